/* quant_legacy.c: the 32-element block types (q4_0, q4_1, q5_0, q5_1, q8_0,
 * q8_1) and mxfp4: scalar reference dequantization and quantization.
 *
 * The quantizers reproduce llama.cpp's reference ones bit for bit: the same
 * float operations in the same order, the same truncating casts ("+ 8.5 then
 * truncate" is round-half-up on a shifted value), roundf (half away from zero)
 * for q8, and the scale stored as IEEE half before the codes are computed from
 * the unrounded f32 scale. Changing the order of a single multiply changes
 * bytes in the output files, so keep the arithmetic as written. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "quant_int.h"

/* ---- q4_0: d * (q - 8), d = max / -8 where max is the value of largest magnitude ---- */

void qt_quant_q4_0(const float *restrict x, void *restrict vy, int64_t n) {
    block_q4_0 *y = vy;
    const int64_t nb = n / QK4_0;
    for (int64_t i = 0; i < nb; i++, x += QK4_0) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK4_0; j++) {
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        const float d = max / -8;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = qt_f32_to_f16(d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            int q0 = (int)(x[j] * id + 8.5f);
            int q1 = (int)(x[j + QK4_0 / 2] * id + 8.5f);
            if (q0 > 15) q0 = 15;
            if (q1 > 15) q1 = 15;
            y[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

void qt_dequant_q4_0(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q4_0 *x = vx;
    const int64_t nb = n / QK4_0;
    for (int64_t i = 0; i < nb; i++, y += QK4_0) {
        const float d = qt_f16_to_f32(x[i].d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            y[j] = ((x[i].qs[j] & 0x0f) - 8) * d;
            y[j + QK4_0 / 2] = ((x[i].qs[j] >> 4) - 8) * d;
        }
    }
}

/* ---- q4_1: d * q + m over [min, max] ---- */

void qt_quant_q4_1(const float *restrict x, void *restrict vy, int64_t n) {
    block_q4_1 *y = vy;
    const int64_t nb = n / QK4_1;
    for (int64_t i = 0; i < nb; i++, x += QK4_1) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < QK4_1; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / 15;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = qt_f32_to_f16(d);
        y[i].m = qt_f32_to_f16(min);
        for (int j = 0; j < QK4_1 / 2; j++) {
            int q0 = (int)((x[j] - min) * id + 0.5f);
            int q1 = (int)((x[j + QK4_1 / 2] - min) * id + 0.5f);
            if (q0 > 15) q0 = 15;
            if (q1 > 15) q1 = 15;
            y[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

void qt_dequant_q4_1(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q4_1 *x = vx;
    const int64_t nb = n / QK4_1;
    for (int64_t i = 0; i < nb; i++, y += QK4_1) {
        const float d = qt_f16_to_f32(x[i].d), m = qt_f16_to_f32(x[i].m);
        for (int j = 0; j < QK4_1 / 2; j++) {
            y[j] = (x[i].qs[j] & 0x0f) * d + m;
            y[j + QK4_1 / 2] = (x[i].qs[j] >> 4) * d + m;
        }
    }
}

/* ---- q5_0 / q5_1: as q4 with a fifth bit per element packed in qh ---- */

void qt_quant_q5_0(const float *restrict x, void *restrict vy, int64_t n) {
    block_q5_0 *y = vy;
    const int64_t nb = n / QK5_0;
    for (int64_t i = 0; i < nb; i++, x += QK5_0) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK5_0; j++) {
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        const float d = max / -16;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = qt_f32_to_f16(d);
        uint32_t qh = 0;
        for (int j = 0; j < QK5_0 / 2; j++) {
            int q0 = (int)(x[j] * id + 16.5f);
            int q1 = (int)(x[j + QK5_0 / 2] * id + 16.5f);
            if (q0 > 31) q0 = 31;
            if (q1 > 31) q1 = 31;
            y[i].qs[j] = (uint8_t)((q0 & 0x0f) | ((q1 & 0x0f) << 4));
            qh |= (uint32_t)((q0 >> 4) & 1) << j;
            qh |= (uint32_t)((q1 >> 4) & 1) << (j + QK5_0 / 2);
        }
        memcpy(y[i].qh, &qh, sizeof qh);
    }
}

void qt_dequant_q5_0(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q5_0 *x = vx;
    const int64_t nb = n / QK5_0;
    for (int64_t i = 0; i < nb; i++, y += QK5_0) {
        const float d = qt_f16_to_f32(x[i].d);
        uint32_t qh;
        memcpy(&qh, x[i].qh, sizeof qh);
        for (int j = 0; j < QK5_0 / 2; j++) {
            const int h0 = (qh >> j) & 1, h1 = (qh >> (j + 16)) & 1;
            y[j] = (((x[i].qs[j] & 0x0f) | (h0 << 4)) - 16) * d;
            y[j + QK5_0 / 2] = (((x[i].qs[j] >> 4) | (h1 << 4)) - 16) * d;
        }
    }
}

void qt_quant_q5_1(const float *restrict x, void *restrict vy, int64_t n) {
    block_q5_1 *y = vy;
    const int64_t nb = n / QK5_1;
    for (int64_t i = 0; i < nb; i++, x += QK5_1) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < QK5_1; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / 31;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = qt_f32_to_f16(d);
        y[i].m = qt_f32_to_f16(min);
        uint32_t qh = 0;
        for (int j = 0; j < QK5_1 / 2; j++) {
            /* no clamp here (llama.cpp has none): the byte keeps whatever truncation gives */
            const uint8_t q0 = (uint8_t)((x[j] - min) * id + 0.5f);
            const uint8_t q1 = (uint8_t)((x[j + QK5_1 / 2] - min) * id + 0.5f);
            y[i].qs[j] = (uint8_t)((q0 & 0x0f) | ((q1 & 0x0f) << 4));
            qh |= (uint32_t)((q0 >> 4) & 1) << j;
            qh |= (uint32_t)((q1 >> 4) & 1) << (j + QK5_1 / 2);
        }
        memcpy(y[i].qh, &qh, sizeof qh);
    }
}

void qt_dequant_q5_1(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q5_1 *x = vx;
    const int64_t nb = n / QK5_1;
    for (int64_t i = 0; i < nb; i++, y += QK5_1) {
        const float d = qt_f16_to_f32(x[i].d), m = qt_f16_to_f32(x[i].m);
        uint32_t qh;
        memcpy(&qh, x[i].qh, sizeof qh);
        for (int j = 0; j < QK5_1 / 2; j++) {
            const int h0 = (qh >> j) & 1, h1 = (qh >> (j + 16)) & 1;
            y[j] = ((x[i].qs[j] & 0x0f) | (h0 << 4)) * d + m;
            y[j + QK5_1 / 2] = ((x[i].qs[j] >> 4) | (h1 << 4)) * d + m;
        }
    }
}

/* ---- q8_0 / q8_1: d = amax / 127, q = roundf(x / d) ---- */

void qt_quant_q8_0(const float *restrict x, void *restrict vy, int64_t n) {
    block_q8_0 *y = vy;
    const int64_t nb = n / QK8_0;
    for (int64_t i = 0; i < nb; i++, x += QK8_0) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = qt_f32_to_f16(d);
        for (int j = 0; j < QK8_0; j++) y[i].qs[j] = (int8_t)roundf(x[j] * id);
    }
}

void qt_dequant_q8_0(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q8_0 *x = vx;
    const int64_t nb = n / QK8_0;
    for (int64_t i = 0; i < nb; i++, y += QK8_0) {
        const float d = qt_f16_to_f32(x[i].d);
        for (int j = 0; j < QK8_0; j++) y[j] = x[i].qs[j] * d;
    }
}

void qt_quant_q8_1(const float *restrict x, void *restrict vy, int64_t n) {
    block_q8_1 *y = vy;
    const int64_t nb = n / QK8_1;
    for (int64_t i = 0; i < nb; i++, x += QK8_1) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_1; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = qt_f32_to_f16(d);
        int sum = 0;
        for (int j = 0; j < QK8_1; j++) {
            y[i].qs[j] = (int8_t)roundf(x[j] * id);
            sum += y[i].qs[j];
        }
        y[i].s = qt_f32_to_f16(sum * d);
    }
}

void qt_dequant_q8_1(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q8_1 *x = vx;
    const int64_t nb = n / QK8_1;
    for (int64_t i = 0; i < nb; i++, y += QK8_1) {
        const float d = qt_f16_to_f32(x[i].d);
        for (int j = 0; j < QK8_1; j++) y[j] = x[i].qs[j] * d;
    }
}

/* ---- mxfp4: E2M1 codes (table holds doubled values) times 2^(e-127), so the
 * stored exponent is applied as 2^(e-128) to undo the doubling. ---- */

static const int8_t fp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* 2^(e-128) as a float, e an E8M0 exponent (e = 0 and 1 give subnormals). */
static inline float e8m0_half(uint8_t e) {
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static int fp4_best(float x, float d) {
    int best = 0;
    float best_err = fabsf(fp4_values[0] * d - x);
    for (int i = 1; i < 16; i++) {
        const float err = fabsf(fp4_values[i] * d - x);
        if (err < best_err) {
            best = i;
            best_err = err;
        }
    }
    return best;
}

void qt_quant_mxfp4(const float *restrict x, void *restrict vy, int64_t n) {
    block_mxfp4 *y = vy;
    const int64_t nb = n / QK_MXFP4;
    for (int64_t i = 0; i < nb; i++, x += QK_MXFP4) {
        float amax = 0.0f;
        for (int j = 0; j < QK_MXFP4; j++)
            if (amax < fabsf(x[j])) amax = fabsf(x[j]);
        const uint8_t e = amax > 0.0f ? (uint8_t)(floorf(log2f(amax)) - 2 + 127) : 0;
        const float d = e8m0_half(e);
        y[i].e = e;
        for (int j = 0; j < QK_MXFP4 / 2; j++)
            y[i].qs[j] = (uint8_t)(fp4_best(x[j], d) | (fp4_best(x[j + QK_MXFP4 / 2], d) << 4));
    }
}

void qt_dequant_mxfp4(const void *restrict vx, float *restrict y, int64_t n) {
    const block_mxfp4 *x = vx;
    const int64_t nb = n / QK_MXFP4;
    for (int64_t i = 0; i < nb; i++, y += QK_MXFP4) {
        const float d = e8m0_half(x[i].e);
        for (int j = 0; j < QK_MXFP4 / 2; j++) {
            y[j] = fp4_values[x[i].qs[j] & 0x0f] * d;
            y[j + QK_MXFP4 / 2] = fp4_values[x[i].qs[j] >> 4] * d;
        }
    }
}
