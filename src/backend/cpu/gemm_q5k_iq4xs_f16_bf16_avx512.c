/* gemm_q5k_iq4xs_f16_bf16_avx512.c: AVX-512 (F+BW) gemm kernels for Q5_K,
 * IQ4_XS, F16 and BF16 (compiled with -mavx512f -mavx512bw on top of AVX2;
 * gemm.c registers them behind a run-time CPU check).
 *
 * Each is bit-identical to its twin in gemm_q5k_iq4xs_f16_bf16_avx2.c, so
 * the backend may use either for any row count: the integer kernels make 16 exact i32 lanes per
 * zmm whose two halves, added, are exactly the AVX2 kernel's 8 lanes (the same
 * elements, summed exactly), then do the AVX2 kernel's float work; the float
 * kernels keep one zmm accumulator where the AVX2 kernel keeps two ymm side by
 * side (F16: acc0|acc1; BF16: e0|e1 and o0|o1), so every lane sees the same
 * FMAs in the same order, and split them back for the same tail and reduction.
 * Zen 4 runs a zmm op as two 256-bit halves: the gain is in instructions per
 * element and, for the float types, in twice the rows per weight conversion. */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "../../quant/quant.h"
#include "dot_int.h"
#include "gemm_int.h"
#include "gemm_simd.h"

/* The high 8 lanes of a zmm (AVX-512F has no extractf32x8: through the integer view). */
static ALWAYS_INLINE __m256 hi8(__m512 v) { return _mm256_castsi256_ps(_mm512_extracti64x4_epi64(_mm512_castps_si512(v), 1)); }

/* Bit b of every byte moved to bit 4, others cleared (b may be negative: a left shift). */
#define SHIFT_TO_4(v, b)                                                                                 \
    _mm512_and_si512((b) <= 4 ? _mm512_slli_epi16((v), 4 - (b) < 0 ? 0 : 4 - (b))                       \
                              : _mm512_srli_epi16((v), (b) - 4 < 0 ? 0 : (b) - 4), _mm512_set1_epi8(0x10))

static ALWAYS_INLINE void q5_K_body(int64_t k, const block_q5_K *restrict w, const int NA,
                                    const void *const *restrict a, float *restrict s) {
    const __m512i lo4 = _mm512_set1_epi8(0x0f);
    __m256 acc[CPU_GEMM_MAX_NA];
    __m128 accm[CPU_GEMM_MAX_NA];
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) {
        acc[r] = _mm256_setzero_ps();
        accm[r] = _mm_setzero_ps();
    }
    __m512i map[4];
    k45_scale_maps(map);
    for (int64_t i = 0; i < k / QK_K; i++) {
        const block_q5_K *b = &w[i];
        __m128i sm = k4_scales_mins(b->scales);
        __m512i sc16 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(sm));
        __m128i m16 = _mm_cvtepu8_epi16(_mm_srli_si128(sm, 8));
        /* fifth bits: [qh | qh >> 1], so that one shift puts bit 2j (low half) and 2j+1 (high half) at bit 4 */
        __m256i hb = _mm256_loadu_si256((const __m256i *)b->qh);
        __m512i hz = _mm512_inserti64x4(_mm512_castsi256_si512(hb), _mm256_srli_epi16(hb, 1), 1);
        __m512i q[4], sc[4];
        #pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            __m256i q32 = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * j));
            __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(q32), _mm256_srli_epi16(q32, 4), 1);
            q[j] = _mm512_or_si512(_mm512_and_si512(v, lo4), SHIFT_TO_4(hz, 2 * j));
            sc[j] = _mm512_permutexvar_epi16(map[j], sc16);
        }
        k45_rows_512(q, sc, h2f(b->d), h2f(b->dmin), m16, i, NA, a, acc, accm);
    }
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) s[r] = hsum8(acc[r]) - hsum4(accm[r]);
}

/* IQ4_XS: per 64 weights (sub-blocks 2j, 2j+1) one zmm of signed table values
 * in the order [2j: 0..15 | 16..31 | 2j+1: 0..15 | 16..31]; the sign trick by
 * mask: |w| times a negated where w < 0 (exact, |a| <= 127). */
static ALWAYS_INLINE void iq4_xs_body(int64_t k, const block_iq4_xs *restrict w, const int NA,
                                      const void *const *restrict a, float *restrict s) {
    const __m512i table = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)cpu_kvalues_iq4nl));
    const __m512i lo4 = _mm512_set1_epi8(0x0f);
    __m256 acc[CPU_GEMM_MAX_NA];
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) acc[r] = _mm256_setzero_ps();
    __m512i map[4];
    k45_scale_maps(map);
    for (int64_t i = 0; i < k / QK_K; i++) {
        const block_iq4_xs *b = &w[i];
        /* the 8 six-bit scales: low nibbles of scales_l interleaved (ib even: low, odd: high), high bits from scales_h */
        uint32_t sl;
        memcpy(&sl, b->scales_l, 4);
        uint64_t h = b->scales_h, hs = 0;
        #pragma GCC unroll 8
        for (int ib = 0; ib < 8; ib++) hs |= ((h >> (2 * ib)) & 3) << (8 * ib + 4);
        __m128i lv = _mm_cvtsi32_si128((int)sl);
        lv = _mm_unpacklo_epi8(_mm_and_si128(lv, _mm_set1_epi8(0x0f)), _mm_and_si128(_mm_srli_epi16(lv, 4), _mm_set1_epi8(0x0f)));
        lv = _mm_or_si128(lv, _mm_cvtsi64_si128((long long)hs));
        __m512i sc16 = _mm512_castsi128_si512(_mm_sub_epi16(_mm_cvtepu8_epi16(lv), _mm_set1_epi16(32)));
        __m512i q[4], sc[4];
        __mmask64 neg[4];
        #pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * j));
            __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4), 1);
            z = _mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0)); /* [lo 2j | hi 2j | lo 2j+1 | hi 2j+1] */
            __m512i wv = _mm512_shuffle_epi8(table, _mm512_and_si512(z, lo4));
            neg[j] = _mm512_movepi8_mask(wv);
            q[j] = _mm512_abs_epi8(wv);
            sc[j] = _mm512_permutexvar_epi16(map[j], sc16);
        }
        const float d = h2f(b->d);
        #pragma GCC unroll 8
        for (int r = 0; r < NA; r++) {
            const block_q8_K *y = (const block_q8_K *)a[r] + i;
            __m512i sumi = _mm512_setzero_si512();
            #pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                __m512i av = _mm512_loadu_si512(y->qs + 64 * j);
                av = _mm512_mask_sub_epi8(av, neg[j], _mm512_setzero_si512(), av);
                sumi = _mm512_add_epi32(sumi, _mm512_madd_epi16(_mm512_maddubs_epi16(q[j], av), sc[j]));
            }
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * y->d), _mm256_cvtepi32_ps(fold(sumi)), acc[r]);
        }
    }
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) s[r] = hsum8(acc[r]);
}

/* F16: one zmm per row = the AVX2 kernel's acc0 | acc1. */
static ALWAYS_INLINE void f16_body(int64_t k, const uint16_t *restrict w, const int NA, const void *const *restrict a,
                                   float *restrict s) {
    __m512 acc[CPU_GEMM_MAX_NA];
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) acc[r] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        __m512 wv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + i)));
        #pragma GCC unroll 8
        for (int r = 0; r < NA; r++) acc[r] = _mm512_fmadd_ps(wv, _mm512_loadu_ps((const float *)a[r] + i), acc[r]);
    }
    const bool run8 = i + 8 <= k;
    __m256 wt = run8 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + i))) : _mm256_setzero_ps();
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) {
        const float *x = (const float *)a[r];
        __m256 t = _mm512_castps512_ps256(acc[r]);
        int64_t j = i;
        if (run8) {
            t = _mm256_fmadd_ps(wt, _mm256_loadu_ps(x + j), t);
            j += 8;
        }
        float sum = hsum8(_mm256_add_ps(t, hi8(acc[r])));
        for (; j < k; j++) sum += h2f(w[j]) * x[j];
        s[r] = sum;
    }
}

/* BF16: per row one zmm of even products (the AVX2 kernel's e0 | e1) and one of odd (o0 | o1). */
static ALWAYS_INLINE __m512 bf_even(__m512i v) { return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)); }
static ALWAYS_INLINE __m512 bf_odd(__m512i v) {
    return _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)0xffff0000u)));
}
static ALWAYS_INLINE __m256 bf_even8(__m256i v) { return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)); }
static ALWAYS_INLINE __m256 bf_odd8(__m256i v) {
    return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u)));
}

static ALWAYS_INLINE void bf16_body(int64_t k, const uint16_t *restrict w, const int NA, const void *const *restrict a,
                                    float *restrict s) {
    __m512 e[4], o[4];
    #pragma GCC unroll 4
    for (int r = 0; r < NA; r++) e[r] = o[r] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= k; i += 32) {
        __m512i v = _mm512_loadu_si512(w + i);
        __m512 we = bf_even(v), wo = bf_odd(v);
        #pragma GCC unroll 4
        for (int r = 0; r < NA; r++) {
            __m512i x = _mm512_loadu_si512((const uint16_t *)a[r] + i);
            e[r] = _mm512_fmadd_ps(we, bf_even(x), e[r]);
            o[r] = _mm512_fmadd_ps(wo, bf_odd(x), o[r]);
        }
    }
    #pragma GCC unroll 4
    for (int r = 0; r < NA; r++) {
        const uint16_t *x = (const uint16_t *)a[r];
        __m256 te = _mm512_castps512_ps256(e[r]), to = _mm512_castps512_ps256(o[r]);
        int64_t j = i;
        if (j + 16 <= k) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(w + j)), xv = _mm256_loadu_si256((const __m256i *)(x + j));
            te = _mm256_fmadd_ps(bf_even8(v), bf_even8(xv), te);
            to = _mm256_fmadd_ps(bf_odd8(v), bf_odd8(xv), to);
            j += 16;
        }
        float sum = hsum8(_mm256_add_ps(_mm256_add_ps(te, hi8(e[r])),
                                        _mm256_add_ps(to, hi8(o[r]))));
        for (; j < k; j++) sum += qt_bf16_to_f32(w[j]) * qt_bf16_to_f32(x[j]);
        s[r] = sum;
    }
}

void cpu_gemm_q5_K_avx512(int64_t k, const void *restrict w, int na, const void *const *restrict a, float *restrict s) {
    GEMM_DISPATCH(q5_K_body, block_q5_K)
}
void cpu_gemm_iq4_xs_avx512(int64_t k, const void *restrict w, int na, const void *const *restrict a, float *restrict s) {
    GEMM_DISPATCH(iq4_xs_body, block_iq4_xs)
}
void cpu_gemm_f16_avx512(int64_t k, const void *restrict w, int na, const void *const *restrict a, float *restrict s) {
    GEMM_DISPATCH(f16_body, uint16_t)
}
void cpu_gemm_bf16_avx512(int64_t k, const void *restrict w, int na, const void *const *restrict a, float *restrict s) {
    for (int r0 = 0; r0 < na; r0 += 4) {
        int n = na - r0 < 4 ? na - r0 : 4;
        switch (n) {
        case 1: bf16_body(k, w, 1, a + r0, s + r0); break;
        case 2: bf16_body(k, w, 2, a + r0, s + r0); break;
        case 3: bf16_body(k, w, 3, a + r0, s + r0); break;
        default: bf16_body(k, w, 4, a + r0, s + r0); break;
        }
    }
}

#else
typedef int hn_gemm_q5k_iq4xs_f16_bf16_avx512_unused;
#endif
