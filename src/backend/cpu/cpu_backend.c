/* cpu_backend.c: the CPU backend's vtable and its small ops (norms, rope,
 * element-wise, routing, argmax/softmax). Matmuls live in
 * cpu_matmul.c, attention and the KV store in cpu_attn.c. Ops over many rows are split over
 * the pool; tiny ones (decode) run on the calling thread, where a dispatch
 * would cost more than the work. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../core/alloc.h"
#include "../../quant/quant.h"
#include "cpu_int.h"
#include "dot.h"

#define PAR_MIN_ROWS 8 /* fewer rows than this: run on the caller */

/* ---- row-parallel helper ---- */

typedef void (*rows_fn)(void *ctx, int r0, int r1);
typedef struct {
    rows_fn fn;
    void *ctx;
    int n, chunk;
    _Atomic int next;
} rows_task;

static void rows_worker(void *ctx, int ith, int nth) {
    (void)ith;
    (void)nth;
    rows_task *t = ctx;
    for (;;) {
        int r0 = atomic_fetch_add_explicit(&t->next, t->chunk, memory_order_relaxed);
        if (r0 >= t->n) break;
        t->fn(t->ctx, r0, r0 + t->chunk < t->n ? r0 + t->chunk : t->n);
    }
}

/* Runs fn over rows [0, n) in chunks shared among the threads that show up. */
static void par_rows(cpu_be *cb, int n, rows_fn fn, void *ctx) {
    if (cb->nth == 1 || n < PAR_MIN_ROWS) {
        fn(ctx, 0, n);
        return;
    }
    rows_task t = {.fn = fn, .ctx = ctx, .n = n, .chunk = (n + cb->nth * 4 - 1) / (cb->nth * 4)};
    atomic_store(&t.next, 0);
    pool_run_shared(cb->pool, rows_worker, &t);
}

/* ---- embedding lookup ---- */

static void op_get_rows(be_backend *b, const be_weight *w, const int32_t *ids, int n, float *out) {
    (void)b;
    const qt_type_traits *tr = qt_traits(w->type);
    int64_t k = w->ne[0];
    for (int i = 0; i < n; i++) {
        const void *row = (const unsigned char *)w->data + (size_t)ids[i] * w->row_bytes;
        float *o = out + (size_t)i * (size_t)k;
        if (w->type == QT_F32)
            memcpy(o, row, sizeof(float) * (size_t)k);
        else
            tr->to_float(row, o, k);
    }
}

/* ---- rms_norm ---- */

typedef struct {
    const float *x, *w;
    float *y;
    int dim;
    float eps;
} norm_ctx;

static void norm_rows(void *ctx, int r0, int r1) {
    norm_ctx *c = ctx;
    for (int r = r0; r < r1; r++) {
        const float *x = c->x + (size_t)r * (size_t)c->dim;
        float *y = c->y + (size_t)r * (size_t)c->dim;
        /* llama.cpp's arithmetic to the bit (float squares summed in double, float
         * mean and scale): the 8-bit activation converters see ties that any
         * other rounding of the scale flips (see dot.c) */
        double ss = 0.0;
        for (int i = 0; i < c->dim; i++) ss += (double)(x[i] * x[i]);
        float mean = (float)(ss / c->dim);
        float scale = 1.0f / sqrtf(mean + c->eps);
        if (c->w)
            for (int i = 0; i < c->dim; i++) y[i] = x[i] * scale * c->w[i];
        else
            for (int i = 0; i < c->dim; i++) y[i] = x[i] * scale;
    }
}

static void op_rms_norm(be_backend *b, const float *x, const float *w, int n, int dim, float eps, float *y) {
    norm_ctx c = {x, w, y, dim, eps};
    par_rows(cpu_of(b), n, norm_rows, &c);
}

/* ---- rope ---- */

typedef struct {
    float *x;
    int n_head, head_dim, n_rot;
    const int32_t *pos;
    float freq_base;
    be_rope_mode mode;
} rope_ctx;

static void rope_rows(void *ctx, int r0, int r1) {
    rope_ctx *c = ctx;
    const int half = c->n_rot / 2;
    /* theta_i = pos * base^(-2i/n_rot), built by repeated multiplication */
    const float theta_scale = powf(c->freq_base, -2.0f / (float)c->n_rot);
    float cs[512], sn[512];
    for (int r = r0; r < r1; r++) {
        float theta = (float)c->pos[r];
        for (int i = 0; i < half && i < 512; i++) {
            cs[i] = cosf(theta);
            sn[i] = sinf(theta);
            theta *= theta_scale;
        }
        for (int h = 0; h < c->n_head; h++) {
            float *v = c->x + ((size_t)r * (size_t)c->n_head + (size_t)h) * (size_t)c->head_dim;
            if (c->mode == BE_ROPE_NEOX) {
                for (int i = 0; i < half; i++) {
                    float a = v[i], bb = v[i + half];
                    v[i] = a * cs[i] - bb * sn[i];
                    v[i + half] = a * sn[i] + bb * cs[i];
                }
            } else {
                for (int i = 0; i < half; i++) {
                    float a = v[2 * i], bb = v[2 * i + 1];
                    v[2 * i] = a * cs[i] - bb * sn[i];
                    v[2 * i + 1] = a * sn[i] + bb * cs[i];
                }
            }
        }
    }
}

static void op_rope(be_backend *b, float *x, int n, int n_head, int head_dim, int n_rot, const int32_t *pos,
                    float freq_base, be_rope_mode mode) {
    rope_ctx c = {x, n_head, head_dim, n_rot, pos, freq_base, mode};
    par_rows(cpu_of(b), n, rope_rows, &c);
}

/* ---- element-wise ---- */

static void op_add(be_backend *b, const float *a, const float *bb, float *y, size_t n) {
    (void)b;
    for (size_t i = 0; i < n; i++) y[i] = a[i] + bb[i];
}

static void op_mul(be_backend *b, const float *a, const float *bb, float *y, size_t n) {
    (void)b;
    for (size_t i = 0; i < n; i++) y[i] = a[i] * bb[i];
}

static void op_add_bias(be_backend *b, float *x, const float *bias, int n, int dim) {
    (void)b;
    for (int r = 0; r < n; r++)
        for (int i = 0; i < dim; i++) x[(size_t)r * (size_t)dim + (size_t)i] += bias[i];
}

typedef struct {
    const float *g, *u;
    float *y;
    size_t n;
} swiglu_ctx;

static void swiglu_rows(void *ctx, int r0, int r1) {
    swiglu_ctx *c = ctx;
    /* rows here are 4096-element slices */
    size_t i0 = (size_t)r0 * 4096, i1 = (size_t)r1 * 4096 < c->n ? (size_t)r1 * 4096 : c->n;
    for (size_t i = i0; i < i1; i++) {
        float g = c->g[i];
        c->y[i] = g / (1.0f + expf(-g)) * c->u[i];
    }
}

static void op_swiglu(be_backend *b, const float *gate, const float *up, float *y, size_t n) {
    swiglu_ctx c = {gate, up, y, n};
    par_rows(cpu_of(b), (int)((n + 4095) / 4096), swiglu_rows, &c);
}

/* ---- routing, argmax, softmax ---- */

static void softmax_f32(float *x, int64_t n) {
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        if (x[i] > mx) mx = x[i];
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}

static void op_moe_route(be_backend *b, const float *logits, int n, int n_expert, int k, int32_t *ids,
                         float *weights) {
    float *p = cpu_of(b)->route;
    for (int r = 0; r < n; r++) {
        memcpy(p, logits + (size_t)r * (size_t)n_expert, sizeof(float) * (size_t)n_expert);
        softmax_f32(p, n_expert);
        float sum = 0.0f;
        for (int s = 0; s < k; s++) {
            int best = -1;
            for (int e = 0; e < n_expert; e++)
                if (p[e] >= 0.0f && (best < 0 || p[e] > p[best])) best = e;
            ids[r * k + s] = best;
            weights[r * k + s] = p[best];
            sum += p[best];
            p[best] = -1.0f; /* taken */
        }
        for (int s = 0; s < k; s++) weights[r * k + s] /= sum;
    }
}

static int32_t op_argmax(be_backend *b, const float *x, int64_t n) {
    (void)b;
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return (int32_t)best;
}

static void op_softmax(be_backend *b, float *x, int64_t n) {
    (void)b;
    softmax_f32(x, n);
}

/* ---- lifecycle ---- */

static void op_free(be_backend *b) {
    cpu_be *cb = cpu_of(b);
    cpu_matmul_free(cb);
    cpu_packs_free(cb);
    cpu_attn_free(cb);
    hn_free(cb);
}

static hn_status op_reserve(be_backend *b, const be_limits *lim, hn_err *err) {
    cpu_be *cb = cpu_of(b);
    if (lim->max_head_dim > 4096 || lim->max_group > 1024 || lim->max_rows < 0 || lim->max_k < 0 ||
        lim->max_experts < 0)
        return hn_errf(err, HN_ERR_RANGE, "cpu backend: limits out of range");
    cb->lim = *lim;
    hn_status st = cpu_matmul_reserve(cb, err);
    if (st) return st;
    st = cpu_attn_reserve(cb, err);
    if (st) return st;
    return HN_OK;
}

static const be_ops cpu_ops = {
    .version = BE_OPS_VERSION,
    .name = "cpu",
    .free = op_free,
    .reserve = op_reserve,
    .get_rows = op_get_rows,
    .matmul = cpu_op_matmul,
    .rms_norm = op_rms_norm,
    .rope = op_rope,
    .add = op_add,
    .mul = op_mul,
    .add_bias = op_add_bias,
    .swiglu = op_swiglu,
    .kv_store = cpu_op_kv_store,
    .attention = cpu_op_attention,
    .moe_route = op_moe_route,
    .moe_matmul = cpu_op_moe_matmul,
    .argmax = op_argmax,
    .softmax = op_softmax,
    .matmul_multi = cpu_op_matmul_multi,
    .prepare_weight = cpu_op_prepare_weight,
};

hn_status be_cpu_create(pool *p, be_backend **out, hn_err *err) {
    *out = NULL;
    cpu_be *cb = hn_calloc(1, sizeof *cb);
    if (!cb) return hn_errf(err, HN_ERR_NOMEM, "cpu backend: out of memory");
    cb->pool = p;
    cb->nth = pool_n_threads(p);
    cb->base.ops = &cpu_ops;
    cb->base.impl = cb;
    cpu_attn_select(cb);
    const char *ng = getenv("HONE_NO_GEMM");
    cb->no_gemm = ng && *ng && strcmp(ng, "0") != 0;
    const char *np = getenv("HONE_NO_PACK");
    cb->no_pack = np && *np && strcmp(np, "0") != 0;
    *out = &cb->base;
    return HN_OK;
}

void be_cpu_force_reference(be_backend *b, bool on) {
    cpu_of(b)->force_ref = on;
    cpu_attn_select(cpu_of(b));
}
