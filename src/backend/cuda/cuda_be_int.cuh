/* cuda_be_int.cuh: private to backend/cuda: the kernel launchers the cuda
 * backend's ops call (cuda_state.cuh holds its state, cuda_ops.cu the ops, cuda_mm.cu
 * the type-templated kernels: get_rows and the dequantizing matmuls,
 * cuda_kern.cu the rest). Launchers queue on a stream and return the launch's
 * error (cudaGetLastError), never waiting. */
#ifndef HN_CUDA_BE_INT_CUH
#define HN_CUDA_BE_INT_CUH

#include <cuda_runtime.h>

#include "cuda_int.cuh"

/* C headers (quant.h says restrict, which C++ spells __restrict__) */
#define restrict __restrict__
extern "C" {
#include "../../quant/quant.h"
#include "../backend.h"
}
#undef restrict

/* A weight as the dequantizing kernels see it: the GGUF rows as in the file
 * (raw), or hc_weight's planes (planes: the nine hc_gemv types). n rows per
 * matrix, mats matrices, rows of all matrices consecutive. */
struct cm_w {
    qt_type type;
    bool planes;
    const uint8_t *raw;
    size_t row_bytes;
    const uint8_t *plane[4];
    int64_t k, n, mats;
};

/* types the decoders know in the file layout (every type with a CPU to_float but q8_1, q8_K) */
bool cm_raw_supports(qt_type t);
/* out[i] = row ids[i] of matrix 0 (f32 [n][k]); ids outside [0, rows) give zero rows */
cudaError_t cm_get_rows(cudaStream_t s, const cm_w *w, int n, const int32_t *ids, float *out);
/* y[n][N] = x[n][K] . W[mat]^T: each weight row decoded once per 32 activation
 * rows into shared memory, f32 products summed in f32 (dbl: in f64). Lane l of
 * a warp sums elements l, l+32, ... in order, then the warp by shuffles, so a
 * result does not depend on n (cm_matmul_slots computes the same). reg: an f32 matrix's
 * rows beyond a few on k_mm_reg (the same bits; cuda_mm.cu, not yet run on a GPU). */
cudaError_t cm_matmul_tile(cudaStream_t s, const cm_w *w, int mat, const float *x, int n, float *y, bool dbl,
                           bool reg);
/* y[r*k+s] = W[ids[r*k+s]] . x_row (x_row = x[r] if shared, else x[r*k+s]) for
 * r < n: one warp per (slot, output), the same sums as cm_matmul_tile; an id
 * outside [0, mats) gives a zero row. */
cudaError_t cm_matmul_slots(cudaStream_t s, const cm_w *w, const float *x, bool shared, int n, int k,
                            const int32_t *ids, float *y, bool dbl);

/* The CPU backend's activation rounding for weights of type t (dot.c: Q8_0
 * for the 32-block types, Q8_1's values for q4_1/q5_1, Q8_K for the
 * 256-block types, bf16 for bf16): out = dequant(quant(x)), n rows of k
 * (a whole number of the weight's blocks), with the CPU's arithmetic, so
 * that the dequantizing matmuls see the activations the CPU's integer dots
 * see. Returns false (nothing queued) for f32 and f16 weights, which take x
 * as it is. */
bool cm_act_rounds(qt_type t);
cudaError_t cm_act_round(cudaStream_t s, qt_type t, const float *x, int64_t k, int n, float *out);

/* where K/V rows live: kv.h's location math, by value */
struct ck_kv {
    unsigned char *base;
    size_t block_bytes, layer_bytes, k_row_bytes, v_row_bytes, k_head_bytes, v_head_bytes;
    int block_size;
    qt_type kt, vt;
    int64_t row_elems;
};

/* the recurrent-state slots of a layer: slot i's bytes at base + i * slot_bytes, this layer's at + off */
struct ck_state {
    unsigned char *base;
    size_t slot_bytes, off;
};

/* the delta rule's arguments (be_delta_args with device pointers) */
struct ck_delta {
    const float *q, *k, *v, *alpha, *beta, *dt_bias, *A;
    float *out;
    int n, Nk, Nv, S;
};

/* cuda_ssm.cu: the hybrid ops (backend.h version 5) */
cudaError_t ck_copy_cols(cudaStream_t s, const float *x, int x_ld, int x_off, int n, int nc, float *y, int y_ld,
                         int y_off);
cudaError_t ck_sigmoid_mul(cudaStream_t s, const float *x, const float *g, int n, int dim, int g_dim, float *y);
cudaError_t ck_l2_norm(cudaStream_t s, const float *x, int n, int dim, float eps, float *y);
cudaError_t ck_rope_multi(cudaStream_t s, float *x, int n, int n_head, int head_dim, int n_rot, float theta_scale,
                          const int32_t sections[4], const int32_t *pos);
cudaError_t ck_ssm_conv(cudaStream_t s, const float *x, const float *w, int n, int channels, int kernel,
                        const ck_state *st, const int32_t *pos, const int32_t *seq, const int32_t *slot,
                        const int32_t *state_slot, const int32_t *snap, float *y);
/* once per backend, before any graph capture: kernel attributes (the delta rule's shared memory) */
cudaError_t ck_init(void);
/* the largest head dim the delta rule takes (its state sits in shared memory) */
int ck_delta_max_dim(void);
cudaError_t ck_delta_net(cudaStream_t s, const ck_delta *a, const ck_state *st, int n_seqs, const int32_t *pos,
                         const int32_t *seq, const int32_t *slot, const int32_t *state_slot, const int32_t *snap);

/* y = rms_norm(x) (* w if w), n rows of dim: k_rms_norm, or with rtc (HONE_CUDA_RTC=1) the NVRTC
 * kernel with dim baked in when it can be had (ck_rms_norm_rtc; the same bits) */
cudaError_t ck_rms_norm(cudaStream_t s, const float *x, const float *w, int n, int dim, float eps, float *y, bool rtc);
/* queues the NVRTC rms_norm (cuda_rtc_k.cu, compiled or read from the cache at its first use on the
 * device) and returns true; false, nothing queued, when it cannot be had: the caller runs k_rms_norm */
bool ck_rms_norm_rtc(cudaStream_t s, const float *x, const float *w, int n, int dim, float eps, float *y);
cudaError_t ck_rope(cudaStream_t s, float *x, int n, int n_head, int head_dim, int n_rot, float theta_scale,
                    bool neox, const int32_t *pos);
cudaError_t ck_add(cudaStream_t s, const float *a, const float *b, float *y, size_t n);
cudaError_t ck_add_bias(cudaStream_t s, float *x, const float *bias, int n, int dim);
cudaError_t ck_swiglu(cudaStream_t s, const float *g, const float *u, float *y, size_t n);
cudaError_t ck_moe_route(cudaStream_t s, const float *logits, int n, int n_expert, int k, int32_t *ids, float *w);
cudaError_t ck_moe_combine(cudaStream_t s, const float *y, const float *w, int n, int k, int dim, float *out);
cudaError_t ck_gather_out(cudaStream_t s, const float *x, int dim, int n_out, const int32_t *rows, float *out);
cudaError_t ck_mask_logits(cudaStream_t s, float *l, const uint32_t *allowed, int64_t n_vocab);
cudaError_t ck_kv_store(cudaStream_t s, const ck_kv *g, int layer, const float *k, const float *v, int n,
                        const int32_t *slot);
/* attention over the paged cache (head_dim <= 512): the split form (flash decoding: chunks of 128
 * positions per block, the kv head's query heads together, then a combine) when the heads allow
 * and `part` (part_cap floats of device scratch) holds a token's partials; else one block per
 * (token, head), an online softmax over the positions in chunks of 128; tc: decode rows on the
 * tensor cores (ck_fattn_dec) where they take them; combine2: the chunks combined by
 * k_attn_combine2 (cuda_kern.cu; not yet run on a GPU) */
cudaError_t ck_attention(cudaStream_t s, const float *q, float *out, int n_tokens, int n_head, int n_head_kv,
                         int head_dim, float scale, int32_t window, const ck_kv *g, int layer, const int32_t *pos,
                         const int32_t *seq, const int32_t *bt, int32_t bt_stride, const int32_t *tok, float *part,
                         size_t part_cap, bool tc, bool combine2);
/* (tok: NULL, tokens 0 .. n_tokens - 1; else those n_tokens tokens of the step. tc: the split form
 * may take the tensor cores, ck_fattn_dec, where it allows the heads.)
 * cuda_fattn.cu: prefill attention on the tensor cores for tiles of at most
 * ck_fattn_tile_tokens() consecutive tokens of one sequence at consecutive
 * positions (tiles: pairs first token, tokens), f16 K and V, head_dim 64 or
 * 128 (ck_fattn_ok); ck_fattn_init once before use (its shared memory) */
int ck_fattn_tile_tokens(void);
bool ck_fattn_ok(int n_head, int n_head_kv, int head_dim, const ck_kv *g);
cudaError_t ck_fattn_init(void);
cudaError_t ck_fattn(cudaStream_t s, const float *q, float *out, const int32_t *tiles, int n_tiles, int n_head,
                     int n_head_kv, int head_dim, float scale, int32_t window, const ck_kv *g, int layer,
                     const int32_t *pos, const int32_t *seq, const int32_t *bt, int32_t bt_stride);
/* decode rows on the tensor cores (cuda_fattn.cu: k_fattn_dec): f16 K and V, head_dim 64 or 128, at
 * most 16 query heads a kv head (HONE_CUDA_FDEC=0: off); one warp per (token, kv head, chunk of
 * ck_fattn_dec_chunk() positions), partials in the split form's layout (part NULL: one chunk, the
 * output written directly) */
bool ck_fattn_dec_ok(int n_head, int n_head_kv, int head_dim, const ck_kv *g);
int ck_fattn_dec_chunk(void);
cudaError_t ck_fattn_dec(cudaStream_t s, dim3 grid, const float *q, int n_head, int n_head_kv, int head_dim,
                         float scale, int32_t window, const ck_kv *g, int layer, const int32_t *pos,
                         const int32_t *seq, const int32_t *bt, int32_t bt_stride, const int32_t *tok, int t0,
                         int n_split, float *part, float *out);
/* whether the split (flash-decoding) form takes these heads, and the scratch floats one token needs */
bool ck_attention_split_ok(int n_head, int n_head_kv, int head_dim);
size_t ck_attention_part_floats(int n_head, int head_dim, int32_t max_positions);
/* K/V element types kv_store and attention take */
bool ck_kv_type_ok(qt_type t, bool is_v);
/* fused q/k per-head rms-norm (qw, kw may be NULL: none), rope of both, and the KV store (cuda_kern.cu) */
bool ck_qk_rope_store_ok(int head_dim, int n_rot, const ck_kv *g);
cudaError_t ck_qk_rope_store(cudaStream_t s, float *q, float *k, const float *v, const float *qw, const float *kw,
                             int n, int n_head, int n_head_kv, int head_dim, float eps_q, float eps_k, int n_rot,
                             float theta_scale, bool neox, const int32_t *pos, const ck_kv *g, int layer,
                             const int32_t *slot);

#endif
