/* cmd_serve.c: `hone serve` — the OpenAI-, Responses- and Anthropic-
 * compatible HTTP server (src/server/) on one model.
 *
 *   hone serve -m FILE [--host 127.0.0.1] [--port 8080] [--api-key KEY]... [--cache-isolation auto|on|off]
 *              [--alias NAME] [--ctx N] [--max-tokens N] [-t THREADS]
 *              [--kv-bytes SIZE] [--verbose] [--test-engine]
 *
 * The engine (src/sched/engine.h) loads the model and generates;
 * --test-engine replaces it by the scripted engine of server/testeng.h (the
 * model file then only supplies the tokenizer and the chat template), for
 * protocol tests. Runs until SIGINT/SIGTERM, then drains (srv_stop). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "../core/alloc.h"
#include "../gguf/gguf.h"
#include "../sched/engine.h"
#include "../server/prompt.h"
#include "../server/server.h"
#include "../model/model.h"
#include "../server/testeng.h"
#include "../tokenizer/tokenizer.h"
#include "../tune/apply.h"
#include "cli.h"

static hn_status real_submit(void *ctx, const eng_request *r, eng_req_id *id, hn_err *err) {
    return eng_submit(ctx, r, id, err);
}
static void real_cancel(void *ctx, eng_req_id id) { eng_cancel(ctx, id); }
static void real_stats(void *ctx, eng_stats *out) { eng_get_stats(ctx, out); }
static int real_sessions(void *ctx, eng_session *out, int cap) { return eng_get_sessions(ctx, out, cap); }

/* model load: the tuned kernel parameters (a failure only warns) */
static hn_status serve_tune(void *ctx, struct model *m, hn_err *err) {
    (void)ctx;
    (void)err;
    cli_load_tune(m, "serve");
    return HN_OK;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: hone serve -m FILE [options]\n"
            "  -m, --model FILE     GGUF model to serve\n"
            "  --host ADDR          address to bind (default 127.0.0.1; 0.0.0.0 exposes it to the network)\n"
            "  --port N             port (default 8080; 0 picks a free one)\n"
            "  --api-key KEY        require this key (Authorization: Bearer KEY or x-api-key: KEY);\n"
            "                       also read from HONE_API_KEY. Give it again for more keys (up to 64,\n"
            "                       e.g. one per tenant): any of them is accepted\n"
            "  --cache-isolation auto|on|off  a prefix cache per API key: a request never reuses KV\n"
            "                       computed for another key's prompt, so cached_tokens and timing tell a\n"
            "                       client nothing about other keys' prompts (auto, the default: on when\n"
            "                       there is more than one key)\n"
            "  --alias NAME         model name reported to clients (default: the file's general.name)\n"
            "  --ctx N              context length per sequence (default: the model's)\n"
            "  --max-tokens N       most tokens one request may generate (default: no cap)\n"
            "  --default-max-tokens N  tokens to generate when a request names no limit (default 8192;\n"
            "                       0: until the context is full)\n"
            "  -t, --threads N      compute threads (default: all cores)\n"
            "  --device NAME        backend: auto (default: the best available), cpu, cuda\n"
            "  --cpu-moe N          " CLI_CPU_MOE_HELP "\n"
            "  --vram SIZE          " CLI_VRAM_HELP "\n"
            "  --devices LIST       " CLI_DEVICES_HELP "\n"
            "  --kv-bytes SIZE      cap on KV cache memory, e.g. 4G or 512M\n"
            "  --kv-type T          KV cache elements: f16 (default), f32, q8_0, k8v4 (8-bit K, 4-bit V)\n"
            "  --block-size N       KV positions per block (default 16)\n"
            "  --spec MODE          speculative decoding: " CLI_SPEC_HELP "\n"
            "  --draft FILE         " CLI_DRAFT_HELP "\n"
            "  --no-prefix-cache    compute every prompt from scratch (no reuse across requests). The cache\n"
            "                       is shared by all requests of one API key (of all requests without\n"
            "                       keys or with --cache-isolation off): a response's cached_tokens (and\n"
            "                       its speed) show whether another client's prompt began the same way;\n"
            "                       give clients that must not learn about each other keys of their own\n"
            "  --cache-idle S       drop cached prefixes and their memory after S seconds idle\n"
            "                       (default 300; 0: never)\n"
            "  --no-tune            built-in kernel parameters: neither tune nor use the tuning cache\n"
            "                       (also HONE_NO_TUNE=1; by default the first start tunes, up to 30 s)\n"
            "  --max-body SIZE      largest request body (default 32M)\n"
            "  --max-inflight SIZE  request bodies held at once by all requests in progress (default 256M);\n"
            "                       beyond it a request gets 503 (529 on /v1/messages) to retry later\n"
            "  --max-json-nodes N   most JSON objects + arrays in one body, counted before parsing\n"
            "                       (default 200000; 413 beyond)\n"
            "  --ping-ms N          keep-alive interval of a silent stream (default 5000; at most half the idle timeout)\n"
            "  --max-connections N  open connections in all (default 1024, within the open-file limit)\n"
            "  --max-conn-per-ip N  open connections per client address (default 64; none when bound to\n"
            "                       loopback, where every client is 127.0.0.1; 0: none)\n"
            "  --idle-timeout S     close a connection silent for S seconds (default 15)\n"
            "  --header-timeout S   a connection must deliver a whole request header within S seconds of\n"
            "                       its start or its previous response, however it trickles (default 10)\n"
            "  --http-threads N     threads serving connections (default 4; they never wait for the model)\n"
            "  --cors-origins LIST  origins (comma-separated, e.g. http://localhost:3000; * for any) whose\n"
            "                       pages may call the server; default none: no CORS headers, and a\n"
            "                       request with any other Origin header is refused (403)\n"
            "  --allowed-hosts LIST Host header names to serve beyond IP literals and localhost\n"
            "                       (comma-separated; * for any); others get 403 (DNS rebinding)\n"
            "  --shutdown-grace S   on SIGINT/SIGTERM: stop accepting, let running requests finish for S\n"
            "                       seconds (default 5), then end the rest with a final error in their\n"
            "                       API's format (streams: an error event; others: 503), within 3 s more\n"
            "  --verbose            log every request to stderr\n"
            "  --test-engine        scripted engine instead of the model (protocol tests only)\n");
}

static bool parse_size(const char *s, size_t *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0) return false;
    double m = 1;
    switch (*end) {
    case 'k': case 'K': m = 1024.0; end++; break;
    case 'm': case 'M': m = 1024.0 * 1024; end++; break;
    case 'g': case 'G': m = 1024.0 * 1024 * 1024; end++; break;
    case 't': case 'T': m = 1024.0 * 1024 * 1024 * 1024; end++; break;
    }
    if (*end == 'i' || *end == 'b' || *end == 'B') end++;
    if (*end) return false;
    *out = (size_t)(v * m);
    return true;
}

static bool parse_int(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

int cmd_serve(int argc, char **argv) {
    const char *model = NULL, *alias = NULL, *api_key = getenv("HONE_API_KEY"), *device = NULL;
    enum { MAX_KEYS = 64 };
    const char *keys[MAX_KEYS];
    int n_keys = 0;
    srv_config cfg = srv_default_config();
    long ctx = 0, max_tokens = 0, threads = 0;
    size_t kv_bytes = 0;
    bool test_engine = false, prefix_cache = true, no_tune = false;
    int kv_type = ENG_KV_F16, spec = ENG_SPEC_AUTO, cpu_moe = 0, n_ranks = 0;
    size_t vram = 0;
    const char *devices = NULL;
    const char *draft = NULL;
    long block_size = 0, cache_idle = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        long n;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--verbose") || !strcmp(a, "-v")) {
            cfg.log_requests = true;
            continue;
        } else if (!strcmp(a, "--test-engine")) {
            test_engine = true;
            continue;
        } else if (!strcmp(a, "--no-prefix-cache")) {
            prefix_cache = false;
            continue;
        } else if (!strcmp(a, "--no-tune")) {
            no_tune = true;
            continue;
        }
        if (!v) {
            fprintf(stderr, "hone serve: %s needs a value (or is unknown)\n", a);
            usage(stderr);
            return 2;
        }
        i++;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--host")) cfg.host = v;
        else if (!strcmp(a, "--port") && parse_int(v, 0, 65535, &n)) cfg.port = (int)n;
        else if (!strcmp(a, "--api-key") && *v && n_keys < MAX_KEYS) keys[n_keys++] = v;
        else if (!strcmp(a, "--cache-isolation") && (!strcmp(v, "auto") || !strcmp(v, "on") || !strcmp(v, "off")))
            cfg.cache_isolation = !strcmp(v, "auto") ? -1 : !strcmp(v, "on");
        else if (!strcmp(a, "--alias")) alias = v;
        else if (!strcmp(a, "--device")) device = v;
        else if (!strcmp(a, "--devices")) devices = v;
        else if (!strcmp(a, "--cors-origins")) cfg.cors_origins = v;
        else if (!strcmp(a, "--allowed-hosts")) cfg.allowed_hosts = v;
        else if (!strcmp(a, "--ctx") && parse_int(v, 16, 1L << 24, &ctx)) {}
        else if (!strcmp(a, "--max-tokens") && parse_int(v, 1, 1L << 24, &max_tokens)) {}
        else if (!strcmp(a, "--default-max-tokens") && parse_int(v, 0, 1L << 24, &n)) cfg.default_max_tokens = (int32_t)n;
        else if ((!strcmp(a, "-t") || !strcmp(a, "--threads")) && parse_int(v, 1, 4096, &threads)) {}
        else if (!strcmp(a, "--kv-bytes") && parse_size(v, &kv_bytes)) {}
        else if (!strcmp(a, "--kv-type") && eng_kv_type_from_name(v, &kv_type)) {}
        else if (!strcmp(a, "--spec")) {
            if (!cli_spec_parse("serve", v, &spec)) return 2;
        }
        else if (!strcmp(a, "--draft")) draft = v;
        else if (!strcmp(a, "--cpu-moe")) {
            if (!cli_cpu_moe_parse("serve", v, &cpu_moe)) return 2;
        }
        else if (!strcmp(a, "--vram")) {
            if (!cli_vram_parse("serve", v, &vram)) return 2;
        }
        else if (!strcmp(a, "--block-size") && parse_int(v, 1, 4096, &block_size)) {}
        else if (!strcmp(a, "--cache-idle") && parse_int(v, 0, 86400 * 30, &cache_idle)) {}
        else if (!strcmp(a, "--max-body") && parse_size(v, &cfg.max_body) && cfg.max_body >= 1024) {}
        else if (!strcmp(a, "--max-inflight") && parse_size(v, &cfg.max_inflight) && cfg.max_inflight >= 1024) {}
        else if (!strcmp(a, "--max-json-nodes") && parse_int(v, 16, 1L << 30, &n)) cfg.max_json_nodes = (int)n;
        else if (!strcmp(a, "--ping-ms") && parse_int(v, 10, 600000, &n)) cfg.ping_ms = (int)n;
        else if (!strcmp(a, "--max-connections") && parse_int(v, 1, 1 << 20, &n)) cfg.max_connections = (int)n;
        else if (!strcmp(a, "--max-conn-per-ip") && parse_int(v, 0, 1 << 20, &n)) cfg.max_conn_per_ip = (int)n;
        else if (!strcmp(a, "--idle-timeout") && parse_int(v, 1, 86400, &n)) cfg.idle_timeout_s = (int)n;
        else if (!strcmp(a, "--header-timeout") && parse_int(v, 1, 86400, &n)) cfg.header_timeout_s = (int)n;
        else if (!strcmp(a, "--shutdown-grace") && parse_int(v, 0, 3600, &n)) cfg.shutdown_grace_ms = (int)n * 1000;
        else if (!strcmp(a, "--http-threads") && parse_int(v, 1, 256, &n)) cfg.http_threads = (int)n;
        else {
            fprintf(stderr, "hone serve: bad option or value: %s %s\n", a, v);
            usage(stderr);
            return 2;
        }
    }
    if (!model) {
        fprintf(stderr, "hone serve: -m FILE is required\n");
        usage(stderr);
        return 2;
    }
    if (devices && !cli_devices_parse("serve", devices, &device, &n_ranks)) return 2;

    /* SIGINT/SIGTERM end the server: blocked here (every thread inherits
     * the mask) and awaited with sigwait below. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    /* every connection is a file descriptor: raise the soft limit to the hard one */
    struct rlimit rl;
    if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }

    hn_err err = {0};
    gguf_ctx *g = NULL;
    tok_vocab *vocab = NULL;
    teng *te = NULL;
    eng_engine *eng = NULL;
    srv_engine se;
    const gguf_ctx *meta;
    const tok_vocab *voc;
    int32_t n_ctx, kv_tokens = 0;
    bool resume = false;
    int rc = 1;
    if (test_engine) {
        if (gguf_open(model, &g, &err) != HN_OK || tok_load(g, &vocab, &err) != HN_OK) {
            fprintf(stderr, "hone serve: %s: %s\n", model, err.msg);
            goto out;
        }
        int64_t trained = 0;
        char key[128];
        const char *arch = gguf_get_str(g, "general.architecture");
        snprintf(key, sizeof key, "%s.context_length", arch ? arch : "llama");
        if (!gguf_get_i64(g, key, &trained) || trained <= 0) trained = 4096;
        n_ctx = ctx > 0 ? (int32_t)ctx : (int32_t)(trained < 32768 ? trained : 32768);
        if (teng_create(vocab, n_ctx, &te, &err) != HN_OK) {
            fprintf(stderr, "hone serve: %s\n", err.msg);
            goto out;
        }
        se = teng_engine(te);
        meta = g;
        voc = vocab;
    } else {
        eng_params ep = eng_default_params();
        ep.model_path = model;
        ep.n_threads = (int)threads;
        ep.device = device;
        ep.n_ctx = (int32_t)ctx;
        ep.kv_max_bytes = kv_bytes;
        ep.kv_type = kv_type;
        ep.spec = spec;
        ep.draft_path = draft;
        ep.cpu_moe = cpu_moe;
        ep.mem_budget = vram;
        ep.n_ranks = n_ranks;
        ep.block_size = (int)block_size;
        ep.prefix_cache = prefix_cache;
        if (cache_idle >= 0) ep.cache_idle_ms = cache_idle ? (int32_t)(cache_idle * 1000) : -1;
        if (!no_tune) ep.on_load = serve_tune;
        if (eng_create(&ep, &eng, &err) != HN_OK) {
            fprintf(stderr, "hone serve: %s: %s\n", model, err.msg);
            goto out;
        }
        cli_device_note("serve", device, eng_device(eng));
        se = (srv_engine){.ctx = eng, .submit = real_submit, .cancel = real_cancel, .stats = real_stats,
                          .sessions = real_sessions};
        meta = eng_gguf(eng);
        voc = eng_vocab(eng);
        n_ctx = eng_n_ctx(eng);
        eng_stats es;
        eng_get_stats(eng, &es);
        if (es.blocks_max > 0 && es.block_size > 0 && (int64_t)es.blocks_max * es.block_size < INT32_MAX)
            kv_tokens = es.blocks_max * es.block_size;
        resume = es.ckpt_max > 0; /* a hybrid with the prefix cache: it keeps states where a next turn resumes */
    }
    {
        prm_model pm;
        if (prm_model_init(&pm, meta, voc, &err) != HN_OK) {
            fprintf(stderr, "hone serve: the model's chat template: %s\n", err.msg);
            goto out;
        }
        pm.resume = resume;
        const char *name = alias ? alias : gguf_get_str(meta, "general.name");
        cfg.model_name = name && *name ? name : "hone";
        if (n_keys) { /* --api-key given: those keys (HONE_API_KEY is the default of one) */
            cfg.api_key = keys[0];
            cfg.api_keys = keys + 1;
            cfg.n_api_keys = n_keys - 1;
            api_key = keys[0];
        } else {
            cfg.api_key = api_key;
        }
        cfg.n_ctx = n_ctx;
        cfg.kv_tokens = kv_tokens;
        cfg.max_tokens = (int32_t)max_tokens;
        srv_server *srv;
        if (srv_start(&cfg, &se, &pm, &srv, &err) != HN_OK) {
            fprintf(stderr, "hone serve: %s\n", err.msg);
            prm_model_free(&pm);
            goto out;
        }
        bool v6 = strchr(cfg.host, ':') != NULL;
        bool isolated = cfg.cache_isolation < 0 ? n_keys > 1 : cfg.cache_isolation > 0;
        fprintf(stderr, "hone serve: %s on http://%s%s%s:%d (context %d%s%s%s; tool calls: %s)\n", cfg.model_name,
                v6 ? "[" : "", cfg.host, v6 ? "]" : "", srv_port(srv), n_ctx,
                n_keys > 1 ? ", API keys required" : api_key && *api_key ? ", API key required" : "",
                prefix_cache && isolated && api_key && *api_key ? ", prefix cache per key" : "",
                test_engine ? ", TEST ENGINE" : "", tc_format_name(pm.det.format));
        bool local = !strcmp(cfg.host, "localhost") || !strncmp(cfg.host, "127.", 4) || !strcmp(cfg.host, "::1");
        if (!local && !(api_key && *api_key))
            fprintf(stderr, "hone serve: WARNING: listening on %s without an API key: anyone who can reach this "
                            "port can use the model (set --api-key or HONE_API_KEY)\n", cfg.host);
        int sig = 0;
        sigwait(&sigs, &sig);
        fprintf(stderr, "hone serve: stopping (signal %d)\n", sig);
        srv_stop(srv);
        prm_model_free(&pm);
        rc = 0;
    }
out:
    teng_free(te);
    eng_free(eng);
    tok_free(vocab);
    gguf_close(g);
    return rc;
}
