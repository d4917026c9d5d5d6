/* cuda_kern.cu: the cuda backend's kernels other than the matmuls: norms,
 * rope, element-wise, MoE routing and combine, the output rows, the logits
 * mask, the KV store with its conversions, and attention over the paged
 * cache. Each matches the CPU backend's arithmetic where the CPU's result is
 * exact to reproduce (explicitly rounded operations: nvcc would otherwise
 * contract a * b + c into one FMA), and is a plain one-block-per-row kernel:
 * correct before fast. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_fp16.h>

#include "cuda_be_int.cuh"

static __device__ __forceinline__ float h2f(unsigned short h) { return __half2float(__ushort_as_half(h)); }
static __device__ __forceinline__ unsigned short f2h(float f) { return __half_as_ushort(__float2half_rn(f)); }

/* block-wide reductions over blockDim.x (a multiple of 32, at most 1024) threads; every thread gets the result */
template <typename A, bool MAX>
static __device__ A block_reduce(A v, A *sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32, nw = blockDim.x / 32;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const A u = __shfl_xor_sync(0xffffffffu, v, o);
        v = MAX ? (u > v ? u : v) : v + u;
    }
    __syncthreads(); /* sh may still be read by a previous call */
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = sh[0];
    for (int i = 1; i < nw; i++) v = MAX ? (sh[i] > v ? sh[i] : v) : v + sh[i];
    return v;
}

/* ---- rms_norm: float squares summed in double, float mean and scale (llama.cpp's arithmetic) ---- */

/* one block a row, RN_VPT values a thread kept in registers between the
 * sum and the scaling (so x is read once, all loads issued together); rows
 * wider than RN_VPT * 1024 loop */
#define RN_VPT HC_RN_VPT
static __global__ void k_rms_norm(const float *x, const float *w, int dim, float eps, float *y) {
    HC_PDL_ENTER();
    __shared__ double sh[32];
    const float *xr = x + (int64_t)blockIdx.x * dim;
    float *yr = y + (int64_t)blockIdx.x * dim;
    const int nt = blockDim.x;
    double ss = 0.0;
    float v[RN_VPT];
#pragma unroll
    for (int j = 0; j < RN_VPT; j++) {
        const int i = threadIdx.x + j * nt;
        v[j] = i < dim ? xr[i] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < RN_VPT; j++) ss += (double)__fmul_rn(v[j], v[j]);
    for (int i = threadIdx.x + RN_VPT * nt; i < dim; i += nt) ss += (double)__fmul_rn(xr[i], xr[i]);
    const float scale = hc_rms_scale(ss, nt, dim, eps, sh);
#pragma unroll
    for (int j = 0; j < RN_VPT; j++) {
        const int i = threadIdx.x + j * nt;
        if (i < dim) {
            const float u = __fmul_rn(v[j], scale);
            yr[i] = w ? __fmul_rn(u, w[i]) : u;
        }
    }
    for (int i = threadIdx.x + RN_VPT * nt; i < dim; i += nt) {
        const float u = __fmul_rn(xr[i], scale);
        yr[i] = w ? __fmul_rn(u, w[i]) : u;
    }
}

cudaError_t ck_rms_norm(cudaStream_t s, const float *x, const float *w, int n, int dim, float eps, float *y, bool rtc) {
    if (n <= 0) return cudaSuccess;
    if (rtc && ck_rms_norm_rtc(s, x, w, n, dim, eps, y)) return cudaGetLastError();
    const int nt = hc_rms_threads(dim);
    hc_launch(k_rms_norm, (unsigned)n, (unsigned)nt, 0, s, x, w, dim, eps, y);
    return cudaGetLastError();
}

#define RP_MAX_HALF 256

/* ---- rope: theta_i = pos * theta_scale^i by repeated multiplication, as the CPU builds it ---- */

static __global__ void k_rope(float *x, int n_head, int head_dim, int n_rot, float theta_scale, bool neox,
                              const int32_t *pos) {
    HC_PDL_ENTER();
    __shared__ float cs[RP_MAX_HALF], sn[RP_MAX_HALF];
    const int r = blockIdx.x, half = n_rot / 2;
    /* the angles once per row: thread i builds theta_i by the CPU's i multiplications */
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float theta = (float)pos[r];
        for (int q = 0; q < i; q++) theta = __fmul_rn(theta, theta_scale);
        cs[i] = cosf(theta);
        sn[i] = sinf(theta);
    }
    __syncthreads();
    for (int t = threadIdx.x; t < n_head * half; t += blockDim.x) {
        const int h = t / half, i = t % half;
        float *v = x + ((int64_t)r * n_head + h) * head_dim;
        const int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
        const float a = v[i0], b = v[i1];
        v[i0] = __fsub_rn(__fmul_rn(a, cs[i]), __fmul_rn(b, sn[i]));
        v[i1] = __fadd_rn(__fmul_rn(a, sn[i]), __fmul_rn(b, cs[i]));
    }
}

/* rows of more than 2 * RP_MAX_HALF rotated dims: each pair builds its own angle */
static __global__ void k_rope_wide(float *x, int n_head, int head_dim, int n_rot, float theta_scale, bool neox,
                                   const int32_t *pos) {
    HC_PDL_ENTER();

    const int r = blockIdx.x, half = n_rot / 2;
    for (int t = threadIdx.x; t < n_head * half; t += blockDim.x) {
        const int h = t / half, i = t % half;
        float theta = (float)pos[r];
        for (int q = 0; q < i; q++) theta = __fmul_rn(theta, theta_scale);
        const float cs = cosf(theta), sn = sinf(theta);
        float *v = x + ((int64_t)r * n_head + h) * head_dim;
        const int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
        const float a = v[i0], b = v[i1];
        v[i0] = __fsub_rn(__fmul_rn(a, cs), __fmul_rn(b, sn));
        v[i1] = __fadd_rn(__fmul_rn(a, sn), __fmul_rn(b, cs));
    }
}

cudaError_t ck_rope(cudaStream_t s, float *x, int n, int n_head, int head_dim, int n_rot, float theta_scale,
                    bool neox, const int32_t *pos) {
    if (n <= 0 || n_rot < 2) return cudaSuccess;
    if (n_rot / 2 <= RP_MAX_HALF)
        hc_launch(k_rope, (unsigned)n, 256, 0, s, x, n_head, head_dim, n_rot, theta_scale, neox, pos);
    else
        hc_launch(k_rope_wide, (unsigned)n, 128, 0, s, x, n_head, head_dim, n_rot, theta_scale, neox, pos);
    return cudaGetLastError();
}

/* ---- element-wise ---- */

static unsigned grid_of(size_t n) {
    const size_t b = (n + 255) / 256;
    return (unsigned)(b < 65536 ? b : 65536);
}

static __global__ void k_add(const float *a, const float *b, float *y, size_t n) {
    HC_PDL_ENTER();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = __fadd_rn(a[i], b[i]);
}

static __global__ void k_add_bias(float *x, const float *bias, int dim, size_t n) {
    HC_PDL_ENTER();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = __fadd_rn(x[i], bias[i % (size_t)dim]);
}

static __global__ void k_swiglu(const float *g, const float *u, float *y, size_t n) {
    HC_PDL_ENTER();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float gv = g[i];
        y[i] = __fmul_rn(__fdiv_rn(gv, __fadd_rn(1.0f, expf(-gv))), u[i]);
    }
}

cudaError_t ck_add(cudaStream_t s, const float *a, const float *b, float *y, size_t n) {
    if (!n) return cudaSuccess;
    hc_launch(k_add, grid_of(n), 256, 0, s, a, b, y, n);
    return cudaGetLastError();
}

cudaError_t ck_add_bias(cudaStream_t s, float *x, const float *bias, int n, int dim) {
    const size_t total = (size_t)n * (size_t)dim;
    if (!total) return cudaSuccess;
    hc_launch(k_add_bias, grid_of(total), 256, 0, s, x, bias, dim, total);
    return cudaGetLastError();
}

cudaError_t ck_swiglu(cudaStream_t s, const float *g, const float *u, float *y, size_t n) {
    if (!n) return cudaSuccess;
    hc_launch(k_swiglu, grid_of(n), 256, 0, s, g, u, y, n);
    return cudaGetLastError();
}

/* ---- MoE: routing (a warp a row, the CPU loop's results) and the weighted combine ---- */

/* one warp a row: the max, the exponentials, the scaling and each of the k
 * selections in parallel (a selection is the largest probability not yet
 * taken, the lowest expert on ties: the CPU loop's strict >), the two sums in
 * the CPU's order on lane 0 (the exponentials' in double, the weights' in
 * float), so the ids and weights are the CPU loop's */
static __global__ void k_moe_route(const float *logits, int n_expert, int k, int32_t *ids, float *weights) {
    HC_PDL_ENTER();
    extern __shared__ float p[];
    const int lane = threadIdx.x;
    const int r = blockIdx.x;
    const float *l = logits + (int64_t)r * n_expert;
    float mx = -INFINITY;
    for (int e = lane; e < n_expert; e += 32) mx = fmaxf(mx, l[e]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    for (int e = lane; e < n_expert; e += 32) p[e] = expf(__fsub_rn(l[e], mx));
    __syncwarp();
    float inv = 0.0f;
    if (lane == 0) {
        double sum = 0.0;
        for (int e = 0; e < n_expert; e++) sum += p[e];
        inv = (float)(1.0 / sum);
    }
    inv = __shfl_sync(0xffffffffu, inv, 0);
    __syncwarp();
    for (int e = lane; e < n_expert; e += 32) p[e] = __fmul_rn(p[e], inv);
    __syncwarp();
    float wsum = 0.0f;
    for (int s = 0; s < k; s++) {
        int best = -1;
        float bv = 0.0f;
        for (int e = lane; e < n_expert; e += 32)
            if (p[e] >= 0.0f && (best < 0 || p[e] > bv)) best = e, bv = p[e];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const int ob = __shfl_xor_sync(0xffffffffu, best, o);
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            if (ob >= 0 && (best < 0 || ov > bv || (ov == bv && ob < best))) best = ob, bv = ov;
        }
        if (lane == 0) {
            ids[r * k + s] = best;
            weights[r * k + s] = best >= 0 ? bv : 0.0f;
            if (best >= 0) {
                wsum = __fadd_rn(wsum, bv);
                p[best] = -1.0f; /* taken */
            }
        }
        __syncwarp();
    }
    if (lane == 0)
        for (int s = 0; s < k; s++) weights[r * k + s] = __fdiv_rn(weights[r * k + s], wsum);
}

cudaError_t ck_moe_route(cudaStream_t s, const float *logits, int n, int n_expert, int k, int32_t *ids, float *w) {
    if (n <= 0) return cudaSuccess;
    hc_launch(k_moe_route, (unsigned)n, 32, sizeof(float) * (size_t)n_expert, s, logits, n_expert, k, ids, w);
    return cudaGetLastError();
}

static __global__ void k_moe_combine(const float *y, const float *w, int k, int dim, float *out) {
    HC_PDL_ENTER();
    const int r = blockIdx.x;
    for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < dim; i += gridDim.y * blockDim.x) {
        float o = 0.0f;
        for (int s = 0; s < k; s++)
            o = __fadd_rn(o, __fmul_rn(w[r * k + s], y[((int64_t)r * k + s) * dim + i]));
        out[(int64_t)r * dim + i] = o;
    }
}

cudaError_t ck_moe_combine(cudaStream_t s, const float *y, const float *w, int n, int k, int dim, float *out) {
    if (n <= 0) return cudaSuccess;
    /* blocks across the row too: one block a row left a decode step's combine latency-bound */
    hc_launch(k_moe_combine, dim3((unsigned)n, (unsigned)((dim + 255) / 256)), 256, 0, s, y, w, k, dim, out);
    return cudaGetLastError();
}

/* ---- the wanted rows; the logits mask ---- */

/* in place (out == x) one block copies the rows in order, as memmove would:
 * out_rows ascend, so row i's source is never an earlier destination */
static __global__ void k_gather_out(const float *x, int dim, int n_out, const int32_t *rows, float *out, bool seq) {
    HC_PDL_ENTER();
    for (int i = seq ? 0 : blockIdx.x; i < (seq ? n_out : (int)blockIdx.x + 1); i++) {
        const float *src = x + (int64_t)rows[i] * dim;
        float *dst = out + (int64_t)i * dim;
        if (src != dst) {
            float v[4];
            for (int c = 0; c < dim; c += 4 * (int)blockDim.x) {
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    const int j = c + u * (int)blockDim.x + (int)threadIdx.x;
                    if (j < dim) v[u] = src[j];
                }
                __syncthreads();
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    const int j = c + u * (int)blockDim.x + (int)threadIdx.x;
                    if (j < dim) dst[j] = v[u];
                }
                __syncthreads();
            }
        }
    }
}

cudaError_t ck_gather_out(cudaStream_t s, const float *x, int dim, int n_out, const int32_t *rows, float *out) {
    if (n_out <= 0) return cudaSuccess;
    const bool seq = x == out;
    hc_launch(k_gather_out, seq ? 1u : (unsigned)n_out, 256, 0, s, x, dim, n_out, rows, out, seq);
    return cudaGetLastError();
}

static __global__ void k_mask(float *l, const uint32_t *allowed, int64_t n) {
    HC_PDL_ENTER();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        if (!(allowed[i >> 5] >> (i & 31) & 1u)) l[i] = -INFINITY;
}

cudaError_t ck_mask_logits(cudaStream_t s, float *l, const uint32_t *allowed, int64_t n_vocab) {
    if (n_vocab <= 0) return cudaSuccess;
    hc_launch(k_mask, grid_of((size_t)n_vocab), 256, 0, s, l, allowed, n_vocab);
    return cudaGetLastError();
}

/* ---- the KV store: one warp per 32-element block (lane j holds element j),
 * the CPU quantizers' arithmetic (qt_quant_q8_0, q4_0, q4_1) ---- */

bool ck_kv_type_ok(qt_type t, bool is_v) {
    if (t == QT_F32 || t == QT_F16 || t == QT_Q8_0) return true;
    return is_v && (t == QT_Q4_0 || t == QT_Q4_1);
}

static __device__ void store_block(qt_type t, float v, uint8_t *b, int lane) {
    if (t == QT_Q8_0) {
        float amax = fabsf(v);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        const float d = __fdiv_rn(amax, 127.0f), id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
        if (lane == 0) *(unsigned short *)b = f2h(d);
        ((int8_t *)b)[2 + lane] = (int8_t)roundf(__fmul_rn(v, id));
        return;
    }
    int q;
    if (t == QT_Q4_0) {
        /* the first element of largest magnitude */
        float a = fabsf(v);
        int idx = lane;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float a2 = __shfl_xor_sync(0xffffffffu, a, o);
            const int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
            if (a2 > a || (a2 == a && i2 < idx)) {
                a = a2;
                idx = i2;
            }
        }
        const float mx = __shfl_sync(0xffffffffu, v, idx);
        const float d = __fdiv_rn(mx, -8.0f), id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
        if (lane == 0) *(unsigned short *)b = f2h(d);
        q = (int)__fadd_rn(__fmul_rn(v, id), 8.5f);
        if (q > 15) q = 15;
        b += 2;
    } else { /* q4_1 */
        float mn = v, mx = v;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, o));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        }
        const float d = __fdiv_rn(__fsub_rn(mx, mn), 15.0f), id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
        if (lane == 0) {
            ((unsigned short *)b)[0] = f2h(d);
            ((unsigned short *)b)[1] = f2h(mn);
        }
        q = (int)__fadd_rn(__fmul_rn(__fsub_rn(v, mn), id), 0.5f);
        if (q > 15) q = 15;
        b += 4;
    }
    const int hi = __shfl_down_sync(0xffffffffu, q, 16);
    if (lane < 16) b[lane] = (uint8_t)(q | (hi << 4));
}

static __device__ size_t block_size_of(qt_type t) {
    return t == QT_Q8_0 ? 34 : t == QT_Q4_0 ? 18 : 20;
}

static __global__ void k_kv_store(ck_kv g, int layer, const float *k, const float *v, const int32_t *slot) {
    HC_PDL_ENTER();
    const int t = blockIdx.x;
    const bool is_v = blockIdx.y == 1;
    const int32_t sl = slot[t];
    if (sl < 0) return;
    const qt_type ty = is_v ? g.vt : g.kt;
    const float *x = (is_v ? v : k) + (int64_t)t * g.row_elems;
    uint8_t *dst = g.base + (size_t)(sl / g.block_size) * g.block_bytes + (size_t)layer * g.layer_bytes +
                   (is_v ? (size_t)g.block_size * g.k_row_bytes : 0) +
                   (size_t)(sl % g.block_size) * (is_v ? g.v_row_bytes : g.k_row_bytes);
    if (ty == QT_F32) {
        for (int64_t i = threadIdx.x; i < g.row_elems; i += blockDim.x) ((float *)dst)[i] = x[i];
    } else if (ty == QT_F16) {
        for (int64_t i = threadIdx.x; i < g.row_elems; i += blockDim.x) ((unsigned short *)dst)[i] = f2h(x[i]);
    } else {
        const int lane = threadIdx.x & 31, nw = blockDim.x / 32;
        const size_t bs = block_size_of(ty);
        for (int64_t b = threadIdx.x / 32; b < g.row_elems / 32; b += nw) store_block(ty, x[b * 32 + lane], dst + b * bs, lane);
    }
}

cudaError_t ck_kv_store(cudaStream_t s, const ck_kv *g, int layer, const float *k, const float *v, int n,
                        const int32_t *slot) {
    if (n <= 0) return cudaSuccess;
    hc_launch(k_kv_store, dim3((unsigned)n, 2), 128, 0, s, *g, layer, k, v, slot);
    return cudaGetLastError();
}

/* ---- fused: per-head rms-norm of q and k, rope of both, k and v into the
 * cache (the records rms_norm q, rms_norm k, rope q, rope k, kv_store of a
 * decode step; the norms optional), bit for bit as those kernels: a warp a
 * head row (head_dim <= 128: k_rms_norm's one-warp shape, 4 values a lane),
 * the angles as k_rope builds them, the stores as k_kv_store's. Grid:
 * (token, groups of 4 head rows: the n_head q rows, then n_head_kv k rows,
 * then n_head_kv v rows). */
#define QR_MAX_HD 128
static __global__ void __launch_bounds__(128)
    k_qk_rope_store(float *q, float *k, const float *v, const float *qw, const float *kw, int n_head, int n_head_kv,
                    int hd, float eps_q, float eps_k, int n_rot, float theta_scale, bool neox, const int32_t *pos,
                    ck_kv g, int layer, const int32_t *slot) {
    HC_PDL_ENTER();
    __shared__ float buf[4][QR_MAX_HD];
    const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int hidx = blockIdx.y * 4 + warp;
    if (hidx >= n_head + 2 * n_head_kv) return;
    const bool is_q = hidx < n_head, is_v = hidx >= n_head + n_head_kv;
    const int h = is_q ? hidx : is_v ? hidx - n_head - n_head_kv : hidx - n_head;
    float *row = is_q ? q + ((int64_t)t * n_head + h) * hd : NULL;
    if (!is_q) row = (is_v ? (float *)v : k) + ((int64_t)t * n_head_kv + h) * hd;
    float *b = buf[warp];
    if (!is_v) {
        const float *w = is_q ? qw : kw;
        float x[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int i = lane + 32 * j;
            x[j] = i < hd ? row[i] : 0.0f;
        }
        if (w) {
            double ss = 0.0;
#pragma unroll
            for (int j = 0; j < 4; j++) ss += (double)__fmul_rn(x[j], x[j]);
            const float scale = hc_rms_scale(ss, 32, hd, is_q ? eps_q : eps_k, NULL);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int i = lane + 32 * j;
                if (i < hd) x[j] = __fmul_rn(__fmul_rn(x[j], scale), w[i]);
            }
        }
#pragma unroll
        for (int j = 0; j < 4; j++)
            if (lane + 32 * j < hd) b[lane + 32 * j] = x[j];
        __syncwarp();
        const int half = n_rot / 2;
        for (int i = lane; i < half; i += 32) {
            float theta = (float)pos[t];
            for (int r = 0; r < i; r++) theta = __fmul_rn(theta, theta_scale);
            const float cs = cosf(theta), sn = sinf(theta);
            const int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
            const float a = b[i0], c = b[i1];
            b[i0] = __fsub_rn(__fmul_rn(a, cs), __fmul_rn(c, sn));
            b[i1] = __fadd_rn(__fmul_rn(a, sn), __fmul_rn(c, cs));
        }
        __syncwarp();
        for (int i = lane; i < hd; i += 32) row[i] = b[i];
        if (is_q) return;
    } else {
        for (int i = lane; i < hd; i += 32) b[i] = row[i];
        __syncwarp();
    }
    const int32_t sl = slot[t];
    if (sl < 0) return;
    const qt_type ty = is_v ? g.vt : g.kt;
    uint8_t *dst = g.base + (size_t)(sl / g.block_size) * g.block_bytes + (size_t)layer * g.layer_bytes +
                   (is_v ? (size_t)g.block_size * g.k_row_bytes : 0) +
                   (size_t)(sl % g.block_size) * (is_v ? g.v_row_bytes : g.k_row_bytes);
    const int64_t e0 = (int64_t)h * hd; /* the head's first element of the row */
    if (ty == QT_F32) {
        for (int i = lane; i < hd; i += 32) ((float *)dst)[e0 + i] = b[i];
    } else if (ty == QT_F16) {
        for (int i = lane; i < hd; i += 32) ((unsigned short *)dst)[e0 + i] = f2h(b[i]);
    } else {
        const size_t bs = block_size_of(ty);
        for (int bl = 0; bl < hd / 32; bl++) store_block(ty, b[bl * 32 + lane], dst + (size_t)(e0 / 32 + bl) * bs, lane);
    }
}

bool ck_qk_rope_store_ok(int head_dim, int n_rot, const ck_kv *g) {
    if (head_dim < 1 || head_dim > QR_MAX_HD || n_rot < 0 || n_rot > head_dim || (n_rot & 1)) return false;
    const bool quant = g->kt != QT_F32 && g->kt != QT_F16;
    const bool vquant = g->vt != QT_F32 && g->vt != QT_F16;
    return !((quant || vquant) && head_dim % 32);
}

cudaError_t ck_qk_rope_store(cudaStream_t s, float *q, float *k, const float *v, const float *qw, const float *kw,
                             int n, int n_head, int n_head_kv, int head_dim, float eps_q, float eps_k, int n_rot,
                             float theta_scale, bool neox, const int32_t *pos, const ck_kv *g, int layer,
                             const int32_t *slot) {
    if (n <= 0) return cudaSuccess;
    const int rows = n_head + 2 * n_head_kv;
    hc_launch(k_qk_rope_store, dim3((unsigned)n, (unsigned)((rows + 3) / 4)), 128, 0, s,
        q, k, v, qw, kw, n_head, n_head_kv, head_dim, eps_q, eps_k, n_rot < 2 ? 0 : n_rot, theta_scale, neox, pos, *g,
        layer, slot);
    return cudaGetLastError();
}

/* ---- attention ---- */

/* element d of one kv head's row (f32, f16, q8_0, q4_0, q4_1), as the CPU's to_float */
static __device__ __forceinline__ float kv_get(qt_type t, const uint8_t *row, int d) {
    switch (t) {
    case QT_F32: return ((const float *)row)[d];
    case QT_F16: return h2f(((const unsigned short *)row)[d]);
    case QT_Q8_0: {
        const uint8_t *b = row + (d / 32) * 34;
        return __fmul_rn((float)((const int8_t *)b)[2 + d % 32], h2f(*(const unsigned short *)b));
    }
    case QT_Q4_0: {
        const uint8_t *b = row + (d / 32) * 18;
        const int j = d % 32, q = j < 16 ? b[2 + j] & 15 : b[2 + j - 16] >> 4;
        return __fmul_rn((float)(q - 8), h2f(*(const unsigned short *)b));
    }
    default: { /* q4_1 */
        const uint8_t *b = row + (d / 32) * 20;
        const int j = d % 32, q = j < 16 ? b[4 + j] & 15 : b[4 + j - 16] >> 4;
        return __fadd_rn(__fmul_rn((float)q, h2f(((const unsigned short *)b)[0])), h2f(((const unsigned short *)b)[1]));
    }
    }
}

#define AT_THREADS 128
#define AT_MAX_HD 512

static __global__ void __launch_bounds__(AT_THREADS)
    k_attention(const float *q, float *out, int n_head, int n_head_kv, int hd, float scale, int32_t window, ck_kv g,
                int layer, const int32_t *pos, const int32_t *seq, const int32_t *bt, int32_t bt_stride,
                const int32_t *tok) {
    HC_PDL_ENTER();
    extern __shared__ float sm[];
    float *qs = sm;                    /* [hd] */
    float *ps = sm + ((hd + 1) & ~1);  /* [AT_THREADS] this chunk's weights */
    float *red = ps + AT_THREADS;      /* [32] reductions */
    const uint8_t **vrow = (const uint8_t **)(red + 32); /* [AT_THREADS] (an even number of floats in: 8-byte aligned) */
    const int t = tok ? tok[blockIdx.x] : blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
    const int kvh = h / (n_head / n_head_kv);
    const float *qr = q + ((int64_t)t * n_head + h) * hd;
    for (int d = tid; d < hd; d += AT_THREADS) qs[d] = qr[d];
    __syncthreads();
    const int32_t hi = pos[t], lo = window > 0 && hi - window + 1 > 0 ? hi - window + 1 : 0;
    const int32_t *btr = bt + (int64_t)seq[t] * bt_stride;
    const size_t v_off = (size_t)g.block_size * g.k_row_bytes;
    float m = -INFINITY, l = 0.0f, acc[AT_MAX_HD / AT_THREADS];
#pragma unroll
    for (int i = 0; i < AT_MAX_HD / AT_THREADS; i++) acc[i] = 0.0f;
    for (int32_t p0 = lo; p0 <= hi; p0 += AT_THREADS) {
        const int cnt = hi - p0 + 1 < AT_THREADS ? hi - p0 + 1 : AT_THREADS;
        float sc = -INFINITY;
        if (tid < cnt) {
            const int32_t p = p0 + tid, blk = btr[p / g.block_size], sl = p % g.block_size;
            const uint8_t *lb = g.base + (size_t)blk * g.block_bytes + (size_t)layer * g.layer_bytes;
            const uint8_t *kr = lb + (size_t)sl * g.k_row_bytes + (size_t)kvh * g.k_head_bytes;
            vrow[tid] = lb + v_off + (size_t)sl * g.v_row_bytes + (size_t)kvh * g.v_head_bytes;
            float s = 0.0f;
            for (int d = 0; d < hd; d++) s = __fmaf_rn(qs[d], kv_get(g.kt, kr, d), s);
            sc = s * scale;
        }
        const float cm = block_reduce<float, true>(sc, red);
        const float mn = cm > m ? cm : m;
        const float corr = m == -INFINITY ? 0.0f : expf(m - mn);
        const float e = tid < cnt ? expf(sc - mn) : 0.0f;
        ps[tid] = e;
        const float cs = block_reduce<float, false>(e, red); /* syncs: ps and vrow are visible */
        l = l * corr + cs;
#pragma unroll
        for (int i = 0; i < AT_MAX_HD / AT_THREADS; i++) {
            const int d = tid + i * AT_THREADS;
            if (d < hd) {
                float a = acc[i] * corr;
                for (int j = 0; j < cnt; j++) a = __fmaf_rn(ps[j], kv_get(g.vt, vrow[j], d), a);
                acc[i] = a;
            }
        }
        m = mn;
        __syncthreads(); /* ps and vrow are rewritten by the next chunk */
    }
    float *o = out + ((int64_t)t * n_head + h) * hd;
#pragma unroll
    for (int i = 0; i < AT_MAX_HD / AT_THREADS; i++) {
        const int d = tid + i * AT_THREADS;
        if (d < hd) o[d] = acc[i] / l;
    }
}

/* ---- attention split over the context (flash decoding), GQA-shared ----
 * Pass 1: one block per (token, kv head, chunk of AS_CHUNK positions): the
 * chunk's scores for all G query heads of the kv head (a warp per position,
 * lanes over the head dims: K rows read contiguously, once for the G heads),
 * their softmax within the chunk, and the V-weighted sums (a thread per head
 * dim, V rows read once for the G heads); it leaves (acc, max, sum) per
 * (token, head, chunk). Pass 2: per (token, head), the chunks combined in
 * chunk order. Chunk boundaries are fixed multiples of AS_CHUNK from position
 * 0, so a token's result does not depend on the batch it came in or on how
 * many chunks the longest sequence of the step needs. */

#define AS_CHUNK 128
#define AS_THREADS 128
#define AS_MAX_G 16
#define AS_MAX_GHD 2048 /* G * head_dim: the queries, and each warp's V sums, in shared memory */
#define AS_U 8 /* positions a warp has in flight (K or V rows loaded before use) */

/* element d of a kv row: f16 directly when both caches are f16 (F16), else by type */
template <bool F16>
static __device__ __forceinline__ float kv_at(qt_type t, const uint8_t *row, int d) {
    if (F16) return h2f(((const unsigned short *)row)[d]);
    return kv_get(t, row, d);
}

/* ---- the parts of a chunk's work both chunk kernels share ---- */

/* an empty chunk's partials (no position of it in the window): max -inf, sum 0 */
static __device__ __forceinline__ void attn_part_empty(float *pt, int G, int n_split, int hd) {
    if (!pt) return;
    const int stride = hd + 2;
    for (int gi = threadIdx.x; gi < G; gi += blockDim.x) {
        pt[(size_t)gi * n_split * stride + hd] = -INFINITY;
        pt[(size_t)gi * n_split * stride + hd + 1] = 0.0f;
    }
}

/* the chunk's K and V row addresses of kv head kh, one position a thread */
static __device__ __forceinline__ void attn_rows(const ck_kv &g, int layer, int kh, const int32_t *btr, int32_t lo,
                                                 int cnt, const uint8_t **krow, const uint8_t **vrow) {
    const size_t v_off = (size_t)g.block_size * g.k_row_bytes;
    for (int j = threadIdx.x; j < cnt; j += blockDim.x) {
        const int32_t p = lo + j, blk = btr[p / g.block_size], sl = p % g.block_size;
        const uint8_t *lb = g.base + (size_t)blk * g.block_bytes + (size_t)layer * g.layer_bytes;
        krow[j] = lb + (size_t)sl * g.k_row_bytes + (size_t)kh * g.k_head_bytes;
        vrow[j] = lb + v_off + (size_t)sl * g.v_row_bytes + (size_t)kh * g.v_head_bytes;
    }
}

/* the chunk's softmax per head, a warp a head: ps [G][AS_CHUNK] scores become
 * weights exp(s - m); s_m, s_l: each head's max and sum */
static __device__ __forceinline__ void attn_chunk_softmax(float *ps, int G, int cnt, float *s_m, float *s_l) {
    const int lane = threadIdx.x & 31, nw = blockDim.x / 32;
    for (int gi = threadIdx.x / 32; gi < G; gi += nw) {
        float *pg = ps + gi * AS_CHUNK;
        float m = -INFINITY;
        for (int j = lane; j < cnt; j += 32) m = fmaxf(m, pg[j]);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        float l = 0.0f;
        for (int j = lane; j < cnt; j += 32) {
            const float e = expf(pg[j] - m);
            pg[j] = e;
            l += e;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
        if (lane == 0) {
            s_m[gi] = m;
            s_l[gi] = l;
        }
    }
}

/* the warps' V sums (nw slabs of G hd floats, wstride apart) added in warp
 * order, into the chunk's partials pt, or (pt NULL: the only chunk) divided
 * by the sums into the output rows of the kv head's G query heads */
static __device__ __forceinline__ void attn_part_out(const float *slab, int wstride, int G, int hd, int n_split,
                                                     const float *s_m, const float *s_l, float *pt, float *out) {
    const int stride = hd + 2, ghd = G * hd, nw = blockDim.x / 32;
    for (int i = threadIdx.x; i < ghd; i += blockDim.x) {
        float r = slab[i];
        for (int w = 1; w < nw; w++) r = __fadd_rn(r, slab[w * wstride + i]);
        const int gi = i / hd, d = i % hd;
        if (pt)
            pt[(size_t)gi * n_split * stride + d] = r;
        else
            out[i] = r / s_l[gi];
    }
    if (pt)
        for (int gi = threadIdx.x; gi < G; gi += blockDim.x) {
            pt[(size_t)gi * n_split * stride + hd] = s_m[gi];
            pt[(size_t)gi * n_split * stride + hd + 1] = s_l[gi];
        }
}

/* One block per (token, kv head, chunk of AS_CHUNK positions), 4 warps.
 * Positions go to the warps in groups of AS_U (group gr to warp gr % 4), so
 * a short context still spreads over the warps and each warp has AS_U rows'
 * loads in flight. Scores: per position, lane l dots dims l, l + 32, ... of
 * each query head of the kv head (the K row loaded once for the G heads),
 * then a butterfly sum (AS_U x 4 of them interleaved). V: each warp sums its
 * positions in order into registers (lane l: dims l + 32 i, up to 32 / ND
 * heads a pass over the V rows), leaves them in its own slab of shared
 * memory, and the four slabs are added in warp order. ND = dims a lane
 * (head_dim / 32 rounded up to 2, 4, 8 or 16). Direct (part NULL): the
 * step's block table spans one chunk, so this block is the token's only
 * partial and writes acc / l itself: the combine's result for one chunk bit
 * for bit (its weight expf(0) is exactly 1). */
#define AS_GB 4 /* query heads whose scores a pass over a K row computes */
template <int ND, bool F16>
static __global__ void __launch_bounds__(AS_THREADS)
    k_attn_part(const float *q, int n_head, int n_head_kv, int hd, float scale, int32_t window, ck_kv g, int layer,
                const int32_t *pos, const int32_t *seq, const int32_t *bt, int32_t bt_stride, const int32_t *tok, int t0, int n_split,
                float *part, float *out) {
    HC_PDL_ENTER();
    constexpr int NW = AS_THREADS / 32, GBV = 32 / ND;
    __shared__ float slab[NW][AS_MAX_GHD]; /* slab 0: the queries while scoring; then each warp's V sums */
    __shared__ float ps[AS_MAX_G][AS_CHUNK];
    __shared__ const uint8_t *krow[AS_CHUNK], *vrow[AS_CHUNK];
    __shared__ float s_m[AS_MAX_G], s_l[AS_MAX_G];
    float *qs = slab[0];
    const int t = tok ? tok[t0 + blockIdx.x] : t0 + blockIdx.x, kh = blockIdx.y, sp = blockIdx.z, tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5, G = n_head / n_head_kv;
    const int32_t hi = pos[t], lo0 = window > 0 && hi - window + 1 > 0 ? hi - window + 1 : 0;
    const int32_t c0 = sp * AS_CHUNK, lo = lo0 > c0 ? lo0 : c0, hi1 = hi < c0 + AS_CHUNK - 1 ? hi : c0 + AS_CHUNK - 1;
    const int stride = hd + 2;
    float *pt = part ? part + (((size_t)blockIdx.x * n_head + (size_t)kh * G) * n_split + sp) * stride : NULL;
    if (lo > hi1) { /* no position of this chunk: an empty partial */
        attn_part_empty(pt, G, n_split, hd);
        return;
    }
    const int cnt = hi1 - lo + 1, ghd = G * hd;
    const float *qr = q + ((int64_t)t * n_head + (int64_t)kh * G) * hd;
    if ((hd & 3) == 0)
        for (int i = 4 * tid; i < ghd; i += 4 * AS_THREADS) *(float4 *)(qs + i) = __ldg((const float4 *)(qr + i));
    else
        for (int i = tid; i < ghd; i += AS_THREADS) qs[i] = qr[i];
    attn_rows(g, layer, kh, bt + (int64_t)seq[t] * bt_stride, lo, cnt, krow, vrow);
    __syncthreads();
    /* scores */
    for (int j0 = warp * AS_U; j0 < cnt; j0 += NW * AS_U) {
        float kv[AS_U][ND];
#pragma unroll
        for (int u = 0; u < AS_U; u++)
#pragma unroll
            for (int i = 0; i < ND; i++) {
                const int d = lane + 32 * i;
                kv[u][i] = d < hd && j0 + u < cnt ? kv_at<F16>(g.kt, krow[j0 + u], d) : 0.0f;
            }
        for (int g0 = 0; g0 < G; g0 += AS_GB) {
            float a[AS_U][AS_GB];
#pragma unroll
            for (int u = 0; u < AS_U; u++)
#pragma unroll
                for (int gb = 0; gb < AS_GB; gb++) {
                    float v = 0.0f;
                    if (g0 + gb < G)
#pragma unroll
                        for (int i = 0; i < ND; i++) {
                            const int d = lane + 32 * i;
                            if (d < hd) v = __fmaf_rn(qs[(g0 + gb) * hd + d], kv[u][i], v);
                        }
                    a[u][gb] = v;
                }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
#pragma unroll
                for (int u = 0; u < AS_U; u++)
#pragma unroll
                    for (int gb = 0; gb < AS_GB; gb++) a[u][gb] += __shfl_xor_sync(0xffffffffu, a[u][gb], o);
            if (lane == 0)
#pragma unroll
                for (int u = 0; u < AS_U; u++)
#pragma unroll
                    for (int gb = 0; gb < AS_GB; gb++)
                        if (j0 + u < cnt && g0 + gb < G) ps[g0 + gb][j0 + u] = a[u][gb] * scale;
        }
    }
    __syncthreads();
    attn_chunk_softmax(&ps[0][0], G, cnt, s_m, s_l);
    __syncthreads(); /* also: the queries in slab 0 are no longer read */
    /* V-weighted sums: GBV heads a pass over this warp's V rows */
    for (int g0 = 0; g0 < G; g0 += GBV) {
        float acc[GBV][ND];
#pragma unroll
        for (int gb = 0; gb < GBV; gb++)
#pragma unroll
            for (int i = 0; i < ND; i++) acc[gb][i] = 0.0f;
        for (int j0 = warp * AS_U; j0 < cnt; j0 += NW * AS_U) {
            float vv[AS_U][ND];
#pragma unroll
            for (int u = 0; u < AS_U; u++)
#pragma unroll
                for (int i = 0; i < ND; i++) {
                    const int d = lane + 32 * i;
                    vv[u][i] = d < hd && j0 + u < cnt ? kv_at<F16>(g.vt, vrow[j0 + u], d) : 0.0f;
                }
#pragma unroll
            for (int u = 0; u < AS_U; u++) {
                if (j0 + u >= cnt) break;
#pragma unroll
                for (int gb = 0; gb < GBV; gb++) {
                    if (g0 + gb >= G) break;
                    const float pw = ps[g0 + gb][j0 + u];
#pragma unroll
                    for (int i = 0; i < ND; i++) acc[gb][i] = __fmaf_rn(pw, vv[u][i], acc[gb][i]);
                }
            }
        }
#pragma unroll
        for (int gb = 0; gb < GBV; gb++) {
            if (g0 + gb >= G) break;
#pragma unroll
            for (int i = 0; i < ND; i++) {
                const int d = lane + 32 * i;
                if (d < hd) slab[warp][(g0 + gb) * hd + d] = acc[gb][i];
            }
        }
    }
    __syncthreads();
    attn_part_out(&slab[0][0], AS_MAX_GHD, G, hd, n_split, s_m, s_l, pt,
                  out + ((int64_t)t * n_head + (int64_t)kh * G) * hd);
}

/* The f16 cache's form of k_attn_part: the same blocks, chunks, partials and
 * order of the chunk's work, with lane l owning the ND consecutive dims
 * [l ND, l ND + ND) of a row (one 2 ND-byte load a row, kept packed in
 * registers: AS_U rows in flight cost AS_U ND / 2 registers), the V sums of
 * GB heads a pass (GB = all G heads when G ND <= 32: the V rows are read
 * once), and shared memory sized to the step's G and head_dim (dynamic), so
 * that more blocks fit an SM. A token's result depends only on its own
 * positions, as in k_attn_part. */
typedef void (*attn_part_fn_t)(const float *, int, int, int, float, int32_t, ck_kv, int, const int32_t *,
                               const int32_t *, const int32_t *, int32_t, const int32_t *, int, int, float *, float *);
template <int ND> struct hpack;
template <> struct hpack<2> { typedef unsigned int t; };
template <> struct hpack<4> { typedef uint2 t; };
template <> struct hpack<8> { typedef uint4 t; };

template <int ND>
static __device__ __forceinline__ void unpack_h(const typename hpack<ND>::t &p, float *f) {
    const __half2 *h = (const __half2 *)&p;
#pragma unroll
    for (int i = 0; i < ND / 2; i++) {
        const float2 v = __half22float2(h[i]);
        f[2 * i] = v.x;
        f[2 * i + 1] = v.y;
    }
}

template <int ND, int GB>
static __global__ void __launch_bounds__(AS_THREADS, 6)
    k_attn_part16(const float *q, int n_head, int n_head_kv, int hd, float scale, int32_t window, ck_kv g, int layer,
                  const int32_t *pos, const int32_t *seq, const int32_t *bt, int32_t bt_stride, const int32_t *tok, int t0, int n_split,
                  float *part, float *out) {
    HC_PDL_ENTER();
    typedef typename hpack<ND>::t P;
    constexpr int NW = AS_THREADS / 32;
    extern __shared__ float4 smem4[];
    const int G = n_head / n_head_kv, ghd = G * hd;
    float *slab = (float *)smem4;                 /* [NW][G hd]: the queries while scoring, then each warp's V sums */
    float *ps = slab + NW * ghd;                  /* [G][AS_CHUNK] */
    /* [G] each, G rounded up to even: the row pointers after them 8-byte aligned */
    float *s_m = ps + G * AS_CHUNK, *s_l = s_m + ((G + 1) & ~1);
    const uint8_t **krow = (const uint8_t **)(s_l + ((G + 1) & ~1)); /* [AS_CHUNK] each */
    const uint8_t **vrow = krow + AS_CHUNK;
    float *qs = slab;
    const int t = tok ? tok[t0 + blockIdx.x] : t0 + blockIdx.x, kh = blockIdx.y, sp = blockIdx.z, tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    const int32_t hi = pos[t], lo0 = window > 0 && hi - window + 1 > 0 ? hi - window + 1 : 0;
    const int32_t c0 = sp * AS_CHUNK, lo = lo0 > c0 ? lo0 : c0, hi1 = hi < c0 + AS_CHUNK - 1 ? hi : c0 + AS_CHUNK - 1;
    const int stride = hd + 2;
    float *pt = part ? part + (((size_t)blockIdx.x * n_head + (size_t)kh * G) * n_split + sp) * stride : NULL;
    if (lo > hi1) {
        attn_part_empty(pt, G, n_split, hd);
        return;
    }
    const int cnt = hi1 - lo + 1;
    const float *qr = q + ((int64_t)t * n_head + (int64_t)kh * G) * hd;
    for (int i = 4 * tid; i < ghd; i += 4 * AS_THREADS) *(float4 *)(qs + i) = __ldg((const float4 *)(qr + i));
    attn_rows(g, layer, kh, bt + (int64_t)seq[t] * bt_stride, lo, cnt, krow, vrow);
    __syncthreads();
    const int d0 = lane * ND;
    /* scores */
    for (int j0 = warp * AS_U; j0 < cnt; j0 += NW * AS_U) {
        P kp[AS_U];
#pragma unroll
        for (int u = 0; u < AS_U; u++)
            if (j0 + u < cnt) kp[u] = __ldg((const P *)(krow[j0 + u]) + lane);
        for (int g0 = 0; g0 < G; g0 += AS_GB) {
            float a[AS_U][AS_GB];
#pragma unroll
            for (int u = 0; u < AS_U; u++) {
                float kf[ND];
                if (j0 + u < cnt) unpack_h<ND>(kp[u], kf);
                else
#pragma unroll
                    for (int i = 0; i < ND; i++) kf[i] = 0.0f;
#pragma unroll
                for (int gb = 0; gb < AS_GB; gb++) {
                    float v = 0.0f;
                    if (g0 + gb < G) {
                        const float *qq = qs + (g0 + gb) * hd + d0;
#pragma unroll
                        for (int i = 0; i < ND; i++) v = __fmaf_rn(qq[i], kf[i], v);
                    }
                    a[u][gb] = v;
                }
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
#pragma unroll
                for (int u = 0; u < AS_U; u++)
#pragma unroll
                    for (int gb = 0; gb < AS_GB; gb++) a[u][gb] += __shfl_xor_sync(0xffffffffu, a[u][gb], o);
            if (lane == 0)
#pragma unroll
                for (int u = 0; u < AS_U; u++)
#pragma unroll
                    for (int gb = 0; gb < AS_GB; gb++)
                        if (j0 + u < cnt && g0 + gb < G) ps[(g0 + gb) * AS_CHUNK + j0 + u] = a[u][gb] * scale;
        }
    }
    __syncthreads();
    attn_chunk_softmax(ps, G, cnt, s_m, s_l);
    __syncthreads();
    for (int g0 = 0; g0 < G; g0 += GB) {
        float acc[GB][ND];
#pragma unroll
        for (int gb = 0; gb < GB; gb++)
#pragma unroll
            for (int i = 0; i < ND; i++) acc[gb][i] = 0.0f;
        for (int j0 = warp * AS_U; j0 < cnt; j0 += NW * AS_U) {
            P vp[AS_U];
#pragma unroll
            for (int u = 0; u < AS_U; u++)
                if (j0 + u < cnt) vp[u] = __ldg((const P *)(vrow[j0 + u]) + lane);
#pragma unroll
            for (int u = 0; u < AS_U; u++) {
                if (j0 + u >= cnt) break;
                float vf[ND];
                unpack_h<ND>(vp[u], vf);
#pragma unroll
                for (int gb = 0; gb < GB; gb++) {
                    if (g0 + gb >= G) break;
                    const float pw = ps[(g0 + gb) * AS_CHUNK + j0 + u];
#pragma unroll
                    for (int i = 0; i < ND; i++) acc[gb][i] = __fmaf_rn(pw, vf[i], acc[gb][i]);
                }
            }
        }
#pragma unroll
        for (int gb = 0; gb < GB; gb++) {
            if (g0 + gb >= G) break;
            float *dst = slab + warp * ghd + (g0 + gb) * hd + d0;
#pragma unroll
            for (int i = 0; i < ND; i++) dst[i] = acc[gb][i];
        }
    }
    __syncthreads();
    attn_part_out(slab, ghd, G, hd, n_split, s_m, s_l, pt, out + ((int64_t)t * n_head + (int64_t)kh * G) * hd);
}

/* the f16 form's kernel for head_dim and G (NULL: it does not take them), and its shared memory */
static attn_part_fn_t attn_part16(int hd, int G, size_t *smem) {
    if (hd % 32 || hd / 32 < 2 || hd / 32 > 8 || (hd / 32) & (hd / 32 - 1) || G < 1 || G > AS_MAX_G) return NULL;
    const int nd = hd / 32;
    *smem = sizeof(float) * ((size_t)(AS_THREADS / 32) * G * hd + (size_t)G * AS_CHUNK + 2 * (((size_t)G + 1) & ~(size_t)1)) +
            2 * AS_CHUNK * sizeof(void *);
    const int gb = G * nd <= 32 ? G : 32 / nd; /* heads a pass over the V rows */
#define AP16(N) \
    (gb <= 1 ? k_attn_part16<N, 1> : gb <= 2 ? k_attn_part16<N, 2> : gb <= 4 ? k_attn_part16<N, 4> \
     : gb <= 8 ? k_attn_part16<N, (8 * N <= 32 ? 8 : 32 / N)> : k_attn_part16<N, (16 * N <= 32 ? 16 : 32 / N)>)
    return nd == 2 ? AP16(2) : nd == 4 ? AP16(4) : AP16(8);
#undef AP16
}

typedef void (*attn_part_fn)(const float *, int, int, int, float, int32_t, ck_kv, int, const int32_t *,
                             const int32_t *, const int32_t *, int32_t, const int32_t *, int, int, float *, float *);

template <bool F16>
static attn_part_fn attn_part_nd(int hd) {
    const int nd = (hd + 31) / 32;
    return nd <= 2 ? k_attn_part<2, F16> : nd <= 4 ? k_attn_part<4, F16> : nd <= 8 ? k_attn_part<8, F16>
                                                                                    : k_attn_part<16, F16>;
}

/* one block per (token, head): the chunks in order. The chunk weights
 * expf(m_s - M) are computed once each (in parallel) into shared memory; L
 * and every output dim then sum the chunks in chunk order. */
#define AC_MAX_SPLIT 2048
static __global__ void k_attn_combine(const float *part, int n_head, int hd, const int32_t *tok, int t0, int n_split,
                                      float *out) {
    HC_PDL_ENTER();
    __shared__ float wsh[AC_MAX_SPLIT], red[32];
    __shared__ float s_L;
    const int tl = blockIdx.x, h = blockIdx.y, stride = hd + 2;
    const float *pt = part + ((size_t)tl * n_head + h) * n_split * stride;
    float M = -INFINITY;
    for (int s = threadIdx.x; s < n_split; s += blockDim.x) M = fmaxf(M, pt[(size_t)s * stride + hd]);
    M = block_reduce<float, true>(M, red);
    for (int s = threadIdx.x; s < n_split; s += blockDim.x) {
        const float m = pt[(size_t)s * stride + hd];
        wsh[s] = m != -INFINITY ? expf(m - M) : 0.0f; /* 0: an empty chunk, skipped below */
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float L = 0.0f;
        for (int s = 0; s < n_split; s++)
            if (pt[(size_t)s * stride + hd] != -INFINITY) L = __fmaf_rn(pt[(size_t)s * stride + hd + 1], wsh[s], L);
        s_L = L;
    }
    __syncthreads();
    const float L = s_L;
    float *o = out + ((int64_t)(tok ? tok[t0 + tl] : t0 + tl) * n_head + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float a = 0.0f;
#pragma unroll 8
        for (int s = 0; s < n_split; s++)
            if (pt[(size_t)s * stride + hd] != -INFINITY) a = __fmaf_rn(pt[(size_t)s * stride + d], wsh[s], a);
        o[d] = a / L;
    }
}

/* k_attn_combine's work spread over the block (HONE_CUDA_COMBINE=1, cu_be.combine2;
 * NOT YET RUN ON A GPU, so not the default): the chunks' weights and L in one
 * strided pass (L summed per thread in chunk order, then the block's fixed
 * tree), the output dims as float2 columns, the AC2_THREADS / (hd / 2) groups
 * of threads each summing every group-th chunk in order, then the groups in
 * order. k_attn_combine sums L on one thread and a dim's chunks on one thread
 * (at 32K positions 256 chunks each, one after the other, on 32 blocks a
 * layer). A row's result still depends only on its own chunks (a fixed order
 * for a given n_split); the bits differ from k_attn_combine's in the
 * summation order. hd even (the partials' rows are hd + 2 floats, 8-byte
 * aligned). */
#define AC2_THREADS 256
static __global__ void __launch_bounds__(AC2_THREADS)
    k_attn_combine2(const float *part, int n_head, int hd, const int32_t *tok, int t0, int n_split, float *out) {
    HC_PDL_ENTER();
    __shared__ float wsh[AC_MAX_SPLIT], red[32];
    __shared__ float2 gsum[AC2_THREADS];
    const int tl = blockIdx.x, h = blockIdx.y, stride = hd + 2, tid = threadIdx.x;
    const float *pt = part + ((size_t)tl * n_head + h) * n_split * stride;
    float M = -INFINITY;
    for (int s = tid; s < n_split; s += AC2_THREADS) M = fmaxf(M, pt[(size_t)s * stride + hd]);
    M = block_reduce<float, true>(M, red);
    float ls = 0.0f;
    for (int s = tid; s < n_split; s += AC2_THREADS) {
        const float m = pt[(size_t)s * stride + hd];
        const float w = m != -INFINITY ? expf(m - M) : 0.0f; /* 0: an empty chunk, skipped below */
        wsh[s] = w;
        if (w != 0.0f) ls = __fmaf_rn(pt[(size_t)s * stride + hd + 1], w, ls);
    }
    const float L = block_reduce<float, false>(ls, red); /* syncs: wsh is visible */
    const int DV = hd >> 1, NG = AC2_THREADS / DV, c = tid % DV, gi = tid / DV;
    float2 a = make_float2(0.0f, 0.0f);
    if (gi < NG) {
#pragma unroll 4
        for (int s = gi; s < n_split; s += NG) {
            const float2 v = *(const float2 *)(pt + (size_t)s * stride + 2 * c);
            const float w = wsh[s];
            if (w != 0.0f) {
                a.x = __fmaf_rn(v.x, w, a.x);
                a.y = __fmaf_rn(v.y, w, a.y);
            }
        }
    }
    gsum[tid] = a;
    __syncthreads();
    float *o = out + ((int64_t)(tok ? tok[t0 + tl] : t0 + tl) * n_head + h) * hd;
    for (int cc = tid; cc < DV; cc += AC2_THREADS) {
        float x = 0.0f, y = 0.0f;
        for (int g2 = 0; g2 < NG; g2++) {
            const float2 v = gsum[g2 * DV + cc];
            x += v.x;
            y += v.y;
        }
        o[2 * cc] = x / L;
        o[2 * cc + 1] = y / L;
    }
}

/* the combine of nt tokens' partials (k_attn_combine2 where asked and hd allows) */
static void attn_combine(cudaStream_t s, bool combine2, const float *part, int nt, int n_head, int hd,
                         const int32_t *tok, int t0, int n_split, float *out) {
    if (combine2 && hd % 2 == 0 && hd / 2 <= AC2_THREADS)
        hc_launch(k_attn_combine2, dim3((unsigned)nt, (unsigned)n_head), AC2_THREADS, 0, s, part, n_head, hd, tok, t0,
                  n_split, out);
    else
        hc_launch(k_attn_combine, dim3((unsigned)nt, (unsigned)n_head), 128, 0, s, part, n_head, hd, tok, t0, n_split,
                  out);
}

bool ck_attention_split_ok(int n_head, int n_head_kv, int head_dim) {
    const int G = n_head_kv > 0 ? n_head / n_head_kv : 0;
    return G >= 1 && G <= AS_MAX_G && G * head_dim <= AS_MAX_GHD && head_dim <= AT_MAX_HD;
}

size_t ck_attention_part_floats(int n_head, int head_dim, int32_t max_positions) {
    const size_t n_split = (size_t)((max_positions + AS_CHUNK - 1) / AS_CHUNK);
    return (size_t)n_head * n_split * (size_t)(head_dim + 2);
}

/* HONE_CUDA_ATTN_V4=0: the f16 cache takes k_attn_part too (to compare) */
static bool attn_v4_on(void) {
    static int on = -1;
    if (on < 0) {
        const char *v = getenv("HONE_CUDA_ATTN_V4");
        on = !(v && !strcmp(v, "0"));
    }
    return on != 0;
}

cudaError_t ck_attention(cudaStream_t s, const float *q, float *out, int n_tokens, int n_head, int n_head_kv,
                         int head_dim, float scale, int32_t window, const ck_kv *g, int layer, const int32_t *pos,
                         const int32_t *seq, const int32_t *bt, int32_t bt_stride, const int32_t *tok, float *part,
                         size_t part_cap, bool tc, bool combine2) {
    if (n_tokens <= 0) return cudaSuccess;
    if (head_dim > AT_MAX_HD || head_dim < 1 || n_head_kv < 1 || n_head % n_head_kv) return cudaErrorInvalidValue;
    /* the split form when the queries of a kv head fit its kernel and the scratch holds one token's partials
     * (the chunks are counted from the step's block table width, which bounds every position) */
    const size_t per_tok = ck_attention_part_floats(n_head, head_dim, bt_stride * g->block_size);
    const int n_split = (bt_stride * g->block_size + AS_CHUNK - 1) / AS_CHUNK;
    if (part && ck_attention_split_ok(n_head, n_head_kv, head_dim) && n_split <= AC_MAX_SPLIT &&
        (n_split == 1 || per_tok <= part_cap)) {
        attn_part_fn kp = g->kt == QT_F16 && g->vt == QT_F16 ? attn_part_nd<true>(head_dim)
                                                              : attn_part_nd<false>(head_dim);
        size_t smem = 0;
        if (g->kt == QT_F16 && g->vt == QT_F16 && attn_v4_on()) {
            attn_part_fn_t k16 = attn_part16(head_dim, n_head / n_head_kv, &smem);
            if (k16) kp = k16;
            else smem = 0;
        }
        const int group = n_split == 1 ? n_tokens
                                       : (int)(part_cap / per_tok < (size_t)n_tokens ? part_cap / per_tok : (size_t)n_tokens);
        if (tc && ck_fattn_dec_ok(n_head, n_head_kv, head_dim, g)) { /* the tensor cores (cuda_fattn.cu), same chunks */
            for (int t0 = 0; t0 < n_tokens; t0 += group) {
                const int nt = n_tokens - t0 < group ? n_tokens - t0 : group;
                const cudaError_t e = ck_fattn_dec(s, dim3((unsigned)nt, (unsigned)n_head_kv, (unsigned)n_split), q, n_head,
                                                   n_head_kv, head_dim, scale, window, g, layer, pos, seq, bt, bt_stride,
                                                   tok, t0, n_split, n_split == 1 ? NULL : part, out);
                if (e != cudaSuccess) return e;
                if (n_split > 1) attn_combine(s, combine2, part, nt, n_head, head_dim, tok, t0, n_split, out);
            }
            return cudaGetLastError();
        }
        for (int t0 = 0; t0 < n_tokens; t0 += group) {
            const int nt = n_tokens - t0 < group ? n_tokens - t0 : group;
            if (n_split == 1) { /* one chunk: the output directly, no combine */
                hc_launch(kp, dim3((unsigned)nt, (unsigned)n_head_kv, 1), AS_THREADS, smem, s,
                    q, n_head, n_head_kv, head_dim, scale, window, *g, layer, pos, seq, bt, bt_stride, tok, t0, 1, (float *)NULL, out);
                continue;
            }
            hc_launch(kp, dim3((unsigned)nt, (unsigned)n_head_kv, (unsigned)n_split), AS_THREADS, smem, s,
                q, n_head, n_head_kv, head_dim, scale, window, *g, layer, pos, seq, bt, bt_stride, tok, t0, n_split,
                part, out);
            attn_combine(s, combine2, part, nt, n_head, head_dim, tok, t0, n_split, out);
        }
        return cudaGetLastError();
    }
    const int hd_pad = (head_dim + 1) & ~1; /* keeps vrow 8-byte aligned */
    const size_t smem = sizeof(float) * (size_t)(hd_pad + AT_THREADS + 32) + sizeof(void *) * AT_THREADS;
    hc_launch(k_attention, dim3((unsigned)n_tokens, (unsigned)n_head), AT_THREADS, smem, s,
        q, out, n_head, n_head_kv, head_dim, scale, window, *g, layer, pos, seq, bt, bt_stride, tok);
    return cudaGetLastError();
}
