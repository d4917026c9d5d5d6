/* cmd_run.c: `hone run`: generate a continuation of a prompt.
 *
 * A one-request client of the engine (sched/engine.h), like the server: it
 * creates an engine on the model (or, with no -m, the demo model hone writes
 * into its cache directory), tokenizes the prompt, submits one request and
 * streams the tokens through the tokenizer's streaming detokenizer as they
 * arrive, until -n tokens or an end-of-generation token. Prompt and
 * generation speeds (from the request's counters) go to stderr at the end.
 *
 * The engine's event callback runs on the engine thread; it only appends the
 * token to a buffer sized for the whole reply (no allocation, no I/O) and
 * signals the main thread, which owns all output: a slow terminal or pipe
 * then never stalls the engine, and the detokenizer, Ctrl-C and errors are
 * handled in one place. Ctrl-C cancels the request (the text so far is
 * flushed, exit 130); a second Ctrl-C kills as before. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "../core/alloc.h"
#include "../core/clock.h"
#include "../model/demo.h"
#include "../model/model.h"
#include "../sched/engine.h"
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
            "  --device NAME           backend: auto (default: the best available), cpu, cuda\n"
            "  --cpu-moe N             " CLI_CPU_MOE_HELP "\n"
            "  --vram SIZE             " CLI_VRAM_HELP "\n"
            "  --devices LIST          " CLI_DEVICES_HELP "\n"
            "  --kv-type T             KV cache elements: f16 (default), f32, q8_0, k8v4\n"
            "  --spec MODE             speculative decoding: " CLI_SPEC_HELP "\n"
            "  --draft FILE            " CLI_DRAFT_HELP "\n"
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


/* model load (on the loading thread, before the engine starts): the tuned
 * kernel parameters unless --no-tune (a failure only warns), and the thread
 * count for the speed line */
typedef struct run_load {
    bool tune;
    int n_threads;
} run_load;

static hn_status run_on_load(void *ctx, struct model *m, hn_err *err) {
    (void)err;
    run_load *l = ctx;
    l->n_threads = model_n_threads(m);
    if (l->tune) cli_load_tune(m, "run");
    return HN_OK;
}

/* The events of the one request, from the engine thread to the main thread.
 * tok holds every token of the reply (at most max_tokens arrive). */
typedef struct run_queue {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t *tok;
    int32_t cap, n;
    bool done;
    eng_finish finish;
    eng_req_stats stats;
    char error[256];
} run_queue;

static void run_on_event(void *ctx, const eng_event *ev) {
    run_queue *q = ctx;
    pthread_mutex_lock(&q->mu);
    if (ev->type == ENG_EV_TOKEN) {
        if (q->n < q->cap) q->tok[q->n++] = ev->token;
    } else {
        q->done = true;
        q->finish = ev->finish;
        q->stats = ev->stats;
        if (ev->finish == ENG_FINISH_ERROR)
            snprintf(q->error, sizeof q->error, "%s", ev->error ? ev->error : "generation failed");
    }
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

static volatile sig_atomic_t g_interrupted;

static void on_sigint(int sig) {
    (void)sig;
    g_interrupted = 1;
}

int cmd_run(int argc, char **argv) {
    const char *path = NULL, *prompt = NULL, *tokens = NULL, *device = NULL;
    int kv_type = ENG_KV_F16, spec = ENG_SPEC_AUTO, cpu_moe = 0, n_ranks = 0;
    size_t vram = 0;
    const char *devices = NULL;
    const char *draft = NULL;
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
        else if (!strcmp(a, "--device")) device = v;
        else if (!strcmp(a, "--devices")) devices = v;
        else if (!strcmp(a, "--kv-type")) {
            if (!eng_kv_type_from_name(v, &kv_type)) {
                fprintf(stderr, "hone run: unknown KV type '%s' (f16, f32, q8_0, k8v4)\n", v);
                return 2;
            }
        }
        else if (!strcmp(a, "--spec")) {
            if (!cli_spec_parse("run", v, &spec)) return 2;
        }
        else if (!strcmp(a, "--draft")) draft = v;
        else if (!strcmp(a, "--cpu-moe")) {
            if (!cli_cpu_moe_parse("run", v, &cpu_moe)) return 2;
        } else if (!strcmp(a, "--vram")) {
            if (!cli_vram_parse("run", v, &vram)) return 2;
        }
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
    if (devices && !cli_devices_parse("run", devices, &device, &n_ranks)) return 2;
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
    eng_engine *e = NULL;
    int32_t *ids = NULL;
    run_queue q = {.done = false};
    pthread_mutex_init(&q.mu, NULL);
    pthread_cond_init(&q.cv, NULL);
    struct sigaction old_int;
    bool sig_installed = false;

    /* One request: one running sequence, the prompt in steps of 256 tokens
     * (the steps run's own loop took: on a CPU each step streams the weights
     * once, and nothing else waits on this one), no prefix cache to keep. */
    run_load ld = {.tune = !no_tune};
    eng_params ep = eng_default_params();
    ep.model_path = path;
    ep.device = device;
    ep.kv_type = kv_type;
    ep.spec = spec;
    ep.draft_path = draft;
    ep.cpu_moe = cpu_moe;
    ep.mem_budget = vram;
    ep.n_ranks = n_ranks;
    ep.n_threads = n_threads;
    ep.max_running = 1;
    ep.step_tokens = 256;
    ep.prefix_cache = false;
    ep.cache_idle_ms = -1;
    ep.on_load = run_on_load;
    ep.on_load_ctx = &ld;
    if (eng_create(&ep, &e, &err) != HN_OK) {
        fprintf(stderr, "hone run: %s: %s\n", path, err.msg);
        goto done;
    }
    cli_device_note("run", device, eng_device(e));
    const tok_vocab *voc = eng_vocab(e);
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
    if (n_prompt + n_gen > eng_n_ctx(e)) {
        fprintf(stderr, "hone run: %lld prompt + %ld new tokens exceed the model's context of %d\n",
                (long long)n_prompt, n_gen, (int)eng_n_ctx(e));
        goto done;
    }
    /* -n 0 still evaluates the prompt (its speed is the point): one token is
     * generated and not shown */
    q.cap = n_gen > 0 ? (int32_t)n_gen : 1;
    q.tok = hn_malloc(sizeof *q.tok * (size_t)q.cap);
    if (!q.tok) {
        fprintf(stderr, "hone run: out of memory\n");
        goto done;
    }
    eng_request r = {.prompt = ids, .n_prompt = (int32_t)n_prompt, .sampling = sp, .max_tokens = q.cap,
                     .ignore_eog = ignore_eos, .penalize_prompt = true, .on_event = run_on_event, .ctx = &q};
    eng_req_id id;
    if (eng_submit(e, &r, &id, &err) != HN_OK) {
        fprintf(stderr, "hone run: %s\n", err.msg);
        goto done;
    }
    /* Ctrl-C cancels the request (unless SIGINT is ignored, as in a background job) */
    struct sigaction sa = {.sa_handler = on_sigint, .sa_flags = SA_RESTART | SA_RESETHAND};
    sigemptyset(&sa.sa_mask);
    g_interrupted = 0;
    if (sigaction(SIGINT, NULL, &old_int) == 0 && old_int.sa_handler != SIG_IGN)
        sig_installed = sigaction(SIGINT, &sa, NULL) == 0;

    /* print tokens as they arrive until DONE */
    tok_stream ts = {.first = true}; /* a continuation keeps its first leading space */
    char piece[512];
    int32_t n_shown = 0, n_seen = 0;
    bool cancelled = false;
    for (;;) {
        pthread_mutex_lock(&q.mu);
        while (q.n == n_seen && !q.done) {
            if (g_interrupted && !cancelled) break;
            struct timespec dl;
            hn_deadline_ms(&dl, 100); /* a Ctrl-C is noticed within 0.1 s */
            pthread_cond_timedwait(&q.cv, &q.mu, &dl);
        }
        int32_t n = q.n;
        bool fin = q.done;
        pthread_mutex_unlock(&q.mu);
        if (g_interrupted && !cancelled) {
            eng_cancel(e, id);
            cancelled = true;
        }
        for (; n_seen < n; n_seen++) {
            if (n_gen == 0) continue;
            int32_t t = q.tok[n_seen];
            if (print_ids) {
                printf(n_shown ? " %d" : "%d", t);
            } else {
                size_t k = tok_stream_push(voc, &ts, t, piece, sizeof piece);
                fwrite(piece, 1, k, stdout);
            }
            n_shown++;
            fflush(stdout);
        }
        if (fin && n_seen == n) break;
    }
    if (!print_ids) {
        size_t k = tok_stream_flush(&ts, piece, sizeof piece);
        fwrite(piece, 1, k, stdout);
    }
    printf("\n");
    fflush(stdout);
    if (q.finish == ENG_FINISH_ERROR) {
        fprintf(stderr, "hone run: %s\n", q.error);
        goto done;
    }
    /* prompt: from the first step on it to the first token; generation: the rest */
    const eng_req_stats *s = &q.stats;
    double tp = (s->t_first_ms - s->t_queued_ms) / 1e3, tg = (s->t_total_ms - s->t_first_ms) / 1e3;
    if (tp < 0) tp = 0;
    if (tg < 0 || n_gen == 0) tg = 0;
    fprintf(stderr, "hone run: %d threads; prompt %lld tokens in %.3f s (%.1f tok/s); generated %d tokens in %.3f s (%.1f tok/s)\n",
            ld.n_threads, (long long)n_prompt, tp, (double)n_prompt / (tp > 0 ? tp : 1e-9), (int)n_shown, tg,
            n_shown > 0 ? (double)(n_shown > 1 ? n_shown - 1 : 1) / (tg > 0 ? tg : 1e-9) : 0.0);
    if (s->n_drafted > 0)
        fprintf(stderr, "hone run: speculative (%s): drafted %d tokens, accepted %d (%.0f%%), %d decode steps saved\n",
                eng_spec_name(spec), (int)s->n_drafted, (int)s->n_accepted, 100.0 * s->n_accepted / s->n_drafted,
                (int)s->n_accepted);
    if (q.finish == ENG_FINISH_CANCELLED) {
        fprintf(stderr, "hone run: interrupted\n");
        rc = 130;
        goto done;
    }
    rc = 0;
done:
    eng_free(e); /* after the request's DONE (or before any submit): the callback is not called again */
    if (sig_installed) sigaction(SIGINT, &old_int, NULL);
    hn_free(q.tok);
    hn_free(ids);
    pthread_cond_destroy(&q.cv);
    pthread_mutex_destroy(&q.mu);
    return rc;
}
