/* cmd_tune.c: `hone tune [-m FILE] [-t N] [--budget SECONDS] [--force]`:
 * probes the machine (cores, caches, ISA, measured bandwidth), then tunes the
 * decode GEMV of every distinct weight shape of the model (or of a built-in
 * set of Qwen3-0.6B shapes without -m) and prints, per kernel and shape, the
 * default time, the tuned time, the speedup and the chosen parameters.
 * Results are cached per device; a second run reuses them and says so. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../backend/cpu/dot.h"
#include "../core/alloc.h"
#include "../core/pool.h"
#include "../gguf/gguf.h"
#include "../quant/quant.h"
#include "../tune/gemv.h"
#include "../tune/probe.h"
#include "../tune/tune.h"
#include "cli.h"

#define MAX_SHAPES 64
#define MAX_MATS 64 /* copies of one shape taken from the file (layers) */

typedef struct shape {
    qt_type type;
    int64_t k, n;
    const void *mats[MAX_MATS];
    int n_mats, n_total; /* n_total: tensors of this shape in the model */
} shape;

static void usage(FILE *f) {
    fprintf(f,
            "usage: hone tune [-m FILE] [-t N] [--budget SECONDS] [--force]\n\n"
            "Probes this machine (cores, caches, instruction sets, memory bandwidth) and\n"
            "tunes the decode matrix-vector kernels for every weight shape of FILE (without\n"
            "-m: the Qwen3-0.6B shapes in q4_0, q8_0, q4_K and q6_K). Every candidate is\n"
            "validated against the scalar reference before it is timed; a winner must beat\n"
            "the default by 3%%. Results are cached per device (HONE_CACHE_DIR, else\n"
            "$XDG_CACHE_HOME/hone or ~/.cache/hone); a second run reuses them.\n\n"
            "  -m FILE           GGUF model whose weight shapes to tune\n"
            "  -t N              threads (default: every CPU this process may use)\n"
            "  --budget SECONDS  total tuning time (default 30)\n"
            "  --force           measure and tune again, replacing cached results\n");
}

static void print_size(size_t b) {
    if (!b) printf("?");
    else if (b >= ((size_t)1 << 20) && b % ((size_t)1 << 20) == 0) printf("%zu MiB", b >> 20);
    else printf("%zu KiB", b >> 10);
}

static void print_probe(const tn_probe *p) {
    char isa[512];
    printf("device   %s (%s), fingerprint %s\n", p->model, p->arch, p->fingerprint);
    printf("cores    %d logical, %d physical, %d usable", p->logical, p->physical, p->usable);
    if (p->p_cores || p->e_cores) printf(", %d performance + %d efficiency", p->p_cores, p->e_cores);
    if (p->max_mhz) printf(", max %d MHz", p->max_mhz);
    printf("\ncaches   L1d ");
    print_size(p->l1d);
    printf(", L2 ");
    print_size(p->l2);
    printf(", L3 ");
    print_size(p->l3);
    printf("\nmemory   %.1f GiB\n", (double)p->mem_bytes / (double)(1ull << 30));
    printf("isa      %s\n", tn_probe_isa_str(p->isa, isa, sizeof isa));
    printf("bandwidth (GB/s, %zu MiB buffers%s)\n", p->bw_buffer >> 20, p->bw_cached ? ", cached" : "");
    printf("  threads   read    copy\n");
    for (int i = 0; i < p->bw_n; i++) printf("  %7d %7.1f %7.1f\n", p->bw_threads[i], p->bw_read[i], p->bw_copy[i]);
}

static shape *find_shape(shape *s, int *n, qt_type t, int64_t k, int64_t rows) {
    for (int i = 0; i < *n; i++)
        if (s[i].type == t && s[i].k == k && s[i].n == rows) return &s[i];
    if (*n == MAX_SHAPES) return NULL;
    shape *x = &s[(*n)++];
    memset(x, 0, sizeof *x);
    x->type = t;
    x->k = k;
    x->n = rows;
    return x;
}

/* The distinct (type, k, n) of the model's 2-D matmul weights that have a dot kernel. */
static int model_shapes(const gguf_ctx *g, shape *out) {
    int n = 0;
    bool has_output = gguf_find_tensor(g, "output.weight") != NULL;
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        size_t len = strlen(t->name);
        if (t->n_dims != 2 || len < 7 || strcmp(t->name + len - 7, ".weight")) continue;
        bool matmul = !strncmp(t->name, "blk.", 4) || !strcmp(t->name, "output.weight") ||
                      (!has_output && !strcmp(t->name, "token_embd.weight"));
        if (!matmul || strstr(t->name, "norm") || !cpu_dot_best(t->type)) continue;
        shape *s = find_shape(out, &n, t->type, t->ne[0], t->ne[1]);
        if (!s) break;
        if (s->n_mats < MAX_MATS) s->mats[s->n_mats++] = t->data;
        s->n_total++;
    }
    return n;
}

/* Qwen3-0.6B: hidden 1024, 16 query heads and 8 KV heads of 128, FFN 3072. */
static int builtin_shapes(shape *out) {
    static const qt_type types[] = {QT_Q4_0, QT_Q8_0, QT_Q4_K, QT_Q6_K};
    static const int64_t kn[][2] = {{1024, 2048}, {1024, 1024}, {2048, 1024}, {1024, 3072}, {3072, 1024}};
    int n = 0;
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
        for (size_t i = 0; i < sizeof kn / sizeof kn[0]; i++) {
            shape *s = &out[n++];
            memset(s, 0, sizeof *s);
            s->type = types[t];
            s->k = kn[i][0];
            s->n = kn[i][1];
        }
    return n;
}

int cmd_tune(int argc, char **argv) {
    const char *model = NULL;
    double budget = 30;
    int threads = 0;
    bool force = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-m") && i + 1 < argc) {
            model = argv[++i];
        } else if (!strcmp(a, "-t") && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 1 || v > 1024) {
                fprintf(stderr, "hone tune: bad thread count '%s'\n", argv[i]);
                return 2;
            }
            threads = (int)v;
        } else if (!strcmp(a, "--budget") && i + 1 < argc) {
            char *end;
            budget = strtod(argv[++i], &end);
            if (*end || !(budget > 0) || budget > 86400) {
                fprintf(stderr, "hone tune: bad budget '%s'\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(a, "--force")) {
            force = true;
        } else {
            fprintf(stderr, "hone tune: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }

    hn_err err;
    hn_err_clear(&err);
    tn_probe probe;
    if (tn_probe_get(&probe, force, &err) != HN_OK) {
        fprintf(stderr, "hone tune: %s\n", err.msg);
        return 1;
    }
    print_probe(&probe);
    if (threads == 0) threads = probe.usable;

    gguf_ctx *g = NULL;
    static shape shapes[MAX_SHAPES];
    int n_shapes;
    if (model) {
        if (gguf_open(model, &g, &err) != HN_OK) {
            fprintf(stderr, "hone tune: %s\n", err.msg);
            return 1;
        }
        n_shapes = model_shapes(g, shapes);
        if (n_shapes == 0) {
            fprintf(stderr, "hone tune: %s has no matmul weights with a CPU kernel\n", model);
            gguf_close(g);
            return 1;
        }
    } else {
        n_shapes = builtin_shapes(shapes);
    }

    pool *pl = NULL;
    tn_tuner *tuner = NULL;
    int rc = 0;
    if (pool_create(threads, &pl, &err) != HN_OK) {
        fprintf(stderr, "hone tune: %s\n", err.msg);
        gguf_close(g);
        return 1;
    }
    /* the budget is shared by weight bytes (what a case's runs cost) */
    double total_w = 0;
    for (int i = 0; i < n_shapes; i++) total_w += (double)qt_row_size(shapes[i].type, shapes[i].k) * (double)shapes[i].n;
    tn_opts o = {.budget_s = budget, .n_cases = n_shapes, .total_weight = total_w, .margin = -1, .force = force,
                 .progress = isatty(2) != 0};
    if (tn_tuner_open(probe.fingerprint, &o, &tuner, &err) != HN_OK) {
        fprintf(stderr, "hone tune: %s\n", err.msg);
        pool_free(pl);
        gguf_close(g);
        return 1;
    }
    if (tn_tuner_cache_was_corrupt(tuner))
        fprintf(stderr, "hone tune: the cache file %s was corrupt; it is ignored and will be rewritten\n",
                tn_tuner_cache_path(tuner));

    /* weights stream from memory: rotate over at least twice the last level cache */
    size_t llc = probe.l3 ? probe.l3 : probe.l2 ? probe.l2 : ((size_t)8 << 20);
    size_t rotate = 2 * llc < ((size_t)16 << 20) ? ((size_t)16 << 20) : 2 * llc;
    if (rotate > ((size_t)256 << 20)) rotate = (size_t)256 << 20;
    double bw = tn_probe_read_bw(&probe, threads);

    printf("\ntuning %d shape%s of %s with %d thread%s (budget %.0f s)\n\n", n_shapes, n_shapes == 1 ? "" : "s",
           model ? model : "the built-in Qwen3-0.6B set", threads, threads == 1 ? "" : "s", budget);
    char line[4096];
    int n_cached = 0, n_done = 0, n_partial = 0;
    size_t at = 0;
    static char table[64 * 1024];
    at += (size_t)snprintf(table + at, sizeof table - at,
                           "| kernel | shape | default us | tuned us | speedup | GB/s | %% of read bw | params | note |\n"
                           "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- |\n");
    for (int i = 0; i < n_shapes && rc == 0; i++) {
        shape *s = &shapes[i];
        tn_gemv *gv = NULL;
        if (tn_gemv_create(s->type, s->k, s->n, s->n_mats ? s->mats : NULL, s->n_mats, rotate, pl, &gv, &err) !=
            HN_OK) {
            fprintf(stderr, "\nhone tune: %s\n", err.msg);
            rc = 1;
            break;
        }
        tn_case c;
        tn_gemv_case(gv, &c);
        tn_result res;
        if (tn_tune(tuner, &c, &res, &err) != HN_OK) {
            fprintf(stderr, "\nhone tune: %s\n", err.msg);
            tn_gemv_free(gv);
            rc = 1;
            break;
        }
        char params[256], note[96];
        tn_cfg_str(&c, res.cfg, params, sizeof params);
        double gbs = res.tuned_ns > 0 ? (double)tn_gemv_bytes(gv) / res.tuned_ns : 0;
        snprintf(note, sizeof note, "%s%s", res.cached ? "cached" : res.changed ? "tuned" : "default kept",
                 res.partial ? ", budget cut (not cached)" : "");
        if (!res.cached && res.n_rejected) {
            size_t nl = strlen(note);
            snprintf(note + nl, sizeof note - nl, ", %d rejected", res.n_rejected);
        }
        snprintf(line, sizeof line, "| %s | %s | %.1f | %.1f | %.2fx | %.1f | %.0f%% | %s | %s |\n", c.kernel,
                 c.shape, res.default_ns * 1e-3, res.tuned_ns * 1e-3,
                 res.tuned_ns > 0 ? res.default_ns / res.tuned_ns : 0.0, gbs,
                 bw > 0 ? 100.0 * gbs * 1e9 / bw : 0.0, params, note);
        at += (size_t)snprintf(table + at, sizeof table - at, "%s", line);
        if (at >= sizeof table) at = sizeof table - 1;
        n_cached += res.cached;
        n_partial += res.partial;
        n_done++;
        tn_gemv_free(gv);
    }
    if (o.progress) fprintf(stderr, "\r%*s\r", 100, "");
    if (n_done) fputs(table, stdout);
    if (rc == 0) {
        if (tn_tuner_save(tuner, &err) != HN_OK) fprintf(stderr, "hone tune: cannot save results: %s\n", err.msg);
        printf("\n%d of %d results came from the cache %s%s (nothing was run for them)\n", n_cached, n_done,
               tn_tuner_cache_path(tuner), n_cached == n_done ? ": all cached" : "");
        if (n_partial)
            printf("%d search%s cut short by the budget: not cached; rerun with a larger --budget\n", n_partial,
                   n_partial == 1 ? " was" : "es were");
        printf("tuning took %.1f s\n", tn_tuner_elapsed(tuner));
    }
    tn_tuner_close(tuner);
    pool_free(pl);
    gguf_close(g);
    return rc;
}
