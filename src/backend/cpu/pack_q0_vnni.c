/* pack_q0_vnni.c: AVX-512 VNNI kernels for the x16 layouts of Q4_0 and Q8_0
 * (pack_q0.h; compiled with AVX-512 F+BW+VL+VNNI, registered behind a
 * run-time check).
 *
 * Per block, each 64-byte vector holds 16 rows x 4 unsigned codes; vpdpbusd
 * against one 4-byte piece of the activation block broadcast to all lanes
 * adds those 4 products into each row's i32 lane, so 4 (Q4_0: low and high
 * nibbles of 4 loads) or 8 (Q8_0) instructions give the block's 16 row sums
 * per activation row. The sums start at the prepped correction (-8 or -128 x
 * the activation block's sum), which makes them the exact signed dot. The
 * weight vectors are decoded once per block for all na activation rows. */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__AVX512VL__)

#include <immintrin.h>
#include <string.h>

#include "pack_q0.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))

static ALWAYS_INLINE __m512i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

static ALWAYS_INLINE void q4_0_body(int64_t k, const unsigned char *restrict g, const int NA,
                                    const void *const *restrict a, float *restrict s) {
    const int64_t nb = k / 32;
    
    const __m512i lo4 = _mm512_set1_epi8(0x0f);
    /* two i32 chains per row when few rows hide vpdpbusd's latency (integer
     * sums: the split does not change the result) */
    const int CH = NA <= 2 ? 2 : 1;
    __m512 acc[CPU_PACK_MAX_NA];
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const unsigned char *cb = g + (size_t)b * PQ4_BS;
        __m512i sum[CPU_PACK_MAX_NA], sum2[CPU_PACK_MAX_NA];
        #pragma GCC unroll 8
        for (int r = 0; r < NA; r++) {
            sum[r] = _mm512_set1_epi32(((const pq0_act *)a[r])[b].c4);
            sum2[r] = _mm512_setzero_si512();
        }
        #pragma GCC unroll 4
        for (int v = 0; v < 4; v++) {
            __m512i raw = _mm512_loadu_si512(cb + 64 * v);
            __m512i lo = _mm512_and_si512(raw, lo4), hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), lo4);
            #pragma GCC unroll 8
            for (int r = 0; r < NA; r++) {
                const pq0_act *y = (const pq0_act *)a[r] + b;
                sum[r] = _mm512_dpbusd_epi32(sum[r], lo, bcast4(y->qs + 4 * v));
                if (CH == 2)
                    sum2[r] = _mm512_dpbusd_epi32(sum2[r], hi, bcast4(y->qs + 16 + 4 * v));
                else
                    sum[r] = _mm512_dpbusd_epi32(sum[r], hi, bcast4(y->qs + 16 + 4 * v));
            }
        }
        __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)PQ4_D(g, b)));
        #pragma GCC unroll 8
        for (int r = 0; r < NA; r++) {
            const pq0_act *y = (const pq0_act *)a[r] + b;
            __m512i t = CH == 2 ? _mm512_add_epi32(sum[r], sum2[r]) : sum[r];
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(y->d)), _mm512_cvtepi32_ps(t), acc[r]);
        }
    }
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) _mm512_storeu_ps(s + (size_t)r * PQ0_R, acc[r]);
}

static ALWAYS_INLINE void q8_0_body(int64_t k, const unsigned char *restrict g, const int NA,
                                    const void *const *restrict a, float *restrict s) {
    const int64_t nb = k / 32;
    
    const int CH = NA <= 2 ? 2 : 1;
    __m512 acc[CPU_PACK_MAX_NA];
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const unsigned char *cb = g + (size_t)b * PQ8_BS;
        __m512i sum[CPU_PACK_MAX_NA], sum2[CPU_PACK_MAX_NA];
        #pragma GCC unroll 8
        for (int r = 0; r < NA; r++) {
            sum[r] = _mm512_set1_epi32(((const pq0_act *)a[r])[b].c8);
            sum2[r] = _mm512_setzero_si512();
        }
        #pragma GCC unroll 8
        for (int q = 0; q < 8; q++) {
            __m512i w = _mm512_loadu_si512(cb + 64 * q);
            #pragma GCC unroll 8
            for (int r = 0; r < NA; r++) {
                const pq0_act *y = (const pq0_act *)a[r] + b;
                if (CH == 2 && (q & 1))
                    sum2[r] = _mm512_dpbusd_epi32(sum2[r], w, bcast4(y->qs + 4 * q));
                else
                    sum[r] = _mm512_dpbusd_epi32(sum[r], w, bcast4(y->qs + 4 * q));
            }
        }
        __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)PQ8_D(g, b)));
        #pragma GCC unroll 8
        for (int r = 0; r < NA; r++) {
            const pq0_act *y = (const pq0_act *)a[r] + b;
            __m512i t = CH == 2 ? _mm512_add_epi32(sum[r], sum2[r]) : sum[r];
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(y->d)), _mm512_cvtepi32_ps(t), acc[r]);
        }
    }
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) _mm512_storeu_ps(s + (size_t)r * PQ0_R, acc[r]);
}

#define PACK_DISPATCH(body)                    \
    switch (na) {                              \
    case 1: body(k, g, 1, a, s); break;        \
    case 2: body(k, g, 2, a, s); break;        \
    case 3: body(k, g, 3, a, s); break;        \
    case 4: body(k, g, 4, a, s); break;        \
    case 5: body(k, g, 5, a, s); break;        \
    case 6: body(k, g, 6, a, s); break;        \
    case 7: body(k, g, 7, a, s); break;        \
    default: body(k, g, 8, a, s); break;       \
    }

void cpu_pack_q4_0x16_vnni(int64_t k, const void *restrict g, int na, const void *const *restrict a, float *restrict s) {
    PACK_DISPATCH(q4_0_body)
}

void cpu_pack_q8_0x16_vnni(int64_t k, const void *restrict g, int na, const void *const *restrict a, float *restrict s) {
    PACK_DISPATCH(q8_0_body)
}

#endif
