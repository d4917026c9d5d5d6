/* cpu_ssm_avx2.c: the delta rule's token step with AVX2 + FMA, bit for bit
 * the scalar form of cpu_ssm.c (delta_token): the same 4 x 16-lane dot
 * accumulators (two 8-lane registers per accumulator), the same pairwise
 * reduction, fused rank-1 updates. tests/test_backend_ops.c compares the
 * two. */
#include <immintrin.h>
#include <math.h>

#include "cpu_int.h"

/* ggml's f32 dot order (4 accumulators of 16 lanes over steps of 64, then
 * acc0+acc2, acc1+acc3, acc0+acc1, lanes l+8, l+4, then (0+2)+(1+3)); n a
 * multiple of 64 */
static inline float dot64(const float *x, const float *y, int n) {
    __m256 a[8];
    for (int j = 0; j < 8; j++) a[j] = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 64)
        for (int j = 0; j < 8; j++) a[j] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8 * j), _mm256_loadu_ps(y + i + 8 * j), a[j]);
    /* accumulator j (16 lanes) = registers 2j (lanes 0-7), 2j+1 (lanes 8-15) */
    __m256 lo = _mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6]));
    __m256 hi = _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7]));
    __m256 h = _mm256_add_ps(lo, hi);                                                    /* lane l + lane l+8 */
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));       /* l + l+4 */
    __m128 s = _mm_add_ps(q, _mm_movehl_ps(q, q));                                       /* 0+2, 1+3 */
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
}

void cpu_delta_token_avx2(float *M, int S, const float *qt, const float *kt, const float *vt, float g, float beta,
                          float *ot) {
    const float scale = 1.0f / sqrtf((float)S);
    const __m256 decay = _mm256_set1_ps(expf(g));
    for (int vi = 0; vi < S; vi++) {
        float *row = M + (size_t)vi * (size_t)S;
        for (int ki = 0; ki < S; ki += 8) _mm256_storeu_ps(row + ki, _mm256_mul_ps(_mm256_loadu_ps(row + ki), decay));
        const __m256 d = _mm256_set1_ps((vt[vi] - dot64(row, kt, S)) * beta);
        for (int ki = 0; ki < S; ki += 8)
            _mm256_storeu_ps(row + ki, _mm256_fmadd_ps(_mm256_loadu_ps(kt + ki), d, _mm256_loadu_ps(row + ki)));
        ot[vi] = dot64(row, qt, S) * scale;
    }
}
