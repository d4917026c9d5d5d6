/* test_cuda_tune: the cuda backend's tuning (backend/cuda/cuda_tune.cu) on a
 * GPU, through the backend's ops as tune/ sees them:
 *   - tune_info: a "cuda-" fingerprint, stable; decode tuned at 1, 2, 4, 8
 *     rows, no prefill family; mm_tunable exactly for the nine hc_gemv types;
 *   - a case for every type (synthetic weights, and a host matrix as the
 *     model's): the default run agrees with the reference within the stated
 *     tolerance and a poisoned output does not; every one of the 18
 *     configurations runs and gives the default's bits; the device clock
 *     answers; an invalid configuration is refused; tn_tune searches all 18,
 *     rejects none and picks a valid one, translated to be_mm_params and back;
 *     call sizes past 8 rows and other types are HN_ERR_UNSUPPORTED;
 *   - set_mm_params per shape and call size (and per type) changes no bit of
 *     a matmul at 1..16 rows, nor of matmul_multi, and clear_mm_params undoes
 *     it; bad arguments are refused;
 *   - the model driver (tn_tune_shapes) on the device within 60 s: one cache
 *     file keyed by the GPU, every entry a decode entry at its rows, a second
 *     run answered from the cache, the winners applied.
 * Skips (passing) without a CUDA build or device, after checking that the
 * cuda backend is then refused with a reason and the CPU's tune_info is the
 * tuner's default. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cuda/cuda_tune_key.h"
#include "backend/registry.h"
#include "quant/quant.h"
#include "test.h"
#include "tune/apply.h"
#include "tune/tune.h"

/* without a device: no cuda backend (a reason given), and the CPU keeps the tuner's defaults */
static void check_no_device(void) {
    hn_err err;
    be_backend *b = NULL;
    be_config cfg = {.device = 0};
    CHECK(be_create("cuda", &cfg, &b, &err) == HN_ERR_UNSUPPORTED && b == NULL && err.msg[0]);
    be_config cc = {.n_threads = 1};
    CHECK(be_create("cpu", &cc, &b, &err) == HN_OK);
    if (b) {
        be_tune_info in;
        tn_backend_info(b, &in);
        CHECK(!in.fingerprint[0] && in.n_decode == 1 && in.decode_rows[0] == 1 && in.prefill);
        be_free(b);
    }
}

#ifndef HN_HAVE_CUDA
int main(void) {
    check_no_device();
    printf("SKIP: built without CUDA\n");
    TEST_DONE();
}
#else
#include "backend/cuda/cuda.h"
#include "backend/cuda/cuda_backend.h"

static be_backend *g_b;
static char g_dir[256];

static const qt_type types[] = {QT_Q4_0, QT_Q8_0, QT_Q4_K, QT_Q5_K, QT_Q6_K, QT_IQ4_XS, QT_MXFP4, QT_F16, QT_BF16};
#define N_TYPES (sizeof types / sizeof *types)

/* a host matrix of n rows of k: random values quantized (malloc'd) */
static void *host_matrix(qt_type t, int64_t k, int64_t n) {
    float *f = malloc(sizeof(float) * (size_t)(k * n));
    void *q = malloc(qt_row_size(t, k) * (size_t)n);
    if (f && q) {
        for (int64_t i = 0; i < k * n; i++) f[i] = 0.05f * test_gauss();
        qt_traits(t)->from_float(f, q, k * n);
    }
    free(f);
    return q;
}

static void test_info(void) {
    be_tune_info in, again;
    tn_backend_info(g_b, &in);
    tn_backend_info(g_b, &again);
    printf("device: %s, fingerprint %s\n", in.device, in.fingerprint);
    CHECKF(!strncmp(in.fingerprint, "cuda-", 5) && strlen(in.fingerprint) == 21, "fingerprint %s", in.fingerprint);
    CHECK(!strcmp(in.fingerprint, again.fingerprint) && in.device[0]);
    CHECK(in.n_decode == 4 && in.decode_rows[0] == 1 && in.decode_rows[1] == 2 && in.decode_rows[2] == 4 &&
          in.decode_rows[3] == 8 && !in.prefill);
    for (size_t i = 0; i < N_TYPES; i++) CHECK(g_b->ops->mm_tunable(g_b, types[i]));
    CHECK(!g_b->ops->mm_tunable(g_b, QT_Q4_1) && !g_b->ops->mm_tunable(g_b, QT_Q2_K) &&
          !g_b->ops->mm_tunable(g_b, QT_F32));
    /* what the tuner may not ask */
    hn_err err;
    tn_case c;
    be_mm_case bad_rows = {.type = QT_Q4_K, .k = 256, .n = 64, .rows = 9};
    CHECK(g_b->ops->mm_case_new(g_b, &bad_rows, &c, &err) == HN_ERR_UNSUPPORTED);
    be_mm_case bad_type = {.type = QT_Q2_K, .k = 256, .n = 64, .rows = 1};
    CHECK(g_b->ops->mm_case_new(g_b, &bad_type, &c, &err) == HN_ERR_UNSUPPORTED);
    be_mm_case bad_k = {.type = QT_Q4_K, .k = 100, .n = 64, .rows = 1};
    CHECK(g_b->ops->mm_case_new(g_b, &bad_k, &c, &err) == HN_ERR_INVALID);
}

static void test_case(qt_type t, int64_t k, int64_t n, int rows, bool real) {
    const qt_type_traits *tr = qt_traits(t);
    hn_err err;
    void *host = real ? host_matrix(t, k, n) : NULL;
    const void *mats[1] = {host};
    be_mm_case mc = {.type = t, .k = k, .n = n, .rows = rows, .mats = real ? mats : NULL, .n_mats = real ? 1 : 0,
                     .rotate_bytes = (size_t)16 << 20};
    tn_case c;
    hn_status st = g_b->ops->mm_case_new(g_b, &mc, &c, &err);
    CHECKF(st == HN_OK, "%s case: %s", tr->name, err.msg);
    if (st) {
        free(host);
        return;
    }
    CHECK(!strcmp(c.kernel, "cuda-gemv") && !strncmp(c.version, HCT_GEMV_VERSION "-", sizeof HCT_GEMV_VERSION));
    CHECK(c.n_params == 3 && c.n_out == (size_t)rows * (size_t)n && c.time && c.run && c.reference && c.reset);
    char want_shape[96];
    snprintf(want_shape, sizeof want_shape, "%s k%lld n%lld r%d", tr->name, (long long)k, (long long)n, rows);
    CHECKF(!strcmp(c.shape, want_shape), "shape %s", c.shape);
    /* the defaults are what hc_gemv runs untuned */
    hc_weight shape = {.type = t, .k = k, .n = n};
    hc_gemv_params d = hc_gemv_resolve(&shape, rows, NULL);
    int def[3];
    for (int p = 0; p < 3; p++) def[p] = c.params[p].values[c.params[p].def];
    CHECK(def[0] == d.rows_per_warp && def[1] == d.units && def[2] == d.warps);

    float *ref = malloc(sizeof(float) * c.n_out), *out = malloc(sizeof(float) * c.n_out),
          *o0 = malloc(sizeof(float) * c.n_out);
    st = ref && out && o0 ? c.reference(c.ctx, ref, &err) : HN_ERR_NOMEM;
    CHECKF(st == HN_OK, "%s reference: %s", tr->name, err.msg);
    if (!st) {
        float mx = 0;
        for (size_t i = 0; i < c.n_out; i++) mx = fmaxf(mx, fabsf(ref[i]));
        const float tol = c.tol_abs + c.tol_max * mx;
        c.reset(c.ctx);
        CHECK(c.run(c.ctx, def, o0));
        size_t bad = 0;
        CHECKF(tn_validate(ref, o0, c.n_out, tol, c.tol_rel, &bad), "%s k=%lld n=%lld r%d: default off the reference at %zu: %g vs %g",
               tr->name, (long long)k, (long long)n, rows, bad, o0[bad], ref[bad]);
        memcpy(out, o0, sizeof(float) * c.n_out);
        out[c.n_out / 2] += 1.0f + fabsf(out[c.n_out / 2]) * 0.01f + 100.0f * tol;
        CHECK(!tn_validate(ref, out, c.n_out, tol, c.tol_rel, NULL)); /* the bound can fail */
        /* every configuration: the default's bits, and a time on the device's clock */
        int n_ok = 0;
        for (int a = 0; a < c.params[0].n; a++)
            for (int b = 0; b < c.params[1].n; b++)
                for (int e = 0; e < c.params[2].n; e++) {
                    int cfg[3] = {c.params[0].values[a], c.params[1].values[b], c.params[2].values[e]};
                    for (size_t i = 0; i < c.n_out; i++) out[i] = NAN;
                    bool ran = c.run(c.ctx, cfg, out);
                    bool same = ran && !memcmp(out, o0, sizeof(float) * c.n_out);
                    double ns = c.time(c.ctx, cfg, 5);
                    CHECKF(same && ns > 0, "%s k=%lld n=%lld r%d rpw %d units %d warps %d: ran %d, same bits %d, %.1f ns",
                           tr->name, (long long)k, (long long)n, rows, cfg[0], cfg[1], cfg[2], ran, same, ns);
                    n_ok += same && ns > 0;
                }
        CHECK(n_ok == 18);
        int bad_cfg[3] = {3, 4, 4};
        CHECK(!c.run(c.ctx, bad_cfg, out) && c.time(c.ctx, bad_cfg, 1) <= 0);
        /* the search */
        tn_tuner *tu = NULL;
        tn_opts o = {.budget_s = 20, .n_cases = 1, .margin = -1, .no_cache = true};
        tn_result res;
        st = tn_tuner_open("cuda-test000000000001", &o, &tu, &err);
        if (!st) st = tn_tune(tu, &c, &res, &err);
        CHECKF(st == HN_OK, "%s tune: %s", tr->name, err.msg);
        if (!st) {
            CHECKF(res.n_tried == 18 && res.n_rejected == 0 && res.n_skipped == 0 && !res.not_reached,
                   "%s tune: %d tried, %d rejected, %d skipped", tr->name, res.n_tried, res.n_rejected, res.n_skipped);
            const hct_cfg w = hct_cfg_of(res.cfg, 0);
            CHECK(hct_cfg_valid(w) && res.default_ns > 0 && res.tuned_ns > 0);
            CHECK(res.changed ? tn_margin_wins(res.default_ns, res.tuned_ns, TN_DEFAULT_MARGIN)
                              : res.tuned_ns == res.default_ns && !memcmp(res.cfg, def, sizeof def));
            be_mm_params mp;
            g_b->ops->mm_case_params(g_b, &c, res.cfg, &mp);
            const hct_cfg back = hct_of_mm(&mp);
            CHECK(back.rpw == w.rpw && back.units == w.units && back.warps == w.warps);
            char buf[128];
            printf("  %-24s default %7.2f us, tuned %7.2f us (%s)\n", c.shape, res.default_ns * 1e-3,
                   res.tuned_ns * 1e-3, tn_cfg_str(&c, res.cfg, buf, sizeof buf));
        }
        tn_tuner_close(tu);
    }
    free(ref);
    free(out);
    free(o0);
    g_b->ops->mm_case_free(g_b, &c);
    CHECK(c.ctx == NULL);
    free(host);
}

/* ---- through the backend's matmuls ---- */

static be_tensor *weight(qt_type t, int64_t k, int64_t n, const void *data) {
    be_weight_src src = {.name = "test", .type = t, .ne = {k, n, 1}, .data = data, .bytes = qt_row_size(t, k) * (size_t)n};
    be_tensor *w = NULL;
    hn_err e;
    hn_status st = g_b->ops->weight_load(g_b, &src, BE_W_MATMUL, &w, &e);
    CHECKF(st == HN_OK, "weight_load: %s", e.msg);
    return st ? NULL : w;
}

static be_tensor *act(int64_t ne0, int64_t ne1, const float *host) {
    be_tensor *x = NULL;
    hn_err e;
    hn_status st = g_b->ops->tensor_new(g_b, QT_F32, ne0, ne1, &x, &e);
    CHECKF(st == HN_OK, "tensor_new: %s", e.msg);
    if (!st && host) g_b->ops->upload(g_b, x, 0, host, sizeof(float) * (size_t)(ne0 * ne1));
    return st ? NULL : x;
}

/* y's first n rows of cols on the host (copied into dst) */
static bool back(const be_tensor *y, int n, int64_t cols, float *dst) {
    const void *h = NULL;
    hn_err e;
    g_b->ops->fetch(g_b, y, n, &h);
    hn_status st = g_b->ops->sync(g_b, &e);
    CHECKF(st == HN_OK, "sync: %s", e.msg);
    if (st || !h) return false;
    memcpy(dst, h, sizeof(float) * (size_t)n * (size_t)cols);
    return true;
}

#define MR 16
static void test_apply_bits(void) {
    const int64_t k = 1024, n = 300, n2 = 64;
    hn_err err;
    be_limits lim = {.max_rows = MR, .max_k = k, .max_head_dim = 64, .max_group = 1, .arena_bytes = (size_t)8 << 20};
    CHECK(g_b->ops->reserve(g_b, &lim, &err) == HN_OK);
    void *h1 = host_matrix(QT_Q4_K, k, n), *h2 = host_matrix(QT_Q4_K, k, n2);
    float *hx = malloc(sizeof(float) * MR * k), *base = malloc(sizeof(float) * MR * n * MR),
          *got = malloc(sizeof(float) * MR * n), *b2 = malloc(sizeof(float) * MR * n2), *g2 = malloc(sizeof(float) * MR * n2);
    if (!h1 || !h2 || !hx || !base || !got || !b2 || !g2) {
        CHECK(!"out of host memory");
        goto done;
    }
    for (int i = 0; i < MR * k; i++) hx[i] = test_gauss();
    be_tensor *w = weight(QT_Q4_K, k, n, h1), *w2 = weight(QT_Q4_K, k, n2, h2);
    be_tensor *x = act(k, MR, hx), *y = act(n, MR, NULL), *ya = act(n, MR, NULL), *yb = act(n2, MR, NULL);
    if (!w || !w2 || !x || !y || !ya || !yb) goto done;
    /* the built-in parameters' bits at 1..16 rows (8 at a time past 8, hc_mmq at 16) */
    for (int na = 1; na <= MR; na++) {
        g_b->ops->matmul(g_b, w, 0, x, na, y);
        if (!back(y, na, n, base + (size_t)(na - 1) * MR * n)) goto done;
    }
    be_mm_params tuned[4];
    static const hct_cfg cfgs[4] = {{1, 8, 2}, {4, 4, 8}, {2, 8, 4}, {1, 4, 2}};
    static const int from[4] = {1, 2, 4, 8};
    for (int i = 0; i < 4; i++) {
        hct_to_mm(cfgs[i], &tuned[i]);
        CHECK(g_b->ops->set_mm_params(g_b, QT_Q4_K, k, n, from[i], &tuned[i]));
    }
    CHECK(!g_b->ops->set_mm_params(g_b, QT_Q4_K, k, n, 0, &tuned[0]));
    CHECK(!g_b->ops->set_mm_params(g_b, (qt_type)QT_TYPE_COUNT, 0, 0, 1, &tuned[0]));
    be_mm_params per_type;
    hct_to_mm((hct_cfg){4, 8, 8}, &per_type);
    CHECK(g_b->ops->set_mm_params(g_b, QT_Q4_K, 0, 0, 1, &per_type)); /* w2's shape takes it */
    for (int pass = 0; pass < 2; pass++) {
        int bad = 0;
        for (int na = 1; na <= MR; na++) {
            g_b->ops->matmul(g_b, w, 0, x, na, y);
            if (!back(y, na, n, got)) goto done;
            bad += memcmp(got, base + (size_t)(na - 1) * MR * n, sizeof(float) * (size_t)na * (size_t)n) != 0;
        }
        CHECKF(bad == 0, "%s: %d row counts differ from the built-in bits", pass ? "cleared" : "tuned", bad);
        /* matmul_multi (one launch, the first weight's parameters) against the matmuls alone */
        for (int na = 1; na <= HC_GEMV_MAX_ROWS; na++) {
            const be_tensor *ws[2] = {w, w2};
            be_tensor *ys[2] = {ya, yb};
            g_b->ops->matmul_multi(g_b, 2, ws, x, na, ys);
            if (!back(ya, na, n, got) || !back(yb, na, n2, g2)) goto done;
            g_b->ops->matmul(g_b, w2, 0, x, na, yb);
            if (!back(yb, na, n2, b2)) goto done;
            CHECKF(!memcmp(got, base + (size_t)(na - 1) * MR * n, sizeof(float) * (size_t)na * (size_t)n) &&
                       !memcmp(g2, b2, sizeof(float) * (size_t)na * (size_t)n2),
                   "%s matmul_multi at %d rows differs from the matmuls alone", pass ? "cleared" : "tuned", na);
        }
        g_b->ops->clear_mm_params(g_b);
        CHECK(g_b->ops->set_mm_params(g_b, QT_Q4_K, 0, 0, 1, NULL));
    }
done:
    free(h1);
    free(h2);
    free(hx);
    free(base);
    free(got);
    free(b2);
    free(g2);
}

/* ---- the model driver ---- */

static void test_driver(void) {
    tn_shape sh[3];
    memset(sh, 0, sizeof sh);
    sh[0] = (tn_shape){.type = QT_Q4_K, .k = 1024, .n = 512, .n_total = 1};
    sh[1] = (tn_shape){.type = QT_Q8_0, .k = 1024, .n = 256, .n_total = 1};
    sh[2] = (tn_shape){.type = QT_F16, .k = 512, .n = 384, .n_total = 1, .is_output = true};
    hn_err err;
    tn_model_opts o = {.backend = g_b, .budget_s = 40};
    tn_model_report rep;
    hn_status st = tn_tune_shapes(sh, 3, &o, &rep, &err);
    CHECKF(st == HN_OK, "tn_tune_shapes: %s", err.msg);
    if (st) {
        tn_model_report_free(&rep);
        return;
    }
    CHECKF(rep.n == 12 && rep.n_tuned + rep.n_cached == 12 && rep.elapsed_s < 60, "%d entries, %d tuned, %.1f s",
           rep.n, rep.n_tuned, rep.elapsed_s);
    CHECK(!strncmp(rep.fingerprint, "cuda-", 5) && strstr(rep.cache_path, "tune-cuda-") != NULL);
    CHECK(access(rep.cache_path, R_OK) == 0);
    for (int i = 0; i < rep.n; i++) {
        const tn_model_entry *e = &rep.e[i];
        CHECK(e->family == TN_FAM_DECODE && !strcmp(e->kernel, "cuda-gemv") && e->tuned && e->min_rows == e->rows &&
              (e->rows == 1 || e->rows == 2 || e->rows == 4 || e->rows == 8));
        CHECK(!e->res.changed || hct_cfg_valid(hct_of_mm(&e->params)));
    }
    printf("driver: %d cases in %.1f s, cache %s\n", rep.n, rep.elapsed_s, rep.cache_path);
    const int set = tn_apply_report(g_b, &rep);
    CHECK(set >= 0 && set <= rep.n);
    tn_model_report_free(&rep);
    /* a second run: everything from the cache, nothing run */
    st = tn_tune_shapes(sh, 3, &o, &rep, &err);
    CHECKF(st == HN_OK && rep.n == 12 && rep.n_cached == 12 && rep.n_tuned == 0, "second run: %d cached of %d",
           rep.n_cached, rep.n);
    tn_model_report_free(&rep);
    g_b->ops->clear_mm_params(g_b);
}

int main(void) {
    const char *why = NULL;
    if (!be_available("cuda", &why)) {
        check_no_device();
        printf("SKIP: no CUDA device (%s)\n", why ? why : "?");
        TEST_DONE();
    }
    snprintf(g_dir, sizeof g_dir, "/tmp/hone-test-cuda-tune-XXXXXX");
    if (!mkdtemp(g_dir)) {
        fprintf(stderr, "cannot make a temp dir\n");
        return 1;
    }
    setenv("HONE_CACHE_DIR", g_dir, 1);
    hn_err err;
    be_config cfg = {.device = 0};
    hn_status st = be_create("cuda", &cfg, &g_b, &err);
    CHECKF(st == HN_OK, "cuda backend: %s", err.msg);
    if (st) TEST_DONE();
    test_info();
    for (size_t i = 0; i < N_TYPES; i++) {
        const qt_type t = types[i];
        const int before = test_failed_;
        const int64_t blk = qt_traits(t)->blck_size;
        const int64_t k = blk == 256 ? 2048 : blk == 32 ? 1120 : 1000; /* f16/bf16: k % 8 == 0 */
        test_case(t, k, 515, 1, false);
        test_case(t, k, 130, 8, true);
        test_case(t, blk == 256 ? 256 : 96, 37, 3, false);
        printf("%-7s %s\n", qt_traits(t)->name, test_failed_ == before ? "ok" : "FAILED");
    }
    test_apply_bits();
    test_driver();
    be_free(g_b);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    TEST_DONE();
}
#endif
