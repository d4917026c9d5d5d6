/* pack_q0_i8mm.c: the Q4_0 / Q8_0 x16 kernels on the int8 matrix-multiply
 * extension (smmla; -march=...+i8mm), listed in cpu_pack_table_0_arm and run
 * only when the CPU reports it (HWCAP2_I8MM).
 *
 * smmla multiplies a 2x8 byte matrix by the transpose of another, adding the
 * 2x2 i32 products: with two weight rows' 8 consecutive elements (two 4-byte
 * lanes of adjacent code vectors, interleaved with a zip) against two
 * activation rows' same 8 elements, one instruction does 32 products, twice
 * sdot's 16. Activation rows go in pairs (an odd last row is paired with
 * itself). Every (weight row, activation row) sum is the exact integer the
 * portable kernel computes and the float steps are its steps, so these
 * kernels write its bits, whatever na and whatever the pairing. */
#if defined(__aarch64__) && defined(__ARM_FEATURE_MATMUL_INT8)

#include <arm_neon.h>

#include "pack_q0.h"

static inline float32x4_t scales4(const uint16_t *d, int q, float da) {
    return vmulq_n_f32(vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(d + 4 * q))), da);
}

/* rows (4q, 4q+1) and (4q+2, 4q+3) of two adjacent code vectors v0, v1 as 2x8 byte matrices */
static inline void row_pairs(const unsigned char *v0, const unsigned char *v1, uint8x16_t *p01, uint8x16_t *p23) {
    uint32x4_t a = vreinterpretq_u32_u8(vld1q_u8(v0)), b = vreinterpretq_u32_u8(vld1q_u8(v1));
    *p01 = vreinterpretq_u8_u32(vzip1q_u32(a, b));
    *p23 = vreinterpretq_u8_u32(vzip2q_u32(a, b));
}

/* 2x2 sums c01 = [r0.y0, r0.y1, r1.y0, r1.y1], c23 likewise -> per-activation-row vectors of rows 0..3 */
static inline void split(int32x4_t c01, int32x4_t c23, int32x4_t *y0, int32x4_t *y1) {
    *y0 = vuzp1q_s32(c01, c23);
    *y1 = vuzp2q_s32(c01, c23);
}

void cpu_pack_q4_0x16_i8mm(int64_t k, const void *restrict g, int na, const void *const *restrict a, float *restrict s) {
    const int64_t nb = k / 32;
    const unsigned char *codes = g;
    const uint8x16_t lo4 = vdupq_n_u8(0x0f);
    for (int r = 0; r < na; r += 2) {
        const pq0_act *y0 = a[r], *y1 = a[r + 1 < na ? r + 1 : r];
        float32x4_t acc0[4], acc1[4];
        for (int q = 0; q < 4; q++) acc0[q] = acc1[q] = vdupq_n_f32(0);
        for (int64_t b = 0; b < nb; b++) {
            const unsigned char *cb = codes + (size_t)b * PQ4_BS;
            /* activation elements 8u .. 8u+7 (low nibbles) and 16 + 8u .. (high) of both rows */
            int8x16_t bl[2], bh[2];
            for (int u = 0; u < 2; u++) {
                bl[u] = vcombine_s8(vld1_s8(y0[b].qs + 8 * u), vld1_s8(y1[b].qs + 8 * u));
                bh[u] = vcombine_s8(vld1_s8(y0[b].qs + 16 + 8 * u), vld1_s8(y1[b].qs + 16 + 8 * u));
            }
            const uint16_t *d = PQ4_D(g, b);
            for (int q = 0; q < 4; q++) {
                int32x4_t c01 = vdupq_n_s32(0), c23 = vdupq_n_s32(0);
                for (int u = 0; u < 2; u++) {
                    uint8x16_t p01, p23;
                    row_pairs(cb + 2 * u * 64 + q * 16, cb + (2 * u + 1) * 64 + q * 16, &p01, &p23);
                    c01 = vmmlaq_s32(c01, vreinterpretq_s8_u8(vandq_u8(p01, lo4)), bl[u]);
                    c01 = vmmlaq_s32(c01, vreinterpretq_s8_u8(vshrq_n_u8(p01, 4)), bh[u]);
                    c23 = vmmlaq_s32(c23, vreinterpretq_s8_u8(vandq_u8(p23, lo4)), bl[u]);
                    c23 = vmmlaq_s32(c23, vreinterpretq_s8_u8(vshrq_n_u8(p23, 4)), bh[u]);
                }
                int32x4_t s0, s1;
                split(c01, c23, &s0, &s1);
                s0 = vaddq_s32(s0, vdupq_n_s32(y0[b].c4));
                s1 = vaddq_s32(s1, vdupq_n_s32(y1[b].c4));
                acc0[q] = vfmaq_f32(acc0[q], scales4(d, q, y0[b].d), vcvtq_f32_s32(s0));
                acc1[q] = vfmaq_f32(acc1[q], scales4(d, q, y1[b].d), vcvtq_f32_s32(s1));
            }
        }
        for (int q = 0; q < 4; q++) {
            vst1q_f32(s + (size_t)r * PQ0_R + 4 * q, acc0[q]);
            if (r + 1 < na) vst1q_f32(s + (size_t)(r + 1) * PQ0_R + 4 * q, acc1[q]);
        }
    }
}

void cpu_pack_q8_0x16_i8mm(int64_t k, const void *restrict g, int na, const void *const *restrict a, float *restrict s) {
    const int64_t nb = k / 32;
    const unsigned char *codes = g;
    const uint8x16_t bias = vdupq_n_u8(0x80);
    for (int r = 0; r < na; r += 2) {
        const pq0_act *y0 = a[r], *y1 = a[r + 1 < na ? r + 1 : r];
        float32x4_t acc0[4], acc1[4];
        for (int q = 0; q < 4; q++) acc0[q] = acc1[q] = vdupq_n_f32(0);
        for (int64_t b = 0; b < nb; b++) {
            const unsigned char *cb = codes + (size_t)b * PQ8_BS;
            int8x16_t by[4]; /* activation elements 8u .. 8u+7 of both rows */
            for (int u = 0; u < 4; u++) by[u] = vcombine_s8(vld1_s8(y0[b].qs + 8 * u), vld1_s8(y1[b].qs + 8 * u));
            const uint16_t *d = PQ8_D(g, b);
            for (int q = 0; q < 4; q++) {
                /* signed codes c ^ 0x80: sum (c - 128) * a = sum c * a + c8, the portable kernel's integer */
                int32x4_t c01 = vdupq_n_s32(0), c23 = vdupq_n_s32(0);
                for (int u = 0; u < 4; u++) {
                    uint8x16_t p01, p23;
                    row_pairs(cb + 2 * u * 64 + q * 16, cb + (2 * u + 1) * 64 + q * 16, &p01, &p23);
                    c01 = vmmlaq_s32(c01, vreinterpretq_s8_u8(veorq_u8(p01, bias)), by[u]);
                    c23 = vmmlaq_s32(c23, vreinterpretq_s8_u8(veorq_u8(p23, bias)), by[u]);
                }
                int32x4_t s0, s1;
                split(c01, c23, &s0, &s1);
                acc0[q] = vfmaq_f32(acc0[q], scales4(d, q, y0[b].d), vcvtq_f32_s32(s0));
                acc1[q] = vfmaq_f32(acc1[q], scales4(d, q, y1[b].d), vcvtq_f32_s32(s1));
            }
        }
        for (int q = 0; q < 4; q++) {
            vst1q_f32(s + (size_t)r * PQ0_R + 4 * q, acc0[q]);
            if (r + 1 < na) vst1q_f32(s + (size_t)(r + 1) * PQ0_R + 4 * q, acc1[q]);
        }
    }
}

#else
typedef int hn_pack_q0_i8mm_unused; /* not an AArch64 build with the i8mm flags */
#endif
