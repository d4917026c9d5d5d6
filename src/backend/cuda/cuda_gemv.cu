/* cuda_gemv.cu: weights on the device and the decode matrix-vector kernels
 * (cuda.h has the contract).
 *
 * Layout. A weight is one allocation of up to four planes: for q4_0, q8_0,
 * q6_K, iq4_xs and mxfp4 each field of the GGUF block (codes, high bits,
 * scales, super-scale) goes to its own plane, so a row's codes are contiguous
 * and 16-byte aligned; q4_K, q5_K, f16 and bf16 keep the file layout, whose
 * blocks (144, 176 bytes) already are. The repack runs on the device once,
 * at upload; the bytes are the file's, only their order changes.
 *
 * Kernels (integer types). x is quantized first (quant_x: 32 values per
 * block, int8 codes, f32 scale d and d * sum of codes). Each lane of a warp
 * owns "units" of 32 weights of a row (one 32-block, or an eighth of a
 * 256-super-block) that cover two 16-value runs of x, A and B: it loads the
 * unit's 16 code bytes with one 16-byte load (plus its scales), the matching
 * 2 x 16 int8 of each activation row, and does 8 dp4a per row. Consecutive
 * lanes take consecutive units, so a warp instruction reads 512 contiguous
 * bytes of codes. A unit is decoded once (prep: int8 values, scales, min
 * factors) and then serves every activation row. A warp computes RPW rows at
 * once (the x registers serve all of them) and keeps UNITS units of loads in
 * flight per lane (UN = UNITS / RPW units of RPW rows) before it computes;
 * WARPS warps a block; the warp's lanes then sum by shuffles. RPW (1, 2, 4),
 * UNITS (4, 8) and WARPS (2, 4, 8) are hc_gemv_params, chosen by the tuner
 * (cuda_tune.cu): they change which loads are in flight together and how
 * rows map to blocks, never the order in which a lane sums its units nor the
 * butterfly, so every choice gives the same bits (test_cuda_gemv checks it).
 * Built in: UNITS 4, WARPS 4, RPW by default_rpw. f16/bf16: the same shape
 * with 8 weights a unit and f32 x read directly.
 *
 * Prefill (hc_mmq): the same units on the tensor cores, many activation rows
 * a block, every output bit-identical to mmv_q's ("matrix-matrix" below). */
#include <stdint.h>
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda_int.cuh"
#include "cuda_units.cuh"
#include "cuda_wdec.cuh"

/* ---- layouts ---- */

typedef struct layout {
    int blck, size, nplanes;
    int off[4], len[4]; /* plane p holds bytes [off, off + len) of every block */
} layout;

static bool layout_of(qt_type t, layout *L) {
    static const layout tab[] = {
        /* blck size np  offsets          lengths */
        {32, 18, 2, {2, 0}, {16, 2}},                  /* q4_0: codes, d */
        {32, 34, 2, {2, 0}, {32, 2}},                  /* q8_0: codes, d */
        {256, 144, 1, {0}, {144}},                     /* q4_K: as in the file */
        {256, 176, 1, {0}, {176}},                     /* q5_K: as in the file */
        {256, 210, 4, {0, 128, 192, 208}, {128, 64, 16, 2}}, /* q6_K: ql, qh, scales, d */
        {256, 136, 2, {8, 0}, {128, 8}},               /* iq4_xs: codes, d + scales */
        {32, 17, 2, {1, 0}, {16, 1}},                  /* mxfp4: codes, e */
        {1, 2, 1, {0}, {2}},                           /* f16 */
        {1, 2, 1, {0}, {2}},                           /* bf16 */
    };
    int i;
    switch (t) {
    case QT_Q4_0: i = 0; break;
    case QT_Q8_0: i = 1; break;
    case QT_Q4_K: i = 2; break;
    case QT_Q5_K: i = 3; break;
    case QT_Q6_K: i = 4; break;
    case QT_IQ4_XS: i = 5; break;
    case QT_MXFP4: i = 6; break;
    case QT_F16: i = 7; break;
    case QT_BF16: i = 8; break;
    default: return false;
    }
    *L = tab[i];
    return true;
}

extern "C" hc_act hc_gemv_act(qt_type t) {
    switch (t) {
    case QT_BF16: return HC_ACT_BF16;
    case QT_Q4_0: case QT_Q8_0: case QT_MXFP4: return HC_ACT_Q8_0;
    case QT_Q4_K: case QT_Q5_K: case QT_Q6_K: case QT_IQ4_XS: return HC_ACT_Q8_K;
    default: return HC_ACT_F32;
    }
}

static bool is_float_type(qt_type t) { return t == QT_F16 || t == QT_BF16; }

#define WARPS 4     /* warps a block, built in */
#define MAX_WARPS 8 /* the most a block may have (the kernels' launch bounds) */

/* sums acc over the warp and lets lane rr * NA + r write y[r][row0 + rr] */
template <int NA, int RPW>
static __device__ __forceinline__ void warp_store(float (&acc)[RPW][NA], int64_t row0, int64_t n, float *y) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int rr = 0; rr < RPW; rr++)
#pragma unroll
        for (int r = 0; r < NA; r++) {
            float v = acc[rr][r];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
            if (lane == (rr * NA + r) % 32 && row0 + rr < n) y[r * n + row0 + rr] = v;
        }
}

/* up to GEMV_MULTI weights of one type and row length, sharing x, in one
 * launch: blocks [b0[i], b0[i + 1]) compute weight i (b0[0] = 0) */
#define GEMV_MULTI 3
struct mwview {
    wview w[GEMV_MULTI];
    float *y[GEMV_MULTI];
    unsigned b0[GEMV_MULTI];
    int nw;
};

#ifndef HC_GEMV_UNITS
#define HC_GEMV_UNITS 4 /* units of loads a lane has in flight, built in (4 or 8; the bits do not change) */
#endif
static_assert(HC_GEMV_UNITS == 4 || HC_GEMV_UNITS == 8, "hc_gemv has kernels for 4 and 8 units in flight");
#ifndef HC_GEMV_MINB
#define HC_GEMV_MINB 1 /* blocks per SM the register budget must allow (a build-time experiment) */
#endif
/* a warp's RPW rows row0.. of the nr rows at row base of w (w.n counts
 * them all: an expert stack's base is e * nr), the result to y[r * nr + ..] */
template <int T, int NA, int RPW, int UN>
static __device__ __forceinline__ void mmv_acc(const wview &w, int64_t base, int64_t row0, int64_t nr, const xview &x,
                                               float (&acc)[RPW][NA]) {
    typedef TT<T> U;
    const int lane = threadIdx.x & 31;
    const int units = (int)(w.k / 32);
    int64_t rows[RPW];
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) rows[rr] = base + (row0 + rr < nr ? row0 + rr : nr - 1);
#pragma unroll
    for (int rr = 0; rr < RPW; rr++)
#pragma unroll
        for (int r = 0; r < NA; r++) acc[rr][r] = 0.0f;

    for (int u0 = lane; u0 < units; u0 += 32 * UN) {
        typename U::W wd[RPW][UN];
#pragma unroll
        for (int j = 0; j < UN; j++)
            if (u0 + 32 * j < units)
#pragma unroll
                for (int rr = 0; rr < RPW; rr++) wd[rr][j] = U::load(w, rows[rr], u0 + 32 * j);
#pragma unroll
        for (int j = 0; j < UN; j++) {
            const int u = u0 + 32 * j;
            if (u >= units) break;
            int pa, pb;
            U::pos(u, pa, pb);
            PU pw[RPW];
#pragma unroll
            for (int rr = 0; rr < RPW; rr++) pw[rr] = U::prep(wd[rr][j], u);
#pragma unroll
            for (int r = 0; r < NA; r++) {
                XU xu;
                xload<U::SUMS, U::ONE_BLOCK, U::PAIR>(x, r, pa, pb, xu);
#pragma unroll
                for (int rr = 0; rr < RPW; rr++) acc[rr][r] = __fadd_rn(acc[rr][r], pdot<U::SUMS, U::ONE_BLOCK>(pw[rr], xu));
            }
        }
    }
}

template <int T, int NA, int RPW, int UN>
static __device__ __forceinline__ void mmv_rows(const wview &w, int64_t base, int64_t row0, int64_t nr, const xview &x,
                                                float *__restrict__ y) {
    float acc[RPW][NA];
    mmv_acc<T, NA, RPW, UN>(w, base, row0, nr, x, acc);
    warp_store<NA, RPW>(acc, row0, nr, y);
}

/* UN units of RPW rows in flight per lane; blockDim.x / 32 warps (2..MAX_WARPS) */
template <int T, int NA, int RPW, int UN>
static __global__ void __launch_bounds__(MAX_WARPS * 32, HC_GEMV_MINB) mmv_q(mwview mw, xview x) {
    HC_PDL_ENTER();
    /* this block's weight, by selects (no indexing into the parameters) */
    const int wi = mw.nw > 2 && blockIdx.x >= mw.b0[2] ? 2 : mw.nw > 1 && blockIdx.x >= mw.b0[1] ? 1 : 0;
    const wview w = wi == 2 ? mw.w[2] : wi == 1 ? mw.w[1] : mw.w[0];
    float *__restrict__ y = wi == 2 ? mw.y[2] : wi == 1 ? mw.y[1] : mw.y[0];
    const unsigned blk = blockIdx.x - (wi == 2 ? mw.b0[2] : wi == 1 ? mw.b0[1] : 0u);
    const int64_t row0 = ((int64_t)blk * (blockDim.x / 32) + threadIdx.x / 32) * RPW;
    if (row0 >= w.n) return;
    mmv_rows<T, NA, RPW, UN>(w, 0, row0, w.n, x, y);
}

/* slot s's activation row in the chunk's quantized x (slots from s0; ks 0: a row a slot) */
static __device__ __forceinline__ xview slot_x(const xview &x, int s, int s0, int ks) {
    const int xr = (ks ? s / ks : s) - (ks ? s0 / ks : s0);
    xview xv = x;
    xv.q += (int64_t)xr * x.ld;
    xv.d += (int64_t)xr * x.ldb;
    xv.s += (int64_t)xr * x.ldb;
    return xv;
}

/* expert slots: block (bx, s) computes rows of slot s's matrix e = ids[s]
 * (or mat when ids is NULL) of nr rows each, on activation row s / ks (ks
 * 0: row s, relative to the chunk's first slot s0), into y[s][..]; e out of
 * [0, mats) gives zeros. One activation row a slot: every slot has the bits
 * of a one-row mmv_q of its matrix. */
template <int T, int RPW, int UN>
static __global__ void __launch_bounds__(MAX_WARPS * 32, HC_GEMV_MINB)
    mmv_e(wview w, int64_t nr, int mats, xview x, const int32_t *__restrict__ ids, int mat, int s0, int ks,
          float *__restrict__ y) {
    HC_PDL_ENTER();
    const int s = s0 + (int)blockIdx.y;
    const int64_t row0 = ((int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * RPW;
    if (row0 >= nr) return;
    const int e = ids ? __ldg(ids + s) : mat;
    float *ys = y + (int64_t)s * nr;
    if (e < 0 || e >= mats) {
        const int lane = threadIdx.x & 31;
        if (lane < RPW && row0 + lane < nr) ys[row0 + lane] = 0.0f;
        return;
    }
    mmv_rows<T, 1, RPW, UN>(w, (int64_t)e * nr, row0, nr, slot_x(x, s, s0, ks), ys);
}

/* a MoE layer's gate and up expert products of the same x in one launch
 * (hc_gemv_slots2): block (bx, s) computes rows row0.. of slot s's gate
 * matrix and then the same rows of its up matrix (the same unit loop and
 * warp sums as mmv_e, so each output has a one-row gemv's bits), and with
 * h the swiglu of the two, k_swiglu's arithmetic (silu(g) u as
 * (g / (1 + expf(-g))) u), from the lane that holds both sums. e out of
 * [0, mats): zeros (and h 0, as k_swiglu gives for 0 and 0). */
template <int T, int RPW, int UN>
static __global__ void __launch_bounds__(MAX_WARPS * 32, HC_GEMV_MINB)
    mmv_e2(wview wg, wview wu, int64_t nr, int mats, xview x, const int32_t *__restrict__ ids, int s0, int ks,
           float *__restrict__ yg, float *__restrict__ yu, float *__restrict__ h) {
    HC_PDL_ENTER();
    const int s = s0 + (int)blockIdx.y;
    const int64_t row0 = ((int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * RPW;
    if (row0 >= nr) return;
    const int e = __ldg(ids + s), lane = threadIdx.x & 31;
    const int64_t o = (int64_t)s * nr + row0;
    if (e < 0 || e >= mats) {
        if (lane < RPW && row0 + lane < nr) {
            yg[o + lane] = 0.0f;
            yu[o + lane] = 0.0f;
            if (h) h[o + lane] = 0.0f;
        }
        return;
    }
    const xview xv = slot_x(x, s, s0, ks);
    float ag[RPW][1], au[RPW][1];
    mmv_acc<T, 1, RPW, UN>(wg, (int64_t)e * nr, row0, nr, xv, ag);
    mmv_acc<T, 1, RPW, UN>(wu, (int64_t)e * nr, row0, nr, xv, au);
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
        float g = ag[rr][0], u = au[rr][0];
#pragma unroll
        for (int of = 16; of > 0; of >>= 1) {
            g = __fadd_rn(g, __shfl_xor_sync(0xffffffffu, g, of));
            u = __fadd_rn(u, __shfl_xor_sync(0xffffffffu, u, of));
        }
        if (lane == rr && row0 + rr < nr) {
            yg[o + rr] = g;
            yu[o + rr] = u;
            if (h) h[o + rr] = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
        }
    }
}

/* ---- the matrix-matrix kernel (prefill): mmq ----
 *
 * What it must reproduce. mmv_q gives output (weight row j, activation row r)
 * as: lane l (0..31) sums, in increasing order of u, pdot over the units
 * u = l, l + 32, l + 64, ... (starting from +0.0f), then the lanes are summed
 * by the butterfly 16, 8, 4, 2, 1: a fixed binary tree over the 32 lane
 * partials, whose leaves, read left to right, are the partials
 * l = brev5(i) for i = 0..31 (0, 16, 8, 24, ...: pair (l, l + 16) first, then
 * those pairs 8 apart, ...). Every pdot is pcomb of the two runs' integer
 * dots, which are exact.
 *
 * How mmq does the same. A block computes 64 weight rows x 64 activation
 * rows; its 8 warps 32 x 16 each (2 x 2 tiles of the m16n8k16 int8 mma,
 * which yields the run dot of 16 x 8 outputs; runs A and B are two mmas).
 * The block walks "steps" i-major: leaf position i = 0..31, then
 * s = 0..S-1 (S = units / 32 rounded up), step (i, s) being the unit
 * u = 32 s + brev5(i) (skipped when u >= units: mmv_q's lane has no such
 * unit). Each thread keeps, for each of its 16 outputs, the running partial
 * of the current leaf (summed in increasing u, as the lane does) and a stack
 * of 5 completed subtrees: when leaf i is done it is merged as a binary
 * counter merges (for each trailing 1 bit k of i: partial = stack[k] +
 * partial; then stack[t] = partial), which evaluates exactly the butterfly's
 * tree. The dots come out of the mma as int32 added to the bits of
 * 1.5 * 2^23 (the accumulator's initial value), so that one exact
 * subtraction gives the float of the dot (|dot| < 2^22: 16 products of
 * |values| <= 128 and 127) instead of an int-to-float conversion: the same
 * float as mmv_q's (float)dot. The float part then is pcomb, the same
 * function as mmv_q's, on the same operands: the weights' decoded values and
 * factors come from the same TT<T>::load/prep, the activations' from the same
 * xload. So every output has mmv_q's bits.
 *
 * Pipeline: a stage is 4 steps; each of the 256 threads loads one weight
 * unit (one row) and one activation unit (one row) of the next stage into
 * registers while the block computes the current one, then decodes the unit
 * (prep) into shared memory (double-buffered, one barrier a stage).
 *
 * What limits it: the float part (pcomb per output, unit: 8 to 12 f32
 * operations) runs on the FP32 pipes, 5x more work than the mma's; it is
 * mmv_q's arithmetic, which this kernel must follow bit for bit. */
#define MQ_BM 64          /* weight rows a block */
#define MQ_BN 64          /* activation rows a block */
#define MQ_G 4            /* steps (units) a stage */
#define MQ_THREADS 256
#define MQ_MAGIC 0x4B400000 /* the bits of 12582912.0f = 1.5 * 2^23 */
static_assert(MQ_BM * MQ_G == MQ_THREADS && MQ_BN * MQ_G == MQ_THREADS, "one load a thread a stage");

/* the exact float of a dot that mma_s8 returned offset by MQ_MAGIC */
static __device__ __forceinline__ float mq_dot(int d) { return __fsub_rn(__int_as_float(d), 12582912.0f); }

static __device__ __forceinline__ int brev5(int i) { return (int)(__brev((unsigned)i) >> 27); }

/* the wait for all of a thread's asynchronous copies */
static __device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.commit_group;\ncp.async.wait_all;" ::: "memory");
}

/* a factor quad from shared memory: only .x, .y (the scales) where the type has no sums */
template <bool SUMS>
static __device__ __forceinline__ float4 ld_f(const float4 *p) {
    if (SUMS) return *p;
    const float2 v = *(const float2 *)p;
    return make_float4(v.x, v.y, 0.0f, 0.0f);
}

template <int T>
static __global__ void __launch_bounds__(MQ_THREADS, 1) mmq(wview w, xview x, int na, float *__restrict__ y) {
    HC_PDL_ENTER();
    typedef TT<T> U;
    constexpr bool SUMS = U::SUMS, OB = U::ONE_BLOCK;
    /* [buffer][step of the stage][row of the tile]: runs A and B (16 int8
     * each) and the factors (weights fa, fb, ma, mb; activations da, db,
     * sa, sb); 48 KiB */
    __shared__ int4 s_wa[2][MQ_G][MQ_BM], s_wb[2][MQ_G][MQ_BM];
    __shared__ float4 s_wf[2][MQ_G][MQ_BM];
    __shared__ int4 s_xa[2][MQ_G][MQ_BN], s_xb[2][MQ_G][MQ_BN];
    __shared__ float4 s_xf[2][MQ_G][MQ_BN];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gid = lane >> 2, tig = lane & 3;
    const int wrow = (warp & 1) * 32, wcol = (warp >> 1) * 16; /* the warp's outputs in the tile */
    const int64_t j0 = (int64_t)blockIdx.x * MQ_BM;
    const int r0 = (int)blockIdx.y * MQ_BN;
    const int units = (int)(w.k / 32), S = (units + 31) / 32, nst = 32 * S / MQ_G;

    /* this thread's loads: row lr of the tile (clamped to the matrices), step lg of each stage */
    const int lr = tid % MQ_BM, lg = tid / MQ_BM;
    const int64_t lrow = j0 + lr < w.n ? j0 + lr : w.n - 1;
    const int lxr = r0 + lr < na ? r0 + lr : na - 1;
    typename U::W wreg = {};
    int lu = 0;
    bool lvalid = false;
    /* the next stage's loads: the weight unit into registers (prep decodes
     * it later, in put), the activation unit straight into shared memory
     * buffer b: the same values xload reads (db = da, sb unused in ONE_BLOCK
     * types; sa, sb unused without SUMS) */
    auto fetch = [&](int c, int b) {
        const int q = c * MQ_G + lg, i = q / S, s = q - i * S;
        lu = 32 * s + brev5(i);
        lvalid = lu < units;
        if (lvalid) {
            wreg = U::load(w, lrow, lu);
            int pa, pb;
            U::pos(lu, pa, pb);
            const int8_t *xq = x.q + lxr * x.ld;
            const float *xd = x.d + lxr * x.ldb, *xs = x.s + lxr * x.ldb;
            float *f = (float *)&s_xf[b][lg][lr];
            cpa16(&s_xa[b][lg][lr], xq + pa);
            cpa16(&s_xb[b][lg][lr], xq + pb);
            cpa4(f, xd + pa / 32);
            cpa4(f + 1, xd + (OB ? pa : pb) / 32);
            if (SUMS) {
                cpa4(f + 2, xs + pa / 32);
                if (!OB) cpa4(f + 3, xs + pb / 32);
            }
        }
    };
    auto put = [&](int b) {
        if (lvalid) {
            const PU p = U::prep(wreg, lu);
            s_wa[b][lg][lr] = p.a;
            s_wb[b][lg][lr] = p.b;
            s_wf[b][lg][lr] = make_float4(p.fa, p.fb, p.ma, p.mb);
        }
    };

    /* outputs: [mi][ni][e] = weight row wrow + 16 mi + gid + 8 (e >> 1),
     * activation row wcol + 8 ni + 2 tig + (e & 1) */
    float acc[2][2][4], st[5][2][2][4];
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < 2; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                acc[mi][ni][e] = 0.0f;
#pragma unroll
                for (int k = 0; k < 5; k++) st[k][mi][ni][e] = 0.0f;
            }

    fetch(0, 0);
    put(0);
    cp_wait();
    __syncthreads();
    for (int c = 0; c < nst; c++) {
        const int b = c & 1;
        /* buffer b ^ 1 was last read in stage c - 1, before the barrier that ended it */
        if (c + 1 < nst) fetch(c + 1, b ^ 1);
#pragma unroll
        for (int g = 0; g < MQ_G; g++) {
            const int q = c * MQ_G + g, i = q / S, s = q - i * S;
            if (32 * s + brev5(i) < units) {
                int aa[2][2], ab[2][2], ba[2], bb[2];
                float4 wf[2][2], xf[2][2];
#pragma unroll
                for (int mi = 0; mi < 2; mi++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int R = wrow + 16 * mi + gid + 8 * h;
                        aa[mi][h] = ((const int *)&s_wa[b][g][R])[tig];
                        ab[mi][h] = ((const int *)&s_wb[b][g][R])[tig];
                        wf[mi][h] = ld_f<SUMS>(&s_wf[b][g][R]);
                    }
#pragma unroll
                for (int ni = 0; ni < 2; ni++) {
                    const int C = wcol + 8 * ni;
                    ba[ni] = ((const int *)&s_xa[b][g][C + gid])[tig];
                    bb[ni] = ((const int *)&s_xb[b][g][C + gid])[tig];
                    xf[ni][0] = ld_f<SUMS>(&s_xf[b][g][C + 2 * tig]);
                    xf[ni][1] = ld_f<SUMS>(&s_xf[b][g][C + 2 * tig + 1]);
                }
#pragma unroll
                for (int mi = 0; mi < 2; mi++)
#pragma unroll
                    for (int ni = 0; ni < 2; ni++) {
                        int da[4], db[4];
                        mma_s8(da, aa[mi][0], aa[mi][1], ba[ni], MQ_MAGIC);
                        mma_s8(db, ab[mi][0], ab[mi][1], bb[ni], MQ_MAGIC);
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const float4 fw = wf[mi][e >> 1], fx = xf[ni][e & 1];
                            acc[mi][ni][e] = __fadd_rn(acc[mi][ni][e],
                                                       pcomb<SUMS, OB>(fw.x, fw.y, fw.z, fw.w, fx.x, fx.y, fx.z, fx.w,
                                                                       mq_dot(da[e]), mq_dot(db[e])));
                        }
                    }
            }
            if (s == S - 1) {
                /* leaf i done: merge it as a binary counter; after leaf 31 acc holds the sum */
                bool placed = false;
#pragma unroll
                for (int k = 0; k < 5; k++)
                    if (!placed) {
                        if ((i >> k) & 1) {
#pragma unroll
                            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                                for (int ni = 0; ni < 2; ni++)
#pragma unroll
                                    for (int e = 0; e < 4; e++)
                                        acc[mi][ni][e] = __fadd_rn(st[k][mi][ni][e], acc[mi][ni][e]);
                        } else {
#pragma unroll
                            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                                for (int ni = 0; ni < 2; ni++)
#pragma unroll
                                    for (int e = 0; e < 4; e++) {
                                        st[k][mi][ni][e] = acc[mi][ni][e];
                                        acc[mi][ni][e] = 0.0f;
                                    }
                            placed = true;
                        }
                    }
            }
        }
        if (c + 1 < nst) put(b ^ 1);
        cp_wait();
        __syncthreads();
    }
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < 2; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int64_t R = j0 + wrow + 16 * mi + gid + 8 * (e >> 1);
                const int C = r0 + wcol + 8 * ni + 2 * tig + (e & 1);
                if (R < w.n && C < na) y[(int64_t)C * w.n + R] = acc[mi][ni][e];
            }
}

/* f16/bf16: unit = 8 weights (16 bytes); k % 8 == 0 */
static __device__ __forceinline__ void f8(int4 q, bool bf, float (&f)[8]) {
    const unsigned v[4] = {(unsigned)q.x, (unsigned)q.y, (unsigned)q.z, (unsigned)q.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (bf) {
            f[2 * i] = __uint_as_float(v[i] << 16);
            f[2 * i + 1] = __uint_as_float(v[i] & 0xffff0000u);
        } else {
            const float2 p = __half22float2(*(const __half2 *)&v[i]);
            f[2 * i] = p.x;
            f[2 * i + 1] = p.y;
        }
    }
}

template <int T, int NA, int RPW, int UN>
static __global__ void __launch_bounds__(MAX_WARPS * 32) mmv_f(wview w, const float *__restrict__ x, float *__restrict__ y) {
    HC_PDL_ENTER();
    constexpr bool BF = T == QT_BF16;
    const int lane = threadIdx.x & 31;
    const int64_t row0 = ((int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * RPW;
    if (row0 >= w.n) return;
    const int units = (int)(w.k / 8);
    const int4 *rowp[RPW];
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) rowp[rr] = (const int4 *)(w.p[0] + (row0 + rr < w.n ? row0 + rr : w.n - 1) * w.k * 2);
    float acc[RPW][NA];
#pragma unroll
    for (int rr = 0; rr < RPW; rr++)
#pragma unroll
        for (int r = 0; r < NA; r++) acc[rr][r] = 0.0f;

    for (int u0 = lane; u0 < units; u0 += 32 * UN) {
        int4 wd[RPW][UN];
#pragma unroll
        for (int j = 0; j < UN; j++)
            if (u0 + 32 * j < units)
#pragma unroll
                for (int rr = 0; rr < RPW; rr++) wd[rr][j] = __ldg(rowp[rr] + u0 + 32 * j);
#pragma unroll
        for (int j = 0; j < UN; j++) {
            const int u = u0 + 32 * j;
            if (u >= units) break;
            float wf[RPW][8];
#pragma unroll
            for (int rr = 0; rr < RPW; rr++) f8(wd[rr][j], BF, wf[rr]);
#pragma unroll
            for (int r = 0; r < NA; r++) {
                const float4 *xp = (const float4 *)(x + r * w.k + 8 * (int64_t)u);
                float4 a = __ldg(xp), b = __ldg(xp + 1);
                if (BF) { /* the CPU rounds x to bf16 for bf16 weights */
                    a = make_float4(act_bf16(a.x), act_bf16(a.y), act_bf16(a.z), act_bf16(a.w));
                    b = make_float4(act_bf16(b.x), act_bf16(b.y), act_bf16(b.z), act_bf16(b.w));
                }
#pragma unroll
                for (int rr = 0; rr < RPW; rr++)
                    acc[rr][r] += wf[rr][0] * a.x + wf[rr][1] * a.y + wf[rr][2] * a.z + wf[rr][3] * a.w +
                                  wf[rr][4] * b.x + wf[rr][5] * b.y + wf[rr][6] * b.z + wf[rr][7] * b.w;
            }
        }
    }
    warp_store<NA, RPW>(acc, row0, w.n, y);
}

/* x [na][k] f32 -> codes, scales and scaled sums of 32-blocks, exactly as
 * the CPU backend quantizes activations for the same weight type (dot.c's
 * cpu_act_q8_0_ref / cpu_act_q8_K_ref, whose arithmetic follows llama.cpp),
 * so that the GPU's and the CPU's logits agree to float rounding:
 * 32-block types see Q8_0 (inverse scale 127 / amax, codes rounded half to
 * even, the scale rounded to f16); 256-block types see Q8_K (one f32 scale
 * per 256 values, -127 / max with max the value of largest magnitude), kept
 * here as eight 32-blocks of the same scale. s = d * sum(codes) of each
 * 32-block. Explicitly rounded operations: nothing is contracted. */
/* one warp a 32-block */
static __global__ void quant_x32(const float *__restrict__ x, int64_t k, int8_t *__restrict__ q, float *__restrict__ d,
                                 float *__restrict__ s) {
    HC_PDL_ENTER();
    const int64_t nb = k / 32, b = (int64_t)blockIdx.x * 4 + threadIdx.x / 32;
    const int r = blockIdx.y, lane = threadIdx.x & 31;
    if (b >= nb) return;
    const float v = x[r * k + b * 32 + lane];
    const float amax = act_warp_amax(v);
    const float id = amax != 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
    const float dd = __half2float(__float2half_rn(__fdiv_rn(amax, 127.0f)));
    const int c = act_q8(__fmul_rn(v, id));
    int sum = c;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    q[r * k + b * 32 + lane] = (int8_t)c;
    if (lane == 0) {
        d[r * nb + b] = dd;
        s[r * nb + b] = __fmul_rn(dd, (float)sum);
    }
}

/* Q8_K of a 256-block, one value v a thread of a 256-thread block: the
 * thread's code to *q, and its 32-block's scale and scaled code sum to
 * d[warp], s[warp] (quant_x256 and the fused swiglu's form share it) */
static __device__ __forceinline__ void quant256_put(float v, float *s_max, int8_t *q, float *d, float *s) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float m = act_block256_max(v, s_max);
    int c = 0;
    float dd = 0.0f;
    if (m != 0.0f) {
        const float iscale = __fdiv_rn(-127.0f, m);
        c = act_q8(__fmul_rn(iscale, v));
        dd = __fdiv_rn(1.0f, iscale);
    }
    int sum = c;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    *q = (int8_t)c;
    if (lane == 0) {
        d[warp] = dd;
        s[warp] = __fmul_rn(dd, (float)sum);
    }
}

/* one block of 256 threads a 256-block */
static __global__ void quant_x256(const float *__restrict__ x, int64_t k, int8_t *__restrict__ q,
                                  float *__restrict__ d, float *__restrict__ s) {
    HC_PDL_ENTER();
    __shared__ float s_max[8];
    const int64_t nb = k / 32, B = blockIdx.x;
    const int r = blockIdx.y, t = threadIdx.x;
    const float v = x[r * k + B * 256 + t];
    quant256_put(v, s_max, q + r * k + B * 256 + t, d + r * nb + B * 8, s + r * nb + B * 8);
}

/* ---- fused producers of a quantized x (decode: the step's records fuse
 * them, cuda_backend.cu) ----
 * The quantization of one 32-block (Q8_0) or one 256-block (Q8_K) by one
 * warp, from values in shared memory: the bits of quant_x32 / quant_x256
 * (Q8_K's max is a total order, largest magnitude then the larger value, so
 * the order it is taken in does not matter, and the code sums are integers). */
template <int ACT>
static __device__ __forceinline__ void warp_quant_block(const float *v, int64_t b, int lane, int8_t *q, float *qd,
                                                        float *qs) {
    if (ACT == HC_ACT_Q8_0) {
        const float x = v[b * 32 + lane];
        const float amax = act_warp_amax(x);
        const float id = amax != 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
        const float dd = __half2float(__float2half_rn(__fdiv_rn(amax, 127.0f)));
        const int c = act_q8(__fmul_rn(x, id));
        int sum = c;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        q[b * 32 + lane] = (int8_t)c;
        if (lane == 0) {
            qd[b] = dd;
            qs[b] = __fmul_rn(dd, (float)sum);
        }
    } else { /* Q8_K: b is the 256-block */
        float xv[8], m = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            xv[i] = v[b * 256 + 32 * i + lane];
            if (i == 0 || fabsf(xv[i]) > fabsf(m) || (fabsf(xv[i]) == fabsf(m) && xv[i] > m)) m = xv[i];
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float u = __shfl_xor_sync(0xffffffffu, m, o);
            if (fabsf(u) > fabsf(m) || (fabsf(u) == fabsf(m) && u > m)) m = u;
        }
        const float iscale = m != 0.0f ? __fdiv_rn(-127.0f, m) : 0.0f;
        const float dd = m != 0.0f ? __fdiv_rn(1.0f, iscale) : 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int c = m != 0.0f ? act_q8(__fmul_rn(iscale, xv[i])) : 0;
            int sum = c;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
            q[b * 256 + 32 * i + lane] = (int8_t)c;
            if (lane == 0) {
                qd[b * 8 + i] = dd;
                qs[b * 8 + i] = __fmul_rn(dd, (float)sum);
            }
        }
    }
}

/* [x = x + r;] y = rms_norm(x) * w (cuda_kern.cu's k_rms_norm, bit for bit:
 * the same threads, values a thread and sums), and y quantized for ACT into
 * the scratch; one block a row, y kept in shared memory between the two */
#define NQ_VPT HC_RN_VPT
template <int ACT>
static __global__ void k_norm_quant(float *__restrict__ x, const float *__restrict__ r, const float *__restrict__ w,
                                    int dim, float eps, float *__restrict__ y, int8_t *__restrict__ q,
                                    float *__restrict__ qd, float *__restrict__ qs) {
    HC_PDL_ENTER();
    extern __shared__ float ys[];
    __shared__ double sh[32];
    float *xr = x + (int64_t)blockIdx.x * dim;
    const float *rr = r ? r + (int64_t)blockIdx.x * dim : NULL;
    float *yr = y + (int64_t)blockIdx.x * dim;
    const int nt = blockDim.x, lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    double ss = 0.0;
    float v[NQ_VPT];
#pragma unroll
    for (int j = 0; j < NQ_VPT; j++) {
        const int i = threadIdx.x + j * nt;
        v[j] = i < dim ? xr[i] : 0.0f;
        if (rr && i < dim) {
            v[j] = __fadd_rn(v[j], rr[i]);
            xr[i] = v[j];
        }
    }
#pragma unroll
    for (int j = 0; j < NQ_VPT; j++) ss += (double)__fmul_rn(v[j], v[j]);
    for (int i = threadIdx.x + NQ_VPT * nt; i < dim; i += nt) {
        float u = xr[i];
        if (rr) {
            u = __fadd_rn(u, rr[i]);
            xr[i] = u;
        }
        ys[i] = u;
        ss += (double)__fmul_rn(u, u);
    }
    const float scale = hc_rms_scale(ss, nt, dim, eps, sh);
#pragma unroll
    for (int j = 0; j < NQ_VPT; j++) {
        const int i = threadIdx.x + j * nt;
        if (i < dim) {
            const float u = __fmul_rn(v[j], scale);
            ys[i] = yr[i] = w ? __fmul_rn(u, w[i]) : u;
        }
    }
    for (int i = threadIdx.x + NQ_VPT * nt; i < dim; i += nt) {
        const float u = __fmul_rn(ys[i], scale);
        ys[i] = yr[i] = w ? __fmul_rn(u, w[i]) : u;
    }
    __syncthreads();
    const int64_t nb = dim / 32, row = blockIdx.x;
    const int64_t nblk = ACT == HC_ACT_Q8_0 ? nb : nb / 8;
    for (int64_t b = warp; b < nblk; b += nt / 32) warp_quant_block<ACT>(ys, b, lane, q + row * dim, qd + row * nb, qs + row * nb);
}

/* y = silu(g) * u (cuda_kern.cu's k_swiglu, bit for bit) over rows of k, and
 * y quantized for ACT into the scratch; a block of 4 warps a (row, 4 blocks) */
template <int ACT>
static __global__ void k_swiglu_quant(const float *__restrict__ g, const float *__restrict__ u, int64_t k,
                                      float *__restrict__ y, int8_t *__restrict__ q, float *__restrict__ qd,
                                      float *__restrict__ qs) {
    HC_PDL_ENTER();
    constexpr int BL = ACT == HC_ACT_Q8_0 ? 32 : 256;
    __shared__ float vs[4 * BL];
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    const int64_t row = blockIdx.y, nb = k / 32, b = (int64_t)blockIdx.x * 4 + warp;
    if (b * BL >= k) return;
    const int64_t o = row * k + b * BL;
    float *v = vs + warp * BL;
    for (int i = lane; i < BL; i += 32) {
        const float gv = g[o + i];
        v[i] = y[o + i] = __fmul_rn(__fdiv_rn(gv, __fadd_rn(1.0f, expf(-gv))), u[o + i]);
    }
    __syncwarp();
    warp_quant_block<ACT>(v, 0, lane, q + o, qd + row * nb + b * (BL / 32), qs + row * nb + b * (BL / 32));
}

/* the Q8_K form: one block of 256 threads a (row, 256-block), each thread
 * one value, quantized as quant_x256 does (quant256_put, on the value in a
 * register): the whole machine's width instead of a warp a 256-block */
static __global__ void k_swiglu_quant256(const float *__restrict__ g, const float *__restrict__ u, int64_t k,
                                         float *__restrict__ y, int8_t *__restrict__ q, float *__restrict__ qd,
                                         float *__restrict__ qs) {
    HC_PDL_ENTER();
    __shared__ float s_max[8];
    const int64_t nb = k / 32, B = blockIdx.x, r = blockIdx.y;
    const int64_t o = r * k + B * 256 + threadIdx.x;
    const float gv = g[o];
    const float v = __fmul_rn(__fdiv_rn(gv, __fadd_rn(1.0f, expf(-gv))), u[o]);
    y[o] = v;
    quant256_put(v, s_max, q + o, qd + r * nb + B * 8, qs + r * nb + B * 8);
}

extern "C" bool hc_quant_fusable(hc_act act, int64_t dim, int na, const hc_gemv_scratch *s) {
    if (act != HC_ACT_Q8_0 && act != HC_ACT_Q8_K) return false;
    if (!s || !s->xq || dim > s->max_k || na < 1 || na > s->max_rows) return false;
    return dim % (act == HC_ACT_Q8_K ? 256 : 32) == 0;
}

extern "C" hn_status hc_norm_quant(float *x, const float *r, const float *w, int n, int dim, float eps, float *y,
                                   hc_act act, hc_gemv_scratch *s, void *stream, hn_err *err) {
    if (!hc_quant_fusable(act, dim, n, s) || dim > HC_NORM_QUANT_MAX)
        return hn_errf(err, HN_ERR_INVALID, "cuda: norm_quant: %d rows of %d for activation type %d", n, dim, (int)act);
    const int nt = hc_rms_threads(dim);
    const size_t smem = sizeof(float) * (size_t)dim;
    cudaStream_t cs = (cudaStream_t)stream;
    if (act == HC_ACT_Q8_0)
        hc_launch(k_norm_quant<HC_ACT_Q8_0>, (unsigned)n, (unsigned)nt, smem, cs, x, r, w, dim, eps, y, s->xq, s->xd, s->xs);
    else
        hc_launch(k_norm_quant<HC_ACT_Q8_K>, (unsigned)n, (unsigned)nt, smem, cs, x, r, w, dim, eps, y, s->xq, s->xd, s->xs);
    HC_LAUNCHED(err, "norm_quant kernel");
    return HN_OK;
}

extern "C" hn_status hc_swiglu_quant(const float *g, const float *u, int n, int64_t k, float *y, hc_act act,
                                     hc_gemv_scratch *s, void *stream, hn_err *err) {
    if (!hc_quant_fusable(act, k, n, s))
        return hn_errf(err, HN_ERR_INVALID, "cuda: swiglu_quant: %d rows of %lld for activation type %d", n,
                       (long long)k, (int)act);
    cudaStream_t cs = (cudaStream_t)stream;
    const int64_t nblk = act == HC_ACT_Q8_0 ? k / 32 : k / 256;
    const dim3 grid((unsigned)((nblk + 3) / 4), (unsigned)n);
    if (act == HC_ACT_Q8_0)
        hc_launch(k_swiglu_quant<HC_ACT_Q8_0>, grid, 128, 0, cs, g, u, k, y, s->xq, s->xd, s->xs);
    else
        hc_launch(k_swiglu_quant256, dim3((unsigned)(k / 256), (unsigned)n), 256, 0, cs, g, u, k, y, s->xq, s->xd,
                  s->xs);
    HC_LAUNCHED(err, "swiglu_quant kernel");
    return HN_OK;
}

/* the scalar reference; BFX: x rounded to bf16 first (hc_gemv's path for
 * bf16 rows that are not 16-byte aligned, which must round as the fast kernel does) */
template <int T, bool BFX = false>
static __global__ void mmv_ref(wview w, const float *__restrict__ x, float *__restrict__ y) {
    HC_PDL_ENTER();
    const int64_t row = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int r = blockIdx.y;
    if (row >= w.n) return;
    double acc = 0;
    for (int64_t e = 0; e < w.k; e++) {
        const float xv = x[r * w.k + e];
        acc += (double)wref<T>(w, row, e) * (double)(BFX ? act_bf16(xv) : xv);
    }
    y[r * w.n + row] = (float)acc;
}

/* ---- repack: block i's bytes [off, off + len) -> plane p at i * len ---- */

struct planes_arg {
    uint8_t *dst[4];
    int off[4], len[4];
    int np, size;
};

static __global__ void repack(const uint8_t *__restrict__ src, int64_t nblocks, planes_arg a) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < nblocks; i += (int64_t)gridDim.x * blockDim.x) {
        const uint8_t *s = src + i * a.size;
        for (int p = 0; p < a.np; p++)
            for (int j = 0; j < a.len[p]; j++) a.dst[p][i * a.len[p] + j] = s[a.off[p] + j];
    }
}

/* ---- dispatch ---- */

typedef void (*qkern)(mwview, xview);
typedef void (*fkern)(wview, const float *, float *);
typedef void (*rkern)(wview, const float *, float *);

template <int T, int RPW, int UN>
static qkern pick_q_na(int na) {
    switch (na) {
    case 1: return mmv_q<T, 1, RPW, UN>;
    case 2: return mmv_q<T, 2, RPW, UN>;
    case 3: return mmv_q<T, 3, RPW, UN>;
    case 4: return mmv_q<T, 4, RPW, UN>;
    case 5: return mmv_q<T, 5, RPW, UN>;
    case 6: return mmv_q<T, 6, RPW, UN>;
    case 7: return mmv_q<T, 7, RPW, UN>;
    default: return mmv_q<T, 8, RPW, UN>;
    }
}
template <int T, int RPW, int UN>
static fkern pick_f_na(int na) {
    switch (na) {
    case 1: return mmv_f<T, 1, RPW, UN>;
    case 2: return mmv_f<T, 2, RPW, UN>;
    case 3: return mmv_f<T, 3, RPW, UN>;
    case 4: return mmv_f<T, 4, RPW, UN>;
    case 5: return mmv_f<T, 5, RPW, UN>;
    case 6: return mmv_f<T, 6, RPW, UN>;
    case 7: return mmv_f<T, 7, RPW, UN>;
    default: return mmv_f<T, 8, RPW, UN>;
    }
}
/* the six (rows per warp, units) variants: 4 units in flight (the built-in) or 8 */
template <int T>
static qkern pick_q(int na, int rpw, int units) {
    if (units == 8) return rpw == 1 ? pick_q_na<T, 1, 8>(na) : rpw == 2 ? pick_q_na<T, 2, 4>(na) : pick_q_na<T, 4, 2>(na);
    return rpw == 1 ? pick_q_na<T, 1, 4>(na) : rpw == 2 ? pick_q_na<T, 2, 2>(na) : pick_q_na<T, 4, 1>(na);
}
template <int T>
static fkern pick_f(int na, int rpw, int units) {
    if (units == 8) return rpw == 1 ? pick_f_na<T, 1, 8>(na) : rpw == 2 ? pick_f_na<T, 2, 4>(na) : pick_f_na<T, 4, 2>(na);
    return rpw == 1 ? pick_f_na<T, 1, 4>(na) : rpw == 2 ? pick_f_na<T, 2, 2>(na) : pick_f_na<T, 4, 1>(na);
}

/* the expert-slot kernels, 4 units in flight */
typedef void (*ekern)(wview, int64_t, int, xview, const int32_t *, int, int, int, float *);
template <int T>
static ekern pick_e(int rpw) {
    return rpw == 1 ? mmv_e<T, 1, 4> : rpw == 2 ? mmv_e<T, 2, 2> : mmv_e<T, 4, 1>;
}
typedef void (*ekern2)(wview, wview, int64_t, int, xview, const int32_t *, int, int, float *, float *, float *);
template <int T>
static ekern2 pick_e2(int rpw) {
    return rpw == 1 ? mmv_e2<T, 1, 4> : rpw == 2 ? mmv_e2<T, 2, 2> : mmv_e2<T, 4, 1>;
}
static ekern ekernel(qt_type t, int rpw) {
    switch (t) {
    case QT_Q4_0: return pick_e<QT_Q4_0>(rpw);
    case QT_Q8_0: return pick_e<QT_Q8_0>(rpw);
    case QT_Q4_K: return pick_e<QT_Q4_K>(rpw);
    case QT_Q5_K: return pick_e<QT_Q5_K>(rpw);
    case QT_Q6_K: return pick_e<QT_Q6_K>(rpw);
    case QT_IQ4_XS: return pick_e<QT_IQ4_XS>(rpw);
    case QT_MXFP4: return pick_e<QT_MXFP4>(rpw);
    default: return NULL;
    }
}

static ekern2 ekernel2(qt_type t, int rpw) {
    switch (t) {
    case QT_Q4_0: return pick_e2<QT_Q4_0>(rpw);
    case QT_Q8_0: return pick_e2<QT_Q8_0>(rpw);
    case QT_Q4_K: return pick_e2<QT_Q4_K>(rpw);
    case QT_Q5_K: return pick_e2<QT_Q5_K>(rpw);
    case QT_Q6_K: return pick_e2<QT_Q6_K>(rpw);
    case QT_IQ4_XS: return pick_e2<QT_IQ4_XS>(rpw);
    case QT_MXFP4: return pick_e2<QT_MXFP4>(rpw);
    default: return NULL;
    }
}

static qkern qkernel(qt_type t, int na, int rpw, int units) {
    switch (t) {
    case QT_Q4_0: return pick_q<QT_Q4_0>(na, rpw, units);
    case QT_Q8_0: return pick_q<QT_Q8_0>(na, rpw, units);
    case QT_Q4_K: return pick_q<QT_Q4_K>(na, rpw, units);
    case QT_Q5_K: return pick_q<QT_Q5_K>(na, rpw, units);
    case QT_Q6_K: return pick_q<QT_Q6_K>(na, rpw, units);
    case QT_IQ4_XS: return pick_q<QT_IQ4_XS>(na, rpw, units);
    case QT_MXFP4: return pick_q<QT_MXFP4>(na, rpw, units);
    default: return NULL;
    }
}

typedef void (*mkern)(wview, xview, int, float *);

static mkern mkernel(qt_type t) {
    switch (t) {
    case QT_Q4_0: return mmq<QT_Q4_0>;
    case QT_Q8_0: return mmq<QT_Q8_0>;
    case QT_Q4_K: return mmq<QT_Q4_K>;
    case QT_Q5_K: return mmq<QT_Q5_K>;
    case QT_Q6_K: return mmq<QT_Q6_K>;
    case QT_IQ4_XS: return mmq<QT_IQ4_XS>;
    case QT_MXFP4: return mmq<QT_MXFP4>;
    default: return NULL;
    }
}

static rkern rkernel(qt_type t) {
    switch (t) {
    case QT_Q4_0: return mmv_ref<QT_Q4_0>;
    case QT_Q8_0: return mmv_ref<QT_Q8_0>;
    case QT_Q4_K: return mmv_ref<QT_Q4_K>;
    case QT_Q5_K: return mmv_ref<QT_Q5_K>;
    case QT_Q6_K: return mmv_ref<QT_Q6_K>;
    case QT_IQ4_XS: return mmv_ref<QT_IQ4_XS>;
    case QT_MXFP4: return mmv_ref<QT_MXFP4>;
    case QT_F16: return mmv_ref<QT_F16>;
    case QT_BF16: return mmv_ref<QT_BF16>;
    default: return NULL;
    }
}

/* the built-in rows per warp, from bench_cuda_gemv on an H200 (bench/README.md):
 * more rows share each activation load as na grows; one row of a huge
 * matrix (the output) gains from 4 rows of loads in flight per warp */
static int default_rpw(qt_type t, int na, int64_t n) {
    if (na == 1) return n >= 65536 ? 4 : 2;
    if (na == 2) return 2;
    if (na <= 4) return 4;
    return t == QT_Q8_0 || t == QT_Q4_0 ? 2 : 4;
}

extern "C" {

bool hc_gemv_supports(qt_type t) {
    layout L;
    return layout_of(t, &L);
}

void hc_weight_free(hc_weight *w) {
    if (!w) return;
    hc_free(w->mem);
    memset(w, 0, sizeof *w);
}

hn_status hc_weight_upload(hc_weight *w, qt_type t, int64_t k, int64_t n, const void *host, hn_err *err) {
    memset(w, 0, sizeof *w);
    layout L;
    if (!layout_of(t, &L)) return hn_errf(err, HN_ERR_UNSUPPORTED, "cuda: no matrix-vector kernel for type %d", (int)t);
    if (k <= 0 || n <= 0 || k % L.blck || k > (1 << 28) || n > (1 << 28) || !host)
        return hn_errf(err, HN_ERR_INVALID, "cuda: bad weight shape %lld x %lld for a type of %d-element blocks",
                       (long long)n, (long long)k, L.blck);
    const int64_t nblocks = n * (k / L.blck);
    const size_t bytes = (size_t)nblocks * (size_t)L.size;
    size_t plane_off[4], total = 0;
    for (int p = 0; p < L.nplanes; p++) {
        plane_off[p] = total;
        total += ((size_t)nblocks * (size_t)L.len[p] + 255) & ~(size_t)255;
    }
    hn_status st = hc_malloc(&w->mem, total, err);
    if (st) return st;
    w->type = t;
    w->k = k;
    w->n = n;
    w->gguf_bytes = bytes;
    for (int p = 0; p < L.nplanes; p++) w->plane[p] = (const uint8_t *)w->mem + plane_off[p];
    if (L.nplanes == 1) {
        st = hc_upload(w->mem, host, bytes, err);
    } else {
        void *stage = NULL;
        st = hc_malloc(&stage, bytes, err);
        if (!st) st = hc_upload(stage, host, bytes, err);
        if (!st) {
            planes_arg a;
            memset(&a, 0, sizeof a);
            for (int p = 0; p < L.nplanes; p++) {
                a.dst[p] = (uint8_t *)w->mem + plane_off[p];
                a.off[p] = L.off[p];
                a.len[p] = L.len[p];
            }
            a.np = L.nplanes;
            a.size = L.size;
            const int64_t grid = (nblocks + 255) / 256;
            repack<<<(unsigned)(grid < 65536 ? grid : 65536), 256>>>((const uint8_t *)stage, nblocks, a);
            cudaError_t e = cudaGetLastError();
            if (e == cudaSuccess) e = cudaDeviceSynchronize();
            if (e != cudaSuccess) st = hc_fail(err, e, "weight repack");
        }
        hc_free(stage);
    }
    if (st) hc_weight_free(w);
    return st;
}

hn_status hc_weight_clone(hc_weight *dst, const hc_weight *src, hn_err *err) {
    memset(dst, 0, sizeof *dst);
    layout L;
    if (!src || !src->mem || !layout_of(src->type, &L))
        return hn_errf(err, HN_ERR_INVALID, "cuda: weight clone: no weight to copy");
    const int64_t nblocks = src->n * (src->k / L.blck);
    size_t total = 0;
    for (int p = 0; p < L.nplanes; p++) total += ((size_t)nblocks * (size_t)L.len[p] + 255) & ~(size_t)255;
    hn_status st = hc_malloc(&dst->mem, total, err);
    if (st) return st;
    cudaError_t e = cudaMemcpy(dst->mem, src->mem, total, cudaMemcpyDeviceToDevice);
    if (e != cudaSuccess) {
        hc_weight_free(dst);
        return hc_fail(err, e, "weight clone");
    }
    dst->type = src->type;
    dst->k = src->k;
    dst->n = src->n;
    dst->gguf_bytes = src->gguf_bytes;
    for (int p = 0; p < 4; p++)
        if (src->plane[p]) dst->plane[p] = (const uint8_t *)dst->mem + (src->plane[p] - (const uint8_t *)src->mem);
    return HN_OK;
}

hn_status hc_gemv_scratch_init_rows(hc_gemv_scratch *s, int64_t max_k, int max_rows, hn_err *err) {
    memset(s, 0, sizeof *s);
    if (max_k <= 0 || max_k % 32 || max_k > (1 << 28))
        return hn_errf(err, HN_ERR_INVALID, "cuda: gemv scratch: bad row length %lld", (long long)max_k);
    if (max_rows < HC_GEMV_MAX_ROWS || max_rows > 65535)
        return hn_errf(err, HN_ERR_INVALID, "cuda: gemv scratch: %d rows (%d..65535)", max_rows, HC_GEMV_MAX_ROWS);
    const size_t vals = (size_t)max_rows * (size_t)max_k;
    hn_status st = hc_malloc((void **)&s->xq, vals, err);
    if (!st) st = hc_malloc((void **)&s->xd, sizeof(float) * (vals / 32), err);
    if (!st) st = hc_malloc((void **)&s->xs, sizeof(float) * (vals / 32), err);
    if (!st) st = hc_malloc(&s->xh, 2 * vals, err);
    if (!st) st = hc_malloc((void **)&s->xe, sizeof(float) * (size_t)max_rows, err);
    if (st) {
        hc_gemv_scratch_free(s);
        return st;
    }
    s->max_k = max_k;
    s->max_rows = max_rows;
    return HN_OK;
}

hn_status hc_gemv_scratch_init(hc_gemv_scratch *s, int64_t max_k, hn_err *err) {
    return hc_gemv_scratch_init_rows(s, max_k, HC_GEMV_MAX_ROWS, err);
}

void hc_gemv_scratch_free(hc_gemv_scratch *s) {
    if (!s) return;
    hc_free(s->xq);
    hc_free(s->xd);
    hc_free(s->xs);
    hc_free(s->xh);
    hc_free(s->xe);
    memset(s, 0, sizeof *s);
}

static hn_status check_args(const hc_weight *w, const float *x, int na, const float *y, hn_err *err) {
    if (!w || !w->mem || !x || !y) return hn_errf(err, HN_ERR_INVALID, "cuda: gemv: missing weight, input or output");
    if (!hc_gemv_supports(w->type)) return hn_errf(err, HN_ERR_UNSUPPORTED, "cuda: gemv: unsupported type %d", (int)w->type);
    if (na < 1 || na > HC_GEMV_MAX_ROWS)
        return hn_errf(err, HN_ERR_INVALID, "cuda: gemv: %d activation rows (1..%d)", na, HC_GEMV_MAX_ROWS);
    return HN_OK;
}

/* the quantized-x scratch holds rows of w's length */
static hn_status scratch_check(const hc_weight *w, const hc_gemv_scratch *s, hn_err *err) {
    if (!s || !s->xq || w->k > s->max_k)
        return hn_errf(err, HN_ERR_INVALID, "cuda: gemv: row length %lld over the scratch's %lld", (long long)w->k,
                       (long long)(s ? s->max_k : 0));
    return HN_OK;
}

/* x [na][k] quantized for w's type into the scratch (unless reuse), and its view */
static hn_status quant_rows(const hc_weight *w, const float *x, int na, hc_gemv_scratch *s, bool reuse, cudaStream_t cs,
                            xview *xv, hn_err *err) {
    const int64_t nb = w->k / 32;
    if (!reuse) {
        if (hc_gemv_act(w->type) == HC_ACT_Q8_K)
            hc_launch(quant_x256, dim3((unsigned)(w->k / 256), (unsigned)na), 256, 0, cs, x, w->k, s->xq, s->xd, s->xs);
        else
            hc_launch(quant_x32, dim3((unsigned)((nb + 3) / 4), (unsigned)na), 128, 0, cs, x, w->k, s->xq, s->xd, s->xs);
        HC_LAUNCHED(err, "activation quantization kernel");
    }
    *xv = xview{s->xq, s->xd, s->xs, w->k, nb};
    return HN_OK;
}

hn_status hc_quant_rows(const hc_weight *w, const float *x, int na, hc_gemv_scratch *s, int reuse_x, void *stream,
                        hn_err *err) {
    hn_status st = scratch_check(w, s, err);
    if (st) return st;
    if (na < 1 || na > s->max_rows)
        return hn_errf(err, HN_ERR_INVALID, "cuda: %d activation rows over the scratch's %d", na, s->max_rows);
    xview xv;
    return quant_rows(w, x, na, s, reuse_x != 0, (cudaStream_t)stream, &xv, err);
}

hc_gemv_params hc_gemv_resolve(const hc_weight *w, int na, const hc_gemv_params *p) {
    hc_gemv_params r = {0, 0, HC_GEMV_UNITS, WARPS};
    r.rows_per_warp = w ? default_rpw(w->type, na, w->n) : 1;
    if (p) {
        if (p->rows_per_warp) r.rows_per_warp = p->rows_per_warp;
        if (p->units) r.units = p->units;
        if (p->warps) r.warps = p->warps;
        r.reuse_x = p->reuse_x;
    }
    return r;
}

static hn_status params_check(const hc_gemv_params *r, hn_err *err) {
    const int rpw = r->rows_per_warp, u = r->units, wp = r->warps;
    if ((rpw != 1 && rpw != 2 && rpw != 4) || (u != 4 && u != 8) || (wp != 2 && wp != 4 && wp != MAX_WARPS))
        return hn_errf(err, HN_ERR_INVALID, "cuda: gemv: rows per warp %d (1, 2 or 4), units %d (4 or 8), warps %d (2, 4 or 8)",
                       rpw, u, wp);
    return HN_OK;
}

/* blocks of warps x rpw rows over n rows */
static unsigned grid_of(int64_t n, const hc_gemv_params *r) {
    const int64_t per = (int64_t)r->warps * r->rows_per_warp;
    return (unsigned)((n + per - 1) / per);
}

hn_status hc_gemv(const hc_weight *w, const float *x, int na, float *y, hc_gemv_scratch *s, const hc_gemv_params *p,
                  void *stream, hn_err *err) {
    hn_status st = check_args(w, x, na, y, err);
    if (st) return st;
    cudaStream_t cs = (cudaStream_t)stream;
    const hc_gemv_params r = hc_gemv_resolve(w, na, p);
    if ((st = params_check(&r, err))) return st;
    const unsigned grid = grid_of(w->n, &r), block = (unsigned)(32 * r.warps);
    if (is_float_type(w->type)) {
        if (w->k % 8) { /* rows not 16-byte aligned: the scalar path (bf16: on rounded x, as below) */
            if (w->type == QT_F16) return hc_gemv_ref(w, x, na, y, stream, err);
            hc_launch(mmv_ref<QT_BF16, true>, dim3((unsigned)((w->n + 127) / 128), (unsigned)na), 128, 0, cs, wview_of(w), x, y);
            HC_LAUNCHED(err, "gemv kernel");
            return HN_OK;
        }
        fkern f = w->type == QT_F16 ? pick_f<QT_F16>(na, r.rows_per_warp, r.units)
                                    : pick_f<QT_BF16>(na, r.rows_per_warp, r.units);
        hc_launch(f, grid, block, 0, cs, wview_of(w), x, y);
        HC_LAUNCHED(err, "gemv kernel");
        return HN_OK;
    }
    if ((st = scratch_check(w, s, err))) return st;
    xview xv;
    st = quant_rows(w, x, na, s, r.reuse_x, cs, &xv, err);
    if (st) return st;
    mwview mw;
    memset(&mw, 0, sizeof mw);
    mw.w[0] = wview_of(w);
    mw.y[0] = y;
    mw.nw = 1;
    hc_launch(qkernel(w->type, na, r.rows_per_warp, r.units), grid, block, 0, cs, mw, xv);
    HC_LAUNCHED(err, "gemv kernel");
    return HN_OK;
}

bool hc_gemv_slots_supports(qt_type t) { return ekernel(t, 1) != NULL; }

} /* extern "C" */

/* the slots of an expert-slot launch in chunks of whole activation rows that
 * the scratch holds, x quantized per chunk: launch(rows per warp, grid,
 * block, the chunk's x, its first slot) */
template <typename L>
static hn_status slots_chunks(const hc_weight *w, int64_t nr, const float *x, int slots, int ks, hc_gemv_scratch *s,
                              int reuse_x, cudaStream_t cs, const char *what, hn_err *err, L launch) {
    hc_gemv_params r = hc_gemv_resolve(w, 1, NULL);
    r.rows_per_warp = default_rpw(w->type, 1, nr);
    const unsigned grid = grid_of(nr, &r), block = (unsigned)(32 * r.warps);
    const int per = ks ? ks : 1;
    int rows_max = s->max_rows < 65535 / per ? s->max_rows : 65535 / per;
    if (rows_max < 1) rows_max = 1;
    const int nx = ks ? (slots + ks - 1) / ks : slots;
    if (reuse_x && nx > rows_max)
        return hn_errf(err, HN_ERR_INVALID, "cuda: %s: %d activation rows to reuse over the scratch's %d", what, nx,
                       rows_max);
    for (int r0 = 0; r0 < nx; r0 += rows_max) {
        const int nrow = nx - r0 < rows_max ? nx - r0 : rows_max;
        const int s0 = r0 * per, s1 = (r0 + nrow) * per < slots ? (r0 + nrow) * per : slots;
        xview xv;
        hn_status st = quant_rows(w, x + (int64_t)r0 * w->k, nrow, s, reuse_x != 0, cs, &xv, err);
        if (st) return st;
        launch(r.rows_per_warp, dim3(grid, (unsigned)(s1 - s0)), block, xv, s0);
        HC_LAUNCHED(err, what);
    }
    return HN_OK;
}

extern "C" {

hn_status hc_gemv_slots(const hc_weight *w, int64_t nr, int mats, const float *x, int slots, int ks,
                        const int32_t *ids, int mat, float *y, hc_gemv_scratch *s, int reuse_x, void *stream,
                        hn_err *err) {
    if (!w || !w->mem || !x || !y || (!ids && (mat < 0 || mat >= mats)))
        return hn_errf(err, HN_ERR_INVALID, "cuda: gemv slots: missing weight, input, output or matrix");
    if (!hc_gemv_slots_supports(w->type))
        return hn_errf(err, HN_ERR_UNSUPPORTED, "cuda: gemv slots: unsupported type %d", (int)w->type);
    if (nr < 1 || mats < 1 || nr * mats != w->n || slots < 0 || ks < 0)
        return hn_errf(err, HN_ERR_INVALID, "cuda: gemv slots: %d matrices of %lld rows in %lld", mats, (long long)nr,
                       (long long)w->n);
    hn_status st = scratch_check(w, s, err);
    if (st || slots == 0) return st;
    cudaStream_t cs = (cudaStream_t)stream;
    return slots_chunks(w, nr, x, slots, ks, s, reuse_x, cs, "gemv slots", err,
                        [&](int rpw, dim3 g, unsigned block, const xview &xv, int s0) {
                            hc_launch(ekernel(w->type, rpw), g, block, 0, cs, wview_of(w), nr, mats, xv, ids, mat, s0,
                                      ks, y);
                        });
}

hn_status hc_gemv_slots2(const hc_weight *wg, const hc_weight *wu, int64_t nr, int mats, const float *x, int slots,
                         int ks, const int32_t *ids, float *yg, float *yu, float *h, hc_gemv_scratch *s, int reuse_x,
                         void *stream, hn_err *err) {
    if (!wg || !wg->mem || !wu || !wu->mem || !x || !yg || !yu || !ids)
        return hn_errf(err, HN_ERR_INVALID, "cuda: gemv slots2: missing weight, input, output or ids");
    if (!hc_gemv_slots_supports(wg->type) || wu->type != wg->type || wu->k != wg->k || wu->n != wg->n)
        return hn_errf(err, HN_ERR_UNSUPPORTED, "cuda: gemv slots2: types %d and %d, %lld x %lld and %lld x %lld",
                       (int)wg->type, (int)wu->type, (long long)wg->n, (long long)wg->k, (long long)wu->n,
                       (long long)wu->k);
    if (nr < 1 || mats < 1 || nr * mats != wg->n || slots < 0 || ks < 0)
        return hn_errf(err, HN_ERR_INVALID, "cuda: gemv slots2: %d matrices of %lld rows in %lld", mats, (long long)nr,
                       (long long)wg->n);
    hn_status st = scratch_check(wg, s, err);
    if (st || slots == 0) return st;
    cudaStream_t cs = (cudaStream_t)stream;
    return slots_chunks(wg, nr, x, slots, ks, s, reuse_x, cs, "gemv slots2", err,
                        [&](int rpw, dim3 g, unsigned block, const xview &xv, int s0) {
                            hc_launch(ekernel2(wg->type, rpw), g, block, 0, cs, wview_of(wg), wview_of(wu), nr, mats,
                                      xv, ids, s0, ks, yg, yu, h);
                        });
}

int hc_gemv_multi_ok(int n_w, const hc_weight *const *w, int na, const hc_gemv_params *p) {
    if (n_w < 1 || n_w > GEMV_MULTI || na < 1 || na > HC_GEMV_MAX_ROWS) return 0;
    hc_gemv_params r0 = hc_gemv_resolve(w[0], na, p);
    for (int i = 0; i < n_w; i++) {
        if (!w[i] || !w[i]->mem || is_float_type(w[i]->type) || !hc_gemv_supports(w[i]->type)) return 0;
        const hc_gemv_params r = hc_gemv_resolve(w[i], na, p);
        if (w[i]->type != w[0]->type || w[i]->k != w[0]->k || r.rows_per_warp != r0.rows_per_warp ||
            r.units != r0.units || r.warps != r0.warps)
            return 0;
    }
    return 1;
}

hn_status hc_gemv_multi(int n_w, const hc_weight *const *w, const float *x, int na, float *const *y,
                        hc_gemv_scratch *s, const hc_gemv_params *p, void *stream, hn_err *err) {
    if (!hc_gemv_multi_ok(n_w, w, na, p))
        return hn_errf(err, HN_ERR_INVALID, "cuda: gemv_multi: weights that cannot share one launch");
    for (int i = 0; i < n_w; i++) {
        hn_status st = check_args(w[i], x, na, y[i], err);
        if (st) return st;
    }
    hn_status st = scratch_check(w[0], s, err);
    if (st) return st;
    cudaStream_t cs = (cudaStream_t)stream;
    const hc_gemv_params r = hc_gemv_resolve(w[0], na, p);
    if ((st = params_check(&r, err))) return st;
    xview xv;
    st = quant_rows(w[0], x, na, s, r.reuse_x != 0, cs, &xv, err);
    if (st) return st;
    mwview mw;
    memset(&mw, 0, sizeof mw);
    unsigned grid = 0;
    for (int i = 0; i < n_w; i++) {
        mw.w[i] = wview_of(w[i]);
        mw.y[i] = y[i];
        mw.b0[i] = grid;
        grid += grid_of(w[i]->n, &r);
    }
    mw.nw = n_w;
    hc_launch(qkernel(w[0]->type, na, r.rows_per_warp, r.units), grid, (unsigned)(32 * r.warps), 0, cs, mw, xv);
    HC_LAUNCHED(err, "gemv kernel");
    return HN_OK;
}

hn_status hc_gemv_ref(const hc_weight *w, const float *x, int na, float *y, void *stream, hn_err *err) {
    hn_status st = check_args(w, x, na, y, err);
    if (st) return st;
    hc_launch(rkernel(w->type), dim3((unsigned)((w->n + 127) / 128), (unsigned)na), 128, 0, (cudaStream_t)stream, wview_of(w), x, y);
    HC_LAUNCHED(err, "reference gemv kernel");
    return HN_OK;
}

bool hc_mmq_supports(qt_type t) { return mkernel(t) != NULL; }

hn_status hc_mmq(const hc_weight *w, const float *x, int na, float *y, hc_gemv_scratch *s, const hc_gemv_params *p,
                 void *stream, hn_err *err) {
    if (!w || !w->mem || !x || !y) return hn_errf(err, HN_ERR_INVALID, "cuda: mmq: missing weight, input or output");
    mkern f = mkernel(w->type);
    if (!f) return hn_errf(err, HN_ERR_UNSUPPORTED, "cuda: mmq: unsupported type %d", (int)w->type);
    if (!s || !s->xq || w->k > s->max_k || na < 1 || na > s->max_rows)
        return hn_errf(err, HN_ERR_INVALID, "cuda: mmq: %d rows of %lld over the scratch's %d of %lld", na,
                       (long long)w->k, s ? s->max_rows : 0, (long long)(s ? s->max_k : 0));
    cudaStream_t cs = (cudaStream_t)stream;
    xview xv;
    hn_status st = quant_rows(w, x, na, s, p && p->reuse_x, cs, &xv, err);
    if (st) return st;
    const dim3 grid((unsigned)((w->n + MQ_BM - 1) / MQ_BM), (unsigned)((na + MQ_BN - 1) / MQ_BN));
    hc_launch(f, grid, MQ_THREADS, 0, cs, wview_of(w), xv, na, y);
    HC_LAUNCHED(err, "mmq kernel");
    return HN_OK;
}

} /* extern "C" */
