/* cpu_vec_avx2.c: AVX2+FMA+F16C versions of the vector helpers the CPU
 * backend's attention uses (dot product, y += a*x, a chunk's weighted sum of
 * V rows into register-resident accumulators; f32 and f16 rows). Compiled
 * with -mavx2 -mfma -mf16c; only called after cpu_vec_select saw the features
 * at run time. */
#include "cpu_int.h"

#include <math.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

float cpu_vec_dot_avx2(const float *a, const float *b, int n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s0 = _mm256_add_ps(s0, s1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s0), _mm256_extractf128_ps(s0, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    float s = _mm_cvtss_f32(h);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

void cpu_vec_axpy_avx2(float *y, float a, const float *x, int n) {
    __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

/* acc[h][0..hd) += sum over i < np of w[h*ws + i] * v_i (v_i = V row i,
 * vstride elements apart), for heads h < group. The accumulators of a 32-wide
 * slice of two heads stay in registers while the chunk's V rows stream past,
 * each V load serving both heads; per element the FMAs run in position order,
 * exactly as one axpy per position would. */
#define WSUM_BODY(LOAD)                                                                                   \
    int d = 0;                                                                                            \
    for (; d + 32 <= hd; d += 32) {                                                                       \
        for (int h = 0; h < group; h += 2) {                                                              \
            int two = h + 1 < group;                                                                      \
            float *a0 = acc + (size_t)h * (size_t)hd + d, *a1 = a0 + (two ? hd : 0);                    \
            __m256 x0 = _mm256_loadu_ps(a0), x1 = _mm256_loadu_ps(a0 + 8), x2 = _mm256_loadu_ps(a0 + 16),  \
                   x3 = _mm256_loadu_ps(a0 + 24);                                                         \
            __m256 y0 = _mm256_loadu_ps(a1), y1 = _mm256_loadu_ps(a1 + 8), y2 = _mm256_loadu_ps(a1 + 16),  \
                   y3 = _mm256_loadu_ps(a1 + 24);                                                         \
            const float *w0 = w + (size_t)h * (size_t)ws, *w1 = w0 + (two ? ws : 0);                      \
            for (int i = 0; i < np; i++) {                                                                \
                __m256 v0 = LOAD(v + (size_t)i * vstride + d), v1 = LOAD(v + (size_t)i * vstride + d + 8);   \
                __m256 v2 = LOAD(v + (size_t)i * vstride + d + 16), v3 = LOAD(v + (size_t)i * vstride + d + 24); \
                __m256 c0 = _mm256_set1_ps(w0[i]), c1 = _mm256_set1_ps(w1[i]);                            \
                x0 = _mm256_fmadd_ps(c0, v0, x0);                                                         \
                x1 = _mm256_fmadd_ps(c0, v1, x1);                                                         \
                x2 = _mm256_fmadd_ps(c0, v2, x2);                                                         \
                x3 = _mm256_fmadd_ps(c0, v3, x3);                                                         \
                y0 = _mm256_fmadd_ps(c1, v0, y0);                                                         \
                y1 = _mm256_fmadd_ps(c1, v1, y1);                                                         \
                y2 = _mm256_fmadd_ps(c1, v2, y2);                                                         \
                y3 = _mm256_fmadd_ps(c1, v3, y3);                                                         \
            }                                                                                             \
            if (two) {                                                                                    \
                _mm256_storeu_ps(a1, y0);                                                                 \
                _mm256_storeu_ps(a1 + 8, y1);                                                             \
                _mm256_storeu_ps(a1 + 16, y2);                                                            \
                _mm256_storeu_ps(a1 + 24, y3);                                                            \
            }                                                                                             \
            _mm256_storeu_ps(a0, x0);                                                                     \
            _mm256_storeu_ps(a0 + 8, x1);                                                                 \
            _mm256_storeu_ps(a0 + 16, x2);                                                                \
            _mm256_storeu_ps(a0 + 24, x3);                                                                \
        }                                                                                                 \
    }                                                                                                     \
    for (; d < hd; d++) /* tail dims: scalar, same order */                                               \
        for (int h = 0; h < group; h++)                                                                   \
            for (int i = 0; i < np; i++)                                                                  \
                acc[(size_t)h * (size_t)hd + d] = fmaf(w[(size_t)h * (size_t)ws + i], TAIL(v[(size_t)i * vstride + d]), \
                                                       acc[(size_t)h * (size_t)hd + d]);

static inline __m256 load_f32(const float *p) { return _mm256_loadu_ps(p); }
static inline __m256 load_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline float tail_f16(uint16_t h) { return _cvtsh_ss(h); }

void cpu_attn_wsum_f32_avx2(float *acc, int group, int hd, const float *w, int ws, const float *v, size_t vstride,
                            int np) {
#define TAIL(x) (x)
    WSUM_BODY(load_f32)
#undef TAIL
}

void cpu_attn_wsum_f16_avx2(float *acc, int group, int hd, const float *w, int ws, const uint16_t *v, size_t vstride,
                            int np) {
#define TAIL(x) tail_f16(x)
    WSUM_BODY(load_f16)
#undef TAIL
}

/* dot(q, k) with k in f16, summed as cpu_vec_dot_avx2 sums (same result as
 * dotting the f32-converted row). */
float cpu_vec_dot_f16_avx2(const float *a, const uint16_t *b, int n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load_f16(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), load_f16(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load_f16(b + i), s0);
    s0 = _mm256_add_ps(s0, s1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s0), _mm256_extractf128_ps(s0, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    float s = _mm_cvtss_f32(h);
    for (; i < n; i++) s += a[i] * tail_f16(b[i]);
    return s;
}

#else
typedef int cpu_vec_avx2_unused; /* not an x86 build */
#endif
