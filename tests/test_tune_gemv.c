/* test_tune_gemv.c: the decode (gemv) and prefill tuning families and
 * `hone tune`. Every configuration (kernel x threads x chunks, x tile for
 * prefill) of every weight type with a kernel, on synthetic and on real model
 * weights, must validate against the scalar reference; configurations that
 * cannot run are refused; the tuner picks a valid configuration and caches it;
 * `hone tune` prints the probe and both tables and says that its second run
 * came from the cache. No assertion depends on speed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/dot.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/pack.h"
#include "core/alloc.h"
#include "core/pool.h"
#include "gguf/gguf.h"
#include "quant/quant.h"
#include "test.h"
#include "backend/cpu/cpu_tune.h"
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
    int idx[TN_MAX_PARAMS] = {0};
    for (;;) {
        int cfg[TN_MAX_PARAMS];
        for (int p = 0; p < c->n_params; p++) cfg[p] = c->params[p].values[idx[p]];
        for (size_t i = 0; i < c->n_out; i++) out[i] = -12345.0f;
        c->reset(c->ctx);
        CHECK(c->run(c->ctx, cfg, out));
        size_t bad = 0;
        bool ok = tn_validate(ref, out, c->n_out, c->tol_abs + c->tol_max * mx, c->tol_rel, &bad);
        char cs[256];
        CHECKF(ok, "%s %s %s: output %zu %g vs %g", what, c->shape, tn_cfg_str(c, cfg, cs, sizeof cs), bad, out[bad],
               ref[bad]);
        checked++;
        int p = 0;
        while (p < c->n_params && ++idx[p] == c->params[p].n) idx[p++] = 0;
        if (p == c->n_params) break;
    }
    /* after a reset the rotation starts over: the same output again */
    int def[TN_MAX_PARAMS];
    for (int p = 0; p < c->n_params; p++) def[p] = c->params[p].values[c->params[p].def];
    c->reset(c->ctx);
    c->run(c->ctx, def, out);
    c->reset(c->ctx);
    c->run(c->ctx, def, ref);
    CHECK(!memcmp(out, ref, sizeof(float) * c->n_out));
    /* what cannot run is refused */
    int bad1[TN_MAX_PARAMS], bad2[TN_MAX_PARAMS], bad3[TN_MAX_PARAMS];
    memcpy(bad1, def, sizeof def);
    memcpy(bad2, def, sizeof def);
    memcpy(bad3, def, sizeof def);
    bad1[0] = c->params[0].n;
    bad2[1] = 99;
    bad3[2] = 0;
    CHECK(!c->run(c->ctx, bad1, out) && !c->run(c->ctx, bad2, out) && !c->run(c->ctx, bad3, out));
    hn_free(ref);
    hn_free(out);
    return checked;
}

/* The kernel candidates a case should offer for t at k (n rows): non-reference variants
 * reading the dot registry's activations (gemm ones only when they fit k), the packed
 * variants of the layout the model would pack into (its reference excluded), plus the default. */
static int expected_kernels(qt_type t, int64_t k, int64_t n, int rows, char *def, size_t cap) {
    const cpu_dot_kernel *v[8];
    const cpu_gemm_kernel *gv[8];
    const cpu_pack_kernel *pv[8];
    int nd = cpu_dot_variants(t, v, 8), ng = cpu_gemm_variants(t, gv, 8), npv = cpu_pack_variants(t, pv, 8), c = 0;
    const cpu_dot_kernel *best = cpu_dot_best(t);
    const cpu_gemm_kernel *pick = cpu_gemm_pick_k(t, rows, k);
    if (pick && pick->act_type != best->act_type) pick = NULL;
    const cpu_pack_kernel *pb = cpu_pack_best(t, k);
    if (pb && (n < pb->rows || pb->act_type != best->act_type)) pb = NULL;
    if (pb) snprintf(def, cap, "pack-%s", pb->name);
    else snprintf(def, cap, "%s%s", pick ? "gemm-" : "", pick ? pick->isa : best->isa);
    for (int i = 0; i < nd; i++)
        c += (strcmp(v[i]->isa, "ref") && v[i]->act_type == best->act_type) || (!pb && !pick && v[i] == best);
    for (int i = 0; i < ng; i++)
        c += gv[i]->act_type == best->act_type && cpu_gemm_fits(gv[i], k) &&
             (strcmp(gv[i]->isa, "ref") || (!pb && gv[i] == pick));
    for (int i = 0; pb && i < npv; i++)
        c += pv[i]->layout == pb->layout && cpu_pack_fits(pv[i], k) && pv[i]->act_type == best->act_type &&
             (pv[i] != cpu_pack_ref(t, pb->layout) || pv[i] == pb);
    return c;
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
        /* the default is what the backend runs untuned; no scalar reference unless it is the default */
        char want[32];
        int nv = expected_kernels(types[i], 512, 200, 1, want, sizeof want);
        CHECKF(c.params[0].n == nv, "%s: %d kernels, want %d", qt_name(types[i]), c.params[0].n, nv);
        CHECKF(!strcmp(c.params[0].labels[c.params[0].def], want), "%s: default %s, want %s", qt_name(types[i]),
               c.params[0].labels[c.params[0].def], want);
        for (int j = 0; j < c.params[0].n; j++)
            CHECK(j == c.params[0].def || !strstr(c.params[0].labels[j], "ref"));
        CHECK(c.params[1].values[c.params[1].def] == pool_n_threads(p));
        CHECK(c.params[2].values[c.params[2].def] == 4);
        CHECK(c.n_params == 3 && !strcmp(c.kernel, "gemv") && !strcmp(c.version, tn_gemv_version(1)));
        CHECK(tn_gemv_bytes(g) == qt_row_size(types[i], 512) * 200);
        CHECK(strstr(c.shape, qt_name(types[i])) == c.shape);
        CHECK(check_all_configs(&c, "synthetic") == nv * c.params[1].n * c.params[2].n);
        /* the backend parameters of a configuration */
        int cfg[3] = {c.params[0].def, 1, 8};
        be_cpu_mm_params mp;
        tn_gemv_params(g, cfg, &mp);
        CHECK(mp.threads == 1 && mp.chunks == 8 && mp.tile == 0 && (mp.kernel != 0) != (mp.pack > 0));
        /* a packed default: its label names the layout's kernel, and the unpacked choices say pack -1 */
        if (strstr(want, "pack-") == want) {
            CHECK(mp.pack > 0);
            int n_packed = 0;
            for (int j = 0; j < c.params[0].n; j++) {
                cfg[0] = j;
                tn_gemv_params(g, cfg, &mp);
                n_packed += strstr(c.params[0].labels[j], "pack-") != NULL;
                CHECK((strstr(c.params[0].labels[j], "pack-") != NULL) == (mp.pack > 0) && (mp.pack > 0 || mp.pack == -1));
            }
            CHECKF(n_packed >= 2, "%s: %d packed choices", qt_name(types[i]), n_packed);
        }
        tn_gemv_free(g);

        /* prefill: 19 rows (a partial tile of 8), every configuration, tile included */
        st = tn_prefill_create(types[i], 512, 72, 19, NULL, 0, (size_t)1 << 18, p, &g, &err);
        CHECKF(st == HN_OK, "%s prefill: %s", qt_name(types[i]), err.msg);
        if (st != HN_OK) continue;
        tn_gemv_case(g, &c);
        nv = expected_kernels(types[i], 512, 72, 19, want, sizeof want);
        CHECKF(c.params[0].n == nv && !strcmp(c.params[0].labels[c.params[0].def], want), "%s prefill: default %s, want %s",
               qt_name(types[i]), c.params[0].labels[c.params[0].def], want);
        CHECK(c.n_params == 4 && !strcmp(c.kernel, "prefill") && !strcmp(c.version, tn_gemv_version(32)) && strncmp(c.version, TN_PREFILL_VERSION "-k", sizeof TN_PREFILL_VERSION + 1) == 0);
        CHECK(!strcmp(c.params[3].name, "tile") && c.params[3].values[c.params[3].def] == 0);
        CHECK(strstr(c.shape, " r19 ") != NULL && c.n_out == 19 * 72);
        CHECK(tn_gemv_macs(g) == 19.0 * 512 * 72);
        CHECK(check_all_configs(&c, "prefill") == nv * c.params[1].n * c.params[2].n * c.params[3].n);
        int pcfg[4] = {c.params[0].def, 2, 4, 32};
        tn_gemv_params(g, pcfg, &mp);
        CHECK(mp.threads == 2 && mp.chunks == 4 && mp.tile == 32);
        tn_gemv_free(g);
    }
    hn_err err;
    tn_gemv *g = NULL;
    CHECK(tn_gemv_create(QT_Q4_K, 100, 10, NULL, 0, 0, p, &g, &err) == HN_ERR_INVALID && !g); /* not whole blocks */
    CHECK(tn_gemv_create(QT_Q8_K, 256, 10, NULL, 0, 0, p, &g, &err) == HN_ERR_UNSUPPORTED && !g);
    CHECK(tn_gemv_create(QT_Q4_0, 0, 10, NULL, 0, 0, p, &g, &err) == HN_ERR_INVALID);
    CHECK(tn_prefill_create(QT_Q4_0, 64, 10, 1, NULL, 0, 0, p, &g, &err) == HN_ERR_INVALID && !g);
    /* a busy machine: the thread count is not a parameter (the pool's size only) */
    CHECK(tn_gemv_create(QT_Q4_K, 256, 64, NULL, 0, 0, p, &g, &err) == HN_OK);
    if (g) {
        tn_case c;
        tn_gemv_all_threads(g);
        tn_gemv_case(g, &c);
        CHECK(c.params[1].n == 1 && c.params[1].values[0] == pool_n_threads(p) && c.params[1].def == 0);
        tn_gemv_free(g);
    }
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
        /* prefill over the real matrices: 40 rows (tiles of 8, 16, 32 with a partial one) */
        g = NULL;
        CHECK(tn_prefill_create(t0->type, t0->ne[0], t0->ne[1], 40, mats, n, (size_t)1 << 20, p, &g, &err) == HN_OK);
        if (!g) continue;
        tn_gemv_case(g, &c);
        CHECK(check_all_configs(&c, names[i]) == c.params[0].n * c.params[1].n * c.params[2].n * c.params[3].n);
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
    CHECKF(strstr(out, "\nprefill (") && strstr(out, "| kernel | shape | default us | tuned us | speedup | GMAC/s |"), "%s",
           out);
    CHECK(strstr(out, "| prefill | q4_K k256 n768 r32 ") != NULL && strstr(out, "| prefill | q4_K k256 n768 r128 ") != NULL);
    CHECK(strstr(out, "| prefill | q6_K k256 n2048 ") == NULL); /* the logits matrix has no prefill case */
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
