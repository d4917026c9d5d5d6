/* cmd_bench.c: `hone bench MODE`: built-in end-to-end benchmarks.
 *
 *   hone bench agents -m FILE [-S sessions] [-P prefix] [-T turns] [-U user]
 *                     [-G generated] [--no-prefix-cache] [engine options]
 *
 * `agents` replays the shape of coding-agent traffic through the engine:
 * S sessions run at once; every session's first prompt is a shared
 * "system + tools" prefix of P tokens plus U tokens of its own; each turn
 * generates G tokens (greedy, end-of-generation ignored), then the session
 * sends its whole conversation again plus U new tokens, for T turns. Token
 * ids are seeded random text ids, so runs are reproducible. It reports total
 * time, TTFT p50/p95, prompt tokens sent vs computed (the cache hit rate),
 * aggregate decode tokens/s, peak memory and memory once the sessions end
 * (with the cache kept, and after dropping it as the idle timer would).
 *
 * The defaults mimic a coding agent scaled down to a 2-core CPU and a
 * Qwen3-0.6B-sized model (about a minute): a long shared prefix, short
 * additions and replies (agents send ~100 prompt tokens per generated one).
 *
 * Other modes (a llama-bench-like kernel/model mode) plug into the table
 * below. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../core/alloc.h"
#include "../core/clock.h"
#include "../sched/engine.h"
#include "../tokenizer/tokenizer.h"
#include "cli.h"

/* ---- shared helpers ---- */

static bool parse_long(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

static bool parse_bytes(const char *s, size_t *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0) return false;
    double m = 1;
    if (*end == 'k' || *end == 'K') m = 1024.0, end++;
    else if (*end == 'm' || *end == 'M') m = 1024.0 * 1024, end++;
    else if (*end == 'g' || *end == 'G') m = 1024.0 * 1024 * 1024, end++;
    if (*end) return false;
    *out = (size_t)(v * m);
    return true;
}

/* VmRSS and VmHWM of this process in bytes (0 if unknown). */
static void proc_mem(size_t *rss, size_t *hwm) {
    *rss = *hwm = 0;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        unsigned long kb;
        if (sscanf(line, "VmRSS: %lu kB", &kb) == 1) *rss = (size_t)kb * 1024;
        if (sscanf(line, "VmHWM: %lu kB", &kb) == 1) *hwm = (size_t)kb * 1024;
    }
    fclose(f);
}

static double mib(size_t b) { return (double)b / (1024.0 * 1024.0); }

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double percentile(double *v, int n, double p) {
    if (n <= 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    int i = (int)(p * (n - 1) + 0.5);
    return v[i];
}

/* ---- agents ---- */

typedef struct session {
    int32_t *conv;      /* the conversation so far */
    int32_t n_conv, cap;
    int turn;
    bool busy, done_turn;
    eng_req_stats st;
    eng_finish fin;
    int32_t n_reply;
} session;

typedef struct agents_run {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    session *s;
} agents_run;

typedef struct sess_ctx {
    agents_run *run;
    int idx;
} sess_ctx;

static void on_event(void *ctx, const eng_event *ev) {
    sess_ctx *c = ctx;
    agents_run *r = c->run;
    session *s = &r->s[c->idx];
    pthread_mutex_lock(&r->mu);
    if (ev->type == ENG_EV_TOKEN) {
        if (s->n_conv < s->cap) s->conv[s->n_conv++] = ev->token;
        s->n_reply++;
    } else {
        s->st = ev->stats;
        s->fin = ev->finish;
        s->done_turn = true;
        pthread_cond_signal(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
}

static uint64_t rng_state;
static int32_t rand_token(int32_t lo, int32_t hi) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return lo + (int32_t)(rng_state % (uint64_t)(hi - lo));
}

static void agents_usage(FILE *f) {
    fprintf(f,
            "usage: hone bench agents -m FILE [options]\n"
            "  -S N                concurrent sessions (default 4)\n"
            "  -P N                shared system+tools prefix tokens (default 1024)\n"
            "  -T N                turns per session (default 3)\n"
            "  -U N                new tokens each turn adds (default 48)\n"
            "  -G N                tokens generated each turn (default 16)\n"
            "  --no-prefix-cache   compute every prompt from scratch\n"
            "  -t, --threads N     compute threads (default: all cores)\n"
            "  --device NAME       backend: auto (default: the best available), cpu, cuda\n"
            "  --cpu-moe N         " CLI_CPU_MOE_HELP "\n"
            "  --vram SIZE         " CLI_VRAM_HELP "\n"
            "  --devices LIST      " CLI_DEVICES_HELP "\n"
            "  --block-size N      KV positions per block (default: the engine's)\n"
            "  --kv-type T         f16 (default), f32, q8_0, k8v4\n"
            "  --spec MODE         speculative decoding: " CLI_SPEC_HELP "\n"
            "  --draft FILE        " CLI_DRAFT_HELP "\n"
            "  --step-tokens N     token budget per engine step (default: the engine's)\n"
            "  --kv-bytes SIZE     cap on KV memory (e.g. 2G)\n"
            "  --ctx N             context per sequence (default: enough for the workload)\n"
            "  --seed N            token seed (default 1)\n");
}

static int bench_agents(int argc, char **argv) {
    const char *model = NULL, *device = NULL;
    long S = 4, P = 1024, T = 3, U = 48, G = 16, threads = 0, bsz = 0, step = 0, ctx = 0, seed = 1;
    int kv_type = ENG_KV_F16, spec = ENG_SPEC_AUTO, cpu_moe = 0, n_ranks = 0;
    size_t vram = 0;
    const char *devices = NULL;
    const char *draft = NULL;
    size_t kv_bytes = 0;
    bool prefix = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            agents_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--no-prefix-cache")) {
            prefix = false;
            continue;
        }
        bool ok = v != NULL;
        if (ok) {
            i++;
            if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = v;
            else if (!strcmp(a, "--device")) device = v;
            else if (!strcmp(a, "--devices")) devices = v;
            else if (!strcmp(a, "-S")) ok = parse_long(v, 1, 256, &S);
            else if (!strcmp(a, "-P")) ok = parse_long(v, 0, 1 << 22, &P);
            else if (!strcmp(a, "-T")) ok = parse_long(v, 1, 10000, &T);
            else if (!strcmp(a, "-U")) ok = parse_long(v, 1, 1 << 22, &U);
            else if (!strcmp(a, "-G")) ok = parse_long(v, 1, 1 << 20, &G);
            else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) ok = parse_long(v, 1, 4096, &threads);
            else if (!strcmp(a, "--block-size")) ok = parse_long(v, 1, 4096, &bsz);
            else if (!strcmp(a, "--step-tokens")) ok = parse_long(v, 1, 65536, &step);
            else if (!strcmp(a, "--ctx")) ok = parse_long(v, 16, 1L << 24, &ctx);
            else if (!strcmp(a, "--seed")) ok = parse_long(v, 0, 1L << 40, &seed);
            else if (!strcmp(a, "--kv-type")) ok = eng_kv_type_from_name(v, &kv_type);
            else if (!strcmp(a, "--spec")) {
                if (!cli_spec_parse("bench agents", v, &spec)) return 2;
            }
            else if (!strcmp(a, "--draft")) draft = v;
            else if (!strcmp(a, "--cpu-moe")) {
                if (!cli_cpu_moe_parse("bench agents", v, &cpu_moe)) return 2;
            }
            else if (!strcmp(a, "--vram")) {
                if (!cli_vram_parse("bench agents", v, &vram)) return 2;
            }
            else if (!strcmp(a, "--kv-bytes")) ok = parse_bytes(v, &kv_bytes);
            else ok = false;
        }
        if (!ok) {
            fprintf(stderr, "hone bench agents: bad option or value: %s %s\n", a, v ? v : "");
            agents_usage(stderr);
            return 2;
        }
    }
    if (!model) {
        fprintf(stderr, "hone bench agents: -m FILE is required\n");
        agents_usage(stderr);
        return 2;
    }
    if (devices && !cli_devices_parse("bench agents", devices, &device, &n_ranks)) return 2;
    long per_session = P + T * (U + G) + 1;
    if (ctx == 0) ctx = per_session + 16;
    if (per_session > ctx) {
        fprintf(stderr, "hone bench agents: a session reaches %ld tokens, over the context of %ld\n", per_session, ctx);
        return 2;
    }

    eng_params ep = eng_default_params();
    ep.model_path = model;
    ep.device = device;
    ep.n_threads = (int)threads;
    ep.n_ctx = (int32_t)ctx;
    ep.block_size = (int)bsz;
    ep.step_tokens = (int32_t)step;
    ep.kv_max_bytes = kv_bytes;
    ep.kv_type = kv_type;
    ep.spec = spec;
    ep.draft_path = draft;
    ep.cpu_moe = cpu_moe;
    ep.mem_budget = vram;
    ep.n_ranks = n_ranks;
    ep.prefix_cache = prefix;
    ep.cache_idle_ms = -1; /* this benchmark drops the cache itself, at the end */
    eng_engine *e;
    hn_err err = {0};
    if (eng_create(&ep, &e, &err) != HN_OK) {
        fprintf(stderr, "hone bench agents: %s: %s\n", model, err.msg);
        return 1;
    }
    cli_device_note("bench agents", device, eng_device(e));
    int32_t n_vocab = tok_n_vocab(eng_vocab(e));
    /* warm-up: one token through the model pages its weights in, so the
     * starting memory is the model's and every later change is the KV's */
    {
        session w = {0};
        agents_run wr = {.s = &w};
        pthread_mutex_init(&wr.mu, NULL);
        pthread_cond_init(&wr.cv, NULL);
        sess_ctx wc = {&wr, 0};
        int32_t one = n_vocab > 2000 ? 1000 : 1, buf[2];
        w.conv = buf;
        w.cap = 2;
        eng_request rq = {.prompt = &one, .n_prompt = 1, .max_tokens = 1, .ignore_eog = true, .on_event = on_event,
                          .ctx = &wc};
        rq.sampling = smp_default_params();
        eng_req_id id;
        if (eng_submit(e, &rq, &id, &err) == HN_OK) {
            pthread_mutex_lock(&wr.mu);
            while (!w.done_turn) pthread_cond_wait(&wr.cv, &wr.mu);
            pthread_mutex_unlock(&wr.mu);
        }
        pthread_cond_destroy(&wr.cv);
        pthread_mutex_destroy(&wr.mu);
        eng_stats ws;
        for (int i = 0; i < 200; i++) {
            eng_get_stats(e, &ws);
            if (ws.n_running == 0 && ws.n_waiting == 0) break;
            usleep(5000);
        }
        eng_trim(e);
    }
    size_t rss0, hwm0;
    proc_mem(&rss0, &hwm0);
    eng_stats es0;
    eng_get_stats(e, &es0);
    int32_t lo = n_vocab > 2000 ? 1000 : 1, hi = n_vocab > 2000 ? (n_vocab < 100000 ? n_vocab - 500 : 100000) : n_vocab;
    rng_state = 0x9e3779b97f4a7c15ULL ^ (uint64_t)seed * 0x100000001b3ULL;
    if (!rng_state) rng_state = 1;

    agents_run run;
    pthread_mutex_init(&run.mu, NULL);
    pthread_cond_init(&run.cv, NULL);
    run.s = hn_calloc((size_t)S, sizeof(session));
    sess_ctx *ctxs = hn_calloc((size_t)S, sizeof(sess_ctx));
    int32_t *prefix_toks = hn_malloc(sizeof(int32_t) * (size_t)(P + 1));
    int n_req = (int)(S * T);
    double *ttft = hn_malloc(sizeof(double) * (size_t)n_req);
    double *ttft_later = hn_malloc(sizeof(double) * (size_t)n_req);
    double *dec_rate = hn_malloc(sizeof(double) * (size_t)n_req);
    int n_rate = 0;
    if (!run.s || !ctxs || !prefix_toks || !ttft || !ttft_later || !dec_rate) {
        fprintf(stderr, "hone bench agents: out of memory\n");
        return 1;
    }
    for (long i = 0; i < P; i++) prefix_toks[i] = rand_token(lo, hi);
    for (long i = 0; i < S; i++) {
        session *s = &run.s[i];
        s->cap = (int32_t)per_session;
        s->conv = hn_malloc(sizeof(int32_t) * (size_t)s->cap);
        if (!s->conv) {
            fprintf(stderr, "hone bench agents: out of memory\n");
            return 1;
        }
        memcpy(s->conv, prefix_toks, sizeof(int32_t) * (size_t)P);
        s->n_conv = (int32_t)P;
        ctxs[i] = (sess_ctx){&run, (int)i};
    }
    fprintf(stderr,
            "hone bench agents: %ld sessions x %ld turns; shared prefix %ld, +%ld per turn, %ld generated; prefix cache %s; "
            "kv %s\n",
            S, T, P, U, G, prefix ? "on" : "off", eng_kv_type_name(kv_type));

    int n_ttft = 0, n_later = 0, n_active = 0, failures = 0;
    uint64_t sent = 0, cached = 0, generated = 0;
    double t0 = hn_now_ms();
    size_t peak_rss = 0;
    pthread_mutex_lock(&run.mu);
    for (;;) {
        /* start the next turn of every idle session */
        for (long i = 0; i < S; i++) {
            session *s = &run.s[i];
            if (s->busy || s->turn >= T) continue;
            for (long k = 0; k < U; k++) s->conv[s->n_conv++] = rand_token(lo, hi);
            eng_request rq = {.prompt = s->conv, .n_prompt = s->n_conv, .max_tokens = (int32_t)G,
                              .ignore_eog = true, .on_event = on_event, .ctx = &ctxs[i]};
            rq.sampling = smp_default_params();
            rq.sampling.temp = 0;
            s->busy = true;
            s->done_turn = false;
            s->n_reply = 0;
            eng_req_id id;
            pthread_mutex_unlock(&run.mu);
            hn_status st = eng_submit(e, &rq, &id, &err);
            pthread_mutex_lock(&run.mu);
            if (st != HN_OK) {
                fprintf(stderr, "hone bench agents: submit: %s\n", err.msg);
                s->busy = false;
                s->turn = (int)T;
                failures++;
                continue;
            }
            n_active++;
        }
        if (n_active == 0) break;
        struct timespec ts;
        hn_deadline_ms(&ts, 100);
        pthread_cond_timedwait(&run.cv, &run.mu, &ts);
        size_t rss, hwm;
        proc_mem(&rss, &hwm);
        if (rss > peak_rss) peak_rss = rss;
        for (long i = 0; i < S; i++) {
            session *s = &run.s[i];
            if (!s->busy || !s->done_turn) continue;
            s->busy = false;
            s->turn++;
            n_active--;
            if (s->fin != ENG_FINISH_LENGTH) failures++;
            sent += (uint64_t)s->st.n_prompt;
            cached += (uint64_t)s->st.n_cached;
            generated += (uint64_t)s->st.n_generated;
            ttft[n_ttft++] = s->st.t_first_ms;
            if (s->turn > 1) ttft_later[n_later++] = s->st.t_first_ms;
            if (s->st.n_generated > 1 && s->st.t_total_ms > s->st.t_first_ms)
                dec_rate[n_rate++] = (s->st.n_generated - 1) / ((s->st.t_total_ms - s->st.t_first_ms) / 1e3);
        }
    }
    pthread_mutex_unlock(&run.mu);
    double total_ms = hn_now_ms() - t0;

    /* the last DONE comes before the engine publishes that step's counters */
    eng_stats es;
    for (int i = 0; i < 200; i++) {
        eng_get_stats(e, &es);
        if (es.n_running == 0 && es.n_waiting == 0 && es.blocks_used == 0) break;
        usleep(5000);
    }
    size_t rss_end, hwm;
    proc_mem(&rss_end, &hwm);
    size_t kv_end = es.kv_bytes;
    eng_trim(e);
    eng_stats et;
    eng_get_stats(e, &et);
    size_t rss_trim;
    proc_mem(&rss_trim, &hwm);

    double p50 = percentile(ttft, n_ttft, 0.5), p95 = percentile(ttft, n_ttft, 0.95);
    double l50 = percentile(ttft_later, n_later, 0.5);
    uint64_t computed_prompt = sent - cached;
    printf("hone bench agents: %ld sessions, %ld turns, prefix %ld, +%ld/turn, gen %ld, prefix cache %s, kv %s, "
           "block %d\n",
           S, T, P, U, G, prefix ? "on" : "off", eng_kv_type_name(kv_type), (int)es.block_size);
    printf("  device              %s\n", eng_device(e));
    printf("  total time          %.2f s\n", total_ms / 1e3);
    printf("  TTFT p50 / p95      %.0f / %.0f ms (turns 2+: p50 %.0f ms)\n", p50, p95, l50);
    printf("  prompt tokens       %llu sent, %llu computed, %llu from cache: hit rate %.1f%%\n", (unsigned long long)sent,
           (unsigned long long)computed_prompt, (unsigned long long)cached, sent ? 100.0 * (double)cached / (double)sent : 0.0);
    printf("  model tokens        %llu computed in %llu steps (%llu preemptions, %llu evictions)\n",
           (unsigned long long)(es.computed_tokens - es0.computed_tokens), (unsigned long long)(es.steps - es0.steps), (unsigned long long)es.preemptions,
           (unsigned long long)es.evictions);
    printf("  decode              %llu tokens, %.2f tok/s aggregate over the run; per session %.2f tok/s "
           "(median, first token to last)\n",
           (unsigned long long)generated, (double)generated / (total_ms / 1e3), percentile(dec_rate, n_rate, 0.5));
    printf("  KV memory           peak %.1f MiB; after the sessions end %.1f MiB (%d cached blocks kept); "
           "after dropping the cache %.1f MiB\n",
           mib(es.kv_peak_bytes), mib(kv_end), (int)es.blocks_cached, mib(et.kv_bytes));
    printf("  speculation         %s: %llu drafted, %llu accepted (decode steps saved), %llu verify steps\n",
           eng_spec_name(es.spec), (unsigned long long)(es.spec_drafted - es0.spec_drafted),
           (unsigned long long)(es.spec_accepted - es0.spec_accepted),
           (unsigned long long)(es.spec_verify_steps - es0.spec_verify_steps));
    if (es.draft_loaded)
        printf("  draft model         %.1f MiB weights (file) + %.1f MiB heap, KV peak %.1f MiB; %llu drafter steps "
               "(%llu rows), %llu tokens proposed\n",
               mib(es.draft_file_bytes), mib(es.draft_model_bytes), mib(es.draft_kv_peak_bytes),
               (unsigned long long)(es.draft_steps - es0.draft_steps), (unsigned long long)(es.draft_tokens - es0.draft_tokens),
               (unsigned long long)(es.draft_drafted - es0.draft_drafted));
    if (es.mtp_loaded)
        printf("  MTP layer           KV peak %.1f MiB; %llu MTP steps (%llu rows, catch-up included), %llu tokens "
               "proposed, %llu requests stopped following\n",
               mib(es.mtp_kv_peak_bytes), (unsigned long long)(es.mtp_steps - es0.mtp_steps),
               (unsigned long long)(es.mtp_tokens - es0.mtp_tokens), (unsigned long long)(es.mtp_drafted - es0.mtp_drafted),
               (unsigned long long)(es.mtp_left_out - es0.mtp_left_out));
    if (es.dflash_loaded)
        printf("  DFlash drafter      KV peak %.1f MiB; %llu drafter steps (%llu rows, injection included), %llu blocks, "
               "%llu tokens proposed, %llu requests stopped following\n",
               mib(es.dflash_kv_peak_bytes), (unsigned long long)(es.dflash_steps - es0.dflash_steps),
               (unsigned long long)(es.dflash_tokens - es0.dflash_tokens),
               (unsigned long long)(es.dflash_blocks - es0.dflash_blocks),
               (unsigned long long)(es.dflash_drafted - es0.dflash_drafted),
               (unsigned long long)(es.dflash_left_out - es0.dflash_left_out));
    if (es.ckpt_max > 0)
        printf("  recurrent state     peak %.1f MiB (live slots + checkpoints); after the sessions end %.1f MiB, "
               "%d of %d checkpoints, %llu prefixes resumed from one; after dropping the cache %.1f MiB\n",
               mib(es.state_peak_bytes), mib(es.state_bytes), (int)es.ckpts, (int)es.ckpt_max,
               (unsigned long long)es.ckpt_hits, mib(et.state_bytes));
    printf("  process RSS         start (model loaded, warmed) %.1f MiB, peak %.1f MiB, after the sessions end %.1f MiB, "
           "after dropping the cache %.1f MiB\n",
           mib(rss0), mib(peak_rss > hwm ? peak_rss : hwm), mib(rss_end), mib(rss_trim));
    printf("  memory back to start  %s (RSS %+.1f MiB vs start, KV %.1f MiB)\n",
           rss_trim <= rss0 + (size_t)(32u << 20) ? "yes" : "no", (double)((long long)rss_trim - (long long)rss0) / 1048576.0,
           mib(et.kv_bytes));
    if (failures) printf("  %d turns did not finish normally\n", failures);

    for (long i = 0; i < S; i++) hn_free(run.s[i].conv);
    hn_free(run.s);
    hn_free(ctxs);
    hn_free(prefix_toks);
    hn_free(ttft);
    hn_free(ttft_later);
    hn_free(dec_rate);
    eng_free(e);
    pthread_cond_destroy(&run.cv);
    pthread_mutex_destroy(&run.mu);
    return failures ? 1 : 0;
}

/* ---- modes ---- */

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} modes[] = {
    {"agents", bench_agents, "concurrent agent sessions sharing a prefix: TTFT, cache hit rate, memory"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: hone bench -m FILE [-p 512] [-n 128] [-t N] [--depth D] ...   prefill and decode speed\n"
               "       hone bench MODE [options]   (hone bench MODE --help for its options)\nmodes:\n");
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) fprintf(f, "  %-10s %s\n", modes[i].name, modes[i].help);
}

int cmd_bench(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++)
        if (!strcmp(argv[1], modes[i].name)) return modes[i].fn(argc - 1, argv + 1);
    /* no mode: options of the model benchmark (llama-bench's shape) */
    if (argv[1][0] == '-') return cmd_bench_model(argc, argv);
    fprintf(stderr, "hone bench: unknown mode '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
