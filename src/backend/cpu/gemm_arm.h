/* gemm_arm.h: the AArch64 gemm kernels (see gemm.h), one body for two builds
 * (private to gemm_neon.c and gemm_dotprod.c, which include it once each
 * with ARM_SFX set).
 *
 * One weight row against NA activation rows (NA = 1..8, one instantiation
 * each): a chunk of the weight row is decoded once into signed bytes and
 * multiplied into every activation row while it is in registers. dot4 adds
 * each 4-byte group's products into its own i32 lane: one sdot in the
 * dotprod build, widening multiplies and pairwise adds in the base build,
 * the same lanes either way. So the integer sums are the same lane for lane
 * and every float step is the same: the two builds write the same bits (the
 * backend may mix them, as it mixes the x86 variants), and a row's result
 * does not depend on NA. Against the reference they agree to float rounding
 * (tests/test_gemm.c's tolerance). */
#ifndef ARM_SFX
#error "gemm_arm.h is included by gemm_neon.c / gemm_dotprod.c with ARM_SFX set"
#endif

#include <arm_neon.h>
#include <string.h>

#include "../../quant/quant.h"
#include "dot_int.h"
#include "gemm_int.h"

#define ARM_CAT2(a, b) a##_##b
#define ARM_CAT(a, b) ARM_CAT2(a, b)
#define ARM_FN(name) ARM_CAT(cpu_gemm_##name, ARM_SFX)
#define AI inline __attribute__((always_inline))

/* acc lane i += sum_b w[4i + b] * a[4i + b] */
static AI int32x4_t dot4(int32x4_t acc, int8x16_t w, int8x16_t a) {
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, w, a);
#else
    int32x4_t lo = vpaddlq_s16(vmull_s8(vget_low_s8(w), vget_low_s8(a)));
    int32x4_t hi = vpaddlq_s16(vmull_high_s8(w, a));
    return vaddq_s32(acc, vpaddq_s32(lo, hi));
#endif
}

static AI float h2f(uint16_t h) {
    __fp16 f;
    memcpy(&f, &h, 2);
    return (float)f;
}

/* 32 weight bytes (two 16-byte halves) against 32 activation codes */
static AI int32x4_t dot32(int8x16_t w0, int8x16_t w1, const int8_t *aq) {
    return dot4(dot4(vdupq_n_s32(0), w0, vld1q_s8(aq)), w1, vld1q_s8(aq + 16));
}

/* ---- 32-element blocks against Q8_0 ---- */

#define Q32_BODY(NAME, BT, DECODE)                                                                        \
    static AI void NAME(int64_t k, const BT *restrict w, const int NA, const void *const *restrict a,     \
                        float *restrict s) {                                                              \
        float32x4_t acc[CPU_GEMM_MAX_NA];                                                                 \
        _Pragma("GCC unroll 8")                                                                           \
        for (int r = 0; r < NA; r++) acc[r] = vdupq_n_f32(0);                                             \
        for (int64_t i = 0; i < k / 32; i++) {                                                            \
            int8x16_t w0, w1;                                                                             \
            DECODE(&w[i], &w0, &w1);                                                                      \
            const float d = h2f(w[i].d);                                                                  \
            _Pragma("GCC unroll 8")                                                                       \
            for (int r = 0; r < NA; r++) {                                                                \
                const block_q8_0 *y = (const block_q8_0 *)a[r] + i;                                       \
                acc[r] = vfmaq_n_f32(acc[r], vcvtq_f32_s32(dot32(w0, w1, y->qs)), d * h2f(y->d));         \
            }                                                                                             \
        }                                                                                                 \
        _Pragma("GCC unroll 8")                                                                           \
        for (int r = 0; r < NA; r++) s[r] = vaddvq_f32(acc[r]);                                           \
    }

static AI void dec_q8_0(const block_q8_0 *b, int8x16_t *w0, int8x16_t *w1) {
    *w0 = vld1q_s8(b->qs);
    *w1 = vld1q_s8(b->qs + 16);
}
static AI void dec_q4_0(const block_q4_0 *b, int8x16_t *w0, int8x16_t *w1) {
    uint8x16_t q = vld1q_u8(b->qs);
    *w0 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0f))), vdupq_n_s8(8));
    *w1 = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), vdupq_n_s8(8));
}
Q32_BODY(q8_0_body, block_q8_0, dec_q8_0)
Q32_BODY(q4_0_body, block_q4_0, dec_q4_0)

/* ---- K-quants against Q8_K ---- */

/* Q4_K/Q5_K's 12 scale bytes -> sc[0..8) and m[0..8) (6 bits each). */
static AI void k4_unpack(const uint8_t *p, uint8_t sc[8], uint8_t m[8]) {
    uint32_t u0, u1, u2, t[4];
    memcpy(&u0, p, 4);
    memcpy(&u1, p + 4, 4);
    memcpy(&u2, p + 8, 4);
    t[0] = u0 & 0x3f3f3f3f;
    t[1] = (u2 & 0x0f0f0f0f) | (((u0 >> 6) & 0x03030303) << 4);
    t[2] = u1 & 0x3f3f3f3f;
    t[3] = ((u2 >> 4) & 0x0f0f0f0f) | (((u1 >> 6) & 0x03030303) << 4);
    memcpy(sc, t, 8);
    memcpy(m, t + 2, 8);
}

/* sum_j m[j] * (bsums[2j] + bsums[2j+1]) (exact integers) */
static AI int k4_mins(const uint8_t m[8], const int16_t *bsums) {
    int16x8_t pairs = vpaddq_s16(vld1q_s16(bsums), vld1q_s16(bsums + 8));
    int16x8_t mm = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(m)));
    return vaddvq_s32(vmlal_high_s16(vmull_s16(vget_low_s16(pairs), vget_low_s16(mm)), pairs, mm));
}

/* Q4_K (Q5 = 0) and Q5_K (Q5 = 1): 64 elements (sub-blocks 2j, 2j+1) at a time. */
static AI void k45_body(int64_t k, const void *restrict vw, const int Q5, const int NA, const void *const *restrict a,
                        float *restrict s) {
    const uint8x16_t lo4 = vdupq_n_u8(0x0f), b16 = vdupq_n_u8(0x10);
    float32x4_t acc[CPU_GEMM_MAX_NA];
    float accm[CPU_GEMM_MAX_NA];
    int32x4_t sumi[CPU_GEMM_MAX_NA];
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) {
        acc[r] = vdupq_n_f32(0);
        accm[r] = 0;
    }
    for (int64_t i = 0; i < k / QK_K; i++) {
        const uint8_t *qs, *scales, *qh = NULL;
        uint16_t dh, dmh;
        if (Q5) {
            const block_q5_K *b = (const block_q5_K *)vw + i;
            qs = b->qs, scales = b->scales, qh = b->qh, dh = b->d, dmh = b->dmin;
        } else {
            const block_q4_K *b = (const block_q4_K *)vw + i;
            qs = b->qs, scales = b->scales, dh = b->d, dmh = b->dmin;
        }
        uint8_t sc[8], m[8];
        k4_unpack(scales, sc, m);
        uint8x16_t h0 = vdupq_n_u8(0), h1 = vdupq_n_u8(0);
        if (Q5) {
            h0 = vld1q_u8(qh);
            h1 = vld1q_u8(qh + 16);
        }
        #pragma GCC unroll 8
        for (int r = 0; r < NA; r++) sumi[r] = vdupq_n_s32(0);
        for (int j = 0; j < 4; j++) {
            uint8x16_t q0 = vld1q_u8(qs + 32 * j), q1 = vld1q_u8(qs + 32 * j + 16);
            uint8x16_t l0 = vandq_u8(q0, lo4), l1 = vandq_u8(q1, lo4), g0 = vshrq_n_u8(q0, 4), g1 = vshrq_n_u8(q1, 4);
            if (Q5) {
                const uint8x16_t ml = vdupq_n_u8((uint8_t)(1u << (2 * j))), mh = vdupq_n_u8((uint8_t)(2u << (2 * j)));
                l0 = vorrq_u8(l0, vandq_u8(vtstq_u8(h0, ml), b16));
                l1 = vorrq_u8(l1, vandq_u8(vtstq_u8(h1, ml), b16));
                g0 = vorrq_u8(g0, vandq_u8(vtstq_u8(h0, mh), b16));
                g1 = vorrq_u8(g1, vandq_u8(vtstq_u8(h1, mh), b16));
            }
            const int8x16_t wl0 = vreinterpretq_s8_u8(l0), wl1 = vreinterpretq_s8_u8(l1);
            const int8x16_t wh0 = vreinterpretq_s8_u8(g0), wh1 = vreinterpretq_s8_u8(g1);
            #pragma GCC unroll 8
            for (int r = 0; r < NA; r++) {
                const int8_t *aq = ((const block_q8_K *)a[r] + i)->qs + 64 * j;
                sumi[r] = vmlaq_n_s32(sumi[r], dot32(wl0, wl1, aq), sc[2 * j]);
                sumi[r] = vmlaq_n_s32(sumi[r], dot32(wh0, wh1, aq + 32), sc[2 * j + 1]);
            }
        }
        const float d = h2f(dh), dmin = h2f(dmh);
        #pragma GCC unroll 8
        for (int r = 0; r < NA; r++) {
            const block_q8_K *y = (const block_q8_K *)a[r] + i;
            acc[r] = vfmaq_n_f32(acc[r], vcvtq_f32_s32(sumi[r]), d * y->d);
            accm[r] += dmin * y->d * (float)k4_mins(m, y->bsums);
        }
    }
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) s[r] = vaddvq_f32(acc[r]) - accm[r];
}

static AI void q4_K_body(int64_t k, const block_q4_K *restrict w, const int NA, const void *const *restrict a,
                         float *restrict s) {
    k45_body(k, w, 0, NA, a, s);
}
static AI void q5_K_body(int64_t k, const block_q5_K *restrict w, const int NA, const void *const *restrict a,
                         float *restrict s) {
    k45_body(k, w, 1, NA, a, s);
}

static AI void q6_K_body(int64_t k, const block_q6_K *restrict w, const int NA, const void *const *restrict a,
                         float *restrict s) {
    const uint8x16_t lo4 = vdupq_n_u8(0x0f), lo2 = vdupq_n_u8(0x03);
    const int8x16_t m32 = vdupq_n_s8(32);
    float32x4_t acc[CPU_GEMM_MAX_NA];
    int32x4_t sumi[CPU_GEMM_MAX_NA];
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) acc[r] = vdupq_n_f32(0);
    for (int64_t i = 0; i < k / QK_K; i++) {
        const block_q6_K *b = &w[i];
        #pragma GCC unroll 8
        for (int r = 0; r < NA; r++) sumi[r] = vdupq_n_s32(0);
        for (int half = 0; half < 2; half++) {
            const uint8_t *ql = b->ql + 64 * half, *qh = b->qh + 32 * half;
            const int8_t *sc = b->scales + 8 * half;
            for (int h = 0; h < 2; h++) { /* elements 16h .. 16h+15 of each quarter of the half */
                uint8x16_t l0 = vld1q_u8(ql + 16 * h), l1 = vld1q_u8(ql + 32 + 16 * h), hb = vld1q_u8(qh + 16 * h);
                int8x16_t c[4];
                c[0] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vandq_u8(l0, lo4), vshlq_n_u8(vandq_u8(hb, lo2), 4))), m32);
                c[1] = vsubq_s8(
                    vreinterpretq_s8_u8(vorrq_u8(vandq_u8(l1, lo4), vshlq_n_u8(vandq_u8(vshrq_n_u8(hb, 2), lo2), 4))), m32);
                c[2] = vsubq_s8(
                    vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(l0, 4), vshlq_n_u8(vandq_u8(vshrq_n_u8(hb, 4), lo2), 4))), m32);
                c[3] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(l1, 4), vshlq_n_u8(vshrq_n_u8(hb, 6), 4))), m32);
                #pragma GCC unroll 8
                for (int r = 0; r < NA; r++) {
                    const int8_t *aq = ((const block_q8_K *)a[r] + i)->qs + 128 * half + 16 * h;
                    for (int g = 0; g < 4; g++)
                        sumi[r] = vmlaq_n_s32(sumi[r], dot4(vdupq_n_s32(0), c[g], vld1q_s8(aq + 32 * g)), sc[h + 2 * g]);
                }
            }
        }
        const float d = h2f(b->d);
        #pragma GCC unroll 8
        for (int r = 0; r < NA; r++)
            acc[r] = vfmaq_n_f32(acc[r], vcvtq_f32_s32(sumi[r]), d * ((const block_q8_K *)a[r] + i)->d);
    }
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) s[r] = vaddvq_f32(acc[r]);
}

static AI void iq4_xs_body(int64_t k, const block_iq4_xs *restrict w, const int NA, const void *const *restrict a,
                           float *restrict s) {
    const int8x16_t table = vld1q_s8(cpu_kvalues_iq4nl);
    const uint8x16_t lo4 = vdupq_n_u8(0x0f);
    float32x4_t acc[CPU_GEMM_MAX_NA];
    int32x4_t sumi[CPU_GEMM_MAX_NA];
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) acc[r] = vdupq_n_f32(0);
    for (int64_t i = 0; i < k / QK_K; i++) {
        const block_iq4_xs *b = &w[i];
        #pragma GCC unroll 8
        for (int r = 0; r < NA; r++) sumi[r] = vdupq_n_s32(0);
        for (int ib = 0; ib < QK_K / 32; ib++) {
            int ls = ((b->scales_l[ib / 2] >> 4 * (ib % 2)) & 0xf) | (((b->scales_h >> 2 * ib) & 3) << 4);
            uint8x16_t q = vld1q_u8(b->qs + 16 * ib);
            int8x16_t w0 = vqtbl1q_s8(table, vandq_u8(q, lo4)), w1 = vqtbl1q_s8(table, vshrq_n_u8(q, 4));
            #pragma GCC unroll 8
            for (int r = 0; r < NA; r++)
                sumi[r] = vmlaq_n_s32(sumi[r], dot32(w0, w1, ((const block_q8_K *)a[r] + i)->qs + 32 * ib), ls - 32);
        }
        const float d = h2f(b->d);
        #pragma GCC unroll 8
        for (int r = 0; r < NA; r++)
            acc[r] = vfmaq_n_f32(acc[r], vcvtq_f32_s32(sumi[r]), d * ((const block_q8_K *)a[r] + i)->d);
    }
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) s[r] = vaddvq_f32(acc[r]);
}

/* ---- float weights: 8 elements at a time, the tail in order ---- */

static AI void f16_body(int64_t k, const uint16_t *restrict w, const int NA, const void *const *restrict a,
                        float *restrict s) {
    float32x4_t acc[CPU_GEMM_MAX_NA][2];
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) acc[r][0] = acc[r][1] = vdupq_n_f32(0);
    int64_t j = 0;
    for (; j + 8 <= k; j += 8) {
        float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(w + j));
        float32x4_t w0 = vcvt_f32_f16(vget_low_f16(h)), w1 = vcvt_high_f32_f16(h);
        #pragma GCC unroll 8
        for (int r = 0; r < NA; r++) {
            const float *x = (const float *)a[r] + j;
            acc[r][0] = vfmaq_f32(acc[r][0], w0, vld1q_f32(x));
            acc[r][1] = vfmaq_f32(acc[r][1], w1, vld1q_f32(x + 4));
        }
    }
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) {
        const float *x = a[r];
        float sum = vaddvq_f32(vaddq_f32(acc[r][0], acc[r][1]));
        for (int64_t t = j; t < k; t++) sum += h2f(w[t]) * x[t];
        s[r] = sum;
    }
}

static AI float32x4_t bf16_lo(uint16x8_t v) { return vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(v), 16)); }
static AI float32x4_t bf16_hi(uint16x8_t v) { return vreinterpretq_f32_u32(vshll_high_n_u16(v, 16)); }

static AI void bf16_body(int64_t k, const uint16_t *restrict w, const int NA, const void *const *restrict a,
                         float *restrict s) {
    float32x4_t acc[CPU_GEMM_MAX_NA][2];
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) acc[r][0] = acc[r][1] = vdupq_n_f32(0);
    int64_t j = 0;
    for (; j + 8 <= k; j += 8) {
        uint16x8_t wv = vld1q_u16(w + j);
        float32x4_t w0 = bf16_lo(wv), w1 = bf16_hi(wv);
        #pragma GCC unroll 8
        for (int r = 0; r < NA; r++) {
            uint16x8_t xv = vld1q_u16((const uint16_t *)a[r] + j);
            acc[r][0] = vfmaq_f32(acc[r][0], w0, bf16_lo(xv));
            acc[r][1] = vfmaq_f32(acc[r][1], w1, bf16_hi(xv));
        }
    }
    #pragma GCC unroll 8
    for (int r = 0; r < NA; r++) {
        const uint16_t *x = a[r];
        float sum = vaddvq_f32(vaddq_f32(acc[r][0], acc[r][1]));
        for (int64_t t = j; t < k; t++) sum += qt_bf16_to_f32(w[t]) * qt_bf16_to_f32(x[t]);
        s[r] = sum;
    }
}

void ARM_FN(q8_0)(int64_t k, const void *restrict w, int na, const void *const *restrict a, float *restrict s) {
    GEMM_DISPATCH(q8_0_body, block_q8_0)
}
void ARM_FN(q4_0)(int64_t k, const void *restrict w, int na, const void *const *restrict a, float *restrict s) {
    GEMM_DISPATCH(q4_0_body, block_q4_0)
}
void ARM_FN(q4_K)(int64_t k, const void *restrict w, int na, const void *const *restrict a, float *restrict s) {
    GEMM_DISPATCH(q4_K_body, block_q4_K)
}
void ARM_FN(q5_K)(int64_t k, const void *restrict w, int na, const void *const *restrict a, float *restrict s) {
    GEMM_DISPATCH(q5_K_body, block_q5_K)
}
void ARM_FN(q6_K)(int64_t k, const void *restrict w, int na, const void *const *restrict a, float *restrict s) {
    GEMM_DISPATCH(q6_K_body, block_q6_K)
}
void ARM_FN(iq4_xs)(int64_t k, const void *restrict w, int na, const void *const *restrict a, float *restrict s) {
    GEMM_DISPATCH(iq4_xs_body, block_iq4_xs)
}
/* float rows: groups of up to 4 activation rows (registers), each row alone in its group's arithmetic */
void ARM_FN(f16)(int64_t k, const void *restrict w, int na, const void *const *restrict a, float *restrict s) {
    for (int r0 = 0; r0 < na; r0 += 4) switch (na - r0) {
        case 1: f16_body(k, w, 1, a + r0, s + r0); break;
        case 2: f16_body(k, w, 2, a + r0, s + r0); break;
        case 3: f16_body(k, w, 3, a + r0, s + r0); break;
        default: f16_body(k, w, 4, a + r0, s + r0); break;
        }
}
void ARM_FN(bf16)(int64_t k, const void *restrict w, int na, const void *const *restrict a, float *restrict s) {
    for (int r0 = 0; r0 < na; r0 += 4) switch (na - r0) {
        case 1: bf16_body(k, w, 1, a + r0, s + r0); break;
        case 2: bf16_body(k, w, 2, a + r0, s + r0); break;
        case 3: bf16_body(k, w, 3, a + r0, s + r0); break;
        default: bf16_body(k, w, 4, a + r0, s + r0); break;
        }
}

#undef AI
#undef ARM_FN
#undef ARM_CAT
#undef ARM_CAT2
