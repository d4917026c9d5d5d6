/* quant_iq.c: the non-linear 4-bit types iq4_nl (blocks of 32, one f16 scale)
 * and iq4_xs (super-blocks of 256: one f16 scale and eight 6-bit sub-scales).
 * Each 4-bit code indexes a fixed 16-entry int8 table.
 *
 * The quantizers follow the path llama-quantize takes without an importance
 * matrix (weights w = x^2, 15 candidate scales around -max/table[0] per
 * 32-element block), so files quantized by hone and by llama.cpp carry the same
 * bytes. Note: llama.cpp's separate "row reference" for iq4_nl uses no scale
 * search; hone's from_float is the file-producing variant. */
#include <math.h>
#include <string.h>

#include "quant_int.h"

#define GROUP_MAX_EPS 1e-15f
#define NTRY 7

static const int8_t iq4_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* Index of the table entry nearest to x (ties to the lower entry), by bisection. */
static int best_index(float x) {
    if (x <= iq4_values[0]) return 0;
    if (x >= iq4_values[15]) return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (x < iq4_values[mid]) hi = mid;
        else lo = mid;
    }
    return x - iq4_values[hi - 1] < iq4_values[hi] - x ? hi - 1 : hi;
}

/* Fits one 32-element block: codes into L, returns the scale (0 if all ~zero,
 * in which case L is left as is). */
static float fit_block(const float *restrict xb, uint8_t *restrict L) {
    float weight[32];
    float amax = 0, max = 0;
    for (int j = 0; j < 32; j++) {
        weight[j] = xb[j] * xb[j];
        const float ax = fabsf(xb[j]);
        if (ax > amax) {
            amax = ax;
            max = xb[j];
        }
    }
    if (amax < GROUP_MAX_EPS) return 0;
    float d = -max / iq4_values[0];
    float id = 1 / d;
    float sumqx = 0, sumq2 = 0;
    for (int j = 0; j < 32; j++) {
        const int l = best_index(id * xb[j]);
        L[j] = (uint8_t)l;
        const float q = iq4_values[l];
        sumqx += weight[j] * q * xb[j];
        sumq2 += weight[j] * q * q;
    }
    d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
    float best = d * sumqx;
    for (int itry = -NTRY; itry <= NTRY; itry++) {
        id = (itry + iq4_values[0]) / max;
        sumqx = sumq2 = 0;
        for (int j = 0; j < 32; j++) {
            const float q = iq4_values[best_index(id * xb[j])];
            sumqx += weight[j] * q * xb[j];
            sumq2 += weight[j] * q * q;
        }
        if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    return d;
}

/* Packs 32 codes: byte j holds elements j (low nibble) and j+16 (high). */
static void pack32(const uint8_t *restrict L, uint8_t *restrict qs) {
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)(L[j] | (L[16 + j] << 4));
}

void qt_quant_iq4_nl(const float *restrict x, void *restrict vy, int64_t n) {
    block_iq4_nl *y = vy;
    const int64_t nb = n / QK4_NL;
    uint8_t L[QK4_NL] = {0};
    for (int64_t i = 0; i < nb; i++, x += QK4_NL) {
        const float d = fit_block(x, L);
        y[i].d = qt_f32_to_f16(d);
        const float id = d ? 1 / d : 0;
        for (int j = 0; j < QK4_NL; j++) L[j] = (uint8_t)best_index(id * x[j]);
        pack32(L, y[i].qs);
    }
}

void qt_dequant_iq4_nl(const void *restrict vx, float *restrict y, int64_t n) {
    const block_iq4_nl *x = vx;
    const int64_t nb = n / QK4_NL;
    for (int64_t i = 0; i < nb; i++, y += QK4_NL) {
        const float d = qt_f16_to_f32(x[i].d);
        for (int j = 0; j < QK4_NL / 2; j++) {
            y[j] = d * iq4_values[x[i].qs[j] & 0xf];
            y[j + QK4_NL / 2] = d * iq4_values[x[i].qs[j] >> 4];
        }
    }
}

void qt_quant_iq4_xs(const float *restrict x, void *restrict vy, int64_t n) {
    block_iq4_xs *y = vy;
    const int64_t nb = n / QK_K;
    uint8_t L[QK_K] = {0};
    float scales[QK_K / 32];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        float max_scale = 0, amax_scale = 0;
        for (int ib = 0; ib < QK_K / 32; ib++) {
            scales[ib] = fit_block(x + 32 * ib, L + 32 * ib);
            if (fabsf(scales[ib]) > amax_scale) {
                amax_scale = fabsf(scales[ib]);
                max_scale = scales[ib];
            }
        }
        /* sub-scales are 6-bit signed (stored +32) against d = -max_scale/32 */
        const float d = -max_scale / 32;
        y[i].d = qt_f32_to_f16(d);
        y[i].scales_h = 0;
        memset(y[i].scales_l, 0, sizeof y[i].scales_l);
        const float id = d ? 1 / d : 0.f;
        for (int ib = 0; ib < QK_K / 32; ib++) {
            int l = qt_nearest_int(id * scales[ib]);
            l = l < -32 ? -32 : l > 31 ? 31 : l;
            const float dl = d * l;
            const float idl = dl ? 1 / dl : 0.f;
            for (int j = 0; j < 32; j++) L[32 * ib + j] = (uint8_t)best_index(idl * x[32 * ib + j]);
            l += 32;
            y[i].scales_l[ib / 2] |= (uint8_t)((l & 0xf) << (4 * (ib % 2)));
            y[i].scales_h |= (uint16_t)((l >> 4) << (2 * ib));
        }
        for (int ib = 0; ib < QK_K / 32; ib++) pack32(L + 32 * ib, y[i].qs + 16 * ib);
    }
}

void qt_dequant_iq4_xs(const void *restrict vx, float *restrict y, int64_t n) {
    const block_iq4_xs *x = vx;
    const int64_t nb = n / QK_K;
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *qs = x[i].qs;
        const float d = qt_f16_to_f32(x[i].d);
        for (int ib = 0; ib < QK_K / 32; ib++, y += 32, qs += 16) {
            const int ls = ((x[i].scales_l[ib / 2] >> 4 * (ib % 2)) & 0xf) | (((x[i].scales_h >> 2 * ib) & 3) << 4);
            const float dl = d * (ls - 32);
            for (int j = 0; j < 16; j++) {
                y[j] = dl * iq4_values[qs[j] & 0xf];
                y[j + 16] = dl * iq4_values[qs[j] >> 4];
            }
        }
    }
}
