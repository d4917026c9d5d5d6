/* cpu_attn_avx512.c: AVX-512 (F+BW) versions of the attention kernels:
 * scores of query rows over a chunk of K rows, the weighted sum of a chunk's
 * V rows into register-resident accumulators (f32 and f16 rows; f16 widened
 * in registers), and exp of a chunk's scores. head_dim must be a multiple of
 * 16. Compiled with the AVX-512 flags; only called after cpu_attn_variants
 * saw the features at run time. */
#include "cpu_int.h"

#include <math.h>
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

/* ---- tiles of query rows (prefill) ---- */

/* lane j of the result = sum of cj's lanes, for 16 accumulators (a
 * transposing reduction: 45 operations for all sixteen) */
static inline __m512 pair_ps(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
}
static inline __m512 pair_pd(__m512 a, __m512 b) {
    __m512d x = _mm512_castps_pd(a), y = _mm512_castps_pd(b);
    return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
}
static inline __m512 reduce16(__m512 c0, __m512 c1, __m512 c2, __m512 c3, __m512 c4, __m512 c5, __m512 c6, __m512 c7,
                              __m512 c8, __m512 c9, __m512 c10, __m512 c11, __m512 c12, __m512 c13, __m512 c14,
                              __m512 c15) {
    __m512 v0 = pair_pd(pair_ps(c0, c1), pair_ps(c2, c3)), v1 = pair_pd(pair_ps(c4, c5), pair_ps(c6, c7));
    __m512 v2 = pair_pd(pair_ps(c8, c9), pair_ps(c10, c11)), v3 = pair_pd(pair_ps(c12, c13), pair_ps(c14, c15));
    __m512 x01 = _mm512_add_ps(_mm512_shuffle_f32x4(v0, v1, 0x44), _mm512_shuffle_f32x4(v0, v1, 0xEE));
    __m512 x23 = _mm512_add_ps(_mm512_shuffle_f32x4(v2, v3, 0x44), _mm512_shuffle_f32x4(v2, v3, 0xEE));
    return _mm512_add_ps(_mm512_shuffle_f32x4(x01, x23, 0x88), _mm512_shuffle_f32x4(x01, x23, 0xDD));
}

/* s[r*ss + i] = dot(q[r], K row i) * scale: register tiles of four query rows
 * by four K rows (each K load serves four rows, each q load four K rows),
 * one reduction per tile; four K rows stay in L1 while every query row goes
 * past them. */
#define ROW4(j, x)                                                                                           \
    c##j##0 = _mm512_fmadd_ps(x, k0, c##j##0);                                                               \
    c##j##1 = _mm512_fmadd_ps(x, k1, c##j##1);                                                               \
    c##j##2 = _mm512_fmadd_ps(x, k2, c##j##2);                                                               \
    c##j##3 = _mm512_fmadd_ps(x, k3, c##j##3);
#define SCORES_TILE512(LD, T)                                                                                \
    const __m512 vs = _mm512_set1_ps(scale);                                                                 \
    for (int i0 = 0; i0 < np; i0 += 4) {                                                                     \
        const T *kr[4];                                                                                      \
        int nr = np - i0 < 4 ? np - i0 : 4;                                                                  \
        for (int j = 0; j < 4; j++) kr[j] = (const T *)cpu_attn_row(k, i0 + (j < nr ? j : 0));              \
        for (int r0 = 0; r0 < nq; r0 += 4) {                                                                 \
            int nqq = nq - r0 < 4 ? nq - r0 : 4;                                                             \
            const float *q0 = q[r0], *q1 = q[r0 + (nqq > 1)], *q2 = q[r0 + (nqq > 2 ? 2 : 0)],               \
                        *q3 = q[r0 + (nqq > 3 ? 3 : 0)];                                                     \
            __m512 c00 = _mm512_setzero_ps(), c01 = c00, c02 = c00, c03 = c00, c10 = c00, c11 = c00, c12 = c00, \
                   c13 = c00, c20 = c00, c21 = c00, c22 = c00, c23 = c00, c30 = c00, c31 = c00, c32 = c00, c33 = c00; \
            for (int d = 0; d < hd; d += 16) {                                                               \
                __m512 k0 = LD(kr[0] + d), k1 = LD(kr[1] + d), k2 = LD(kr[2] + d), k3 = LD(kr[3] + d);       \
                __m512 x0 = _mm512_loadu_ps(q0 + d), x1 = _mm512_loadu_ps(q1 + d);                           \
                ROW4(0, x0) ROW4(1, x1)                                                                      \
                __m512 x2 = _mm512_loadu_ps(q2 + d), x3 = _mm512_loadu_ps(q3 + d);                           \
                ROW4(2, x2) ROW4(3, x3)                                                                      \
            }                                                                                                \
            __m512 r = _mm512_mul_ps(reduce16(c00, c01, c02, c03, c10, c11, c12, c13, c20, c21, c22, c23, c30, \
                                              c31, c32, c33), vs);                                           \
            float t[16];                                                                                     \
            _mm512_storeu_ps(t, r);                                                                          \
            for (int j = 0; j < nqq; j++)                                                                    \
                for (int e = 0; e < nr; e++) s[(size_t)(r0 + j) * (size_t)ss + (size_t)(i0 + e)] = t[4 * j + e]; \
        }                                                                                                    \
    }

void cpu_attn_scores_tile_f32_avx512(const float *const *q, int nq, int hd, const cpu_attn_rows *k, int np,
                                     float scale, float *s, int ss) {
    SCORES_TILE512(ld_f32, float)
}

void cpu_attn_scores_tile_f16_avx512(const float *const *q, int nq, int hd, const cpu_attn_rows *k, int np,
                                     float scale, float *s, int ss) {
    SCORES_TILE512(ld_f16, uint16_t)
}

/* acc[r][d] += sum_i w[r*ws + i] * V_i[d]: a slice of NZ x 16 dims of NH
 * (<= 4) rows' accumulators in registers while the chunk's V rows stream
 * past, each V load serving NH rows; terms added in position order. */
#define WTILE_SLICE(LD, NZ, NH)                                                                              \
    do {                                                                                                     \
        __m512 x[NH][NZ];                                                                                    \
        _Pragma("GCC unroll 16") for (int hh = 0; hh < NH; hh++)                                            \
            _Pragma("GCC unroll 16") for (int z = 0; z < NZ; z++) x[hh][z] =                                \
                _mm512_loadu_ps(acc[r0 + hh] + d + 16 * z);                                                  \
        for (int i = 0; i < np; i++) {                                                                       \
            __m512 v[NZ];                                                                                    \
            _Pragma("GCC unroll 16") for (int z = 0; z < NZ; z++) v[z] = LD(vr[i] + d + 16 * z);            \
            _Pragma("GCC unroll 16") for (int hh = 0; hh < NH; hh++) {                                      \
                __m512 cw = _mm512_set1_ps(w[(size_t)(r0 + hh) * (size_t)ws + i]);                           \
                _Pragma("GCC unroll 16") for (int z = 0; z < NZ; z++) x[hh][z] =                            \
                    _mm512_fmadd_ps(cw, v[z], x[hh][z]);                                                     \
            }                                                                                                \
        }                                                                                                    \
        _Pragma("GCC unroll 16") for (int hh = 0; hh < NH; hh++)                                            \
            _Pragma("GCC unroll 16") for (int z = 0; z < NZ; z++)                                           \
                _mm512_storeu_ps(acc[r0 + hh] + d + 16 * z, x[hh][z]);                                       \
    } while (0)

#define WTILE_ROWS(LD, NZ)                                                                                   \
    for (int r0 = 0; r0 < nq;) {                                                                             \
        switch (nq - r0 < 4 ? nq - r0 : 4) {                                                                 \
        case 4: WTILE_SLICE(LD, NZ, 4); r0 += 4; break;                                                      \
        case 3: WTILE_SLICE(LD, NZ, 3); r0 += 3; break;                                                      \
        case 2: WTILE_SLICE(LD, NZ, 2); r0 += 2; break;                                                      \
        default: WTILE_SLICE(LD, NZ, 1); r0 += 1; break;                                                     \
        }                                                                                                    \
    }

#define WSUM_TILE512(LD, T)                                                                                  \
    const T *vr[CPU_ATTN_SCORE_CAP];                                                                         \
    for (int i = 0; i < np; i++) vr[i] = (const T *)cpu_attn_row(v, i);                                      \
    int d = 0;                                                                                               \
    for (; d + 64 <= hd; d += 64) WTILE_ROWS(LD, 4)                                                          \
    for (; d < hd; d += 16) WTILE_ROWS(LD, 1)

void cpu_attn_wsum_tile_f32_avx512(float *const *acc, int nq, int hd, const float *w, int ws, const cpu_attn_rows *v,
                                   int np) {
    WSUM_TILE512(ld_f32, float)
}

void cpu_attn_wsum_tile_f16_avx512(float *const *acc, int nq, int hd, const float *w, int ws, const cpu_attn_rows *v,
                                   int np) {
    WSUM_TILE512(ld_f16, uint16_t)
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

/* One online-softmax step of a row (see cpu_attn_softmax_fn): max, rescale,
 * exp and sum all 16 lanes wide (the sum in lane order, then across lanes). */
void cpu_attn_softmax_avx512(float *s, int n, float *m, float *l, float *acc, int hd) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    __m512 vm = ninf;
    int i = 0;
    for (; i + 16 <= n; i += 16) vm = _mm512_max_ps(vm, _mm512_loadu_ps(s + i));
    __mmask16 tail = (__mmask16)((1u << (n - i)) - 1);
    if (i < n) vm = _mm512_max_ps(vm, _mm512_mask_loadu_ps(ninf, tail, s + i));
    float mx = _mm512_reduce_max_ps(vm);
    if (*m > mx) mx = *m;
    float corr = _mm512_cvtss_f32(exp_neg16(_mm512_set1_ps(*m - mx))); /* 0 on the first chunk (m = -inf) */
    if (corr != 1.0f) {
        __m512 c = _mm512_set1_ps(corr);
        for (int d = 0; d < hd; d += 16) _mm512_storeu_ps(acc + d, _mm512_mul_ps(c, _mm512_loadu_ps(acc + d)));
        *l *= corr;
    }
    __m512 vmx = _mm512_set1_ps(mx), sum = _mm512_setzero_ps();
    for (i = 0; i + 16 <= n; i += 16) {
        __m512 e = exp_neg16(_mm512_sub_ps(_mm512_loadu_ps(s + i), vmx));
        _mm512_storeu_ps(s + i, e);
        sum = _mm512_add_ps(sum, e);
    }
    if (i < n) {
        __m512 e = _mm512_maskz_mov_ps(tail, exp_neg16(_mm512_sub_ps(_mm512_mask_loadu_ps(vmx, tail, s + i), vmx)));
        _mm512_mask_storeu_ps(s + i, tail, e);
        sum = _mm512_add_ps(sum, e);
    }
    *m = mx;
    *l += _mm512_reduce_add_ps(sum);
}

#else
typedef int cpu_attn_avx512_unused; /* not an x86 build */
#endif
