/* backend.h: the interface between model code and the kernels (DESIGN.md,
 * "The backend").
 *
 * A backend is a small versioned vtable (be_ops) plus its private state. The
 * model calls only these ops, so it never sees SIMD, threads, CUDA or memory:
 * everything it computes on is a be_tensor handle made by the backend, at
 * load: weights with weight_load (from their host source, the file mapping),
 * activations with tensor_new (carved from an arena sized at reserve). On the
 * CPU a handle's data is a host pointer, on a GPU a device pointer; only the
 * backend dereferences it.
 *
 * Shapes: activations are row-major, one row per token; ops take the row
 * count (and, where a tensor is viewed with another row length, e.g. one row
 * per head, the row length) explicitly. Weights keep their GGUF type: ne[0]
 * is the row length K, ne[1] the number of rows N (output features), ne[2]
 * the number of matrices (experts; 1 for dense). matmul computes
 * y[r][j] = dot(W[j], x[r]).
 *
 * A step: plan_set hands the backend the step's plan (sched/plan.h: tokens,
 * positions, KV slots, block table, sequence lengths, wanted rows; one upload
 * on a GPU), then the model enqueues ops, then fetch queues the logits' copy
 * to the host and sync waits. Ops return nothing: sync returns the first
 * error since the last sync (the single error point). Ops never allocate.
 *
 * Adding an op: append it to be_ops (never reorder), bump BE_OPS_VERSION,
 * and give it a scalar reference plus a case in tests/test_backend_ops.c. */
#ifndef HN_BACKEND_H
#define HN_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../core/status.h"
#include "../kv/kv.h"
#include "../quant/blocks.h"
#include "../sched/plan.h"

/* version 4: handles, plans and one sync per step replaced the host-pointer
 * ops of versions 1-3; append-only from here. Version 5: the hybrid
 * (Gated DeltaNet) ops, copy_cols .. state_copy. Version 6: ssm_conv and
 * delta_net also write the state after a token into the plan's snapshot
 * slot for it (plan->state_snap), which speculation rolls back to. Version
 * 7: mem_info, the device memory a model must fit in. Version 8:
 * scratch_bytes, and reserve may be called again (the scratch follows the
 * load). Version 9: tune_info, what the tuner keys a backend's winners by
 * and at which call sizes it tunes them (tuning on the device). */
#define BE_OPS_VERSION 9

/* most weights in one matmul_multi call */
#define BE_MULTI_MAX 8

/* A tensor handle. The fields describe it; data is backend memory. */
typedef struct be_tensor {
    qt_type type;      /* element type: a GGUF type for weights, QT_F32 or QT_I32 for activations */
    int64_t ne[3];     /* row length, rows, matrices */
    size_t row_bytes;  /* bytes of one row */
    size_t mat_bytes;  /* bytes of one matrix (ne[1] rows) */
    void *data;        /* backend memory (never dereferenced outside the backend) */
    /* a backend-owned copy in a backend layout (layout != 0), which matmuls
     * read instead of data; zero when the weight is used as loaded */
    const void *packed;
    int layout;
} be_tensor;

/* Where a weight comes from: host bytes (usually the file mapping), which
 * must outlive the backend unless it copies them (BE_W_DROP_SOURCE says the
 * backend may give the pages back once it has its copy). */
typedef struct be_weight_src {
    const char *name;  /* for messages */
    qt_type type;
    int64_t ne[3];
    const void *data;
    size_t bytes;
} be_weight_src;

/* weight_load flags */
enum {
    BE_W_MATMUL = 1u << 0,      /* read by matmuls: the backend may repack it */
    BE_W_ROWS = 1u << 1,        /* read by get_rows (an embedding table) */
    /* the source lies in a read-only file mapping: after copying it, the
     * backend may give those pages back (a later read faults them in again) */
    BE_W_DROP_SOURCE = 1u << 2,
};

/* The rows of one activation tensor that the coming steps touch at most (be_limits.act). */
typedef struct be_act_rows {
    const be_tensor *t;
    int64_t rows;
} be_act_rows;

/* What scratch the ops need: given at load, and again whenever the steps to
 * come need more (or, to give memory back, less); see reserve. */
typedef struct be_limits {
    int max_rows;       /* most activation rows in one matmul (tokens x experts used for moe) */
    int64_t max_k;      /* longest row length of any matmul input */
    int max_head_dim;
    int max_group;      /* query heads per kv head */
    int max_experts;    /* expert_count (0 for dense models) */
    size_t arena_bytes; /* activation tensors the caller will make (sum of be_tensor_bytes) */
    /* For tensors already made: the first `rows` rows of act[i].t are all
     * that ops will touch until the next reserve (at most the tensor's own
     * ne[1]). A backend may back only those with memory and give the rest
     * back, at the same address. Tensors not listed, and all of them when
     * act is NULL: whole. */
    const be_act_rows *act;
    int n_act;
} be_limits;

typedef enum { BE_ROPE_NORM = 0, BE_ROPE_NEOX = 2 } be_rope_mode;

/* Attention of the plan's tokens over the paged KV cache: token t attends
 * causally to its sequence's positions max(0, pos[t]-window+1) .. pos[t]
 * (window 0: no window) through the plan's block table; their K/V must be
 * stored already (kv_store of this layer first). GQA: query head h reads kv
 * head h / (n_head / n_head_kv). q and out are [n_tokens][n_head * head_dim]. */
typedef struct be_attn_args {
    const be_tensor *q;
    be_tensor *out;
    int n_tokens, n_head, n_head_kv, head_dim;
    float scale;           /* usually 1/sqrt(head_dim) */
    int32_t window;
    const kv_cache *kv;
    int layer;
} be_attn_args;

/* The gated delta rule (Gated DeltaNet) over the plan's tokens, in token
 * order per sequence, on each sequence's recurrent state (plan->state_slot;
 * the state starts from zero at a token at position 0; padding rows, slot
 * -1, are skipped). Per value head j (reading key/query head j % n_k_heads),
 * with g = softplus(alpha[t][j] + dt_bias[j]) * a[j] and
 * b = sigmoid(beta[t][j]), the state M (S x S, rows = value index) does
 *   M = exp(g) M;  M += b (v - M k) k^T;  out = M q / sqrt(S)
 * q, k are [n][n_k_heads * S] (L2-normalised by the caller), v and out
 * [n][n_v_heads * S], alpha and beta [n][n_v_heads] (raw projections). The
 * state of this layer sits at byte state_off of each slot: n_v_heads S x S
 * f32 matrices, row-major. Snapshots: where plan->state_snap[t] >= 0, this
 * layer's state right after token t is also written at state_off of that
 * slot (the sequence's own slot still ends with the state after its last
 * token); a sequence with snapshots, or rowwise, is computed token by token,
 * each token as a one-token step would compute it. */
typedef struct be_delta_args {
    const be_tensor *q, *k, *v, *alpha, *beta;
    const be_tensor *dt_bias, *a; /* [n_v_heads] f32 weights */
    be_tensor *out;
    int n_tokens, n_k_heads, n_v_heads, head_dim;
    const kv_cache *kv;
    size_t state_off;
} be_delta_args;

/* Matmul parameters, as the tuner chooses them (all 0: the defaults). They
 * change speed only, never results beyond float summation order. The
 * meaning of kernel and pack indices is the backend's (mm_candidates lists
 * them). */
typedef struct be_mm_params {
    int kernel;
    int chunks;
    int threads;
    int pack;
    int tile;
} be_mm_params;

/* A matmul shape and call size to tune (the tuner's model driver, tune/apply.h). */
typedef struct be_mm_case {
    qt_type type;
    int64_t k, n;          /* row length, rows */
    int rows;              /* activation rows per call (1: decode) */
    const void *const *mats; /* n_mats host matrices of this shape to time on (NULL: synthetic) */
    int n_mats;
    size_t rotate_bytes;   /* copies the runs rotate through, so weights stream as in a step */
    bool all_threads;      /* keep the thread count fixed (a busy machine) */
} be_mm_case;

/* What the tuner asks of a backend (tune_info, version 9). */
#define BE_TUNE_ROWS 8
typedef struct be_tune_info {
    char fingerprint[32]; /* the key its winners are cached under ("": the host's, tune/probe.h) */
    char device[160];     /* the device, for `hone tune` ("": the host's probe) */
    /* call sizes the decode family is tuned at, ascending from 1: a call of
     * r rows takes the entry of the largest decode_rows[i] <= r */
    int decode_rows[BE_TUNE_ROWS];
    int n_decode;
    bool prefill; /* whether the prefill family (tune/apply.h's row counts) applies */
} be_tune_info;

struct tn_case;
typedef struct be_backend be_backend;

typedef struct be_ops {
    int version;       /* BE_OPS_VERSION the backend was built against */
    const char *name;  /* "cpu", "cuda" */
    void (*free)(be_backend *b);
    /* Sizes scratch and the activation arena (may allocate). First at load,
     * before any tensor; then again between steps (after a sync, nothing
     * queued) whenever the coming steps need other limits, larger or smaller
     * (scratch for the rows actually run, grown on a new high-water mark and
     * given back when idle). A later call: arena_bytes counts only tensors
     * still to be made (0: none), every handle made stays valid with the
     * same data pointer (memory grows and shrinks in place), and the ops of
     * the steps after it keep within its limits (max_rows, the act rows).
     * Limits the backend already meets allocate nothing. After a failed
     * call, steps fail (at sync) until a reserve succeeds. */
    hn_status (*reserve)(be_backend *b, const be_limits *lim, hn_err *err);

    /* ---- tensors (at load, after reserve) ---- */
    /* An activation tensor of ne1 rows of ne0 elements (QT_F32 or QT_I32) from the arena. */
    hn_status (*tensor_new)(be_backend *b, qt_type type, int64_t ne0, int64_t ne1, be_tensor **out, hn_err *err);
    /* A weight made from host bytes (uploaded, referenced or repacked). flags: BE_W_*. */
    hn_status (*weight_load)(be_backend *b, const be_weight_src *src, unsigned flags, be_tensor **out, hn_err *err);
    /* Where the KV pool's bytes live (kv_config.storage). */
    const kv_storage *(*kv_storage)(be_backend *b);

    /* ---- a step ---- */
    /* The step's plan (borrowed until the step's sync). */
    void (*plan_set)(be_backend *b, const step_plan *p);
    /* Queues the copy of t's first n_rows rows to host memory; *host is valid after sync, until the next step. */
    void (*fetch)(be_backend *b, const be_tensor *t, int n_rows, const void **host);
    /* Queues a copy of n host bytes into t at byte offset off (inputs computed
     * on the host: tests, tools); the host bytes are copied at the call. */
    void (*upload)(be_backend *b, be_tensor *t, size_t off, const void *host, size_t n);
    /* Waits for every op queued since the last sync; the first error since then. */
    hn_status (*sync)(be_backend *b, hn_err *err);

    /* ---- compute (queued) ---- */
    /* out[i] = dequantized row plan->token[i] of w for i < n. */
    void (*get_rows)(be_backend *b, const be_tensor *w, int n, be_tensor *out);
    /* y[n][N] = x[n][K] . W^T for the matrix `mat` of w (0 for dense weights). */
    void (*matmul)(be_backend *b, const be_tensor *w, int mat, const be_tensor *x, int n, be_tensor *y);
    /* ys[i][n][N_i] = x[n][K] . W_i^T for n_w (<= BE_MULTI_MAX) dense weights sharing
     * K and the input (q/k/v, gate/up): one activation conversion, one dispatch. */
    void (*matmul_multi)(be_backend *b, int n_w, const be_tensor *const *ws, const be_tensor *x, int n,
                         be_tensor *const *ys);
    /* y[r] = x[r] / rms(x[r]) * w (w may be NULL) for n rows of dim; y may be x. */
    void (*rms_norm)(be_backend *b, const be_tensor *x, const be_tensor *w, int n, int dim, float eps, be_tensor *y);
    /* Rotates the first n_rot dims of each of n_head heads of row i < n in
     * place, at position plan->pos[i]. */
    void (*rope)(be_backend *b, be_tensor *x, int n, int n_head, int head_dim, int n_rot, float freq_base,
                 be_rope_mode mode);
    /* y[i] = a[i] + b[i] for the first n elements (y may be a or b). */
    void (*add)(be_backend *b, const be_tensor *a, const be_tensor *bb, be_tensor *y, size_t n);
    /* x[r][j] += bias[j] for n rows of dim. */
    void (*add_bias)(be_backend *b, be_tensor *x, const be_tensor *bias, int n, int dim);
    /* y[i] = silu(gate[i]) * up[i] for the first n elements (y may be either). */
    void (*swiglu)(be_backend *b, const be_tensor *gate, const be_tensor *up, be_tensor *y, size_t n);
    /* Stores rows i < n of k and v ([n][n_head_kv * head_dim]) of one layer
     * at their plan slots (slot -1: nothing), converting to the cache's types. */
    void (*kv_store)(be_backend *b, kv_cache *kv, int layer, const be_tensor *k, const be_tensor *v, int n);
    void (*attention)(be_backend *b, const be_attn_args *a);
    /* MoE routing: for each of n rows of logits[n][n_expert], softmax, keep the
     * top k experts (lowest id on ties) into ids[n*k] (QT_I32) and their
     * weights normalised to sum 1 into weights[n*k]. */
    void (*moe_route)(be_backend *b, const be_tensor *logits, int n, int n_expert, int k, be_tensor *ids,
                      be_tensor *weights);
    /* Grouped expert matmul: y[r*k+s] = W[ids[r*k+s]] . x_row, where x_row is
     * x[r] if x_shared, else x[r*k+s]. w is 3-D (one matrix per expert). */
    void (*moe_matmul)(be_backend *b, const be_tensor *w, const be_tensor *x, bool x_shared, int n, int k,
                       const be_tensor *ids, be_tensor *y);
    /* out[r] = sum_s w[r*k+s] * y[r*k+s] (rows of dim), for r < n: the routed experts' outputs weighted. */
    void (*moe_combine)(be_backend *b, const be_tensor *y, const be_tensor *w, int n, int k, int dim,
                        be_tensor *out);
    /* out[i] = x[plan->out_rows[i]] (rows of dim) for i < plan->n_out. */
    void (*gather_out)(be_backend *b, const be_tensor *x, int dim, be_tensor *out);
    /* Row `row` of logits ([rows][n_vocab]): every token whose bit is clear in
     * allowed (n_vocab bits, little-endian words; copied at the call) gets -inf. */
    void (*mask_logits)(be_backend *b, be_tensor *logits, int row, const uint32_t *allowed, int64_t n_vocab);

    /* ---- tuning (between steps) ---- */
    /* Sets the matmul parameters for weights of type t (k == 0: every shape of
     * the type; else weights of rows of k elements and n rows, for calls of at
     * least min_rows >= 1 activation rows: a call uses the entry with the
     * largest min_rows <= its rows). NULL removes. False: table full or bad arguments. */
    bool (*set_mm_params)(be_backend *b, qt_type t, int64_t k, int64_t n, int min_rows, const be_mm_params *p);
    /* Removes every per-shape entry. */
    void (*clear_mm_params)(be_backend *b);
    /* Reference mode: every op runs its scalar reference (for tests and validation). */
    void (*set_reference)(be_backend *b, bool on);
    /* Whether the backend has matmul variants to tune for weights of type t. */
    bool (*mm_tunable)(be_backend *b, qt_type t);
    /* The tuner's case (tune/tune.h) for a matmul shape: the backend's
     * candidate kernels and parameters, validated against its reference and
     * timed through its own matmul. c->ctx is the backend's until
     * mm_case_free. HN_ERR_UNSUPPORTED: nothing to tune for this type. */
    hn_status (*mm_case_new)(be_backend *b, const be_mm_case *a, struct tn_case *c, hn_err *err);
    /* The parameters of configuration cfg (values of the case's params) of a case. */
    void (*mm_case_params)(be_backend *b, const struct tn_case *c, const int *cfg, be_mm_params *out);
    void (*mm_case_free)(be_backend *b, struct tn_case *c);

    /* ---- version 5: hybrid (recurrent) layers ---- */
    /* y[r][y_off + i] = x[r][x_off + i] for i < nc, r < n, rows of x_ld and
     * y_ld elements (splits interleaved projections: gated q, q/k/v). The
     * elements' bits are copied (f32, or i32 routing ids packed beside f32
     * rows: experts apart, model_forward.c). */
    void (*copy_cols)(be_backend *b, const be_tensor *x, int x_ld, int x_off, int n, int nc, be_tensor *y, int y_ld,
                      int y_off);
    /* y[r][i] = x[r][i] * sigmoid(g[r][g_dim == 1 ? 0 : i]) for n rows of dim
     * (g rows of g_dim: dim, or 1 for one gate per row); y may be x. */
    void (*sigmoid_mul)(be_backend *b, const be_tensor *x, const be_tensor *g, int n, int dim, int g_dim,
                        be_tensor *y);
    /* y[r] = x[r] / max(||x[r]||, eps) for n rows of dim; y may be x. */
    void (*l2_norm)(be_backend *b, const be_tensor *x, int n, int dim, float eps, be_tensor *y);
    /* Multi-section (IMROPE) rotary embedding, NEOX pairs (i, i + n_rot/2),
     * in place: pair i < n_rot/2 takes the text position plan->pos of the
     * t/h/w section when i % 3 == 0/1/2 and i < 3 * sections[i % 3], else
     * position 0 (the e section: no rotation). */
    void (*rope_multi)(be_backend *b, be_tensor *x, int n, int n_head, int head_dim, int n_rot, float freq_base,
                       const int32_t sections[4]);
    /* Causal depthwise conv over time + SiLU for the plan's tokens, in token
     * order per sequence: y[t][c] = silu(sum_j w[c][j] * u_{t-K+1+j}[c]) with
     * u the inputs x (rows of channels), the ones before this step taken
     * from the sequence's conv state (the last K-1 inputs, zero before
     * position 0) at byte state_off of its slot ([K-1][channels] f32), which
     * is updated. w is f32 [channels][K] (ne {K, channels}). Where
 * plan->state_snap[t] >= 0, the window right after token t is also written
 * at state_off of that slot (see delta_net). */
    void (*ssm_conv)(be_backend *b, const be_tensor *x, const be_tensor *w, int n, int channels, int kernel,
                     const kv_cache *kv, size_t state_off, be_tensor *y);
    void (*delta_net)(be_backend *b, const be_delta_args *a);
    /* Copies whole state slots: slot dst[i] = slot src[i] for i < n (the
     * arrays are copied at the call). Checkpoints and their restore. */
    void (*state_copy)(be_backend *b, const kv_cache *kv, int n, const int32_t *src, const int32_t *dst);

    /* ---- version 7 ---- */
    /* Whether the backend keeps tensors in memory of its own (a GPU's), and
     * if so its free and total bytes now (after reserve's allocations):
     * model_load refuses a model whose weights do not fit. false (host
     * memory, nothing to check) leaves *free_b and *total_b untouched. */
    bool (*mem_info)(be_backend *b, size_t *free_b, size_t *total_b);

    /* ---- version 8: accounting ---- */
    /* Bytes of memory the backend's scratch and activation tensors hold now
     * (what reserve sized; weights and the KV pool not counted). */
    size_t (*scratch_bytes)(be_backend *b);

    /* ---- version 9: tuning on the device ---- */
    /* Fills out (see be_tune_info). NULL, or a table older than 9: the CPU's
     * answer (the host's fingerprint, decode at 1 row, prefill). */
    void (*tune_info)(be_backend *b, be_tune_info *out);
} be_ops;

struct be_backend {
    const be_ops *ops;
    void *impl;
    /* runs a plan's n_pad rows (replays captured graphs); else n_tokens */
    bool pads;
};

/* Bytes an activation tensor takes in the arena (be_limits.arena_bytes sums these). */
size_t be_tensor_bytes(qt_type type, int64_t ne0, int64_t ne1);
/* weight_load's argument check, for every backend: the source has data and
 * its rows of its type fit its bytes. Sets *row_bytes; HN_ERR_INVALID naming
 * the backend (who) and the weight otherwise. */
hn_status be_weight_src_check(const be_weight_src *src, const char *who, size_t *row_bytes, hn_err *err);

/* Frees a backend (NULL is fine). */
static inline void be_free(be_backend *b) {
    if (b) b->ops->free(b);
}

#endif
