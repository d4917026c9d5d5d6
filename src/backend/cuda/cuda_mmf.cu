/* cuda_mmf.cu: prefill's matrix-matrix products on the tensor cores
 * (hc_mmf; cuda.h has the contract): mmi for the integer types (int8 mma,
 * the CPU's integer dots, below), mmf for f16 weights (f16 mma, f32 sums).
 *
 * A row's result depends only on that row: every output is the same chain
 * of mmas and scalings over k in the same order whatever the number of rows
 * or the rows around it (no split over k), so prefill is batch-invariant by
 * itself; it is NOT hc_gemv's bits (the float summation order differs:
 * decode rows and rowwise rows take the gemv; the backend chooses per row,
 * DESIGN.md).
 *
 * Tiling (both). A block computes 128 weight rows x 128 activation rows
 * with 8 warps, each 64 x 32 (4 x 4 tiles of the mma); a step covers 64
 * values of k. Loads run two steps ahead of the mmas, in three stages
 * (global -> shared by cp.async: activations, f16 weights, the integer
 * weights' raw bytes, which the thread that copied them decodes into one of
 * two shared buffers after the step's mmas), one barrier a step. Shared rows are padded
 * (f16: 72 halfs, int8: 80 bytes) so that ldmatrix reads 8 rows without
 * bank conflicts.
 *
 * f16 weights: x is converted to f16 (as the CPU's f16 dot converts it),
 * the row scaled by a power of two 2^-e (e >= 0, from the row's largest
 * value) so that no value can pass f16's range, and the output multiplied
 * back (exact). */
#include <stdint.h>
#include <string.h>

#include <cuda_fp16.h>

#include "cuda_int.cuh"
#include "cuda_units.cuh"

#define MF_BM 128
#define MF_BN 128
#define MF_BK 64
#define MF_LD 72
#define MF_THREADS 256
#define MF_ST 3
#define MF_SMEM (MF_ST * (MF_BM + MF_BN) * MF_LD * 2) /* bytes: three stages of both tiles */


static __device__ __forceinline__ void ldsm4(unsigned (&r)[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(su32(p)));
}
/* d += a (16 x 16 f16, row-major) . b (16 x 8 f16, column-major), f32 accumulators */
static __device__ __forceinline__ void mma_h(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

static __global__ void __launch_bounds__(MF_THREADS, 1)
    mmf(wview w, const __half *__restrict__ xh, const float *__restrict__ xe, int na, float *__restrict__ y) {
    HC_PDL_ENTER();
    extern __shared__ uint4 mf_smem[];
    __half *sA = (__half *)mf_smem;               /* [MF_ST][MF_BM][MF_LD] */
    __half *sB = sA + MF_ST * MF_BM * MF_LD;       /* [MF_ST][MF_BN][MF_LD] */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = (warp & 1) * 64, wn = (warp >> 1) * 32;
    const int64_t j0 = (int64_t)blockIdx.x * MF_BM;
    const int r0 = (int)blockIdx.y * MF_BN;
    const int64_t K = w.k;
    const int nsteps = (int)(K / MF_BK);

    /* loads: row br of both tiles, chunks bc .. bc + 3 (16 bytes each) */
    const int br = tid >> 1, bc = (tid & 1) * 4;
    const int bxr = r0 + br < na ? r0 + br : na - 1;
    const int64_t brow = j0 + br < w.n ? j0 + br : w.n - 1;
    const __half *xrow = xh + (int64_t)bxr * K, *wrow = (const __half *)w.p[0] + brow * K;

    auto fetch = [&](int s, int b) {
        __half *dB = sB + ((size_t)b * MF_BN + br) * MF_LD, *dA = sA + ((size_t)b * MF_BM + br) * MF_LD;
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const int col = (bc + c) * 8;
            cpa16(dB + col, xrow + (int64_t)MF_BK * s + col);
            cpa16(dA + col, wrow + (int64_t)MF_BK * s + col);
        }
    };

    float acc[4][4][4];
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mi][ni][e] = 0.0f;

    /* loads run two steps ahead (stage s % MF_ST holds step s) */
    fetch(0, 0);
    asm volatile("cp.async.commit_group;" ::: "memory");
    if (nsteps > 1) fetch(1, 1);
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 1;" ::: "memory");
    __syncthreads();
    for (int s = 0; s < nsteps; s++) {
        const int b = s % MF_ST;
        if (s + 2 < nsteps) fetch(s + 2, (s + 2) % MF_ST);
        asm volatile("cp.async.commit_group;" ::: "memory");
        const __half *tA = sA + (size_t)b * MF_BM * MF_LD, *tB = sB + (size_t)b * MF_BN * MF_LD;
#pragma unroll
        for (int kk = 0; kk < MF_BK / 16; kk++) {
            unsigned af[4][4], bf[2][4];
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
                ldsm4(af[mi], tA + (wm + 16 * mi + (lane & 15)) * MF_LD + 16 * kk + (lane >> 4) * 8);
#pragma unroll
            for (int nj = 0; nj < 2; nj++)
                ldsm4(bf[nj], tB + (wn + 16 * nj + ((lane >> 4) << 3) + (lane & 7)) * MF_LD + 16 * kk +
                                  ((lane >> 3) & 1) * 8);
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
#pragma unroll
                for (int ni = 0; ni < 4; ni++)
                    mma_h(acc[mi][ni], af[mi], bf[ni >> 1][2 * (ni & 1)], bf[ni >> 1][2 * (ni & 1) + 1]);
        }
        asm volatile("cp.async.wait_group 1;" ::: "memory");
        __syncthreads();
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");

    const int gid = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int ni = 0; ni < 4; ni++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int C = r0 + wn + 8 * ni + 2 * tig + h;
            if (C >= na) continue;
            const float f = xe[C];
            float *yr = y + (int64_t)C * w.n;
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
#pragma unroll
                for (int g = 0; g < 2; g++) {
                    const int64_t R = j0 + wm + 16 * mi + gid + 8 * g;
                    if (R < w.n) yr[R] = acc[mi][ni][2 * g + h] * f;
                }
        }
}

/* ---- the integer types: int8 mma, the CPU's integer dots ----
 *
 * Decoded codes of the weights (int8) and the activations' Q8 codes go
 * through the int8 tensor cores (m16n8k32: one 32-value group a mma, whose
 * integer dot is exact); the scales are applied as the CPU's dot kernels
 * apply them: each group adds (f_w d_x) dot, f_w the group's weight
 * scale (a 32-block's d; a K-quant sub-block's d sc_j), minus the
 * K-quants' min terms (dmin m_j) (d_x sum_j); q6_K's scales cover 16
 * values (two k16 mmas a group). So the results differ from the CPU's only
 * in the float summation order (a K-quant's super-block sums sc_j dot_j in
 * integers first, as the CPU does: HC_MMI_ISUM): the golden tests'
 * tolerances hold as on the CPU.
 *
 * A step covers 64 values of k = two units of the gemv's layout, laid out
 * in shared memory as two 32-value groups of one scale each: for q4_K/q5_K
 * the units' runs A (one sub-block) then their runs B (the next), for the
 * others unit by unit. Each thread decodes one unit of one weight row into
 * codes and factors (IU below); the activation codes and their scales and
 * sums go global -> shared by cp.async, in the same column order. */

enum { IC_G32, IC_K32, IC_K16 };

/* a unit decoded for the integer kernel: codes of runs A and B, the runs'
 * integer scales, the min factors (q4_K/q5_K: dmin m), and the float factor
 * (32-block types: the block's scale; K-quants: the super-block's d) */
struct IU {
    int4 a, b;
    int sa, sb;
    float ma, mb, f;
};

template <int T> struct IT;
template <> struct IT<QT_Q4_0> {
    static constexpr int CL = IC_G32;
    static __device__ __forceinline__ IU dec(const TT<QT_Q4_0>::W &w, int) {
        const int4 l = lo4(w.q), h = hi4(w.q);
        const unsigned e = 0x08080808u;
        return IU{make_int4((int)__vsub4((unsigned)l.x, e), (int)__vsub4((unsigned)l.y, e), (int)__vsub4((unsigned)l.z, e),
                            (int)__vsub4((unsigned)l.w, e)),
                  make_int4((int)__vsub4((unsigned)h.x, e), (int)__vsub4((unsigned)h.y, e), (int)__vsub4((unsigned)h.z, e),
                            (int)__vsub4((unsigned)h.w, e)),
                  0, 0, 0.0f, 0.0f, h2f(w.d)};
    }
};
template <> struct IT<QT_Q8_0> {
    static constexpr int CL = IC_G32;
    static __device__ __forceinline__ IU dec(const TT<QT_Q8_0>::W &w, int) { return IU{w.q0, w.q1, 0, 0, 0.0f, 0.0f, h2f(w.d)}; }
};
template <> struct IT<QT_MXFP4> {
    static constexpr int CL = IC_G32;
    static __device__ __forceinline__ IU dec(const TT<QT_MXFP4>::W &w, int) {
        return IU{lut4(lo4(w.q), false), lut4(hi4(w.q), false), 0, 0, 0.0f, 0.0f, e8m0_half(w.e)};
    }
};
static __device__ __forceinline__ IU kdec(const int4 &h, int u, int4 a, int4 b) {
    const float d = h2f((unsigned short)(h.x & 0xffff)), dmin = h2f((unsigned short)((unsigned)h.x >> 16));
    int sa, ma, sb, mb;
    kscale_i(h, 2 * ((u & 7) >> 1), sa, ma);
    kscale_i(h, 2 * ((u & 7) >> 1) + 1, sb, mb);
    return IU{a, b, sa, sb, dmin * (float)ma, dmin * (float)mb, d};
}
template <> struct IT<QT_Q4_K> {
    static constexpr int CL = IC_K32;
    static __device__ __forceinline__ IU dec(const TT<QT_Q4_K>::W &w, int u) { return kdec(w.h, u, lo4(w.q), hi4(w.q)); }
};
template <> struct IT<QT_Q5_K> {
    static constexpr int CL = IC_K32;
    static __device__ __forceinline__ IU dec(const TT<QT_Q5_K>::W &w, int u) {
        const PU p = TT<QT_Q5_K>::prep(w, u);
        return kdec(w.h, u, p.a, p.b);
    }
};
template <> struct IT<QT_Q6_K> {
    static constexpr int CL = IC_K16;
    static __device__ __forceinline__ IU dec(const TT<QT_Q6_K>::W &w, int u) {
        const PU p = TT<QT_Q6_K>::prep(w, u);
        const int c4 = u & 3;
        return IU{p.a, p.b, (int)(int8_t)(w.sc.x >> (8 * c4)), (int)(int8_t)(w.sc.y >> (8 * c4)), 0.0f, 0.0f, h2f(w.d)};
    }
};
template <> struct IT<QT_IQ4_XS> {
    static constexpr int CL = IC_K32;
    static __device__ __forceinline__ IU dec(const TT<QT_IQ4_XS>::W &w, int u) {
        const int ib = u & 7;
        const int ls = iq4xs_scale(w.h, ib);
        return IU{lut4(lo4(w.q), true), lut4(hi4(w.q), true), ls, ls, 0.0f, 0.0f,
                  h2f((unsigned short)(w.h.x & 0xffff))};
    }
};

/* A unit's bytes copied global -> shared by cp.async (RW<T>::issue, by the
 * thread that decodes it) and read back as TT<T>::W (get): the 16-, 8- and
 * 4-byte fields directly, a 2- or 1-byte field (a block's f16 scale, an
 * mxfp4 exponent) as the aligned word that holds it. */
#define MI_RAW 64 /* bytes of a thread's raw slot */
template <int T> struct RW;
template <> struct RW<QT_Q4_0> {
    struct R { int4 q; unsigned d; };
    static __device__ __forceinline__ void issue(R *r, const wview &w, int64_t row, int u) {
        const int64_t b = row * (w.k / 32) + u;
        cpa16(&r->q, w.p[0] + b * 16);
        cpa4(&r->d, (const unsigned short *)w.p[1] + (b & ~(int64_t)1));
    }
    static __device__ __forceinline__ TT<QT_Q4_0>::W get(const R *r, const wview &w, int64_t row, int u) {
        const int64_t b = row * (w.k / 32) + u;
        return TT<QT_Q4_0>::W{r->q, (unsigned short)(r->d >> (16 * (b & 1)))};
    }
};
template <> struct RW<QT_Q8_0> {
    struct R { int4 q0, q1; unsigned d; };
    static __device__ __forceinline__ void issue(R *r, const wview &w, int64_t row, int u) {
        const int64_t b = row * (w.k / 32) + u;
        cpa16(&r->q0, w.p[0] + b * 32);
        cpa16(&r->q1, w.p[0] + b * 32 + 16);
        cpa4(&r->d, (const unsigned short *)w.p[1] + (b & ~(int64_t)1));
    }
    static __device__ __forceinline__ TT<QT_Q8_0>::W get(const R *r, const wview &w, int64_t row, int u) {
        const int64_t b = row * (w.k / 32) + u;
        return TT<QT_Q8_0>::W{r->q0, r->q1, (unsigned short)(r->d >> (16 * (b & 1)))};
    }
};
template <> struct RW<QT_Q4_K> {
    struct R { int4 q, h; };
    static __device__ __forceinline__ void issue(R *r, const wview &w, int64_t row, int u) {
        const uint8_t *blk = w.p[0] + (row * (w.k / 256) + (u >> 3)) * 144;
        cpa16(&r->h, blk);
        cpa16(&r->q, blk + 16 + 16 * (u & 7));
    }
    static __device__ __forceinline__ TT<QT_Q4_K>::W get(const R *r, const wview &, int64_t, int) {
        return TT<QT_Q4_K>::W{r->q, r->h};
    }
};
template <> struct RW<QT_Q5_K> {
    struct R { int4 q, qh, h; };
    static __device__ __forceinline__ void issue(R *r, const wview &w, int64_t row, int u) {
        const uint8_t *blk = w.p[0] + (row * (w.k / 256) + (u >> 3)) * 176;
        cpa16(&r->h, blk);
        cpa16(&r->qh, blk + 16 + 16 * (u & 1));
        cpa16(&r->q, blk + 48 + 16 * (u & 7));
    }
    static __device__ __forceinline__ TT<QT_Q5_K>::W get(const R *r, const wview &, int64_t, int) {
        return TT<QT_Q5_K>::W{r->q, r->qh, r->h};
    }
};
template <> struct RW<QT_Q6_K> {
    struct R { int4 ql, qh; uint2 sc; unsigned d; };
    static __device__ __forceinline__ void issue(R *r, const wview &w, int64_t row, int u) {
        const int64_t b = row * (w.k / 256) + (u >> 3);
        const int c = u & 7, hf = c >> 2;
        cpa16(&r->ql, w.p[0] + b * 128 + 16 * c);
        cpa16(&r->qh, w.p[1] + b * 64 + 32 * hf + 16 * (c & 1));
        cpa8(&r->sc, w.p[2] + b * 16 + 8 * hf);
        cpa4(&r->d, (const unsigned short *)w.p[3] + (b & ~(int64_t)1));
    }
    static __device__ __forceinline__ TT<QT_Q6_K>::W get(const R *r, const wview &w, int64_t row, int u) {
        const int64_t b = row * (w.k / 256) + (u >> 3);
        return TT<QT_Q6_K>::W{r->ql, r->qh, r->sc, (unsigned short)(r->d >> (16 * (b & 1)))};
    }
};
template <> struct RW<QT_IQ4_XS> {
    struct R { int4 q; uint2 h; };
    static __device__ __forceinline__ void issue(R *r, const wview &w, int64_t row, int u) {
        const int64_t b = row * (w.k / 256) + (u >> 3);
        cpa16(&r->q, w.p[0] + b * 128 + 16 * (u & 7));
        cpa8(&r->h, w.p[1] + b * 8);
    }
    static __device__ __forceinline__ TT<QT_IQ4_XS>::W get(const R *r, const wview &, int64_t, int) {
        return TT<QT_IQ4_XS>::W{r->q, r->h};
    }
};
template <> struct RW<QT_MXFP4> {
    struct R { int4 q; unsigned e; };
    static __device__ __forceinline__ void issue(R *r, const wview &w, int64_t row, int u) {
        const int64_t b = row * (w.k / 32) + u;
        cpa16(&r->q, w.p[0] + b * 16);
        cpa4(&r->e, w.p[1] + (b & ~(int64_t)3));
    }
    static __device__ __forceinline__ TT<QT_MXFP4>::W get(const R *r, const wview &w, int64_t row, int u) {
        const int64_t b = row * (w.k / 32) + u;
        return TT<QT_MXFP4>::W{r->q, (unsigned char)(r->e >> (8 * (b & 3)))};
    }
};

/* q4_K/q5_K: a step's groups are its sub-blocks (runs A, then runs B) */
template <int T> static constexpr bool RUN_MAJOR = T == QT_Q4_K || T == QT_Q5_K;
template <int T> static constexpr bool HAS_MIN = T == QT_Q4_K || T == QT_Q5_K;

/* the shared column of run r (0: A, 1: B) of unit au (0, 1) of a step */
template <int T>
static __device__ __forceinline__ int icol(int au, int r) {
    return RUN_MAJOR<T> ? 32 * r + 16 * au : 32 * au + 16 * r;
}

/* d = a (16 x 32 int8) . b (32 x 8 int8) + c */
static __device__ __forceinline__ void mma_i32(int (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1, int c) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(c));
}

/* the block's shape: HC_MMI_SMALL=1 builds 128 x 64 blocks of 8 warps of 32 x 32 (two blocks an
 * SM by the register bound) instead of 128 x 128 of 64 x 32 (one); the outputs are the same. A
 * build-time experiment: measured on an H200 it is 5-25% slower on every shape (bench/README.md),
 * so the default stays one block an SM. */
#ifndef HC_MMI_SMALL
#define HC_MMI_SMALL 0
#endif
#define MI_MT (HC_MMI_SMALL ? 2 : 4)    /* 16-row mma tiles a warp */
#define MI_WMW (HC_MMI_SMALL ? 4 : 2)   /* warps along the weight rows */
#define MI_BN (HC_MMI_SMALL ? 64 : 128) /* activation rows a block */
#define MI_MINB (HC_MMI_SMALL ? 2 : 1)
/* HC_MMI_ISUM (the default, 1): a K-quant sums sc_j dot_j in integers over its super-block (one
 * integer multiply-add per output and group, the float scaling once per 256 values, as the CPU
 * does) instead of scaling each group's dot in floats (HC_MMI_ISUM=0); the outputs differ in the
 * float rounding only. Measured on an H200: q4_K 9-12% and q6_K 30-33% faster. */
#ifndef HC_MMI_ISUM
#define HC_MMI_ISUM 1
#endif
#define MI_LD 80 /* bytes a shared row: 64 codes + 16 (ldmatrix without bank conflicts) */
#define MI_MAGIC 0x4B400000
/* per weight row and step: the groups' float scales (f; K16: each half's: d sc_j for a
 * K-quant), their integer scales (sc, HC_MMI_ISUM), the super-block's d (fd) and the min
 * factors (mn) */
struct WF {
    float f[4], mn[2], fd;
    int sc[4];
};
/* per activation row and step: the groups' scales and scaled sums */
struct XF {
    float d[2], s[2];
};
/* shared memory: decoded weight tiles and their factors in two buffers;
 * activation tiles, their factors and the threads' raw weight slots in
 * MI_ST stages (loads run two steps ahead of the mmas) */
#define MI_ST 3
#define MI_SMEM                                                                                              \
    (2 * MF_BM * MI_LD + MI_ST * MI_BN * MI_LD + 2 * MF_BM * (int)sizeof(WF) + MI_ST * MI_BN * (int)sizeof(XF) + \
     MI_ST * MF_THREADS * MI_RAW)

/* G (hc_mmf_slots): blockIdx.y is a tile of the sorted slots (gp: the
 * count of tiles, then (expert, first, count) per tile, the sorted slots at
 * gp + so), the weight rows those of matrix e (nr rows each), activation row
 * of slot q: q / ks (ks > 0) or q, output row q (nr wide) */
struct MG {
    const int32_t *gp;
    int so, ks;
    int64_t nr;
};

template <int T, bool G>
static __global__ void __launch_bounds__(MF_THREADS, MI_MINB)
    mmi(wview w, const int8_t *__restrict__ xq, const float *__restrict__ xd, const float *__restrict__ xs, int na,
        float *__restrict__ y, MG mg) {
    HC_PDL_ENTER();
    /* the block's weight rows: wb .. wb + wn_ of w (G: its tile's expert) */
    int64_t wb = 0, wn_ = w.n;
    int tcnt = 0, tfirst = 0;
    const int32_t *sorted = NULL;
    if (G) {
        if ((int)blockIdx.y >= mg.gp[0]) return;
        const int32_t *t = mg.gp + 1 + 3 * blockIdx.y;
        wb = (int64_t)t[0] * mg.nr;
        wn_ = mg.nr;
        tfirst = t[1];
        tcnt = t[2];
        sorted = mg.gp + mg.so;
    }
    constexpr int CL = IT<T>::CL;
    extern __shared__ uint4 mf_smem[];
    typedef typename RW<T>::R RR;
    static_assert(sizeof(RR) <= MI_RAW, "a unit's raw bytes fit the slot");
    unsigned char *sRaw = (unsigned char *)mf_smem;          /* [MI_ST][MF_THREADS][MI_RAW] (16-byte aligned) */
    unsigned char *sA = sRaw + MI_ST * MF_THREADS * MI_RAW; /* [2][MF_BM][MI_LD] */
    unsigned char *sB = sA + 2 * MF_BM * MI_LD;              /* [MI_ST][MI_BN][MI_LD] */
    WF *sW = (WF *)(sB + MI_ST * MI_BN * MI_LD);             /* [2][MF_BM] */
    XF *sX = (XF *)(sW + 2 * MF_BM);                         /* [MI_ST][MI_BN] */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = (warp % MI_WMW) * 16 * MI_MT, wn = (warp / MI_WMW) * 32;
    const int gid = lane >> 2, tig = lane & 3;
    const int64_t j0 = (int64_t)blockIdx.x * MF_BM;
    const int r0 = G ? 0 : (int)blockIdx.y * MI_BN;
    const int64_t K = w.k, nb32 = K / 32;
    const int nsteps = (int)(K / MF_BK);

    const int ar = tid & (MF_BM - 1), au = tid >> 7; /* weight loads: row ar, unit au of the step */
    const int64_t arow = wb + (j0 + ar < wn_ ? j0 + ar : wn_ - 1);
    /* activation loads: row br, unit bh (TPR 4: run brun of it only) */
    constexpr int TPR = MF_THREADS / MI_BN;
    static_assert(TPR == 2 || TPR == 4, "two or four threads an activation row");
    const int br = tid / TPR, bh = (tid % TPR) / (TPR / 2), brun = TPR == 4 ? (tid & 1) : 0;
    int bxr;
    if (G) {
        const int q = sorted[tfirst + (br < tcnt ? br : tcnt - 1)];
        bxr = mg.ks ? q / mg.ks : q;
    } else {
        bxr = r0 + br < na ? r0 + br : na - 1;
    }
    const int8_t *xrow = xq + (int64_t)bxr * K;

    /* the loads of step s into stage b: the activations (codes, scales,
     * sums) and this thread's unit of raw weight bytes */
    auto fetch = [&](int s, int b) {
        const int u = 2 * s + bh;
        int pa, pb;
        TT<T>::pos(u, pa, pb);
        unsigned char *dB = sB + ((size_t)b * MI_BN + br) * MI_LD;
        if (TPR == 2 || brun == 0) cpa16(dB + icol<T>(bh, 0), xrow + pa);
        if (TPR == 2 || brun == 1) cpa16(dB + icol<T>(bh, 1), xrow + pb);
        /* group bh's scale (and sum): the 32-block of the group's first value */
        int g0;
        if (RUN_MAJOR<T>) {
            int qa, qb;
            TT<T>::pos(2 * s, qa, qb);
            g0 = (bh ? qb : qa) / 32;
        } else {
            g0 = pa / 32;
        }
        XF *f = &sX[b * MI_BN + br];
        const int64_t xo = (int64_t)bxr * nb32 + g0;
        if (brun == 0) {
            cpa4(&f->d[bh], xd + xo);
            if (HAS_MIN<T>)
                cpa4(&f->s[bh], xs + xo);
        }
        RW<T>::issue((RR *)(sRaw + ((size_t)b * MF_THREADS + tid) * MI_RAW), w, arow, 2 * s + au);
    };
    /* this thread's unit of step s, from raw stage rb, decoded into buffer b */
    auto put = [&](int s, int rb, int b) {
        const int u = 2 * s + au;
        const IU v = IT<T>::dec(RW<T>::get((const RR *)(sRaw + ((size_t)rb * MF_THREADS + tid) * MI_RAW), w, arow, u), u);
        unsigned char *dA = sA + ((size_t)b * MF_BM + ar) * MI_LD;
        *(int4 *)(dA + icol<T>(au, 0)) = v.a;
        *(int4 *)(dA + icol<T>(au, 1)) = v.b;
        WF *f = &sW[b * MF_BM + ar];
        if (CL == IC_G32) {
            f->f[au] = v.f;
        } else if (CL == IC_K16) {
            f->f[2 * au] = v.f * (float)v.sa;
            f->f[2 * au + 1] = v.f * (float)v.sb;
            if (HC_MMI_ISUM) {
                f->sc[2 * au] = v.sa;
                f->sc[2 * au + 1] = v.sb;
                if (au == 0) f->fd = v.f;
            }
        } else if (RUN_MAJOR<T>) { /* both units carry the step's two sub-blocks' scales: unit 0 writes them */
            if (au == 0) {
                f->f[0] = v.f * (float)v.sa;
                f->f[1] = v.f * (float)v.sb;
                f->mn[0] = v.ma;
                f->mn[1] = v.mb;
                if (HC_MMI_ISUM) {
                    f->sc[0] = v.sa;
                    f->sc[1] = v.sb;
                    f->fd = v.f;
                }
            }
        } else { /* iq4_xs: a unit is a group */
            f->f[au] = v.f * (float)v.sa;
            if (HC_MMI_ISUM) {
                f->sc[au] = v.sa;
                if (au == 0) f->fd = v.f;
            }
        }
    };

    /* acc: the float sum; isum (K-quants): the super-block's sum of sc_j dot_j, exact */
    float acc[MI_MT][4][4];
    constexpr bool ISUM = CL != IC_G32 && HC_MMI_ISUM;
    int isum[ISUM ? MI_MT : 1][4][4];
#pragma unroll
    for (int mi = 0; mi < MI_MT; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                acc[mi][ni][e] = 0.0f;
                if (ISUM) isum[mi][ni][e] = 0;
            }

    /* loads run two steps ahead: stage s % 3 holds step s's activations and
     * raw weights; a thread waits for its own copies (cp.async.wait_group)
     * before it decodes its unit, and the barrier after the decode makes
     * every thread's copies and decodes visible to the mmas of the next step */
    fetch(0, 0);
    asm volatile("cp.async.commit_group;" ::: "memory");
    if (nsteps > 1) fetch(1, 1);
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 1;" ::: "memory");
    put(0, 0, 0);
    __syncthreads();
    for (int s = 0; s < nsteps; s++) {
        const int b = s & 1, st = s % MI_ST;
        if (s + 2 < nsteps) fetch(s + 2, (s + 2) % MI_ST);
        asm volatile("cp.async.commit_group;" ::: "memory");
        const unsigned char *tA = sA + (size_t)b * MF_BM * MI_LD, *tB = sB + (size_t)st * MI_BN * MI_LD;
        const WF *fw = sW + b * MF_BM;
        const XF *fx = sX + st * MI_BN;
#pragma unroll 1
        for (int g = 0; g < 2; g++) {
            unsigned af[MI_MT][4], bf[2][4];
#pragma unroll
            for (int mi = 0; mi < MI_MT; mi++)
                ldsm4(af[mi], tA + (wm + 16 * mi + (lane & 15)) * MI_LD + 32 * g + (lane >> 4) * 16);
#pragma unroll
            for (int nj = 0; nj < 2; nj++)
                ldsm4(bf[nj], tB + (wn + 16 * nj + ((lane >> 4) << 3) + (lane & 7)) * MI_LD + 32 * g + ((lane >> 3) & 1) * 16);
            /* the factors of this thread's rows (4 tiles x gid, gid + 8) and columns (4 tiles x 2 tig, + 1) */
            if (!ISUM) {
                /* each group's dot scaled in floats: (f_w d_x) dot [- (dmin m_j) (d_x sum_j)] */
                float rf[MI_MT][2][2], rm[MI_MT][2], cd[4][2], cs[4][2];
#pragma unroll
                for (int mi = 0; mi < MI_MT; mi++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const WF &q = fw[wm + 16 * mi + gid + 8 * h];
                        if (CL == IC_K16) {
                            rf[mi][h][0] = q.f[2 * g];
                            rf[mi][h][1] = q.f[2 * g + 1];
                        } else {
                            rf[mi][h][0] = q.f[g];
                        }
                        if (HAS_MIN<T>) rm[mi][h] = q.mn[g];
                    }
#pragma unroll
                for (int ni = 0; ni < 4; ni++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const XF &q = fx[wn + 8 * ni + 2 * tig + h];
                        cd[ni][h] = CL == IC_G32 ? q.d[g] : q.d[0];
                        if (HAS_MIN<T>) cs[ni][h] = q.s[g];
                    }
                if (CL != IC_K16) {
                    /* every mma of the group first (independent, pipelined), then the scalings */
                    int d[MI_MT][4][4];
#pragma unroll
                    for (int mi = 0; mi < MI_MT; mi++)
#pragma unroll
                        for (int ni = 0; ni < 4; ni++)
                            mma_i32(d[mi][ni], af[mi], bf[ni >> 1][2 * (ni & 1)], bf[ni >> 1][2 * (ni & 1) + 1],
                                    MI_MAGIC);
#pragma unroll
                    for (int mi = 0; mi < MI_MT; mi++)
#pragma unroll
                        for (int ni = 0; ni < 4; ni++)
#pragma unroll
                            for (int e = 0; e < 4; e++) {
                                float a = __fmaf_rn(__fmul_rn(rf[mi][e >> 1][0], cd[ni][e & 1]),
                                                    __fsub_rn(__int_as_float(d[mi][ni][e]), 12582912.0f),
                                                    acc[mi][ni][e]);
                                if (HAS_MIN<T>) a = __fmaf_rn(-rm[mi][e >> 1], cs[ni][e & 1], a);
                                acc[mi][ni][e] = a;
                            }
                } else {
#pragma unroll
                    for (int mi = 0; mi < MI_MT; mi++) {
                        int d[4][4], d2[4][4];
#pragma unroll
                        for (int ni = 0; ni < 4; ni++) {
                            mma_s8(d[ni], af[mi][0], af[mi][1], bf[ni >> 1][2 * (ni & 1)], 0);
                            mma_s8(d2[ni], af[mi][2], af[mi][3], bf[ni >> 1][2 * (ni & 1) + 1], 0);
                        }
#pragma unroll
                        for (int ni = 0; ni < 4; ni++)
#pragma unroll
                            for (int e = 0; e < 4; e++) {
                                const float c = cd[ni][e & 1];
                                float a = __fmaf_rn(__fmul_rn(rf[mi][e >> 1][0], c), (float)d[ni][e], acc[mi][ni][e]);
                                acc[mi][ni][e] = __fmaf_rn(__fmul_rn(rf[mi][e >> 1][1], c), (float)d2[ni][e], a);
                            }
                    }
                }
            } else {
                /* K-quants: isum += sc_j dot_j (integers, exact); the min terms (dmin m_j) (d_x sum_j) in floats */
                int rs[MI_MT][2][2];
                float rm[MI_MT][2], cs[4][2];
#pragma unroll
                for (int mi = 0; mi < MI_MT; mi++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const WF &q = fw[wm + 16 * mi + gid + 8 * h];
                        rs[mi][h][0] = q.sc[CL == IC_K16 ? 2 * g : g];
                        rs[mi][h][1] = CL == IC_K16 ? q.sc[2 * g + 1] : 0;
                        if (HAS_MIN<T>) rm[mi][h] = q.mn[g];
                    }
                if (HAS_MIN<T>)
#pragma unroll
                    for (int ni = 0; ni < 4; ni++)
#pragma unroll
                        for (int h = 0; h < 2; h++) cs[ni][h] = fx[wn + 8 * ni + 2 * tig + h].s[g];
#pragma unroll
                for (int mi = 0; mi < MI_MT; mi++) {
                    int d[4][4], d2[4][4];
#pragma unroll
                    for (int ni = 0; ni < 4; ni++) {
                        const unsigned b0 = bf[ni >> 1][2 * (ni & 1)], b1 = bf[ni >> 1][2 * (ni & 1) + 1];
                        if (CL == IC_K16) {
                            mma_s8(d[ni], af[mi][0], af[mi][1], b0, 0);
                            mma_s8(d2[ni], af[mi][2], af[mi][3], b1, 0);
                        } else {
                            mma_i32(d[ni], af[mi], b0, b1, 0);
                        }
                    }
#pragma unroll
                    for (int ni = 0; ni < 4; ni++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            int v = isum[mi][ni][e] + rs[mi][e >> 1][0] * d[ni][e];
                            if (CL == IC_K16) v += rs[mi][e >> 1][1] * d2[ni][e];
                            isum[mi][ni][e] = v;
                            if (HAS_MIN<T>)
                                acc[mi][ni][e] = __fmaf_rn(-rm[mi][e >> 1], cs[ni][e & 1], acc[mi][ni][e]);
                        }
                }
            }
        }
        if (ISUM && (s & 3) == 3) { /* the super-block's end: acc += (d d_x) isum */
            float rd[MI_MT][2], cd[4][2];
#pragma unroll
            for (int mi = 0; mi < MI_MT; mi++)
#pragma unroll
                for (int h = 0; h < 2; h++) rd[mi][h] = fw[wm + 16 * mi + gid + 8 * h].fd;
#pragma unroll
            for (int ni = 0; ni < 4; ni++)
#pragma unroll
                for (int h = 0; h < 2; h++) cd[ni][h] = fx[wn + 8 * ni + 2 * tig + h].d[0];
#pragma unroll
            for (int mi = 0; mi < MI_MT; mi++)
#pragma unroll
                for (int ni = 0; ni < 4; ni++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        acc[mi][ni][e] = __fmaf_rn(__fmul_rn(rd[mi][e >> 1], cd[ni][e & 1]),
                                                   (float)isum[mi][ni][e], acc[mi][ni][e]);
                        isum[mi][ni][e] = 0;
                    }
        }
        asm volatile("cp.async.wait_group 1;" ::: "memory");
        if (s + 1 < nsteps) put(s + 1, (s + 1) % MI_ST, b ^ 1);
        __syncthreads();
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");

#pragma unroll
    for (int ni = 0; ni < 4; ni++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int C = r0 + wn + 8 * ni + 2 * tig + h;
            if (C >= (G ? tcnt : na)) continue;
            float *yr = G ? y + (int64_t)sorted[tfirst + C] * wn_ : y + (int64_t)C * w.n;
#pragma unroll
            for (int mi = 0; mi < MI_MT; mi++)
#pragma unroll
                for (int g = 0; g < 2; g++) {
                    const int64_t R = j0 + wm + 16 * mi + gid + 8 * g;
                    if (R < wn_) yr[R] = acc[mi][ni][2 * g + h];
                }
        }
}

/* ---- f16 weights' activations: f16 rows, scaled by a power of two ---- */

/* the row's power-of-two factor from its largest magnitude bound m: 2^-e
 * with e >= 0 the least that takes m to 32768 or below */
static __device__ __forceinline__ float row_pow2(float m) {
    if (!(m > 32768.0f)) return 1.0f;
    int e;
    frexpf(m / 32768.0f, &e); /* m / 32768 in [2^(e-1), 2^e) */
    return ldexpf(1.0f, -e);
}

static __device__ __forceinline__ float block_max(float v, float *sh) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        v = threadIdx.x < blockDim.x / 32 ? sh[threadIdx.x] : 0.0f;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
        if (threadIdx.x == 0) sh[0] = v;
    }
    __syncthreads();
    return sh[0];
}

/* f16 weights: x itself -> f16 */
static __global__ void k_xh_f(const float *__restrict__ x, int64_t k, __half *__restrict__ xh, float *__restrict__ xe) {
    HC_PDL_ENTER();
    __shared__ float sh[32];
    const int r = blockIdx.x;
    const float *xr = x + (int64_t)r * k;
    float m = 0.0f;
    for (int64_t i = threadIdx.x; i < k; i += blockDim.x) m = fmaxf(m, fabsf(xr[i]));
    const float p = row_pow2(block_max(m, sh));
    if (threadIdx.x == 0) xe[r] = 1.0f / p;
    __half *o = xh + (int64_t)r * k;
    for (int64_t i = threadIdx.x; i < k; i += blockDim.x) o[i] = __float2half_rn(xr[i] * p);
}

typedef void (*mikern)(wview, const int8_t *, const float *, const float *, int, float *, MG);

static mikern mi_kernel(qt_type t, bool g = false) {
    switch (t) {
    case QT_Q4_0: return g ? mmi<QT_Q4_0, true> : mmi<QT_Q4_0, false>;
    case QT_Q8_0: return g ? mmi<QT_Q8_0, true> : mmi<QT_Q8_0, false>;
    case QT_Q4_K: return g ? mmi<QT_Q4_K, true> : mmi<QT_Q4_K, false>;
    case QT_Q5_K: return g ? mmi<QT_Q5_K, true> : mmi<QT_Q5_K, false>;
    case QT_Q6_K: return g ? mmi<QT_Q6_K, true> : mmi<QT_Q6_K, false>;
    case QT_IQ4_XS: return g ? mmi<QT_IQ4_XS, true> : mmi<QT_IQ4_XS, false>;
    case QT_MXFP4: return g ? mmi<QT_MXFP4, true> : mmi<QT_MXFP4, false>;
    default: return NULL;
    }
}

/* the slots sorted by expert (one block): counts, then per expert its tiles
 * of up to MI_BN slots (serially on thread 0: a few hundred experts), then
 * each slot's place (atomics: the order within an expert is not fixed, and
 * does not matter: a slot's result depends only on its row and expert).
 * gp: [0] the tile count, [1 + 3 t ..] tile t's (expert, first, count),
 * [so ..] the sorted slots. Slots with an expert outside [0, mats) are left
 * out (their outputs are not written). */
static __global__ void k_slot_sort(const int32_t *__restrict__ ids, int slots, int mats, int32_t *__restrict__ gp,
                                   int so) {
    HC_PDL_ENTER();
    extern __shared__ int32_t sc[]; /* [mats] counts, then [mats] fill positions */
    int32_t *cnt = sc, *pos = sc + mats;
    for (int e = threadIdx.x; e < mats; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (int q = threadIdx.x; q < slots; q += blockDim.x) {
        const int e = ids[q];
        if (e >= 0 && e < mats) atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int off = 0, nt = 0;
        for (int e = 0; e < mats; e++) {
            pos[e] = off;
            for (int f = 0; f < cnt[e]; f += MI_BN) {
                gp[1 + 3 * nt] = e;
                gp[2 + 3 * nt] = off + f;
                gp[3 + 3 * nt] = cnt[e] - f < MI_BN ? cnt[e] - f : MI_BN;
                nt++;
            }
            off += cnt[e];
        }
        gp[0] = nt;
    }
    __syncthreads();
    for (int q = threadIdx.x; q < slots; q += blockDim.x) {
        const int e = ids[q];
        if (e >= 0 && e < mats) gp[so + atomicAdd(&pos[e], 1)] = q;
    }
}

#define MI_SORT_MATS 4096 /* experts k_slot_sort counts in shared memory */
/* tiles of a sort: at most one partial tile an expert */
static int slot_tiles_max(int slots, int mats) { return (slots + MI_BN - 1) / MI_BN + mats; }

/* the kernels' dynamic shared memory, once per process (one device: hc_init) */
static hn_status mf_attrs(hn_err *err) {
    static bool done = false;
    if (done) return HN_OK;
    static const qt_type ts[7] = {QT_Q4_0, QT_Q8_0, QT_Q4_K, QT_Q5_K, QT_Q6_K, QT_IQ4_XS, QT_MXFP4};
    for (int t = 0; t < 7; t++)
        for (int g = 0; g < 2; g++)
            HC_TRY(cudaFuncSetAttribute(mi_kernel(ts[t], g), cudaFuncAttributeMaxDynamicSharedMemorySize, MI_SMEM), err,
                   "mmf kernel attributes");
    HC_TRY(cudaFuncSetAttribute(mmf, cudaFuncAttributeMaxDynamicSharedMemorySize, MF_SMEM), err, "mmf kernel attributes");
    done = true;
    return HN_OK;
}

extern "C" {

bool hc_mmf_supports(qt_type t) { return t == QT_F16 || mi_kernel(t) != NULL; }

bool hc_mmf_takes(const hc_weight *w) { return w && w->mem && hc_mmf_supports(w->type) && w->k % MF_BK == 0; }

hn_status hc_mmf(const hc_weight *w, const float *x, int na, float *y, hc_gemv_scratch *s, int reuse_x, void *stream,
                 hn_err *err) {
    if (!w || !w->mem || !x || !y) return hn_errf(err, HN_ERR_INVALID, "cuda: mmf: missing weight, input or output");
    if (!hc_mmf_takes(w))
        return hn_errf(err, HN_ERR_UNSUPPORTED, "cuda: mmf: type %d with rows of %lld", (int)w->type, (long long)w->k);
    if (!s || !s->xq || !s->xh || w->k > s->max_k || na < 1 || na > s->max_rows)
        return hn_errf(err, HN_ERR_INVALID, "cuda: mmf: %d rows of %lld over the scratch's %d of %lld", na,
                       (long long)w->k, s ? s->max_rows : 0, (long long)(s ? s->max_k : 0));
    hn_status st = mf_attrs(err);
    if (st) return st;
    cudaStream_t cs = (cudaStream_t)stream;
    const dim3 grid((unsigned)((w->n + MF_BM - 1) / MF_BM), (unsigned)((na + MF_BN - 1) / MF_BN));
    if (w->type == QT_F16) {
        __half *xh = (__half *)s->xh;
        hc_launch(k_xh_f, (unsigned)na, 256, 0, cs, x, w->k, xh, s->xe);
        HC_LAUNCHED(err, "mmf activation kernel");
        hc_launch(mmf, grid, MF_THREADS, MF_SMEM, cs, wview_of(w), xh, s->xe, na, y);
    } else {
        st = hc_quant_rows(w, x, na, s, reuse_x, stream, err);
        if (st) return st;
        const dim3 gi((unsigned)((w->n + MF_BM - 1) / MF_BM), (unsigned)((na + MI_BN - 1) / MI_BN));
        hc_launch(mi_kernel(w->type), gi, MF_THREADS, MI_SMEM, cs, wview_of(w), s->xq, s->xd, s->xs, na, y, MG{});
    }
    HC_LAUNCHED(err, "mmf kernel");
    return HN_OK;
}

size_t hc_mmf_slots_work(int slots, int mats) {
    if (slots < 0 || mats < 1) return 0;
    return sizeof(int32_t) * (size_t)(1 + 3 * slot_tiles_max(slots, mats) + slots);
}

bool hc_mmf_slots_takes(const hc_weight *w, int64_t nr, int mats) {
    return w && w->mem && mi_kernel(w->type) && w->k % MF_BK == 0 && nr >= 1 && mats >= 1 && nr * mats == w->n;
}

hn_status hc_mmf_slots(const hc_weight *w, int64_t nr, int mats, const float *x, int slots, int ks, const int32_t *ids,
                       float *y, hc_gemv_scratch *s, void *work, size_t work_bytes, void *stream, hn_err *err) {
    if (!w || !w->mem || !x || !y || !ids || !work)
        return hn_errf(err, HN_ERR_INVALID, "cuda: mmf slots: missing weight, input, output, ids or workspace");
    if (!hc_mmf_slots_takes(w, nr, mats))
        return hn_errf(err, HN_ERR_UNSUPPORTED, "cuda: mmf slots: type %d, %d matrices of %lld rows of %lld", (int)w->type,
                       mats, (long long)nr, (long long)w->k);
    if (slots < 1 || ks < 0 || mats > MI_SORT_MATS) return hn_errf(err, HN_ERR_INVALID, "cuda: mmf slots: %d slots of %d experts", slots, mats);
    const int rows = ks ? (slots + ks - 1) / ks : slots;
    if (!s || !s->xq || w->k > s->max_k || rows > s->max_rows)
        return hn_errf(err, HN_ERR_INVALID, "cuda: mmf slots: %d activation rows of %lld over the scratch's %d of %lld", rows,
                       (long long)w->k, s ? s->max_rows : 0, (long long)(s ? s->max_k : 0));
    const size_t need = hc_mmf_slots_work(slots, mats);
    if (work_bytes < need)
        return hn_errf(err, HN_ERR_INVALID, "cuda: mmf slots: a workspace of %zu bytes, %zu needed", work_bytes, need);
    hn_status st = mf_attrs(err);
    if (st) return st;
    cudaStream_t cs = (cudaStream_t)stream;
    st = hc_quant_rows(w, x, rows, s, 0, stream, err);
    if (st) return st;
    const int tmax = slot_tiles_max(slots, mats), so = 1 + 3 * tmax;
    int32_t *gp = (int32_t *)work;
    hc_launch(k_slot_sort, 1, 1024, sizeof(int32_t) * (size_t)(2 * mats), cs, ids, slots, mats, gp, so);
    HC_LAUNCHED(err, "mmf slots sort kernel");
    MG mg;
    mg.gp = gp;
    mg.so = so;
    mg.ks = ks;
    mg.nr = nr;
    const dim3 gi((unsigned)((nr + MF_BM - 1) / MF_BM), (unsigned)tmax);
    hc_launch(mi_kernel(w->type, true), gi, MF_THREADS, MI_SMEM, cs, wview_of(w), s->xq, s->xd, s->xs, rows, y, mg);
    HC_LAUNCHED(err, "mmf slots kernel");
    return HN_OK;
}

} /* extern "C" */
