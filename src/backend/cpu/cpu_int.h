/* cpu_int.h: state shared by the CPU backend's files (private to backend/cpu). */
#ifndef HN_BACKEND_CPU_INT_H
#define HN_BACKEND_CPU_INT_H

#include <stdatomic.h>

#include "cpu.h"

/* attention scores kept at once per head (positions of one block, at most this many) */
#define CPU_ATTN_SCORE_CAP 64

/* f32 vector helpers for attention: portable versions, AVX2 ones in
 * cpu_vec_avx2.c, picked at run time by cpu_vec_select (into cpu_be). */
typedef float (*cpu_vec_dot_fn)(const float *a, const float *b, int n);
typedef void (*cpu_vec_axpy_fn)(float *y, float a, const float *x, int n);
typedef float (*cpu_vec_dot_h_fn)(const float *a, const uint16_t *b, int n);
/* acc[h][0..hd) += sum_{i<np} w[h*ws + i] * v[i*vstride ..] for h < group (position order per element) */
typedef void (*cpu_attn_wsum_fn)(float *acc, int group, int hd, const float *w, int ws, const float *v, size_t vstride,
                                 int np);
typedef void (*cpu_attn_wsum_h_fn)(float *acc, int group, int hd, const float *w, int ws, const uint16_t *v,
                                   size_t vstride, int np);
float cpu_vec_dot_avx2(const float *a, const float *b, int n);
void cpu_vec_axpy_avx2(float *y, float a, const float *x, int n);
float cpu_vec_dot_f16_avx2(const float *a, const uint16_t *b, int n);
/* s[i] = dot(q, K row i) * scale for i < np (rows kstride elements apart; hd a multiple of 8) */
typedef void (*cpu_attn_scores_fn)(const float *q, int hd, const float *k, size_t kstride, int np, float scale, float *s);
typedef void (*cpu_attn_scores_h_fn)(const float *q, int hd, const uint16_t *k, size_t kstride, int np, float scale,
                                     float *s);
void cpu_attn_scores_f32_avx2(const float *q, int hd, const float *k, size_t kstride, int np, float scale, float *s);
void cpu_attn_scores_f16_avx2(const float *q, int hd, const uint16_t *k, size_t kstride, int np, float scale,
                              float *s);
/* s[i] = exp(s[i] - mx) for i < n (s[i] <= mx); returns the sum in position order */
typedef float (*cpu_vec_exp_sub_fn)(float *s, int n, float mx);
float cpu_vec_exp_sub_avx2(float *s, int n, float mx);
void cpu_attn_wsum_f32_avx2(float *acc, int group, int hd, const float *w, int ws, const float *v, size_t vstride,
                            int np);
void cpu_attn_wsum_f16_avx2(float *acc, int group, int hd, const float *w, int ws, const uint16_t *v, size_t vstride,
                            int np);

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
    unsigned char *prep;  /* the rows rearranged for a gemm kernel with a prep pass: same size as act */
    float *deq;           /* per-thread dequantized weight row: nth x max_k */
    int32_t *ident;       /* 0..max_rows-1 */
    int32_t *order_in;    /* moe: activation row of each (row, slot), grouped by expert */
    int32_t *order_out;   /* moe: output row of each (row, slot), grouped by expert */
    int32_t *counts;      /* moe: max_experts + 1 */
    void *groups;         /* moe: max_experts matmul groups */
    /* attention scratch: per thread max_group x (max_head_dim + 2 + CPU_ATTN_SCORE_CAP) floats */
    float *attn;
    size_t attn_stride;
    float *route;         /* max_experts floats */
    cpu_vec_dot_fn vdot;  /* attention helpers for this CPU */
    cpu_vec_axpy_fn vaxpy;
    cpu_vec_dot_h_fn vdot_h;        /* f16 K rows */
    cpu_attn_wsum_fn wsum;          /* f32 V rows */
    cpu_attn_wsum_h_fn wsum_h;      /* f16 V rows */
    cpu_vec_exp_sub_fn vexp;        /* softmax weights of a chunk */
    cpu_attn_scores_fn scores;      /* a chunk's scores, f32 K (NULL: per-row vdot) */
    cpu_attn_scores_h_fn scores_h;  /* f16 K (NULL: per-row vdot_h) */
} cpu_be;

static inline cpu_be *cpu_of(be_backend *b) { return (cpu_be *)b->impl; }

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

/* ops implemented in cpu_matmul.c and cpu_attn.c */
hn_status cpu_matmul_reserve(cpu_be *cb, hn_err *err);
void cpu_matmul_free(cpu_be *cb);
void cpu_op_matmul(be_backend *b, const be_weight *w, int mat, const float *x, int n, float *y);
void cpu_op_matmul_multi(be_backend *b, int n_w, const be_weight *const *ws, const float *x, int n, float *const *ys);
void cpu_op_moe_matmul(be_backend *b, const be_weight *w, const float *x, bool x_shared, int n, int k,
                       const int32_t *ids, float *y);
void cpu_op_attention(be_backend *b, const be_attn_args *a);
hn_status cpu_op_prepare_weight(be_backend *b, be_weight *w, unsigned flags, hn_err *err);
void cpu_packs_free(cpu_be *cb);

#endif
