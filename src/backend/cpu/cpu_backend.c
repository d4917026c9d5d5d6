/* cpu_backend.c: the CPU backend's vtable and its small ops (norms, rope,
 * element-wise, routing, the expert combine, the step, tensors). Matmuls live in
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
        int r0 = pool_take(&t->next, t->chunk, t->n);
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

void cpu_par_rows(cpu_be *cb, int n, void (*fn)(void *ctx, int r0, int r1), void *ctx) { par_rows(cb, n, fn, ctx); }

/* ---- embedding lookup ---- */

static void op_get_rows(be_backend *b, const be_tensor *w, int n, be_tensor *outt) {
    const step_plan *p = cpu_plan(cpu_of(b), "get_rows");
    if (!p) return;
    const int32_t *ids = p->token;
    const qt_type_traits *tr = qt_traits(w->type);
    int64_t k = w->ne[0];
    float *out = outt->data;
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

static void op_rms_norm(be_backend *b, const be_tensor *x, const be_tensor *w, int n, int dim, float eps,
                        be_tensor *y) {
    norm_ctx c = {x->data, w ? w->data : NULL, y->data, dim, eps};
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

static void op_rope(be_backend *b, be_tensor *x, int n, int n_head, int head_dim, int n_rot, float freq_base,
                    be_rope_mode mode) {
    const step_plan *p = cpu_plan(cpu_of(b), "rope");
    if (!p) return;
    rope_ctx c = {x->data, n_head, head_dim, n_rot, p->pos, freq_base, mode};
    par_rows(cpu_of(b), n, rope_rows, &c);
}

/* ---- element-wise ---- */

static void op_add(be_backend *b, const be_tensor *at, const be_tensor *bt, be_tensor *yt, size_t n) {
    (void)b;
    const float *a = at->data, *bb = bt->data;
    float *y = yt->data;
    for (size_t i = 0; i < n; i++) y[i] = a[i] + bb[i];
}

static void op_add_bias(be_backend *b, be_tensor *xt, const be_tensor *bt, int n, int dim) {
    (void)b;
    float *x = xt->data;
    const float *bias = bt->data;
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

static void op_swiglu(be_backend *b, const be_tensor *gate, const be_tensor *up, be_tensor *y, size_t n) {
    swiglu_ctx c = {gate->data, up->data, y->data, n};
    par_rows(cpu_of(b), (int)((n + 4095) / 4096), swiglu_rows, &c);
}

/* ---- routing, the expert combine, the logits rows ---- */

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

static void op_moe_route(be_backend *b, const be_tensor *lt, int n, int n_expert, int k, be_tensor *idt,
                         be_tensor *wt) {
    float *p = cpu_of(b)->route;
    const float *logits = lt->data;
    int32_t *ids = idt->data;
    float *weights = wt->data;
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

static void op_moe_combine(be_backend *b, const be_tensor *yt, const be_tensor *wt, int n, int k, int dim,
                           be_tensor *outt) {
    (void)b;
    const float *y = yt->data, *w = wt->data;
    float *out = outt->data;
    for (int r = 0; r < n; r++) {
        float *o = out + (size_t)r * (size_t)dim;
        memset(o, 0, sizeof(float) * (size_t)dim);
        for (int s = 0; s < k; s++) {
            const float *ys = y + ((size_t)r * (size_t)k + (size_t)s) * (size_t)dim;
            float ws = w[r * k + s];
            for (int i = 0; i < dim; i++) o[i] += ws * ys[i];
        }
    }
}

static void op_gather_out(be_backend *b, const be_tensor *xt, int dim, be_tensor *outt) {
    const step_plan *p = cpu_plan(cpu_of(b), "gather_out");
    if (!p) return;
    const float *x = xt->data;
    float *out = outt->data;
    for (int i = 0; i < p->n_out; i++) {
        int32_t r = p->out_rows[i];
        if (out != x || r != i) memmove(out + (size_t)i * (size_t)dim, x + (size_t)r * (size_t)dim, sizeof(float) * (size_t)dim);
    }
}

static void op_mask_logits(be_backend *b, be_tensor *lt, int row, const uint32_t *allowed, int64_t n_vocab) {
    (void)b;
    float *l = (float *)lt->data + (size_t)row * (size_t)n_vocab;
    for (int64_t i = 0; i < n_vocab; i++)
        if (!(allowed[i >> 5] >> (i & 31) & 1u)) l[i] = -INFINITY;
}

/* ---- the step ---- */

static void op_plan_set(be_backend *b, const step_plan *p) { cpu_of(b)->plan = p; }

static void op_fetch(be_backend *b, const be_tensor *t, int n_rows, const void **host) {
    (void)b;
    (void)n_rows;
    *host = t->data; /* host memory already */
}

static void op_upload(be_backend *b, be_tensor *t, size_t off, const void *host, size_t n) {
    (void)b;
    memcpy((unsigned char *)t->data + off, host, n);
}

static hn_status op_sync(be_backend *b, hn_err *err) {
    /* ops ran as they were called; the only errors are calls out of contract */
    cpu_be *cb = cpu_of(b);
    hn_status st = cb->err;
    if (st) hn_errf(err, st, "%s", cb->err_msg);
    cb->err = HN_OK;
    return st;
}

/* ---- tensors ---- */

static hn_status track(cpu_be *cb, be_tensor *t, hn_err *err) {
    if (cb->n_tensors == cb->cap_tensors) {
        int cap = cb->cap_tensors ? 2 * cb->cap_tensors : 256;
        void *np = hn_realloc(cb->tensors, sizeof *cb->tensors * (size_t)cap);
        if (!np) {
            hn_free(t);
            return hn_errf(err, HN_ERR_NOMEM, "cpu backend: out of memory");
        }
        cb->tensors = np;
        cb->cap_tensors = cap;
    }
    cb->tensors[cb->n_tensors++] = t;
    return HN_OK;
}

/* Backs the first `bytes` of activation tensor a (page-rounded, at most its
 * reservation) with memory, committing or giving back the difference. */
static hn_status act_back(cpu_be *cb, struct cpu_act *a, size_t bytes, hn_err *err) {
    const size_t pg = hn_page_size();
    size_t want = (bytes + pg - 1) / pg * pg;
    if (want > a->vm) want = a->vm;
    unsigned char *base = a->t->data;
    if (want > a->backed) {
        if (!hn_vm_commit(base + a->backed, want - a->backed))
            return hn_errf(err, HN_ERR_NOMEM, "cpu backend: cannot back %zu bytes of activations", want - a->backed);
    } else if (want < a->backed) {
        hn_vm_decommit(base + want, a->backed - want);
    }
    cb->act_backed = cb->act_backed - a->backed + want;
    a->backed = want;
    return HN_OK;
}

static hn_status op_tensor_new(be_backend *b, qt_type type, int64_t ne0, int64_t ne1, be_tensor **out, hn_err *err) {
    cpu_be *cb = cpu_of(b);
    *out = NULL;
    if ((type != QT_F32 && type != QT_I32) || ne0 < 1 || ne1 < 1)
        return hn_errf(err, HN_ERR_INVALID, "cpu backend: bad activation tensor (%s, %lld x %lld)", qt_name(type),
                       (long long)ne0, (long long)ne1);
    size_t bytes = be_tensor_bytes(type, ne0, ne1);
    if (bytes > cb->arena_cap - cb->arena_used)
        return hn_errf(err, HN_ERR_RANGE, "cpu backend: activation arena full (%zu of %zu bytes used, %zu more asked)",
                       cb->arena_used, cb->arena_cap, bytes);
    if (cb->n_acts == cb->cap_acts) {
        int cap = cb->cap_acts ? 2 * cb->cap_acts : 64;
        void *np = hn_realloc(cb->acts, sizeof *cb->acts * (size_t)cap);
        if (!np) return hn_errf(err, HN_ERR_NOMEM, "cpu backend: out of memory");
        cb->acts = np;
        cb->cap_acts = cap;
    }
    be_tensor *t = hn_calloc(1, sizeof *t);
    if (!t) return hn_errf(err, HN_ERR_NOMEM, "cpu backend: out of memory");
    /* its own address range, backed whole until a reserve says fewer rows */
    void *vm = hn_vm_reserve(bytes);
    if (!vm) {
        hn_free(t);
        return hn_errf(err, HN_ERR_NOMEM, "cpu backend: cannot reserve %zu bytes of address space", bytes);
    }
    t->type = type;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->ne[2] = 1;
    t->row_bytes = (size_t)ne0 * 4;
    t->mat_bytes = t->row_bytes * (size_t)ne1;
    t->data = vm;
    struct cpu_act *a = &cb->acts[cb->n_acts];
    *a = (struct cpu_act){.t = t, .vm = (bytes + hn_page_size() - 1) / hn_page_size() * hn_page_size()};
    hn_status st = act_back(cb, a, bytes, err);
    if (st) {
        hn_vm_release(vm, a->vm);
        hn_free(t);
        return st;
    }
    cb->n_acts++;
    cb->arena_used += bytes;
    st = track(cb, t, err);
    if (!st) *out = t;
    return st;
}

static hn_status op_weight_load(be_backend *b, const be_weight_src *src, unsigned flags, be_tensor **out,
                                hn_err *err) {
    cpu_be *cb = cpu_of(b);
    *out = NULL;
    size_t rb;
    hn_status cst = be_weight_src_check(src, "cpu", &rb, err);
    if (cst) return cst;
    be_tensor *t = hn_calloc(1, sizeof *t);
    if (!t) return hn_errf(err, HN_ERR_NOMEM, "cpu backend: out of memory");
    t->type = src->type;
    memcpy(t->ne, src->ne, sizeof t->ne);
    t->row_bytes = rb;
    t->mat_bytes = rb * (size_t)src->ne[1];
    t->data = (void *)src->data; /* the CPU reads the mapping in place */
    hn_status st = track(cb, t, err);
    if (st) return st;
    if ((flags & BE_W_MATMUL) && (st = be_cpu_prepare_weight(b, t, flags & BE_W_DROP_SOURCE, err))) return st;
    *out = t;
    return HN_OK;
}

static const kv_storage *op_kv_storage(be_backend *b) {
    (void)b;
    return kv_host_storage();
}

/* ---- tuning ---- */

static bool op_set_mm_params(be_backend *b, qt_type t, int64_t k, int64_t n, int min_rows, const be_mm_params *p) {
    if (k == 0) {
        if ((unsigned)t >= QT_TYPE_COUNT) return false;
        be_cpu_set_mm_params(b, t, p);
        return true;
    }
    return be_cpu_set_mm_params_shape(b, t, k, n, min_rows, p);
}

static void op_set_reference(be_backend *b, bool on) { be_cpu_force_reference(b, on); }

/* ---- lifecycle ---- */

static void op_free(be_backend *b) {
    cpu_be *cb = cpu_of(b);
    for (int i = 0; i < cb->n_acts; i++) {
        struct cpu_act *a = &cb->acts[i];
        if (a->backed) hn_vm_decommit(a->t->data, a->backed);
        hn_vm_release(a->t->data, a->vm);
    }
    hn_free(cb->acts);
    for (int i = 0; i < cb->n_tensors; i++) hn_free(cb->tensors[i]);
    hn_free(cb->tensors);
    cpu_matmul_free(cb);
    cpu_packs_free(cb);
    cpu_attn_free(cb);
    pool *own = cb->own_pool;
    hn_free(cb);
    pool_free(own);
}

static hn_status op_reserve(be_backend *b, const be_limits *lim, hn_err *err) {
    cpu_be *cb = cpu_of(b);
    if (lim->max_head_dim > 4096 || lim->max_group > 1024 || lim->max_rows < 0 || lim->max_k < 0 ||
        lim->max_experts < 0 || lim->n_act < 0 || (lim->n_act > 0 && !lim->act))
        return hn_errf(err, HN_ERR_RANGE, "cpu backend: limits out of range");
    if (lim->arena_bytes > cb->arena_cap - cb->arena_used && cb->arena_used)
        return hn_errf(err, HN_ERR_INVALID, "cpu backend: the arena grows only before its first tensor");
    /* the act rows name tensors of this backend, each at most once */
    for (int i = 0; i < lim->n_act; i++) {
        int j = 0;
        while (j < cb->n_acts && cb->acts[j].t != lim->act[i].t) j++;
        if (j == cb->n_acts || lim->act[i].rows < 0)
            return hn_errf(err, HN_ERR_INVALID, "cpu backend: reserve: act row %d is not an activation tensor", i);
        for (int k = 0; k < i; k++)
            if (lim->act[k].t == lim->act[i].t)
                return hn_errf(err, HN_ERR_INVALID, "cpu backend: reserve: a tensor listed twice in the act rows");
    }
    cb->lim = *lim;
    cb->lim.act = NULL; /* borrowed for this call only */
    cb->lim.n_act = 0;
    hn_status st = cpu_matmul_reserve(cb, err);
    if (!st) st = cpu_attn_reserve(cb, err);
    cb->unreserved = st != HN_OK;
    if (st) return st;
    if (lim->arena_bytes > cb->arena_cap - cb->arena_used) cb->arena_cap = lim->arena_bytes;
    /* activation rows: backed as listed, the others whole */
    for (int j = 0; j < cb->n_acts; j++) {
        struct cpu_act *a = &cb->acts[j];
        int64_t rows = a->t->ne[1];
        for (int i = 0; i < lim->n_act; i++)
            if (lim->act[i].t == a->t && lim->act[i].rows < rows) rows = lim->act[i].rows;
        if ((st = act_back(cb, a, (size_t)rows * a->t->row_bytes, err))) return st;
    }
    return HN_OK;
}

/* host memory: nothing for model_load to check */
static bool cpu_op_mem_info(be_backend *b, size_t *free_b, size_t *total_b) {
    (void)b, (void)free_b, (void)total_b;
    return false;
}

static size_t op_scratch_bytes(be_backend *b) {
    cpu_be *cb = cpu_of(b);
    return cb->act_backed + cb->mm_bytes + cb->attn_bytes;
}

static const be_ops cpu_ops = {
    .version = BE_OPS_VERSION,
    .name = "cpu",
    .free = op_free,
    .reserve = op_reserve,
    .tensor_new = op_tensor_new,
    .weight_load = op_weight_load,
    .kv_storage = op_kv_storage,
    .plan_set = op_plan_set,
    .fetch = op_fetch,
    .upload = op_upload,
    .sync = op_sync,
    .get_rows = op_get_rows,
    .matmul = cpu_op_matmul,
    .matmul_multi = cpu_op_matmul_multi,
    .rms_norm = op_rms_norm,
    .rope = op_rope,
    .add = op_add,
    .add_bias = op_add_bias,
    .swiglu = op_swiglu,
    .kv_store = cpu_op_kv_store,
    .attention = cpu_op_attention,
    .moe_route = op_moe_route,
    .moe_matmul = cpu_op_moe_matmul,
    .moe_combine = op_moe_combine,
    .gather_out = op_gather_out,
    .mask_logits = op_mask_logits,
    .set_mm_params = op_set_mm_params,
    .clear_mm_params = be_cpu_clear_mm_params_shape,
    .set_reference = op_set_reference,
    .mm_tunable = cpu_op_mm_tunable,
    .mm_case_new = cpu_op_mm_case_new,
    .mm_case_params = cpu_op_mm_case_params,
    .mm_case_free = cpu_op_mm_case_free,
    .copy_cols = cpu_op_copy_cols,
    .sigmoid_mul = cpu_op_sigmoid_mul,
    .l2_norm = cpu_op_l2_norm,
    .rope_multi = cpu_op_rope_multi,
    .ssm_conv = cpu_op_ssm_conv,
    .delta_net = cpu_op_delta_net,
    .state_copy = cpu_op_state_copy,
    .mem_info = cpu_op_mem_info,
    .scratch_bytes = op_scratch_bytes,
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
    cb->delta_avx2 = cpu_dot_features()->avx2 && cpu_dot_features()->fma;
    const char *dc = getenv("HONE_DELTA_CHUNK");
    cb->delta_chunk = dc && *dc ? atoi(dc) : 0;
    if (cb->delta_chunk < 0) cb->delta_chunk = 0;
    const char *np = getenv("HONE_NO_PACK");
    cb->no_pack = np && *np && strcmp(np, "0") != 0;
    *out = &cb->base;
    return HN_OK;
}

void be_cpu_force_reference(be_backend *b, bool on) {
    cpu_of(b)->force_ref = on;
    cpu_attn_select(cpu_of(b));
}

pool *be_cpu_pool(be_backend *b) { return cpu_of(b)->pool; }

