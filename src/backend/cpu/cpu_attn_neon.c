/* cpu_attn_neon.c: AArch64 NEON versions of the attention kernels (scores of
 * query rows over a chunk of K rows, a chunk's weighted sum of V rows into
 * register-resident accumulators, f32 and f16 rows; the same for tiles of
 * query rows (prefill); exp of a chunk's scores; one online-softmax step):
 * the AVX2 set's decode shapes and the AVX-512 set's tile shapes at 4 lanes.
 * NEON is in every AArch64 CPU; cpu_attn_variants lists the set there. */
#include "cpu_int.h"

#include <math.h>

#include "../../quant/quant.h"

#if defined(__aarch64__)
#include <arm_neon.h>

static inline float32x4_t load_f32(const float *p) { return vld1q_f32(p); }
static inline float32x4_t load_f16(const uint16_t *p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }
static inline float tail_f16(uint16_t h) { return qt_f16_to_f32(h); }

/* acc[h][0..hd) += sum over i < np of w[h*ws + i] * (head h/group of V row
 * i), for h < nh. Eight rows at a time; for each pair of heads of one kv
 * head the accumulators of a 16-wide slice stay in registers while the rows
 * stream past, each V load serving both heads; per element the FMAs run in
 * position order. */
#define WSUM_BODY(LOAD, T)                                                                                    \
    const T *vr[CPU_ATTN_SCORE_CAP];                                                                          \
    for (int i = 0; i < np; i++) vr[i] = (const T *)cpu_attn_row(v, i);                                       \
    for (int i0 = 0; i0 < np; i0 += 8) {                                                                      \
        const int i1 = np - i0 < 8 ? np : i0 + 8;                                                             \
        for (int h = 0; h < nh;) {                                                                            \
            const int two = h + 1 < nh && (h + 1) / group == h / group;                                       \
            const size_t off = (size_t)(h / group) * (size_t)hd;                                              \
            const float *w0 = w + (size_t)h * (size_t)ws, *w1 = w0 + (two ? ws : 0);                          \
            int d = 0;                                                                                        \
            for (; d + 16 <= hd; d += 16) {                                                                   \
                float *a0 = acc + (size_t)h * (size_t)hd + d, *a1 = a0 + (two ? hd : 0);                      \
                float32x4_t x0 = vld1q_f32(a0), x1 = vld1q_f32(a0 + 4), x2 = vld1q_f32(a0 + 8),               \
                            x3 = vld1q_f32(a0 + 12);                                                          \
                float32x4_t y0 = vld1q_f32(a1), y1 = vld1q_f32(a1 + 4), y2 = vld1q_f32(a1 + 8),               \
                            y3 = vld1q_f32(a1 + 12);                                                          \
                for (int i = i0; i < i1; i++) {                                                               \
                    const T *vp = vr[i] + off + d;                                                            \
                    float32x4_t v0 = LOAD(vp), v1 = LOAD(vp + 4), v2 = LOAD(vp + 8), v3 = LOAD(vp + 12);      \
                    const float c0 = w0[i], c1 = w1[i];                                                       \
                    x0 = vfmaq_n_f32(x0, v0, c0);                                                             \
                    x1 = vfmaq_n_f32(x1, v1, c0);                                                             \
                    x2 = vfmaq_n_f32(x2, v2, c0);                                                             \
                    x3 = vfmaq_n_f32(x3, v3, c0);                                                             \
                    y0 = vfmaq_n_f32(y0, v0, c1);                                                             \
                    y1 = vfmaq_n_f32(y1, v1, c1);                                                             \
                    y2 = vfmaq_n_f32(y2, v2, c1);                                                             \
                    y3 = vfmaq_n_f32(y3, v3, c1);                                                             \
                }                                                                                             \
                if (two) {                                                                                    \
                    vst1q_f32(a1, y0);                                                                        \
                    vst1q_f32(a1 + 4, y1);                                                                    \
                    vst1q_f32(a1 + 8, y2);                                                                    \
                    vst1q_f32(a1 + 12, y3);                                                                   \
                }                                                                                             \
                vst1q_f32(a0, x0);                                                                            \
                vst1q_f32(a0 + 4, x1);                                                                        \
                vst1q_f32(a0 + 8, x2);                                                                        \
                vst1q_f32(a0 + 12, x3);                                                                       \
            }                                                                                                 \
            for (; d + 4 <= hd; d += 4) {                                                                     \
                float *a0 = acc + (size_t)h * (size_t)hd + d, *a1 = a0 + (two ? hd : 0);                      \
                float32x4_t x0 = vld1q_f32(a0), y0 = vld1q_f32(a1);                                           \
                for (int i = i0; i < i1; i++) {                                                               \
                    float32x4_t v0 = LOAD(vr[i] + off + d);                                                   \
                    x0 = vfmaq_n_f32(x0, v0, w0[i]);                                                          \
                    y0 = vfmaq_n_f32(y0, v0, w1[i]);                                                          \
                }                                                                                             \
                if (two) vst1q_f32(a1, y0);                                                                   \
                vst1q_f32(a0, x0);                                                                            \
            }                                                                                                 \
            for (; d < hd; d++) /* tail dims: scalar, same order */                                           \
                for (int hh = h; hh <= h + two; hh++)                                                         \
                    for (int i = i0; i < i1; i++)                                                             \
                        acc[(size_t)hh * (size_t)hd + d] = fmaf(w[(size_t)hh * (size_t)ws + i], TAIL(vr[i][off + d]), \
                                                                acc[(size_t)hh * (size_t)hd + d]);            \
            h += two ? 2 : 1;                                                                                 \
        }                                                                                                     \
    }

void cpu_attn_wsum_f32_neon(float *acc, int nh, int hd, int group, const float *w, int ws, const cpu_attn_rows *v,
                            int np) {
#define TAIL(x) (x)
    WSUM_BODY(load_f32, float)
#undef TAIL
}

void cpu_attn_wsum_f16_neon(float *acc, int nh, int hd, int group, const float *w, int ws, const cpu_attn_rows *v,
                            int np) {
#define TAIL(x) tail_f16(x)
    WSUM_BODY(load_f16, uint16_t)
#undef TAIL
}

/* s[r*ss + i] = dot(q row r, head r/group of k_i) * scale for r < nq, i < np
 * (hd a multiple of 4): eight K rows at a time, one accumulator each, then
 * pairwise adds that reduce all eight at once; the leftover rows (np % 8)
 * go through the same reduction with repeated rows. */
#define SCORES_BODY(LOAD, T)                                                                              \
    for (int i0 = 0; i0 < np; i0 += 8) {                                                                  \
        const T *kr[8];                                                                                   \
        int nr = np - i0 < 8 ? np - i0 : 8;                                                               \
        for (int j = 0; j < 8; j++) kr[j] = (const T *)cpu_attn_row(k, i0 + (j < nr ? j : 0));           \
        for (int qi = 0; qi < nq; qi++) {                                                                 \
            const float *qr = q + (size_t)qi * qstride;                                                   \
            const size_t off = (size_t)(qi / group) * (size_t)hd;                                        \
            float *sr = s + (size_t)qi * (size_t)ss;                                                      \
            float32x4_t c[8];                                                                             \
            for (int j = 0; j < 8; j++) c[j] = vdupq_n_f32(0);                                            \
            for (int d = 0; d < hd; d += 4) {                                                             \
                float32x4_t qv = vld1q_f32(qr + d);                                                       \
                for (int j = 0; j < 8; j++) c[j] = vfmaq_f32(c[j], qv, LOAD(kr[j] + off + d));           \
            }                                                                                             \
            float32x4_t r0 = vpaddq_f32(vpaddq_f32(c[0], c[1]), vpaddq_f32(c[2], c[3]));                  \
            float32x4_t r1 = vpaddq_f32(vpaddq_f32(c[4], c[5]), vpaddq_f32(c[6], c[7]));                  \
            r0 = vmulq_n_f32(r0, scale);                                                                  \
            r1 = vmulq_n_f32(r1, scale);                                                                  \
            if (nr == 8) {                                                                                \
                vst1q_f32(sr + i0, r0);                                                                   \
                vst1q_f32(sr + i0 + 4, r1);                                                               \
            } else {                                                                                      \
                float t[8];                                                                               \
                vst1q_f32(t, r0);                                                                         \
                vst1q_f32(t + 4, r1);                                                                     \
                for (int j = 0; j < nr; j++) sr[i0 + j] = t[j];                                          \
            }                                                                                             \
        }                                                                                                 \
    }

void cpu_attn_scores_f32_neon(const float *q, int nq, size_t qstride, int hd, int group, const cpu_attn_rows *k, int np,
                              float scale, float *s, int ss) {
    SCORES_BODY(load_f32, float)
}

void cpu_attn_scores_f16_neon(const float *q, int nq, size_t qstride, int hd, int group, const cpu_attn_rows *k, int np,
                              float scale, float *s, int ss) {
    SCORES_BODY(load_f16, uint16_t)
}

/* ---- tiles of query rows (prefill) ---- */

/* s[r*ss + i] = dot(q[r], K row i) * scale: register tiles of four query rows
 * by four K rows (each K load serves four rows, each q load four K rows),
 * one pairwise reduction per row of the tile. */
#define SCORES_TILE(LD, T)                                                                                   \
    for (int i0 = 0; i0 < np; i0 += 4) {                                                                     \
        const T *kr[4];                                                                                      \
        int nr = np - i0 < 4 ? np - i0 : 4;                                                                  \
        for (int j = 0; j < 4; j++) kr[j] = (const T *)cpu_attn_row(k, i0 + (j < nr ? j : 0));              \
        for (int r0 = 0; r0 < nq; r0 += 4) {                                                                 \
            int nqq = nq - r0 < 4 ? nq - r0 : 4;                                                             \
            const float *qr[4] = {q[r0], q[r0 + (nqq > 1)], q[r0 + (nqq > 2 ? 2 : 0)], q[r0 + (nqq > 3 ? 3 : 0)]}; \
            float32x4_t c[4][4];                                                                             \
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++)                                              \
                _Pragma("GCC unroll 4") for (int e = 0; e < 4; e++) c[j][e] = vdupq_n_f32(0);                \
            for (int d = 0; d < hd; d += 4) {                                                                \
                float32x4_t kv[4];                                                                           \
                _Pragma("GCC unroll 4") for (int e = 0; e < 4; e++) kv[e] = LD(kr[e] + d);                  \
                _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {                                        \
                    float32x4_t x = vld1q_f32(qr[j] + d);                                                    \
                    _Pragma("GCC unroll 4") for (int e = 0; e < 4; e++) c[j][e] = vfmaq_f32(c[j][e], x, kv[e]); \
                }                                                                                            \
            }                                                                                                \
            for (int j = 0; j < nqq; j++) {                                                                  \
                float t[4];                                                                                  \
                float32x4_t r = vpaddq_f32(vpaddq_f32(c[j][0], c[j][1]), vpaddq_f32(c[j][2], c[j][3]));      \
                vst1q_f32(t, vmulq_n_f32(r, scale));                                                         \
                for (int e = 0; e < nr; e++) s[(size_t)(r0 + j) * (size_t)ss + (size_t)(i0 + e)] = t[e];    \
            }                                                                                                \
        }                                                                                                    \
    }

void cpu_attn_scores_tile_f32_neon(const float *const *q, int nq, int hd, const cpu_attn_rows *k, int np, float scale,
                                   float *s, int ss) {
    SCORES_TILE(load_f32, float)
}

void cpu_attn_scores_tile_f16_neon(const float *const *q, int nq, int hd, const cpu_attn_rows *k, int np, float scale,
                                   float *s, int ss) {
    SCORES_TILE(load_f16, uint16_t)
}

/* acc[r][d] += sum_i w[r*ws + i] * V_i[d]: a slice of NZ x 4 dims of NH (<= 4)
 * rows' accumulators in registers while the chunk's V rows stream past, each
 * V load serving NH rows; terms added in position order. */
#define WTILE_SLICE(LD, NZ, NH)                                                                              \
    do {                                                                                                     \
        float32x4_t x[NH][NZ];                                                                               \
        _Pragma("GCC unroll 4") for (int hh = 0; hh < NH; hh++)                                              \
            _Pragma("GCC unroll 4") for (int z = 0; z < NZ; z++) x[hh][z] = vld1q_f32(acc[r0 + hh] + d + 4 * z); \
        for (int i = 0; i < np; i++) {                                                                       \
            float32x4_t vv[NZ];                                                                              \
            _Pragma("GCC unroll 4") for (int z = 0; z < NZ; z++) vv[z] = LD(vr[i] + d + 4 * z);             \
            _Pragma("GCC unroll 4") for (int hh = 0; hh < NH; hh++) {                                        \
                const float cw = w[(size_t)(r0 + hh) * (size_t)ws + i];                                      \
                _Pragma("GCC unroll 4") for (int z = 0; z < NZ; z++) x[hh][z] = vfmaq_n_f32(x[hh][z], vv[z], cw); \
            }                                                                                                \
        }                                                                                                    \
        _Pragma("GCC unroll 4") for (int hh = 0; hh < NH; hh++)                                              \
            _Pragma("GCC unroll 4") for (int z = 0; z < NZ; z++) vst1q_f32(acc[r0 + hh] + d + 4 * z, x[hh][z]); \
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

#define WSUM_TILE(LD, T)                                                                                     \
    const T *vr[CPU_ATTN_SCORE_CAP];                                                                         \
    for (int i = 0; i < np; i++) vr[i] = (const T *)cpu_attn_row(v, i);                                      \
    int d = 0;                                                                                               \
    for (; d + 16 <= hd; d += 16) WTILE_ROWS(LD, 4)                                                          \
    for (; d < hd; d += 4) WTILE_ROWS(LD, 1)

void cpu_attn_wsum_tile_f32_neon(float *const *acc, int nq, int hd, const float *w, int ws, const cpu_attn_rows *v,
                                 int np) {
    WSUM_TILE(load_f32, float)
}

void cpu_attn_wsum_tile_f16_neon(float *const *acc, int nq, int hd, const float *w, int ws, const cpu_attn_rows *v,
                                 int np) {
    WSUM_TILE(load_f16, uint16_t)
}

/* e^x for x <= 0, 4 at a time: the AVX2 set's range reduction and degree-6
 * polynomial (x = n ln2 + r, |r| <= ln2/2, 2^n through the exponent bits);
 * x below -87 gives 0. */
static inline float32x4_t exp_neg4(float32x4_t x) {
    const float32x4_t lo = vdupq_n_f32(-87.0f);
    uint32x4_t under = vcltq_f32(x, lo);
    x = vmaxq_f32(x, lo);
    float32x4_t n = vrndnq_f32(vmulq_n_f32(x, 1.44269504088896341f));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f));
    r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
    float32x4_t p = vdupq_n_f32(1.9875691500e-4f);
    p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
    p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
    p = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), p, vmulq_f32(r, r));
    int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    float32x4_t y = vmulq_f32(p, vreinterpretq_f32_s32(e));
    return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(y), under));
}

/* s[i] = e^(s[i] - mx) for i < n (every s[i] <= mx); returns their sum in position order. */
float cpu_vec_exp_sub_neon(float *s, int n, float mx) {
    const float32x4_t m = vdupq_n_f32(mx);
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(s + i, exp_neg4(vsubq_f32(vld1q_f32(s + i), m)));
    if (i < n) {
        float t[4] = {0};
        for (int j = 0; i + j < n; j++) t[j] = s[i + j] - mx;
        vst1q_f32(t, exp_neg4(vld1q_f32(t)));
        for (int j = 0; i + j < n; j++) s[i + j] = t[j];
    }
    float sum = 0;
    for (int j = 0; j < n; j++) sum += s[j];
    return sum;
}

/* One online-softmax step of a row (see cpu_attn_softmax_fn). */
void cpu_attn_softmax_neon(float *s, int n, float *m, float *l, float *acc, int hd) {
    float32x4_t vm = vdupq_n_f32(-INFINITY);
    int i = 0;
    for (; i + 4 <= n; i += 4) vm = vmaxq_f32(vm, vld1q_f32(s + i));
    float mx = vmaxvq_f32(vm);
    for (; i < n; i++) mx = s[i] > mx ? s[i] : mx;
    if (*m > mx) mx = *m;
    float corr = expf(*m - mx); /* 0 on the first chunk (m = -inf) */
    if (corr != 1.0f) {
        int d = 0;
        for (; d + 4 <= hd; d += 4) vst1q_f32(acc + d, vmulq_n_f32(vld1q_f32(acc + d), corr));
        for (; d < hd; d++) acc[d] *= corr;
        *l *= corr;
    }
    *m = mx;
    *l += cpu_vec_exp_sub_neon(s, n, mx);
}

/* The KV store's f32 -> f16 rows: quant/'s f16 row converter, which is NEON on
 * AArch64 and writes qt_f32_to_f16's bits (tests/test_dot.c checks it). */
void cpu_attn_to_f16_neon(const float *x, uint16_t *h, int64_t n) { qt_traits(QT_F16)->from_float(x, h, n); }

#else
typedef int cpu_attn_neon_unused; /* not an AArch64 build */
#endif
