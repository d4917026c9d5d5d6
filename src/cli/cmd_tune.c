/* cmd_tune.c: `hone tune [-m FILE] [-t N] [--device cpu|cuda] [--budget
 * SECONDS] [--force]`: probes the machine (cores, caches, ISA, measured
 * bandwidth; with --device cuda the GPU), then tunes the matmul kernels of
 * every distinct weight shape of the model (or of a built-in set of
 * Qwen3-0.6B shapes without -m) in both families, decode (the CPU: one
 * activation row; CUDA: 1, 2, 4 and 8 rows) and prefill (32 and 128 rows;
 * the CPU only), and prints a table per family: kernel, shape, default time,
 * tuned time, speedup and the chosen parameters. Results are cached per
 * device; a second run reuses them and says so. Model load (run, serve,
 * bench) applies the same results on the backend it runs on. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../backend/registry.h"
#include "../core/alloc.h"
#include "../core/pool.h"
#include "../gguf/gguf.h"
#include "../quant/quant.h"
#include "../tune/apply.h"
#include "../tune/probe.h"
#include "../tune/tune.h"
#include "cli.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: hone tune [-m FILE] [-t N] [--device cpu|cuda] [--budget SECONDS] [--force]\n\n"
            "Probes this machine (cores, caches, instruction sets, memory bandwidth) and\n"
            "tunes the matmul kernels for every weight shape of FILE (without -m: the\n"
            "Qwen3-0.6B shapes in q4_0, q8_0, q4_K and q6_K), for decode (1 row) and\n"
            "prefill (32 and 128 rows); with --device cuda the GPU's decode kernels at\n"
            "1, 2, 4 and 8 rows. Every candidate is validated against the scalar\n"
            "reference before it is timed; a winner must beat the default by 3%%. Results\n"
            "are cached per device (HONE_CACHE_DIR, else $XDG_CACHE_HOME/hone or\n"
            "~/.cache/hone); a second run, and hone run/serve/bench, reuse them.\n\n"
            "  -m FILE           GGUF model whose weight shapes to tune\n"
            "  -t N              threads (default: every CPU this process may use)\n"
            "  --device NAME     cpu (the default) or cuda (GPU 0)\n"
            "  --budget SECONDS  total tuning time (default 27: with setup, within 30)\n"
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

/* Qwen3-0.6B: hidden 1024, 16 query heads and 8 KV heads of 128, FFN 3072. */
static int builtin_shapes(tn_shape *out) {
    static const qt_type types[] = {QT_Q4_0, QT_Q8_0, QT_Q4_K, QT_Q6_K};
    static const int64_t kn[][2] = {{1024, 2048}, {1024, 1024}, {2048, 1024}, {1024, 3072}, {3072, 1024}};
    int n = 0;
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
        for (size_t i = 0; i < sizeof kn / sizeof kn[0]; i++) {
            tn_shape *s = &out[n++];
            memset(s, 0, sizeof *s);
            s->type = types[t];
            s->k = kn[i][0];
            s->n = kn[i][1];
            s->n_total = 1;
        }
    return n;
}

int cmd_tune(int argc, char **argv) {
    const char *model = NULL;
    double budget = TN_DEFAULT_BUDGET_S;
    int threads = 0;
    bool force = false;
    const char *device = "cpu";
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
        } else if (!strcmp(a, "--device") && i + 1 < argc) {
            device = argv[++i];
            if (strcmp(device, "cpu") && strcmp(device, "cuda")) {
                fprintf(stderr, "hone tune: --device %s: cpu or cuda\n", device);
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
    const bool gpu = !strcmp(device, "cuda");
    tn_probe probe;
    be_backend *dev = NULL;
    be_tune_info info;
    memset(&info, 0, sizeof info);
    if (gpu) {
        /* the GPU's own key and description; no host bandwidth to measure */
        be_config bc = {.device = 0};
        if (be_create("cuda", &bc, &dev, &err) != HN_OK) {
            fprintf(stderr, "hone tune: %s\n", err.msg);
            return 1;
        }
        tn_backend_info(dev, &info);
        tn_probe_detect(&probe);
        printf("device   %s, fingerprint %s\n", info.device[0] ? info.device : "cuda", info.fingerprint);
    } else {
        if (tn_probe_get(&probe, force, &err) != HN_OK) {
            fprintf(stderr, "hone tune: %s\n", err.msg);
            return 1;
        }
        print_probe(&probe);
    }
    if (threads == 0) threads = probe.usable;

    gguf_ctx *g = NULL;
    static tn_shape builtin[32];
    tn_shape *shapes = builtin, *owned = NULL;
    int n_shapes;
    if (model) {
        if (gguf_open(model, &g, &err) != HN_OK) {
            fprintf(stderr, "hone tune: %s\n", err.msg);
            return 1;
        }
        n_shapes = tn_model_shapes(g, &owned, &err);
        shapes = owned;
        if (n_shapes <= 0) {
            if (n_shapes == 0) fprintf(stderr, "hone tune: %s has no matmul weights with a CPU kernel\n", model);
            else fprintf(stderr, "hone tune: %s\n", err.msg);
            hn_free(owned);
            gguf_close(g);
            be_free(dev);
            return 1;
        }
    } else {
        n_shapes = builtin_shapes(builtin);
    }
    double bw = gpu ? 0 : tn_probe_read_bw(&probe, threads);
    if (gpu)
        printf("\ntuning %d shape%s of %s on the GPU (budget %.0f s)\n", n_shapes, n_shapes == 1 ? "" : "s",
               model ? model : "the built-in Qwen3-0.6B set", budget);
    else
        printf("\ntuning %d shape%s of %s with %d thread%s (budget %.0f s)\n", n_shapes, n_shapes == 1 ? "" : "s",
               model ? model : "the built-in Qwen3-0.6B set", threads, threads == 1 ? "" : "s", budget);
    fflush(stdout);

    tn_model_opts o = {.backend = dev, .n_threads = threads, .budget_s = budget, .force = force,
                       .progress = isatty(2) != 0};
    tn_model_report rep;
    hn_status st = tn_tune_shapes(shapes, n_shapes, &o, &rep, &err);
    if (rep.cache_corrupt)
        fprintf(stderr, "hone tune: the cache file %s was corrupt; it is ignored and will be rewritten\n",
                rep.cache_path);
    for (int fam = 0; fam < 2; fam++) {
        const int want = fam == 0 ? TN_FAM_DECODE : TN_FAM_PREFILL;
        bool any = false;
        for (int i = 0; i < rep.n; i++) any |= rep.e[i].tuned && rep.e[i].family == want;
        if (!any) continue;
        if (fam == 0 && gpu)
            printf("\ndecode (cuda-gemv at 1, 2, 4 and 8 activation rows; a call of r rows takes the largest <= r)\n\n"
                   "| kernel | shape | default us | tuned us | speedup | GB/s | %% of read bw | params | note |\n"
                   "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- |\n");
        else if (fam == 0)
            printf("\ndecode (gemv, 1 activation row)\n\n"
                   "| kernel | shape | default us | tuned us | speedup | GB/s | %% of read bw | params | note |\n"
                   "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- |\n");
        else
            printf("\nprefill (%d and %d activation rows; %d+ rows take the %d-row winner)\n\n"
                   "| kernel | shape | default us | tuned us | speedup | GMAC/s | params | note |\n"
                   "| --- | --- | ---: | ---: | ---: | ---: | --- | --- |\n",
                   TN_PREFILL_ROWS_A, TN_PREFILL_ROWS_B, TN_PREFILL_SWITCH, TN_PREFILL_ROWS_B);
        for (int i = 0; i < rep.n; i++) {
            const tn_model_entry *e = &rep.e[i];
            if (!e->tuned || e->family != want) continue;
            const tn_result *r = &e->res;
            char note[96];
            snprintf(note, sizeof note, "%s%s", r->cached ? "cached" : r->changed ? "tuned" : "default kept",
                     r->partial ? ", budget cut" : "");
            if (!r->cached && r->n_rejected) {
                size_t nl = strlen(note);
                snprintf(note + nl, sizeof note - nl, ", %d rejected", r->n_rejected);
            }
            double speed = r->tuned_ns > 0 ? r->default_ns / r->tuned_ns : 0.0;
            if (fam == 0) {
                double gbs = r->tuned_ns > 0 ? (double)e->bytes / r->tuned_ns : 0;
                char pct[16];
                if (bw > 0) snprintf(pct, sizeof pct, "%.0f%%", 100.0 * gbs * 1e9 / bw);
                else snprintf(pct, sizeof pct, "-"); /* the GPU's read bandwidth is not measured here */
                printf("| %s | %s | %.1f | %.1f | %.2fx | %.1f | %s | %s | %s |\n", e->kernel, e->shape,
                       r->default_ns * 1e-3, r->tuned_ns * 1e-3, speed, gbs, pct, e->cfg, note);
            } else {
                printf("| %s | %s | %.1f | %.1f | %.2fx | %.1f | %s | %s |\n", e->kernel, e->shape,
                       r->default_ns * 1e-3, r->tuned_ns * 1e-3, speed, r->tuned_ns > 0 ? e->macs / r->tuned_ns : 0.0,
                       e->cfg, note);
            }
        }
    }
    int rc = 0;
    if (st != HN_OK) {
        fprintf(stderr, "hone tune: %s\n", err.msg);
        rc = 1;
    } else {
        int n_done = rep.n_cached + rep.n_tuned;
        printf("\n%d of %d results came from the cache %s%s (nothing was run for them)\n", rep.n_cached, n_done,
               rep.cache_path, rep.n_cached == n_done ? ": all cached" : "");
        if (rep.n_not_reached)
            printf("%d case%s not reached within the budget (defaults kept, not cached)\n", rep.n_not_reached,
                   rep.n_not_reached == 1 ? " was" : "s were");
        if (rep.n_partial)
            printf("%d search%s cut short by the budget (the best found so far is used); --force --budget N searches again\n", rep.n_partial,
                   rep.n_partial == 1 ? " was" : "es were");
        double fs[2] = {0, 0};
        for (int i = 0; i < rep.n; i++) fs[rep.e[i].family == TN_FAM_PREFILL] += rep.e[i].secs;
        printf("tuning took %.1f s (decode %.1f s, prefill %.1f s)\n", rep.elapsed_s, fs[0], fs[1]);
        if (rep.busy)
            printf("note: the machine was busy (load %.1f on %d CPUs): timings are noisy and thread counts were not\n"
                   "tuned (all threads); rerun with --force when it is idle\n",
                   rep.load_avg, rep.usable_cpus);
    }
    tn_model_report_free(&rep);
    hn_free(owned);
    gguf_close(g);
    be_free(dev);
    return rc;
}
