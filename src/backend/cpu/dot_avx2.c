/* dot_avx2.c: AVX2+FMA+F16C dot kernels (compiled with -mavx2 -mfma -mf16c;
 * dot.c only registers them after checking the CPU at run time).
 *
 * The integer kernels multiply 8-bit weights by 8-bit activations with
 * vpmaddubsw (unsigned x signed -> pairwise i16 sums) and widen with vpmaddwd:
 *   - weights already unsigned (Q4_K/Q5_K/Q6_K codes) go in directly, and a
 *     constant offset or per-sub-block min is folded in afterwards from the
 *     activation block sums (Q8_K bsums);
 *   - signed weights (Q8_0, Q4_0 - 8, IQ4/MXFP4 table values) use the sign
 *     trick: |w| (unsigned) times sign(w) * a, exact because activations are
 *     in [-127, 127] so negating them cannot overflow.
 * No pair of products can saturate vpmaddubsw: the largest is 2*128*127.
 * One float FMA per block (per super-block for the K-quants) scales the
 * exact integer sums, so results match the scalar references to rounding. */
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "dot_int.h"

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline int hsum_i32_4(__m128i v) {
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 0, 3, 2)));
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(v);
}

static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

/* 8 i32 sums of 4 products each, for signed w and a (sign trick). */
static inline __m256i dot_i8_signed(__m256i w, __m256i a) {
    __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* 32 nibbles of a 16-byte row: low nibbles in the low lane (elements 0..15),
 * high nibbles in the high lane (elements 16..31). */
static inline __m256i nibbles32(const uint8_t *qs) {
    __m128i q = _mm_loadu_si128((const __m128i *)qs);
    __m256i v = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
}

/* ---- float weights ---- */

void cpu_dot_f32_avx2(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const float *w = vw, *a = va;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; k++)
            acc[k] = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8 * k), _mm256_loadu_ps(a + i + 8 * k), acc[k]);
    for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(a + i), acc[0]);
    float sum = hsum8(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    for (; i < n; i++) sum += w[i] * a[i];
    *s = sum;
}

void cpu_dot_f16_avx2(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const uint16_t *w = vw;
    const float *a = va;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; k++) {
            __m256 wf = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + i + 8 * k)));
            acc[k] = _mm256_fmadd_ps(wf, _mm256_loadu_ps(a + i + 8 * k), acc[k]);
        }
    for (; i + 8 <= n; i += 8)
        acc[0] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + i))), _mm256_loadu_ps(a + i), acc[0]);
    float sum = hsum8(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    for (; i < n; i++) sum += h2f(w[i]) * a[i];
    *s = sum;
}

static inline __m256 bf16x8(const uint16_t *p) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

static inline float bf16_1(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* BF16 weights against BF16 activations; products are exact in f32. */
void cpu_dot_bf16_avx2(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const uint16_t *w = vw, *a = va;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; k++)
            acc[k] = _mm256_fmadd_ps(bf16x8(w + i + 8 * k), bf16x8(a + i + 8 * k), acc[k]);
    for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(bf16x8(w + i), bf16x8(a + i), acc[0]);
    float sum = hsum8(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    for (; i < n; i++) sum += bf16_1(w[i]) * bf16_1(a[i]);
    *s = sum;
}

/* ---- 32-element blocks against Q8_0 ---- */

void cpu_dot_q8_0_avx2(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const block_q8_0 *w = vw;
    const block_q8_0 *a = va;
    int64_t nb = n / QK8_0, i = 0;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; i + 2 <= nb; i += 2) {
        __m256i p0 = dot_i8_signed(_mm256_loadu_si256((const __m256i *)w[i].qs), _mm256_loadu_si256((const __m256i *)a[i].qs));
        __m256i p1 = dot_i8_signed(_mm256_loadu_si256((const __m256i *)w[i + 1].qs),
                                   _mm256_loadu_si256((const __m256i *)a[i + 1].qs));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w[i].d) * h2f(a[i].d)), _mm256_cvtepi32_ps(p0), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w[i + 1].d) * h2f(a[i + 1].d)), _mm256_cvtepi32_ps(p1), acc1);
    }
    for (; i < nb; i++) {
        __m256i p = dot_i8_signed(_mm256_loadu_si256((const __m256i *)w[i].qs), _mm256_loadu_si256((const __m256i *)a[i].qs));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w[i].d) * h2f(a[i].d)), _mm256_cvtepi32_ps(p), acc0);
    }
    *s = hsum8(_mm256_add_ps(acc0, acc1));
}

void cpu_dot_q4_0_avx2(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const block_q4_0 *w = vw;
    const block_q8_0 *a = va;
    int64_t nb = n / QK4_0, i = 0;
    const __m256i eight = _mm256_set1_epi8(8);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; i + 2 <= nb; i += 2) {
        __m256i q0 = _mm256_sub_epi8(nibbles32(w[i].qs), eight);
        __m256i q1 = _mm256_sub_epi8(nibbles32(w[i + 1].qs), eight);
        __m256i p0 = dot_i8_signed(q0, _mm256_loadu_si256((const __m256i *)a[i].qs));
        __m256i p1 = dot_i8_signed(q1, _mm256_loadu_si256((const __m256i *)a[i + 1].qs));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w[i].d) * h2f(a[i].d)), _mm256_cvtepi32_ps(p0), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w[i + 1].d) * h2f(a[i + 1].d)), _mm256_cvtepi32_ps(p1), acc1);
    }
    for (; i < nb; i++) {
        __m256i q = _mm256_sub_epi8(nibbles32(w[i].qs), eight);
        __m256i p = dot_i8_signed(q, _mm256_loadu_si256((const __m256i *)a[i].qs));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w[i].d) * h2f(a[i].d)), _mm256_cvtepi32_ps(p), acc0);
    }
    *s = hsum8(_mm256_add_ps(acc0, acc1));
}

/* 16-level table lookup of 32 nibbles: a table in both lanes, pshufb by index. */
static inline __m256i lut32(const uint8_t *qs, __m256i table) { return _mm256_shuffle_epi8(table, nibbles32(qs)); }

static inline __m256i table16(const int8_t *t) {
    __m128i v = _mm_loadu_si128((const __m128i *)t);
    return _mm256_set_m128i(v, v);
}

void cpu_dot_iq4_nl_avx2(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const block_iq4_nl *w = vw;
    const block_q8_0 *a = va;
    const __m256i table = table16(cpu_kvalues_iq4nl);
    int64_t nb = n / QK4_NL, i = 0;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; i + 2 <= nb; i += 2) {
        __m256i p0 = dot_i8_signed(lut32(w[i].qs, table), _mm256_loadu_si256((const __m256i *)a[i].qs));
        __m256i p1 = dot_i8_signed(lut32(w[i + 1].qs, table), _mm256_loadu_si256((const __m256i *)a[i + 1].qs));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w[i].d) * h2f(a[i].d)), _mm256_cvtepi32_ps(p0), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w[i + 1].d) * h2f(a[i + 1].d)), _mm256_cvtepi32_ps(p1), acc1);
    }
    for (; i < nb; i++) {
        __m256i p = dot_i8_signed(lut32(w[i].qs, table), _mm256_loadu_si256((const __m256i *)a[i].qs));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w[i].d) * h2f(a[i].d)), _mm256_cvtepi32_ps(p), acc0);
    }
    *s = hsum8(_mm256_add_ps(acc0, acc1));
}

void cpu_dot_mxfp4_avx2(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const block_mxfp4 *w = vw;
    const block_q8_0 *a = va;
    const __m256i table = table16(cpu_kvalues_mxfp4);
    int64_t nb = n / QK_MXFP4;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        __m256i p = dot_i8_signed(lut32(w[i].qs, table), _mm256_loadu_si256((const __m256i *)a[i].qs));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(cpu_e8m0_half(w[i].e) * h2f(a[i].d)), _mm256_cvtepi32_ps(p), acc);
    }
    *s = hsum8(acc);
}

/* Bit j of a 32-bit word as byte j (0x00 or 0xff), in the nibbles32 order. */
static inline __m256i bits32(const uint8_t *p) {
    uint32_t u;
    memcpy(&u, p, 4);
    const __m256i idx = _mm256_set_epi64x(0x0303030303030303ll, 0x0202020202020202ll, 0x0101010101010101ll, 0);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)u), idx);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

void cpu_dot_q5_0_avx2(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const block_q5_0 *w = vw;
    const block_q8_0 *a = va;
    const __m256i b16 = _mm256_set1_epi8(0x10);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK5_0; i++) {
        __m256i q = _mm256_or_si256(nibbles32(w[i].qs), _mm256_and_si256(bits32(w[i].qh), b16));
        __m256i p = dot_i8_signed(_mm256_sub_epi8(q, b16), _mm256_loadu_si256((const __m256i *)a[i].qs));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w[i].d) * h2f(a[i].d)), _mm256_cvtepi32_ps(p), acc);
    }
    *s = hsum8(acc);
}

void cpu_dot_q4_1_avx2(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const block_q4_1 *w = vw;
    const block_q8_1 *a = va;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc = _mm256_setzero_ps();
    float summ = 0;
    for (int64_t i = 0; i < n / QK4_1; i++) {
        __m256i av = _mm256_loadu_si256((const __m256i *)a[i].qs);
        __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(nibbles32(w[i].qs), av), ones);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w[i].d) * h2f(a[i].d)), _mm256_cvtepi32_ps(p), acc);
        summ += h2f(w[i].m) * h2f(a[i].s);
    }
    *s = hsum8(acc) + summ;
}

void cpu_dot_q5_1_avx2(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const block_q5_1 *w = vw;
    const block_q8_1 *a = va;
    const __m256i ones = _mm256_set1_epi16(1), b16 = _mm256_set1_epi8(0x10);
    __m256 acc = _mm256_setzero_ps();
    float summ = 0;
    for (int64_t i = 0; i < n / QK5_1; i++) {
        __m256i av = _mm256_loadu_si256((const __m256i *)a[i].qs);
        __m256i q = _mm256_or_si256(nibbles32(w[i].qs), _mm256_and_si256(bits32(w[i].qh), b16));
        __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(q, av), ones);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w[i].d) * h2f(a[i].d)), _mm256_cvtepi32_ps(p), acc);
        summ += h2f(w[i].m) * h2f(a[i].s);
    }
    *s = hsum8(acc) + summ;
}

/* ---- K-quants against Q8_K ---- */

/* Q4_K/Q5_K's 12 scale bytes -> sc[0..8) and m[0..8) as bytes (6 bits each). */
static inline void k4_unpack(const uint8_t *p, uint8_t sc[8], uint8_t m[8]) {
    uint32_t u0, u1, u2, t[4];
    memcpy(&u0, p, 4);
    memcpy(&u1, p + 4, 4);
    memcpy(&u2, p + 8, 4);
    t[0] = u0 & 0x3f3f3f3f;
    t[1] = (u2 & 0x0f0f0f0f) | (((u0 >> 6) & 0x03030303) << 4);
    t[2] = u1 & 0x3f3f3f3f;
    t[3] = ((u2 >> 4) & 0x0f0f0f0f) | (((u1 >> 6) & 0x03030303) << 4);
    memcpy(sc, t, 8);
    memcpy(m, t + 2, 8);
}

/* sum_j m[j] * (bsums[2j] + bsums[2j+1]) for the 8 sub-blocks of 32. */
static inline int k4_mins(const uint8_t m[8], const int16_t *bsums) {
    __m128i b0 = _mm_loadu_si128((const __m128i *)bsums), b1 = _mm_loadu_si128((const __m128i *)(bsums + 8));
    __m128i pairs = _mm_hadd_epi16(b0, b1); /* |pair| <= 2*16*127: no overflow */
    __m128i mm = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)m));
    return hsum_i32_4(_mm_madd_epi16(pairs, mm));
}

void cpu_dot_q4_K_avx2(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const block_q4_K *w = vw;
    const block_q8_K *a = va;
    const __m256i lo4 = _mm256_set1_epi8(0x0f);
    __m256 acc = _mm256_setzero_ps();
    float accm = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t sc[8], m[8];
        k4_unpack(w[i].scales, sc, m);
        const float da = a[i].d;
        accm += h2f(w[i].dmin) * da * (float)k4_mins(m, a[i].bsums);
        const uint8_t *q = w[i].qs;
        const int8_t *aq = a[i].qs;
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++, q += 32, aq += 64) {
            __m256i qq = _mm256_loadu_si256((const __m256i *)q);
            __m256i ql = _mm256_and_si256(qq, lo4), qh = _mm256_and_si256(_mm256_srli_epi16(qq, 4), lo4);
            __m256i pl = _mm256_maddubs_epi16(ql, _mm256_loadu_si256((const __m256i *)aq));
            __m256i ph = _mm256_maddubs_epi16(qh, _mm256_loadu_si256((const __m256i *)(aq + 32)));
            pl = _mm256_madd_epi16(pl, _mm256_set1_epi16(sc[2 * j]));
            ph = _mm256_madd_epi16(ph, _mm256_set1_epi16(sc[2 * j + 1]));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w[i].d) * da), _mm256_cvtepi32_ps(sumi), acc);
    }
    *s = hsum8(acc) - accm;
}

void cpu_dot_q5_K_avx2(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const block_q5_K *w = vw;
    const block_q8_K *a = va;
    const __m256i lo4 = _mm256_set1_epi8(0x0f), b16 = _mm256_set1_epi8(0x10);
    __m256 acc = _mm256_setzero_ps();
    float accm = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t sc[8], m[8];
        k4_unpack(w[i].scales, sc, m);
        const float da = a[i].d;
        accm += h2f(w[i].dmin) * da * (float)k4_mins(m, a[i].bsums);
        const uint8_t *q = w[i].qs;
        const int8_t *aq = a[i].qs;
        const __m256i hb = _mm256_loadu_si256((const __m256i *)w[i].qh);
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++, q += 32, aq += 64) {
            /* fifth bits: bit 2j of qh for the low nibbles, bit 2j+1 for the high */
            __m256i ml = _mm256_set1_epi8((char)(1 << (2 * j))), mh = _mm256_set1_epi8((char)(2 << (2 * j)));
            __m256i hl = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, ml), ml), b16);
            __m256i hh = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, mh), mh), b16);
            __m256i qq = _mm256_loadu_si256((const __m256i *)q);
            __m256i ql = _mm256_or_si256(_mm256_and_si256(qq, lo4), hl);
            __m256i qh = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qq, 4), lo4), hh);
            __m256i pl = _mm256_maddubs_epi16(ql, _mm256_loadu_si256((const __m256i *)aq));
            __m256i ph = _mm256_maddubs_epi16(qh, _mm256_loadu_si256((const __m256i *)(aq + 32)));
            pl = _mm256_madd_epi16(pl, _mm256_set1_epi16(sc[2 * j]));
            ph = _mm256_madd_epi16(ph, _mm256_set1_epi16(sc[2 * j + 1]));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w[i].d) * da), _mm256_cvtepi32_ps(sumi), acc);
    }
    *s = hsum8(acc) - accm;
}

/* Per-16 scales for one 32-element run: low lane s0, high lane s1 (as i16). */
static inline __m256i scale_pair(int s0, int s1) {
    return _mm256_set_m128i(_mm_set1_epi16((short)s1), _mm_set1_epi16((short)s0));
}

void cpu_dot_q6_K_avx2(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const block_q6_K *w = vw;
    const block_q8_K *a = va;
    const __m256i lo4 = _mm256_set1_epi8(0x0f), lo2 = _mm256_set1_epi8(0x03);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float da = a[i].d;
        /* codes are stored +32: subtract 32 * sum_k sc[k] * bsums[k] at the end */
        __m128i scv = _mm_loadu_si128((const __m128i *)w[i].scales);
        __m128i s_lo = _mm_cvtepi8_epi16(scv), s_hi = _mm_cvtepi8_epi16(_mm_srli_si128(scv, 8));
        __m128i bs0 = _mm_loadu_si128((const __m128i *)a[i].bsums), bs1 = _mm_loadu_si128((const __m128i *)(a[i].bsums + 8));
        int offs = hsum_i32_4(_mm_add_epi32(_mm_madd_epi16(s_lo, bs0), _mm_madd_epi16(s_hi, bs1)));

        const uint8_t *ql = w[i].ql, *qh = w[i].qh;
        const int8_t *sc = w[i].scales, *aq = a[i].qs;
        __m256i sumi = _mm256_setzero_si256();
        for (int half = 0; half < 2; half++, ql += 64, qh += 32, sc += 8, aq += 128) {
            __m256i l0 = _mm256_loadu_si256((const __m256i *)ql), l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            __m256i h = _mm256_loadu_si256((const __m256i *)qh);
            __m256i q1 = _mm256_or_si256(_mm256_and_si256(l0, lo4), _mm256_slli_epi16(_mm256_and_si256(h, lo2), 4));
            __m256i q2 = _mm256_or_si256(_mm256_and_si256(l1, lo4),
                                         _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), lo2), 4));
            __m256i q3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), lo4),
                                         _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), lo2), 4));
            __m256i q4 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), lo4),
                                         _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), lo2), 4));
            __m256i p1 = _mm256_maddubs_epi16(q1, _mm256_loadu_si256((const __m256i *)aq));
            __m256i p2 = _mm256_maddubs_epi16(q2, _mm256_loadu_si256((const __m256i *)(aq + 32)));
            __m256i p3 = _mm256_maddubs_epi16(q3, _mm256_loadu_si256((const __m256i *)(aq + 64)));
            __m256i p4 = _mm256_maddubs_epi16(q4, _mm256_loadu_si256((const __m256i *)(aq + 96)));
            p1 = _mm256_madd_epi16(p1, scale_pair(sc[0], sc[1]));
            p2 = _mm256_madd_epi16(p2, scale_pair(sc[2], sc[3]));
            p3 = _mm256_madd_epi16(p3, scale_pair(sc[4], sc[5]));
            p4 = _mm256_madd_epi16(p4, scale_pair(sc[6], sc[7]));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(_mm256_add_epi32(p1, p2), _mm256_add_epi32(p3, p4)));
        }
        sumi = _mm256_sub_epi32(sumi, _mm256_setr_epi32(32 * offs, 0, 0, 0, 0, 0, 0, 0));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w[i].d) * da), _mm256_cvtepi32_ps(sumi), acc);
    }
    *s = hsum8(acc);
}

void cpu_dot_q2_K_avx2(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const block_q2_K *w = vw;
    const block_q8_K *a = va;
    const __m256i lo2 = _mm256_set1_epi8(0x03);
    __m256 acc = _mm256_setzero_ps();
    float accm = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float da = a[i].d;
        /* mins: high nibbles of the 16 scale bytes against the 16 bsums */
        __m128i scv = _mm_loadu_si128((const __m128i *)w[i].scales);
        __m128i mv = _mm_and_si128(_mm_srli_epi16(scv, 4), _mm_set1_epi8(0x0f));
        __m128i bs0 = _mm_loadu_si128((const __m128i *)a[i].bsums), bs1 = _mm_loadu_si128((const __m128i *)(a[i].bsums + 8));
        int summ = hsum_i32_4(_mm_add_epi32(_mm_madd_epi16(_mm_cvtepu8_epi16(mv), bs0),
                                            _mm_madd_epi16(_mm_cvtepu8_epi16(_mm_srli_si128(mv, 8)), bs1)));
        accm += h2f(w[i].dmin) * da * (float)summ;

        const uint8_t *q = w[i].qs, *sc = w[i].scales;
        const int8_t *aq = a[i].qs;
        __m256i sumi = _mm256_setzero_si256();
        for (int half = 0; half < 2; half++, q += 32) {
            __m256i qq = _mm256_loadu_si256((const __m256i *)q);
            for (int shift = 0; shift < 8; shift += 2, sc += 2, aq += 32) {
                __m256i v = _mm256_and_si256(_mm256_srli_epi16(qq, shift), lo2);
                __m256i p = _mm256_maddubs_epi16(v, _mm256_loadu_si256((const __m256i *)aq));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, scale_pair(sc[0] & 0xf, sc[1] & 0xf)));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w[i].d) * da), _mm256_cvtepi32_ps(sumi), acc);
    }
    *s = hsum8(acc) - accm;
}

/* Q3_K's 12 scale bytes -> 16 signed scales (6 bits, minus 32). */
static inline void q3_unpack(const uint8_t *p, int8_t out[16]) {
    uint32_t u0, u1, u2, t[4];
    memcpy(&u0, p, 4);
    memcpy(&u1, p + 4, 4);
    memcpy(&u2, p + 8, 4);
    t[0] = (u0 & 0x0f0f0f0f) | ((u2 & 0x03030303) << 4);
    t[1] = (u1 & 0x0f0f0f0f) | (((u2 >> 2) & 0x03030303) << 4);
    t[2] = ((u0 >> 4) & 0x0f0f0f0f) | (((u2 >> 4) & 0x03030303) << 4);
    t[3] = ((u1 >> 4) & 0x0f0f0f0f) | (((u2 >> 6) & 0x03030303) << 4);
    __m128i v = _mm_sub_epi8(_mm_loadu_si128((const __m128i *)t), _mm_set1_epi8(32));
    _mm_storeu_si128((__m128i *)out, v);
}

void cpu_dot_q3_K_avx2(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const block_q3_K *w = vw;
    const block_q8_K *a = va;
    const __m256i lo2 = _mm256_set1_epi8(0x03), four = _mm256_set1_epi8(4);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        int8_t sc[16];
        q3_unpack(w[i].scales, sc);
        /* codes are taken as (low 2 bits | high bit << 2) in 0..7, minus 4:
         * the -4 comes back as 4 * sum_k sc[k] * bsums[k] */
        __m128i scv = _mm_loadu_si128((const __m128i *)sc);
        __m128i bs0 = _mm_loadu_si128((const __m128i *)a[i].bsums), bs1 = _mm_loadu_si128((const __m128i *)(a[i].bsums + 8));
        int offs = hsum_i32_4(_mm_add_epi32(_mm_madd_epi16(_mm_cvtepi8_epi16(scv), bs0),
                                            _mm_madd_epi16(_mm_cvtepi8_epi16(_mm_srli_si128(scv, 8)), bs1)));
        const uint8_t *q = w[i].qs;
        const int8_t *aq = a[i].qs;
        const __m256i hm = _mm256_loadu_si256((const __m256i *)w[i].hmask);
        __m256i sumi = _mm256_setzero_si256();
        int is = 0;
        for (int half = 0; half < 2; half++, q += 32) {
            __m256i qq = _mm256_loadu_si256((const __m256i *)q);
            for (int j = 0; j < 4; j++, is += 2, aq += 32) {
                __m256i bit = _mm256_set1_epi8((char)(1 << (4 * half + j)));
                __m256i h4 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit), four);
                __m256i v = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qq, 2 * j), lo2), h4);
                __m256i p = _mm256_maddubs_epi16(v, _mm256_loadu_si256((const __m256i *)aq));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, scale_pair(sc[is], sc[is + 1])));
            }
        }
        sumi = _mm256_sub_epi32(sumi, _mm256_setr_epi32(4 * offs, 0, 0, 0, 0, 0, 0, 0));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w[i].d) * a[i].d), _mm256_cvtepi32_ps(sumi), acc);
    }
    *s = hsum8(acc);
}

void cpu_dot_iq4_xs_avx2(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const block_iq4_xs *w = vw;
    const block_q8_K *a = va;
    const __m256i table = table16(cpu_kvalues_iq4nl);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *q = w[i].qs;
        const int8_t *aq = a[i].qs;
        uint32_t sh = w[i].scales_h;
        __m256i sumi = _mm256_setzero_si256();
        for (int ib = 0; ib < QK_K / 32; ib += 2, q += 32, aq += 64, sh >>= 4) {
            int ls0 = ((w[i].scales_l[ib / 2] & 0xf) | ((sh & 3) << 4)) - 32;
            int ls1 = ((w[i].scales_l[ib / 2] >> 4) | (((sh >> 2) & 3) << 4)) - 32;
            __m256i w0 = lut32(q, table), w1 = lut32(q + 16, table);
            __m256i a0 = _mm256_loadu_si256((const __m256i *)aq), a1 = _mm256_loadu_si256((const __m256i *)(aq + 32));
            __m256i p0 = _mm256_maddubs_epi16(_mm256_sign_epi8(w0, w0), _mm256_sign_epi8(a0, w0));
            __m256i p1 = _mm256_maddubs_epi16(_mm256_sign_epi8(w1, w1), _mm256_sign_epi8(a1, w1));
            p0 = _mm256_madd_epi16(p0, _mm256_set1_epi16((short)ls0));
            p1 = _mm256_madd_epi16(p1, _mm256_set1_epi16((short)ls1));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w[i].d) * a[i].d), _mm256_cvtepi32_ps(sumi), acc);
    }
    *s = hsum8(acc);
}

/* ---- activation converters (byte for byte what dot.c's scalar ones write) ---- */

/* max(|x|) over n floats (n a multiple of 8), NaNs ignored as fmaxf ignores
 * them: vmaxps returns its second operand when either is NaN, and the running
 * maximum (never NaN) is always that second operand. */
static inline float amax8n(const float *x, int n) {
    const __m256 abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 m0 = _mm256_setzero_ps(), m1 = _mm256_setzero_ps();
    for (int j = 0; j < n; j += 16) {
        m0 = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + j), abs), m0);
        m1 = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + j + 8), abs), m1);
    }
    __m256 m = _mm256_max_ps(m0, m1);
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* lrintf(x * m) clamped to [-127, 127] (out-of-range and NaN give INT_MIN, as lrintf's LONG_MIN: -127). */
static inline __m256i round_clamp(__m256 x, __m256 m) {
    __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(x, m));
    return _mm256_max_epi32(_mm256_min_epi32(q, _mm256_set1_epi32(127)), _mm256_set1_epi32(-127));
}

/* Four vectors of 8 i32 codes (in [-127, 127]) -> 32 bytes in element order. */
static inline __m256i pack32(__m256i q0, __m256i q1, __m256i q2, __m256i q3) {
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* One 32-block: codes of x * id into qs; returns their sum. */
static inline __m256i q8_block32(const float *x, __m256 id, int8_t *qs) {
    __m256i q0 = round_clamp(_mm256_loadu_ps(x), id), q1 = round_clamp(_mm256_loadu_ps(x + 8), id);
    __m256i q2 = round_clamp(_mm256_loadu_ps(x + 16), id), q3 = round_clamp(_mm256_loadu_ps(x + 24), id);
    _mm256_storeu_si256((__m256i *)qs, pack32(q0, q1, q2, q3));
    return _mm256_add_epi32(_mm256_add_epi32(q0, q1), _mm256_add_epi32(q2, q3));
}

static inline int hsum_i32_8(__m256i v) {
    return hsum_i32_4(_mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
}

void cpu_act_q8_0_avx2(const float *restrict x, void *restrict vy, int64_t n) {
    block_q8_0 *y = vy;
    for (int64_t i = 0; i < n / QK8_0; i++, x += QK8_0) {
        float amax = amax8n(x, QK8_0);
        float d = amax / 127.0f, id = amax != 0 ? 127.0f / amax : 0.0f;
        y[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        (void)q8_block32(x, _mm256_set1_ps(id), y[i].qs);
    }
}

void cpu_act_q8_1_avx2(const float *restrict x, void *restrict vy, int64_t n) {
    block_q8_1 *y = vy;
    for (int64_t i = 0; i < n / QK8_1; i++, x += QK8_1) {
        float amax = amax8n(x, QK8_1);
        float d = amax / 127.0f, id = amax != 0 ? 127.0f / amax : 0.0f;
        int sum = hsum_i32_8(q8_block32(x, _mm256_set1_ps(id), y[i].qs));
        y[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        y[i].s = _cvtss_sh(d * (float)sum, _MM_FROUND_TO_NEAREST_INT);
    }
}

void cpu_act_q8_K_avx2(const float *restrict x, void *restrict vy, int64_t n) {
    block_q8_K *y = vy;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        /* the largest |x| and its sign: the first element of that magnitude (as the scalar scan keeps it) */
        __m256 hi = _mm256_set1_ps(-INFINITY), lo = _mm256_set1_ps(INFINITY);
        for (int j = 0; j < QK_K; j += 8) {
            __m256 v = _mm256_loadu_ps(x + j);
            hi = _mm256_max_ps(v, hi);
            lo = _mm256_min_ps(v, lo);
        }
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(hi), _mm256_extractf128_ps(hi, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        __m128 l = _mm_min_ps(_mm256_castps256_ps128(lo), _mm256_extractf128_ps(lo, 1));
        l = _mm_min_ps(l, _mm_movehl_ps(l, l));
        l = _mm_min_ss(l, _mm_movehdup_ps(l));
        float vmax = _mm_cvtss_f32(h), vmin = _mm_cvtss_f32(l);
        float amax = vmax > -vmin ? vmax : -vmin;
        if (!(amax > 0)) {
            memset(&y[i], 0, sizeof(y[i]));
            continue;
        }
        float max;
        if (vmax != amax) max = vmin;
        else if (-vmin != amax) max = vmax;
        else { /* both +amax and -amax occur: the first one wins */
            max = 0;
            for (int j = 0; j < QK_K; j++)
                if (fabsf(x[j]) == amax) {
                    max = x[j];
                    break;
                }
        }
        float iscale = -127.0f / max;
        const __m256 m = _mm256_set1_ps(iscale);
        __m256i sums[8];
        for (int j = 0; j < QK_K / 32; j++) {
            __m256i q0 = round_clamp(_mm256_loadu_ps(x + 32 * j), m), q1 = round_clamp(_mm256_loadu_ps(x + 32 * j + 8), m);
            __m256i q2 = round_clamp(_mm256_loadu_ps(x + 32 * j + 16), m), q3 = round_clamp(_mm256_loadu_ps(x + 32 * j + 24), m);
            _mm256_storeu_si256((__m256i *)(y[i].qs + 32 * j), pack32(q0, q1, q2, q3));
            /* lanes 0..3: partial sums of elements 0..15, lanes 4..7 of 16..31 */
            __m256i s01 = _mm256_add_epi32(q0, q1), s23 = _mm256_add_epi32(q2, q3);
            sums[j] = _mm256_permute2x128_si256(s01, s23, 0x20); /* [s01 lo | s23 lo] */
            sums[j] = _mm256_add_epi32(sums[j], _mm256_permute2x128_si256(s01, s23, 0x31));
        }
        /* sums[j]: lanes 0..3 sum to bsum 2j, lanes 4..7 to bsum 2j+1 */
        __m256i r[2];
        for (int g = 0; g < 2; g++) {
            __m256i a = _mm256_hadd_epi32(sums[4 * g], sums[4 * g + 1]);
            __m256i b = _mm256_hadd_epi32(sums[4 * g + 2], sums[4 * g + 3]);
            /* [j0 lo, j1 lo, j2 lo, j3 lo | j0 hi, j1 hi, j2 hi, j3 hi] */
            __m256i c = _mm256_hadd_epi32(a, b);
            r[g] = _mm256_permutevar8x32_epi32(c, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        }
        __m256i b16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(r[0], r[1]), _MM_SHUFFLE(3, 1, 2, 0));
        _mm256_storeu_si256((__m256i *)y[i].bsums, b16);
        y[i].d = 1.0f / iscale;
    }
}

void cpu_act_bf16_avx2(const float *restrict x, void *restrict vy, int64_t n) {
    uint16_t *y = vy;
    int64_t i = 0;
    const __m256i lsb = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff), quiet = _mm256_set1_epi32(0x40);
    for (; i + 16 <= n; i += 16) {
        __m256i r[2];
        for (int h = 0; h < 2; h++) {
            __m256 v = _mm256_loadu_ps(x + i + 8 * h);
            __m256i u = _mm256_castps_si256(v);
            __m256i up = _mm256_srli_epi32(u, 16);
            __m256i rn = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, bias), _mm256_and_si256(up, lsb)), 16);
            __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
            r[h] = _mm256_blendv_epi8(rn, _mm256_or_si256(up, quiet), nan);
        }
        __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r[0], r[1]), _MM_SHUFFLE(3, 1, 2, 0));
        _mm256_storeu_si256((__m256i *)(y + i), p);
    }
    if (i < n) cpu_act_bf16_ref(x + i, y + i, n - i);
}

#else
/* Not an x86 target with AVX2 flags: nothing here (dot.c registers nothing). */
typedef int hn_dot_avx2_unused;
#endif
