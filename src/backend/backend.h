/* backend.h: the interface between model code and the kernels.
 *
 * A backend is a small versioned vtable (be_ops) plus its private state. The
 * model calls only these ops, so it never sees SIMD, threads or CUDA. Shapes:
 *   activations: row-major f32, one row per token, `n` rows;
 *   weights (be_weight): kept in their GGUF type; ne[0] is the row length K,
 *   ne[1] the number of rows N (output features), ne[2] the number of
 *   matrices (experts; 1 for dense). matmul computes y[r][j] = dot(W[j], x[r]).
 * Ops never allocate: `reserve` sizes every scratch buffer once, at load, for
 * the largest batch the caller will submit, and ops must stay inside it.
 * Ops report no errors: arguments are validated by the model at load time.
 *
 * Adding an op: append it to be_ops (never reorder), bump BE_OPS_VERSION, and
 * give it a scalar reference in the cpu backend plus a test (tests/test_backend.c). */
#ifndef HN_BACKEND_H
#define HN_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../core/status.h"
#include "../kv/kv.h"
#include "../quant/blocks.h"

#define BE_OPS_VERSION 3

/* most weights in one matmul_multi call */
#define BE_MULTI_MAX 8

typedef struct be_weight {
    qt_type type;
    int64_t ne[3];     /* K (row length), N (rows), matrices */
    size_t row_bytes;  /* bytes of one row */
    size_t mat_bytes;  /* bytes of one matrix (N rows) */
    const void *data;
    /* set by prepare_weight (version 3), zero otherwise: a backend-owned copy
     * of the weight in a backend layout (layout != 0), which matmuls read
     * instead of data; get_rows always reads data */
    const void *packed;
    int layout;
} be_weight;

/* prepare_weight flags */
enum {
    /* data lies in a read-only file mapping: after repacking, the backend may
     * give those pages back to the OS (a later read, e.g. get_rows of a tied
     * embedding table, faults the rows it touches in again) */
    BE_PREP_DROP_SOURCE = 1u << 0,
};

/* What scratch the ops need, given at load. */
typedef struct be_limits {
    int max_rows;       /* most activation rows in one matmul (tokens x experts used for moe) */
    int64_t max_k;      /* longest row length of any matmul input */
    int max_head_dim;
    int max_group;      /* query heads per kv head */
    int max_experts;    /* expert_count (0 for dense models) */
} be_limits;

typedef enum { BE_ROPE_NORM = 0, BE_ROPE_NEOX = 2 } be_rope_mode;

/* Attention of n_tokens query rows over the paged KV cache. Token t belongs to
 * sequence seqs[t] and sits at position pos[t]; it attends causally to that
 * sequence's cached positions max(0, pos[t]-window+1) .. pos[t] (window 0:
 * no window), whose K/V must already be in the cache (the model stores the
 * batch's K/V first). GQA: query head h reads kv head h / (n_head / n_head_kv). */
typedef struct be_attn_args {
    const float *q;        /* [n_tokens][n_head * head_dim] */
    float *out;            /* [n_tokens][n_head * head_dim] */
    int n_tokens, n_head, n_head_kv, head_dim;
    float scale;           /* usually 1/sqrt(head_dim) */
    int32_t window;
    const kv_cache *kv;
    int layer;
    const int32_t *pos;
    const kv_seq *const *seqs;
} be_attn_args;

typedef struct be_backend be_backend;

typedef struct be_ops {
    int version;       /* BE_OPS_VERSION the backend was built against */
    const char *name;  /* "cpu" */
    void (*free)(be_backend *b);
    /* Sizes scratch for the given limits (may allocate; call at load, not in the token loop). */
    hn_status (*reserve)(be_backend *b, const be_limits *lim, hn_err *err);

    /* out[i] = dequantized row ids[i] of w (an embedding table); ids checked by the caller. */
    void (*get_rows)(be_backend *b, const be_weight *w, const int32_t *ids, int n, float *out);
    /* y[n][N] = x[n][K] . W^T for the matrix `mat` of w (0 for dense weights). */
    void (*matmul)(be_backend *b, const be_weight *w, int mat, const float *x, int n, float *y);
    /* y[r] = x[r] / rms(x[r]) * w (w may be NULL); n rows of dim; y may equal x. */
    void (*rms_norm)(be_backend *b, const float *x, const float *w, int n, int dim, float eps, float *y);
    /* Rotates the first n_rot dims of each of n_head heads of each row in place. */
    void (*rope)(be_backend *b, float *x, int n, int n_head, int head_dim, int n_rot, const int32_t *pos,
                 float freq_base, be_rope_mode mode);
    /* y[i] = a[i] + b[i] for n elements (y may alias a or b). */
    void (*add)(be_backend *b, const float *a, const float *bb, float *y, size_t n);
    /* y[i] = a[i] * b[i]. */
    void (*mul)(be_backend *b, const float *a, const float *bb, float *y, size_t n);
    /* x[r][j] += bias[j] for n rows of dim. */
    void (*add_bias)(be_backend *b, float *x, const float *bias, int n, int dim);
    /* y[i] = silu(gate[i]) * up[i] (y may alias either). */
    void (*swiglu)(be_backend *b, const float *gate, const float *up, float *y, size_t n);
    /* Writes n_tokens K and V rows ([n_tokens][n_head_kv * head_dim]) into each
     * token's sequence at its position for one layer (blocks must be reserved). */
    void (*kv_store)(be_backend *b, kv_cache *kv, int layer, int n_tokens, const float *k, const float *v,
                     const int32_t *pos, const kv_seq *const *seqs);
    void (*attention)(be_backend *b, const be_attn_args *a);
    /* MoE routing: for each of n rows of logits[n][n_expert], softmax, keep the
     * top k experts (lowest id on ties) and their weights normalised to sum 1. */
    void (*moe_route)(be_backend *b, const float *logits, int n, int n_expert, int k, int32_t *ids, float *weights);
    /* Grouped expert matmul: y[r*k+s] = W[ids[r*k+s]] . x_row, where x_row is
     * x[r] if x_shared, else x[r*k+s]. w is 3-D (one matrix per expert). */
    void (*moe_matmul)(be_backend *b, const be_weight *w, const float *x, bool x_shared, int n, int k,
                       const int32_t *ids, float *y);
    /* Index of the largest of n values (lowest index on ties). */
    int32_t (*argmax)(be_backend *b, const float *x, int64_t n);
    /* In-place softmax of n values. */
    void (*softmax)(be_backend *b, float *x, int64_t n);

    /* ---- version 2 ---- */
    /* ys[i][n][N_i] = x[n][K] . W_i^T for n_w (<= BE_MULTI_MAX) dense weights sharing
     * K and the input (q/k/v, gate/up): one activation conversion, one dispatch. */
    void (*matmul_multi)(be_backend *b, int n_w, const be_weight *const *ws, const float *x, int n, float *const *ys);

    /* ---- version 3 ---- */
    /* Readies a matmul weight once at load (after reserve): the backend may
     * repack it into a layout of its own, owned by the backend and freed with
     * it, and record it in w->packed / w->layout (copies of *w made afterwards
     * carry it along). Leaves w unpacked when the type has no layout (or
     * packing is off). Fails only when out of memory. flags: BE_PREP_*. */
    hn_status (*prepare_weight)(be_backend *b, be_weight *w, unsigned flags, hn_err *err);
} be_ops;

struct be_backend {
    const be_ops *ops;
    void *impl;
};

/* Frees a backend (NULL is fine). */
static inline void be_free(be_backend *b) {
    if (b) b->ops->free(b);
}

#endif
