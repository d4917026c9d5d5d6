/* cmd_run.c: `hone run`: generate a continuation of a prompt.
 *
 * Loads the model (or, with no -m, the demo model hone writes into its cache
 * directory), tokenizes the prompt, prefills it in one forward, then samples
 * and decodes one token at a time, streaming the text through the
 * tokenizer's streaming detokenizer, until -n tokens or an end-of-generation
 * token. Prompt and generation speeds go to stderr at the end. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "../core/alloc.h"
#include "../core/clock.h"
#include "../kv/kv.h"
#include "../model/demo.h"
#include "../model/model.h"
#include "../sample/sample.h"
#include "../tokenizer/tokenizer.h"
#include "../tune/apply.h"
#include "cli.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: hone run [-m FILE] [-p PROMPT | --tokens \"ID ID ...\"] [options]\n"
            "\n"
            "Generates a continuation of PROMPT and streams it to stdout; prompt and\n"
            "generation speed go to stderr. Without -m, runs the demo model (written to\n"
            "$XDG_CACHE_HOME/hone/demo.gguf, default ~/.cache/hone, on first use).\n"
            "\n"
            "  -m, --model FILE        GGUF model\n"
            "  -p, --prompt TEXT       prompt text (BOS added as the model says; special tokens parsed)\n"
            "  --tokens \"ID ...\"       prompt as token ids instead of text\n"
            "  -n N                    tokens to generate (default 64; stops early at end of generation)\n"
            "  --temp T                temperature (default 0.8; 0 = greedy)\n"
            "  --top-k K               (default 40; 0 = off)\n"
            "  --top-p P               (default 0.95; 1 = off)\n"
            "  --min-p P               (default 0.05; 0 = off)\n"
            "  --repeat-penalty X      (default 1 = off), over the last 64 tokens\n"
            "  --seed S                sampler seed (default 0)\n"
            "  -t, --threads N         threads (default: all CPUs)\n"
            "  --print-ids             print the generated token ids instead of text\n"
            "  --ignore-eos            do not stop at end-of-generation tokens (benchmarks)\n"
            "  --no-tune               built-in kernel parameters: neither tune nor use the tuning cache\n"
            "                          (also HONE_NO_TUNE=1; by default the first start tunes, up to 30 s)\n"
            "  -h, --help              this help\n");
}

/* Parses "ID ID ..." (spaces or commas) into a new array; returns the count or -1. */
static int64_t parse_ids(const char *s, int32_t **out) {
    int64_t cap = 16, n = 0;
    int32_t *ids = hn_malloc(sizeof *ids * (size_t)cap);
    if (!ids) return -1;
    while (*s) {
        while (*s == ' ' || *s == ',' || *s == '\t' || *s == '\n') s++;
        if (!*s) break;
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno || v < 0 || v > INT32_MAX) {
            hn_free(ids);
            return -1;
        }
        if (n == cap) {
            int32_t *p = hn_realloc(ids, sizeof *ids * (size_t)(cap *= 2));
            if (!p) {
                hn_free(ids);
                return -1;
            }
            ids = p;
        }
        ids[n++] = (int32_t)v;
        s = end;
    }
    *out = ids;
    return n;
}

/* The demo model's path; writes the file if it is not there yet. */
static int demo_path(char *buf, size_t cap) {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char dir[1024];
    if (xdg && *xdg)
        snprintf(dir, sizeof dir, "%s/hone", xdg);
    else if (home && *home)
        snprintf(dir, sizeof dir, "%s/.cache/hone", home);
    else {
        fprintf(stderr, "hone run: no -m given, and neither XDG_CACHE_HOME nor HOME is set for the demo model\n");
        return 0;
    }
    /* mkdir -p */
    for (char *p = dir + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        mkdir(dir, 0755);
        *p = '/';
    }
    mkdir(dir, 0755);
    if ((size_t)snprintf(buf, cap, "%s/demo.gguf", dir) >= cap) return 0;
    struct stat st;
    if (stat(buf, &st) == 0) {
        fprintf(stderr, "hone run: no -m given; running the demo model %s\n", buf);
        return 1;
    }
    hn_err err = {0};
    if (demo_model_write(buf, &err) != HN_OK) {
        fprintf(stderr, "hone run: cannot write the demo model: %s\n", err.msg);
        return 0;
    }
    fprintf(stderr, "hone run: no -m given; wrote the demo model to %s and running it\n", buf);
    return 1;
}

static int need_arg(int i, int argc, const char *a) {
    if (i + 1 < argc) return 1;
    fprintf(stderr, "hone run: %s needs a value\n", a);
    return 0;
}

int cmd_run(int argc, char **argv) {
    const char *path = NULL, *prompt = NULL, *tokens = NULL;
    long n_gen = 64;
    int n_threads = 0;
    bool print_ids = false, ignore_eos = false, no_tune = false;
    smp_params sp = smp_default_params();
    sp.repeat_penalty = 1.0f;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        char *end = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--print-ids")) {
            print_ids = true;
            continue;
        } else if (!strcmp(a, "--ignore-eos")) {
            ignore_eos = true;
            continue;
        } else if (!strcmp(a, "--no-tune")) {
            no_tune = true;
            continue;
        }
        if (a[0] != '-' || !need_arg(i, argc, a)) {
            if (a[0] != '-') fprintf(stderr, "hone run: unexpected argument '%s' (the prompt goes after -p)\n", a);
            usage(stderr);
            return 2;
        }
        const char *v = argv[++i];
        errno = 0;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) path = v;
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) prompt = v;
        else if (!strcmp(a, "--tokens")) tokens = v;
        else if (!strcmp(a, "-n")) n_gen = strtol(v, &end, 10);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) n_threads = (int)strtol(v, &end, 10);
        else if (!strcmp(a, "--temp")) sp.temp = strtof(v, &end);
        else if (!strcmp(a, "--top-k")) sp.top_k = (int32_t)strtol(v, &end, 10);
        else if (!strcmp(a, "--top-p")) sp.top_p = strtof(v, &end);
        else if (!strcmp(a, "--min-p")) sp.min_p = strtof(v, &end);
        else if (!strcmp(a, "--repeat-penalty")) sp.repeat_penalty = strtof(v, &end);
        else if (!strcmp(a, "--seed")) sp.seed = strtoull(v, &end, 10);
        else {
            fprintf(stderr, "hone run: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
        if (end && (*end || end == v || errno)) {
            fprintf(stderr, "hone run: bad value '%s' for %s\n", v, a);
            return 2;
        }
    }
    if (n_gen < 0 || n_gen > 1000000 || n_threads < 0 || n_threads > 1024) {
        fprintf(stderr, "hone run: -n or -t out of range\n");
        return 2;
    }
    if (prompt && tokens) {
        fprintf(stderr, "hone run: give -p or --tokens, not both\n");
        return 2;
    }
    char demo[1200];
    if (!path) {
        if (!demo_path(demo, sizeof demo)) return 1;
        path = demo;
    }
    if (!prompt && !tokens) prompt = "Once upon a time";

    int rc = 1;
    hn_err err = {0};
    model *m = NULL;
    tok_vocab *voc = NULL;
    kv_cache *kv = NULL;
    kv_seq seq = {0};
    smp_sampler *smp = NULL;
    int32_t *ids = NULL;
    float *logits = NULL;
    model_params mp = {.n_threads = n_threads, .max_batch = 256};
    if (model_load(path, &mp, &m, &err) != HN_OK || tok_load(model_gguf(m), &voc, &err) != HN_OK) {
        fprintf(stderr, "hone run: %s: %s\n", path, err.msg);
        goto done;
    }
    if (!no_tune && tn_load_tune(model_backend(m), model_gguf(m), model_n_threads(m), "hone run", &err) != HN_OK)
        fprintf(stderr, "hone run: kernel tuning skipped: %s\n", err.msg);
    const model_hparams *hp = model_hp(m);
    int64_t n_prompt;
    if (tokens) {
        n_prompt = parse_ids(tokens, &ids);
        if (n_prompt < 0) {
            fprintf(stderr, "hone run: --tokens wants space-separated non-negative ids\n");
            rc = 2;
            goto done;
        }
    } else {
        size_t len = strlen(prompt);
        n_prompt = tok_encode(voc, prompt, len, true, true, NULL, 0);
        ids = n_prompt >= 0 ? hn_malloc(sizeof *ids * (size_t)(n_prompt > 0 ? n_prompt : 1)) : NULL;
        if (!ids || tok_encode(voc, prompt, len, true, true, ids, n_prompt) != n_prompt) {
            fprintf(stderr, "hone run: tokenization failed\n");
            goto done;
        }
    }
    if (n_prompt == 0) {
        fprintf(stderr, "hone run: the prompt has no tokens\n");
        goto done;
    }
    for (int64_t i = 0; i < n_prompt; i++)
        if (ids[i] >= hp->n_vocab) {
            fprintf(stderr, "hone run: token id %d is outside the vocabulary (%d)\n", ids[i], hp->n_vocab);
            goto done;
        }
    int64_t n_ctx = n_prompt + n_gen;
    if (n_ctx > hp->n_ctx_train) {
        fprintf(stderr, "hone run: %lld prompt + %ld new tokens exceed the model's context of %d\n",
                (long long)n_prompt, n_gen, hp->n_ctx_train);
        goto done;
    }
    kv_config kc = model_kv_config(m, (int32_t)((n_ctx + 15) / 16), 16);
    if (kv_create(&kc, &kv, &err) != HN_OK || kv_seq_init(&seq, kv, (int32_t)n_ctx, &err) != HN_OK) {
        fprintf(stderr, "hone run: %s\n", err.msg);
        goto done;
    }
    smp = smp_new(&sp, hp->n_vocab);
    logits = hn_malloc(sizeof(float) * (size_t)hp->n_vocab);
    int32_t *pos = hn_malloc(sizeof(int32_t) * (size_t)n_prompt), *sid = hn_calloc((size_t)n_prompt, sizeof(int32_t));
    if (!smp || !logits || !pos || !sid) {
        fprintf(stderr, "hone run: bad sampler parameters or out of memory\n");
        hn_free(pos);
        hn_free(sid);
        goto done;
    }
    for (int64_t i = 0; i < n_prompt; i++) {
        pos[i] = (int32_t)i;
        smp_accept(smp, ids[i]);
    }
    kv_seq *seqs[1] = {&seq};
    model_batch b = {.n_tokens = (int32_t)n_prompt, .token = ids, .pos = pos, .seq_id = sid, .seqs = seqs, .n_seqs = 1};
    double t0 = hn_now_s();
    hn_status st = model_forward(m, kv, &b, logits, 1, &err);
    double t1 = hn_now_s();
    hn_free(pos);
    hn_free(sid);
    if (st != HN_OK) {
        fprintf(stderr, "hone run: %s\n", err.msg);
        goto done;
    }

    /* decode loop: sample, print, feed back */
    tok_stream ts = {.first = true}; /* a continuation keeps its first leading space */
    char piece[512];
    long n_done = 0;
    int32_t zero = 0;
    for (; n_done < n_gen; n_done++) {
        int32_t t = smp_sample(smp, logits);
        if (t < 0 || (!ignore_eos && tok_is_eog(voc, t))) break;
        smp_accept(smp, t);
        if (print_ids) {
            printf(n_done ? " %d" : "%d", t);
        } else {
            size_t k = tok_stream_push(voc, &ts, t, piece, sizeof piece);
            fwrite(piece, 1, k, stdout);
        }
        fflush(stdout);
        if (n_done + 1 == n_gen) {
            n_done++;
            break;
        }
        int32_t p = (int32_t)(n_prompt + n_done);
        model_batch d = {.n_tokens = 1, .token = &t, .pos = &p, .seq_id = &zero, .seqs = seqs, .n_seqs = 1};
        if (model_forward(m, kv, &d, logits, 1, &err) != HN_OK) {
            fprintf(stderr, "\nhone run: %s\n", err.msg);
            goto done;
        }
    }
    double t2 = hn_now_s();
    if (!print_ids) {
        size_t k = tok_stream_flush(&ts, piece, sizeof piece);
        fwrite(piece, 1, k, stdout);
    }
    printf("\n");
    fflush(stdout);
    fprintf(stderr, "hone run: %d threads; prompt %lld tokens in %.3f s (%.1f tok/s); generated %ld tokens in %.3f s (%.1f tok/s)\n",
            model_n_threads(m), (long long)n_prompt, t1 - t0, (double)n_prompt / (t1 - t0 > 0 ? t1 - t0 : 1e-9),
            n_done, t2 - t1, n_done > 0 ? (double)(n_done > 1 ? n_done - 1 : 1) / (t2 - t1 > 0 ? t2 - t1 : 1e-9) : 0.0);
    rc = 0;
done:
    hn_free(logits);
    hn_free(ids);
    smp_free(smp);
    if (kv) kv_seq_free(&seq, kv);
    kv_free(kv);
    tok_free(voc);
    model_free(m);
    return rc;
}
