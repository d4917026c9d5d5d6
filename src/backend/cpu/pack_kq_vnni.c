/* pack_kq_vnni.c: AVX-512 VNNI kernels for the packed K-quant layouts
 * (pack_kq_int.h); compiled with AVX-512 F+BW+VL+VNNI, listed in
 * cpu_pack_table_k_x86 and only run after the registry's CPU check.
 *
 * One call: 8 interleaved weight rows against NA activation rows (NA = 1..8,
 * one instantiation each so the accumulators stay in registers). Each 64-byte
 * load of codes feeds vpdpbusd for all 8 rows at once: i32 lane 2r + e sums
 * 4 products of row r per instruction against a 64-bit broadcast of the
 * activation bytes. A sub-block's exact i32 sum is multiplied by its scale
 * (vpmulld) into the row's super-block sum, which is scaled in f32 once per
 * super-block; the two lanes of a row are added at the end. The integer
 * work per lane depends only on the row and the activation, and the float
 * work is the same sequence for every NA, so a row's result does not depend
 * on the batch. Offsets (Q4_K/Q5_K mins, Q6_K's +32) come from the
 * activation's 16-element sums. */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)

#include <immintrin.h>
#include <string.h>

#include "pack_kq_int.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))

static ALWAYS_INLINE __m512i bcast64(const void *p) {
    long long v;
    memcpy(&v, p, 8);
    return _mm512_set1_epi64(v);
}

/* 16 lanes, lane 2r + e = v[r] (for the 8 per-row values in v's low half) */
static ALWAYS_INLINE __m512i dup_lo(void) { return _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7); }
static ALWAYS_INLINE __m512i dup_hi(void) {
    return _mm512_setr_epi32(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
}

/* 8 f16 values (one per row) as 16 f32 lanes (lane 2r + e = row r) */
static ALWAYS_INLINE __m512 rows_f16(const uint8_t *p, __m512i dup) {
    __m256 f = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    return _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(f));
}

/* s[8r + j] = lane 2j + lane 2j + 1 of acc */
static ALWAYS_INLINE void store_rows(float *s, __m512 acc) {
    __m512 t = _mm512_add_ps(acc, _mm512_permute_ps(acc, 0xb1));
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 2, 4, 6, 8, 10, 12, 14);
    _mm256_storeu_ps(s, _mm512_castps512_ps256(_mm512_permutexvar_ps(even, t)));
}

/* The Q4_K / Q5_K mins term of one super-block and one activation row:
 * lane 2r + h = sum over sub-blocks 4u + 2h + {0,1} (u = 0, 1) of min * (sum of its 32 activations). */
static ALWAYS_INLINE __m512i k4_mins(const block_q8_K *y, __m512i m0, __m512i m1) {
    __m128i bs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)y->bsums), _mm_loadu_si128((const __m128i *)(y->bsums + 8)));
    __m512i b0 = _mm512_broadcastq_epi64(bs), b1 = _mm512_broadcastq_epi64(_mm_unpackhi_epi64(bs, bs));
    return _mm512_add_epi32(_mm512_madd_epi16(m0, b0), _mm512_madd_epi16(m1, b1));
}

/* Q4_K (HI = 0) and Q5_K (HI = 1): codes of pair jj decoded once, then every activation row. */
static ALWAYS_INLINE void k45_body(int64_t k, const uint8_t *restrict g, const int NA, const void *const *restrict a,
                                   float *restrict s, const int HI) {
    const int64_t nsb = k / QK_K;
    const size_t sb = HI ? KQ5_SB : KQ4_SB;
    const __m512i lo4 = _mm512_set1_epi8(0x0f), b4 = _mm512_set1_epi8(0x10);
    const __m512i dl = dup_lo(), dh = dup_hi();
    __m512 acc[CPU_PACK_MAX_NA];
    __m512i sumi[CPU_PACK_MAX_NA];
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nsb; i++) {
        const uint8_t *h = g + sb * i, *cb = h + KQ4_HDR;
        #pragma GCC unroll 8
        for (int r = 0; r < NA; r++) sumi[r] = _mm512_setzero_si512();
        #pragma GCC unroll 4
        for (int jj = 0; jj < 4; jj++) {
            __m512i sc2 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(h + 32 + 16 * jj)));
            __m512i scl = _mm512_permutexvar_epi32(dl, sc2), sch = _mm512_permutexvar_epi32(dh, sc2);
            __m512i ql[4], qh[4];
            #pragma GCC unroll 4
            for (int z = 0; z < 4; z++) {
                const uint8_t *c = cb + 256 * jj + 64 * z;
                __m512i v = _mm512_loadu_si512((const void *)c);
#ifdef KQ_PF
                _mm_prefetch((const char *)c + KQ_PF, _MM_HINT_T0);
#endif
                ql[z] = _mm512_and_si512(v, lo4);
                qh[z] = _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4);
                if (HI) {
                    __mmask64 ml, mh;
                    memcpy(&ml, cb + 1024 + 16 * (4 * jj + z), 8);
                    memcpy(&mh, cb + 1024 + 16 * (4 * jj + z) + 8, 8);
                    /* codes are <= 15: adding 16 under the mask sets their fifth bit */
                    ql[z] = _mm512_mask_add_epi8(ql[z], ml, ql[z], b4);
                    qh[z] = _mm512_mask_add_epi8(qh[z], mh, qh[z], b4);
                }
            }
            #pragma GCC unroll 8
            for (int r = 0; r < NA; r++) {
                const int8_t *aq = ((const block_q8_K *)a[r] + i)->qs + 64 * jj;
                __m512i al = _mm512_setzero_si512(), ah = _mm512_setzero_si512();
                #pragma GCC unroll 4
                for (int z = 0; z < 4; z++) {
                    al = _mm512_dpbusd_epi32(al, ql[z], bcast64(aq + 8 * z));
                    ah = _mm512_dpbusd_epi32(ah, qh[z], bcast64(aq + 32 + 8 * z));
                }
                if (HI) {
                    sumi[r] = _mm512_add_epi32(sumi[r], _mm512_add_epi32(_mm512_mullo_epi32(al, scl), _mm512_mullo_epi32(ah, sch)));
                } else {
                    /* a Q4_K lane's sub-block sum (16 products, |sum| <= 16 * 15 * 127 < 2^15) fits in its low
                     * i16, and the scale's high i16 is 0: vpdpwssd adds sum * scale, as vpmulld + vpaddd would */
                    sumi[r] = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(sumi[r], al, scl), ah, sch);
                }
            }
        }
        const __m512 d16 = rows_f16(h, dl), dm16 = rows_f16(h + 16, dl);
        const __m512i m0 = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(h + 96)));
        const __m512i m1 = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(h + 128)));
        #pragma GCC unroll 8
        for (int r = 0; r < NA; r++) {
            const block_q8_K *y = (const block_q8_K *)a[r] + i;
            const __m512 ad = _mm512_set1_ps(y->d);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[r]), _mm512_mul_ps(d16, ad), acc[r]);
            acc[r] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(k4_mins(y, m0, m1)), _mm512_mul_ps(dm16, ad), acc[r]);
        }
    }
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) store_rows(s + KQ_R * r, acc[r]);
}

static ALWAYS_INLINE void q4_K_body(int64_t k, const uint8_t *restrict g, const int NA, const void *const *restrict a,
                                    float *restrict s) {
    k45_body(k, g, NA, a, s, 0);
}
static ALWAYS_INLINE void q5_K_body(int64_t k, const uint8_t *restrict g, const int NA, const void *const *restrict a,
                                    float *restrict s) {
    k45_body(k, g, NA, a, s, 1);
}

/* Q6_K: per sub-block pair p, 192 bytes give the 4 quads of codes (6 bits,
 * unsigned, stored +32); each lane starts from -32 * (its sub-block's
 * activation sum), so after the 4 vpdpbusd it holds sum((q - 32) * a) exactly. */
static ALWAYS_INLINE void q6_K_body(int64_t k, const uint8_t *restrict g, const int NA, const void *const *restrict a,
                                    float *restrict s) {
    const int64_t nsb = k / QK_K;
    const __m512i m3f = _mm512_set1_epi8(0x3f), m30 = _mm512_set1_epi8(0x30), m0f = _mm512_set1_epi8(0x0f);
    const __m512i dl = dup_lo();
    __m512 acc[CPU_PACK_MAX_NA];
    __m512i sumi[CPU_PACK_MAX_NA];
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nsb; i++) {
        const uint8_t *h = g + KQ6_SB * i, *cb = h + KQ6_HDR;
        #pragma GCC unroll 8
        for (int r = 0; r < NA; r++) sumi[r] = _mm512_setzero_si512();
        #pragma GCC unroll 2
        for (int p = 0; p < 8; p++) {
            const __m512i A = _mm512_loadu_si512((const void *)(cb + 192 * p));
            const __m512i B = _mm512_loadu_si512((const void *)(cb + 192 * p + 64));
            const __m512i C = _mm512_loadu_si512((const void *)(cb + 192 * p + 128));
            __m512i q[4];
            q[0] = _mm512_and_si512(A, m3f);
            q[1] = _mm512_and_si512(B, m3f);
            /* (x & 0x0f) | y, y already confined to bits 4..5 */
            q[2] = _mm512_ternarylogic_epi32(C, _mm512_and_si512(_mm512_srli_epi16(A, 2), m30), m0f, 0xec);
            q[3] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(C, 4), _mm512_and_si512(_mm512_srli_epi16(B, 2), m30), m0f, 0xec);
            const __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(h + 16 + 16 * p)));
            #pragma GCC unroll 8
            for (int r = 0; r < NA; r++) {
                const kq6_prep_block *y = (const kq6_prep_block *)a[r] + i;
                __m512i t = bcast64(y->nb + 2 * p);
                #pragma GCC unroll 4
                for (int qd = 0; qd < 4; qd++) t = _mm512_dpbusd_epi32(t, q[qd], bcast64(y->qs + 32 * p + 8 * qd));
                sumi[r] = _mm512_add_epi32(sumi[r], _mm512_mullo_epi32(t, sc));
            }
        }
        const __m512 d16 = rows_f16(h, dl);
        #pragma GCC unroll 8
        for (int r = 0; r < NA; r++) {
            const kq6_prep_block *y = (const kq6_prep_block *)a[r] + i;
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[r]), _mm512_mul_ps(d16, _mm512_set1_ps(y->d)), acc[r]);
        }
    }
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) store_rows(s + KQ_R * r, acc[r]);
}

#define PACK_DISPATCH(body)                        \
    switch (na) {                                  \
    case 1: body(k, (const uint8_t *)group, 1, a, s); break;  \
    case 2: body(k, (const uint8_t *)group, 2, a, s); break;  \
    case 3: body(k, (const uint8_t *)group, 3, a, s); break;  \
    case 4: body(k, (const uint8_t *)group, 4, a, s); break;  \
    case 5: body(k, (const uint8_t *)group, 5, a, s); break;  \
    case 6: body(k, (const uint8_t *)group, 6, a, s); break;  \
    case 7: body(k, (const uint8_t *)group, 7, a, s); break;  \
    default: body(k, (const uint8_t *)group, 8, a, s); break; \
    }

void cpu_pack_q4_K_vnni(int64_t k, const void *restrict group, int na, const void *const *restrict a, float *restrict s) {
    PACK_DISPATCH(q4_K_body)
}
void cpu_pack_q5_K_vnni(int64_t k, const void *restrict group, int na, const void *const *restrict a, float *restrict s) {
    PACK_DISPATCH(q5_K_body)
}
void cpu_pack_q6_K_vnni(int64_t k, const void *restrict group, int na, const void *const *restrict a, float *restrict s) {
    PACK_DISPATCH(q6_K_body)
}

#endif
