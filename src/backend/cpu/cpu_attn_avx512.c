/* cpu_attn_avx512.c: AVX-512 (F+BW) versions of the attention kernels:
 * scores of query rows over a chunk of K rows, the weighted sum of a chunk's
 * V rows into register-resident accumulators (f32 and f16 rows; f16 widened
 * in registers), and exp of a chunk's scores. head_dim must be a multiple of
 * 16. Compiled with the AVX-512 flags; only called after cpu_attn_variants
 * saw the features at run time. */
#include "cpu_int.h"

#include <stdbool.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

static inline __m512 ld_f32(const float *p) { return _mm512_loadu_ps(p); }
static inline __m512 ld_f16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }

/* the eight sums of c0..c7's lanes, in order */
static inline __m256 reduce8(__m512 c0, __m512 c1, __m512 c2, __m512 c3, __m512 c4, __m512 c5, __m512 c6, __m512 c7) {
#define HALF(c) _mm256_add_ps(_mm512_castps512_ps256(c), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(c), 1)))
    __m256 h0 = HALF(c0), h1 = HALF(c1), h2 = HALF(c2), h3 = HALF(c3);
    __m256 h4 = HALF(c4), h5 = HALF(c5), h6 = HALF(c6), h7 = HALF(c7);
#undef HALF
    __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(h0, h1), _mm256_hadd_ps(h2, h3));
    __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(h4, h5), _mm256_hadd_ps(h6, h7));
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

static inline void store_n(float *dst, __m256 r, int n) {
    if (n == 8) {
        _mm256_storeu_ps(dst, r);
    } else {
        float t[8];
        _mm256_storeu_ps(t, r);
        for (int j = 0; j < n; j++) dst[j] = t[j];
    }
}

/* Eight K rows at a time; query rows of the same kv head go in pairs (each K
 * load, and f16 widening, serves both), one accumulator per (query row, K
 * row), then one transposing reduction per query row. The query rows sweep
 * the eight K rows' heads in order, so the rows are read front to back. */
#define SCORES512(LD, T)                                                                                     \
    const __m256 vs = _mm256_set1_ps(scale);                                                                 \
    for (int i0 = 0; i0 < np; i0 += 8) {                                                                     \
        const T *kr[8];                                                                                      \
        int nr = np - i0 < 8 ? np - i0 : 8;                                                                  \
        for (int j = 0; j < 8; j++) kr[j] = (const T *)cpu_attn_row(k, i0 + (j < nr ? j : 0));              \
        for (int qi = 0; qi < nq;) {                                                                         \
            const size_t off = (size_t)(qi / group) * (size_t)hd;                                            \
            const float *qa = q + (size_t)qi * qstride;                                                      \
            if (qi + 1 < nq && (qi + 1) / group == qi / group) {                                             \
                const float *qb = qa + qstride;                                                              \
                __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0; \
                __m512 b0 = a0, b1 = a0, b2 = a0, b3 = a0, b4 = a0, b5 = a0, b6 = a0, b7 = a0;                \
                for (size_t d = 0; d < (size_t)hd; d += 16) {                                                \
                    __m512 x = _mm512_loadu_ps(qa + d), y = _mm512_loadu_ps(qb + d), kv;                     \
                    kv = LD(kr[0] + off + d); a0 = _mm512_fmadd_ps(x, kv, a0); b0 = _mm512_fmadd_ps(y, kv, b0); \
                    kv = LD(kr[1] + off + d); a1 = _mm512_fmadd_ps(x, kv, a1); b1 = _mm512_fmadd_ps(y, kv, b1); \
                    kv = LD(kr[2] + off + d); a2 = _mm512_fmadd_ps(x, kv, a2); b2 = _mm512_fmadd_ps(y, kv, b2); \
                    kv = LD(kr[3] + off + d); a3 = _mm512_fmadd_ps(x, kv, a3); b3 = _mm512_fmadd_ps(y, kv, b3); \
                    kv = LD(kr[4] + off + d); a4 = _mm512_fmadd_ps(x, kv, a4); b4 = _mm512_fmadd_ps(y, kv, b4); \
                    kv = LD(kr[5] + off + d); a5 = _mm512_fmadd_ps(x, kv, a5); b5 = _mm512_fmadd_ps(y, kv, b5); \
                    kv = LD(kr[6] + off + d); a6 = _mm512_fmadd_ps(x, kv, a6); b6 = _mm512_fmadd_ps(y, kv, b6); \
                    kv = LD(kr[7] + off + d); a7 = _mm512_fmadd_ps(x, kv, a7); b7 = _mm512_fmadd_ps(y, kv, b7); \
                }                                                                                            \
                store_n(s + (size_t)qi * (size_t)ss + i0, _mm256_mul_ps(reduce8(a0, a1, a2, a3, a4, a5, a6, a7), vs), nr); \
                store_n(s + (size_t)(qi + 1) * (size_t)ss + i0,                                              \
                        _mm256_mul_ps(reduce8(b0, b1, b2, b3, b4, b5, b6, b7), vs), nr);                     \
                qi += 2;                                                                                     \
            } else {                                                                                         \
                __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0; \
                for (size_t d = 0; d < (size_t)hd; d += 16) {                                                \
                    __m512 x = _mm512_loadu_ps(qa + d);                                                      \
                    a0 = _mm512_fmadd_ps(x, LD(kr[0] + off + d), a0);                                        \
                    a1 = _mm512_fmadd_ps(x, LD(kr[1] + off + d), a1);                                        \
                    a2 = _mm512_fmadd_ps(x, LD(kr[2] + off + d), a2);                                        \
                    a3 = _mm512_fmadd_ps(x, LD(kr[3] + off + d), a3);                                        \
                    a4 = _mm512_fmadd_ps(x, LD(kr[4] + off + d), a4);                                        \
                    a5 = _mm512_fmadd_ps(x, LD(kr[5] + off + d), a5);                                        \
                    a6 = _mm512_fmadd_ps(x, LD(kr[6] + off + d), a6);                                        \
                    a7 = _mm512_fmadd_ps(x, LD(kr[7] + off + d), a7);                                        \
                }                                                                                            \
                store_n(s + (size_t)qi * (size_t)ss + i0, _mm256_mul_ps(reduce8(a0, a1, a2, a3, a4, a5, a6, a7), vs), nr); \
                qi++;                                                                                        \
            }                                                                                                \
        }                                                                                                    \
    }

void cpu_attn_scores_f32_avx512(const float *q, int nq, size_t qstride, int hd, int group, const cpu_attn_rows *k,
                                int np, float scale, float *s, int ss) {
    SCORES512(ld_f32, float)
}

void cpu_attn_scores_f16_avx512(const float *q, int nq, size_t qstride, int hd, int group, const cpu_attn_rows *k,
                                int np, float scale, float *s, int ss) {
    SCORES512(ld_f16, uint16_t)
}

/* acc[h][d] += sum_i w[h*ws + i] * V_i[head h / group][d]. Eight V rows at a
 * time; for each pair of heads of one kv head, a slice of NZ x 16 dims of
 * their accumulators is held in registers while the eight rows stream past,
 * each V load serving both heads. The heads sweep the rows front to back;
 * per element the terms are added in position order. */
#define WSUM_SLICE(LD, NZ, NH)                                                                               \
    do {                                                                                                     \
        __m512 x[NH][NZ];                                                                                    \
        _Pragma("GCC unroll 16") for (int hh = 0; hh < NH; hh++)                                            \
            _Pragma("GCC unroll 16") for (int z = 0; z < NZ; z++) x[hh][z] =                                \
                _mm512_loadu_ps(acc + (size_t)(h + hh) * (size_t)hd + d + 16 * z);                           \
        for (int i = i0; i < i1; i++) {                                                                      \
            __m512 v[NZ];                                                                                    \
            _Pragma("GCC unroll 16") for (int z = 0; z < NZ; z++) v[z] = LD(vr[i] + off + d + 16 * z);      \
            _Pragma("GCC unroll 16") for (int hh = 0; hh < NH; hh++) {                                      \
                __m512 c = _mm512_set1_ps(w[(size_t)(h + hh) * (size_t)ws + i]);                             \
                _Pragma("GCC unroll 16") for (int z = 0; z < NZ; z++) x[hh][z] =                            \
                    _mm512_fmadd_ps(c, v[z], x[hh][z]);                                                      \
            }                                                                                                \
        }                                                                                                    \
        _Pragma("GCC unroll 16") for (int hh = 0; hh < NH; hh++)                                            \
            _Pragma("GCC unroll 16") for (int z = 0; z < NZ; z++)                                           \
                _mm512_storeu_ps(acc + (size_t)(h + hh) * (size_t)hd + d + 16 * z, x[hh][z]);                \
    } while (0)

#define WSUM512(LD, T)                                                                                       \
    const T *vr[CPU_ATTN_SCORE_CAP];                                                                         \
    for (int i = 0; i < np; i++) vr[i] = (const T *)cpu_attn_row(v, i);                                      \
    for (int i0 = 0; i0 < np; i0 += 8) {                                                                     \
        const int i1 = np - i0 < 8 ? np : i0 + 8;                                                            \
        for (int h = 0; h < nh;) {                                                                           \
            const size_t off = (size_t)(h / group) * (size_t)hd;                                             \
            const bool two = h + 1 < nh && (h + 1) / group == h / group;                                     \
            size_t d = 0;                                                                                    \
            for (; d + 128 <= (size_t)hd; d += 128) {                                                        \
                if (two) WSUM_SLICE(LD, 8, 2);                                                               \
                else WSUM_SLICE(LD, 8, 1);                                                                   \
            }                                                                                                \
            for (; d + 64 <= (size_t)hd; d += 64) {                                                          \
                if (two) WSUM_SLICE(LD, 4, 2);                                                               \
                else WSUM_SLICE(LD, 4, 1);                                                                   \
            }                                                                                                \
            for (; d < (size_t)hd; d += 16) {                                                                \
                if (two) WSUM_SLICE(LD, 1, 2);                                                               \
                else WSUM_SLICE(LD, 1, 1);                                                                   \
            }                                                                                                \
            h += two ? 2 : 1;                                                                                \
        }                                                                                                    \
    }

void cpu_attn_wsum_f32_avx512(float *acc, int nh, int hd, int group, const float *w, int ws, const cpu_attn_rows *v,
                              int np) {
    WSUM512(ld_f32, float)
}

void cpu_attn_wsum_f16_avx512(float *acc, int nh, int hd, int group, const float *w, int ws, const cpu_attn_rows *v,
                              int np) {
    WSUM512(ld_f16, uint16_t)
}

/* e^x for x <= 0, 16 at a time (the AVX2 version's method and constants):
 * x = n ln2 + r, e^r by a degree-6 polynomial, 2^n via the exponent bits;
 * below -87 (and -inf) gives 0. */
static inline __m512 exp_neg16(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-87.0f);
    __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    x = _mm512_max_ps(x, lo);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mul_ps((__mmask16)~under, p, _mm512_castsi512_ps(e));
}

/* s[i] = e^(s[i] - mx) for i < n; returns their sum added in position order. */
float cpu_vec_exp_sub_avx512(float *s, int n, float mx) {
    __m512 m = _mm512_set1_ps(mx);
    int i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(s + i, exp_neg16(_mm512_sub_ps(_mm512_loadu_ps(s + i), m)));
    if (i < n) {
        __mmask16 k = (__mmask16)((1u << (n - i)) - 1);
        __m512 x = _mm512_maskz_loadu_ps(k, s + i);
        _mm512_mask_storeu_ps(s + i, k, exp_neg16(_mm512_sub_ps(x, m)));
    }
    float sum = 0;
    for (int j = 0; j < n; j++) sum += s[j];
    return sum;
}

#else
typedef int cpu_attn_avx512_unused; /* not an x86 build */
#endif
