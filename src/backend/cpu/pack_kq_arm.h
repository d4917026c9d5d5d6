/* pack_kq_arm.h: AArch64 kernels for the packed Q4_K / Q5_K / Q6_K layouts
 * (pack_kq_int.h), one body for three builds (private to pack_kq_neon.c,
 * pack_kq_dotprod.c and pack_kq_i8mm.c, which include it once each with
 * ARM_SFX set).
 *
 * 16 bytes of a 64-byte code chunk are two rows x 8 bytes (rows 2p, 2p+1).
 * The base and dotprod builds multiply them by the activation's matching 8
 * bytes (in both 64-bit halves) with dot4 (sdot, or widening multiplies and
 * pairwise adds: the same i32 lanes), one activation row at a time; the i8mm
 * build treats them as a 2x8 matrix and multiplies it by two activation rows'
 * 8 bytes with smmla (32 products an instruction), activation rows in pairs
 * (an odd last one paired with itself). Either way each sub-block's sum per
 * (weight row, activation row) is scaled by its byte scale as an exact
 * integer; per super-block each row's integer total and its min term
 * (exact too) are then scaled in the same float steps, in super-block order:
 * acc = fma(d_w * d_a, sum, acc), acc = acc - (dmin_w * d_a) * mins (fused).
 * (Q6_K: the same with its signed scales and no min term.)
 * So all three builds write the same bits, whatever na, and agree with the
 * reference to float rounding. (They do not reproduce the x86 kernels' bits:
 * those keep two float lanes per row.) */
#ifndef ARM_SFX
#error "pack_kq_arm.h is included by pack_kq_{neon,dotprod,i8mm}.c with ARM_SFX set"
#endif

#include <arm_neon.h>
#include <string.h>

#include "pack_kq_int.h"

#define ARM_CAT2(a, b) a##_##b
#define ARM_CAT(a, b) ARM_CAT2(a, b)
#define ARM_FN(name) ARM_CAT(cpu_pack_##name, ARM_SFX)
#define AI inline __attribute__((always_inline))

#if defined(__ARM_FEATURE_MATMUL_INT8)
#define KQ_PAIRS 1 /* activation rows two at a time, smmla */
#else
#define KQ_PAIRS 0
#endif

/* super-blocks per pass over the activation rows (4 Q5_K records: 5.8 KB, in L1) */
#define KQ_ARM_CHUNK 4

#if !KQ_PAIRS
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
#endif

/* The 8 rows' byte scales of one sub-block as lanes (row 2p, row 2p, row 2p+1, row 2p+1), p = 0..3. */
static AI void scale_lanes(const uint8_t *sc8, int32x4_t out[4]) {
    uint16x8_t v = vmovl_u8(vld1_u8(sc8));
    uint16x8_t z1 = vzip1q_u16(v, v), z2 = vzip2q_u16(v, v);
    out[0] = vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(z1)));
    out[1] = vreinterpretq_s32_u32(vmovl_high_u16(z1));
    out[2] = vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(z2)));
    out[3] = vreinterpretq_s32_u32(vmovl_high_u16(z2));
}

/* The min terms sum_j mn[j][row] * (bsums[2j] + bsums[2j+1]) of rows 0..3 and 4..7 (exact). */
static AI void mins_rows(const uint8_t *h, const int16_t *bsums, int32x4_t *m03, int32x4_t *m47) {
    int16x8_t P = vpaddq_s16(vld1q_s16(bsums), vld1q_s16(bsums + 8)); /* sub-blocks 0..7 */
    int16x8_t p0 = vcombine_s16(vget_low_s16(P), vget_low_s16(P)), p1 = vcombine_s16(vget_high_s16(P), vget_high_s16(P));
    int32x4_t r[8];
    for (int q = 0; q < 2; q++) { /* rows 4q .. 4q+3 */
        /* mn[u][row][i] = h[96 + 32u + 4 row + i]: rows 4q, 4q+1 in the low 8 bytes, 4q+2, 4q+3 in the high */
        uint8x16_t u0 = vld1q_u8(h + 96 + 16 * q), u1 = vld1q_u8(h + 128 + 16 * q);
        int16x8_t a0 = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(u0))), a1 = vreinterpretq_s16_u16(vmovl_high_u8(u0));
        int16x8_t b0 = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(u1))), b1 = vreinterpretq_s16_u16(vmovl_high_u8(u1));
        r[4 * q + 0] = vmlal_s16(vmull_s16(vget_low_s16(a0), vget_low_s16(p0)), vget_low_s16(b0), vget_low_s16(p1));
        r[4 * q + 1] = vmlal_high_s16(vmull_high_s16(a0, p0), b0, p1);
        r[4 * q + 2] = vmlal_s16(vmull_s16(vget_low_s16(a1), vget_low_s16(p0)), vget_low_s16(b1), vget_low_s16(p1));
        r[4 * q + 3] = vmlal_high_s16(vmull_high_s16(a1, p0), b1, p1);
    }
    *m03 = vpaddq_s32(vpaddq_s32(r[0], r[1]), vpaddq_s32(r[2], r[3]));
    *m47 = vpaddq_s32(vpaddq_s32(r[4], r[5]), vpaddq_s32(r[6], r[7]));
}

/* 16 mask bits (one per byte of rows 2p, 2p+1 of a chunk) as bytes of 0x10 or 0 */
static AI uint8x16_t fifth_bits(const uint8_t *mask2) {
    static const uint8_t bits[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    uint8x16_t v = vcombine_u8(vdup_n_u8(mask2[0]), vdup_n_u8(mask2[1]));
    return vandq_u8(vtstq_u8(v, vld1q_u8(bits)), vdupq_n_u8(0x10));
}

/* One super-block's exact integer sums of the 8 rows (rows 0..3, 4..7) against
 * activation row y0 (and y1 in the i8mm build). */
static AI void k45_sb(const uint8_t *h, const int HI, const int8_t *y0, const int8_t *y1, int32x4_t s0[2],
                      int32x4_t s1[2]) {
    const uint8_t *cb = h + KQ4_HDR;
    const uint8x16_t lo4 = vdupq_n_u8(0x0f);
    int32x4_t C0[4];
    for (int p = 0; p < 4; p++) C0[p] = vdupq_n_s32(0);
    (void)y1;
    for (int jj = 0; jj < 4; jj++) {
        int32x4_t Rl0[4], Rh0[4], scl[4], sch[4];
        for (int p = 0; p < 4; p++) Rl0[p] = Rh0[p] = vdupq_n_s32(0);
        for (int z = 0; z < 4; z++) {
            const int c = 4 * jj + z;
            const int8_t *a0 = y0 + 64 * jj + 8 * z;
#if KQ_PAIRS
            const int8_t *a1 = y1 + 64 * jj + 8 * z;
            const int8x16_t bl = vcombine_s8(vld1_s8(a0), vld1_s8(a1)), bh = vcombine_s8(vld1_s8(a0 + 32), vld1_s8(a1 + 32));
#else
            const int8x8_t l8 = vld1_s8(a0), h8 = vld1_s8(a0 + 32);
            const int8x16_t bl = vcombine_s8(l8, l8), bh = vcombine_s8(h8, h8);
#endif
            for (int p = 0; p < 4; p++) {
                uint8x16_t A = vld1q_u8(cb + 64 * c + 16 * p);
                uint8x16_t l = vandq_u8(A, lo4), g = vshrq_n_u8(A, 4);
                if (HI) {
                    l = vorrq_u8(l, fifth_bits(cb + 1024 + 16 * c + 2 * p));
                    g = vorrq_u8(g, fifth_bits(cb + 1024 + 16 * c + 8 + 2 * p));
                }
#if KQ_PAIRS
                Rl0[p] = vmmlaq_s32(Rl0[p], vreinterpretq_s8_u8(l), bl);
                Rh0[p] = vmmlaq_s32(Rh0[p], vreinterpretq_s8_u8(g), bh);
#else
                Rl0[p] = dot4(Rl0[p], vreinterpretq_s8_u8(l), bl);
                Rh0[p] = dot4(Rh0[p], vreinterpretq_s8_u8(g), bh);
#endif
            }
        }
        /* lanes: (row 2p, row 2p, row 2p+1, row 2p+1) in both forms, so one scale vector serves */
        scale_lanes(h + 32 + 8 * (2 * jj), scl);
        scale_lanes(h + 32 + 8 * (2 * jj + 1), sch);
        for (int p = 0; p < 4; p++) C0[p] = vmlaq_s32(vmlaq_s32(C0[p], Rl0[p], scl[p]), Rh0[p], sch[p]);
    }
#if KQ_PAIRS
    /* C0[p] = (row 2p . y0, row 2p . y1, row 2p+1 . y0, row 2p+1 . y1) */
    s0[0] = vuzp1q_s32(C0[0], C0[1]);
    s0[1] = vuzp1q_s32(C0[2], C0[3]);
    s1[0] = vuzp2q_s32(C0[0], C0[1]);
    s1[1] = vuzp2q_s32(C0[2], C0[3]);
#else
    /* C0[p] = (row 2p bytes 0-3, 4-7, row 2p+1 bytes 0-3, 4-7) */
    s0[0] = vpaddq_s32(C0[0], C0[1]);
    s0[1] = vpaddq_s32(C0[2], C0[3]);
    s1[0] = s1[1] = vdupq_n_s32(0);
#endif
}

/* acc (rows 0..3, 4..7) += one super-block of activation row y: the float steps every build shares */
static AI void k45_acc(const uint8_t *h, const block_q8_K *y, const int32x4_t s[2], float32x4_t acc[2]) {
    int32x4_t m[2];
    mins_rows(h, y->bsums, &m[0], &m[1]);
    for (int q = 0; q < 2; q++) {
        float32x4_t d = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)(const void *)(h + 8 * q))));
        float32x4_t dm = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)(const void *)(h + 16 + 8 * q))));
        acc[q] = vfmaq_f32(acc[q], vmulq_n_f32(d, y->d), vcvtq_f32_s32(s[q]));
        acc[q] = vfmsq_f32(acc[q], vmulq_n_f32(dm, y->d), vcvtq_f32_s32(m[q]));
    }
}

static void k45_kernel(int64_t k, const uint8_t *restrict g, int na, const void *const *restrict a, float *restrict s,
                       const int HI) {
    const int64_t nsb = k / QK_K;
    const size_t sb = HI ? KQ5_SB : KQ4_SB;
    float32x4_t acc[CPU_PACK_MAX_NA][2];
    for (int r = 0; r < na; r++) acc[r][0] = acc[r][1] = vdupq_n_f32(0);
    /* a few super-blocks at a time, every activation row over them while they are in L1 */
    for (int64_t i0 = 0; i0 < nsb; i0 += KQ_ARM_CHUNK)
        for (int r = 0; r < na; r += 1 + KQ_PAIRS) {
            const int r1 = KQ_PAIRS && r + 1 < na ? r + 1 : r;
            for (int64_t i = i0; i < nsb && i < i0 + KQ_ARM_CHUNK; i++) {
                const uint8_t *h = g + sb * i;
                const block_q8_K *y0 = (const block_q8_K *)a[r] + i, *y1 = (const block_q8_K *)a[r1] + i;
                int32x4_t s0[2], s1[2];
                k45_sb(h, HI, y0->qs, y1->qs, s0, s1);
                k45_acc(h, y0, s0, acc[r]);
                if (KQ_PAIRS && r1 != r) k45_acc(h, y1, s1, acc[r1]);
            }
        }
    for (int r = 0; r < na; r++) {
        vst1q_f32(s + (size_t)KQ_R * r, acc[r][0]);
        vst1q_f32(s + (size_t)KQ_R * r + 4, acc[r][1]);
    }
}

/* ---- Q6_K: codes 0..63 (value - 32; the -32 comes back through the prepped nb = -32 * bsums) ----
 * 16 bytes of a quad are rows (2p', 2p'+1) x (e0: 4 codes of sub-block 2p, e1: 4 of sub-block 2p+1).
 * dot4 keeps the (row, e) lanes as they are, against the activation's matching 8 bytes; smmla needs
 * 8 codes of one sub-block per matrix row, so two quads are transposed into (row, e) pairs first
 * (trn1 / trn2) and two activation rows' same 8 codes gathered beside them (uzp1 / uzp2). */

/* the four quads of rows (2rp, 2rp+1) of pair p's vectors A, B, C, as codes 0..63 */
static AI void q6_quads(const uint8_t *c, int rp, int8x16_t q[4]) {
    const uint8x16_t m3f = vdupq_n_u8(0x3f), m0f = vdupq_n_u8(0x0f), m30 = vdupq_n_u8(0x30);
    uint8x16_t A = vld1q_u8(c + 16 * rp), B = vld1q_u8(c + 64 + 16 * rp), C = vld1q_u8(c + 128 + 16 * rp);
    q[0] = vreinterpretq_s8_u8(vandq_u8(A, m3f));
    q[1] = vreinterpretq_s8_u8(vandq_u8(B, m3f));
    q[2] = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(C, m0f), vandq_u8(vshrq_n_u8(A, 2), m30)));
    q[3] = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(C, 4), vandq_u8(vshrq_n_u8(B, 2), m30)));
}

/* the 4 signed scale bytes (row 2rp e0, e1, row 2rp+1 e0, e1) of pair p as i32 lanes */
static AI int32x4_t q6_scales(const uint8_t *h, int p, int rp) {
    int8x8_t v = vreinterpret_s8_u32(vld1_dup_u32((const uint32_t *)(const void *)(h + 16 + 16 * p + 4 * rp)));
    return vmovl_s16(vget_low_s16(vmovl_s8(v)));
}

/* One super-block's exact integer sums of the 8 rows (rows 0..3, 4..7) against prepped row y0 (and y1). */
static AI void q6_sb(const uint8_t *h, const kq6_prep_block *y0, const kq6_prep_block *y1, int32x4_t s0[2],
                     int32x4_t s1[2]) {
    const uint8_t *cb = h + KQ6_HDR;
    int32x4_t S[4];
    for (int rp = 0; rp < 4; rp++) S[rp] = vdupq_n_s32(0);
    (void)y1;
    for (int p = 0; p < 8; p++) {
        const uint8_t *c = cb + 192 * p;
#if KQ_PAIRS
        /* activation codes of both rows, per quad pair u (quads 2u, 2u+1) and e */
        int8x16_t be[2][2];
        for (int u = 0; u < 2; u++) {
            uint32x4_t Y0 = vreinterpretq_u32_s8(vld1q_s8(y0->qs + 32 * p + 16 * u));
            uint32x4_t Y1 = vreinterpretq_u32_s8(vld1q_s8(y1->qs + 32 * p + 16 * u));
            be[u][0] = vreinterpretq_s8_u32(vuzp1q_u32(Y0, Y1));
            be[u][1] = vreinterpretq_s8_u32(vuzp2q_u32(Y0, Y1));
        }
        int32x2_t N = vld1_s32(y0->nb + 2 * p), M = vld1_s32(y1->nb + 2 * p);
        const int32x4_t nb0 = vcombine_s32(vzip1_s32(N, M), vzip1_s32(N, M));
        const int32x4_t nb1 = vcombine_s32(vzip2_s32(N, M), vzip2_s32(N, M));
        for (int rp = 0; rp < 4; rp++) {
            int8x16_t q[4];
            q6_quads(c, rp, q);
            int32x4_t ce0 = vdupq_n_s32(0), ce1 = vdupq_n_s32(0);
            for (int u = 0; u < 2; u++) {
                uint32x4_t qa = vreinterpretq_u32_s8(q[2 * u]), qb = vreinterpretq_u32_s8(q[2 * u + 1]);
                ce0 = vmmlaq_s32(ce0, vreinterpretq_s8_u32(vtrn1q_u32(qa, qb)), be[u][0]);
                ce1 = vmmlaq_s32(ce1, vreinterpretq_s8_u32(vtrn2q_u32(qa, qb)), be[u][1]);
            }
            const int32x4_t sc = q6_scales(h, p, rp); /* (row 2rp e0, e1, row 2rp+1 e0, e1) */
            S[rp] = vmlaq_s32(S[rp], vaddq_s32(ce0, nb0), vtrn1q_s32(sc, sc));
            S[rp] = vmlaq_s32(S[rp], vaddq_s32(ce1, nb1), vtrn2q_s32(sc, sc));
        }
#else
        int8x16_t ay[4];
        for (int qd = 0; qd < 4; qd++) {
            int8x8_t a8 = vld1_s8(y0->qs + 32 * p + 8 * qd); /* (e0: 4 codes, e1: 4 codes) */
            ay[qd] = vcombine_s8(a8, a8);
        }
        int32x2_t N = vld1_s32(y0->nb + 2 * p);
        const int32x4_t nbv = vcombine_s32(N, N);
        for (int rp = 0; rp < 4; rp++) {
            int8x16_t q[4];
            q6_quads(c, rp, q);
            int32x4_t raw = nbv;
            for (int qd = 0; qd < 4; qd++) raw = dot4(raw, q[qd], ay[qd]);
            S[rp] = vmlaq_s32(S[rp], raw, q6_scales(h, p, rp));
        }
#endif
    }
#if KQ_PAIRS
    /* S[rp] = (row 2rp . y0, row 2rp . y1, row 2rp+1 . y0, row 2rp+1 . y1) */
    s0[0] = vuzp1q_s32(S[0], S[1]);
    s0[1] = vuzp1q_s32(S[2], S[3]);
    s1[0] = vuzp2q_s32(S[0], S[1]);
    s1[1] = vuzp2q_s32(S[2], S[3]);
#else
    /* S[rp] = (row 2rp e0, e1, row 2rp+1 e0, e1) */
    s0[0] = vpaddq_s32(S[0], S[1]);
    s0[1] = vpaddq_s32(S[2], S[3]);
    s1[0] = s1[1] = vdupq_n_s32(0);
#endif
}

static AI void q6_acc(const uint8_t *h, const kq6_prep_block *y, const int32x4_t s[2], float32x4_t acc[2]) {
    for (int q = 0; q < 2; q++) {
        float32x4_t d = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)(const void *)(h + 8 * q))));
        acc[q] = vfmaq_f32(acc[q], vmulq_n_f32(d, y->d), vcvtq_f32_s32(s[q]));
    }
}

void ARM_FN(q6_K)(int64_t k, const void *restrict group, int na, const void *const *restrict a, float *restrict s) {
    const int64_t nsb = k / QK_K;
    const uint8_t *g = group;
    float32x4_t acc[CPU_PACK_MAX_NA][2];
    for (int r = 0; r < na; r++) acc[r][0] = acc[r][1] = vdupq_n_f32(0);
    for (int64_t i0 = 0; i0 < nsb; i0 += KQ_ARM_CHUNK)
        for (int r = 0; r < na; r += 1 + KQ_PAIRS) {
            const int r1 = KQ_PAIRS && r + 1 < na ? r + 1 : r;
            for (int64_t i = i0; i < nsb && i < i0 + KQ_ARM_CHUNK; i++) {
                const uint8_t *h = g + KQ6_SB * i;
                const kq6_prep_block *y0 = (const kq6_prep_block *)a[r] + i, *y1 = (const kq6_prep_block *)a[r1] + i;
                int32x4_t s0[2], s1[2];
                q6_sb(h, y0, y1, s0, s1);
                q6_acc(h, y0, s0, acc[r]);
                if (KQ_PAIRS && r1 != r) q6_acc(h, y1, s1, acc[r1]);
            }
        }
    for (int r = 0; r < na; r++) {
        vst1q_f32(s + (size_t)KQ_R * r, acc[r][0]);
        vst1q_f32(s + (size_t)KQ_R * r + 4, acc[r][1]);
    }
}

void ARM_FN(q4_K)(int64_t k, const void *restrict group, int na, const void *const *restrict a, float *restrict s) {
    k45_kernel(k, group, na, a, s, 0);
}
void ARM_FN(q5_K)(int64_t k, const void *restrict group, int na, const void *const *restrict a, float *restrict s) {
    k45_kernel(k, group, na, a, s, 1);
}

#undef KQ_PAIRS
#undef KQ_ARM_CHUNK
#undef AI
#undef ARM_FN
#undef ARM_CAT
#undef ARM_CAT2
