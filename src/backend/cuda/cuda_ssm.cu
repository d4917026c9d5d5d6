/* cuda_ssm.cu: the cuda backend's kernels for hybrid (Gated DeltaNet)
 * layers (backend.h, version 5): strided column copies, sigmoid gating, L2
 * norm, multi-section rope, the short causal conv over each sequence's conv
 * state and the gated delta rule over each sequence's delta state, in the
 * CPU backend's order of operations (cpu_ssm.c) with explicitly rounded
 * operations where the CPU rounds; the recurrences run in token order per
 * sequence. Correct before fast: the delta rule is one block per (value
 * head, sequence), one thread per state row, the state in shared memory for
 * the step. Both recurrences also write the state after a token into the
 * plan's snapshot slot for it (state_snap), when it names one. */
#include <math.h>
#include <stdint.h>

#include "cuda_be_int.cuh"

static unsigned grid_of(size_t n) {
    const size_t b = (n + 255) / 256;
    return (unsigned)(b < 65536 ? b : 65536);
}

/* ---- copy_cols, sigmoid_mul, l2_norm ---- */

static __global__ void k_copy_cols(const float *x, int x_ld, int x_off, int n, int nc, float *y, int y_ld, int y_off) {
    HC_PDL_ENTER();
    const size_t total = (size_t)n * (size_t)nc;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / (size_t)nc, c = i % (size_t)nc;
        y[r * (size_t)y_ld + (size_t)y_off + c] = x[r * (size_t)x_ld + (size_t)x_off + c];
    }
}

cudaError_t ck_copy_cols(cudaStream_t s, const float *x, int x_ld, int x_off, int n, int nc, float *y, int y_ld,
                         int y_off) {
    if (n <= 0 || nc <= 0) return cudaSuccess;
    hc_launch(k_copy_cols, grid_of((size_t)n * (size_t)nc), 256, 0, s, x, x_ld, x_off, n, nc, y, y_ld, y_off);
    return cudaGetLastError();
}

static __global__ void k_sigmoid_mul(const float *x, const float *g, int dim, int g_dim, size_t total, float *y) {
    HC_PDL_ENTER();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / (size_t)dim, c = i % (size_t)dim;
        const float gv = g[r * (size_t)g_dim + (g_dim == 1 ? 0 : c)];
        /* the sigmoid, then a product (as the CPU and ggml) */
        const float sg = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-gv)));
        y[i] = __fmul_rn(x[i], sg);
    }
}

cudaError_t ck_sigmoid_mul(cudaStream_t s, const float *x, const float *g, int n, int dim, int g_dim, float *y) {
    const size_t total = (size_t)n * (size_t)dim;
    if (!total) return cudaSuccess;
    hc_launch(k_sigmoid_mul, grid_of(total), 256, 0, s, x, g, dim, g_dim, total, y);
    return cudaGetLastError();
}

/* one warp a row: float squares summed in double (as the CPU) */
static __global__ void k_l2_norm(const float *x, int n, int dim, float eps, float *y) {
    HC_PDL_ENTER();
    const int64_t r = (int64_t)blockIdx.x * 4 + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (r >= n) return;
    const float *xr = x + r * dim;
    float *yr = y + r * dim;
    double ss = 0.0;
    for (int i = lane; i < dim; i += 32) ss += (double)__fmul_rn(xr[i], xr[i]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float nrm = __fsqrt_rn((float)ss);
    const float scale = __fdiv_rn(1.0f, nrm > eps ? nrm : eps);
    for (int i = lane; i < dim; i += 32) yr[i] = __fmul_rn(xr[i], scale);
}

cudaError_t ck_l2_norm(cudaStream_t s, const float *x, int n, int dim, float eps, float *y) {
    if (n <= 0 || dim <= 0) return cudaSuccess;
    hc_launch(k_l2_norm, (unsigned)((n + 3) / 4), 128, 0, s, x, n, dim, eps, y);
    return cudaGetLastError();
}

/* ---- rope_multi: NEOX pairs, text positions in the t/h/w sections, e unrotated ---- */

static __global__ void k_rope_multi(float *x, int n_head, int head_dim, int n_rot, float theta_scale, int s0, int s1,
                                    int s2, const int32_t *pos) {
    HC_PDL_ENTER();
    const int r = blockIdx.x, half = n_rot / 2;
    const int sec_n[3] = {s0, s1, s2};
    for (int t = threadIdx.x; t < n_head * half; t += blockDim.x) {
        const int h = t / half, i = t % half;
        if (i >= 3 * sec_n[i % 3]) continue; /* position 0: cos 1, sin 0 leaves the pair as it is */
        float theta = (float)pos[r];
        for (int q = 0; q < i; q++) theta = __fmul_rn(theta, theta_scale);
        const float cs = cosf(theta), sn = sinf(theta);
        float *v = x + ((int64_t)r * n_head + h) * head_dim;
        const float a = v[i], b = v[i + half];
        v[i] = __fsub_rn(__fmul_rn(a, cs), __fmul_rn(b, sn));
        v[i + half] = __fadd_rn(__fmul_rn(a, sn), __fmul_rn(b, cs));
    }
}

cudaError_t ck_rope_multi(cudaStream_t s, float *x, int n, int n_head, int head_dim, int n_rot, float theta_scale,
                          const int32_t sections[4], const int32_t *pos) {
    if (n <= 0 || n_rot < 2) return cudaSuccess;
    hc_launch(k_rope_multi, (unsigned)n, 128, 0, s, x, n_head, head_dim, n_rot, theta_scale, sections[0], sections[1],
                                             sections[2], pos);
    return cudaGetLastError();
}

/* ---- the short conv: one thread per channel, the plan's tokens in order ---- */

static __global__ void k_ssm_conv(const float *x, const float *w, int n, int C, int K, ck_state st,
                                  const int32_t *pos, const int32_t *seq, const int32_t *slot,
                                  const int32_t *state_slot, const int32_t *snap, float *y) {
    HC_PDL_ENTER();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= C) return;
    const float *wi = w + (size_t)i * (size_t)K;
    for (int t = 0; t < n; t++) {
        if (slot[t] < 0) continue; /* padding */
        float *sp = (float *)(st.base + (size_t)state_slot[seq[t]] * st.slot_bytes + st.off);
        if (pos[t] == 0)
            for (int j = 0; j < K - 1; j++) sp[(size_t)j * C + i] = 0.0f;
        const float xv = x[(size_t)t * C + i];
        float acc = 0.0f;
        for (int j = 0; j < K - 1; j++) acc = __fmaf_rn(sp[(size_t)j * C + i], wi[j], acc);
        acc = __fmaf_rn(xv, wi[K - 1], acc);
        for (int j = 0; j + 1 < K - 1; j++) sp[(size_t)j * C + i] = sp[(size_t)(j + 1) * C + i];
        if (K > 1) sp[(size_t)(K - 2) * C + i] = xv;
        y[(size_t)t * C + i] = __fdiv_rn(acc, __fadd_rn(1.0f, expf(-acc)));
        if (snap[t] >= 0) { /* the window after this token into its snapshot slot */
            float *sn = (float *)(st.base + (size_t)snap[t] * st.slot_bytes + st.off);
            for (int j = 0; j < K - 1; j++) sn[(size_t)j * C + i] = sp[(size_t)j * C + i];
        }
    }
}

cudaError_t ck_ssm_conv(cudaStream_t s, const float *x, const float *w, int n, int channels, int kernel,
                        const ck_state *st, const int32_t *pos, const int32_t *seq, const int32_t *slot,
                        const int32_t *state_slot, const int32_t *snap, float *y) {
    if (n <= 0 || channels <= 0) return cudaSuccess;
    hc_launch(k_ssm_conv, (unsigned)((channels + 127) / 128), 128, 0, s, x, w, n, channels, kernel, *st, pos, seq, slot,
                                                                  state_slot, snap, y);
    return cudaGetLastError();
}

/* ---- the gated delta rule ----
 * Block (value head j, sequence s); thread vi owns state row vi. The state
 * sits in shared memory column-major (element (vi, ki) at ki * S + vi, so
 * that the threads of a warp touch consecutive words) for the whole step,
 * loaded from and stored back to the slot's row-major matrix. Per token:
 * decay, k-dot, rank-1 update, q-dot, as the CPU does it. */

static __device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : logf(__fadd_rn(1.0f, expf(x))); }

static __global__ void k_delta_net(ck_delta a, ck_state st, const int32_t *pos, const int32_t *seq,
                                   const int32_t *slot, const int32_t *state_slot, const int32_t *snap) {
    HC_PDL_ENTER();
    extern __shared__ float sm[];
    const int S = a.S, Nk = a.Nk, Nv = a.Nv;
    const int j = blockIdx.x, s = blockIdx.y, kh = j % Nk, vi = threadIdx.x;
    float *M = sm, *kq = sm + (size_t)S * S; /* k then q of the current token */
    float *Mg = (float *)(st.base + (size_t)state_slot[s] * st.slot_bytes + st.off) + (size_t)j * S * S;
    for (int e = threadIdx.x; e < S * S; e += blockDim.x) M[(e % S) * S + e / S] = Mg[e];
    __syncthreads();
    const float scale = __fdiv_rn(1.0f, __fsqrt_rn((float)S));
    for (int t = 0; t < a.n; t++) {
        if (seq[t] != s || slot[t] < 0) continue;
        const size_t qk_at = (size_t)t * Nk * S + (size_t)kh * S, v_at = (size_t)t * Nv * S + (size_t)j * S;
        for (int e = threadIdx.x; e < S; e += blockDim.x) {
            kq[e] = a.k[qk_at + e];
            kq[S + e] = a.q[qk_at + e];
        }
        if (pos[t] == 0)
            for (int e = threadIdx.x; e < S * S; e += blockDim.x) M[e] = 0.0f;
        __syncthreads();
        if (vi < S) {
            const float g = __fmul_rn(softplus_f(__fadd_rn(a.alpha[(size_t)t * Nv + j], a.dt_bias[j])), a.A[j]);
            const float beta = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-a.beta[(size_t)t * Nv + j])));
            const float decay = expf(g);
            float dot = 0.0f;
            for (int ki = 0; ki < S; ki++) {
                const float m = __fmul_rn(M[ki * S + vi], decay);
                M[ki * S + vi] = m;
                dot = __fmaf_rn(m, kq[ki], dot);
            }
            const float d = __fmul_rn(__fsub_rn(a.v[v_at + vi], dot), beta);
            float o = 0.0f;
            for (int ki = 0; ki < S; ki++) {
                const float m = __fmaf_rn(kq[ki], d, M[ki * S + vi]);
                M[ki * S + vi] = m;
                o = __fmaf_rn(m, kq[S + ki], o);
            }
            a.out[v_at + vi] = __fmul_rn(o, scale);
        }
        __syncthreads(); /* kq is reloaded for the next token */
        if (snap[t] >= 0) { /* the state after this token into its snapshot slot (row-major, as the slot) */
            float *Ms = (float *)(st.base + (size_t)snap[t] * st.slot_bytes + st.off) + (size_t)j * S * S;
            for (int e = threadIdx.x; e < S * S; e += blockDim.x) Ms[e] = M[(e % S) * S + e / S];
            __syncthreads(); /* before the next token changes M */
        }
    }
    for (int e = threadIdx.x; e < S * S; e += blockDim.x) Mg[e] = M[(e % S) * S + e / S];
}

int ck_delta_max_dim(void) { return 200; }

cudaError_t ck_init(void) {
    const int S = ck_delta_max_dim();
    return cudaFuncSetAttribute(k_delta_net, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)(sizeof(float) * ((size_t)S * S + 2 * (size_t)S)));
}

cudaError_t ck_delta_net(cudaStream_t s, const ck_delta *a, const ck_state *st, int n_seqs, const int32_t *pos,
                         const int32_t *seq, const int32_t *slot, const int32_t *state_slot, const int32_t *snap) {
    if (a->n <= 0 || n_seqs <= 0) return cudaSuccess;
    if (a->S < 1 || a->S > ck_delta_max_dim()) return cudaErrorInvalidValue;
    const size_t smem = sizeof(float) * ((size_t)a->S * a->S + 2 * (size_t)a->S); /* within ck_init's limit */
    const unsigned threads = (unsigned)((a->S + 31) / 32 * 32);
    hc_launch(k_delta_net, dim3((unsigned)a->Nv, (unsigned)n_seqs), threads, smem, s, *a, *st, pos, seq, slot, state_slot, snap);
    return cudaGetLastError();
}
