/* dot_neon.c: the AArch64 dot kernels of dot_arm.h for the base ISA (NEON
 * is in every AArch64 CPU), and the NEON activation converters, which write
 * dot.c's scalar converters' bytes exactly. */
#if defined(__aarch64__)

#include <math.h>

#define ARM_SFX neon
#include "dot_arm.h"

#include "../../quant/quant.h"

/* max(|x|) over n floats (a multiple of 8), NaNs ignored as fmaxf ignores
 * them (fmaxnm returns the number), never below 0 (the scalar scan starts there). */
static inline float amax_n(const float *x, int n) {
    float32x4_t m0 = vdupq_n_f32(0), m1 = vdupq_n_f32(0);
    for (int j = 0; j < n; j += 8) {
        m0 = vmaxnmq_f32(m0, vabsq_f32(vld1q_f32(x + j)));
        m1 = vmaxnmq_f32(m1, vabsq_f32(vld1q_f32(x + j + 4)));
    }
    return vmaxnmvq_f32(vmaxnmq_f32(m0, m1));
}

/* lrintf(x * m) clamped to [-127, 127]: fcvtns rounds to nearest even (the
 * default rounding lrintf uses), saturates out-of-range values and gives 0
 * for NaN, as AArch64's lrintf does. */
static inline int32x4_t round_clamp(float32x4_t x, float32x4_t m) {
    int32x4_t q = vcvtnq_s32_f32(vmulq_f32(x, m));
    return vmaxq_s32(vminq_s32(q, vdupq_n_s32(127)), vdupq_n_s32(-127));
}

/* 16 floats -> 16 codes of x * m; returns their four partial sums. */
static inline int32x4_t q8_16(const float *x, float32x4_t m, int8_t *qs) {
    int32x4_t q0 = round_clamp(vld1q_f32(x), m), q1 = round_clamp(vld1q_f32(x + 4), m);
    int32x4_t q2 = round_clamp(vld1q_f32(x + 8), m), q3 = round_clamp(vld1q_f32(x + 12), m);
    int16x8_t h0 = vcombine_s16(vmovn_s32(q0), vmovn_s32(q1)), h1 = vcombine_s16(vmovn_s32(q2), vmovn_s32(q3));
    vst1q_s8(qs, vcombine_s8(vmovn_s16(h0), vmovn_s16(h1)));
    return vaddq_s32(vaddq_s32(q0, q1), vaddq_s32(q2, q3));
}

void cpu_act_q8_0_neon(const float *restrict x, void *restrict vy, int64_t n) {
    block_q8_0 *y = vy;
    for (int64_t i = 0; i < n / QK8_0; i++, x += QK8_0) {
        float amax = amax_n(x, QK8_0);
        float d = amax / 127.0f, id = amax != 0 ? 127.0f / amax : 0.0f;
        y[i].d = qt_f32_to_f16(d);
        const float32x4_t m = vdupq_n_f32(id);
        (void)q8_16(x, m, y[i].qs);
        (void)q8_16(x + 16, m, y[i].qs + 16);
    }
}

void cpu_act_q8_1_neon(const float *restrict x, void *restrict vy, int64_t n) {
    block_q8_1 *y = vy;
    for (int64_t i = 0; i < n / QK8_1; i++, x += QK8_1) {
        float amax = amax_n(x, QK8_1);
        float d = amax / 127.0f, id = amax != 0 ? 127.0f / amax : 0.0f;
        const float32x4_t m = vdupq_n_f32(id);
        int sum = vaddvq_s32(vaddq_s32(q8_16(x, m, y[i].qs), q8_16(x + 16, m, y[i].qs + 16)));
        y[i].d = qt_f32_to_f16(d);
        y[i].s = qt_f32_to_f16(d * (float)sum);
    }
}

void cpu_act_q8_K_neon(const float *restrict x, void *restrict vy, int64_t n) {
    block_q8_K *y = vy;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        /* the largest |x| and its sign: the first element of that magnitude (as the scalar scan keeps it);
         * fmaxnm / fminnm skip NaNs as the scalar `>` does */
        float32x4_t hi = vdupq_n_f32(-INFINITY), lo = vdupq_n_f32(INFINITY);
        for (int j = 0; j < QK_K; j += 4) {
            float32x4_t v = vld1q_f32(x + j);
            hi = vmaxnmq_f32(hi, v);
            lo = vminnmq_f32(lo, v);
        }
        float vmax = vmaxnmvq_f32(hi), vmin = vminnmvq_f32(lo);
        float amax = vmax > -vmin ? vmax : -vmin;
        if (!(amax > 0)) {
            memset(&y[i], 0, sizeof(y[i]));
            continue;
        }
        float max;
        if (vmax != amax) max = vmin;
        else if (-vmin != amax) max = vmax;
        else { /* both +amax and -amax occur: the first one wins */
            max = 0;
            for (int j = 0; j < QK_K; j++)
                if (fabsf(x[j]) == amax) {
                    max = x[j];
                    break;
                }
        }
        float iscale = -127.0f / max;
        const float32x4_t m = vdupq_n_f32(iscale);
        for (int j = 0; j < QK_K / 16; j++)
            y[i].bsums[j] = (int16_t)vaddvq_s32(q8_16(x + 16 * j, m, y[i].qs + 16 * j));
        y[i].d = 1.0f / iscale;
    }
}

void cpu_act_bf16_neon(const float *restrict x, void *restrict vy, int64_t n) {
    uint16_t *y = vy;
    int64_t i = 0;
    const uint32x4_t one = vdupq_n_u32(1), bias = vdupq_n_u32(0x7fff), quiet = vdupq_n_u32(0x40);
    for (; i + 8 <= n; i += 8) {
        uint16x4_t r[2];
        for (int h = 0; h < 2; h++) {
            float32x4_t v = vld1q_f32(x + i + 4 * h);
            uint32x4_t u = vreinterpretq_u32_f32(v), up = vshrq_n_u32(u, 16);
            uint32x4_t rn = vshrq_n_u32(vaddq_u32(vaddq_u32(u, bias), vandq_u32(up, one)), 16);
            uint32x4_t ok = vceqq_f32(v, v); /* not NaN */
            r[h] = vmovn_u32(vbslq_u32(ok, rn, vorrq_u32(up, quiet)));
        }
        vst1q_u16(y + i, vcombine_u16(r[0], r[1]));
    }
    if (i < n) cpu_act_bf16_ref(x + i, y + i, n - i);
}

#else
/* Not an AArch64 build: nothing here (dot.c registers nothing). */
typedef int hn_dot_neon_unused;
#endif
