/* pack_q0_avx2.c: AVX2 kernels for the x16 layouts of Q4_0 and Q8_0
 * (pack_q0.h; compiled with AVX2+FMA+F16C, registered behind a run-time
 * check).
 *
 * A 64-byte vector of the layout is two ymm halves of 8 rows each; a kernel
 * pass covers one half for up to 4 activation rows (16 ymm registers), so the
 * group is read from L1 once per half and per 4 rows. vpmaddubsw (unsigned
 * code x signed activation, pairs) and vpmaddwd by ones give the same exact
 * i32 sums per 4 elements as vpdpbusd. Q4_0's codes start from the prepped
 * -8 x sum correction, as in the VNNI kernel; Q8_0's biased codes would
 * saturate vpmaddubsw, so they are un-biased and take the sign trick instead
 * (|w| x sign(a, w)), which gives the signed sum directly. Either way the
 * block sums, and so the results, equal the VNNI kernel's bit for bit. */
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <immintrin.h>
#include <string.h>

#include "pack_q0.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))

static ALWAYS_INLINE __m256i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* rows 8h..8h+7 of the group against NA (<= 4) activation rows; s = row 0's outputs */
static ALWAYS_INLINE void q4_0_half(int64_t k, const unsigned char *restrict g, int h, const int NA,
                                    const void *const *restrict a, float *restrict s) {
    const int64_t nb = k / 32;
    
    const __m256i lo4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    __m256 acc[4];
    #pragma GCC unroll 4
    for (int r = 0; r < NA; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const unsigned char *cb = g + (size_t)b * PQ4_BS + 32 * h;
        __m256i sum[4];
        #pragma GCC unroll 4
        for (int r = 0; r < NA; r++) sum[r] = _mm256_set1_epi32(((const pq0_act *)a[r])[b].c4);
        #pragma GCC unroll 4
        for (int v = 0; v < 4; v++) {
            __m256i raw = _mm256_loadu_si256((const __m256i *)(cb + 64 * v));
            __m256i lo = _mm256_and_si256(raw, lo4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), lo4);
            #pragma GCC unroll 4
            for (int r = 0; r < NA; r++) {
                const pq0_act *y = (const pq0_act *)a[r] + b;
                __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, bcast4(y->qs + 4 * v)),
                                             _mm256_maddubs_epi16(hi, bcast4(y->qs + 16 + 4 * v)));
                sum[r] = _mm256_add_epi32(sum[r], _mm256_madd_epi16(p, ones));
            }
        }
        __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(PQ4_D(g, b) + 8 * h)));
        #pragma GCC unroll 4
        for (int r = 0; r < NA; r++) {
            const pq0_act *y = (const pq0_act *)a[r] + b;
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(y->d)), _mm256_cvtepi32_ps(sum[r]), acc[r]);
        }
    }
    #pragma GCC unroll 4
    for (int r = 0; r < NA; r++) _mm256_storeu_ps(s + (size_t)r * PQ0_R + 8 * h, acc[r]);
}

static ALWAYS_INLINE void q8_0_half(int64_t k, const unsigned char *restrict g, int h, const int NA,
                                    const void *const *restrict a, float *restrict s) {
    const int64_t nb = k / 32;
    
    const __m256i bias = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    __m256 acc[4];
    #pragma GCC unroll 4
    for (int r = 0; r < NA; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const unsigned char *cb = g + (size_t)b * PQ8_BS + 32 * h;
        __m256i sum[4];
        #pragma GCC unroll 4
        for (int r = 0; r < NA; r++) sum[r] = _mm256_setzero_si256();
        #pragma GCC unroll 8
        for (int q = 0; q < 8; q++) {
            __m256i w = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(cb + 64 * q)), bias);
            __m256i aw = _mm256_abs_epi8(w);
            #pragma GCC unroll 4
            for (int r = 0; r < NA; r++) {
                const pq0_act *y = (const pq0_act *)a[r] + b;
                __m256i p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(bcast4(y->qs + 4 * q), w));
                sum[r] = _mm256_add_epi32(sum[r], _mm256_madd_epi16(p, ones));
            }
        }
        __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(PQ8_D(g, b) + 8 * h)));
        #pragma GCC unroll 4
        for (int r = 0; r < NA; r++) {
            const pq0_act *y = (const pq0_act *)a[r] + b;
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(y->d)), _mm256_cvtepi32_ps(sum[r]), acc[r]);
        }
    }
    #pragma GCC unroll 4
    for (int r = 0; r < NA; r++) _mm256_storeu_ps(s + (size_t)r * PQ0_R + 8 * h, acc[r]);
}

/* both halves, activation rows four at a time */
#define HALVES(body)                                                                 \
    for (int r0 = 0; r0 < na; r0 += 4) {                                             \
        int n4 = na - r0 < 4 ? na - r0 : 4;                                          \
        float *o = s + (size_t)r0 * PQ0_R;                                           \
        for (int h = 0; h < 2; h++) switch (n4) {                                    \
            case 1: body(k, g, h, 1, a + r0, o); break;                              \
            case 2: body(k, g, h, 2, a + r0, o); break;                              \
            case 3: body(k, g, h, 3, a + r0, o); break;                              \
            default: body(k, g, h, 4, a + r0, o); break;                             \
            }                                                                        \
    }

void cpu_pack_q4_0x16_avx2(int64_t k, const void *restrict g, int na, const void *const *restrict a, float *restrict s) {
    HALVES(q4_0_half)
}

void cpu_pack_q8_0x16_avx2(int64_t k, const void *restrict g, int na, const void *const *restrict a, float *restrict s) {
    HALVES(q8_0_half)
}

#endif
