/* cmd_bench_model.c: `hone bench -m FILE`: prefill and decode speed of a model,
 * in the manner of llama-bench.
 *
 * Tests (each repeated -r times; the table shows the median and the spread):
 *   ppP   prefill of P prompt tokens in one forward (the model splits it into
 *         max_batch steps), after --depth D tokens already in the cache;
 *   tgN   N single-token decode steps after D (+ nothing else) cached tokens.
 * Tokens are pseudo-random ids from the vocabulary, so the speed does not
 * depend on a tokenizer or a prompt. The depth prefix is computed once per
 * repetition and not timed (as llama-bench does). The KV cache is f16 by
 * default, as llama-bench's. Output is a markdown table; --csv prints one
 * line per test instead. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../core/alloc.h"
#include "../core/clock.h"
#include "../kv/kv.h"
#include "../model/model.h"
#include "../quant/quant.h"
#include "../tune/apply.h"
#include "cli.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: hone bench -m FILE [-p N] [-n N] [-t N] [--depth D] [-r REPS] [-b BATCH] [--csv] [--no-tune] [--device NAME] [--cpu-moe N|auto] [--vram SIZE] [--devices LIST]\n"
            "\n"
            "Measures prompt processing (ppN) and token generation (tgN) speed like\n"
            "llama-bench: median tokens/s over REPS repetitions, as a markdown table.\n"
            "\n"
            "  -m, --model FILE   GGUF model\n"
            "  -p N               prompt tokens for the prefill test (default 512; 0 = skip)\n"
            "  -n N               generated tokens for the decode test (default 128; 0 = skip)\n"
            "  -t, --threads N    threads (default: all CPUs)\n"
            "  -d, --depth D      tokens already in the context before each test (default 0)\n"
            "  -r, --reps N       repetitions (default 5)\n"
            "  -b, --batch N      most tokens per forward step (default 512)\n"
            "  -ctk, --cache-type-k T   K cache type: f32, f16, q8_0 (default f16, as llama-bench)\n"
            "  -ctv, --cache-type-v T   V cache type: f32, f16, q8_0, q4_0, q4_1 (default f16)\n"
            "  --csv              print `test,depth,threads,median,min,max` lines instead\n"
            "  --no-tune          built-in kernel parameters: neither tune nor use the tuning cache\n"
            "  --device NAME      backend: auto (default: the best available), cpu, cuda\n"
            "                     (also HONE_NO_TUNE=1; by default the first start tunes, up to 30 s)\n"
            "  --cpu-moe N        " CLI_CPU_MOE_HELP "\n"
            "  --vram SIZE        " CLI_VRAM_HELP "\n"
            "  --devices LIST     " CLI_DEVICES_HELP "\n");
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct bench_ctx {
    model *m;
    kv_cache *kv;
    int32_t n_vocab;
    int32_t *tok;   /* scratch ids */
    int32_t *pos;
    int32_t *sid;
    uint64_t rng;
} bench_ctx;

static int32_t next_token(bench_ctx *c) {
    c->rng ^= c->rng << 13;
    c->rng ^= c->rng >> 7;
    c->rng ^= c->rng << 17;
    return (int32_t)(c->rng % (uint64_t)c->n_vocab);
}

/* One forward of n tokens at positions p0.. of seq (logits of the last only). */
static hn_status run_tokens(bench_ctx *c, kv_seq *seq, int32_t p0, int32_t n, hn_err *err) {
    for (int32_t i = 0; i < n; i++) {
        c->tok[i] = next_token(c);
        c->pos[i] = p0 + i;
        c->sid[i] = 0;
    }
    kv_seq *seqs[1] = {seq};
    model_batch b = {.n_tokens = n, .token = c->tok, .pos = c->pos, .seq_id = c->sid, .seqs = seqs, .n_seqs = 1};
    /* the logits stay in the backend, as in the engine's steps (nothing copies them out) */
    return model_forward(c->m, c->kv, &b, NULL, 1, err);
}

/* One repetition: fill `depth` tokens (untimed), then either a prefill of n
 * tokens in one forward (decode false) or n single-token steps; returns tok/s or < 0. */
static double one_rep(bench_ctx *c, int32_t depth, int32_t n, bool decode, hn_err *err) {
    kv_seq seq = {0};
    double rate = -1;
    if (kv_seq_init(&seq, c->kv, depth + n + 1, err) != HN_OK) return -1;
    /* hybrids: the sequence's recurrent state */
    if (model_hp(c->m)->hybrid && kv_seq_state_acquire(c->kv, &seq, err) != HN_OK) goto done;
    if (depth > 0 && run_tokens(c, &seq, 0, depth, err) != HN_OK) goto done;
    double t0 = hn_now_s();
    if (decode) {
        for (int32_t i = 0; i < n; i++)
            if (run_tokens(c, &seq, depth + i, 1, err) != HN_OK) goto done;
    } else if (run_tokens(c, &seq, depth, n, err) != HN_OK) {
        goto done;
    }
    double dt = hn_now_s() - t0;
    rate = (double)n / (dt > 0 ? dt : 1e-9);
done:
    kv_seq_free(&seq, c->kv);
    return rate;
}

static const char *base_name(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* The type holding most weight bytes (what llama-bench calls the model's type). */
static const char *main_type(const gguf_ctx *g) {
    size_t bytes[QT_TYPE_COUNT] = {0};
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        if ((int)t->type >= 0 && (int)t->type < QT_TYPE_COUNT) bytes[t->type] += t->nbytes;
    }
    int best = 0;
    for (int t = 1; t < QT_TYPE_COUNT; t++)
        if (bytes[t] > bytes[best]) best = t;
    return qt_traits((qt_type)best) ? qt_traits((qt_type)best)->name : "?";
}

int cmd_bench_model(int argc, char **argv) {
    const char *path = NULL, *device = NULL;
    long n_prompt = 512, n_gen = 128, depth = 0, reps = 5, batch = 512, n_threads = 0;
    bool csv = false, no_tune = false;
    int cpu_moe = 0, n_ranks = 0;
    size_t vram = 0;
    const char *devices = NULL;
    qt_type ctk = QT_F16, ctv = QT_F16;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--csv")) {
            csv = true;
            continue;
        }
        if (!strcmp(a, "--no-tune")) {
            no_tune = true;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "hone bench: %s needs a value\n", a);
            usage(stderr);
            return 2;
        }
        const char *v = argv[++i];
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            path = v;
            continue;
        }
        if (!strcmp(a, "--device")) {
            device = v;
            continue;
        }
        if (!strcmp(a, "--cpu-moe")) {
            if (!cli_cpu_moe_parse("bench", v, &cpu_moe)) return 2;
            continue;
        }
        if (!strcmp(a, "--vram")) {
            if (!cli_vram_parse("bench", v, &vram)) return 2;
            continue;
        }
        if (!strcmp(a, "--devices")) {
            devices = v;
            continue;
        }
        if (!strcmp(a, "--spec")) { /* a forward-pass benchmark: nothing is generated, so nothing to draft */
            int sp;
            if (!cli_spec_parse("bench", v, &sp)) return 2;
            if (sp != ENG_SPEC_OFF) {
                fprintf(stderr, "hone bench -m times single forward passes; speculative decoding applies to "
                                "generation: use hone bench agents --spec %s, or bench/spec.sh\n", v);
                return 2;
            }
            continue;
        }
        if (!strcmp(a, "-ctk") || !strcmp(a, "--cache-type-k") || !strcmp(a, "-ctv") || !strcmp(a, "--cache-type-v")) {
            bool is_k = !strcmp(a, "-ctk") || !strcmp(a, "--cache-type-k");
            if (!qt_from_name(v, is_k ? &ctk : &ctv)) {
                fprintf(stderr, "hone bench: unknown cache type '%s'\n", v);
                return 2;
            }
            continue;
        }
        long *dst = !strcmp(a, "-p") ? &n_prompt
                  : !strcmp(a, "-n") ? &n_gen
                  : (!strcmp(a, "-t") || !strcmp(a, "--threads")) ? &n_threads
                  : (!strcmp(a, "-d") || !strcmp(a, "--depth")) ? &depth
                  : (!strcmp(a, "-r") || !strcmp(a, "--reps")) ? &reps
                  : (!strcmp(a, "-b") || !strcmp(a, "--batch")) ? &batch
                  : NULL;
        if (!dst) {
            fprintf(stderr, "hone bench: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
        char *end = NULL;
        errno = 0;
        *dst = strtol(v, &end, 10);
        if (!*v || *end || errno) {
            fprintf(stderr, "hone bench: bad value '%s' for %s\n", v, a);
            return 2;
        }
    }
    if (!path) {
        fprintf(stderr, "hone bench: -m FILE is required\n");
        usage(stderr);
        return 2;
    }
    if (devices && !cli_devices_parse("bench", devices, &device, &n_ranks)) return 2;
    if (n_prompt < 0 || n_prompt > 1000000 || n_gen < 0 || n_gen > 1000000 || depth < 0 || depth > 10000000 ||
        reps < 1 || reps > 1000 || batch < 1 || batch > 65536 || n_threads < 0 || n_threads > 1024) {
        fprintf(stderr, "hone bench: an option is out of range\n");
        return 2;
    }

    int rc = 1;
    hn_err err = {0};
    bench_ctx c = {.rng = 0x9e3779b97f4a7c15ull};
    double *rates = hn_malloc(sizeof(double) * (size_t)reps);
    model_params mp = {.n_threads = (int)n_threads, .max_batch = (int)batch, .device = device, .cpu_moe = cpu_moe, .mem_budget = vram,
                       .n_ranks = n_ranks};
    if (!rates) goto done;
    if (model_load(path, &mp, &c.m, &err) != HN_OK) {
        fprintf(stderr, "hone bench: %s: %s\n", path, err.msg);
        goto done;
    }
    cli_device_note("bench", device, model_backend(c.m)->ops->name);
    if (!no_tune) cli_load_tune(c.m, "bench");
    const model_hparams *hp = model_hp(c.m);
    int64_t need = depth + (n_prompt > n_gen ? n_prompt : n_gen) + 1;
    /* past the trained context the outputs mean nothing, but the speed is the speed (llama-bench measures
     * there too): a note, not a refusal */
    if (need > hp->n_ctx_train)
        fprintf(stderr, "hone bench: depth + test tokens (%lld) exceed the model's trained context of %d: measured "
                        "anyway (a speed test; its outputs past that are not meaningful)\n",
                (long long)need, hp->n_ctx_train);
    int64_t most = depth > n_prompt ? depth : n_prompt;
    if (most < 1) most = 1;
    c.n_vocab = hp->n_vocab;
    c.tok = hn_malloc(sizeof(int32_t) * (size_t)most);
    c.pos = hn_malloc(sizeof(int32_t) * (size_t)most);
    c.sid = hn_malloc(sizeof(int32_t) * (size_t)most);
    kv_config kc = model_kv_config(c.m, (int32_t)((need + 15) / 16 + 1), 16);
    kc.type = ctk;
    kc.v_type = ctv;
    if (!c.tok || !c.pos || !c.sid || kv_create(&kc, &c.kv, &err) != HN_OK) {
        fprintf(stderr, "hone bench: %s\n", err.msg[0] ? err.msg : "out of memory");
        goto done;
    }
    const char *type = main_type(model_gguf(c.m));
    char dev[64]; /* the backend, and where the experts are when some are apart (--cpu-moe) */
    if (model_moe_remote_layers(c.m))
        snprintf(dev, sizeof dev, "%s, experts of %d layers on %s", model_backend(c.m)->ops->name,
                 model_moe_remote_layers(c.m), model_moe_backend(c.m)->ops->name);
    else if (model_n_ranks(c.m) > 1) /* tensor parallel (--devices) */
        snprintf(dev, sizeof dev, "%s x%d (tensor parallel)", model_backend(c.m)->ops->name, model_n_ranks(c.m));
    else
        snprintf(dev, sizeof dev, "%s", model_backend(c.m)->ops->name);
    if (!csv) {
        printf("| model | type | device | threads | test | t/s (median) | min | max |\n");
        printf("| --- | --- | --- | ---: | --- | ---: | ---: | ---: |\n");
    }
    for (int test = 0; test < 2; test++) {
        long n = test == 0 ? n_prompt : n_gen;
        if (n == 0) continue;
        /* one untimed warm-up (page faults, pool spin-up, cpu clocks) */
        if (one_rep(&c, 0, (int32_t)(n < 16 ? n : 16), test == 1, &err) < 0) goto fail;
        for (long r = 0; r < reps; r++) {
            rates[r] = one_rep(&c, (int32_t)depth, (int32_t)n, test == 1, &err);
            if (rates[r] < 0) goto fail;
        }
        qsort(rates, (size_t)reps, sizeof(double), cmp_double);
        double med = reps % 2 ? rates[reps / 2] : 0.5 * (rates[reps / 2 - 1] + rates[reps / 2]);
        char name[64];
        if (depth > 0)
            snprintf(name, sizeof name, "%s%ld @ d%ld", test == 0 ? "pp" : "tg", n, depth);
        else
            snprintf(name, sizeof name, "%s%ld", test == 0 ? "pp" : "tg", n);
        if (csv)
            printf("%s%ld,%ld,%d,%.2f,%.2f,%.2f\n", test == 0 ? "pp" : "tg", n, depth, model_n_threads(c.m), med,
                   rates[0], rates[reps - 1]);
        else
            printf("| %s | %s | %s | %d | %s | %.2f | %.2f | %.2f |\n", base_name(path), type, dev,
                   model_n_threads(c.m), name,
                   med, rates[0], rates[reps - 1]);
        fflush(stdout);
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "hone bench: %s\n", err.msg);
done:
    hn_free(rates);
    hn_free(c.tok);
    hn_free(c.pos);
    hn_free(c.sid);
    kv_free(c.kv);
    model_free(c.m);
    return rc;
}
