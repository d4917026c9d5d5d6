/* test_tune_apply.c: tuned parameters reaching the model's kernels.
 *   - the CPU backend's per-shape parameter table: an entry applies to its
 *     (type, k, n) only, from its min_rows on (the largest min_rows <= the
 *     call's rows wins), overrides the per-type parameters, can be removed,
 *     and the table's capacity is enforced; observed through results that
 *     differ bit for bit between the scalar reference kernel and the default;
 *   - tn_tune_model on a real model: the first run tunes every shape in both
 *     families, the second is answered from the cache (nothing run), a cache
 *     entry of another kernel version is tuned again, tn_apply_report sets
 *     exactly the entries that beat the defaults;
 *   - model load in the CLI (hone run, hone bench): tunes on the first start,
 *     answers from the cache on the second, tunes again after the kernel
 *     version in the cache changed, and does nothing with HONE_NO_TUNE=1 or
 *     --no-tune.
 * No assertion depends on speed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "backend/cpu/cpu.h"
#include "core/alloc.h"
#include "core/pool.h"
#include "gguf/gguf.h"
#include "quant/quant.h"
#include "test.h"
#include "tune/apply.h"
#include "backend/cpu/cpu_tune.h"

static char g_dir[256];

enum { K = 256, NA = 48, NB = 40, ROWS = 16 };

static uint64_t rng = 0x243f6a8885a308d3ull;
static float frand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)(rng >> 40) / (float)(1 << 24) - 0.5f;
}

static void run_mm(be_backend *b, const be_tensor *w, const float *x, int n, float *y) {
    be_tensor X = be_cpu_host(QT_F32, (void *)x), Y = be_cpu_host(QT_F32, y);
    b->ops->matmul(b, w, 0, &X, n, &Y);
}

static bool same(const float *a, const float *b, size_t n) { return !memcmp(a, b, sizeof(float) * n); }

static void test_backend_shapes(pool *p) {
    hn_err err;
    be_backend *b = NULL;
    CHECK(be_cpu_create(p, &b, &err) == HN_OK);
    if (!b) return;
    be_limits lim = {.max_rows = ROWS, .max_k = K, .max_head_dim = 64, .max_group = 1};
    CHECK(b->ops->reserve(b, &lim, &err) == HN_OK);
    const qt_type t = QT_Q4_K;
    size_t rb = qt_row_size(t, K);
    unsigned char *wa = hn_malloc(rb * NA), *wb = hn_malloc(rb * NB);
    float *row = hn_malloc(sizeof(float) * K), *x = hn_malloc(sizeof(float) * K * ROWS);
    static float def_a[ROWS * NA], ref_a[ROWS * NA], def_b[ROWS * NB], ref_b[ROWS * NB], y[ROWS * NA];
    for (int r = 0; r < NA + NB; r++) {
        for (int i = 0; i < K; i++) row[i] = frand();
        qt_traits(t)->from_float(row, r < NA ? wa + (size_t)r * rb : wb + (size_t)(r - NA) * rb, K);
    }
    for (int i = 0; i < K * ROWS; i++) x[i] = frand();
    be_tensor A = {.type = t, .ne = {K, NA, 1}, .row_bytes = rb, .mat_bytes = rb * NA, .data = wa};
    be_tensor B = {.type = t, .ne = {K, NB, 1}, .row_bytes = rb, .mat_bytes = rb * NB, .data = wb};
    be_cpu_mm_params ref = {.kernel = -1}, zero = {0};

    /* the defaults and the scalar reference kernel (per type), for 1 and ROWS rows */
    run_mm(b, &A, x, ROWS, def_a);
    run_mm(b, &B, x, ROWS, def_b);
    be_cpu_set_mm_params(b, t, &ref);
    run_mm(b, &A, x, ROWS, ref_a);
    run_mm(b, &B, x, ROWS, ref_b);
    be_cpu_set_mm_params(b, t, NULL);
    /* precondition: the two kernels round differently, else nothing below could tell them apart */
    CHECK(!same(def_a, ref_a, NA) && !same(def_a + NA * (ROWS - 1), ref_a + NA * (ROWS - 1), NA));
    CHECK(!same(def_b, ref_b, NB));

    /* an entry for A from 1 row: A takes it at every call size, B keeps the defaults */
    CHECK(be_cpu_set_mm_params_shape(b, t, K, NA, 1, &ref));
    run_mm(b, &A, x, 1, y);
    CHECK(same(y, ref_a, NA));
    run_mm(b, &A, x, ROWS, y);
    CHECK(same(y, ref_a, (size_t)ROWS * NA));
    run_mm(b, &B, x, 1, y);
    CHECK(same(y, def_b, NB));
    /* a prefill entry from 9 rows: calls of 9+ rows take it, 1..8 rows the decode entry */
    CHECK(be_cpu_set_mm_params_shape(b, t, K, NA, 9, &zero));
    run_mm(b, &A, x, ROWS, y);
    CHECK(same(y, def_a, (size_t)ROWS * NA));
    run_mm(b, &A, x, 8, y);
    CHECK(same(y, ref_a, (size_t)8 * NA));
    run_mm(b, &A, x, 9, y);
    CHECK(same(y, def_a, (size_t)9 * NA));
    /* the prefill entry replaced in place (same min_rows), then removed */
    CHECK(be_cpu_set_mm_params_shape(b, t, K, NA, 9, &ref));
    run_mm(b, &A, x, ROWS, y);
    CHECK(same(y, ref_a, (size_t)ROWS * NA));
    CHECK(be_cpu_set_mm_params_shape(b, t, K, NA, 9, NULL));
    CHECK(be_cpu_set_mm_params_shape(b, t, K, NA, 1, NULL));
    run_mm(b, &A, x, ROWS, y);
    CHECK(same(y, def_a, (size_t)ROWS * NA));
    /* a shape entry overrides the type's parameters */
    be_cpu_set_mm_params(b, t, &ref);
    CHECK(be_cpu_set_mm_params_shape(b, t, K, NA, 1, &zero));
    run_mm(b, &A, x, ROWS, y);
    CHECK(same(y, def_a, (size_t)ROWS * NA));
    run_mm(b, &B, x, ROWS, y);
    CHECK(same(y, ref_b, (size_t)ROWS * NB));
    be_cpu_set_mm_params(b, t, NULL);
    /* other parameters (threads, chunks, tile) change the speed only */
    be_cpu_mm_params odd = {.threads = 1, .chunks = 3, .tile = 8};
    CHECK(be_cpu_set_mm_params_shape(b, t, K, NA, 9, &odd));
    run_mm(b, &A, x, ROWS, y);
    CHECK(same(y, def_a, (size_t)ROWS * NA));
    /* bad arguments and a full table are refused */
    CHECK(!be_cpu_set_mm_params_shape(b, t, 0, NA, 1, &ref) && !be_cpu_set_mm_params_shape(b, t, K, NA, 0, &ref));
    be_cpu_clear_mm_params_shape(b);
    int n_ok = 0;
    for (int i = 0; i < BE_CPU_MM_SHAPES + 1; i++) n_ok += be_cpu_set_mm_params_shape(b, t, K, 1000 + i, 1, &ref);
    CHECK(n_ok == BE_CPU_MM_SHAPES);
    run_mm(b, &A, x, 1, y);
    CHECK(same(y, def_a, NA));
    be_cpu_clear_mm_params_shape(b);
    CHECK(be_cpu_set_mm_params_shape(b, t, K, NA, 1, &ref));

    be_free(b);
    hn_free(wa);
    hn_free(wb);
    hn_free(row);
    hn_free(x);
}

/* Replaces every "\t<from>\t" of the cache files in dir by "\t<to>\t"; returns the count. */
static int rewrite_version(const char *dir, const char *from, const char *to) {
    char cmd[1024], out[64];
    snprintf(cmd, sizeof cmd,
             "n=$(cat '%s'/tune-*.txt | grep -c \"\t%s\t\"); sed -i \"s/\t%s\t/\t%s\t/\" '%s'/tune-*.txt; echo $n", dir,
             from, from, to, dir);
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = 0;
    pclose(f);
    return atoi(out);
}

static void test_model_cache(void) {
    char path[512], dir[300];
    hn_err err;
    gguf_ctx *g = NULL;
    if (gguf_open(test_data_path(path, sizeof path, "data/models/qwen3-2k-q4_k_m.gguf"), &g, &err) != HN_OK) {
        CHECKF(0, "cannot open %s: %s", path, err.msg);
        return;
    }
    snprintf(dir, sizeof dir, "%s/model", g_dir);
    setenv("HONE_CACHE_DIR", dir, 1);
    /* a budget no search here comes near (a case ends when its search does), so that every
     * case is reached even under a sanitizer on a loaded machine */
    tn_model_opts o = {.n_threads = 2, .budget_s = 300};
    tn_model_report r1, r2, r3;
    CHECK(tn_tune_model(g, &o, &r1, &err) == HN_OK);
    int n_gemv = 0, n_changed = 0;
    for (int i = 0; i < r1.n; i++) {
        n_gemv += !strcmp(r1.e[i].kernel, "gemv");
        n_changed += r1.e[i].res.changed;
        CHECK(r1.e[i].tuned && !r1.e[i].res.cached && r1.e[i].res.n_rejected == 0);
        CHECK((r1.e[i].rows == 1) == !strcmp(r1.e[i].kernel, "gemv"));
        CHECK(r1.e[i].rows == 1 ? r1.e[i].min_rows == 1
                                : r1.e[i].min_rows == (r1.e[i].rows == TN_PREFILL_ROWS_A ? TN_DECODE_MAX_ROWS + 1
                                                                                         : TN_PREFILL_SWITCH));
    }
    /* 7 shapes decode (the tied output included), 6 x 2 prefill */
    CHECKF(r1.n == 19 && n_gemv == 7 && r1.n_tuned == 19 && r1.n_cached == 0, "n %d gemv %d tuned %d", r1.n, n_gemv,
           r1.n_tuned);
    CHECK(strstr(r1.cache_path, dir) == r1.cache_path && !r1.cache_corrupt);

    /* the second start: every entry from the cache, nothing run, the same choices */
    CHECK(tn_tune_model(g, &o, &r2, &err) == HN_OK);
    CHECK(r2.n == r1.n && r2.n_cached == r1.n && r2.n_tuned == 0);
    for (int i = 0; i < r2.n && i < r1.n; i++) {
        CHECK(r2.e[i].res.cached && r2.e[i].res.n_tried == 0 && !strcmp(r2.e[i].cfg, r1.e[i].cfg));
        CHECK(!memcmp(&r2.e[i].params, &r1.e[i].params, sizeof r1.e[i].params));
    }
    /* applied: exactly the entries that beat the defaults */
    pool *p = NULL;
    be_backend *b = NULL;
    CHECK(pool_create(2, &p, &err) == HN_OK && be_cpu_create(p, &b, &err) == HN_OK);
    if (b) {
        CHECK(tn_apply_report(b, &r2) == n_changed);
        be_free(b);
    }
    pool_free(p);

    /* a cached result of another kernel version does not count: those entries are tuned again */
    CHECK(rewrite_version(dir, tn_gemv_version(1), "gemv-old") == n_gemv);
    tn_model_opts oc = o;
    oc.cache_only = true;
    CHECK(tn_tune_model(g, &oc, &r3, &err) == HN_OK);
    CHECK(r3.n_missing == n_gemv && r3.n_cached == r1.n - n_gemv && r3.n_tuned == 0);
    tn_model_report_free(&r3);
    CHECK(tn_tune_model(g, &o, &r3, &err) == HN_OK);
    CHECK(r3.n_tuned == n_gemv && r3.n_cached == r1.n - n_gemv);
    for (int i = 0; i < r3.n; i++) CHECK(r3.e[i].res.cached == (r3.e[i].rows > 1));
    tn_model_report_free(&r3);
    CHECK(rewrite_version(dir, "gemv-old", "x") == 0); /* replaced, not kept beside */
    /* --force tunes everything again */
    o.force = true;
    o.families = TN_FAM_DECODE;
    CHECK(tn_tune_model(g, &o, &r3, &err) == HN_OK);
    CHECK(r3.n == n_gemv && r3.n_tuned == n_gemv && r3.n_cached == 0);
    tn_model_report_free(&r3);
    tn_model_report_free(&r1);
    tn_model_report_free(&r2);
    gguf_close(g);
    setenv("HONE_CACHE_DIR", g_dir, 1);
}

/* a cache that cannot be written: no directory (it cannot be made) or a
 * directory where no file can be created (a read-only or full disk): the
 * search still runs and its results stand (tn_tune_model says not_saved and
 * why, and returns the cache's error for `hone tune`); tn_load_tune applies
 * them and succeeds, where it used to drop them and keep the defaults */
static void test_unwritable_cache(void) {
    char path[512];
    hn_err err;
    gguf_ctx *g = NULL;
    if (gguf_open(test_data_path(path, sizeof path, "data/models/qwen3-2k-q4_k_m.gguf"), &g, &err) != HN_OK) {
        CHECKF(0, "cannot open %s: %s", path, err.msg);
        return;
    }
    static const char *dirs[2] = {"/proc/hone-cannot-exist/x", "/proc/self"};
    for (int d = 0; d < 2; d++) {
        setenv("HONE_CACHE_DIR", dirs[d], 1);
        tn_model_opts o = {.n_threads = 2, .budget_s = 300, .families = TN_FAM_DECODE};
        tn_model_report r;
        hn_status st = tn_tune_model(g, &o, &r, &err);
        int n_tuned = 0;
        for (int i = 0; i < r.n; i++) n_tuned += r.e[i].tuned && !r.e[i].res.cached;
        CHECKF(st == HN_ERR_IO && r.not_saved && r.save_msg[0] && r.n > 0 && n_tuned == r.n && r.n_tuned == r.n,
               "%s: status %d, not_saved %d, %d of %d tuned (%s)", dirs[d], (int)st, r.not_saved, n_tuned, r.n,
               r.save_msg);
        tn_model_report_free(&r);
        pool *p = NULL;
        be_backend *b = NULL;
        CHECK(pool_create(2, &p, &err) == HN_OK && be_cpu_create(p, &b, &err) == HN_OK);
        if (b) {
            const char *nt = getenv("HONE_NO_TUNE");
            char keep[16] = "";
            if (nt) snprintf(keep, sizeof keep, "%s", nt);
            setenv("HONE_NO_TUNE", "0", 1);
            setenv("HONE_TUNE_BUDGET", "300", 1);
            st = tn_load_tune(b, g, 2, "test_tune_apply", &err);
            CHECKF(st == HN_OK, "%s: tn_load_tune with an unwritable cache: %s", dirs[d], err.msg);
            unsetenv("HONE_TUNE_BUDGET");
            if (nt) setenv("HONE_NO_TUNE", keep, 1);
            else unsetenv("HONE_NO_TUNE");
            be_free(b);
        }
        pool_free(p);
    }
    gguf_close(g);
    setenv("HONE_CACHE_DIR", g_dir, 1);
}

static int run_cmd(const char *cmd, char *out, size_t cap) {
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = 0;
    return pclose(f);
}

static void test_cli_load(void) {
    const char *bin = getenv("HONE_BIN");
    if (!bin || !*bin) {
        printf("HONE_BIN not set: skipping the CLI test\n");
        return;
    }
    static char out[1 << 16];
    char cmd[2048], path[512], dir[300];
    test_data_path(path, sizeof path, "data/models/qwen3-2k-q4_k_m.gguf");
    snprintf(dir, sizeof dir, "%s/cli", g_dir);
    const char *run = "run -m '%s' --tokens '1 2 3' -n 2 --temp 0 2>&1 >/dev/null";
    char fmt[512];
    snprintf(fmt, sizeof fmt, "HONE_NO_TUNE=0 HONE_TUNE_BUDGET=300 HONE_CACHE_DIR='%%s' '%%s' %s", run);
    /* first start: tunes (one line on a non-terminal stderr) */
    snprintf(cmd, sizeof cmd, fmt, dir, bin, path);
    CHECK(run_cmd(cmd, out, sizeof out) == 0);
    CHECKF(strstr(out, "hone run: tuned 19 kernel shapes") && !strstr(out, "from the tuning cache") &&
               !strchr(out, '\r'),
           "%s", out);
    /* second start: from the cache */
    CHECK(run_cmd(cmd, out, sizeof out) == 0);
    CHECKF(strstr(out, "hone run: kernel parameters from the tuning cache (19 shapes") && !strstr(out, "tuned "),
           "%s", out);
    snprintf(cmd, sizeof cmd,
             "HONE_NO_TUNE= HONE_CACHE_DIR='%s' '%s' bench -m '%s' -p 16 -n 2 -r 1 -t 2 2>&1 >/dev/null", dir, bin,
             path);
    CHECK(run_cmd(cmd, out, sizeof out) == 0);
    CHECKF(strstr(out, "hone bench: kernel parameters from the tuning cache (19 shapes") != NULL, "%s", out);
    /* the table names the device each row ran on */
    snprintf(cmd, sizeof cmd, "HONE_NO_TUNE=1 '%s' bench -m '%s' -p 16 -n 2 -r 1 -t 2 --device cpu 2>/dev/null", bin,
             path);
    CHECK(run_cmd(cmd, out, sizeof out) == 0);
    CHECKF(strstr(out, "| device |") && strstr(out, "| cpu | 2 | pp16 |") && strstr(out, "| cpu | 2 | tg2 |"), "%s", out);
    /* a changed kernel version: its entries are tuned again */
    CHECK(rewrite_version(dir, tn_gemv_version(32), "prefill-old") == 12);
    snprintf(cmd, sizeof cmd, fmt, dir, bin, path);
    CHECK(run_cmd(cmd, out, sizeof out) == 0);
    CHECKF(strstr(out, "hone run: tuned 12 kernel shapes") && strstr(out, "(7 from the cache"), "%s", out);
    /* HONE_NO_TUNE=1 and --no-tune: no tuning and no cache */
    snprintf(cmd, sizeof cmd, "HONE_NO_TUNE=1 HONE_CACHE_DIR='%s/none' '%s' run -m '%s' --tokens '1 2 3' -n 2 2>&1", g_dir,
             bin, path);
    CHECK(run_cmd(cmd, out, sizeof out) == 0);
    CHECKF(!strstr(out, "tuning") && !strstr(out, "tuned"), "%s", out);
    snprintf(cmd, sizeof cmd,
             "HONE_NO_TUNE=0 HONE_CACHE_DIR='%s/none' '%s' run --no-tune -m '%s' --tokens '1 2 3' -n 2 2>&1; "
             "ls '%s/none' 2>/dev/null | grep -c tune-",
             g_dir, bin, path, g_dir);
    run_cmd(cmd, out, sizeof out);
    CHECKF(!strstr(out, "tuning") && !strstr(out, "tuned") && strstr(out, "\n0\n"), "%s", out);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/hone-test-apply-XXXXXX");
    if (!mkdtemp(g_dir)) return 1;
    setenv("HONE_CACHE_DIR", g_dir, 1);
    pool *p = NULL;
    hn_err err;
    CHECK(pool_create(2, &p, &err) == HN_OK);
    if (p) {
        test_backend_shapes(p);
        pool_free(p);
    }
    test_model_cache();
    test_unwritable_cache();
    test_cli_load();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    TEST_DONE();
}
