/* test_tune_gemv.c: the decode GEMV tuning family and `hone tune`.
 * Every configuration (kernel x threads x chunks) of every weight type
 * with a kernel, on synthetic and on real model weights, must validate against
 * the scalar reference; configurations that cannot run are refused; the tuner
 * picks a valid configuration and caches it; `hone tune` prints the probe and
 * the table and says that its second run came from the cache. No assertion
 * depends on speed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/dot.h"
#include "backend/cpu/gemm.h"
#include "core/alloc.h"
#include "core/pool.h"
#include "gguf/gguf.h"
#include "quant/quant.h"
#include "test.h"
#include "tune/gemv.h"
#include "tune/tune.h"

static char g_dir[256];

/* Runs every configuration of c after a reset and validates it; returns the count checked. */
static int check_all_configs(const tn_case *c, const char *what) {
    float *ref = hn_malloc(sizeof(float) * c->n_out), *out = hn_malloc(sizeof(float) * c->n_out);
    hn_err err;
    CHECK(c->reference(c->ctx, ref, &err) == HN_OK);
    float mx = 0;
    for (size_t i = 0; i < c->n_out; i++) mx = ref[i] > mx ? ref[i] : -ref[i] > mx ? -ref[i] : mx;
    int checked = 0;
    for (int a = 0; a < c->params[0].n; a++)
        for (int b = 0; b < c->params[1].n; b++)
            for (int d = 0; d < c->params[2].n; d++) {
                int cfg[3] = {c->params[0].values[a], c->params[1].values[b], c->params[2].values[d]};
                for (size_t i = 0; i < c->n_out; i++) out[i] = -12345.0f;
                c->reset(c->ctx);
                CHECK(c->run(c->ctx, cfg, out));
                size_t bad = 0;
                bool ok = tn_validate(ref, out, c->n_out, c->tol_abs + c->tol_max * mx, c->tol_rel, &bad);
                CHECKF(ok, "%s %s dot=%s threads=%d chunks=%d: row %zu %g vs %g", what, c->shape,
                       c->params[0].labels[a], cfg[1], cfg[2], bad, out[bad], ref[bad]);
                checked++;
            }
    /* after a reset the rotation starts over: the same output again */
    int def[3] = {c->params[0].values[c->params[0].def], c->params[1].values[c->params[1].def],
                  c->params[2].values[c->params[2].def]};
    c->reset(c->ctx);
    c->run(c->ctx, def, out);
    c->reset(c->ctx);
    c->run(c->ctx, def, ref);
    CHECK(!memcmp(out, ref, sizeof(float) * c->n_out));
    /* what cannot run is refused */
    int bad1[3] = {c->params[0].n, 1, 1}, bad2[3] = {0, 99, 1}, bad3[3] = {0, 1, 0};
    CHECK(!c->run(c->ctx, bad1, out) && !c->run(c->ctx, bad2, out) && !c->run(c->ctx, bad3, out));
    hn_free(ref);
    hn_free(out);
    return checked;
}

static void test_synthetic(pool *p) {
    static const qt_type types[] = {QT_F32,  QT_F16,  QT_BF16, QT_Q4_0, QT_Q4_1, QT_Q5_0,   QT_Q5_1,   QT_Q8_0,
                                    QT_Q2_K, QT_Q3_K, QT_Q4_K, QT_Q5_K, QT_Q6_K, QT_IQ4_NL, QT_IQ4_XS, QT_MXFP4};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        hn_err err;
        tn_gemv *g = NULL;
        hn_status st = tn_gemv_create(types[i], 512, 200, NULL, 0, (size_t)1 << 20, p, &g, &err);
        CHECKF(st == HN_OK, "%s: %s", qt_name(types[i]), err.msg);
        if (st != HN_OK) continue;
        tn_case c;
        tn_gemv_case(g, &c);
        const cpu_dot_kernel *v[8];
        const cpu_gemm_kernel *gv[8];
        int nv = cpu_dot_variants(types[i], v, 8) + cpu_gemm_variants(types[i], gv, 8);
        CHECK(c.params[0].n == nv && !strcmp(c.params[0].labels[0], "ref"));
        /* the default is what the backend runs untuned */
        const cpu_gemm_kernel *pick = cpu_gemm_pick(types[i], 1);
        char want[32];
        snprintf(want, sizeof want, "%s%s", pick ? "gemm-" : "", pick ? pick->isa : cpu_dot_best(types[i])->isa);
        CHECKF(!strcmp(c.params[0].labels[c.params[0].def], want), "%s: default %s, want %s", qt_name(types[i]),
               c.params[0].labels[c.params[0].def], want);
        CHECK(c.params[1].values[c.params[1].def] == pool_n_threads(p));
        CHECK(c.params[2].values[c.params[2].def] == 4);
        CHECK(tn_gemv_bytes(g) == qt_row_size(types[i], 512) * 200);
        CHECK(strstr(c.shape, qt_name(types[i])) == c.shape);
        CHECK(check_all_configs(&c, "synthetic") == nv * c.params[1].n * c.params[2].n);
        tn_gemv_free(g);
    }
    hn_err err;
    tn_gemv *g = NULL;
    CHECK(tn_gemv_create(QT_Q4_K, 100, 10, NULL, 0, 0, p, &g, &err) == HN_ERR_INVALID && !g); /* not whole blocks */
    CHECK(tn_gemv_create(QT_Q8_K, 256, 10, NULL, 0, 0, p, &g, &err) == HN_ERR_UNSUPPORTED && !g);
    CHECK(tn_gemv_create(QT_Q4_0, 0, 10, NULL, 0, 0, p, &g, &err) == HN_ERR_INVALID);
    tn_gemv_free(NULL);
}

/* Real weights: every 2-D blk matrix shape of a shared model, rotating over its layers. */
static void test_real(pool *p) {
    char path[512];
    gguf_ctx *gg = NULL;
    hn_err err;
    if (gguf_open(test_data_path(path, sizeof path, "data/models/qwen3-2k-q4_k_m.gguf"), &gg, &err) != HN_OK) {
        CHECKF(0, "cannot open %s: %s", path, err.msg);
        return;
    }
    const char *names[] = {"attn_q", "attn_k", "ffn_down", "ffn_up"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const void *mats[8];
        int n = 0;
        const gguf_tensor *t0 = NULL;
        for (int l = 0; l < 8; l++) {
            char nm[64];
            snprintf(nm, sizeof nm, "blk.%d.%s.weight", l, names[i]);
            const gguf_tensor *t = gguf_find_tensor(gg, nm);
            if (!t) break;
            if (!t0) t0 = t;
            if (t->type == t0->type && t->ne[0] == t0->ne[0] && t->ne[1] == t0->ne[1]) mats[n++] = t->data;
        }
        CHECKF(t0 != NULL, "no blk.0.%s.weight", names[i]);
        if (!t0) continue;
        tn_gemv *g = NULL;
        CHECK(tn_gemv_create(t0->type, t0->ne[0], t0->ne[1], mats, n, (size_t)1 << 20, p, &g, &err) == HN_OK);
        if (!g) continue;
        tn_case c;
        tn_gemv_case(g, &c);
        check_all_configs(&c, names[i]);

        /* the tuner: a valid pick, cached for the second call */
        tn_opts o = {.budget_s = 60, .n_cases = 1, .margin = -1};
        tn_tuner *t = NULL;
        tn_result r1, r2;
        CHECK(tn_tuner_open("feedfacefeedface", &o, &t, &err) == HN_OK);
        if (t) {
            CHECK(tn_tune(t, &c, &r1, &err) == HN_OK);
            CHECK(!r1.cached && !r1.partial && r1.n_rejected == 0 && r1.n_skipped == 0);
            CHECK(r1.n_tried == c.params[0].n * c.params[1].n * c.params[2].n);
            CHECK(r1.cfg[0] >= 0 && r1.cfg[0] < c.params[0].n);
            CHECK(tn_tune(t, &c, &r2, &err) == HN_OK);
            CHECK(r2.cached && !memcmp(r1.cfg, r2.cfg, sizeof r1.cfg));
            CHECK(tn_tuner_save(t, &err) == HN_OK);
            tn_tuner_close(t);
        }
        tn_gemv_free(g);
    }
    gguf_close(gg);
}

static int run_cmd(const char *cmd, char *out, size_t cap) {
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = 0;
    return pclose(f);
}

static void test_cli(void) {
    const char *bin = getenv("HONE_BIN");
    if (!bin || !*bin) {
        printf("HONE_BIN not set: skipping the CLI test\n");
        return;
    }
    static char out[1 << 16];
    char cmd[1024], path[512];
    test_data_path(path, sizeof path, "data/models/qwen3-2k-q4_k_m.gguf");
    snprintf(cmd, sizeof cmd, "HONE_CACHE_DIR='%s/cli' '%s' tune -m '%s' --budget 60 2>&1", g_dir, bin, path);
    CHECK(run_cmd(cmd, out, sizeof out) == 0);
    CHECKF(strstr(out, "fingerprint") && strstr(out, "bandwidth") && strstr(out, "caches"), "%s", out);
    CHECKF(strstr(out, "| kernel | shape | default us | tuned us | speedup |") != NULL, "%s", out);
    CHECK(strstr(out, "| gemv | q4_K k256 n768 ") != NULL);
    CHECK(strstr(out, "| gemv | q6_K k256 n2048 ") != NULL); /* tied output = token_embd */
    CHECKF(strstr(out, "0 of ") != NULL && strstr(out, "all cached") == NULL, "%s", out);
    CHECK(run_cmd(cmd, out, sizeof out) == 0);
    CHECKF(strstr(out, "all cached") != NULL && strstr(out, "bandwidth (GB/s, ") && strstr(out, ", cached)"), "%s", out);
    CHECK(strstr(out, "| cached |") != NULL);
    /* a corrupt cache file is reported, ignored and rewritten */
    snprintf(cmd, sizeof cmd, "for f in '%s'/cli/tune-*.txt; do printf 'junk' > \"$f\"; done", g_dir);
    CHECK(system(cmd) == 0);
    snprintf(cmd, sizeof cmd, "HONE_CACHE_DIR='%s/cli' '%s' tune -m '%s' --budget 60 2>&1", g_dir, bin, path);
    CHECK(run_cmd(cmd, out, sizeof out) == 0);
    CHECKF(strstr(out, "was corrupt") != NULL && strstr(out, "all cached") == NULL, "%s", out);
    CHECK(run_cmd(cmd, out, sizeof out) == 0);
    CHECK(strstr(out, "all cached") != NULL);
    /* usage errors */
    snprintf(cmd, sizeof cmd, "'%s' tune --budget -1 2>&1", bin);
    CHECK(WEXITSTATUS(run_cmd(cmd, out, sizeof out)) == 2);
    snprintf(cmd, sizeof cmd, "'%s' tune --bogus 2>&1", bin);
    CHECK(WEXITSTATUS(run_cmd(cmd, out, sizeof out)) == 2);
    snprintf(cmd, sizeof cmd, "HONE_CACHE_DIR='%s/cli' '%s' tune -m /nonexistent.gguf 2>&1", g_dir, bin);
    CHECK(WEXITSTATUS(run_cmd(cmd, out, sizeof out)) == 1);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/hone-test-gemv-XXXXXX");
    if (!mkdtemp(g_dir)) return 1;
    setenv("HONE_CACHE_DIR", g_dir, 1);
    pool *p = NULL;
    hn_err err;
    CHECK(pool_create(2, &p, &err) == HN_OK); /* 2 threads even on one core: the split is what is tested */
    if (p) {
        test_synthetic(p);
        test_real(p);
        pool_free(p);
    }
    test_cli();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    TEST_DONE();
}
