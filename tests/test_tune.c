/* test_tune.c: the hardware probe and the autotuner core: sane probe values,
 * the probe and tuner caches (round trip, invalidation by fingerprint and by
 * kernel version, corrupted files ignored and rewritten), validation rejecting
 * a wrong candidate that is the fastest, the margin rule, the budget cut, a
 * case timed on its own (device) clock; and the cuda backend's tuning logic
 * that needs no GPU (cuda_tune_key.h: fingerprint, parameter sets and their
 * mapping) and the tuner's reading of a backend's tune_info.
 * Timing assertions only compare configurations that differ by 10x or more in
 * work, never absolute speed. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cpu/dot.h"
#include "backend/cuda/cuda_tune_key.h"
#include "core/alloc.h"
#include "test.h"
#include "tune/apply.h"
#include "tune/probe.h"
#include "tune/tune.h"

static char g_dir[256];

static void write_text(const char *path, const char *text, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(text, 1, n, f);
    fclose(f);
}

static size_t read_text(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = 0;
    return n;
}

/* ---- a synthetic kernel family: y = A x with variants of known cost ---- */

enum { ROWS = 64, COLS = 256 };

typedef struct syn {
    float a[ROWS * COLS], x[COLS];
    int runs;       /* run() calls */
    int bias;       /* added to the reference (to make the default fail) */
} syn;

static hn_status syn_ref(void *ctx, float *out, hn_err *err) {
    (void)err;
    syn *s = ctx;
    for (int i = 0; i < ROWS; i++) {
        double acc = 0;
        for (int j = 0; j < COLS; j++) acc += (double)s->a[i * COLS + j] * s->x[j];
        out[i] = (float)acc + (float)s->bias;
    }
    return HN_OK;
}

static void syn_once(const syn *s, float *out) {
    for (int i = 0; i < ROWS; i++) {
        float acc = 0;
        for (int j = 0; j < COLS; j++) acc += s->a[i * COLS + j] * s->x[j];
        out[i] = acc;
    }
}

/* cfg[0] variant: 0 correct and slow (the work 16 times), 1 correct, 2 wrong
 * and fastest (writes ones), 3 cannot run; cfg[1] "unroll": same work for every value. */
static bool syn_run(void *ctx, const int *cfg, float *out) {
    syn *s = ctx;
    s->runs++;
    switch (cfg[0]) {
    case 0:
        for (int r = 0; r < 16; r++) {
            syn_once(s, out);
            __asm__ volatile("" : : "r"(out) : "memory");
        }
        return true;
    case 1: syn_once(s, out); return true;
    case 2:
        for (int i = 0; i < ROWS; i++) out[i] = 1.0f;
        return true;
    default: return false;
    }
}

static void syn_init(syn *s) {
    memset(s, 0, sizeof *s);
    uint32_t r = 12345;
    for (int i = 0; i < ROWS * COLS; i++) {
        r = r * 1664525u + 1013904223u;
        s->a[i] = (float)(r >> 8) / 16777216.0f - 0.5f;
    }
    for (int j = 0; j < COLS; j++) {
        r = r * 1664525u + 1013904223u;
        s->x[j] = (float)(r >> 8) / 16777216.0f - 0.5f;
    }
}

static void syn_case(tn_case *c, syn *s, const char *version, int def_variant) {
    memset(c, 0, sizeof *c);
    c->kernel = "synthetic";
    c->version = version;
    snprintf(c->shape, sizeof c->shape, "%dx%d r1", ROWS, COLS);
    c->n_params = 2;
    c->params[0] = (tn_param){.name = "variant", .n = 4, .values = {0, 1, 2, 3},
                              .labels = {"slow", "fast", "wrong", "absent"}, .def = def_variant};
    c->params[1] = (tn_param){.name = "unroll", .n = 3, .values = {1, 2, 4}, .def = 0};
    c->n_out = ROWS;
    c->tol_abs = 1e-4f;
    c->tol_rel = 1e-4f;
    c->ctx = s;
    c->reference = syn_ref;
    c->run = syn_run;
}

/* ---- tests ---- */

static void test_probe(void) {
    tn_probe p;
    tn_probe_detect(&p);
    CHECK(p.logical >= 1);
    CHECK(p.usable >= 1 && p.usable <= p.logical);
    CHECK(p.physical >= 1 && p.physical <= p.logical);
    CHECK(p.p_cores >= 0 && p.e_cores >= 0 && p.p_cores + p.e_cores <= p.logical);
    CHECK(p.mem_bytes >= ((uint64_t)64 << 20));
    CHECK(p.model[0] != 0);
    CHECKF(p.l1d == 0 || (p.l1d >= 4096 && p.l1d <= ((size_t)4 << 20)), "l1d %zu", p.l1d);
    CHECKF(p.l2 == 0 || p.l2 >= p.l1d, "l2 %zu", p.l2);
    CHECKF(p.l3 == 0 || p.l3 >= ((size_t)256 << 10), "l3 %zu", p.l3);
    CHECK(strlen(p.fingerprint) == 16 && strspn(p.fingerprint, "0123456789abcdef") == 16);
    tn_probe q;
    tn_probe_detect(&q);
    CHECK(!strcmp(p.fingerprint, q.fingerprint)); /* stable */
    const cpu_features *f = cpu_dot_features();
    CHECK(f->avx2 == !!(p.isa & HN_ISA_AVX2));
    CHECK(f->fma == !!(p.isa & HN_ISA_FMA));
    CHECK(f->avx512f == !!(p.isa & HN_ISA_AVX512F));
    CHECK(f->avx512vnni == !!(p.isa & HN_ISA_AVX512VNNI));
    CHECK(f->neon == !!(p.isa & HN_ISA_NEON));
    if (p.isa & HN_ISA_AVX2) CHECK(p.isa & HN_ISA_AVX);
    char buf[256];
    tn_probe_isa_str(p.isa, buf, sizeof buf);
    if (p.isa & HN_ISA_AVX2) CHECK(strstr(buf, "avx2") != NULL);
    CHECK(!strcmp(tn_probe_isa_str(0, buf, sizeof buf), ""));
    tn_probe_isa_str(HN_ISA_AVX2 | HN_ISA_FMA, buf, sizeof buf);
    CHECK(!strcmp(buf, "avx2 fma"));
    tn_probe_isa_str(HN_ISA_AVX2 | HN_ISA_FMA, buf, 6); /* truncation stops cleanly */
    CHECK(!strcmp(buf, "avx2"));
}

static void test_probe_cache(void) {
    tn_probe p, q;
    hn_err err;
    CHECK(tn_probe_get(&p, false, &err) == HN_OK);
    CHECK(!p.bw_cached);
    CHECK(p.bw_n >= 1 && p.bw_threads[0] == 1 && p.bw_threads[p.bw_n - 1] <= p.usable);
    for (int i = 0; i < p.bw_n; i++) {
        CHECKF(p.bw_read[i] > 0.1 && p.bw_read[i] < 1e5, "read %g GB/s", p.bw_read[i]);
        CHECKF(p.bw_copy[i] > 0.1 && p.bw_copy[i] < 1e5, "copy %g GB/s", p.bw_copy[i]);
    }
    CHECK(p.bw_buffer >= 4 * p.l3 || p.bw_buffer >= ((size_t)512 << 20) || p.bw_buffer >= p.mem_bytes / 32);
    CHECK(tn_probe_read_bw(&p, 1) == p.bw_read[0] * 1e9);
    CHECK(tn_probe_read_bw(&p, 0) == 0);
    /* second start: from the cache, same numbers */
    CHECK(tn_probe_get(&q, false, &err) == HN_OK);
    CHECK(q.bw_cached);
    CHECK(q.bw_n == p.bw_n);
    for (int i = 0; i < p.bw_n && i < q.bw_n; i++) {
        CHECK(q.bw_threads[i] == p.bw_threads[i]);
        CHECK(fabs(q.bw_read[i] - p.bw_read[i]) < 0.01);
    }
    /* corrupted probe cache: measured again, rewritten, then cached again */
    char path[512], text[4096];
    snprintf(path, sizeof path, "%s/probe-%s.txt", g_dir, p.fingerprint);
    const char *bad[] = {"garbage\n", "hone-probe 1 0000000000000000\nbuffer 1\nbw 1 5 5\n",
                         "", "hone-probe 1 %s\nbuffer 1\nbw 1 nan 5\n", "hone-probe 1 %s\nbuffer 1\nbw 2 5 5\nbw 1 5 5\n",
                         "hone-probe 1 %s\nbuffer 1\nbw 1 5 5 junk\n"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int n = snprintf(text, sizeof text, bad[i], p.fingerprint);
        write_text(path, text, (size_t)n);
        CHECK(tn_probe_get(&q, false, &err) == HN_OK);
        CHECKF(!q.bw_cached, "corrupt probe cache %zu was used", i);
        CHECK(tn_probe_get(&q, false, &err) == HN_OK);
        CHECKF(q.bw_cached, "probe cache %zu not rewritten", i);
    }
    /* force measures again */
    CHECK(tn_probe_get(&q, true, &err) == HN_OK);
    CHECK(!q.bw_cached);
}

static void test_validate_and_margin(void) {
    float r[4] = {1.0f, -2.0f, NAN, INFINITY}, o[4] = {1.0f, -2.0f, NAN, INFINITY};
    size_t bad = 99;
    CHECK(tn_validate(r, o, 4, 0, 0, &bad));
    o[1] = -2.001f;
    CHECK(!tn_validate(r, o, 4, 1e-4f, 1e-4f, &bad) && bad == 1);
    CHECK(tn_validate(r, o, 4, 1e-3f, 1e-4f, &bad));
    o[1] = -2.0f;
    o[2] = 0;
    CHECK(!tn_validate(r, o, 4, 1, 1, &bad) && bad == 2);
    o[2] = NAN;
    o[0] = NAN;
    CHECK(!tn_validate(r, o, 4, 1, 1, &bad) && bad == 0);
    o[0] = 1;
    o[3] = -INFINITY;
    CHECK(!tn_validate(r, o, 4, 1, 1, &bad) && bad == 3);

    CHECK(tn_margin_wins(100, 96, 0.03));
    CHECK(!tn_margin_wins(100, 97, 0.03));  /* exactly at the margin does not win */
    CHECK(!tn_margin_wins(100, 98, 0.03));
    CHECK(!tn_margin_wins(100, 120, 0.03));
    CHECK(tn_margin_wins(100, 99, 0));
    CHECK(!tn_margin_wins(0, 1, 0.03));
    CHECK(!tn_margin_wins(100, 0, 0.03));
    CHECK(!tn_margin_wins(NAN, 1, 0.03));
}

static void test_search(void) {
    static syn s;
    syn_init(&s);
    tn_case c;
    hn_err err;
    tn_tuner *t;
    tn_result res;
    tn_opts o = {.budget_s = 20, .n_cases = 1, .margin = -1, .no_cache = true};
    CHECK(tn_tuner_open("00000000000000aa", &o, &t, &err) == HN_OK);

    /* default slow; fast must win; the wrong variant (fastest) must be rejected */
    syn_case(&c, &s, "v1", 0);
    CHECK(tn_tune(t, &c, &res, &err) == HN_OK);
    CHECKF(res.cfg[0] == 1, "chose variant %d", res.cfg[0]);
    CHECK(res.changed && !res.cached && !res.partial);
    CHECK(res.n_rejected == 3); /* "wrong" with each unroll value */
    CHECK(res.n_skipped == 3);  /* "absent" */
    CHECK(res.n_tried == 9);
    CHECK(res.tuned_ns > 0 && res.default_ns > res.tuned_ns);
    char buf[128];
    CHECK(!strcmp(tn_cfg_str(&c, res.cfg, buf, sizeof buf), "variant=fast,unroll=1") ||
          !strcmp(buf, "variant=fast,unroll=2") || !strcmp(buf, "variant=fast,unroll=4"));

    /* default fast, margin of 90%: identical-work candidates cannot beat it */
    syn_case(&c, &s, "v1", 1);
    tn_tuner_close(t);
    o.margin = 0.9;
    CHECK(tn_tuner_open("00000000000000aa", &o, &t, &err) == HN_OK);
    CHECK(tn_tune(t, &c, &res, &err) == HN_OK);
    CHECK(res.cfg[0] == 1 && res.cfg[1] == 1 && !res.changed);
    CHECK(res.tuned_ns == res.default_ns);

    /* a default that fails validation is an error */
    s.bias = 1;
    c.version = "v-bias"; /* not the entry just recorded */
    CHECK(tn_tune(t, &c, &res, &err) == HN_ERR_INTERNAL);
    s.bias = 0;
    /* malformed cases */
    tn_case m = c;
    m.params[0].def = 7;
    CHECK(tn_tune(t, &m, &res, &err) == HN_ERR_INVALID);
    m = c;
    snprintf(m.shape, sizeof m.shape, "a\tb");
    CHECK(tn_tune(t, &m, &res, &err) == HN_ERR_INVALID);
    m = c;
    m.params[1].name = "a=b";
    CHECK(tn_tune(t, &m, &res, &err) == HN_ERR_INVALID);
    tn_tuner_close(t);

    /* a big grid goes by coordinate descent, still rejects the wrong variant */
    syn_case(&c, &s, "v1", 0);
    c.n_params = 3;
    c.params[2] = (tn_param){.name = "pad", .n = 12, .values = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, .def = 0};
    o.margin = -1;
    CHECK(tn_tuner_open("00000000000000aa", &o, &t, &err) == HN_OK);
    CHECK(tn_tune(t, &c, &res, &err) == HN_OK);
    CHECK(res.cfg[0] == 1);
    CHECK(res.n_tried < 4 * 3 * 12 && res.n_rejected >= 1);
    tn_tuner_close(t);

    /* a budget too small to finish: partial, not cached */
    o.budget_s = 1e-6;
    o.no_cache = false;
    CHECK(tn_tuner_open("00000000000000ab", &o, &t, &err) == HN_OK);
    syn_case(&c, &s, "v1", 0);
    CHECK(tn_tune(t, &c, &res, &err) == HN_OK);
    CHECK(res.partial && res.cfg[0] == 0);
    CHECK(res.not_reached && res.n_tried == 0); /* the budget was spent before the case began: nothing ran */
    int cfg[TN_MAX_PARAMS];
    CHECK(!tn_tuner_lookup(t, &c, cfg, NULL, NULL));
    tn_tuner_close(t);
}

static void test_cache(void) {
    static syn s;
    syn_init(&s);
    tn_case c;
    hn_err err;
    tn_tuner *t;
    tn_result res;
    tn_opts o = {.budget_s = 20, .n_cases = 1, .margin = -1};
    const char *fp = "0123456789abcdef";
    char path[512], text[8192];
    snprintf(path, sizeof path, "%s/tune-%s.txt", g_dir, fp);

    syn_case(&c, &s, "v1", 0);
    CHECK(tn_tuner_open(fp, &o, &t, &err) == HN_OK);
    CHECK(!tn_tuner_cache_was_corrupt(t));
    CHECK(!strcmp(tn_tuner_cache_path(t), path));
    CHECK(tn_tune(t, &c, &res, &err) == HN_OK && !res.cached && res.cfg[0] == 1);
    int want[TN_MAX_PARAMS];
    memcpy(want, res.cfg, sizeof want);
    CHECK(tn_tuner_save(t, &err) == HN_OK);
    tn_tuner_close(t);

    /* second start: a hit, nothing runs */
    CHECK(tn_tuner_open(fp, &o, &t, &err) == HN_OK);
    s.runs = 0;
    CHECK(tn_tune(t, &c, &res, &err) == HN_OK);
    CHECK(res.cached && s.runs == 0);
    CHECK(res.cfg[0] == want[0] && res.cfg[1] == want[1] && res.changed);
    CHECK(res.default_ns > 0 && res.tuned_ns > 0);
    /* force: tuned again */
    tn_tuner_close(t);
    o.force = true;
    CHECK(tn_tuner_open(fp, &o, &t, &err) == HN_OK);
    CHECK(tn_tune(t, &c, &res, &err) == HN_OK && !res.cached && s.runs > 0);
    tn_tuner_close(t);
    o.force = false;

    /* another fingerprint: a miss */
    CHECK(tn_tuner_open("fedcba9876543210", &o, &t, &err) == HN_OK);
    int cfg[TN_MAX_PARAMS];
    CHECK(!tn_tuner_lookup(t, &c, cfg, NULL, NULL));
    tn_tuner_close(t);

    /* another kernel version: a miss; retuning replaces the entry */
    CHECK(tn_tuner_open(fp, &o, &t, &err) == HN_OK);
    tn_case c2;
    syn_case(&c2, &s, "v2", 0);
    CHECK(!tn_tuner_lookup(t, &c2, cfg, NULL, NULL));
    CHECK(tn_tuner_lookup(t, &c, cfg, NULL, NULL));
    s.runs = 0;
    CHECK(tn_tune(t, &c2, &res, &err) == HN_OK && !res.cached && s.runs > 0);
    /* another shape is its own entry */
    tn_case c3;
    syn_case(&c3, &s, "v2", 0);
    snprintf(c3.shape, sizeof c3.shape, "other shape");
    CHECK(!tn_tuner_lookup(t, &c3, cfg, NULL, NULL));
    CHECK(tn_tune(t, &c3, &res, &err) == HN_OK && !res.cached);
    CHECK(tn_tuner_save(t, &err) == HN_OK);
    tn_tuner_close(t);
    CHECK(tn_tuner_open(fp, &o, &t, &err) == HN_OK);
    CHECK(tn_tuner_lookup(t, &c2, cfg, NULL, NULL));
    CHECK(tn_tuner_lookup(t, &c3, cfg, NULL, NULL));
    CHECK(!tn_tuner_lookup(t, &c, cfg, NULL, NULL));
    tn_tuner_close(t);
    size_t n = read_text(path, text, sizeof text);
    CHECK(n > 0 && strstr(text, "\tv1\t") == NULL && strstr(text, "\tv2\t") != NULL);

    /* an entry whose labels no longer exist is a miss, not a crash */
    char line[512];
    int ln = snprintf(line, sizeof line, "hone-tune %d %s\nsynthetic\tv2\t%dx%d r1\tvariant=gone,unroll=1\t10.0\t5.0\n",
                      TN_CACHE_VERSION, fp, ROWS, COLS);
    write_text(path, line, (size_t)ln);
    CHECK(tn_tuner_open(fp, &o, &t, &err) == HN_OK);
    CHECK(!tn_tuner_cache_was_corrupt(t));
    CHECK(!tn_tuner_lookup(t, &c2, cfg, NULL, NULL));
    tn_tuner_close(t);

    /* corrupted files: ignored as a whole, tuning works, save rewrites a good file */
    char good[1024];
    int gl = snprintf(good, sizeof good, "hone-tune %d %s\nsynthetic\tv2\t%dx%d r1\tvariant=fast,unroll=1\t10.0\t5.0\n",
                      TN_CACHE_VERSION, fp, ROWS, COLS);
    CHECK(gl > 0);
    write_text(path, good, (size_t)gl);
    CHECK(tn_tuner_open(fp, &o, &t, &err) == HN_OK);
    CHECK(!tn_tuner_cache_was_corrupt(t) && tn_tuner_lookup(t, &c2, cfg, NULL, NULL) && cfg[0] == 1);
    tn_tuner_close(t);
    const char *mut[] = {
        "truncate",   /* cut mid-line */
        "garbage",    /* binary noise */
        "magic",      /* wrong header */
        "fields",     /* a field missing */
        "number",     /* negative time */
        "nul",        /* an embedded NUL */
        "long",       /* a field longer than its slot */
    };
    for (size_t m = 0; m < sizeof mut / sizeof mut[0]; m++) {
        char bad[2048];
        size_t bl;
        memcpy(bad, good, (size_t)gl);
        bl = (size_t)gl;
        if (!strcmp(mut[m], "truncate")) bl -= 5;
        else if (!strcmp(mut[m], "garbage")) {
            uint32_t r = 7;
            for (size_t i = 0; i < 600; i++) bad[i] = (char)((r = r * 1103515245u + 12345u) >> 16);
            bl = 600;
        } else if (!strcmp(mut[m], "magic")) bad[2] = 'X';
        else if (!strcmp(mut[m], "fields")) bl = (size_t)snprintf(bad, sizeof bad, "hone-tune %d %s\nsynthetic\tv2\t1.0\t2.0\n", TN_CACHE_VERSION, fp);
        else if (!strcmp(mut[m], "number")) bl = (size_t)snprintf(bad, sizeof bad, "hone-tune %d %s\nsynthetic\tv2\ts\tp=1\t-1\t2\n", TN_CACHE_VERSION, fp);
        else if (!strcmp(mut[m], "nul")) bad[gl - 20] = 0;
        else {
            bl = (size_t)snprintf(bad, sizeof bad, "hone-tune %d %s\n", TN_CACHE_VERSION, fp);
            for (int i = 0; i < 300; i++) bad[bl++] = 'k';
            bl += (size_t)snprintf(bad + bl, sizeof bad - bl, "\tv2\ts\tp=1\t1\t2\n");
        }
        write_text(path, bad, bl);
        CHECK(tn_tuner_open(fp, &o, &t, &err) == HN_OK);
        CHECKF(tn_tuner_cache_was_corrupt(t), "mutation %s not detected", mut[m]);
        CHECK(!tn_tuner_lookup(t, &c2, cfg, NULL, NULL));
        CHECK(tn_tune(t, &c2, &res, &err) == HN_OK && !res.cached);
        CHECK(tn_tuner_save(t, &err) == HN_OK);
        tn_tuner_close(t);
        CHECK(tn_tuner_open(fp, &o, &t, &err) == HN_OK);
        CHECKF(!tn_tuner_cache_was_corrupt(t) && tn_tuner_lookup(t, &c2, cfg, NULL, NULL),
               "mutation %s: cache not rewritten", mut[m]);
        tn_tuner_close(t);
    }

    /* an unwritable cache directory: open fails cleanly */
    setenv("HONE_CACHE_DIR", "/proc/hone-cannot-exist/x", 1);
    CHECK(tn_tuner_open(fp, &o, &t, &err) == HN_ERR_IO);
    setenv("HONE_CACHE_DIR", g_dir, 1);
    CHECK(tn_tuner_open("bad fp", &o, &t, &err) == HN_ERR_INVALID);
    CHECK(tn_tuner_open("", &o, &t, &err) == HN_ERR_INVALID);
}

/* a device clock: variant 0 (16 times the host work) reads 10x faster than
 * variant 1; time_ok 0: the clock fails and the host's times decide */
static int g_time_calls, g_time_ok;
static double syn_time(void *ctx, const int *cfg, int reps) {
    (void)ctx;
    g_time_calls++;
    if (!g_time_ok || reps < 1) return 0;
    return cfg[0] == 0 ? 100.0 : 1000.0;
}

static void test_device_clock(void) {
    static syn s;
    syn_init(&s);
    tn_case c;
    hn_err err;
    tn_tuner *t;
    tn_result res;
    tn_opts o = {.budget_s = 20, .n_cases = 2, .margin = -1, .no_cache = true};
    CHECK(tn_tuner_open("00000000000000ab", &o, &t, &err) == HN_OK);
    syn_case(&c, &s, "v1", 1); /* the default: the host's fast variant */
    c.time = syn_time;
    g_time_ok = 1;
    g_time_calls = 0;
    CHECK(tn_tune(t, &c, &res, &err) == HN_OK);
    CHECKF(res.changed && res.cfg[0] == 0, "device clock: variant %d won", res.cfg[0]);
    CHECKF(res.tuned_ns == 100.0 && res.default_ns == 1000.0, "device clock: %.1f vs %.1f ns", res.tuned_ns,
           res.default_ns);
    CHECK(g_time_calls > 0 && res.n_rejected >= 1 && res.n_skipped >= 1);
    /* a clock that cannot measure: the host times run(), and the host's fast default stays */
    g_time_ok = 0;
    g_time_calls = 0;
    c.version = "v2"; /* not the entry just recorded */
    CHECK(tn_tune(t, &c, &res, &err) == HN_OK && !res.cached);
    CHECKF(res.cfg[0] == 1, "host clock fallback: variant %d won", res.cfg[0]); /* unroll may differ: same work */
    CHECK(g_time_calls > 0 && res.default_ns > 0 && res.default_ns != 1000.0);
    tn_tuner_close(t);
}

/* the cuda tuning logic without a GPU */
static void test_cuda_key(void) {
    char a[32], b[32];
    hct_fingerprint("NVIDIA H200", 9, 0, 13000, "0123456789abcdef", a, sizeof a);
    CHECKF(strlen(a) == 21 && !strncmp(a, "cuda-", 5), "fingerprint %s", a);
    for (const char *p = a + 5; *p; p++) CHECK((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'));
    hct_fingerprint("NVIDIA H200", 9, 0, 13000, "0123456789abcdef", b, sizeof b);
    CHECK(!strcmp(a, b)); /* a pure function of its inputs */
    hct_fingerprint("NVIDIA H100", 9, 0, 13000, "0123456789abcdef", b, sizeof b);
    CHECK(strcmp(a, b) != 0);
    hct_fingerprint("NVIDIA H200", 10, 0, 13000, "0123456789abcdef", b, sizeof b);
    CHECK(strcmp(a, b) != 0);
    hct_fingerprint("NVIDIA H200", 9, 1, 13000, "0123456789abcdef", b, sizeof b);
    CHECK(strcmp(a, b) != 0);
    hct_fingerprint("NVIDIA H200", 9, 0, 13010, "0123456789abcdef", b, sizeof b);
    CHECK(strcmp(a, b) != 0);
    hct_fingerprint("NVIDIA H200", 9, 0, 13000, "0123456789abcdee", b, sizeof b);
    CHECK(strcmp(a, b) != 0);
    hct_fingerprint(NULL, 0, 0, 0, NULL, b, sizeof b);
    CHECK(strlen(b) == 21);
    /* the tuner takes it as a fingerprint */
    tn_tuner *t = NULL;
    hn_err err;
    tn_opts o = {.no_cache = true};
    CHECK(tn_tuner_open(a, &o, &t, &err) == HN_OK);
    tn_tuner_close(t);

    /* the parameters: 3 x 2 x 3 values, the defaults where asked, every configuration valid and mapped both ways */
    tn_case c;
    memset(&c, 0, sizeof c);
    CHECK(!hct_case_params(&c, (hct_cfg){3, 4, 4}) && c.n_params == 0);
    CHECK(!hct_case_params(&c, (hct_cfg){2, 0, 4}) && c.n_params == 0);
    CHECK(hct_case_params(&c, (hct_cfg){2, 4, 4}) && c.n_params == 3);
    CHECK(!strcmp(c.params[0].name, "rpw") && !strcmp(c.params[1].name, "units") && !strcmp(c.params[2].name, "warps"));
    CHECK(c.params[0].n == 3 && c.params[1].n == 2 && c.params[2].n == 3);
    CHECK(c.params[0].values[c.params[0].def] == 2 && c.params[1].values[c.params[1].def] == 4 &&
          c.params[2].values[c.params[2].def] == 4);
    memset(&c, 0, sizeof c);
    CHECK(hct_case_params(&c, (hct_cfg){4, 8, 2}) && c.params[0].values[c.params[0].def] == 4 &&
          c.params[1].values[c.params[1].def] == 8 && c.params[2].values[c.params[2].def] == 2);
    c.n_params = TN_MAX_PARAMS - 2;
    CHECK(!hct_case_params(&c, (hct_cfg){4, 8, 2})); /* no room */
    memset(&c, 0, sizeof c);
    CHECK(hct_case_params(&c, (hct_cfg){1, 4, 4}));
    int n_cfg = 0, seen_default = 0;
    for (int i = 0; i < c.params[0].n; i++)
        for (int j = 0; j < c.params[1].n; j++)
            for (int k = 0; k < c.params[2].n; k++) {
                int cfg[3] = {c.params[0].values[i], c.params[1].values[j], c.params[2].values[k]};
                hct_cfg h = hct_cfg_of(cfg, 0);
                CHECK(hct_cfg_valid(h));
                be_mm_params mp;
                hct_to_mm(h, &mp);
                CHECK(mp.kernel == 0 && mp.pack == 0 && mp.tile == h.rpw && mp.chunks == h.units &&
                      mp.threads == h.warps);
                hct_cfg back = hct_of_mm(&mp);
                CHECK(back.rpw == h.rpw && back.units == h.units && back.warps == h.warps);
                seen_default += i == c.params[0].def && j == c.params[1].def && k == c.params[2].def;
                n_cfg++;
            }
    CHECK(n_cfg == 18 && n_cfg <= TN_EXHAUSTIVE && seen_default == 1);
    /* all-zero parameters (an untuned entry) and values out of the sets read as the built-in choice */
    be_mm_params z = {0};
    hct_cfg hz = hct_of_mm(&z);
    CHECK(hz.rpw == 0 && hz.units == 0 && hz.warps == 0 && !hct_cfg_valid(hz));
    be_mm_params odd = {.tile = 3, .chunks = 16, .threads = 4};
    hct_cfg ho = hct_of_mm(&odd);
    CHECK(ho.rpw == 0 && ho.units == 0 && ho.warps == 4);
    hz = hct_of_mm(NULL);
    CHECK(hz.rpw == 0 && hz.units == 0 && hz.warps == 0);
}

/* tn_backend_info: a backend without tune_info (or an older table) gets the
 * CPU's answer; a malformed answer is mended */
static int g_info_mode;
static void fake_info(be_backend *b, be_tune_info *out) {
    (void)b;
    memset(out, 0, sizeof *out);
    snprintf(out->fingerprint, sizeof out->fingerprint, "dev-0001");
    int rows_ok[] = {1, 2, 4, 8}, rows_bad[] = {2, 4};
    const int *r = g_info_mode == 0 ? rows_ok : rows_bad;
    out->n_decode = g_info_mode == 0 ? 4 : 2;
    for (int i = 0; i < out->n_decode; i++) out->decode_rows[i] = r[i];
}

static void test_backend_info(void) {
    be_ops ops;
    memset(&ops, 0, sizeof ops);
    ops.version = BE_OPS_VERSION;
    be_backend b = {.ops = &ops};
    be_tune_info in;
    tn_backend_info(&b, &in);
    CHECK(!in.fingerprint[0] && in.n_decode == 1 && in.decode_rows[0] == 1 && in.prefill);
    ops.tune_info = fake_info;
    g_info_mode = 0;
    tn_backend_info(&b, &in);
    CHECK(!strcmp(in.fingerprint, "dev-0001") && in.n_decode == 4 && in.decode_rows[3] == 8 && !in.prefill);
    g_info_mode = 1; /* not starting at 1 row: the CPU's rows */
    tn_backend_info(&b, &in);
    CHECK(in.n_decode == 1 && in.decode_rows[0] == 1 && !strcmp(in.fingerprint, "dev-0001"));
    ops.version = 8; /* an older table: the op is not there */
    tn_backend_info(&b, &in);
    CHECK(!in.fingerprint[0] && in.n_decode == 1 && in.prefill);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/hone-test-tune-XXXXXX");
    if (!mkdtemp(g_dir)) {
        fprintf(stderr, "cannot make a temp dir\n");
        return 1;
    }
    setenv("HONE_CACHE_DIR", g_dir, 1);
    test_probe();
    test_validate_and_margin();
    test_search();
    test_device_clock();
    test_cuda_key();
    test_backend_info();
    test_cache();
    test_probe_cache();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    TEST_DONE();
}
