/* cuda_tune.cu: the cuda backend's tuning ops (backend.h, "tuning"): the
 * decode gemv's cases for the tuner (tune/tune.h), the tuned parameters'
 * table and the device's tuning key. The logic that needs no GPU (the
 * parameters' sets, their mapping to be_mm_params, the fingerprint) is
 * cuda_tune_key.c.
 *
 * A case is hc_gemv at one weight shape (type, k, n) and one call size of
 * 1..8 activation rows (the tuner's decode family at the rows tune_info
 * lists: 1, 2, 4 and 8, the sizes decode steps are padded to). It owns what
 * it runs on, made at its first reference() (a case answered from the cache
 * costs nothing): its stream, the quantized-x scratch, x, y, and a rotation
 * of copies of the weight on the device (one upload: the model's matrix, or
 * DISTINCT_ROWS random rows quantized with the CPU's quantizer and tiled;
 * then device copies), at least twice the L2 (within 1024 copies and a
 * quarter of the free memory) so that timed runs stream the weight from
 * memory as a step does. x is c * 2^-7 with c integers in
 * -127..127 and a +-127 in every 32 values, which the gemv's activation
 * quantization (Q8_0, Q8_K, bf16) keeps exactly, so that a candidate differs
 * from the reference (hc_gemv_ref: f32 x, f64 sums) by float rounding only
 * and the tolerance can be tight: 1e-3 |ref| + 1e-4 max|ref| (a wrong
 * kernel is off by whole units of 32 products). Runs: hc_gemv with the
 * configuration's parameters on the case's stream, with the backend's
 * programmatic-launch setting; time() launches reps runs over the rotation
 * between two CUDA events (x quantized once before them: in a step the
 * producer of x quantizes it, cuda_ops.cu's fusion), and gives the
 * nanoseconds of one run. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend.h"
#include "cuda_state.cuh"
#include "cuda_tune_key.h"

/* the Makefile's digest of the CUDA sources (the tuning key changes with them) */
#ifndef HC_SRC_DIGEST
#define HC_SRC_DIGEST "0"
#endif

#define DISTINCT_ROWS 32
#define ROT_MIN_BYTES ((size_t)64 << 20) /* at least this much weight in the rotation */
#define ROT_MAX_BYTES ((size_t)1 << 30)  /* at most this much, and a quarter of the free memory */
#define ROT_MAX_COPIES 1024

static void (*g_drop_graphs)(cu_be *cb);

typedef struct cu_case {
    cu_be *cb;
    qt_type type;
    int64_t k, n;
    int na;
    const void **src; /* the model's matrices (borrowed), or NULL: synthetic */
    int n_src;
    hc_weight *rot;
    int n_rot, cur;
    float *dx, *dy;
    hc_gemv_scratch gs;
    cudaStream_t stream;
    cudaEvent_t e0, e1;
    bool ready, failed;
    char version[48];
} cu_case;

static uint64_t xorshift(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void case_free(cu_case *g) {
    if (!g) return;
    if (g->stream) cudaStreamSynchronize(g->stream);
    for (int i = 0; i < g->n_rot && g->rot; i++) hc_weight_free(&g->rot[i]);
    free(g->rot);
    hc_free(g->dx);
    hc_free(g->dy);
    hc_gemv_scratch_free(&g->gs);
    if (g->e0) cudaEventDestroy(g->e0);
    if (g->e1) cudaEventDestroy(g->e1);
    if (g->stream) cudaStreamDestroy(g->stream);
    free(g->src);
    (void)cudaGetLastError();
    free(g);
}

/* the host bytes of one matrix: the model's, or synthetic rows (hn_free'd by the caller when *own) */
static hn_status host_matrix(const cu_case *g, const void **out, bool *own, hn_err *err) {
    const size_t rb = qt_row_size(g->type, g->k), bytes = rb * (size_t)g->n;
    *own = false;
    if (g->n_src > 0) {
        *out = g->src[0];
        return HN_OK;
    }
    const qt_type_traits *tr = qt_traits(g->type);
    unsigned char *m = (unsigned char *)malloc(bytes);
    float *row = (float *)malloc(sizeof(float) * (size_t)g->k);
    if (!m || !row) {
        free(m);
        free(row);
        return hn_errf(err, HN_ERR_NOMEM, "cuda tune: out of host memory for a %zu-byte weight", bytes);
    }
    uint64_t seed = 0x9e3779b97f4a7c15ull ^ ((uint64_t)g->type << 32) ^ (uint64_t)(g->k * 31 + g->n);
    for (int64_t r = 0; r < DISTINCT_ROWS && r < g->n; r++) {
        for (int64_t i = 0; i < g->k; i++) row[i] = (float)(xorshift(&seed) >> 40) / (float)(1 << 24) - 0.5f;
        tr->from_float(row, m + (size_t)r * rb, g->k);
    }
    for (int64_t r = DISTINCT_ROWS; r < g->n; r++) memcpy(m + (size_t)r * rb, m + (size_t)(r % DISTINCT_ROWS) * rb, rb);
    free(row);
    *out = m;
    *own = true;
    return HN_OK;
}

static hn_status cuda_err(cudaError_t e, const char *what, hn_err *err) {
    return e == cudaSuccess ? HN_OK : hc_fail(err, e, what);
}

/* everything the runs need, the first time only */
static hn_status case_prepare(cu_case *g, hn_err *err) {
    if (g->ready) return HN_OK;
    if (g->failed) return hn_errf(err, HN_ERR_INTERNAL, "cuda tune: the case failed to prepare before");
    g->failed = true; /* until it succeeds */
    hc_pdl = g->cb->pdl;
    hn_status st = cuda_err(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking), "tuning stream", err);
    if (!st) st = cuda_err(cudaEventCreate(&g->e0), "tuning event", err);
    if (!st) st = cuda_err(cudaEventCreate(&g->e1), "tuning event", err);
    if (st) return st;
    const void *host = NULL;
    bool own = false;
    if ((st = host_matrix(g, &host, &own, err))) return st;
    hc_device dev;
    memset(&dev, 0, sizeof dev);
    if (hc_probe(&dev, err) != HN_OK) dev.l2_bytes = 0; /* the rotation's size only */
    g->rot = (hc_weight *)calloc(ROT_MAX_COPIES, sizeof(hc_weight));
    if (!g->rot) st = hn_errf(err, HN_ERR_NOMEM, "cuda tune: out of host memory");
    if (!st) st = hc_weight_upload(&g->rot[0], g->type, g->k, g->n, host, err);
    if (own) free((void *)host);
    if (st) return st;
    g->n_rot = 1;
    /* copies: twice the L2 (at least ROT_MIN_BYTES), within a quarter of the free memory */
    const size_t wb = g->rot[0].gguf_bytes > 0 ? g->rot[0].gguf_bytes : 1;
    size_t want = 2 * (size_t)(dev.l2_bytes > 0 ? dev.l2_bytes : 0);
    if (want < ROT_MIN_BYTES) want = ROT_MIN_BYTES;
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) fr = 0;
    (void)cudaGetLastError();
    size_t cap = fr / 4 < ROT_MAX_BYTES ? fr / 4 : ROT_MAX_BYTES;
    if (want > cap) want = cap;
    size_t copies = (want + wb - 1) / wb;
    if (copies > ROT_MAX_COPIES) copies = ROT_MAX_COPIES;
    hn_err ce;
    while ((size_t)g->n_rot < copies && hc_weight_clone(&g->rot[g->n_rot], &g->rot[0], &ce) == HN_OK) g->n_rot++;
    (void)cudaGetLastError(); /* fewer copies when memory runs short */

    /* x: exactly representable after the activation quantization (see the top) */
    const size_t nx = (size_t)g->na * (size_t)g->k, ny = (size_t)g->na * (size_t)g->n;
    float *hx = (float *)malloc(sizeof(float) * nx);
    if (!hx) return hn_errf(err, HN_ERR_NOMEM, "cuda tune: out of host memory");
    uint64_t seed = 0x2545f4914f6cdd1dull ^ (uint64_t)(g->k * 7 + g->na);
    for (size_t i = 0; i < nx; i++) {
        int c = (int)(xorshift(&seed) % 255) - 127;
        if (i % 32 == 0) c = xorshift(&seed) & 1 ? 127 : -127;
        hx[i] = (float)c * (1.0f / 128.0f);
    }
    st = hc_malloc((void **)&g->dx, sizeof(float) * nx, err);
    if (!st) st = hc_malloc((void **)&g->dy, sizeof(float) * ny, err);
    if (!st) st = hc_upload(g->dx, hx, sizeof(float) * nx, err);
    free(hx);
    if (!st && g->type != QT_F16 && g->type != QT_BF16) st = hc_gemv_scratch_init(&g->gs, (g->k + 31) / 32 * 32, err);
    if (st) return st;
    g->ready = true;
    g->failed = false;
    return HN_OK;
}

static hn_status download(cu_case *g, float *out, hn_err *err) {
    hn_status st = cuda_err(cudaStreamSynchronize(g->stream), "tuning run", err);
    if (!st)
        st = cuda_err(cudaMemcpy(out, g->dy, sizeof(float) * (size_t)g->na * (size_t)g->n, cudaMemcpyDeviceToHost),
                      "tuning output", err);
    return st;
}

static hn_status case_reference(void *ctx, float *out, hn_err *err) {
    cu_case *g = (cu_case *)ctx;
    hn_status st = case_prepare(g, err);
    if (st) return st;
    hc_pdl = g->cb->pdl;
    st = hc_gemv_ref(&g->rot[0], g->dx, g->na, g->dy, g->stream, err);
    return st ? st : download(g, out, err);
}

static bool cfg_params(const int *cfg, hc_gemv_params *p) {
    const hct_cfg c = hct_cfg_of(cfg, 0);
    if (!hct_cfg_valid(c)) return false;
    *p = hc_gemv_params{c.rpw, 0, c.units, c.warps};
    return true;
}

static bool case_run(void *ctx, const int *cfg, float *out) {
    cu_case *g = (cu_case *)ctx;
    hc_gemv_params p;
    if (!g->ready || !cfg_params(cfg, &p)) return false;
    hc_pdl = g->cb->pdl;
    hn_err err;
    const hc_weight *w = &g->rot[g->cur];
    g->cur = (g->cur + 1) % g->n_rot;
    if (hc_gemv(w, g->dx, g->na, g->dy, &g->gs, &p, g->stream, &err) != HN_OK) {
        (void)cudaStreamSynchronize(g->stream);
        (void)cudaGetLastError();
        return false;
    }
    if (download(g, out, &err) != HN_OK) {
        (void)cudaGetLastError();
        return false;
    }
    return true;
}

static double case_time(void *ctx, const int *cfg, int reps) {
    cu_case *g = (cu_case *)ctx;
    hc_gemv_params p;
    if (!g->ready || reps < 1 || !cfg_params(cfg, &p)) return 0;
    hc_pdl = g->cb->pdl;
    hn_err err;
    /* x quantized once (and the kernel warm), then reps runs reusing it */
    bool ok = hc_gemv(&g->rot[g->cur], g->dx, g->na, g->dy, &g->gs, &p, g->stream, &err) == HN_OK;
    p.reuse_x = 1;
    ok = ok && cudaEventRecord(g->e0, g->stream) == cudaSuccess;
    for (int r = 0; r < reps && ok; r++) {
        g->cur = (g->cur + 1) % g->n_rot;
        ok = hc_gemv(&g->rot[g->cur], g->dx, g->na, g->dy, &g->gs, &p, g->stream, &err) == HN_OK;
    }
    ok = ok && cudaEventRecord(g->e1, g->stream) == cudaSuccess;
    float ms = 0;
    ok = ok && cudaEventSynchronize(g->e1) == cudaSuccess && cudaEventElapsedTime(&ms, g->e0, g->e1) == cudaSuccess;
    if (!ok) {
        (void)cudaStreamSynchronize(g->stream);
        (void)cudaGetLastError();
        return 0;
    }
    return (double)ms * 1e6 / reps;
}

static void case_reset(void *ctx) { ((cu_case *)ctx)->cur = 0; }

/* ---- the ops ---- */

static bool op_mm_tunable(be_backend *b, qt_type t) {
    (void)b;
    return (unsigned)t < QT_TYPE_COUNT && hc_gemv_supports(t);
}

static hn_status op_mm_case_new(be_backend *b, const be_mm_case *a, struct tn_case *c, hn_err *err) {
    cu_be *cb = cu_of(b);
    memset(c, 0, sizeof *c);
    const qt_type_traits *tr = qt_traits(a->type);
    if (!tr || !op_mm_tunable(b, a->type))
        return hn_errf(err, HN_ERR_UNSUPPORTED, "cuda tune: no gemv kernel for %s", qt_name(a->type));
    if (a->rows < 1 || a->rows > HC_GEMV_MAX_ROWS)
        return hn_errf(err, HN_ERR_UNSUPPORTED, "cuda tune: %d rows: only decode (1..%d rows) is tuned", a->rows,
                       HC_GEMV_MAX_ROWS);
    if (a->k <= 0 || a->n <= 0 || a->k % tr->blck_size || a->k > (1 << 28) || a->n > (1 << 28))
        return hn_errf(err, HN_ERR_INVALID, "cuda tune: bad shape %lld x %lld for %s", (long long)a->n,
                       (long long)a->k, tr->name);
    if ((!a->mats || a->n_mats < 1) && !tr->from_float)
        return hn_errf(err, HN_ERR_UNSUPPORTED, "cuda tune: cannot make synthetic %s weights", tr->name);
    cu_case *g = (cu_case *)calloc(1, sizeof *g);
    if (!g) return hn_errf(err, HN_ERR_NOMEM, "cuda tune: out of host memory");
    g->cb = cb;
    g->type = a->type;
    g->k = a->k;
    g->n = a->n;
    g->na = a->rows;
    if (a->mats && a->n_mats > 0) {
        g->src = (const void **)malloc(sizeof(void *) * (size_t)a->n_mats);
        if (!g->src) {
            case_free(g);
            return hn_errf(err, HN_ERR_NOMEM, "cuda tune: out of host memory");
        }
        memcpy(g->src, a->mats, sizeof(void *) * (size_t)a->n_mats);
        g->n_src = a->n_mats;
    }
    /* the defaults: what hc_gemv runs untuned for this shape and call size */
    hc_weight shape;
    memset(&shape, 0, sizeof shape);
    shape.type = a->type;
    shape.k = a->k;
    shape.n = a->n;
    const hc_gemv_params d = hc_gemv_resolve(&shape, a->rows, NULL);
    snprintf(g->version, sizeof g->version, "%s-%s", HCT_GEMV_VERSION, HC_SRC_DIGEST);
    c->kernel = "cuda-gemv";
    c->version = g->version;
    snprintf(c->shape, sizeof c->shape, "%s k%lld n%lld r%d", tr->name, (long long)a->k, (long long)a->n, a->rows);
    if (!hct_case_params(c, hct_cfg{d.rows_per_warp, d.units, d.warps})) {
        case_free(g);
        return hn_errf(err, HN_ERR_INTERNAL, "cuda tune: built-in parameters %d/%d/%d out of the tuned sets",
                       d.rows_per_warp, d.units, d.warps);
    }
    c->n_out = (size_t)a->rows * (size_t)a->n;
    c->tol_rel = 1e-3f;
    c->tol_abs = 1e-6f;
    c->tol_max = 1e-4f;
    c->ctx = g;
    c->reference = case_reference;
    c->run = case_run;
    c->reset = case_reset;
    c->time = case_time;
    c->weight = (double)qt_row_size(a->type, a->k) * (double)a->n;
    return HN_OK;
}

static void op_mm_case_params(be_backend *b, const struct tn_case *c, const int *cfg, be_mm_params *out) {
    (void)b;
    (void)c;
    hct_to_mm(hct_cfg_of(cfg, 0), out);
}

static void op_mm_case_free(be_backend *b, struct tn_case *c) {
    (void)b;
    case_free((cu_case *)c->ctx);
    c->ctx = NULL;
}

static hc_gemv_params gemv_params_of(const be_mm_params *p) {
    const hct_cfg c = hct_of_mm(p);
    return hc_gemv_params{c.rpw, 0, c.units, c.warps};
}

static bool op_set_mm_params(be_backend *b, qt_type t, int64_t k, int64_t n, int min_rows, const be_mm_params *p) {
    cu_be *cb = cu_of(b);
    if ((unsigned)t >= QT_TYPE_COUNT) return false;
    if (k == 0) {
        cb->mm_type[t] = p ? gemv_params_of(p) : hc_gemv_params{0, 0, 0, 0};
        if (g_drop_graphs) g_drop_graphs(cb); /* captured graphs hold the kernels chosen before */
        return true;
    }
    if (k < 1 || n < 1 || min_rows < 1) return false;
    int i = 0;
    while (i < cb->n_mm_shape && !(cb->mm_shape[i].type == t && cb->mm_shape[i].k == k && cb->mm_shape[i].n == n &&
                                   cb->mm_shape[i].min_rows == min_rows))
        i++;
    if (!p) {
        if (i < cb->n_mm_shape) cb->mm_shape[i] = cb->mm_shape[--cb->n_mm_shape];
    } else {
        if (i == cb->n_mm_shape) {
            if (i == CU_MM_SHAPES) return false;
            cb->n_mm_shape++;
        }
        cb->mm_shape[i].type = t;
        cb->mm_shape[i].k = k;
        cb->mm_shape[i].n = n;
        cb->mm_shape[i].min_rows = min_rows;
        cb->mm_shape[i].p = gemv_params_of(p);
    }
    if (g_drop_graphs) g_drop_graphs(cb);
    return true;
}

static void op_clear_mm_params(be_backend *b) {
    cu_be *cb = cu_of(b);
    cb->n_mm_shape = 0;
    if (g_drop_graphs) g_drop_graphs(cb);
}

static void op_tune_info(be_backend *b, be_tune_info *out) {
    cu_be *cb = cu_of(b);
    memset(out, 0, sizeof *out);
    hc_device d;
    hn_err err;
    memset(&d, 0, sizeof d);
    if (cudaSetDevice(cb->device) != cudaSuccess || hc_probe(&d, &err) != HN_OK) {
        (void)cudaGetLastError();
        snprintf(d.name, sizeof d.name, "unknown");
    }
    hct_fingerprint(d.name, d.cc_major, d.cc_minor, d.driver_version, HC_SRC_DIGEST, out->fingerprint,
                    sizeof out->fingerprint);
    snprintf(out->device, sizeof out->device, "%.64s (sm_%d%d, %d SMs, %.1f GiB, L2 %d MiB, driver %d, sources %.16s)",
             d.name, d.cc_major, d.cc_minor, d.sm_count, (double)d.mem_total / (double)(1ull << 30),
             d.l2_bytes >> 20, d.driver_version, HC_SRC_DIGEST);
    static const int rows[] = {1, 2, 4, 8};
    for (int i = 0; i < 4; i++) out->decode_rows[i] = rows[i];
    out->n_decode = 4;
    out->prefill = false;
}

hc_gemv_params cu_mm_params(const cu_be *cb, const be_tensor *w, int na, int reuse_x) {
    const cu_mm_shape *best = NULL;
    for (int i = 0; i < cb->n_mm_shape && w->ne[2] <= 1; i++) {
        const cu_mm_shape *e = &cb->mm_shape[i];
        if (e->type == w->type && e->k == w->ne[0] && e->n == w->ne[1] && e->min_rows <= na &&
            (!best || e->min_rows > best->min_rows))
            best = e;
    }
    hc_gemv_params p = {0, 0, 0, 0};
    if (best) p = best->p;
    else if ((unsigned)w->type < QT_TYPE_COUNT) p = cb->mm_type[w->type];
    p.reuse_x = reuse_x;
    return p;
}

void cu_tune_ops(be_ops *o, void (*drop_graphs)(cu_be *cb)) {
    g_drop_graphs = drop_graphs;
    o->set_mm_params = op_set_mm_params;
    o->clear_mm_params = op_clear_mm_params;
    o->mm_tunable = op_mm_tunable;
    o->mm_case_new = op_mm_case_new;
    o->mm_case_params = op_mm_case_params;
    o->mm_case_free = op_mm_case_free;
    o->tune_info = op_tune_info;
}
