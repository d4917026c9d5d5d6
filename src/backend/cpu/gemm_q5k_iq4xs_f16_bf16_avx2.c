/* gemm_q5k_iq4xs_f16_bf16_avx2.c: AVX2+FMA+F16C gemm kernels for Q5_K,
 * IQ4_XS, F16 and BF16 (see gemm.h; gemm.c registers them behind a run-time
 * CPU check).
 *
 * One weight row against NA activation rows. The integer types decode each
 * 64 weights once (Q5_K: nibbles plus the fifth bit; IQ4_XS: table lookup of
 * the nibbles) and multiply them into every row with vpmaddubsw, Q5_K as
 * unsigned codes with its mins folded in from the activation's bsums, IQ4_XS
 * with the sign trick (exact: activations are in [-127, 127]); vpmaddwd by
 * the sub-block scale gives exact i32 lanes, scaled once per super-block in
 * f32. The float types keep per-row f32 accumulators whose lanes cover fixed
 * elements (F16: two of 8 lanes per 16 elements; BF16: even and odd elements
 * of two runs of 16 per 32), processed in groups of rows small enough for
 * the registers. A row's arithmetic never depends on how many rows share the
 * call, and gemm_q5k_iq4xs_f16_bf16_avx512.c's kernels do exactly the same
 * arithmetic per lane (their zmm accumulators are two of these ymm side by
 * side), so the two variants are bit-identical (tests/test_gemm.c). */
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "../../quant/quant.h"
#include "dot_int.h"
#include "gemm_int.h"
#include "gemm_simd.h"

/* Bit b of every byte of v moved to bit 4 (other bits cleared); b constant. */
#define BIT_TO_4(v, b)                                                                                       \
    _mm256_and_si256((b) <= 4 ? _mm256_slli_epi16((v), 4 - (b) < 0 ? 0 : 4 - (b))                           \
                              : _mm256_srli_epi16((v), (b) - 4 < 0 ? 0 : (b) - 4), _mm256_set1_epi8(0x10))

static ALWAYS_INLINE void q5_K_body(int64_t k, const block_q5_K *restrict w, const int NA,
                                    const void *const *restrict a, float *restrict s) {
    const __m256i lo4 = _mm256_set1_epi8(0x0f);
    __m256 acc[CPU_GEMM_MAX_NA];
    __m128 accm[CPU_GEMM_MAX_NA];
    __m256i sumi[CPU_GEMM_MAX_NA];
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) {
        acc[r] = _mm256_setzero_ps();
        accm[r] = _mm_setzero_ps();
    }
    for (int64_t i = 0; i < k / QK_K; i++) {
        const block_q5_K *b = &w[i];
        __m128i sm = k4_scales_mins(b->scales);
        __m128i s16 = _mm_cvtepu8_epi16(sm);
        __m256i sc16 = _mm256_set_m128i(s16, s16);
        __m128i m16 = _mm_cvtepu8_epi16(_mm_srli_si128(sm, 8));
        const __m256i hb = _mm256_loadu_si256((const __m256i *)b->qh);
        #pragma GCC unroll 8
        for (int r = 0; r < NA; r++) sumi[r] = _mm256_setzero_si256();
        #pragma GCC unroll 8
        for (int j = 0; j < 4; j++) {
            __m256i qq = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * j));
            /* sub-block 2j: low nibbles + bit 2j of qh; 2j+1: high nibbles + bit 2j+1 */
            __m256i ql = _mm256_or_si256(_mm256_and_si256(qq, lo4), BIT_TO_4(hb, 2 * j));
            __m256i qh = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qq, 4), lo4), BIT_TO_4(hb, 2 * j + 1));
            __m256i sl = bcast16(sc16, 2 * j), sh = bcast16(sc16, 2 * j + 1);
            k45_pair_rows(ql, qh, sl, sh, i, j, NA, a, sumi);
        }
        k45_scale_rows(sumi, h2f(b->d), h2f(b->dmin), m16, i, NA, a, acc, accm);
    }
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) s[r] = hsum8(acc[r]) - hsum4(accm[r]);
}

/* 32 nibbles of 16 bytes through the 16-level table: low nibbles then high. */
static ALWAYS_INLINE __m256i lut32(const uint8_t *qs, __m256i table) {
    __m128i q = _mm_loadu_si128((const __m128i *)qs);
    __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0f));
    return _mm256_shuffle_epi8(table, v);
}

/* IQ4_XS's 8 six-bit scales minus 32 as i16: low nibbles of scales_l (sub-block
 * ib even: low, odd: high) with two high bits each from scales_h. */
static ALWAYS_INLINE __m128i iq4_xs_scales(const block_iq4_xs *b) {
    uint32_t sl;
    memcpy(&sl, b->scales_l, 4);
    uint64_t h = b->scales_h, hs = 0;
    #pragma GCC unroll 8
    for (int ib = 0; ib < 8; ib++) hs |= ((h >> (2 * ib)) & 3) << (8 * ib + 4);
    __m128i lv = _mm_cvtsi32_si128((int)sl);
    lv = _mm_unpacklo_epi8(_mm_and_si128(lv, _mm_set1_epi8(0x0f)), _mm_and_si128(_mm_srli_epi16(lv, 4), _mm_set1_epi8(0x0f)));
    lv = _mm_or_si128(lv, _mm_cvtsi64_si128((long long)hs));
    return _mm_sub_epi16(_mm_cvtepu8_epi16(lv), _mm_set1_epi16(32));
}

static ALWAYS_INLINE void iq4_xs_body(int64_t k, const block_iq4_xs *restrict w, const int NA,
                                      const void *const *restrict a, float *restrict s) {
    const __m128i t128 = _mm_loadu_si128((const __m128i *)cpu_kvalues_iq4nl);
    const __m256i table = _mm256_set_m128i(t128, t128);
    __m256 acc[CPU_GEMM_MAX_NA];
    __m256i sumi[CPU_GEMM_MAX_NA];
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < k / QK_K; i++) {
        const block_iq4_xs *b = &w[i];
        __m128i ls = iq4_xs_scales(b);
        __m256i sc16 = _mm256_set_m128i(ls, ls);
        #pragma GCC unroll 8
        for (int r = 0; r < NA; r++) sumi[r] = _mm256_setzero_si256();
        #pragma GCC unroll 8
        for (int ib = 0; ib < QK_K / 32; ib += 2) {
            __m256i w0 = lut32(b->qs + 16 * ib, table), w1 = lut32(b->qs + 16 * ib + 16, table);
            __m256i u0 = _mm256_sign_epi8(w0, w0), u1 = _mm256_sign_epi8(w1, w1);
            __m256i s0 = bcast16(sc16, ib), s1 = bcast16(sc16, ib + 1);
            #pragma GCC unroll 8
            for (int r = 0; r < NA; r++) {
                const int8_t *aq = ((const block_q8_K *)a[r] + i)->qs + 32 * ib;
                __m256i p0 = _mm256_maddubs_epi16(u0, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)aq), w0));
                __m256i p1 = _mm256_maddubs_epi16(u1, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(aq + 32)), w1));
                sumi[r] = _mm256_add_epi32(sumi[r], _mm256_add_epi32(_mm256_madd_epi16(p0, s0), _mm256_madd_epi16(p1, s1)));
            }
        }
        const float d = h2f(b->d);
        #pragma GCC unroll 8
        for (int r = 0; r < NA; r++) {
            const block_q8_K *y = (const block_q8_K *)a[r] + i;
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * y->d), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
        }
    }
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) s[r] = hsum8(acc[r]);
}

/* ---- F16 weights against f32 activations ----
 * Per row two accumulators: acc0 takes elements 16i..16i+7, acc1 16i+8..16i+15;
 * a run of 8 left over goes into acc0; the sum is hsum8(acc0 + acc1), then the
 * last k % 8 elements one by one. Groups of up to 4 rows share each weight
 * conversion. */
static ALWAYS_INLINE void f16_body(int64_t k, const uint16_t *restrict w, const int NA, const void *const *restrict a,
                                   float *restrict s) {
    __m256 acc0[4], acc1[4];
    #pragma GCC unroll 4
    for (int r = 0; r < NA; r++) acc0[r] = acc1[r] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + i)));
        __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + i + 8)));
        #pragma GCC unroll 4
        for (int r = 0; r < NA; r++) {
            const float *x = (const float *)a[r] + i;
            acc0[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x), acc0[r]);
            acc1[r] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + 8), acc1[r]);
        }
    }
    const bool run8 = i + 8 <= k;
    __m256 wt = run8 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + i))) : _mm256_setzero_ps();
    #pragma GCC unroll 4
    for (int r = 0; r < NA; r++) {
        const float *x = (const float *)a[r];
        __m256 t = acc0[r];
        int64_t j = i;
        if (run8) {
            t = _mm256_fmadd_ps(wt, _mm256_loadu_ps(x + j), t);
            j += 8;
        }
        float sum = hsum8(_mm256_add_ps(t, acc1[r]));
        for (; j < k; j++) sum += h2f(w[j]) * x[j];
        s[r] = sum;
    }
}

/* ---- BF16 weights against BF16 activations ----
 * A 32-bit lane of 16 bf16 values holds an even element (low half) and an odd
 * one (high half): shifting left by 16 gives the even ones as f32, masking the
 * odd ones. Per row four accumulators per 32 elements: e0/o0 (even/odd of
 * elements 0..15), e1/o1 (16..31); a run of 16 left over goes into e0/o0; the
 * sum is hsum8((e0 + e1) + (o0 + o1)), then the last k % 16 one by one. Products
 * of two bf16 values are exact in f32. Groups of up to 2 rows. */
static ALWAYS_INLINE __m256 bf_even(__m256i v) { return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)); }
static ALWAYS_INLINE __m256 bf_odd(__m256i v) {
    return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u)));
}

static ALWAYS_INLINE void bf16_body(int64_t k, const uint16_t *restrict w, const int NA, const void *const *restrict a,
                                    float *restrict s) {
    __m256 e0[2], o0[2], e1[2], o1[2];
    #pragma GCC unroll 2
    for (int r = 0; r < NA; r++) e0[r] = o0[r] = e1[r] = o1[r] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= k; i += 32) {
        __m256i v0 = _mm256_loadu_si256((const __m256i *)(w + i)), v1 = _mm256_loadu_si256((const __m256i *)(w + i + 16));
        __m256 we0 = bf_even(v0), wo0 = bf_odd(v0), we1 = bf_even(v1), wo1 = bf_odd(v1);
        #pragma GCC unroll 2
        for (int r = 0; r < NA; r++) {
            const uint16_t *x = (const uint16_t *)a[r] + i;
            __m256i x0 = _mm256_loadu_si256((const __m256i *)x), x1 = _mm256_loadu_si256((const __m256i *)(x + 16));
            e0[r] = _mm256_fmadd_ps(we0, bf_even(x0), e0[r]);
            o0[r] = _mm256_fmadd_ps(wo0, bf_odd(x0), o0[r]);
            e1[r] = _mm256_fmadd_ps(we1, bf_even(x1), e1[r]);
            o1[r] = _mm256_fmadd_ps(wo1, bf_odd(x1), o1[r]);
        }
    }
    #pragma GCC unroll 2
    for (int r = 0; r < NA; r++) {
        const uint16_t *x = (const uint16_t *)a[r];
        __m256 te = e0[r], to = o0[r];
        int64_t j = i;
        if (j + 16 <= k) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(w + j)), xv = _mm256_loadu_si256((const __m256i *)(x + j));
            te = _mm256_fmadd_ps(bf_even(v), bf_even(xv), te);
            to = _mm256_fmadd_ps(bf_odd(v), bf_odd(xv), to);
            j += 16;
        }
        float sum = hsum8(_mm256_add_ps(_mm256_add_ps(te, e1[r]), _mm256_add_ps(to, o1[r])));
        for (; j < k; j++) sum += qt_bf16_to_f32(w[j]) * qt_bf16_to_f32(x[j]);
        s[r] = sum;
    }
}

void cpu_gemm_q5_K_avx2(int64_t k, const void *restrict w, int na, const void *const *restrict a, float *restrict s) {
    GEMM_DISPATCH(q5_K_body, block_q5_K)
}
void cpu_gemm_iq4_xs_avx2(int64_t k, const void *restrict w, int na, const void *const *restrict a, float *restrict s) {
    GEMM_DISPATCH(iq4_xs_body, block_iq4_xs)
}
void cpu_gemm_f16_avx2(int64_t k, const void *restrict w, int na, const void *const *restrict a, float *restrict s) {
    for (int r0 = 0; r0 < na; r0 += 4) {
        int n = na - r0 < 4 ? na - r0 : 4;
        switch (n) {
        case 1: f16_body(k, w, 1, a + r0, s + r0); break;
        case 2: f16_body(k, w, 2, a + r0, s + r0); break;
        case 3: f16_body(k, w, 3, a + r0, s + r0); break;
        default: f16_body(k, w, 4, a + r0, s + r0); break;
        }
    }
}
void cpu_gemm_bf16_avx2(int64_t k, const void *restrict w, int na, const void *const *restrict a, float *restrict s) {
    for (int r0 = 0; r0 < na; r0 += 2) {
        if (na - r0 >= 2) bf16_body(k, w, 2, a + r0, s + r0);
        else bf16_body(k, w, 1, a + r0, s + r0);
    }
}

#else
typedef int hn_gemm_q5k_iq4xs_f16_bf16_avx2_unused;
#endif
