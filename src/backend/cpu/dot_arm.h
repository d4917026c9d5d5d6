/* dot_arm.h: the AArch64 dot kernels, one body for two builds (private to
 * dot_neon.c and dot_dotprod.c, which include it once each).
 *
 * ARM_SFX names the variant: dot_neon.c builds it for the base ISA,
 * dot_dotprod.c with -march=...+dotprod, where sdot16 is one sdot
 * instruction (vdotq_s32) instead of two widening multiplies and two pairwise
 * adds. Either way sdot16 adds the 16 byte products of a and b into the four
 * i32 lanes of acc, exactly; the lanes split the sum differently, so the two
 * builds agree with the scalar reference to float rounding (as the x86
 * kernels do: tests/test_dot.c's tolerance), not bit for bit with each other.
 *
 * Every integer product is 8-bit x 8-bit: weights are decoded to signed
 * bytes (Q4_0 - 8, table values, Q6_K - 32 ...) or unsigned codes below 128,
 * activations are in [-127, 127], so nothing saturates; each block's (or
 * sub-block's) integer sum is exact, and one float multiply-add per block
 * (per super-block for the K-quants) scales it. */
#ifndef ARM_SFX
#error "dot_arm.h is included by dot_neon.c / dot_dotprod.c with ARM_SFX set"
#endif

#include <arm_neon.h>
#include <string.h>

#include "dot_int.h"

#define ARM_CAT2(a, b) a##_##b
#define ARM_CAT(a, b) ARM_CAT2(a, b)
#define ARM_FN(name) ARM_CAT(cpu_dot_##name, ARM_SFX)

static inline int32x4_t sdot16(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, a, b);
#else
    int16x8_t lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    int16x8_t hi = vmull_high_s8(a, b);
    return vaddq_s32(acc, vaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi)));
#endif
}

static inline float h2f(uint16_t h) {
    __fp16 f;
    memcpy(&f, &h, 2);
    return (float)f;
}

/* 32 nibbles of a 16-byte row as bytes: low nibbles (elements 0..15), high nibbles (16..31). */
static inline void nib32(const uint8_t *qs, uint8x16_t *lo, uint8x16_t *hi) {
    uint8x16_t q = vld1q_u8(qs);
    *lo = vandq_u8(q, vdupq_n_u8(0x0f));
    *hi = vshrq_n_u8(q, 4);
}

/* ---- float weights ---- */

void ARM_FN(f32)(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const float *w = vw, *a = va;
    float32x4_t acc[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 4; k++) acc[k] = vfmaq_f32(acc[k], vld1q_f32(w + i + 4 * k), vld1q_f32(a + i + 4 * k));
    for (; i + 4 <= n; i += 4) acc[0] = vfmaq_f32(acc[0], vld1q_f32(w + i), vld1q_f32(a + i));
    float sum = vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])));
    for (; i < n; i++) sum += w[i] * a[i];
    *s = sum;
}

void ARM_FN(f16)(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const uint16_t *w = vw;
    const float *a = va;
    float32x4_t acc[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 2; k++) {
            float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(w + i + 8 * k));
            acc[2 * k] = vfmaq_f32(acc[2 * k], vcvt_f32_f16(vget_low_f16(h)), vld1q_f32(a + i + 8 * k));
            acc[2 * k + 1] = vfmaq_f32(acc[2 * k + 1], vcvt_high_f32_f16(h), vld1q_f32(a + i + 8 * k + 4));
        }
    for (; i + 4 <= n; i += 4)
        acc[0] = vfmaq_f32(acc[0], vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(w + i))), vld1q_f32(a + i));
    float sum = vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])));
    for (; i < n; i++) sum += h2f(w[i]) * a[i];
    *s = sum;
}

static inline float bf1(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* BF16 weights against BF16 activations; products are exact in f32. */
void ARM_FN(bf16)(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const uint16_t *w = vw, *a = va;
    float32x4_t acc[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};
    int64_t i = 0;
    /* 8 elements at a time into accumulators 0, 1, then 2, 3 (alternating) */
    for (int k = 0; i + 8 <= n; i += 8, k ^= 2) {
        uint16x8_t wv = vld1q_u16(w + i), av = vld1q_u16(a + i);
        float32x4_t w0 = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(wv), 16));
        float32x4_t w1 = vreinterpretq_f32_u32(vshll_high_n_u16(wv, 16));
        float32x4_t a0 = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(av), 16));
        float32x4_t a1 = vreinterpretq_f32_u32(vshll_high_n_u16(av, 16));
        acc[k] = vfmaq_f32(acc[k], w0, a0);
        acc[k + 1] = vfmaq_f32(acc[k + 1], w1, a1);
    }
    float sum = vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])));
    for (; i < n; i++) sum += bf1(w[i]) * bf1(a[i]);
    *s = sum;
}

/* ---- 32-element blocks against Q8_0 / Q8_1 ---- */

/* One 32-block: signed weight bytes (elements 0..15, 16..31) against its activation codes. */
static inline int32x4_t blk32(int8x16_t w0, int8x16_t w1, const int8_t *aq) {
    return sdot16(sdot16(vdupq_n_s32(0), w0, vld1q_s8(aq)), w1, vld1q_s8(aq + 16));
}

void ARM_FN(q8_0)(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const block_q8_0 *w = vw;
    const block_q8_0 *a = va;
    int64_t nb = n / QK8_0, i = 0;
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = vdupq_n_f32(0);
    for (; i + 2 <= nb; i += 2) {
        int32x4_t p0 = blk32(vld1q_s8(w[i].qs), vld1q_s8(w[i].qs + 16), a[i].qs);
        int32x4_t p1 = blk32(vld1q_s8(w[i + 1].qs), vld1q_s8(w[i + 1].qs + 16), a[i + 1].qs);
        acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(p0), h2f(w[i].d) * h2f(a[i].d));
        acc1 = vfmaq_n_f32(acc1, vcvtq_f32_s32(p1), h2f(w[i + 1].d) * h2f(a[i + 1].d));
    }
    for (; i < nb; i++) {
        int32x4_t p = blk32(vld1q_s8(w[i].qs), vld1q_s8(w[i].qs + 16), a[i].qs);
        acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(p), h2f(w[i].d) * h2f(a[i].d));
    }
    *s = vaddvq_f32(vaddq_f32(acc0, acc1));
}

static inline int32x4_t q4_0_blk(const block_q4_0 *w, const int8_t *aq) {
    uint8x16_t lo, hi;
    nib32(w->qs, &lo, &hi);
    const int8x16_t eight = vdupq_n_s8(8);
    return blk32(vsubq_s8(vreinterpretq_s8_u8(lo), eight), vsubq_s8(vreinterpretq_s8_u8(hi), eight), aq);
}

void ARM_FN(q4_0)(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const block_q4_0 *w = vw;
    const block_q8_0 *a = va;
    int64_t nb = n / QK4_0, i = 0;
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = vdupq_n_f32(0);
    for (; i + 2 <= nb; i += 2) {
        int32x4_t p0 = q4_0_blk(&w[i], a[i].qs), p1 = q4_0_blk(&w[i + 1], a[i + 1].qs);
        acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(p0), h2f(w[i].d) * h2f(a[i].d));
        acc1 = vfmaq_n_f32(acc1, vcvtq_f32_s32(p1), h2f(w[i + 1].d) * h2f(a[i + 1].d));
    }
    for (; i < nb; i++) acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(q4_0_blk(&w[i], a[i].qs)), h2f(w[i].d) * h2f(a[i].d));
    *s = vaddvq_f32(vaddq_f32(acc0, acc1));
}

/* 16-level table lookup of a 32-block's nibbles (IQ4_NL, IQ4_XS, MXFP4). */
static inline int32x4_t lut_blk(const uint8_t *qs, int8x16_t table, const int8_t *aq) {
    uint8x16_t lo, hi;
    nib32(qs, &lo, &hi);
    return blk32(vqtbl1q_s8(table, lo), vqtbl1q_s8(table, hi), aq);
}

void ARM_FN(iq4_nl)(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const block_iq4_nl *w = vw;
    const block_q8_0 *a = va;
    const int8x16_t table = vld1q_s8(cpu_kvalues_iq4nl);
    float32x4_t acc = vdupq_n_f32(0);
    for (int64_t i = 0; i < n / QK4_NL; i++)
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(lut_blk(w[i].qs, table, a[i].qs)), h2f(w[i].d) * h2f(a[i].d));
    *s = vaddvq_f32(acc);
}

void ARM_FN(mxfp4)(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const block_mxfp4 *w = vw;
    const block_q8_0 *a = va;
    const int8x16_t table = vld1q_s8(cpu_kvalues_mxfp4);
    float32x4_t acc = vdupq_n_f32(0);
    for (int64_t i = 0; i < n / QK_MXFP4; i++)
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(lut_blk(w[i].qs, table, a[i].qs)), cpu_e8m0_half(w[i].e) * h2f(a[i].d));
    *s = vaddvq_f32(acc);
}

/* Q5_0/Q5_1's fifth bits as 0x10 bytes: elements 0..15 from qh bits 0..15, 16..31 from bits 16..31. */
static inline void q5_hi(const uint8_t *qh, uint8x16_t *h0, uint8x16_t *h1) {
    static const uint8_t bits[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t m = vld1q_u8(bits), b16 = vdupq_n_u8(0x10);
    *h0 = vandq_u8(vtstq_u8(vcombine_u8(vdup_n_u8(qh[0]), vdup_n_u8(qh[1])), m), b16);
    *h1 = vandq_u8(vtstq_u8(vcombine_u8(vdup_n_u8(qh[2]), vdup_n_u8(qh[3])), m), b16);
}

void ARM_FN(q5_0)(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const block_q5_0 *w = vw;
    const block_q8_0 *a = va;
    const int8x16_t b16 = vdupq_n_s8(16);
    float32x4_t acc = vdupq_n_f32(0);
    for (int64_t i = 0; i < n / QK5_0; i++) {
        uint8x16_t lo, hi, h0, h1;
        nib32(w[i].qs, &lo, &hi);
        q5_hi(w[i].qh, &h0, &h1);
        int8x16_t w0 = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(lo, h0)), b16);
        int8x16_t w1 = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(hi, h1)), b16);
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(blk32(w0, w1, a[i].qs)), h2f(w[i].d) * h2f(a[i].d));
    }
    *s = vaddvq_f32(acc);
}

void ARM_FN(q4_1)(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const block_q4_1 *w = vw;
    const block_q8_1 *a = va;
    float32x4_t acc = vdupq_n_f32(0);
    float summ = 0;
    for (int64_t i = 0; i < n / QK4_1; i++) {
        uint8x16_t lo, hi;
        nib32(w[i].qs, &lo, &hi);
        int32x4_t p = blk32(vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi), a[i].qs);
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(p), h2f(w[i].d) * h2f(a[i].d));
        summ += h2f(w[i].m) * h2f(a[i].s);
    }
    *s = vaddvq_f32(acc) + summ;
}

void ARM_FN(q5_1)(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const block_q5_1 *w = vw;
    const block_q8_1 *a = va;
    float32x4_t acc = vdupq_n_f32(0);
    float summ = 0;
    for (int64_t i = 0; i < n / QK5_1; i++) {
        uint8x16_t lo, hi, h0, h1;
        nib32(w[i].qs, &lo, &hi);
        q5_hi(w[i].qh, &h0, &h1);
        int32x4_t p = blk32(vreinterpretq_s8_u8(vorrq_u8(lo, h0)), vreinterpretq_s8_u8(vorrq_u8(hi, h1)), a[i].qs);
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(p), h2f(w[i].d) * h2f(a[i].d));
        summ += h2f(w[i].m) * h2f(a[i].s);
    }
    *s = vaddvq_f32(acc) + summ;
}

/* ---- K-quants against Q8_K ---- */

/* Q4_K/Q5_K's 12 scale bytes -> sc[0..8) and m[0..8) (6 bits each). */
static inline void k4_unpack(const uint8_t *p, uint8_t sc[8], uint8_t m[8]) {
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

/* sum_j m[j] * (bsums[2j] + bsums[2j+1]) for the 8 sub-blocks of 32 (|pair| <= 2*16*127: no overflow). */
static inline int k4_mins(const uint8_t m[8], const int16_t *bsums) {
    int16x8_t pairs = vpaddq_s16(vld1q_s16(bsums), vld1q_s16(bsums + 8));
    int16x8_t mm = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(m)));
    return vaddvq_s32(vmlal_high_s16(vmull_s16(vget_low_s16(pairs), vget_low_s16(mm)), pairs, mm));
}

void ARM_FN(q4_K)(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const block_q4_K *w = vw;
    const block_q8_K *a = va;
    const uint8x16_t lo4 = vdupq_n_u8(0x0f);
    float acc = 0, accm = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t sc[8], m[8];
        k4_unpack(w[i].scales, sc, m);
        const float da = a[i].d;
        accm += h2f(w[i].dmin) * da * (float)k4_mins(m, a[i].bsums);
        const uint8_t *q = w[i].qs;
        const int8_t *aq = a[i].qs;
        int32x4_t sumi = vdupq_n_s32(0);
        for (int j = 0; j < 4; j++, q += 32, aq += 64) {
            uint8x16_t q0 = vld1q_u8(q), q1 = vld1q_u8(q + 16);
            int32x4_t pl = sdot16(sdot16(vdupq_n_s32(0), vreinterpretq_s8_u8(vandq_u8(q0, lo4)), vld1q_s8(aq)),
                                  vreinterpretq_s8_u8(vandq_u8(q1, lo4)), vld1q_s8(aq + 16));
            int32x4_t ph = sdot16(sdot16(vdupq_n_s32(0), vreinterpretq_s8_u8(vshrq_n_u8(q0, 4)), vld1q_s8(aq + 32)),
                                  vreinterpretq_s8_u8(vshrq_n_u8(q1, 4)), vld1q_s8(aq + 48));
            sumi = vmlaq_n_s32(sumi, pl, sc[2 * j]);
            sumi = vmlaq_n_s32(sumi, ph, sc[2 * j + 1]);
        }
        acc += h2f(w[i].d) * da * (float)vaddvq_s32(sumi);
    }
    *s = acc - accm;
}

void ARM_FN(q5_K)(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const block_q5_K *w = vw;
    const block_q8_K *a = va;
    const uint8x16_t lo4 = vdupq_n_u8(0x0f), b16 = vdupq_n_u8(0x10);
    float acc = 0, accm = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t sc[8], m[8];
        k4_unpack(w[i].scales, sc, m);
        const float da = a[i].d;
        accm += h2f(w[i].dmin) * da * (float)k4_mins(m, a[i].bsums);
        const uint8_t *q = w[i].qs;
        const int8_t *aq = a[i].qs;
        const uint8x16_t h0 = vld1q_u8(w[i].qh), h1 = vld1q_u8(w[i].qh + 16);
        int32x4_t sumi = vdupq_n_s32(0);
        for (int j = 0; j < 4; j++, q += 32, aq += 64) {
            uint8x16_t q0 = vld1q_u8(q), q1 = vld1q_u8(q + 16);
            /* fifth bits of sub-blocks 2j (low nibbles) and 2j+1 (high) */
            const uint8x16_t ml = vdupq_n_u8((uint8_t)(1u << (2 * j))), mh = vdupq_n_u8((uint8_t)(2u << (2 * j)));
            uint8x16_t l0 = vorrq_u8(vandq_u8(q0, lo4), vandq_u8(vtstq_u8(h0, ml), b16));
            uint8x16_t l1 = vorrq_u8(vandq_u8(q1, lo4), vandq_u8(vtstq_u8(h1, ml), b16));
            uint8x16_t g0 = vorrq_u8(vshrq_n_u8(q0, 4), vandq_u8(vtstq_u8(h0, mh), b16));
            uint8x16_t g1 = vorrq_u8(vshrq_n_u8(q1, 4), vandq_u8(vtstq_u8(h1, mh), b16));
            int32x4_t pl = sdot16(sdot16(vdupq_n_s32(0), vreinterpretq_s8_u8(l0), vld1q_s8(aq)), vreinterpretq_s8_u8(l1),
                                  vld1q_s8(aq + 16));
            int32x4_t ph = sdot16(sdot16(vdupq_n_s32(0), vreinterpretq_s8_u8(g0), vld1q_s8(aq + 32)),
                                  vreinterpretq_s8_u8(g1), vld1q_s8(aq + 48));
            sumi = vmlaq_n_s32(sumi, pl, sc[2 * j]);
            sumi = vmlaq_n_s32(sumi, ph, sc[2 * j + 1]);
        }
        acc += h2f(w[i].d) * da * (float)vaddvq_s32(sumi);
    }
    *s = acc - accm;
}

/* Q6_K: codes (4 bits of ql, 2 of qh) minus 32 as signed bytes. */
void ARM_FN(q6_K)(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const block_q6_K *w = vw;
    const block_q8_K *a = va;
    const uint8x16_t lo4 = vdupq_n_u8(0x0f), lo2 = vdupq_n_u8(0x03);
    const int8x16_t m32 = vdupq_n_s8(32);
    float acc = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *ql = w[i].ql, *qh = w[i].qh;
        const int8_t *sc = w[i].scales, *aq = a[i].qs;
        int32x4_t sumi = vdupq_n_s32(0);
        for (int half = 0; half < 2; half++, ql += 64, qh += 32, sc += 8, aq += 128) {
            for (int h = 0; h < 2; h++) { /* elements 16h .. 16h+15 of each quarter */
                uint8x16_t l0 = vld1q_u8(ql + 16 * h), l1 = vld1q_u8(ql + 32 + 16 * h), hb = vld1q_u8(qh + 16 * h);
                uint8x16_t c1 = vorrq_u8(vandq_u8(l0, lo4), vshlq_n_u8(vandq_u8(hb, lo2), 4));
                uint8x16_t c2 = vorrq_u8(vandq_u8(l1, lo4), vshlq_n_u8(vandq_u8(vshrq_n_u8(hb, 2), lo2), 4));
                uint8x16_t c3 = vorrq_u8(vshrq_n_u8(l0, 4), vshlq_n_u8(vandq_u8(vshrq_n_u8(hb, 4), lo2), 4));
                uint8x16_t c4 = vorrq_u8(vshrq_n_u8(l1, 4), vshlq_n_u8(vshrq_n_u8(hb, 6), 4));
                int32x4_t p1 = sdot16(vdupq_n_s32(0), vsubq_s8(vreinterpretq_s8_u8(c1), m32), vld1q_s8(aq + 16 * h));
                int32x4_t p2 = sdot16(vdupq_n_s32(0), vsubq_s8(vreinterpretq_s8_u8(c2), m32), vld1q_s8(aq + 32 + 16 * h));
                int32x4_t p3 = sdot16(vdupq_n_s32(0), vsubq_s8(vreinterpretq_s8_u8(c3), m32), vld1q_s8(aq + 64 + 16 * h));
                int32x4_t p4 = sdot16(vdupq_n_s32(0), vsubq_s8(vreinterpretq_s8_u8(c4), m32), vld1q_s8(aq + 96 + 16 * h));
                sumi = vmlaq_n_s32(sumi, p1, sc[h + 0]);
                sumi = vmlaq_n_s32(sumi, p2, sc[h + 2]);
                sumi = vmlaq_n_s32(sumi, p3, sc[h + 4]);
                sumi = vmlaq_n_s32(sumi, p4, sc[h + 6]);
            }
        }
        acc += h2f(w[i].d) * a[i].d * (float)vaddvq_s32(sumi);
    }
    *s = acc;
}

/* Q2_K: 2-bit codes with 4-bit scales and mins per 16 elements. */
void ARM_FN(q2_K)(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const block_q2_K *w = vw;
    const block_q8_K *a = va;
    const uint8x16_t lo2 = vdupq_n_u8(0x03);
    float acc = 0, accm = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float da = a[i].d;
        uint8x16_t scv = vld1q_u8(w[i].scales);
        int16x8_t m0 = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(vshrq_n_u8(scv, 4))));
        int16x8_t m1 = vreinterpretq_s16_u16(vmovl_high_u8(vshrq_n_u8(scv, 4)));
        int16x8_t b0 = vld1q_s16(a[i].bsums), b1 = vld1q_s16(a[i].bsums + 8);
        int32x4_t mm = vmull_s16(vget_low_s16(m0), vget_low_s16(b0));
        mm = vmlal_high_s16(mm, m0, b0);
        mm = vmlal_s16(mm, vget_low_s16(m1), vget_low_s16(b1));
        mm = vmlal_high_s16(mm, m1, b1);
        accm += h2f(w[i].dmin) * da * (float)vaddvq_s32(mm);
        const uint8_t *q = w[i].qs, *sc = w[i].scales;
        const int8_t *aq = a[i].qs;
        int32x4_t sumi = vdupq_n_s32(0);
        for (int half = 0; half < 2; half++, q += 32) {
            uint8x16_t q0 = vld1q_u8(q), q1 = vld1q_u8(q + 16);
            for (int shift = 0; shift < 8; shift += 2, sc += 2, aq += 32) {
                const int8x16_t sh = vdupq_n_s8((int8_t)-shift);
                int8x16_t v0 = vreinterpretq_s8_u8(vandq_u8(vshlq_u8(q0, sh), lo2));
                int8x16_t v1 = vreinterpretq_s8_u8(vandq_u8(vshlq_u8(q1, sh), lo2));
                sumi = vmlaq_n_s32(sumi, sdot16(vdupq_n_s32(0), v0, vld1q_s8(aq)), sc[0] & 0xf);
                sumi = vmlaq_n_s32(sumi, sdot16(vdupq_n_s32(0), v1, vld1q_s8(aq + 16)), sc[1] & 0xf);
            }
        }
        acc += h2f(w[i].d) * da * (float)vaddvq_s32(sumi);
    }
    *s = acc - accm;
}

/* Q3_K's 12 scale bytes -> 16 signed scales (6 bits, minus 32). */
static inline void q3_unpack(const uint8_t *p, int8_t out[16]) {
    uint32_t u0, u1, u2, t[4];
    memcpy(&u0, p, 4);
    memcpy(&u1, p + 4, 4);
    memcpy(&u2, p + 8, 4);
    t[0] = (u0 & 0x0f0f0f0f) | ((u2 & 0x03030303) << 4);
    t[1] = (u1 & 0x0f0f0f0f) | (((u2 >> 2) & 0x03030303) << 4);
    t[2] = ((u0 >> 4) & 0x0f0f0f0f) | (((u2 >> 4) & 0x03030303) << 4);
    t[3] = ((u1 >> 4) & 0x0f0f0f0f) | (((u2 >> 6) & 0x03030303) << 4);
    vst1q_s8(out, vsubq_s8(vreinterpretq_s8_u32(vld1q_u32(t)), vdupq_n_s8(32)));
}

/* Q3_K: value = (2 low bits) - (hmask bit ? 0 : 4), in [-4, 3]. */
void ARM_FN(q3_K)(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const block_q3_K *w = vw;
    const block_q8_K *a = va;
    const uint8x16_t lo2 = vdupq_n_u8(0x03), four = vdupq_n_u8(4);
    float acc = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int8_t sc[16];
        q3_unpack(w[i].scales, sc);
        const uint8_t *q = w[i].qs;
        const int8_t *aq = a[i].qs;
        const uint8x16_t hm0 = vld1q_u8(w[i].hmask), hm1 = vld1q_u8(w[i].hmask + 16);
        int32x4_t sumi = vdupq_n_s32(0);
        int is = 0;
        for (int half = 0; half < 2; half++, q += 32) {
            uint8x16_t q0 = vld1q_u8(q), q1 = vld1q_u8(q + 16);
            for (int j = 0; j < 4; j++, is += 2, aq += 32) {
                const uint8x16_t bit = vdupq_n_u8((uint8_t)(1u << (4 * half + j)));
                const int8x16_t sh = vdupq_n_s8((int8_t)(-2 * j));
                /* 4 where the high bit is clear */
                uint8x16_t o0 = vbicq_u8(four, vtstq_u8(hm0, bit)), o1 = vbicq_u8(four, vtstq_u8(hm1, bit));
                int8x16_t v0 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(vshlq_u8(q0, sh), lo2)), vreinterpretq_s8_u8(o0));
                int8x16_t v1 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(vshlq_u8(q1, sh), lo2)), vreinterpretq_s8_u8(o1));
                sumi = vmlaq_n_s32(sumi, sdot16(vdupq_n_s32(0), v0, vld1q_s8(aq)), sc[is]);
                sumi = vmlaq_n_s32(sumi, sdot16(vdupq_n_s32(0), v1, vld1q_s8(aq + 16)), sc[is + 1]);
            }
        }
        acc += h2f(w[i].d) * a[i].d * (float)vaddvq_s32(sumi);
    }
    *s = acc;
}

void ARM_FN(iq4_xs)(int64_t n, float *restrict s, const void *restrict vw, const void *restrict va) {
    const block_iq4_xs *w = vw;
    const block_q8_K *a = va;
    const int8x16_t table = vld1q_s8(cpu_kvalues_iq4nl);
    float acc = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int32x4_t sumi = vdupq_n_s32(0);
        for (int ib = 0; ib < QK_K / 32; ib++) {
            int ls = ((w[i].scales_l[ib / 2] >> 4 * (ib % 2)) & 0xf) | (((w[i].scales_h >> 2 * ib) & 3) << 4);
            sumi = vmlaq_n_s32(sumi, lut_blk(w[i].qs + 16 * ib, table, a[i].qs + 32 * ib), ls - 32);
        }
        acc += h2f(w[i].d) * a[i].d * (float)vaddvq_s32(sumi);
    }
    *s = acc;
}

#undef ARM_FN
#undef ARM_CAT
#undef ARM_CAT2
