/* cuda_fattn.cu: flash attention for prefill on the tensor cores.
 *
 * The prefill rows of a step (cuda_backend.cu: fa_of) come as tiles of at
 * most FA_BQ consecutive tokens of one sequence at consecutive positions. One
 * block per (tile, query head), FA_NW warps of 16 query rows each: Q is held
 * in registers as f16 fragments, the K and V rows of FA_BK positions at a
 * time are copied from the paged f16 cache into shared memory (cp.async, two
 * stages: the next positions' rows load while these are used), S = Q K^T
 * and O += P V are mma.sync m16n8k16 (f16 in, f32 accumulated), and the
 * softmax is online per row (f32, base 2). Positions are walked in tiles of
 * FA_BK from a multiple of FA_BK, so a token's result depends only on its
 * own positions and query, not on which tile or step it came in: a tile
 * entirely outside a row's window leaves that row's sums exactly as they
 * were (weights exp2(-inf) = 0, rescale exp2(0) = 1).
 *
 * Against the f32 kernels of cuda_kern.cu it rounds q and the weights P to
 * f16 (as llama.cpp's flash attention does); the model tests hold the
 * result to the reference within their tolerances. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_fp16.h>

#include "cuda_be_int.cuh"

#define FA_NW 4               /* warps a block */
#define FA_BQ (16 * FA_NW)    /* query rows (tokens) a block */
/* positions a K/V tile (a multiple of 16): 64, or 32 for head_dim 256,
 * whose Q tile sits in shared memory instead of registers (QS) */
template <int HD> struct fa_cfg {
    static constexpr int BK = HD > 128 ? 32 : 64;
    static constexpr bool QS = HD > 128;
};

static __device__ __forceinline__ uint32_t pack_h2(float a, float b) {
    const __half2 h = __floats2half2_rn(a, b);
    return *(const uint32_t *)&h;
}

static __device__ __forceinline__ void mma16816(float *d, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

static __device__ __forceinline__ void ldsm_x4(uint32_t *r, const void *p) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

static __device__ __forceinline__ void ldsm_x4_t(uint32_t *r, const void *p) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

/* 16 bytes global -> shared; ok false: zeros, nothing read */
static __device__ __forceinline__ void cp16(void *dst, const void *src, bool ok) {
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    const int n = ok ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(n));
}
static __device__ __forceinline__ void cp_commit(void) { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
static __device__ __forceinline__ void cp_wait(void) { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

/* the K and V rows of positions [kb, kb + BK) of kv head kh into shared
 * memory (rows LD halves apart); positions outside [lo, hi] become zeros */
template <int HD, int FA_BK, int NT = FA_NW * 32>
static __device__ __forceinline__ void fa_load(__half *ks, __half *vs, const ck_kv &g, int layer, int kh,
                                               const int32_t *btr, int32_t kb, int32_t lo, int32_t hi) {
    constexpr int LD = HD + 8, CPR = HD / 8; /* 16-byte pieces a row */
    const size_t v_off = (size_t)g.block_size * g.k_row_bytes;
    for (int c = threadIdx.x; c < FA_BK * CPR; c += NT) {
        const int r = c / CPR, piece = c % CPR;
        const int32_t p = kb + r;
        const bool ok = p >= lo && p <= hi;
        const uint8_t *kr = g.base, *vr = g.base;
        if (ok) {
            const int32_t blk = btr[p / g.block_size], sl = p % g.block_size;
            const uint8_t *lb = g.base + (size_t)blk * g.block_bytes + (size_t)layer * g.layer_bytes;
            kr = lb + (size_t)sl * g.k_row_bytes + (size_t)kh * g.k_head_bytes + 16 * piece;
            vr = lb + v_off + (size_t)sl * g.v_row_bytes + (size_t)kh * g.v_head_bytes + 16 * piece;
        }
        cp16(ks + r * LD + 8 * piece, kr, ok);
        cp16(vs + r * LD + 8 * piece, vr, ok);
    }
}

/* tiles: pairs (first token, tokens) of the step; the heaviest (last) tile first */
template <int HD>
static __global__ void __launch_bounds__(FA_NW * 32, 2)
    k_fattn(const float *q, float *out, const int32_t *tiles, int n_tiles, int n_head, int n_head_kv, float scale2,
            int32_t window, ck_kv g, int layer, const int32_t *pos, const int32_t *seq, const int32_t *bt,
            int32_t bt_stride) {
    HC_PDL_ENTER();
    constexpr int FA_BK = fa_cfg<HD>::BK;
    constexpr bool QS = fa_cfg<HD>::QS;
    constexpr int LD = HD + 8, KS = HD / 16, ND = HD / 8, NS = FA_BK / 8;
    extern __shared__ uint4 fa_shm[];
    __half *kbuf = (__half *)fa_shm;        /* [2][FA_BK][LD] */
    __half *vbuf = kbuf + 2 * FA_BK * LD;    /* [2][FA_BK][LD] */
    __half *qsm = vbuf + 2 * FA_BK * LD;     /* QS: [FA_BQ][LD] */
    const int tile = n_tiles - 1 - (int)blockIdx.x, h = blockIdx.y;
    const int kh = h / (n_head / n_head_kv);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, tq = lane & 3;
    const int t0 = tiles[2 * tile], nt = tiles[2 * tile + 1];
    const int32_t p0 = pos[t0], plast = p0 + nt - 1;
    const int32_t lo = window > 0 && p0 - window + 1 > 0 ? p0 - window + 1 : 0;
    const int32_t kb0 = lo / FA_BK * FA_BK;
    const int32_t *btr = bt + (int64_t)seq[t0] * bt_stride;
    const int n_kt = (plast - kb0) / FA_BK + 1;

    fa_load<HD, FA_BK>(kbuf, vbuf, g, layer, kh, btr, kb0, lo, plast);
    cp_commit();

    /* this warp's rows: r0 = 16 warp + gq and r0 + 8 of the tile */
    const int r0 = 16 * warp + gq, r1 = r0 + 8;
    const bool v0 = r0 < nt, v1 = r1 < nt;
    const int32_t hi0 = v0 ? p0 + r0 : -1, hi1 = v1 ? p0 + r1 : -1;
    const int32_t lo0 = window > 0 ? hi0 - window + 1 : 0, lo1 = window > 0 ? hi1 - window + 1 : 0;
    const int32_t whi = p0 + 16 * warp + 15 < plast ? p0 + 16 * warp + 15 : plast; /* the warp's last position */
    uint32_t qa[QS ? 1 : KS][4];
    if (QS) { /* the tile's rows as f16, zeros past the tile (read after the loop's first barrier) */
        for (int i = threadIdx.x; i < FA_BQ * HD / 2; i += FA_NW * 32) {
            const int r = i / (HD / 2), d = 2 * (i % (HD / 2));
            float2 v = make_float2(0.f, 0.f);
            if (r < nt) v = *(const float2 *)(q + ((int64_t)(t0 + r) * n_head + h) * HD + d);
            *(uint32_t *)(qsm + r * LD + d) = pack_h2(v.x, v.y);
        }
    } else {
        const float *q0 = q + ((int64_t)(t0 + r0) * n_head + h) * HD, *q1 = q + ((int64_t)(t0 + r1) * n_head + h) * HD;
#pragma unroll
        for (int k = 0; k < KS; k++) {
            const int d = 16 * k + 2 * tq;
            float2 a = make_float2(0.f, 0.f), b = a, c = a, e = a;
            if (v0) {
                a = *(const float2 *)(q0 + d);
                c = *(const float2 *)(q0 + d + 8);
            }
            if (v1) {
                b = *(const float2 *)(q1 + d);
                e = *(const float2 *)(q1 + d + 8);
            }
            qa[k][0] = pack_h2(a.x, a.y);
            qa[k][1] = pack_h2(b.x, b.y);
            qa[k][2] = pack_h2(c.x, c.y);
            qa[k][3] = pack_h2(e.x, e.y);
        }
    }
    float o[ND][4];
#pragma unroll
    for (int n = 0; n < ND; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

    for (int j = 0; j < n_kt; j++) {
        const int32_t kb = kb0 + j * FA_BK;
        if (j + 1 < n_kt) {
            const int st = (j + 1) & 1;
            fa_load<HD, FA_BK>(kbuf + st * FA_BK * LD, vbuf + st * FA_BK * LD, g, layer, kh, btr, kb + FA_BK, lo, plast);
            cp_commit();
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
        const __half *ks = kbuf + (j & 1) * FA_BK * LD, *vs = vbuf + (j & 1) * FA_BK * LD;
        if (kb <= whi) { /* else every position is past this warp's rows */
            float s[NS][4];
#pragma unroll
            for (int n = 0; n < NS; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
            for (int k2 = 0; k2 < KS / 2; k2++) {
                uint32_t a0[4], a1[4];
                if (QS) {
                    const __half *qr = qsm + (16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1)) * LD + 8 * (lane >> 4);
                    ldsm_x4(a0, qr + 32 * k2);
                    ldsm_x4(a1, qr + 32 * k2 + 16);
                }
                const uint32_t *A0 = QS ? a0 : qa[QS ? 0 : 2 * k2], *A1 = QS ? a1 : qa[QS ? 0 : 2 * k2 + 1];
#pragma unroll
                for (int n = 0; n < NS; n++) {
                    uint32_t b[4];
                    ldsm_x4(b, ks + (8 * n + (lane & 7)) * LD + 32 * k2 + 8 * (lane >> 3));
                    mma16816(s[n], A0, b[0], b[1]);
                    mma16816(s[n], A1, b[2], b[3]);
                }
            }
            /* scale, mask, the rows' running max */
            float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
            for (int n = 0; n < NS; n++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int32_t p = kb + 8 * n + 2 * tq + e;
                    s[n][e] = p <= hi0 && p >= lo0 ? s[n][e] * scale2 : -INFINITY;
                    s[n][2 + e] = p <= hi1 && p >= lo1 ? s[n][2 + e] * scale2 : -INFINITY;
                    mx0 = fmaxf(mx0, s[n][e]);
                    mx1 = fmaxf(mx1, s[n][2 + e]);
                }
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
            const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
            /* a row with nothing yet (n = -inf) keeps its zeros: rescale 1, weights 0 */
            const float c0 = n0 == -INFINITY ? 1.f : exp2f(m0 - n0), c1 = n1 == -INFINITY ? 1.f : exp2f(m1 - n1);
            const float b0 = n0 == -INFINITY ? 0.f : n0, b1 = n1 == -INFINITY ? 0.f : n1;
            m0 = n0;
            m1 = n1;
            float ls0 = 0.f, ls1 = 0.f;
            uint32_t pa[FA_BK / 16][4];
#pragma unroll
            for (int n = 0; n < NS; n++) {
                const float e0 = exp2f(s[n][0] - b0), e1 = exp2f(s[n][1] - b0);
                const float e2 = exp2f(s[n][2] - b1), e3 = exp2f(s[n][3] - b1);
                ls0 += e0 + e1;
                ls1 += e2 + e3;
                pa[n / 2][(n & 1) * 2 + 0] = pack_h2(e0, e1);
                pa[n / 2][(n & 1) * 2 + 1] = pack_h2(e2, e3);
            }
            l0 = l0 * c0 + ls0;
            l1 = l1 * c1 + ls1;
#pragma unroll
            for (int n = 0; n < ND; n++) {
                o[n][0] *= c0;
                o[n][1] *= c0;
                o[n][2] *= c1;
                o[n][3] *= c1;
            }
            /* O += P V */
#pragma unroll
            for (int kk = 0; kk < FA_BK / 16; kk++)
#pragma unroll
                for (int i = 0; i < HD / 16; i++) {
                    uint32_t b[4];
                    ldsm_x4_t(b, vs + (16 * kk + 8 * ((lane >> 3) & 1) + (lane & 7)) * LD + 16 * i + 8 * (lane >> 4));
                    mma16816(o[2 * i], pa[kk], b[0], b[1]);
                    mma16816(o[2 * i + 1], pa[kk], b[2], b[3]);
                }
        }
        __syncthreads(); /* this stage is loaded again two tiles on */
    }
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    float *o0 = out + ((int64_t)(t0 + r0) * n_head + h) * HD, *o1 = out + ((int64_t)(t0 + r1) * n_head + h) * HD;
#pragma unroll
    for (int n = 0; n < ND; n++) {
        const int d = 8 * n + 2 * tq;
        if (v0) *(float2 *)(o0 + d) = make_float2(o[n][0] / l0, o[n][1] / l0);
        if (v1) *(float2 *)(o1 + d) = make_float2(o[n][2] / l1, o[n][3] / l1);
    }
}

/* Decode rows on the tensor cores (flash decoding): one warp per (token, kv
 * head, chunk of AS_CHUNK = 128 positions from position 0), the kv head's G
 * query heads as the rows of one 16-row mma tile (rows past G are zeros),
 * K/V tiles of FD_BK positions in two cp.async stages. Each warp writes its
 * chunk's partial in k_attn_part16's layout (acc[hd], m in natural-log
 * units, l), which k_attn_combine sums in chunk order; with one chunk it
 * writes the output itself. A token's result depends on its own positions
 * and query only (fixed chunk boundaries, an empty chunk is m = -inf). */
#define FD_CHUNK 128
#define FD_BK 32
template <int HD>
static __global__ void __launch_bounds__(32)
    k_fattn_dec(const float *q, int n_head, int n_head_kv, float scale2, int32_t window, ck_kv g, int layer,
                const int32_t *pos, const int32_t *seq, const int32_t *bt, int32_t bt_stride, const int32_t *tok,
                int t0, int n_split, float *part, float *out) {
    HC_PDL_ENTER();
    constexpr int LD = HD + 8, KS = HD / 16, ND = HD / 8, NS = FD_BK / 8, NKT = FD_CHUNK / FD_BK;
    extern __shared__ uint4 fa_shm[];
    __half *kbuf = (__half *)fa_shm;     /* [2][FD_BK][LD] */
    __half *vbuf = kbuf + 2 * FD_BK * LD; /* [2][FD_BK][LD] */
    const int tl = blockIdx.x, kh = blockIdx.y, sp = blockIdx.z;
    const int t = tok ? tok[t0 + tl] : t0 + tl, G = n_head / n_head_kv;
    const int lane = threadIdx.x, gq = lane >> 2, tq = lane & 3;
    const int32_t hi = pos[t], lo0 = window > 0 && hi - window + 1 > 0 ? hi - window + 1 : 0;
    const int32_t c0 = sp * FD_CHUNK, lo = lo0 > c0 ? lo0 : c0, hi1 = hi < c0 + FD_CHUNK - 1 ? hi : c0 + FD_CHUNK - 1;
    const int stride = HD + 2;
    float *pt = part ? part + (((size_t)tl * n_head + (size_t)kh * G) * n_split + sp) * stride : NULL;
    if (lo > hi1) { /* no position of this chunk: an empty partial */
        if (pt && lane < G) {
            pt[(size_t)lane * n_split * stride + HD] = -INFINITY;
            pt[(size_t)lane * n_split * stride + HD + 1] = 0.0f;
        }
        return;
    }
    const int32_t *btr = bt + (int64_t)seq[t] * bt_stride;
    const int32_t kb0 = lo / FD_BK * FD_BK;
    const int n_kt = (hi1 - kb0) / FD_BK + 1;
    fa_load<HD, FD_BK, 32>(kbuf, vbuf, g, layer, kh, btr, kb0, lo, hi1);
    cp_commit();
    const int r0 = gq, r1 = gq + 8;
    const bool v0 = r0 < G, v1 = r1 < G;
    uint32_t qa[KS][4];
    {
        const float *q0 = q + ((int64_t)t * n_head + kh * G + r0) * HD, *q1 = q + ((int64_t)t * n_head + kh * G + r1) * HD;
#pragma unroll
        for (int k = 0; k < KS; k++) {
            const int d = 16 * k + 2 * tq;
            float2 a = make_float2(0.f, 0.f), b = a, c = a, e = a;
            if (v0) {
                a = *(const float2 *)(q0 + d);
                c = *(const float2 *)(q0 + d + 8);
            }
            if (v1) {
                b = *(const float2 *)(q1 + d);
                e = *(const float2 *)(q1 + d + 8);
            }
            qa[k][0] = pack_h2(a.x, a.y);
            qa[k][1] = pack_h2(b.x, b.y);
            qa[k][2] = pack_h2(c.x, c.y);
            qa[k][3] = pack_h2(e.x, e.y);
        }
    }
    float o[ND][4];
#pragma unroll
    for (int n = 0; n < ND; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    for (int j = 0; j < n_kt && j < NKT; j++) {
        const int32_t kb = kb0 + j * FD_BK;
        if (j + 1 < n_kt) {
            const int st = (j + 1) & 1;
            fa_load<HD, FD_BK, 32>(kbuf + st * FD_BK * LD, vbuf + st * FD_BK * LD, g, layer, kh, btr, kb + FD_BK, lo, hi1);
            cp_commit();
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncwarp();
        const __half *ks = kbuf + (j & 1) * FD_BK * LD, *vs = vbuf + (j & 1) * FD_BK * LD;
        float s[NS][4];
#pragma unroll
        for (int n = 0; n < NS; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
        for (int k2 = 0; k2 < KS / 2; k2++)
#pragma unroll
            for (int n = 0; n < NS; n++) {
                uint32_t b[4];
                ldsm_x4(b, ks + (8 * n + (lane & 7)) * LD + 32 * k2 + 8 * (lane >> 3));
                mma16816(s[n], qa[2 * k2], b[0], b[1]);
                mma16816(s[n], qa[2 * k2 + 1], b[2], b[3]);
            }
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int n = 0; n < NS; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int32_t p = kb + 8 * n + 2 * tq + e;
                const bool in = p >= lo && p <= hi1;
                s[n][e] = in ? s[n][e] * scale2 : -INFINITY;
                s[n][2 + e] = in ? s[n][2 + e] * scale2 : -INFINITY;
                mx0 = fmaxf(mx0, s[n][e]);
                mx1 = fmaxf(mx1, s[n][2 + e]);
            }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
        const float c0s = n0 == -INFINITY ? 1.f : exp2f(m0 - n0), c1s = n1 == -INFINITY ? 1.f : exp2f(m1 - n1);
        const float b0 = n0 == -INFINITY ? 0.f : n0, b1 = n1 == -INFINITY ? 0.f : n1;
        m0 = n0;
        m1 = n1;
        float ls0 = 0.f, ls1 = 0.f;
        uint32_t pa[FD_BK / 16][4];
#pragma unroll
        for (int n = 0; n < NS; n++) {
            const float e0 = exp2f(s[n][0] - b0), e1 = exp2f(s[n][1] - b0);
            const float e2 = exp2f(s[n][2] - b1), e3 = exp2f(s[n][3] - b1);
            ls0 += e0 + e1;
            ls1 += e2 + e3;
            pa[n / 2][(n & 1) * 2 + 0] = pack_h2(e0, e1);
            pa[n / 2][(n & 1) * 2 + 1] = pack_h2(e2, e3);
        }
        l0 = l0 * c0s + ls0;
        l1 = l1 * c1s + ls1;
#pragma unroll
        for (int n = 0; n < ND; n++) {
            o[n][0] *= c0s;
            o[n][1] *= c0s;
            o[n][2] *= c1s;
            o[n][3] *= c1s;
        }
#pragma unroll
        for (int kk = 0; kk < FD_BK / 16; kk++)
#pragma unroll
            for (int i = 0; i < HD / 16; i++) {
                uint32_t b[4];
                ldsm_x4_t(b, vs + (16 * kk + 8 * ((lane >> 3) & 1) + (lane & 7)) * LD + 16 * i + 8 * (lane >> 4));
                mma16816(o[2 * i], pa[kk], b[0], b[1]);
                mma16816(o[2 * i + 1], pa[kk], b[2], b[3]);
            }
        __syncwarp(); /* this stage is loaded again two tiles on */
    }
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    if (!pt) { /* the only chunk: the output */
        float *o0 = out + ((int64_t)t * n_head + kh * G + r0) * HD, *o1 = out + ((int64_t)t * n_head + kh * G + r1) * HD;
#pragma unroll
        for (int n = 0; n < ND; n++) {
            const int d = 8 * n + 2 * tq;
            if (v0) *(float2 *)(o0 + d) = make_float2(o[n][0] / l0, o[n][1] / l0);
            if (v1) *(float2 *)(o1 + d) = make_float2(o[n][2] / l1, o[n][3] / l1);
        }
        return;
    }
    const float LN2 = 0.6931471805599453f;
    float *p0 = pt + (size_t)r0 * n_split * stride, *p1 = pt + (size_t)r1 * n_split * stride;
#pragma unroll
    for (int n = 0; n < ND; n++) {
        const int d = 8 * n + 2 * tq;
        if (v0) p0[d] = o[n][0], p0[d + 1] = o[n][1];
        if (v1) p1[d] = o[n][2], p1[d + 1] = o[n][3];
    }
    if (tq == 0) {
        if (v0) p0[HD] = m0 * LN2, p0[HD + 1] = l0;
        if (v1) p1[HD] = m1 * LN2, p1[HD + 1] = l1;
    }
}

template <int HD>
static size_t fd_smem(void) {
    return (size_t)4 * FD_BK * (HD + 8) * sizeof(__half);
}

bool ck_fattn_dec_ok(int n_head, int n_head_kv, int head_dim, const ck_kv *g) {
    static int on = -1;
    if (on < 0) {
        const char *v = getenv("HONE_CUDA_FDEC");
        on = !(v && !strcmp(v, "0"));
    }
    if (!on || head_dim == 256) return false; /* 256: the registers of a one-warp block; k_attn_part16 */
    return ck_fattn_ok(n_head, n_head_kv, head_dim, g) && n_head / n_head_kv <= 16;
}

int ck_fattn_dec_chunk(void) { return FD_CHUNK; }

cudaError_t ck_fattn_dec(cudaStream_t s, dim3 grid, const float *q, int n_head, int n_head_kv, int head_dim,
                         float scale, int32_t window, const ck_kv *g, int layer, const int32_t *pos,
                         const int32_t *seq, const int32_t *bt, int32_t bt_stride, const int32_t *tok, int t0,
                         int n_split, float *part, float *out) {
    const float scale2 = scale * 1.4426950408889634f;
#define FD_GO(D)                                                                                            \
    hc_launch(k_fattn_dec<D>, grid, 32, fd_smem<D>(), s, q, n_head, n_head_kv, scale2, window, *g, layer, pos, \
              seq, bt, bt_stride, tok, t0, n_split, part, out)
    if (head_dim == 64) FD_GO(64);
    else if (head_dim == 128) FD_GO(128);
    else return cudaErrorInvalidValue;
#undef FD_GO
    return cudaGetLastError();
}

template <int HD>
static size_t fa_smem(void) {
    return ((size_t)4 * fa_cfg<HD>::BK + (fa_cfg<HD>::QS ? FA_BQ : 0)) * (HD + 8) * sizeof(__half);
}

int ck_fattn_tile_tokens(void) { return FA_BQ; }

bool ck_fattn_ok(int n_head, int n_head_kv, int head_dim, const ck_kv *g) {
    if (n_head_kv < 1 || n_head % n_head_kv || (head_dim != 64 && head_dim != 128 && head_dim != 256))
        return false;
    if (g->kt != QT_F16 || g->vt != QT_F16) return false;
    /* 16-byte copies: the rows and heads must start 16-byte aligned */
    return !((uintptr_t)g->base % 16 || g->block_bytes % 16 || g->layer_bytes % 16 || g->k_row_bytes % 16 ||
             g->v_row_bytes % 16 || g->k_head_bytes % 16 || g->v_head_bytes % 16);
}

cudaError_t ck_fattn_init(void) {
    cudaError_t e = cudaFuncSetAttribute(k_fattn<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)fa_smem<64>());
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(k_fattn<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)fa_smem<128>());
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(k_fattn<256>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)fa_smem<256>());
    return e;
}

cudaError_t ck_fattn(cudaStream_t s, const float *q, float *out, const int32_t *tiles, int n_tiles, int n_head,
                     int n_head_kv, int head_dim, float scale, int32_t window, const ck_kv *g, int layer,
                     const int32_t *pos, const int32_t *seq, const int32_t *bt, int32_t bt_stride) {
    if (n_tiles <= 0) return cudaSuccess;
    if (!ck_fattn_ok(n_head, n_head_kv, head_dim, g)) return cudaErrorInvalidValue;
    const float scale2 = scale * 1.4426950408889634f;
    const dim3 grid((unsigned)n_tiles, (unsigned)n_head);
#define FA_GO(D)                                                                                               \
    hc_launch(k_fattn<D>, grid, FA_NW * 32, fa_smem<D>(), s, q, out, tiles, n_tiles, n_head, n_head_kv, scale2, window, \
              *g, layer, pos, seq, bt, bt_stride)
    if (head_dim == 64) FA_GO(64);
    else if (head_dim == 128) FA_GO(128);
    else FA_GO(256);
#undef FA_GO
    return cudaGetLastError();
}
