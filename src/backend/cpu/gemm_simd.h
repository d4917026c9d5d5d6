/* gemm_simd.h: small inline helpers shared by the gemm kernel files
 * (gemm_avx2.c, gemm_avx512.c, gemm_q5k_iq4xs_f16_bf16_avx2.c,
 * gemm_q5k_iq4xs_f16_bf16_avx512.c). Include only from files compiled with
 * AVX2+FMA+F16C (the AVX-512 part only where __AVX512F__ is defined). Every
 * kernel reduces with these same functions, so variants that must agree bit
 * for bit round alike. */
#ifndef HN_CPU_GEMM_SIMD_H
#define HN_CPU_GEMM_SIMD_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "../../quant/blocks.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))

static ALWAYS_INLINE float h2f(uint16_t h) { return _cvtsh_ss(h); }

/* Horizontal sums: fixed order, shared by every variant. */
static ALWAYS_INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static ALWAYS_INLINE float hsum4(__m128 v) {
    v = _mm_add_ps(v, _mm_movehl_ps(v, v));
    v = _mm_add_ss(v, _mm_movehdup_ps(v));
    return _mm_cvtss_f32(v);
}

/* Q4_K/Q5_K's 12 scale bytes -> 8 scales then 8 mins, as bytes of one 16-byte vector. */
static ALWAYS_INLINE __m128i k4_scales_mins(const uint8_t *p) {
    uint32_t u0, u1, u2, t[4];
    memcpy(&u0, p, 4);
    memcpy(&u1, p + 4, 4);
    memcpy(&u2, p + 8, 4);
    t[0] = u0 & 0x3f3f3f3f;
    t[1] = (u2 & 0x0f0f0f0f) | (((u0 >> 6) & 0x03030303) << 4);
    t[2] = u1 & 0x3f3f3f3f;
    t[3] = ((u2 >> 4) & 0x0f0f0f0f) | (((u1 >> 6) & 0x03030303) << 4);
    return _mm_loadu_si128((const __m128i *)t);
}

/* i16 vector of scale `j` of v16 (i16 lanes 0..7 in both 128-bit halves), repeated. */
static ALWAYS_INLINE __m256i bcast16(__m256i v16, int j) {
    return _mm256_shuffle_epi8(v16, _mm256_set1_epi16((short)((2 * j) | ((2 * j + 1) << 8))));
}


/* Q4_K/Q5_K (AVX2): sub-blocks 2j and 2j+1 of super-block i, decoded to
 * unsigned codes ql/qh with their i16 scales sl/sh, into every row's exact
 * i32 sums. */
static ALWAYS_INLINE void k45_pair_rows(__m256i ql, __m256i qh, __m256i sl, __m256i sh, int64_t i, int j, const int NA,
                                        const void *const *restrict a, __m256i *sumi) {
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) {
        const int8_t *aq = ((const block_q8_K *)a[r] + i)->qs + 64 * j;
        __m256i pl = _mm256_maddubs_epi16(ql, _mm256_loadu_si256((const __m256i *)aq));
        __m256i ph = _mm256_maddubs_epi16(qh, _mm256_loadu_si256((const __m256i *)(aq + 32)));
        sumi[r] = _mm256_add_epi32(sumi[r], _mm256_add_epi32(_mm256_madd_epi16(pl, sl), _mm256_madd_epi16(ph, sh)));
    }
}

/* Q4_K/Q5_K: super-block i's exact sums (8 i32 lanes per row) scaled into
 * acc, and its mins (m16: 8 i16) against the activation's bsums into accm. */
static ALWAYS_INLINE void k45_scale_rows(const __m256i *sumi, float d, float dmin, __m128i m16, int64_t i, const int NA,
                                         const void *const *restrict a, __m256 *acc, __m128 *accm) {
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) {
        const block_q8_K *y = (const block_q8_K *)a[r] + i;
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * y->d), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
        __m128i pairs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)y->bsums),
                                       _mm_loadu_si128((const __m128i *)(y->bsums + 8)));
        accm[r] = _mm_fmadd_ps(_mm_set1_ps(dmin * y->d), _mm_cvtepi32_ps(_mm_madd_epi16(pairs, m16)), accm[r]);
    }
}

#if defined(__AVX512F__)
/* The two 256-bit halves of 16 exact i32 sums added: lane l then holds the
 * products the AVX2 kernels' lane l holds (the same elements, summed exactly),
 * so the float work after it is the AVX2 kernels', bit for bit. */
static ALWAYS_INLINE __m256i fold(__m512i v) {
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

#if defined(__AVX512BW__)
/* Q4_K/Q5_K (AVX-512): the permutexvar maps that spread the 8 sub-block scales
 * over four zmm of i16 lanes: vector j holds sub-block 2j in lanes 0..15 and
 * 2j+1 in lanes 16..31. */
static ALWAYS_INLINE void k45_scale_maps(__m512i map[4]) {
    static const int16_t m[4][32] __attribute__((aligned(64))) = {
        {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
        {2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3},
        {4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5},
        {6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7},
    };
    for (int j = 0; j < 4; j++) map[j] = _mm512_load_si512(m[j]);
}

/* Q4_K/Q5_K (AVX-512): super-block i as four zmm of 64 unsigned codes q[j]
 * with their i16 scales sc[j], into every row's accumulators; the i32 sums are
 * folded to the AVX2 kernels' lanes (fold), so both round alike. */
static ALWAYS_INLINE void k45_rows_512(const __m512i *q, const __m512i *sc, float d, float dmin, __m128i m16, int64_t i,
                                       const int NA, const void *const *restrict a, __m256 *acc, __m128 *accm) {
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) {
        const block_q8_K *y = (const block_q8_K *)a[r] + i;
        __m512i sumi = _mm512_setzero_si512();
        #pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            __m512i p = _mm512_maddubs_epi16(q[j], _mm512_loadu_si512(y->qs + 64 * j));
            sumi = _mm512_add_epi32(sumi, _mm512_madd_epi16(p, sc[j]));
        }
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * y->d), _mm256_cvtepi32_ps(fold(sumi)), acc[r]);
        __m128i pairs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)y->bsums),
                                       _mm_loadu_si128((const __m128i *)(y->bsums + 8)));
        accm[r] = _mm_fmadd_ps(_mm_set1_ps(dmin * y->d), _mm_cvtepi32_ps(_mm_madd_epi16(pairs, m16)), accm[r]);
    }
}
#endif
#endif

#endif
