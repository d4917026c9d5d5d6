/* cpu_tune.c: the decode (gemv) and prefill matmul families for the tuner
 * (see cpu_tune.h), and the backend's mm_case_* ops over them. Runs are the CPU backend's own matmul (a backend made on the
 * case's pool), with its parameters (kernel, threads, chunks per thread, tile)
 * set through be_cpu_set_mm_params, so what is timed is what the model runs. */
#include "cpu_tune.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../core/alloc.h"
#include "../../quant/quant.h"
#include "cpu_int.h"
#include "dot.h"
#include "gemm.h"
#include "pack.h"

#define MAX_VARIANTS 8
#define MAX_CHOICES 16
#define DISTINCT_ROWS 32 /* synthetic weights: this many quantized rows, tiled */
#define MAX_ROWS 4096

struct tn_gemv {
    qt_type type;
    int64_t k, n;
    int rows; /* activation rows per run (1: decode) */
    size_t row_bytes, mat_bytes;
    unsigned char *rot; /* n_rot copies of the matrix, back to back */
    size_t rot_alloc;
    int n_rot, cur;
    float *x;           /* the activation rows (rows x k floats) */
    unsigned char *act; /* x converted by the reference kernel (rows rows) */
    size_t act_row;
    const cpu_dot_kernel *ref_kern;
    /* kernel choices: dot variants (be kernel -1-i), gemm variants (be kernel 1+i),
     * each on the GGUF rows (pack -1), then packed variants (pack 1+i) */
    be_cpu_mm_params choice[MAX_CHOICES];
    char label[MAX_CHOICES][40];
    int n_choice, def_choice;
    /* packed copies of the rotation (the layout the model packs this shape into) */
    const cpu_pack_kernel *pk;  /* packs the copies; NULL: no packed choice */
    unsigned char *prot;
    size_t pmat_bytes, prot_alloc;
    be_backend *be;
    float *ref; /* reference output over copy 0: rows x n */
    bool ref_ready;
    const void **src; /* borrowed matrices to copy from; NULL: synthetic */
    int n_src;
    pool *pool;
    bool all_threads; /* threads parameter fixed at the pool's size */
    char shape[96];

    /* the reference run */
    _Atomic int next;
};

/* reference: threads take weight rows in chunks of 16 and dot them with every activation row */
static void ref_work(void *ctx, int ith, int nth) {
    (void)ith;
    (void)nth;
    tn_gemv *g = ctx;
    const int64_t k = g->k, n = g->n;
    for (;;) {
        int64_t j0 = (int64_t)atomic_fetch_add_explicit(&g->next, 1, memory_order_relaxed) * 16;
        if (j0 >= n) break;
        int64_t j1 = j0 + 16 < n ? j0 + 16 : n;
        for (int64_t j = j0; j < j1; j++)
            for (int r = 0; r < g->rows; r++)
                g->ref_kern->dot(k, &g->ref[(size_t)r * (size_t)n + (size_t)j], g->rot + (size_t)j * g->row_bytes,
                                 g->act + (size_t)r * g->act_row);
    }
}

void tn_gemv_params(const tn_gemv *g, const int *cfg, be_cpu_mm_params *out) {
    memset(out, 0, sizeof *out);
    int c = cfg[0] >= 0 && cfg[0] < g->n_choice ? cfg[0] : g->def_choice;
    out->kernel = g->choice[c].kernel;
    out->pack = g->choice[c].pack;
    out->threads = cfg[1];
    out->chunks = cfg[2];
    if (g->rows > 1) out->tile = cfg[3];
}

/* A run is the backend's matmul with the configuration's parameters. */
static bool gemv_run(void *ctx, const int *cfg, float *out) {
    tn_gemv *g = ctx;
    if (!g->ref_ready || cfg[0] < 0 || cfg[0] >= g->n_choice || cfg[1] < 1 || cfg[1] > pool_n_threads(g->pool) ||
        cfg[2] < 1 || (g->rows > 1 && (cfg[3] < 0 || cfg[3] > MAX_ROWS)))
        return false;
    int copy = g->cur;
    g->cur = (g->cur + 1) % g->n_rot;
    be_cpu_mm_params mp;
    tn_gemv_params(g, cfg, &mp);
    be_cpu_set_mm_params(g->be, g->type, &mp);
    be_tensor w = {.type = g->type,
                   .ne = {g->k, g->n, 1},
                   .row_bytes = g->row_bytes,
                   .mat_bytes = g->mat_bytes,
                   .data = g->rot + (size_t)copy * g->mat_bytes};
    if (mp.pack > 0) {
        w.packed = g->prot + (size_t)copy * g->pmat_bytes;
        w.layout = g->pk->layout;
    }
    be_tensor xt = be_cpu_host(QT_F32, g->x), yt = be_cpu_host(QT_F32, out);
    g->be->ops->matmul(g->be, &w, 0, &xt, g->rows, &yt);
    return true;
}

static void gemv_reset(void *ctx) { ((tn_gemv *)ctx)->cur = 0; }

static hn_status gemv_prepare(tn_gemv *g, hn_err *err);

static hn_status gemv_reference(void *ctx, float *out, hn_err *err) {
    tn_gemv *g = ctx;
    hn_status st = gemv_prepare(g, err);
    if (st == HN_OK) memcpy(out, g->ref, sizeof(float) * (size_t)g->n * (size_t)g->rows);
    return st;
}

static uint64_t xorshift(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static float uniform(uint64_t *s) { return (float)(xorshift(s) >> 40) / (float)(1 << 24) - 0.5f; }

static void add_choice(tn_gemv *g, int be_kernel, int pack, const char *prefix, const char *isa) {
    if (g->n_choice == MAX_CHOICES) return;
    g->choice[g->n_choice] = (be_cpu_mm_params){.kernel = be_kernel, .pack = pack};
    snprintf(g->label[g->n_choice], sizeof g->label[0], "%s%s", prefix, isa);
    g->n_choice++;
}

static hn_status make_case(qt_type t, int64_t k, int64_t n, int rows, const void *const *mats, int n_mats,
                           size_t rotate_bytes, pool *p, tn_gemv **out, hn_err *err) {
    *out = NULL;
    const qt_type_traits *tr = qt_traits(t);
    if (!tr || k <= 0 || n <= 0 || k > ((int64_t)1 << 24) || n > ((int64_t)1 << 24) || !p || rows < 1 ||
        rows > MAX_ROWS)
        return hn_errf(err, HN_ERR_INVALID, "gemv: bad shape or type");
    size_t rb = qt_row_size(t, k);
    if (!rb) return hn_errf(err, HN_ERR_INVALID, "gemv: %lld is not a multiple of %s's block", (long long)k, tr->name);
    const cpu_dot_kernel *dv[MAX_VARIANTS];
    int nd = cpu_dot_variants(t, dv, MAX_VARIANTS);
    if (nd > MAX_VARIANTS) nd = MAX_VARIANTS;
    if (nd < 1 || strcmp(dv[0]->isa, "ref"))
        return hn_errf(err, HN_ERR_UNSUPPORTED, "gemv: no dot kernel for %s", tr->name);
    tn_gemv *g = hn_calloc(1, sizeof *g);
    if (!g) return hn_errf(err, HN_ERR_NOMEM, "gemv: out of memory");
    g->type = t;
    g->k = k;
    g->n = n;
    g->rows = rows;
    g->pool = p;
    g->row_bytes = rb;
    g->mat_bytes = rb * (size_t)n;
    g->ref_kern = dv[0];
    if (rows == 1)
        snprintf(g->shape, sizeof g->shape, "%s k%lld n%lld t%d", tr->name, (long long)k, (long long)n,
                 pool_n_threads(p));
    else
        snprintf(g->shape, sizeof g->shape, "%s k%lld n%lld r%d t%d", tr->name, (long long)k, (long long)n, rows,
                 pool_n_threads(p));
    /* the backend's untuned choice: the gemm pick (when it reads the dot kernel's activations), else the best dot */
    const cpu_dot_kernel *best = cpu_dot_best(t);
    const cpu_gemm_kernel *gv[MAX_VARIANTS];
    int ng = cpu_gemm_variants(t, gv, MAX_VARIANTS);
    if (ng > MAX_VARIANTS) ng = MAX_VARIANTS;
    const cpu_gemm_kernel *pick = cpu_gemm_pick_k(t, rows, k);
    if (pick && pick->act_type != best->act_type) pick = NULL;
    /* the layout the model repacks this shape into at load (ops->prepare_weight), if any */
    const char *np = getenv("HONE_NO_PACK");
    const cpu_pack_kernel *pbest = np && *np && strcmp(np, "0") ? NULL : cpu_pack_best(t, k);
    if (pbest && (pbest->rows > CPU_PACK_MAX_ROWS || n < pbest->rows || pbest->act_type != best->act_type))
        pbest = NULL;
    /* candidates: every variant but the scalar references (kept only when they are the default) */
    for (int i = 0; i < nd; i++) {
        bool is_def = !pbest && !pick && dv[i] == best;
        if (strcmp(dv[i]->isa, "ref") && dv[i]->act_type == best->act_type) add_choice(g, -1 - i, -1, "", dv[i]->isa);
        else if (is_def) add_choice(g, -1 - i, -1, "", dv[i]->isa);
        else continue;
        if (is_def) g->def_choice = g->n_choice - 1;
    }
    for (int i = 0; i < ng; i++) {
        bool is_def = !pbest && gv[i] == pick;
        if (gv[i]->act_type != best->act_type || !cpu_gemm_fits(gv[i], k)) continue;
        if (strcmp(gv[i]->isa, "ref") || is_def) add_choice(g, 1 + i, -1, "gemm-", gv[i]->isa);
        else continue;
        if (is_def) g->def_choice = g->n_choice - 1;
    }
    if (pbest) {
        /* packed variants of that layout (they read the same bytes); tails run the default kernels */
        const cpu_pack_kernel *pv[MAX_VARIANTS];
        int npv = cpu_pack_variants(t, pv, MAX_VARIANTS);
        if (npv > MAX_VARIANTS) npv = MAX_VARIANTS;
        const cpu_pack_kernel *pref = cpu_pack_ref(t, pbest->layout);
        for (int i = 0; i < npv; i++) {
            if (pv[i]->layout != pbest->layout || pv[i]->act_type != best->act_type || !cpu_pack_fits(pv[i], k) ||
                (pv[i] == pref && pv[i] != pbest))
                continue;
            add_choice(g, 0, 1 + i, "pack-", pv[i]->name);
            if (pv[i] == pbest) g->def_choice = g->n_choice - 1;
        }
        g->pk = pbest;
        g->pmat_bytes = pbest->group_bytes(k) * (size_t)(n / pbest->rows);
    }
    be_limits lim = {.max_rows = rows, .max_k = k, .max_head_dim = 64, .max_group = 1};
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
    g->prot_alloc = g->pk ? copies * g->pmat_bytes : 0;
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

hn_status tn_gemv_create(qt_type t, int64_t k, int64_t n, const void *const *mats, int n_mats, size_t rotate_bytes,
                         pool *p, tn_gemv **out, hn_err *err) {
    return make_case(t, k, n, 1, mats, n_mats, rotate_bytes, p, out, err);
}

hn_status tn_prefill_create(qt_type t, int64_t k, int64_t n, int rows, const void *const *mats, int n_mats,
                            size_t rotate_bytes, pool *p, tn_gemv **out, hn_err *err) {
    if (rows < 2) {
        *out = NULL;
        return hn_errf(err, HN_ERR_INVALID, "prefill: %d rows (decode is tn_gemv_create)", rows);
    }
    return make_case(t, k, n, rows, mats, n_mats, rotate_bytes, p, out, err);
}

/* Allocates and fills the rotation buffer and computes the reference (the
 * first time only): deferred so that a case answered from the cache costs
 * nothing. */
static hn_status gemv_prepare(tn_gemv *g, hn_err *err) {
    if (g->ref_ready) return HN_OK;
    const qt_type_traits *tr = qt_traits(g->type);
    const int64_t k = g->k, n = g->n;
    const size_t rb = g->row_bytes, nx = (size_t)k * (size_t)g->rows;
    g->act_row = (size_t)k * 4 + 1024; /* bounds every act_type's row (see dot.h) */
    if (!g->rot) g->rot = hn_pages_alloc(g->rot_alloc);
    if (!g->x) g->x = hn_malloc(sizeof(float) * nx);
    if (!g->act) g->act = hn_malloc(g->act_row * (size_t)g->rows);
    if (!g->ref) g->ref = hn_malloc(sizeof(float) * (size_t)n * (size_t)g->rows);
    float *row = hn_malloc(sizeof(float) * (size_t)k);
    if (!g->rot || !g->x || !g->act || !g->ref || !row) {
        hn_free(row);
        return hn_errf(err, HN_ERR_NOMEM, "gemv: cannot allocate %zu bytes of rotation buffer", g->rot_alloc);
    }
    uint64_t seed = 0x9e3779b97f4a7c15ull ^ ((uint64_t)g->type << 32) ^ (uint64_t)(k * 31 + n);
    for (size_t i = 0; i < nx; i++) g->x[i] = uniform(&seed);
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
    if (g->pk) {
        /* the packed copies, as prepare_weight makes them */
        if (!g->prot) g->prot = hn_pages_alloc(g->prot_alloc);
        if (!g->prot) return hn_errf(err, HN_ERR_NOMEM, "gemv: cannot allocate %zu bytes of packed copies", g->prot_alloc);
        const int64_t R = g->pk->rows, ng = n / R;
        const size_t gb = g->pk->group_bytes(k);
        for (size_t c = 0; c < copies; c++)
            for (int64_t j = 0; j < ng; j++)
                g->pk->pack(k, g->rot + c * g->mat_bytes + (size_t)(j * R) * rb, rb,
                            g->prot + c * g->pmat_bytes + (size_t)j * gb);
    }
    /* the trusted output: the scalar kernel over copy 0 */
    if (g->ref_kern->act_type == QT_F32) {
        for (int r = 0; r < g->rows; r++) memcpy(g->act + (size_t)r * g->act_row, g->x + (size_t)r * (size_t)k, sizeof(float) * (size_t)k);
    } else {
        for (int r = 0; r < g->rows; r++) g->ref_kern->act(g->x + (size_t)r * (size_t)k, g->act + (size_t)r * g->act_row, k);
    }
    atomic_store(&g->next, 0);
    if ((double)n * (double)g->rows * (double)k < 1e6) ref_work(g, 0, 1);
    else pool_run_shared(g->pool, ref_work, g);
    g->ref_ready = true;
    return HN_OK;
}

void tn_gemv_free(tn_gemv *g) {
    if (!g) return;
    be_free(g->be);
    if (g->rot) hn_pages_free(g->rot, g->rot_alloc);
    if (g->prot) hn_pages_free(g->prot, g->prot_alloc);
    hn_free(g->src);
    hn_free(g->x);
    hn_free(g->act);
    hn_free(g->ref);
    hn_free(g);
}

size_t tn_gemv_bytes(const tn_gemv *g) { return g->mat_bytes; }
void tn_gemv_all_threads(tn_gemv *g) { g->all_threads = true; }
double tn_gemv_macs(const tn_gemv *g) { return (double)g->rows * (double)g->k * (double)g->n; }

/* set by the Makefile: a checksum of the kernel sources (src/backend/cpu, src/quant) */
#ifndef HN_KERNELS_ID
#define HN_KERNELS_ID "0"
#endif

const char *tn_gemv_version(int rows) {
    return rows == 1 ? TN_GEMV_VERSION "-k" HN_KERNELS_ID : TN_PREFILL_VERSION "-k" HN_KERNELS_ID;
}

void tn_gemv_case(tn_gemv *g, tn_case *c) {
    memset(c, 0, sizeof *c);
    c->kernel = g->rows == 1 ? "gemv" : "prefill";
    c->version = tn_gemv_version(g->rows);
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
    for (int v = 1; v < nt && pt->n < TN_MAX_VALUES - 1 && !g->all_threads; v *= 2) pt->values[pt->n++] = v;
    pt->values[pt->n++] = nt;
    pt->def = pt->n - 1;
    static const int cpts[] = {1, 2, 4, 8, 16};
    pc->name = "chunks";
    for (int i = 0; i < 5; i++) pc->values[pc->n++] = cpts[i];
    pc->def = g->rows > 64 ? 3 : 2; /* the backend's 8 past 64 rows, else 4 per thread */
    c->n_params = 3;
    if (g->rows > 1) {
        tn_param *pl = &c->params[3];
        static const int tiles[] = {0, 8, 16, 32, 128}; /* 64 is the gemm default */
        pl->name = "tile";
        for (int i = 0; i < 5; i++) pl->values[pl->n++] = tiles[i];
        pl->labels[0] = "auto"; /* the backend's default (64 rows with a gemm kernel, 16 with a dot kernel) */
        pl->def = 0;
        c->n_params = 4;
    }
    c->n_out = (size_t)g->n * (size_t)g->rows;
    c->tol_rel = 1e-3f;
    c->tol_abs = 1e-6f;
    c->tol_max = 1e-4f;
    c->ctx = g;
    c->reference = gemv_reference;
    c->run = gemv_run;
    c->reset = gemv_reset;
    c->weight = (double)g->mat_bytes;
}

/* ---- the backend's tuning ops ---- */

bool cpu_op_mm_tunable(be_backend *b, qt_type t) {
    (void)b;
    return (unsigned)t < QT_TYPE_COUNT && cpu_dot_best(t) != NULL;
}

hn_status cpu_op_mm_case_new(be_backend *b, const be_mm_case *a, tn_case *c, hn_err *err) {
    tn_gemv *g = NULL;
    pool *p = cpu_of(b)->pool;
    hn_status st = a->rows == 1
                       ? tn_gemv_create(a->type, a->k, a->n, a->mats, a->n_mats, a->rotate_bytes, p, &g, err)
                       : tn_prefill_create(a->type, a->k, a->n, a->rows, a->mats, a->n_mats, a->rotate_bytes, p, &g, err);
    if (st) return st;
    if (a->all_threads) tn_gemv_all_threads(g);
    tn_gemv_case(g, c);
    return HN_OK;
}

void cpu_op_mm_case_params(be_backend *b, const tn_case *c, const int *cfg, be_mm_params *out) {
    (void)b;
    tn_gemv_params(c->ctx, cfg, out);
}

void cpu_op_mm_case_free(be_backend *b, tn_case *c) {
    (void)b;
    tn_gemv_free(c->ctx);
    c->ctx = NULL;
}
