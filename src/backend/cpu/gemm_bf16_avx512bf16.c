/* gemm_bf16_avx512bf16.c: the BF16 gemm kernel on vdpbf16ps (AVX512_BF16;
 * compiled with -mavx512bf16 on top of AVX-512 F+BW; gemm.c registers it
 * behind a run-time check of cpu_features.avx512bf16).
 *
 * vdpbf16ps multiplies pairs of bf16 weights and bf16 activations straight
 * from memory and adds both products into an f32 lane: no widening, one
 * instruction per 32 products and row. Its rounding (two adds per lane, and
 * denormals flushed) is not that of gemm_q5k_iq4xs_f16_bf16_avx2.c, so this
 * variant is not bit-identical to the others; the backend never mixes it
 * with them (it is the BF16 pick for every row count), and each row's
 * arithmetic is fixed: two accumulators (elements 64i..64i+31 and
 * 64i+32..64i+63), the rest into the first by a masked load (zeros add
 * nothing), the sum reduced in a fixed order. Rows go in groups of 4. */
#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__)

#include <immintrin.h>

#include "gemm_int.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))

static ALWAYS_INLINE __m512bh ld(const uint16_t *p) { return (__m512bh)_mm512_loadu_si512(p); }

static ALWAYS_INLINE void body(int64_t k, const uint16_t *restrict w, const int NA, const void *const *restrict a,
                               float *restrict s) {
    __m512 acc0[4], acc1[4];
    #pragma GCC unroll 4
    for (int r = 0; r < NA; r++) acc0[r] = acc1[r] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 64 <= k; i += 64) {
        __m512bh w0 = ld(w + i), w1 = ld(w + i + 32);
        #pragma GCC unroll 4
        for (int r = 0; r < NA; r++) {
            const uint16_t *x = (const uint16_t *)a[r] + i;
            acc0[r] = _mm512_dpbf16_ps(acc0[r], w0, ld(x));
            acc1[r] = _mm512_dpbf16_ps(acc1[r], w1, ld(x + 32));
        }
    }
    for (; i < k; i += 32) {
        __mmask32 m = k - i >= 32 ? 0xffffffffu : (__mmask32)((1u << (k - i)) - 1);
        __m512bh wt = (__m512bh)_mm512_maskz_loadu_epi16(m, w + i);
        #pragma GCC unroll 4
        for (int r = 0; r < NA; r++)
            acc0[r] = _mm512_dpbf16_ps(acc0[r], wt, (__m512bh)_mm512_maskz_loadu_epi16(m, (const uint16_t *)a[r] + i));
    }
    #pragma GCC unroll 4
    for (int r = 0; r < NA; r++) s[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[r], acc1[r]));
}

void cpu_gemm_bf16_avx512bf16(int64_t k, const void *restrict w, int na, const void *const *restrict a,
                              float *restrict s) {
    for (int r0 = 0; r0 < na; r0 += 4) {
        int n = na - r0 < 4 ? na - r0 : 4;
        switch (n) {
        case 1: body(k, w, 1, a + r0, s + r0); break;
        case 2: body(k, w, 2, a + r0, s + r0); break;
        case 3: body(k, w, 3, a + r0, s + r0); break;
        default: body(k, w, 4, a + r0, s + r0); break;
        }
    }
}

#else
typedef int hn_gemm_bf16_avx512bf16_unused;
#endif
