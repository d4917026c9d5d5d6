/* cpu_int.h: state shared by the CPU backend's files (private to backend/cpu). */
#ifndef HN_BACKEND_CPU_INT_H
#define HN_BACKEND_CPU_INT_H

#include <stdatomic.h>
#include <stdio.h>

#include "cpu.h"

/* ---- attention (cpu_attn.c; kernels in cpu_attn_avx2.c, cpu_attn_avx512.c) ---- */

/* positions scored at once per query row (one chunk of the online softmax) */
#define CPU_ATTN_SCORE_CAP 64
/* query rows (tokens x heads of a group) a prefill tile shares its K/V loads among */
#define CPU_ATTN_TILE_ROWS 64
/* partial results kept for positions split among threads (flash decoding) */
#define CPU_ATTN_SLOTS 64

/* Rows of one kv head spread over the cache's blocks: row i of a chunk is
 * blk[(slot0 + i) / bs] + ((slot0 + i) % bs) * stride (bytes; the head's
 * offset already in blk). A dequantized chunk is one "block" of np rows. */
typedef struct cpu_attn_rows {
    const unsigned char *const *blk;
    size_t stride;
    int slot0, bs;
} cpu_attn_rows;

static inline const void *cpu_attn_row(const cpu_attn_rows *r, int i) {
    int j = r->slot0 + i;
    return r->blk[j / r->bs] + (size_t)(j % r->bs) * r->stride;
}

/* s[r*ss + i] = dot(q row r, head r/group of K row i) * scale for r < nq (q
 * rows qstride floats apart; head j of a row: hd elements at offset j*hd),
 * i < np <= CPU_ATTN_SCORE_CAP; one function per K element type (f32, f16) */
typedef void (*cpu_attn_scores_fn)(const float *q, int nq, size_t qstride, int hd, int group, const cpu_attn_rows *k,
                                   int np, float scale, float *s, int ss);
/* acc[h*hd + d] += sum_{i<np} w[h*ws + i] * (head h/group of V row i)[d] for
 * h < nh, d < hd (per element the terms are added in position order); per V
 * element type */
typedef void (*cpu_attn_wsum_fn)(float *acc, int nh, int hd, int group, const float *w, int ws, const cpu_attn_rows *v,
                                 int np);
/* Tiles of query rows (prefill), rows given by pointer, one kv head (its
 * offset already in k / v): s[r*ss + i] = dot(q[r], K row i) * scale for
 * r < nq, i < np; acc[r][d] += sum_{i<np} w[r*ws + i] * V row i [d]. */
typedef void (*cpu_attn_scores_tile_fn)(const float *const *q, int nq, int hd, const cpu_attn_rows *k, int np,
                                        float scale, float *s, int ss);
typedef void (*cpu_attn_wsum_tile_fn)(float *const *acc, int nq, int hd, const float *w, int ws,
                                      const cpu_attn_rows *v, int np);
/* s[i] = exp(s[i] - mx) for i < n (s[i] <= mx, -inf gives 0); returns the sum in position order */
typedef float (*cpu_vec_exp_sub_fn)(float *s, int n, float mx);
/* One online-softmax step of a row: m = max(m, s[0..n)), acc[0..hd) and l
 * scaled by exp(old m - m), s[i] = exp(s[i] - m), l += their sum (n >= 1) */
typedef void (*cpu_attn_softmax_fn)(float *s, int n, float *m, float *l, float *acc, int hd);
/* h[i] = f16(x[i]) for i < n, rounding as qt_f32_to_f16 does */
typedef void (*cpu_attn_to_f16_fn)(const float *x, uint16_t *h, int64_t n);

/* one CPU's set of attention kernels; idx 0 is f32 rows, 1 f16 rows */
typedef struct cpu_attn_kernels {
    const char *name;
    int hd_mult;                 /* head_dim must be a multiple of this (else the next set down is used) */
    cpu_attn_scores_fn scores[2];
    cpu_attn_wsum_fn wsum[2];
    cpu_vec_exp_sub_fn vexp;
    cpu_attn_scores_tile_fn scores_tile[2]; /* NULL: the driver scores a tile token by token */
    cpu_attn_wsum_tile_fn wsum_tile[2];
    cpu_attn_softmax_fn softmax;
} cpu_attn_kernels;

void cpu_attn_scores_f32_avx2(const float *q, int nq, size_t qstride, int hd, int group, const cpu_attn_rows *k, int np,
                                float scale, float *s, int ss);
void cpu_attn_scores_f16_avx2(const float *q, int nq, size_t qstride, int hd, int group, const cpu_attn_rows *k, int np,
                                float scale, float *s, int ss);
void cpu_attn_wsum_f32_avx2(float *acc, int nh, int hd, int group, const float *w, int ws, const cpu_attn_rows *v, int np);
void cpu_attn_wsum_f16_avx2(float *acc, int nh, int hd, int group, const float *w, int ws, const cpu_attn_rows *v, int np);
float cpu_vec_exp_sub_avx2(float *s, int n, float mx);
void cpu_attn_softmax_avx2(float *s, int n, float *m, float *l, float *acc, int hd);
void cpu_attn_softmax_avx512(float *s, int n, float *m, float *l, float *acc, int hd);
void cpu_attn_to_f16_avx2(const float *x, uint16_t *h, int64_t n);
void cpu_attn_scores_f32_avx512(const float *q, int nq, size_t qstride, int hd, int group, const cpu_attn_rows *k, int np,
                                float scale, float *s, int ss);
void cpu_attn_scores_f16_avx512(const float *q, int nq, size_t qstride, int hd, int group, const cpu_attn_rows *k, int np,
                                float scale, float *s, int ss);
void cpu_attn_wsum_f32_avx512(float *acc, int nh, int hd, int group, const float *w, int ws, const cpu_attn_rows *v, int np);
void cpu_attn_wsum_f16_avx512(float *acc, int nh, int hd, int group, const float *w, int ws, const cpu_attn_rows *v, int np);
float cpu_vec_exp_sub_avx512(float *s, int n, float mx);
void cpu_attn_scores_tile_f32_avx512(const float *const *q, int nq, int hd, const cpu_attn_rows *k, int np,
                                     float scale, float *s, int ss);
void cpu_attn_scores_tile_f16_avx512(const float *const *q, int nq, int hd, const cpu_attn_rows *k, int np,
                                     float scale, float *s, int ss);
void cpu_attn_wsum_tile_f32_avx512(float *const *acc, int nq, int hd, const float *w, int ws, const cpu_attn_rows *v,
                                   int np);
void cpu_attn_wsum_tile_f16_avx512(float *const *acc, int nq, int hd, const float *w, int ws, const cpu_attn_rows *v,
                                   int np);

/* AArch64 NEON (cpu_attn_neon.c) */
void cpu_attn_scores_f32_neon(const float *q, int nq, size_t qstride, int hd, int group, const cpu_attn_rows *k, int np,
                              float scale, float *s, int ss);
void cpu_attn_scores_f16_neon(const float *q, int nq, size_t qstride, int hd, int group, const cpu_attn_rows *k, int np,
                              float scale, float *s, int ss);
void cpu_attn_wsum_f32_neon(float *acc, int nh, int hd, int group, const float *w, int ws, const cpu_attn_rows *v, int np);
void cpu_attn_wsum_f16_neon(float *acc, int nh, int hd, int group, const float *w, int ws, const cpu_attn_rows *v, int np);
float cpu_vec_exp_sub_neon(float *s, int n, float mx);
void cpu_attn_softmax_neon(float *s, int n, float *m, float *l, float *acc, int hd);
void cpu_attn_to_f16_neon(const float *x, uint16_t *h, int64_t n);
void cpu_attn_scores_tile_f32_neon(const float *const *q, int nq, int hd, const cpu_attn_rows *k, int np, float scale,
                                   float *s, int ss);
void cpu_attn_scores_tile_f16_neon(const float *const *q, int nq, int hd, const cpu_attn_rows *k, int np, float scale,
                                   float *s, int ss);
void cpu_attn_wsum_tile_f32_neon(float *const *acc, int nq, int hd, const float *w, int ws, const cpu_attn_rows *v,
                                 int np);
void cpu_attn_wsum_tile_f16_neon(float *const *acc, int nq, int hd, const float *w, int ws, const cpu_attn_rows *v,
                                 int np);

/* The kernel sets this CPU can run, fastest first, the portable one last
 * (always present); returns how many (at most cap). For tests. */
int cpu_attn_variants(const cpu_attn_kernels **out, int cap);
/* Test hook: use the kernel set of that name (NULL: the default pick) where head_dim allows. */
void cpu_attn_force(be_backend *b, const char *name);

/* Attention as the kernels see it: host pointers and the plan's arrays.
 * Token t is at position pos[t] of plan sequence seq[t], whose blocks are
 * bt[seq[t] * bt_stride ..]. */
typedef struct cpu_attn_args {
    const float *q;
    float *out;
    int n_tokens, n_head, n_head_kv, head_dim;
    float scale;
    int32_t window;
    const kv_cache *kv;
    int layer;
    const int32_t *pos, *seq, *bt;
    int32_t bt_stride;
    const uint8_t *rowwise; /* [sequence] 1: its tokens are one-token tiles (decode rows); NULL: none */
    const uint8_t *prompt;  /* [sequence] 1: its tokens are prompt rows (prefill tiles, even one alone); NULL: none */
} cpu_attn_args;

/* parameters for one weight shape from min_rows activation rows on (be_cpu_set_mm_params_shape) */
typedef struct cpu_mm_shape {
    qt_type type;
    int64_t k, n;
    int min_rows;
    be_cpu_mm_params p;
} cpu_mm_shape;

typedef struct cpu_be {
    be_backend base;
    pool *pool;
    int nth;
    bool force_ref;
    be_cpu_mm_params mm[QT_TYPE_COUNT]; /* per weight type (be_cpu_set_mm_params) */
    cpu_mm_shape mm_shape[BE_CPU_MM_SHAPES]; /* per weight shape and call size (override mm[]) */
    int n_mm_shape;
    bool no_gemm;         /* dot kernels only (HONE_NO_GEMM=1; for comparisons) */
    bool no_pack;         /* prepare_weight leaves weights unpacked (HONE_NO_PACK=1) */
    /* packed weight copies (prepare_weight), freed with the backend */
    struct cpu_packed { void *p; size_t bytes; } *packs;
    int n_packs, cap_packs;
    unsigned char *pprep; /* converted rows rearranged for a packed kernel's prep: same size as act */
    be_limits lim;
    /* matmul scratch */
    unsigned char *act;   /* converted activation rows: max_rows x (4 * max_k) bytes */
    size_t act_cap;
    size_t mm_rows, mm_k, mm_ne; /* what the matmul scratch is sized for (cpu_matmul_reserve) */
    size_t mm_bytes, attn_bytes; /* bytes the matmul and attention scratch hold */
    unsigned char *prep;  /* the rows rearranged for a gemm kernel with a prep pass: same size as act */
    float *deq;           /* per-thread dequantized weight row: nth x max_k */
    int32_t *ident;       /* 0..max_rows-1 */
    int32_t *order_in;    /* moe: activation row of each (row, slot), grouped by expert */
    int32_t *order_out;   /* moe: output row of each (row, slot), grouped by expert */
    int32_t *counts;      /* moe: max_experts + 1 */
    void *groups;         /* moe: max_experts matmul groups */
    /* attention scratch (cpu_attn_reserve) */
    float *attn;          /* per thread attn_stride floats */
    size_t attn_stride;
    float *attn_part;     /* partial results of split tiles: attn_part_cap floats */
    size_t attn_part_cap;
    void *attn_work;      /* tiles and items of one call */
    const cpu_attn_kernels *ak[3]; /* usable kernel sets, fastest first (portable last) */
    int n_ak;
    int attn_force;       /* HONE_ATTN_KERNEL / tests: index into ak, -1: pick by head_dim */
    cpu_attn_to_f16_fn to_f16; /* kv_store's f32 -> f16 rows */
    float *route;         /* max_experts floats */
    bool delta_avx2;      /* delta_net's token step with AVX2 + FMA (same bits as the scalar form) */
    int delta_chunk;      /* delta_net: the chunked form for a sequence's runs of at least this many tokens (0: token-step only) */
    /* the step */
    const step_plan *plan; /* plan_set's */
    hn_status err;         /* the first error since the last sync */
    char err_msg[128];
    /* the activation arena: a budget (reserve's arena_bytes) that tensor_new
     * draws on; each activation tensor is its own address-space reservation,
     * of which only the rows the limits ask for are backed (reserve again
     * grows or shrinks that in place) */
    struct cpu_act { be_tensor *t; size_t vm, backed; } *acts;
    int n_acts, cap_acts;
    size_t arena_cap, arena_used;
    bool unreserved;      /* the last reserve failed: matmuls and attention fail until one succeeds */
    size_t act_backed;    /* bytes backing activation tensors now (sum of acts[].backed) */
    be_tensor **tensors;
    int n_tensors, cap_tensors;
    pool *own_pool;       /* made by the registry (freed with the backend), or NULL */
} cpu_be;

static inline cpu_be *cpu_of(be_backend *b) { return (cpu_be *)b->impl; }

/* The step's plan for an op that reads it; without one, the op does nothing
 * and the error is reported at sync. */
static inline const step_plan *cpu_plan(cpu_be *cb, const char *op) {
    if (!cb->plan && !cb->err) {
        cb->err = HN_ERR_INVALID;
        snprintf(cb->err_msg, sizeof cb->err_msg, "cpu backend: %s before plan_set", op);
    }
    return cb->plan;
}

/* Whether an op of n activation rows keeps within the reserved limits (else the error is reported at sync). */
static inline bool cpu_rows_ok(cpu_be *cb, int n, const char *op) {
    if (!cb->unreserved && n <= (cb->lim.max_rows > 0 ? cb->lim.max_rows : 1)) return true;
    if (!cb->err) {
        cb->err = cb->unreserved ? HN_ERR_INVALID : HN_ERR_RANGE;
        if (cb->unreserved)
            snprintf(cb->err_msg, sizeof cb->err_msg, "cpu backend: %s after a failed reserve", op);
        else
            snprintf(cb->err_msg, sizeof cb->err_msg, "cpu backend: %s of %d rows over the %d reserved", op, n,
                     cb->lim.max_rows);
    }
    return false;
}

/* f32 dot product with independent partial sums (vectorizes without -ffast-math). */
static inline float cpu_dot_f32(const float *a, const float *b, int64_t n) {
    float s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += a[i + j] * b[i + j];
    float t = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
    for (; i < n; i++) t += a[i] * b[i];
    return t;
}

/* Runs fn over rows [0, n) in chunks shared among the pool's threads (cpu_backend.c). */
void cpu_par_rows(cpu_be *cb, int n, void (*fn)(void *ctx, int r0, int r1), void *ctx);

/* the hybrid-layer ops (cpu_ssm.c) */
void cpu_op_copy_cols(be_backend *b, const be_tensor *x, int x_ld, int x_off, int n, int nc, be_tensor *y, int y_ld,
                      int y_off);
void cpu_op_sigmoid_mul(be_backend *b, const be_tensor *x, const be_tensor *g, int n, int dim, int g_dim, be_tensor *y);
void cpu_op_l2_norm(be_backend *b, const be_tensor *x, int n, int dim, float eps, be_tensor *y);
void cpu_op_rope_multi(be_backend *b, be_tensor *x, int n, int n_head, int head_dim, int n_rot, float freq_base,
                       const int32_t sections[4]);
void cpu_op_ssm_conv(be_backend *b, const be_tensor *x, const be_tensor *w, int n, int channels, int kernel,
                     const kv_cache *kv, size_t state_off, be_tensor *y);
void cpu_op_delta_net(be_backend *b, const be_delta_args *a);
void cpu_op_state_copy(be_backend *b, const kv_cache *kv, int n, const int32_t *src, const int32_t *dst);
/* Test hook / HONE_DELTA_CHUNK: delta_net runs its chunked form for a sequence's runs of at least
 * min_tokens tokens in a step (0: always the token-step form, which is llama.cpp's CPU arithmetic). */
void cpu_delta_chunk(be_backend *b, int min_tokens);
/* One token of the delta rule on one value head (S a multiple of 64), bit for bit the scalar form (cpu_ssm.c). */
void cpu_delta_token_avx2(float *M, int S, const float *qt, const float *kt, const float *vt, float g, float beta,
                          float *ot);

/* ops implemented in cpu_matmul.c and cpu_attn.c */
hn_status cpu_matmul_reserve(cpu_be *cb, hn_err *err);
void cpu_matmul_free(cpu_be *cb);
void cpu_op_matmul(be_backend *b, const be_tensor *w, int mat, const be_tensor *x, int n, be_tensor *y);
void cpu_op_matmul_multi(be_backend *b, int n_w, const be_tensor *const *ws, const be_tensor *x, int n,
                         be_tensor *const *ys);
void cpu_op_moe_matmul(be_backend *b, const be_tensor *w, const be_tensor *x, bool x_shared, int n, int k,
                       const be_tensor *ids, be_tensor *y);
void cpu_op_attention(be_backend *b, const be_attn_args *a);
void cpu_op_kv_store(be_backend *b, kv_cache *kv, int layer, const be_tensor *k, const be_tensor *v, int n);
void cpu_packs_free(cpu_be *cb);
/* the tuning ops (cpu_tune.c) */
bool cpu_op_mm_tunable(be_backend *b, qt_type t);
hn_status cpu_op_mm_case_new(be_backend *b, const be_mm_case *a, struct tn_case *c, hn_err *err);
void cpu_op_mm_case_params(be_backend *b, const struct tn_case *c, const int *cfg, be_mm_params *out);
void cpu_op_mm_case_free(be_backend *b, struct tn_case *c);
/* attention over host arrays (the op's body; tests call it with their own block tables) */
void cpu_attention(cpu_be *cb, const cpu_attn_args *a);
/* the K/V element conversions: n rows at their slots (slot -1: skipped), and
 * n head rows (hd elements of type t, stride bytes apart) to f32 */
void cpu_kv_store_rows(const cpu_be *cb, kv_cache *kv, int layer, int n, const float *k, const float *v,
                       const int32_t *slot);
void cpu_kv_rows_to_f32(qt_type t, int hd, const unsigned char *src, size_t stride, int n, float *dst);
/* attention setup: kernel choice (at create and on force_reference), scratch (at reserve), free */
void cpu_attn_select(cpu_be *cb);
hn_status cpu_attn_reserve(cpu_be *cb, hn_err *err);
void cpu_attn_free(cpu_be *cb);

#endif
