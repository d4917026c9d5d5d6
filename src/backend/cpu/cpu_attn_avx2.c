/* cpu_attn_avx2.c: AVX2+FMA+F16C versions of the attention kernels (scores of
 * query rows over a chunk of K rows, a chunk's weighted sum of V rows into
 * register-resident accumulators, f32 and f16 rows; exp of a chunk's scores)
 * and the KV store's f32 -> f16 rows. Compiled with -mavx2 -mfma -mf16c;
 * only called after cpu_attn_variants saw the features at run time. */
#include "cpu_int.h"

#include <math.h>

#include "../../quant/quant.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

/* acc[h][0..hd) += sum over i < np of w[h*ws + i] * (head h/group of V row
 * i), for h < nh (np <= CPU_ATTN_SCORE_CAP). Eight rows at a time; for each
 * pair of heads of one kv head, the accumulators of a 32-wide slice stay in
 * registers while the eight rows stream past, each V load serving both
 * heads; per element the FMAs run in position order, exactly as one axpy per
 * position would. */
#define WSUM_BODY(LOAD, T)                                                                                \
    const T *vr[CPU_ATTN_SCORE_CAP];                                                                      \
    for (int i = 0; i < np; i++) vr[i] = (const T *)cpu_attn_row(v, i);                                   \
    for (int i0 = 0; i0 < np; i0 += 8) {                                                                  \
        const int i1 = np - i0 < 8 ? np : i0 + 8;                                                         \
        for (int h = 0; h < nh;) {                                                                        \
            const int two = h + 1 < nh && (h + 1) / group == h / group;                                   \
            const size_t off = (size_t)(h / group) * (size_t)hd;                                          \
            const float *w0 = w + (size_t)h * (size_t)ws, *w1 = w0 + (two ? ws : 0);                      \
            int d = 0;                                                                                    \
            for (; d + 32 <= hd; d += 32) {                                                               \
                float *a0 = acc + (size_t)h * (size_t)hd + d, *a1 = a0 + (two ? hd : 0);                  \
                __m256 x0 = _mm256_loadu_ps(a0), x1 = _mm256_loadu_ps(a0 + 8), x2 = _mm256_loadu_ps(a0 + 16), \
                       x3 = _mm256_loadu_ps(a0 + 24);                                                     \
                __m256 y0 = _mm256_loadu_ps(a1), y1 = _mm256_loadu_ps(a1 + 8), y2 = _mm256_loadu_ps(a1 + 16), \
                       y3 = _mm256_loadu_ps(a1 + 24);                                                     \
                for (int i = i0; i < i1; i++) {                                                           \
                    const T *vp = vr[i] + off + d;                                                        \
                    __m256 v0 = LOAD(vp), v1 = LOAD(vp + 8), v2 = LOAD(vp + 16), v3 = LOAD(vp + 24);      \
                    __m256 c0 = _mm256_set1_ps(w0[i]), c1 = _mm256_set1_ps(w1[i]);                        \
                    x0 = _mm256_fmadd_ps(c0, v0, x0);                                                     \
                    x1 = _mm256_fmadd_ps(c0, v1, x1);                                                     \
                    x2 = _mm256_fmadd_ps(c0, v2, x2);                                                     \
                    x3 = _mm256_fmadd_ps(c0, v3, x3);                                                     \
                    y0 = _mm256_fmadd_ps(c1, v0, y0);                                                     \
                    y1 = _mm256_fmadd_ps(c1, v1, y1);                                                     \
                    y2 = _mm256_fmadd_ps(c1, v2, y2);                                                     \
                    y3 = _mm256_fmadd_ps(c1, v3, y3);                                                     \
                }                                                                                         \
                if (two) {                                                                                \
                    _mm256_storeu_ps(a1, y0);                                                             \
                    _mm256_storeu_ps(a1 + 8, y1);                                                         \
                    _mm256_storeu_ps(a1 + 16, y2);                                                        \
                    _mm256_storeu_ps(a1 + 24, y3);                                                        \
                }                                                                                         \
                _mm256_storeu_ps(a0, x0);                                                                 \
                _mm256_storeu_ps(a0 + 8, x1);                                                             \
                _mm256_storeu_ps(a0 + 16, x2);                                                            \
                _mm256_storeu_ps(a0 + 24, x3);                                                            \
            }                                                                                             \
            for (; d < hd; d++) /* tail dims: scalar, same order */                                       \
                for (int hh = h; hh <= h + two; hh++)                                                     \
                    for (int i = i0; i < i1; i++)                                                         \
                        acc[(size_t)hh * (size_t)hd + d] = fmaf(w[(size_t)hh * (size_t)ws + i],           \
                                                                TAIL(vr[i][off + d]), acc[(size_t)hh * (size_t)hd + d]); \
            h += two ? 2 : 1;                                                                             \
        }                                                                                                 \
    }

static inline __m256 load_f32(const float *p) { return _mm256_loadu_ps(p); }
static inline __m256 load_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline float tail_f16(uint16_t h) { return _cvtsh_ss(h); }

void cpu_attn_wsum_f32_avx2(float *acc, int nh, int hd, int group, const float *w, int ws, const cpu_attn_rows *v,
                            int np) {
#define TAIL(x) (x)
    WSUM_BODY(load_f32, float)
#undef TAIL
}

void cpu_attn_wsum_f16_avx2(float *acc, int nh, int hd, int group, const float *w, int ws, const cpu_attn_rows *v,
                            int np) {
#define TAIL(x) tail_f16(x)
    WSUM_BODY(load_f16, uint16_t)
#undef TAIL
}

/* s[r*ss + i] = dot(q row r, head r/group of k_i) * scale for r < nq, i < np
 * (hd a multiple of 8): eight K rows at a time, one accumulator each, then one transposing
 * reduction for all eight instead of a horizontal sum per row; the eight rows
 * stay in L1 while every query row is scored against them. The leftover rows
 * (np % 8) go through the same reduction with repeated rows. */
#define SCORES_BODY(LOAD, T)                                                                           \
    for (int i0 = 0; i0 < np; i0 += 8) {                                                               \
        const T *kr[8];                                                                                \
        int nr = np - i0 < 8 ? np - i0 : 8;                                                            \
        for (int j = 0; j < 8; j++) kr[j] = (const T *)cpu_attn_row(k, i0 + (j < nr ? j : 0));        \
        for (int qi = 0; qi < nq; qi++) {                                                              \
            const float *qr = q + (size_t)qi * qstride;                                                \
            const size_t off = (size_t)(qi / group) * (size_t)hd;                                     \
            float *sr = s + (size_t)qi * (size_t)ss;                                                   \
            __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0; \
            for (int d = 0; d < hd; d += 8) {                                                          \
                __m256 qv = _mm256_loadu_ps(qr + d);                                                   \
                c0 = _mm256_fmadd_ps(qv, LOAD(kr[0] + off + d), c0);                                        \
                c1 = _mm256_fmadd_ps(qv, LOAD(kr[1] + off + d), c1);                                        \
                c2 = _mm256_fmadd_ps(qv, LOAD(kr[2] + off + d), c2);                                        \
                c3 = _mm256_fmadd_ps(qv, LOAD(kr[3] + off + d), c3);                                        \
                c4 = _mm256_fmadd_ps(qv, LOAD(kr[4] + off + d), c4);                                        \
                c5 = _mm256_fmadd_ps(qv, LOAD(kr[5] + off + d), c5);                                        \
                c6 = _mm256_fmadd_ps(qv, LOAD(kr[6] + off + d), c6);                                        \
                c7 = _mm256_fmadd_ps(qv, LOAD(kr[7] + off + d), c7);                                        \
            }                                                                                          \
            __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(c0, c1), _mm256_hadd_ps(c2, c3));              \
            __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(c4, c5), _mm256_hadd_ps(c6, c7));              \
            __m256 r = _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31)); \
            r = _mm256_mul_ps(r, _mm256_set1_ps(scale));                                               \
            if (nr == 8) {                                                                             \
                _mm256_storeu_ps(sr + i0, r);                                                          \
            } else {                                                                                   \
                float t[8];                                                                            \
                _mm256_storeu_ps(t, r);                                                                \
                for (int j = 0; j < nr; j++) sr[i0 + j] = t[j];                                       \
            }                                                                                          \
        }                                                                                              \
    }

void cpu_attn_scores_f32_avx2(const float *q, int nq, size_t qstride, int hd, int group, const cpu_attn_rows *k, int np,
                              float scale, float *s, int ss) {
    SCORES_BODY(load_f32, float)
}

void cpu_attn_scores_f16_avx2(const float *q, int nq, size_t qstride, int hd, int group, const cpu_attn_rows *k, int np,
                              float scale, float *s, int ss) {
    SCORES_BODY(load_f16, uint16_t)
}

/* e^x for x <= 0 (attention weights), 8 at a time: x = n ln2 + r with
 * |r| <= ln2/2, e^r by a degree-6 polynomial (relative error about 2e-7,
 * near expf's), 2^n through the exponent bits; x below -87 gives 0. */
static inline __m256 exp_neg8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.0f);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(x, lo);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

/* s[i] = e^(s[i] - mx) for i < n (every s[i] <= mx); returns their sum, added in
 * position order (as the scalar loop adds them). */
float cpu_vec_exp_sub_avx2(float *s, int n, float mx) {
    __m256 m = _mm256_set1_ps(mx);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(s + i, exp_neg8(_mm256_sub_ps(_mm256_loadu_ps(s + i), m)));
    if (i < n) {
        float t[8] = {0};
        for (int j = 0; i + j < n; j++) t[j] = s[i + j] - mx;
        _mm256_storeu_ps(t, exp_neg8(_mm256_loadu_ps(t)));
        for (int j = 0; i + j < n; j++) s[i + j] = t[j];
    }
    float sum = 0;
    for (int j = 0; j < n; j++) sum += s[j];
    return sum;
}

/* One online-softmax step of a row (see cpu_attn_softmax_fn), 8 lanes wide. */
void cpu_attn_softmax_avx2(float *s, int n, float *m, float *l, float *acc, int hd) {
    __m256 vm = _mm256_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 8 <= n; i += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(s + i));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(vm), _mm256_extractf128_ps(vm, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    float mx = _mm_cvtss_f32(h);
    for (; i < n; i++) mx = s[i] > mx ? s[i] : mx;
    if (*m > mx) mx = *m;
    float corr = expf(*m - mx); /* 0 on the first chunk (m = -inf) */
    if (corr != 1.0f) {
        __m256 c = _mm256_set1_ps(corr);
        int d = 0;
        for (; d + 8 <= hd; d += 8) _mm256_storeu_ps(acc + d, _mm256_mul_ps(c, _mm256_loadu_ps(acc + d)));
        for (; d < hd; d++) acc[d] *= corr;
        *l *= corr;
    }
    *m = mx;
    *l += cpu_vec_exp_sub_avx2(s, n, mx);
}

/* h[i] = f16(x[i]), round to nearest even like qt_f32_to_f16; NaN lanes are
 * rewritten as qt_f32_to_f16 writes them (a quiet NaN keeping the sign). */
void cpu_attn_to_f16_avx2(const float *x, uint16_t *h, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        _mm_storeu_si128((__m128i *)(h + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
        if (!_mm256_testz_ps(nan, nan))
            for (int j = 0; j < 8; j++) h[i + j] = qt_f32_to_f16(x[i + j]);
    }
    for (; i < n; i++) h[i] = qt_f32_to_f16(x[i]);
}

#else
typedef int cpu_attn_avx2_unused; /* not an x86 build */
#endif
