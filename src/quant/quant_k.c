/* quant_k.c: the K-quants (q2_K, q3_K, q4_K, q5_K, q6_K, and q8_K for
 * activations): 256-element super-blocks split into 16- or 32-element
 * sub-blocks, each with its own scale (and min), the scales themselves
 * quantized against one f16 super-block scale.
 *
 * Quantization is llama.cpp's reference algorithm (no importance matrix):
 * for every sub-block a small search picks the scale (and min) that minimise a
 * weighted error (fit_affine for the "scale + min" types, fit_symmetric and
 * fit_q3 for the signed ones); then the sub-block scales are rounded to 4/6/8
 * bits and the elements re-quantized against the rounded scales. The results
 * must be byte-identical with llama.cpp, so the float arithmetic (operation
 * order, rounding helper, search grids) is kept exactly as the reference
 * computes it. */
#include <math.h>
#include <string.h>

#include "quant_int.h"

#define GROUP_MAX_EPS 1e-15f

static inline int imin(int a, int b) { return a < b ? a : b; }
static inline int imax(int a, int b) { return a > b ? a : b; }

/* Signed fit: L[i] in [0, 2*nmax) codes x ~ scale * (L[i] - nmax). Starts from
 * the scale mapping the largest-magnitude value to -nmax, then (weighted least
 * squares, w = x^2) tries 18 nearby scales -(nmax + 0.1*k)/max and keeps the
 * best. Returns the scale (0 if the block is all zero). Used by q6_K. */
static float fit_symmetric(int n, int nmax, const float *restrict x, int8_t *restrict L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        const float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < GROUP_MAX_EPS) {
        for (int i = 0; i < n; i++) L[i] = 0;
        return 0.f;
    }
    float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = qt_nearest_int(iscale * x[i]);
        l = imax(-nmax, imin(nmax - 1, l));
        L[i] = (int8_t)(l + nmax);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = qt_nearest_int(iscale * x[i]);
            l = imax(-nmax, imin(nmax - 1, l));
            const float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) {
                const int l = qt_nearest_int(iscale * x[i]);
                L[i] = (int8_t)(nmax + imax(-nmax, imin(nmax - 1, l)));
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Signed 3-bit fit for q3_K: start from -nmax/max, then up to 5 passes of
 * coordinate descent moving one code at a time when that improves the
 * weighted (w = x^2) least-squares fit. Codes come back offset by nmax. */
static float fit_q3(int n, int nmax, const float *restrict x, int8_t *restrict L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        const float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < GROUP_MAX_EPS) {
        for (int i = 0; i < n; i++) L[i] = 0;
        return 0.f;
    }
    const float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = qt_nearest_int(iscale * x[i]);
        l = imax(-nmax, imin(nmax - 1, l));
        L[i] = (int8_t)l;
        const float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    for (int itry = 0; itry < 5; itry++) {
        int n_changed = 0;
        for (int i = 0; i < n; i++) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * L[i] * L[i];
                int new_l = qt_nearest_int(x[i] * sl2 / slx);
                new_l = imax(-nmax, imin(nmax - 1, new_l));
                if (new_l != L[i]) {
                    slx += w * x[i] * new_l;
                    sl2 += w * new_l * new_l;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed++;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* Affine fit for the "scale and min" types: x ~ scale * L - min with L in
 * [0, nmax], min >= 0 returned in *the_min. Tries nstep+1 scales
 * (rmin + rdelta*k + nmax)/(max - min), each followed by a weighted least
 * squares for (scale, min), keeping the one with the lowest weighted error
 * (absolute error if use_mad, else squared). Laux is scratch of n bytes. */
static float fit_affine(int n, int nmax, const float *restrict x, const float *restrict weights,
                        uint8_t *restrict L, float *restrict the_min, uint8_t *restrict Laux,
                        float rmin, float rdelta, int nstep, bool use_mad) {
    float min = x[0], max = x[0];
    float sum_w = weights[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        const float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        for (int i = 0; i < n; i++) L[i] = 0;
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; i++) {
        const int l = qt_nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)imax(0, imin(nmax, l));
        float diff = scale * L[i] + min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        best_error += weights[i] * diff;
    }
    if (nstep < 1) {
        *the_min = -min;
        return scale;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = qt_nearest_int(iscale * (x[i] - min));
            l = imax(0, imin(nmax, l));
            Laux[i] = (uint8_t)l;
            const float w = weights[i];
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                diff = use_mad ? fabsf(diff) : diff * diff;
                cur_error += weights[i] * diff;
            }
            if (cur_error < best_error) {
                memcpy(L, Laux, (size_t)n);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* q4_K/q5_K pack eight 6-bit scales and eight 6-bit mins into 12 bytes:
 * bytes 0-3 hold scales 0-3 (low 6 bits) and the top 2 bits of scales 4-7,
 * bytes 4-7 the same for mins, bytes 8-11 the low 4 bits of scale|min 4-7. */
static inline void k4_scale_min(int j, const uint8_t *restrict q, uint8_t *restrict d, uint8_t *restrict m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* Packs 256 2-bit codes: byte l of each 32-byte group holds elements l, l+32, l+64, l+96. */
static void pack_2bit(const uint8_t *restrict L, uint8_t *restrict qs) {
    for (int j = 0; j < QK_K; j += 128)
        for (int l = 0; l < 32; l++)
            qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

/* ---- q2_K: 16 sub-blocks of 16, x = d*sc*q - dmin*m, 4-bit sc and m ---- */

void qt_quant_q2_K(const float *restrict x, void *restrict vy, int64_t n) {
    block_q2_K *y = vy;
    const int64_t nb = n / QK_K;
    uint8_t L[QK_K], Laux[16];
    float weights[16], mins[QK_K / 16], scales[QK_K / 16];
    const float q4scale = 15.f;

    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < QK_K / 16; j++) {
            for (int l = 0; l < 16; l++) weights[l] = fabsf(x[16 * j + l]);
            scales[j] = fit_affine(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, true);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        if (max_scale > 0) {
            const float iscale = q4scale / max_scale;
            for (int j = 0; j < QK_K / 16; j++) y[i].scales[j] = (uint8_t)qt_nearest_int(iscale * scales[j]);
            y[i].d = qt_f32_to_f16(max_scale / q4scale);
        } else {
            memset(y[i].scales, 0, sizeof y[i].scales);
            y[i].d = qt_f32_to_f16(0.f);
        }
        if (max_min > 0) {
            const float iscale = q4scale / max_min;
            for (int j = 0; j < QK_K / 16; j++) y[i].scales[j] |= (uint8_t)(qt_nearest_int(iscale * mins[j]) << 4);
            y[i].dmin = qt_f32_to_f16(max_min / q4scale);
        } else {
            y[i].dmin = qt_f32_to_f16(0.f);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = qt_f16_to_f32(y[i].d) * (y[i].scales[j] & 0xf);
            if (!d) continue;
            const float dm = qt_f16_to_f32(y[i].dmin) * (y[i].scales[j] >> 4);
            for (int ii = 0; ii < 16; ii++) {
                const int l = qt_nearest_int((x[16 * j + ii] + dm) / d);
                L[16 * j + ii] = (uint8_t)imax(0, imin(3, l));
            }
        }
        pack_2bit(L, y[i].qs);
    }
}

void qt_dequant_q2_K(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q2_K *x = vx;
    const int64_t nb = n / QK_K;
    for (int64_t i = 0; i < nb; i++) {
        const float d = qt_f16_to_f32(x[i].d), min = qt_f16_to_f32(x[i].dmin);
        const uint8_t *q = x[i].qs;
        int is = 0;
        for (int k = 0; k < QK_K; k += 128, q += 32) {
            for (int shift = 0; shift < 8; shift += 2) {
                for (int half = 0; half < 2; half++) {
                    const uint8_t sc = x[i].scales[is++];
                    const float dl = d * (sc & 0xf), ml = min * (sc >> 4);
                    for (int l = 0; l < 16; l++) *y++ = dl * ((q[l + 16 * half] >> shift) & 3) - ml;
                }
            }
        }
    }
}

/* ---- q3_K: 16 sub-blocks of 16, x = d * (sc - 32) * (q - 4), 6-bit sc ---- */

/* The 6-bit scale j from q3_K's 12 packed bytes: low nibbles in bytes 0-7,
 * top 2 bits in bytes 8-11. Returns it minus 32. */
static inline int q3_scale(const uint8_t *s, int j) {
    const int lo = j < 8 ? s[j] & 0xf : s[j - 8] >> 4;
    const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    return (lo | (hi << 4)) - 32;
}

void qt_quant_q3_K(const float *restrict x, void *restrict vy, int64_t n) {
    block_q3_K *y = vy;
    const int64_t nb = n / QK_K;
    int8_t L[QK_K];
    float scales[QK_K / 16];

    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        float max_scale = 0, amax = 0;
        for (int j = 0; j < QK_K / 16; j++) {
            scales[j] = fit_q3(16, 4, x + 16 * j, L + 16 * j);
            const float scale = fabsf(scales[j]);
            if (scale > amax) {
                amax = scale;
                max_scale = scales[j];
            }
        }
        memset(y[i].scales, 0, 12);
        if (max_scale) {
            const float iscale = -32.f / max_scale;
            for (int j = 0; j < QK_K / 16; j++) {
                int8_t l = (int8_t)qt_nearest_int(iscale * scales[j]);
                l = (int8_t)(imax(-32, imin(31, l)) + 32);
                if (j < 8) y[i].scales[j] = l & 0xf;
                else y[i].scales[j - 8] |= (uint8_t)((l & 0xf) << 4);
                l >>= 4;
                y[i].scales[j % 4 + 8] |= (uint8_t)(l << (2 * (j / 4)));
            }
            y[i].d = qt_f32_to_f16(1 / iscale);
        } else {
            y[i].d = qt_f32_to_f16(0.f);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = qt_f16_to_f32(y[i].d) * (int8_t)q3_scale(y[i].scales, j);
            if (!d) continue;
            for (int ii = 0; ii < 16; ii++) {
                const int l = qt_nearest_int(x[16 * j + ii] / d);
                L[16 * j + ii] = (int8_t)(imax(-4, imin(3, l)) + 4);
            }
        }
        /* high bit of element j goes to hmask[j % 32], bit j / 32 */
        memset(y[i].hmask, 0, QK_K / 8);
        for (int j = 0; j < QK_K; j++) {
            if (L[j] > 3) {
                y[i].hmask[j % 32] |= (uint8_t)(1 << (j / 32));
                L[j] -= 4;
            }
        }
        pack_2bit((const uint8_t *)L, y[i].qs);
    }
}

void qt_dequant_q3_K(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q3_K *x = vx;
    const int64_t nb = n / QK_K;
    for (int64_t i = 0; i < nb; i++) {
        const float d_all = qt_f16_to_f32(x[i].d);
        const uint8_t *q = x[i].qs, *hm = x[i].hmask;
        uint8_t m = 1;
        int is = 0;
        for (int k = 0; k < QK_K; k += 128, q += 32) {
            for (int shift = 0; shift < 8; shift += 2, m <<= 1) {
                for (int half = 0; half < 2; half++) {
                    const float dl = d_all * q3_scale(x[i].scales, is++);
                    for (int l = 0; l < 16; l++) {
                        const int ll = l + 16 * half;
                        *y++ = dl * (((q[ll] >> shift) & 3) - ((hm[ll] & m) ? 0 : 4));
                    }
                }
            }
        }
    }
}

/* ---- q4_K / q5_K: 8 sub-blocks of 32, x = d*sc*q - dmin*m, 6-bit sc and m ---- */

/* The sub-block fits and scale packing shared by q4_K (nmax 15) and q5_K (31);
 * leaves the final codes in L. */
static void k4_block(const float *restrict x, int nmax, float rmin, int nstep, uint16_t *d_out,
                     uint16_t *dmin_out, uint8_t *restrict packed, uint8_t *restrict L) {
    uint8_t Laux[32];
    float weights[32], mins[QK_K / 32], scales[QK_K / 32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < QK_K / 32; j++) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += x[32 * j + l] * x[32 * j + l];
        const float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) weights[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = fit_affine(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep, false);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    for (int j = 0; j < QK_K / 32; j++) {
        uint8_t ls = (uint8_t)qt_nearest_int(inv_scale * scales[j]);
        uint8_t lm = (uint8_t)qt_nearest_int(inv_min * mins[j]);
        if (ls > 63) ls = 63;
        if (lm > 63) lm = 63;
        if (j < 4) {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (uint8_t)((ls & 0xf) | ((lm & 0xf) << 4));
            packed[j - 4] |= (uint8_t)((ls >> 4) << 6);
            packed[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    *d_out = qt_f32_to_f16(max_scale / 63.f);
    *dmin_out = qt_f32_to_f16(max_min / 63.f);
    for (int j = 0; j < QK_K / 32; j++) {
        uint8_t sc, m;
        k4_scale_min(j, packed, &sc, &m);
        const float d = qt_f16_to_f32(*d_out) * sc;
        if (!d) continue;
        const float dm = qt_f16_to_f32(*dmin_out) * m;
        for (int ii = 0; ii < 32; ii++) {
            const int l = qt_nearest_int((x[32 * j + ii] + dm) / d);
            L[32 * j + ii] = (uint8_t)imax(0, imin(nmax, l));
        }
    }
}

void qt_quant_q4_K(const float *restrict x, void *restrict vy, int64_t n) {
    block_q4_K *y = vy;
    const int64_t nb = n / QK_K;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        memset(y[i].scales, 0, K_SCALE_SIZE);
        k4_block(x, 15, -1.f, 20, &y[i].d, &y[i].dmin, y[i].scales, L);
        uint8_t *q = y[i].qs;
        for (int j = 0; j < QK_K; j += 64, q += 32)
            for (int l = 0; l < 32; l++) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
    }
}

void qt_dequant_q4_K(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q4_K *x = vx;
    const int64_t nb = n / QK_K;
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *q = x[i].qs;
        const float d = qt_f16_to_f32(x[i].d), min = qt_f16_to_f32(x[i].dmin);
        for (int j = 0, is = 0; j < QK_K; j += 64, q += 32, is += 2) {
            uint8_t sc, m;
            k4_scale_min(is, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            k4_scale_min(is + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (q[l] & 0xf) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (q[l] >> 4) - m2;
        }
    }
}

void qt_quant_q5_K(const float *restrict x, void *restrict vy, int64_t n) {
    block_q5_K *y = vy;
    const int64_t nb = n / QK_K;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        memset(y[i].scales, 0, K_SCALE_SIZE);
        k4_block(x, 31, -0.5f, 15, &y[i].d, &y[i].dmin, y[i].scales, L);
        uint8_t *qh = y[i].qh, *ql = y[i].qs;
        memset(qh, 0, QK_K / 8);
        uint8_t m1 = 1, m2 = 2;
        for (int k = 0; k < QK_K; k += 64, ql += 32, m1 <<= 2, m2 <<= 2) {
            for (int j = 0; j < 32; j++) {
                int l1 = L[k + j], l2 = L[k + j + 32];
                if (l1 > 15) {
                    l1 -= 16;
                    qh[j] |= m1;
                }
                if (l2 > 15) {
                    l2 -= 16;
                    qh[j] |= m2;
                }
                ql[j] = (uint8_t)(l1 | (l2 << 4));
            }
        }
    }
}

void qt_dequant_q5_K(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q5_K *x = vx;
    const int64_t nb = n / QK_K;
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *ql = x[i].qs, *qh = x[i].qh;
        const float d = qt_f16_to_f32(x[i].d), min = qt_f16_to_f32(x[i].dmin);
        uint8_t u1 = 1, u2 = 2;
        for (int j = 0, is = 0; j < QK_K; j += 64, ql += 32, is += 2, u1 <<= 2, u2 <<= 2) {
            uint8_t sc, m;
            k4_scale_min(is, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            k4_scale_min(is + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * ((ql[l] & 0xf) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
        }
    }
}

/* ---- q6_K: 16 sub-blocks of 16, x = d * sc * (q - 32), int8 sc ---- */

void qt_quant_q6_K(const float *restrict x, void *restrict vy, int64_t n) {
    block_q6_K *y = vy;
    const int64_t nb = n / QK_K;
    int8_t L[QK_K];
    float scales[QK_K / 16];

    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        float max_scale = 0, max_abs_scale = 0;
        for (int ib = 0; ib < QK_K / 16; ib++) {
            const float scale = fit_symmetric(16, 32, x + 16 * ib, L + 16 * ib);
            scales[ib] = scale;
            if (fabsf(scale) > max_abs_scale) {
                max_abs_scale = fabsf(scale);
                max_scale = scale;
            }
        }
        if (max_abs_scale < GROUP_MAX_EPS) {
            memset(&y[i], 0, sizeof(block_q6_K));
            continue;
        }
        const float iscale = -128.f / max_scale;
        y[i].d = qt_f32_to_f16(1 / iscale);
        for (int ib = 0; ib < QK_K / 16; ib++) y[i].scales[ib] = (int8_t)imin(127, qt_nearest_int(iscale * scales[ib]));
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = qt_f16_to_f32(y[i].d) * y[i].scales[j];
            if (!d) continue;
            for (int ii = 0; ii < 16; ii++) {
                const int l = qt_nearest_int(x[16 * j + ii] / d);
                L[16 * j + ii] = (int8_t)(imax(-32, imin(31, l)) + 32);
            }
        }
        uint8_t *ql = y[i].ql, *qh = y[i].qh;
        for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32) {
            for (int l = 0; l < 32; l++) {
                const uint8_t q1 = L[j + l] & 0xf, q2 = L[j + l + 32] & 0xf;
                const uint8_t q3 = L[j + l + 64] & 0xf, q4 = L[j + l + 96] & 0xf;
                ql[l] = (uint8_t)(q1 | (q3 << 4));
                ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
                qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                                  ((L[j + l + 96] >> 4) << 6));
            }
        }
    }
}

void qt_dequant_q6_K(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q6_K *x = vx;
    const int64_t nb = n / QK_K;
    for (int64_t i = 0; i < nb; i++) {
        const float d = qt_f16_to_f32(x[i].d);
        const uint8_t *ql = x[i].ql, *qh = x[i].qh;
        const int8_t *sc = x[i].scales;
        for (int k = 0; k < QK_K; k += 128, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * sc[is] * q1;
                y[l + 32] = d * sc[is + 2] * q2;
                y[l + 64] = d * sc[is + 4] * q3;
                y[l + 96] = d * sc[is + 6] * q4;
            }
        }
    }
}

/* ---- q8_K: f32 scale, q = round(-127/max * x), plus sums of each 16 ---- */

void qt_quant_q8_K(const float *restrict x, void *restrict vy, int64_t n) {
    block_q8_K *y = vy;
    const int64_t nb = n / QK_K;
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        float max = 0, amax = 0;
        for (int j = 0; j < QK_K; j++) {
            const float ax = fabsf(x[j]);
            if (ax > amax) {
                amax = ax;
                max = x[j];
            }
        }
        if (!amax) {
            /* llama.cpp leaves bsums unwritten here; they are zero in hone */
            memset(&y[i], 0, sizeof(block_q8_K));
            continue;
        }
        const float iscale = -127.f / max;
        for (int j = 0; j < QK_K; j++) y[i].qs[j] = (int8_t)imin(127, qt_nearest_int(iscale * x[j]));
        for (int j = 0; j < QK_K / 16; j++) {
            int sum = 0;
            for (int ii = 0; ii < 16; ii++) sum += y[i].qs[j * 16 + ii];
            y[i].bsums[j] = (int16_t)sum;
        }
        y[i].d = 1 / iscale;
    }
}

void qt_dequant_q8_K(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q8_K *x = vx;
    const int64_t nb = n / QK_K;
    for (int64_t i = 0; i < nb; i++)
        for (int j = 0; j < QK_K; j++) *y++ = x[i].d * x[i].qs[j];
}
