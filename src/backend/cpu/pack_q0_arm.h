/* pack_q0_arm.h: the AArch64 kernels of the Q4_0 / Q8_0 x16 layouts
 * (pack_q0.h), one body for two builds (private to pack_q0_neon.c and
 * pack_q0_dotprod.c, which include it once each with ARM_SFX set).
 *
 * A 16-byte quarter of a 64-byte code vector is 4 rows x 4 bytes; dot4
 * multiplies it by one 4-byte piece of the activation block broadcast to
 * every lane, adding each row's four products into its own i32 lane: one
 * sdot (by element) in the dotprod build, two widening multiplies and two
 * rounds of pairwise adds in the base build. The lanes are the same either
 * way, so each row's block sum is the exact integer the portable kernel
 * (q4_0x16_c / q8_0x16_c) computes, and the float steps are its steps
 * (scale = d_w * d_a, one fused multiply-add per block, in block order):
 * both builds write the portable kernel's bits, whatever na. */
#ifndef ARM_SFX
#error "pack_q0_arm.h is included by pack_q0_neon.c / pack_q0_dotprod.c with ARM_SFX set"
#endif

#include <arm_neon.h>
#include <string.h>

#include "pack_q0.h"

#define ARM_CAT2(a, b) a##_##b
#define ARM_CAT(a, b) ARM_CAT2(a, b)
#define ARM_FN(name) ARM_CAT(cpu_pack_##name, ARM_SFX)

/* acc lane i += sum_b w[4i + b] * (4-byte lane `lane` of a)[b] */
#if defined(__ARM_FEATURE_DOTPROD)
#define DOT4(acc, w, a, lane) vdotq_laneq_s32(acc, w, a, lane)
#else
static inline int32x4_t dot4_bcast(int32x4_t acc, int8x16_t w, int8x16_t a) {
    int32x4_t lo = vpaddlq_s16(vmull_s8(vget_low_s8(w), vget_low_s8(a)));
    int32x4_t hi = vpaddlq_s16(vmull_high_s8(w, a));
    return vaddq_s32(acc, vpaddq_s32(lo, hi));
}
#define DOT4(acc, w, a, lane) \
    dot4_bcast(acc, w, vreinterpretq_s8_s32(vdupq_laneq_s32(vreinterpretq_s32_s8(a), lane)))
#endif

/* the 16 rows' block scales times the activation scale, rows 4q .. 4q+3 */
static inline float32x4_t scales4(const uint16_t *d, int q, float da) {
    return vmulq_n_f32(vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(d + 4 * q))), da);
}

void ARM_FN(q4_0x16)(int64_t k, const void *restrict g, int na, const void *const *restrict a, float *restrict s) {
    const int64_t nb = k / 32;
    const unsigned char *codes = g;
    const uint8x16_t lo4 = vdupq_n_u8(0x0f);
    float32x4_t acc[CPU_PACK_MAX_NA][4];
    for (int r = 0; r < na; r++)
        for (int q = 0; q < 4; q++) acc[r][q] = vdupq_n_f32(0);
    for (int64_t b = 0; b < nb; b++) {
        const unsigned char *cb = codes + (size_t)b * PQ4_BS;
        const uint16_t *d = PQ4_D(g, b);
        for (int q = 0; q < 4; q++) {
            /* rows 4q .. 4q+3: low / high nibbles of code vectors 0..3 */
            int8x16_t wl[4], wh[4];
            for (int v = 0; v < 4; v++) {
                uint8x16_t c = vld1q_u8(cb + v * 64 + q * 16);
                wl[v] = vreinterpretq_s8_u8(vandq_u8(c, lo4));
                wh[v] = vreinterpretq_s8_u8(vshrq_n_u8(c, 4));
            }
            for (int r = 0; r < na; r++) {
                const pq0_act *y = (const pq0_act *)a[r] + b;
                const int8x16_t a0 = vld1q_s8(y->qs), a1 = vld1q_s8(y->qs + 16);
                int32x4_t sum = vdupq_n_s32(y->c4);
                sum = DOT4(sum, wl[0], a0, 0);
                sum = DOT4(sum, wh[0], a1, 0);
                sum = DOT4(sum, wl[1], a0, 1);
                sum = DOT4(sum, wh[1], a1, 1);
                sum = DOT4(sum, wl[2], a0, 2);
                sum = DOT4(sum, wh[2], a1, 2);
                sum = DOT4(sum, wl[3], a0, 3);
                sum = DOT4(sum, wh[3], a1, 3);
                acc[r][q] = vfmaq_f32(acc[r][q], scales4(d, q, y->d), vcvtq_f32_s32(sum));
            }
        }
    }
    for (int r = 0; r < na; r++)
        for (int q = 0; q < 4; q++) vst1q_f32(s + (size_t)r * PQ0_R + 4 * q, acc[r][q]);
}

void ARM_FN(q8_0x16)(int64_t k, const void *restrict g, int na, const void *const *restrict a, float *restrict s) {
    const int64_t nb = k / 32;
    const unsigned char *codes = g;
    const uint8x16_t bias = vdupq_n_u8(0x80);
    float32x4_t acc[CPU_PACK_MAX_NA][4];
    for (int r = 0; r < na; r++)
        for (int q = 0; q < 4; q++) acc[r][q] = vdupq_n_f32(0);
    for (int64_t b = 0; b < nb; b++) {
        const unsigned char *cb = codes + (size_t)b * PQ8_BS;
        const uint16_t *d = PQ8_D(g, b);
        for (int q = 0; q < 4; q++) {
            /* the signed codes (c ^ 0x80) of rows 4q .. 4q+3, elements 4v .. 4v+3 */
            int8x16_t w[8];
            for (int v = 0; v < 8; v++) w[v] = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(cb + v * 64 + q * 16), bias));
            for (int r = 0; r < na; r++) {
                const pq0_act *y = (const pq0_act *)a[r] + b;
                const int8x16_t a0 = vld1q_s8(y->qs), a1 = vld1q_s8(y->qs + 16);
                /* sum (c - 128) * a = sum c * a + c8: the portable kernel's integer */
                int32x4_t sum = vdupq_n_s32(0);
                sum = DOT4(sum, w[0], a0, 0);
                sum = DOT4(sum, w[1], a0, 1);
                sum = DOT4(sum, w[2], a0, 2);
                sum = DOT4(sum, w[3], a0, 3);
                sum = DOT4(sum, w[4], a1, 0);
                sum = DOT4(sum, w[5], a1, 1);
                sum = DOT4(sum, w[6], a1, 2);
                sum = DOT4(sum, w[7], a1, 3);
                acc[r][q] = vfmaq_f32(acc[r][q], scales4(d, q, y->d), vcvtq_f32_s32(sum));
            }
        }
    }
    for (int r = 0; r < na; r++)
        for (int q = 0; q < 4; q++) vst1q_f32(s + (size_t)r * PQ0_R + 4 * q, acc[r][q]);
}

#undef DOT4
#undef ARM_FN
#undef ARM_CAT
#undef ARM_CAT2
