/* gemv.c: the decode GEMV kernel family for the tuner (see gemv.h). Runs are
 * the CPU backend's own matmul of one activation row (a backend made on the
 * case's pool), with its parameters (kernel, threads, chunks per thread) set
 * through be_cpu_set_mm_params, so what is timed is what decode runs. */
#include "gemv.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "../backend/cpu/cpu.h"
#include "../backend/cpu/dot.h"
#include "../backend/cpu/gemm.h"
#include "../core/alloc.h"
#include "../quant/quant.h"

#define MAX_VARIANTS 8
#define MAX_CHOICES 16
#define DISTINCT_ROWS 32 /* synthetic weights: this many quantized rows, tiled */

struct tn_gemv {
    qt_type type;
    int64_t k, n;
    size_t row_bytes, mat_bytes;
    unsigned char *rot; /* n_rot copies of the matrix, back to back */
    size_t rot_alloc;
    int n_rot, cur;
    float *x;           /* the activation row (k floats) */
    unsigned char *act; /* x converted for the current variant */
    size_t act_alloc;
    const cpu_dot_kernel *var[MAX_VARIANTS];
    int n_var;
    /* kernel choices: dot variants (be kernel -1-i), then gemm variants (be kernel 1+i) */
    int choice[MAX_CHOICES];
    char label[MAX_CHOICES][24];
    int n_choice, def_choice;
    be_backend *be;
    float *ref; /* reference output over copy 0 */
    bool ref_ready;
    const void **src; /* borrowed matrices to copy from; NULL: synthetic */
    int n_src;
    pool *pool;
    char shape[64];

    /* the current run */
    const cpu_dot_kernel *kern;
    const unsigned char *w, *a;
    float *y;
    int64_t chunk_rows;
    int total_chunks, nth_use;
    _Atomic int next;
};

/* Threads take chunks of rows from the counter until none are left. */
static void gemv_work(void *ctx, int ith, int nth) {
    (void)nth;
    tn_gemv *g = ctx;
    if (ith >= g->nth_use) return;
    cpu_dot_fn dot = g->kern->dot;
    const int64_t k = g->k, n = g->n;
    for (;;) {
        int c = atomic_fetch_add_explicit(&g->next, 1, memory_order_relaxed);
        if (c >= g->total_chunks) break;
        int64_t j0 = (int64_t)c * g->chunk_rows, j1 = j0 + g->chunk_rows < n ? j0 + g->chunk_rows : n;
        for (int64_t j = j0; j < j1; j++) dot(k, &g->y[j], g->w + (size_t)j * g->row_bytes, g->a);
    }
}

/* Runs y = W x on `copy` with variant v, nth_use threads, cpt chunks per thread. */
static void gemv_exec(tn_gemv *g, int copy, int v, int nth_use, int cpt, float *y) {
    g->kern = g->var[v];
    g->w = g->rot + (size_t)copy * g->mat_bytes;
    g->y = y;
    if (g->kern->act_type == QT_F32) {
        g->a = (const unsigned char *)g->x;
    } else {
        g->kern->act(g->x, g->act, g->k);
        g->a = g->act;
    }
    int64_t per = g->n / ((int64_t)nth_use * cpt);
    g->chunk_rows = per < 1 ? 1 : per;
    g->total_chunks = (int)((g->n + g->chunk_rows - 1) / g->chunk_rows);
    g->nth_use = nth_use;
    atomic_store_explicit(&g->next, 0, memory_order_relaxed);
    if (nth_use == 1) gemv_work(g, 0, 1);
    else pool_run(g->pool, gemv_work, g);
}

/* A run is the backend's matmul with the configuration's parameters. */
static bool gemv_run(void *ctx, const int *cfg, float *out) {
    tn_gemv *g = ctx;
    if (!g->ref_ready || cfg[0] < 0 || cfg[0] >= g->n_choice || cfg[1] < 1 || cfg[1] > pool_n_threads(g->pool) ||
        cfg[2] < 1)
        return false;
    int copy = g->cur;
    g->cur = (g->cur + 1) % g->n_rot;
    be_cpu_mm_params mp = {.kernel = g->choice[cfg[0]], .chunks = cfg[2], .threads = cfg[1]};
    be_cpu_set_mm_params(g->be, g->type, &mp);
    be_weight w = {.type = g->type,
                   .ne = {g->k, g->n, 1},
                   .row_bytes = g->row_bytes,
                   .mat_bytes = g->mat_bytes,
                   .data = g->rot + (size_t)copy * g->mat_bytes};
    g->be->ops->matmul(g->be, &w, 0, g->x, 1, out);
    return true;
}

static void gemv_reset(void *ctx) { ((tn_gemv *)ctx)->cur = 0; }

static hn_status gemv_prepare(tn_gemv *g, hn_err *err);

static hn_status gemv_reference(void *ctx, float *out, hn_err *err) {
    (void)err;
    tn_gemv *g = ctx;
    hn_status st = gemv_prepare(g, err);
    if (st == HN_OK) memcpy(out, g->ref, sizeof(float) * (size_t)g->n);
    return st;
}

static uint64_t xorshift(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static float uniform(uint64_t *s) { return (float)(xorshift(s) >> 40) / (float)(1 << 24) - 0.5f; }

hn_status tn_gemv_create(qt_type t, int64_t k, int64_t n, const void *const *mats, int n_mats, size_t rotate_bytes,
                         pool *p, tn_gemv **out, hn_err *err) {
    *out = NULL;
    const qt_type_traits *tr = qt_traits(t);
    if (!tr || k <= 0 || n <= 0 || k > ((int64_t)1 << 24) || n > ((int64_t)1 << 24) || !p)
        return hn_errf(err, HN_ERR_INVALID, "gemv: bad shape or type");
    size_t rb = qt_row_size(t, k);
    if (!rb) return hn_errf(err, HN_ERR_INVALID, "gemv: %lld is not a multiple of %s's block", (long long)k, tr->name);
    tn_gemv *g = hn_calloc(1, sizeof *g);
    if (!g) return hn_errf(err, HN_ERR_NOMEM, "gemv: out of memory");
    g->type = t;
    g->k = k;
    g->n = n;
    g->pool = p;
    g->row_bytes = rb;
    g->mat_bytes = rb * (size_t)n;
    g->n_var = cpu_dot_variants(t, g->var, MAX_VARIANTS);
    if (g->n_var > MAX_VARIANTS) g->n_var = MAX_VARIANTS;
    snprintf(g->shape, sizeof g->shape, "%s k%lld n%lld t%d", tr->name, (long long)k, (long long)n,
             pool_n_threads(p));
    if (g->n_var < 1 || strcmp(g->var[0]->isa, "ref")) {
        tn_gemv_free(g);
        return hn_errf(err, HN_ERR_UNSUPPORTED, "gemv: no dot kernel for %s", tr->name);
    }
    /* kernel choices and the backend's default among them */
    for (int i = 0; i < g->n_var && g->n_choice < MAX_CHOICES; i++, g->n_choice++) {
        g->choice[g->n_choice] = -1 - i;
        snprintf(g->label[g->n_choice], sizeof g->label[0], "%s", g->var[i]->isa);
    }
    g->def_choice = g->n_var - 1; /* cpu_dot_best */
    const cpu_gemm_kernel *gv[MAX_VARIANTS];
    int ng = cpu_gemm_variants(t, gv, MAX_VARIANTS);
    const cpu_gemm_kernel *pick = cpu_gemm_pick(t, 1);
    for (int i = 0; i < ng && i < MAX_VARIANTS && g->n_choice < MAX_CHOICES; i++, g->n_choice++) {
        g->choice[g->n_choice] = 1 + i;
        snprintf(g->label[g->n_choice], sizeof g->label[0], "gemm-%s", gv[i]->isa);
        if (gv[i] == pick) g->def_choice = g->n_choice;
    }
    be_limits lim = {.max_rows = 1, .max_k = k, .max_head_dim = 64, .max_group = 1};
    hn_status st = be_cpu_create(p, &g->be, err);
    if (st == HN_OK) st = g->be->ops->reserve(g->be, &lim, err);
    if (st != HN_OK) {
        tn_gemv_free(g);
        return st;
    }
    if (!mats && !tr->from_float) {
        tn_gemv_free(g);
        return hn_errf(err, HN_ERR_UNSUPPORTED, "gemv: cannot make synthetic %s weights", tr->name);
    }
    size_t copies = rotate_bytes / g->mat_bytes;
    if (copies < 1) copies = 1;
    if (copies > 4096) copies = 4096;
    g->n_rot = (int)copies;
    g->rot_alloc = copies * g->mat_bytes;
    if (mats && n_mats > 0) {
        g->src = hn_malloc(sizeof(void *) * (size_t)n_mats);
        if (!g->src) {
            tn_gemv_free(g);
            return hn_errf(err, HN_ERR_NOMEM, "gemv: out of memory");
        }
        memcpy(g->src, mats, sizeof(void *) * (size_t)n_mats);
        g->n_src = n_mats;
    }
    *out = g;
    return HN_OK;
}

/* Allocates and fills the rotation buffer and computes the reference (the
 * first time only): deferred so that a case answered from the cache costs
 * nothing. */
static hn_status gemv_prepare(tn_gemv *g, hn_err *err) {
    if (g->ref_ready) return HN_OK;
    const qt_type_traits *tr = qt_traits(g->type);
    const int64_t k = g->k, n = g->n;
    const size_t rb = g->row_bytes;
    if (!g->rot) g->rot = hn_pages_alloc(g->rot_alloc);
    if (!g->x) g->x = hn_malloc(sizeof(float) * (size_t)k);
    g->act_alloc = (size_t)k * 4 + 1024; /* bounds every act_type's row (see dot.h) */
    if (!g->act) g->act = hn_malloc(g->act_alloc);
    if (!g->ref) g->ref = hn_malloc(sizeof(float) * (size_t)n);
    float *row = hn_malloc(sizeof(float) * (size_t)k);
    if (!g->rot || !g->x || !g->act || !g->ref || !row) {
        hn_free(row);
        return hn_errf(err, HN_ERR_NOMEM, "gemv: cannot allocate %zu bytes of rotation buffer", g->rot_alloc);
    }
    uint64_t seed = 0x9e3779b97f4a7c15ull ^ ((uint64_t)g->type << 32) ^ (uint64_t)(k * 31 + n);
    for (int64_t i = 0; i < k; i++) g->x[i] = uniform(&seed);
    size_t copies = (size_t)g->n_rot;
    if (g->n_src > 0) {
        for (size_t c = 0; c < copies; c++)
            memcpy(g->rot + c * g->mat_bytes, g->src[c % (size_t)g->n_src], g->mat_bytes);
    } else {
        for (int r = 0; r < DISTINCT_ROWS && r < n; r++) {
            for (int64_t i = 0; i < k; i++) row[i] = uniform(&seed);
            tr->from_float(row, g->rot + (size_t)r * rb, k);
        }
        for (int64_t r = DISTINCT_ROWS; r < n; r++)
            memcpy(g->rot + (size_t)r * rb, g->rot + (size_t)(r % DISTINCT_ROWS) * rb, rb);
        for (size_t c = 1; c < copies; c++) memcpy(g->rot + c * g->mat_bytes, g->rot, g->mat_bytes);
    }
    hn_free(row);
    /* the trusted output: the scalar kernel, one thread, copy 0 */
    gemv_exec(g, 0, 0, 1, 1, g->ref);
    g->ref_ready = true;
    return HN_OK;
}

void tn_gemv_free(tn_gemv *g) {
    if (!g) return;
    be_free(g->be);
    if (g->rot) hn_pages_free(g->rot, g->rot_alloc);
    hn_free(g->src);
    hn_free(g->x);
    hn_free(g->act);
    hn_free(g->ref);
    hn_free(g);
}

size_t tn_gemv_bytes(const tn_gemv *g) { return g->mat_bytes; }

void tn_gemv_case(tn_gemv *g, tn_case *c) {
    memset(c, 0, sizeof *c);
    c->kernel = "gemv";
    c->version = TN_GEMV_VERSION;
    snprintf(c->shape, sizeof c->shape, "%s", g->shape);
    tn_param *pd = &c->params[0], *pt = &c->params[1], *pc = &c->params[2];
    pd->name = "kernel";
    pd->n = g->n_choice < TN_MAX_VALUES ? g->n_choice : TN_MAX_VALUES;
    for (int i = 0; i < pd->n; i++) {
        pd->values[i] = i;
        pd->labels[i] = g->label[i];
    }
    pd->def = g->def_choice < pd->n ? g->def_choice : pd->n - 1; /* the backend's default */
    pt->name = "threads";
    int nt = pool_n_threads(g->pool);
    for (int v = 1; v < nt && pt->n < TN_MAX_VALUES - 1; v *= 2) pt->values[pt->n++] = v;
    pt->values[pt->n++] = nt;
    pt->def = pt->n - 1;
    static const int cpts[] = {1, 2, 4, 8, 16};
    pc->name = "chunks";
    for (int i = 0; i < 5; i++) pc->values[pc->n++] = cpts[i];
    pc->def = 2; /* the backend's 4 per thread */
    c->n_params = 3;
    c->n_out = (size_t)g->n;
    c->tol_rel = 1e-3f;
    c->tol_abs = 1e-6f;
    c->tol_max = 1e-4f;
    c->ctx = g;
    c->reference = gemv_reference;
    c->run = gemv_run;
    c->reset = gemv_reset;
    c->weight = (double)g->mat_bytes;
}
