/* cuda_mm.cu: the type-templated kernels of the cuda backend: get_rows and
 * the dequantizing matmuls (prefill, expert stacks, the types hc_gemv does
 * not take, reference mode). Correct before fast: weights are decoded one
 * element at a time, with the CPU's to_float arithmetic for the file layout
 * (explicitly rounded operations, so that nvcc contracts nothing into an FMA
 * and get_rows matches the CPU bit for bit) and cuda_wdec.cuh's decoder for
 * hc_weight's planes. */
#include <stdint.h>

#include <cuda_fp16.h>

#include "cuda_be_int.cuh"
#include "cuda_wdec.cuh"

/* ---- the file layout: element e of a row ---- */

static __device__ __forceinline__ unsigned short ld16(const uint8_t *p) { return *(const unsigned short *)p; }
/* 4 bytes at a 2-byte aligned address */
static __device__ __forceinline__ uint32_t ld32h(const uint8_t *p) {
    return (uint32_t)ld16(p) | ((uint32_t)ld16(p + 2) << 16);
}
static __device__ __forceinline__ int nib(const uint8_t *qs, int j) { return j < 16 ? qs[j] & 15 : qs[j - 16] >> 4; }

static __device__ __forceinline__ void k4sm(const uint8_t *q, int j, int *d, int *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

template <int T>
static __device__ float raw_get(const uint8_t *row, int64_t e) {
    if constexpr (T == QT_F32) return ((const float *)row)[e];
    else if constexpr (T == QT_F16) return h2f(((const unsigned short *)row)[e]);
    else if constexpr (T == QT_BF16) return __uint_as_float((unsigned)((const unsigned short *)row)[e] << 16);
    else if constexpr (T == QT_Q4_0) {
        const uint8_t *b = row + (e / 32) * 18;
        return __fmul_rn((float)(nib(b + 2, (int)(e % 32)) - 8), h2f(ld16(b)));
    } else if constexpr (T == QT_Q4_1) {
        const uint8_t *b = row + (e / 32) * 20;
        return __fadd_rn(__fmul_rn((float)nib(b + 4, (int)(e % 32)), h2f(ld16(b))), h2f(ld16(b + 2)));
    } else if constexpr (T == QT_Q5_0) {
        const uint8_t *b = row + (e / 32) * 22;
        const int j = (int)(e % 32);
        const int v = nib(b + 6, j) | (int)(((ld32h(b + 2) >> j) & 1) << 4);
        return __fmul_rn((float)(v - 16), h2f(ld16(b)));
    } else if constexpr (T == QT_Q5_1) {
        const uint8_t *b = row + (e / 32) * 24;
        const int j = (int)(e % 32);
        const int v = nib(b + 8, j) | (int)(((ld32h(b + 4) >> j) & 1) << 4);
        return __fadd_rn(__fmul_rn((float)v, h2f(ld16(b))), h2f(ld16(b + 2)));
    } else if constexpr (T == QT_Q8_0) {
        const uint8_t *b = row + (e / 32) * 34;
        return __fmul_rn((float)((const int8_t *)b)[2 + e % 32], h2f(ld16(b)));
    } else if constexpr (T == QT_IQ4_NL) {
        const uint8_t *b = row + (e / 32) * 18;
        return __fmul_rn(h2f(ld16(b)), (float)c_iq4[nib(b + 2, (int)(e % 32))]);
    } else if constexpr (T == QT_MXFP4) {
        const uint8_t *b = row + (e / 32) * 17;
        return __fmul_rn((float)c_fp4[nib(b + 1, (int)(e % 32))], e8m0_half(b[0]));
    } else if constexpr (T == QT_Q2_K) {
        const uint8_t *b = row + (e / 256) * 84;
        const int j = (int)(e % 256), n128 = j / 128, sh = (j % 128) / 32, half = (j % 32) / 16, l = j % 16;
        const uint8_t sc = b[n128 * 8 + sh * 2 + half];
        const float d = h2f(ld16(b + 80)), mn = h2f(ld16(b + 82));
        const float dl = __fmul_rn(d, (float)(sc & 0xf)), ml = __fmul_rn(mn, (float)(sc >> 4));
        const int q = (b[16 + 32 * n128 + l + 16 * half] >> (2 * sh)) & 3;
        return __fsub_rn(__fmul_rn(dl, (float)q), ml);
    } else if constexpr (T == QT_Q3_K) {
        const uint8_t *b = row + (e / 256) * 110;
        const int j = (int)(e % 256), n128 = j / 128, sh = (j % 128) / 32, half = (j % 32) / 16, l = j % 16;
        const int ll = l + 16 * half, is = n128 * 8 + sh * 2 + half;
        const uint8_t *s = b + 96;
        const int lo = is < 8 ? s[is] & 0xf : s[is - 8] >> 4, hi = (s[8 + is % 4] >> (2 * (is / 4))) & 3;
        const float dl = __fmul_rn(h2f(ld16(b + 108)), (float)((lo | (hi << 4)) - 32));
        const int m = 1 << (n128 * 4 + sh);
        const int q = ((b[32 + 32 * n128 + ll] >> (2 * sh)) & 3) - ((b[ll] & m) ? 0 : 4);
        return __fmul_rn(dl, (float)q);
    } else if constexpr (T == QT_Q4_K || T == QT_Q5_K) {
        const uint8_t *b = row + (e / 256) * (T == QT_Q4_K ? 144 : 176);
        const int j = (int)(e % 256), j64 = j / 64, w = j % 64, l = w % 32, is = 2 * j64 + (w >= 32);
        int sc, m;
        k4sm(b + 4, is, &sc, &m);
        const float d = __fmul_rn(h2f(ld16(b)), (float)sc), mn = __fmul_rn(h2f(ld16(b + 2)), (float)m);
        const uint8_t *ql = b + (T == QT_Q4_K ? 16 : 48) + 32 * j64;
        int v = w < 32 ? ql[l] & 0xf : ql[l] >> 4;
        if constexpr (T == QT_Q5_K) v += (b[16 + l] & (1 << (2 * j64 + (w >= 32)))) ? 16 : 0;
        return __fsub_rn(__fmul_rn(d, (float)v), mn);
    } else if constexpr (T == QT_Q6_K) {
        const uint8_t *b = row + (e / 256) * 210;
        const int j = (int)(e % 256), n128 = j / 128, w = j % 128, quarter = w / 32, l = w % 32;
        const uint8_t *ql = b + 64 * n128, *qh = b + 128 + 32 * n128;
        const int8_t *sc = (const int8_t *)(b + 192) + 8 * n128;
        const int lq = (quarter & 1) ? ql[l + 32] : ql[l];
        const int q = ((quarter >= 2 ? lq >> 4 : lq & 0xf) | (((qh[l] >> (2 * quarter)) & 3) << 4)) - 32;
        return __fmul_rn(__fmul_rn(h2f(ld16(b + 208)), (float)sc[l / 16 + 2 * quarter]), (float)q);
    } else if constexpr (T == QT_IQ4_XS) {
        const uint8_t *b = row + (e / 256) * 136;
        const int j = (int)(e % 256), ib = j / 32;
        const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xf) | (((ld16(b + 2) >> (2 * ib)) & 3) << 4);
        const float dl = __fmul_rn(h2f(ld16(b)), (float)(ls - 32));
        return __fmul_rn(dl, (float)c_iq4[nib(b + 8 + 16 * ib, j % 32)]);
    } else {
        return 0.0f;
    }
}

/* what a kernel receives: both forms, one used */
struct wsrc {
    const uint8_t *raw;
    size_t row_bytes;
    wview pv;
};

template <int T, bool PL>
static __device__ __forceinline__ float wget(const wsrc &w, int64_t row, int64_t e) {
    if constexpr (PL) return wref<T>(w.pv, row, e);
    else return raw_get<T>(w.raw + row * w.row_bytes, e);
}

static __device__ __forceinline__ float facc(float w, float x, float a) { return __fmaf_rn(w, x, a); }
static __device__ __forceinline__ double facc(float w, float x, double a) { return __fma_rn((double)w, (double)x, a); }

template <typename A>
static __device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* ---- kernels ---- */

template <int T, bool PL>
static __global__ void k_get_rows(wsrc w, int64_t k, int64_t rows, const int32_t *__restrict__ ids, float *__restrict__ out) {
    HC_PDL_ENTER();
    const int i = blockIdx.x;
    const int32_t id = ids[i];
    float *o = out + (int64_t)i * k;
    const bool ok = id >= 0 && id < rows;
    for (int64_t e = threadIdx.x; e < k; e += blockDim.x) o[e] = ok ? wget<T, PL>(w, id, e) : 0.0f;
}

#define MM_KC 2048 /* weight elements decoded into shared memory at a time (a multiple of 32) */
#define MM_RB 32   /* activation rows a block serves */
#define MM_WARPS 4

template <int T, bool PL, typename A>
static __global__ void __launch_bounds__(MM_WARPS * 32)
    k_mm_tile(wsrc w, int64_t row0, int64_t K, int64_t N, const float *__restrict__ x, int n, float *__restrict__ y) {
    HC_PDL_ENTER();
    __shared__ float ws[MM_KC];
    const int64_t j = blockIdx.x;
    const int r0 = blockIdx.y * MM_RB, warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    constexpr int PER = MM_RB / MM_WARPS;
    A acc[PER];
#pragma unroll
    for (int q = 0; q < PER; q++) acc[q] = 0;
    for (int64_t c0 = 0; c0 < K; c0 += MM_KC) {
        const int kc = (int)(K - c0 < MM_KC ? K - c0 : MM_KC);
        for (int i = threadIdx.x; i < kc; i += MM_WARPS * 32) ws[i] = wget<T, PL>(w, row0 + j, c0 + i);
        __syncthreads();
#pragma unroll
        for (int q = 0; q < PER; q++) {
            const int r = r0 + warp + MM_WARPS * q;
            if (r < n) {
                const float *xr = x + (int64_t)r * K + c0;
                A a = acc[q];
                for (int i = lane; i < kc; i += 32) a = facc(ws[i], xr[i], a);
                acc[q] = a;
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int q = 0; q < PER; q++) {
        const int r = r0 + warp + MM_WARPS * q;
        if (r < n) {
            const A v = warp_sum(acc[q]);
            if (lane == 0) y[(int64_t)r * N + j] = (float)v;
        }
    }
}

/* a few activation rows (decode: a MoE router's f32 matrix): one warp an
 * output, the tile kernel's order of operations (lane l sums i = l, l + 32,
 * ... in turn, then warp_sum), so the same bits, without the shared-memory
 * pass and its barriers that leave most of the tile kernel's warps idle */
#define MM_WW 8 /* warps (outputs) a block */
template <int T, bool PL>
static __global__ void __launch_bounds__(MM_WW * 32)
    k_mm_warp(wsrc w, int64_t row0, int64_t K, int64_t N, const float *__restrict__ x, int n, float *__restrict__ y) {
    HC_PDL_ENTER();
    const int64_t j = (int64_t)blockIdx.x * MM_WW + threadIdx.x / 32;
    const int r = blockIdx.y, lane = threadIdx.x & 31;
    if (j >= N || r >= n) return;
    const float *xr = x + (int64_t)r * K;
    float a = 0;
    for (int64_t i = lane; i < K; i += 32) a = facc(wget<T, PL>(w, row0 + j, i), xr[i], a);
    const float v = warp_sum(a);
    if (lane == 0) y[(int64_t)r * N + j] = v;
}
#define MM_WARP_MAX_ROWS 4 /* up to this many rows take k_mm_warp */

/* many rows of an f32 matrix (prefill: a MoE router's 2048 x 128): a warp
 * computes an MR x MJ tile of outputs, lane l holding the partial sums of
 * i = l, l + 32, ... of all of them (the tile kernel's order for each
 * output), then warp_sum on each: the tile kernel's bits, with MR + MJ loads
 * for MR MJ multiply-adds instead of two a multiply-add. HONE_CUDA_MMREG=1
 * (cm_matmul_tile's reg); NOT YET RUN ON A GPU, so not the default. */
#define MR_R 8      /* activation rows a warp */
#define MR_J 8      /* outputs a warp */
#define MR_WR 2     /* warps along the rows a block */
#define MR_WJ 2     /* warps along the outputs a block */
template <int T, bool PL>
static __global__ void __launch_bounds__(MR_WR * MR_WJ * 32)
    k_mm_reg(wsrc w, int64_t row0, int64_t K, int64_t N, const float *__restrict__ x, int n, float *__restrict__ y) {
    HC_PDL_ENTER();
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int r0 = (blockIdx.y * MR_WR + warp % MR_WR) * MR_R;
    const int64_t j0 = ((int64_t)blockIdx.x * MR_WJ + warp / MR_WR) * MR_J;
    if (r0 >= n || j0 >= N) return;
    /* rows and outputs past the end read the last valid one (not stored) */
    const float *xr[MR_R];
    int64_t wj[MR_J];
#pragma unroll
    for (int r = 0; r < MR_R; r++) xr[r] = x + (int64_t)(r0 + r < n ? r0 + r : n - 1) * K;
#pragma unroll
    for (int j = 0; j < MR_J; j++) wj[j] = row0 + (j0 + j < N ? j0 + j : N - 1);
    float acc[MR_R][MR_J];
#pragma unroll
    for (int r = 0; r < MR_R; r++)
#pragma unroll
        for (int j = 0; j < MR_J; j++) acc[r][j] = 0.0f;
#pragma unroll 2
    for (int64_t i = lane; i < K; i += 32) {
        float xv[MR_R], wv[MR_J];
#pragma unroll
        for (int r = 0; r < MR_R; r++) xv[r] = xr[r][i];
#pragma unroll
        for (int j = 0; j < MR_J; j++) wv[j] = wget<T, PL>(w, wj[j], i);
#pragma unroll
        for (int r = 0; r < MR_R; r++)
#pragma unroll
            for (int j = 0; j < MR_J; j++) acc[r][j] = facc(wv[j], xv[r], acc[r][j]);
    }
#pragma unroll
    for (int r = 0; r < MR_R; r++)
#pragma unroll
        for (int j = 0; j < MR_J; j++) {
            const float v = warp_sum(acc[r][j]);
            if (lane == 0 && r0 + r < n && j0 + j < N) y[(int64_t)(r0 + r) * N + j0 + j] = v;
        }
}

template <int T, bool PL, typename A>
static __global__ void __launch_bounds__(MM_WARPS * 32)
    k_mm_slots(wsrc w, int64_t K, int64_t N, int mats, const float *__restrict__ x, bool shared, int k,
               const int32_t *__restrict__ ids, float *__restrict__ y) {
    HC_PDL_ENTER();
    const int s = blockIdx.x, lane = threadIdx.x & 31;
    const int32_t e = ids[s];
    const float *xr = x + (int64_t)(shared ? s / k : s) * K;
    for (int64_t j = (int64_t)blockIdx.y * MM_WARPS + threadIdx.x / 32; j < N; j += (int64_t)gridDim.y * MM_WARPS) {
        if (e < 0 || e >= mats) {
            if (lane == 0) y[(int64_t)s * N + j] = 0.0f;
            continue;
        }
        A a = 0;
        for (int64_t i = lane; i < K; i += 32) a = facc(wget<T, PL>(w, (int64_t)e * N + j, i), xr[i], a);
        const A v = warp_sum(a);
        if (lane == 0) y[(int64_t)s * N + j] = (float)v;
    }
}

/* ---- dispatch ---- */

typedef void (*rows_fn)(wsrc, int64_t, int64_t, const int32_t *, float *);
typedef void (*tile_fn)(wsrc, int64_t, int64_t, int64_t, const float *, int, float *);
typedef void (*slots_fn)(wsrc, int64_t, int64_t, int, const float *, bool, int, const int32_t *, float *);

struct kset {
    rows_fn rows;
    tile_fn tile[2];
    tile_fn warp;
    slots_fn slots[2];
};

template <int T, bool PL>
static kset kset_of() {
    return kset{k_get_rows<T, PL>, {k_mm_tile<T, PL, float>, k_mm_tile<T, PL, double>}, k_mm_warp<T, PL>,
                {k_mm_slots<T, PL, float>, k_mm_slots<T, PL, double>}};
}

static bool pick(qt_type t, bool planes, kset *o) {
    if (planes) {
        switch (t) {
        case QT_Q4_0: *o = kset_of<QT_Q4_0, true>(); return true;
        case QT_Q8_0: *o = kset_of<QT_Q8_0, true>(); return true;
        case QT_Q4_K: *o = kset_of<QT_Q4_K, true>(); return true;
        case QT_Q5_K: *o = kset_of<QT_Q5_K, true>(); return true;
        case QT_Q6_K: *o = kset_of<QT_Q6_K, true>(); return true;
        case QT_IQ4_XS: *o = kset_of<QT_IQ4_XS, true>(); return true;
        case QT_MXFP4: *o = kset_of<QT_MXFP4, true>(); return true;
        case QT_F16: *o = kset_of<QT_F16, true>(); return true;
        case QT_BF16: *o = kset_of<QT_BF16, true>(); return true;
        default: return false;
        }
    }
    switch (t) {
    case QT_F32: *o = kset_of<QT_F32, false>(); return true;
    case QT_F16: *o = kset_of<QT_F16, false>(); return true;
    case QT_BF16: *o = kset_of<QT_BF16, false>(); return true;
    case QT_Q4_0: *o = kset_of<QT_Q4_0, false>(); return true;
    case QT_Q4_1: *o = kset_of<QT_Q4_1, false>(); return true;
    case QT_Q5_0: *o = kset_of<QT_Q5_0, false>(); return true;
    case QT_Q5_1: *o = kset_of<QT_Q5_1, false>(); return true;
    case QT_Q8_0: *o = kset_of<QT_Q8_0, false>(); return true;
    case QT_Q2_K: *o = kset_of<QT_Q2_K, false>(); return true;
    case QT_Q3_K: *o = kset_of<QT_Q3_K, false>(); return true;
    case QT_Q4_K: *o = kset_of<QT_Q4_K, false>(); return true;
    case QT_Q5_K: *o = kset_of<QT_Q5_K, false>(); return true;
    case QT_Q6_K: *o = kset_of<QT_Q6_K, false>(); return true;
    case QT_IQ4_NL: *o = kset_of<QT_IQ4_NL, false>(); return true;
    case QT_IQ4_XS: *o = kset_of<QT_IQ4_XS, false>(); return true;
    case QT_MXFP4: *o = kset_of<QT_MXFP4, false>(); return true;
    default: return false;
    }
}

static wsrc src_of(const cm_w *w) {
    wsrc s;
    s.raw = w->raw;
    s.row_bytes = w->row_bytes;
    for (int i = 0; i < 4; i++) s.pv.p[i] = w->plane[i];
    s.pv.k = w->k;
    s.pv.n = w->n * w->mats;
    return s;
}

bool cm_raw_supports(qt_type t) {
    kset k;
    return pick(t, false, &k);
}

cudaError_t cm_get_rows(cudaStream_t s, const cm_w *w, int n, const int32_t *ids, float *out) {
    kset k;
    if (!pick(w->type, w->planes, &k)) return cudaErrorNotSupported;
    if (n <= 0) return cudaSuccess;
    hc_launch(k.rows, (unsigned)n, 256, 0, s, src_of(w), w->k, w->n, ids, out);
    return cudaGetLastError();
}

cudaError_t cm_matmul_tile(cudaStream_t s, const cm_w *w, int mat, const float *x, int n, float *y, bool dbl,
                           bool reg) {
    kset k;
    if (!pick(w->type, w->planes, &k)) return cudaErrorNotSupported;
    if (n <= 0 || w->n <= 0) return cudaSuccess;
    if (reg && !dbl && n > MM_WARP_MAX_ROWS && w->type == QT_F32 && !w->planes) {
        const int64_t tj = (int64_t)MR_J * MR_WJ, tr = (int64_t)MR_R * MR_WR;
        dim3 grid((unsigned)((w->n + tj - 1) / tj), (unsigned)((n + tr - 1) / tr));
        hc_launch(k_mm_reg<QT_F32, false>, grid, MR_WR * MR_WJ * 32, 0, s, src_of(w), (int64_t)mat * w->n, w->k, w->n, x,
                  n, y);
        return cudaGetLastError();
    }
    if (!dbl && n <= MM_WARP_MAX_ROWS) {
        dim3 grid((unsigned)((w->n + MM_WW - 1) / MM_WW), (unsigned)n);
        hc_launch(k.warp, grid, MM_WW * 32, 0, s, src_of(w), (int64_t)mat * w->n, w->k, w->n, x, n, y);
        return cudaGetLastError();
    }
    dim3 grid((unsigned)w->n, (unsigned)((n + MM_RB - 1) / MM_RB));
    hc_launch(k.tile[dbl], grid, MM_WARPS * 32, 0, s, src_of(w), (int64_t)mat * w->n, w->k, w->n, x, n, y);
    return cudaGetLastError();
}

cudaError_t cm_matmul_slots(cudaStream_t s, const cm_w *w, const float *x, bool shared, int n, int k,
                            const int32_t *ids, float *y, bool dbl) {
    kset ks;
    if (!pick(w->type, w->planes, &ks)) return cudaErrorNotSupported;
    if (n <= 0 || k <= 0 || w->n <= 0) return cudaSuccess;
    const int64_t groups = (w->n + MM_WARPS - 1) / MM_WARPS;
    dim3 grid((unsigned)(n * k), (unsigned)(groups < 65535 ? groups : 65535));
    hc_launch(ks.slots[dbl], grid, MM_WARPS * 32, 0, s, src_of(w), w->k, w->n, (int)w->mats, x, shared, k, ids, y);
    return cudaGetLastError();
}

/* ---- the CPU's activation rounding (cuda_gemv.cu's quant_x32 / quant_x256
 * give the same codes and scales) ---- */

/* Q8_0 (and Q8_1's values): one warp a 32-block */
static __global__ void k_round32(const float *__restrict__ x, int64_t k, float *__restrict__ out) {
    HC_PDL_ENTER();
    const int64_t nb = k / 32, b = (int64_t)blockIdx.x * 4 + threadIdx.x / 32;
    const int64_t r = blockIdx.y;
    const int lane = threadIdx.x & 31;
    if (b >= nb) return;
    const float v = x[r * k + b * 32 + lane];
    const float amax = act_warp_amax(v);
    const float id = amax != 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
    const float d = __half2float(__float2half_rn(__fdiv_rn(amax, 127.0f)));
    out[r * k + b * 32 + lane] = __fmul_rn((float)act_q8(__fmul_rn(v, id)), d);
}

/* Q8_K: one block of 256 threads a 256-block */
static __global__ void k_round256(const float *__restrict__ x, int64_t k, float *__restrict__ out) {
    HC_PDL_ENTER();
    __shared__ float s_max[8];
    const int64_t B = blockIdx.x, r = blockIdx.y;
    const int t = threadIdx.x;
    const float v = x[r * k + B * 256 + t];
    const float m = act_block256_max(v, s_max);
    float o = 0.0f;
    if (m != 0.0f) {
        const float iscale = __fdiv_rn(-127.0f, m);
        o = __fmul_rn((float)act_q8(__fmul_rn(iscale, v)), __fdiv_rn(1.0f, iscale));
    }
    out[r * k + B * 256 + t] = o;
}

static __global__ void k_round_bf16(const float *__restrict__ x, int64_t n, float *__restrict__ out) {
    HC_PDL_ENTER();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        out[i] = act_bf16(x[i]);
    }
}

enum { R_NONE, R_BF16, R_32, R_256 };

static int round_kind(qt_type t) {
    switch (t) {
    case QT_BF16: return R_BF16;
    case QT_Q4_0: case QT_Q4_1: case QT_Q5_0: case QT_Q5_1: case QT_Q8_0: case QT_IQ4_NL: case QT_MXFP4: return R_32;
    case QT_Q2_K: case QT_Q3_K: case QT_Q4_K: case QT_Q5_K: case QT_Q6_K: case QT_IQ4_XS: return R_256;
    default: return R_NONE;
    }
}

bool cm_act_rounds(qt_type t) { return round_kind(t) != R_NONE; }

cudaError_t cm_act_round(cudaStream_t s, qt_type t, const float *x, int64_t k, int n, float *out) {
    const int kind = round_kind(t);
    if (kind == R_NONE || n <= 0 || k <= 0) return cudaSuccess;
    if ((kind == R_32 && k % 32) || (kind == R_256 && k % 256)) return cudaErrorInvalidValue;
    if (kind == R_BF16) {
        const int64_t tot = k * n;
        const int64_t g = (tot + 255) / 256;
        hc_launch(k_round_bf16, (unsigned)(g < 65535 ? g : 65535), 256, 0, s, x, tot, out);
    } else if (kind == R_32) {
        hc_launch(k_round32, dim3((unsigned)((k / 32 + 3) / 4), (unsigned)n), 128, 0, s, x, k, out);
    } else {
        hc_launch(k_round256, dim3((unsigned)(k / 256), (unsigned)n), 256, 0, s, x, k, out);
    }
    return cudaGetLastError();
}
