/* server.h: the HTTP server behind `hone serve`.
 *
 * libmicrohttpd with a small pool of epoll threads (http_threads) that
 * never block: a request waiting for the engine, or a stream with nothing
 * to send, is suspended (MHD_suspend_connection) and resumed by the
 * engine's callback when tokens arrive, or by the server's ticker thread
 * when a keep-alive ping is due, the client is gone or the server stops.
 * An idle socket therefore costs a file descriptor and a little memory,
 * not a thread: max_connections (default 1024, clamped to the process's
 * file limit) is shared by everyone, max_conn_per_ip bounds one client
 * address (default 64, but none when bound to loopback, where every client
 * is 127.0.0.1), and a connection silent for idle_timeout_s (default 15)
 * is closed, and one that has not delivered a whole request header within
 * header_timeout_s (default 10) of its start or its previous response is
 * cut, however slowly it trickles bytes.
 * Bound to 127.0.0.1 unless told otherwise. Routes:
 *   GET|HEAD /            200 (probes by Claude Code and others)
 *   GET /health           {"status":"ok", "running": N, and with engine stats
 *                         "kv": {"blocks_used", "blocks_cached", "blocks_total", "blocks_max"}}
 *   GET /v1/models        the loaded model under its alias (also /models, /v1/models/{id})
 *   GET /api/version, /api/tags   minimal Ollama-style probes
 *   POST /v1/chat/completions, /v1/completions, /v1/responses,
 *        /v1/messages (any query string, e.g. ?beta=true), /v1/messages/count_tokens
 *   POST /v1/chat/completions/input_tokens, /v1/responses/input_tokens  {"input_tokens": N}
 *        (each also without the /v1 prefix)
 *   POST /v1/debug/render  the prompt a request would produce (?api=chat|completions|responses|messages)
 *   GET /metrics, /v1/hone/status, and the dashboard at /   (metrics.h)
 * Limits: the request line and headers are capped at max_header (413 in
 * JSON; libmicrohttpd's own HTML reply only beyond twice that), conflicting
 * Content-Length / Transfer-Encoding framing is a 400; the API key (when set) is checked on the headers before any body is read
 * (Authorization: Bearer or x-api-key, compared in constant time); bodies
 * over max_body are refused with 413; bodies must be valid UTF-8 JSON with
 * at most max_json_nodes objects and arrays (counted in one pass before
 * the parser allocates: 413 beyond). Each request holds its body's size
 * against max_inflight from its headers to its end; one that would go
 * over is refused with 503 (529 on /v1/messages), which clients retry.
 *
 * Browsers: no CORS header unless the request's Origin is in cors_origins
 * (then it is echoed, and a preflight gets the methods and the headers it
 * asked for); a request carrying any other Origin is refused (403), so
 * that a page cannot drive a keyless server with "simple" requests; POST
 * bodies must be Content-Type: application/json (415 otherwise); the Host
 * header must be an IP literal, localhost or in allowed_hosts (403 else:
 * DNS rebinding).
 *
 * Shared servers: the prefix cache is shared by every client, so a
 * response's cached_tokens (and its latency) tell whether another client's
 * prompt began with the same tokens. Where clients must not learn about
 * each other, run without it (hone serve --no-prefix-cache).
 *
 * Generation goes through srv_engine: the engine.h functions in production,
 * a scripted engine in tests. Each request gets its tokens on the engine
 * thread's callback, queued to the HTTP thread, which runs the gen pipeline
 * and writes SSE. Streams start with message_start / response.created at
 * once and send keep-alives (ping events or SSE comments) every ping_ms of
 * silence; a client that disconnects has its generation cancelled. */
#ifndef HN_SERVER_SERVER_H
#define HN_SERVER_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../core/status.h"
#include "../sample/sample.h"
#include "../sched/engine.h"
#include "prompt.h"

/* The engine as the server uses it (mirrors engine.h). */
typedef struct srv_engine {
    void *ctx;
    hn_status (*submit)(void *ctx, const eng_request *r, eng_req_id *id, hn_err *err);
    void (*cancel)(void *ctx, eng_req_id id);
    /* optional (NULL: not reported): eng_get_stats / eng_get_sessions, for
     * /health's KV figures, /metrics, /v1/hone/status and the dashboard (metrics.h) */
    void (*stats)(void *ctx, eng_stats *out);
    int (*sessions)(void *ctx, eng_session *out, int cap);
} srv_engine;

typedef struct srv_config {
    const char *host;        /* default "127.0.0.1" */
    int port;                /* 0: any free port (see srv_port) */
    const char *api_key;     /* NULL or "" (and no api_keys): no authentication */
    const char *const *api_keys; /* more accepted keys, n_api_keys of them (e.g. one per tenant) */
    int n_api_keys;
    int cache_isolation;     /* prefix cache per API key (a key's requests never reuse KV computed for
                                another key's prompt): -1 (default) when more than one key is
                                accepted, 0 shared by all, 1 per key */
    const char *model_name;  /* the name reported to clients (any requested name maps to it) */
    int32_t n_ctx;           /* context length: longer prompts are refused */
    int32_t kv_tokens;       /* positions the whole KV cache can hold (0: unknown): a prompt that
                                cannot fit is refused (400), max_tokens is cut to what fits */
    int32_t max_tokens;      /* cap per request (<= 0: no cap beyond the context) */
    int32_t default_max_tokens; /* when the request names none (default 8192; <= 0: until the context is full) */
    size_t max_body;         /* default 32 MiB */
    size_t max_inflight;     /* bodies of all requests in progress, read or held (default 256 MiB, >= max_body) */
    int max_json_nodes;      /* objects + arrays in one body, counted before parsing (default 200000) */
    size_t max_header;       /* per-connection header memory, default 64 KiB */
    int max_connections;     /* default 1024 (clamped to RLIMIT_NOFILE less a margin) */
    int max_conn_per_ip;     /* per client address; -1 (default): 64, or none on a loopback bind; 0: none */
    int idle_timeout_s;      /* a connection silent this long is closed (default 15) */
    int header_timeout_s;    /* a connection gets this long, from its start or its previous
                                response, to deliver a whole request header, however slowly
                                it trickles (default 10) */
    int http_threads;        /* epoll threads serving connections (default 4) */
    int shutdown_grace_ms;   /* srv_stop lets running requests finish this long (default 5000) */
    int ping_ms;             /* keep-alive interval while nothing is produced (default 5000) */
    smp_params sampling;     /* defaults for fields a request leaves out */
    bool log_requests;       /* one line per request (client bytes escaped) */
    void *log_file;          /* FILE * for those lines; NULL: stderr */
    const char *cors_origins; /* comma-separated origins allowed to call from a browser ("*": any); NULL: none */
    const char *allowed_hosts; /* comma-separated extra Host names ("*": any); IP literals and localhost always pass */
} srv_config;

typedef struct srv_server srv_server;

/* Defaults for every field. */
srv_config srv_default_config(void);

/* Starts listening. eng and pm are borrowed and must outlive the server. */
hn_status srv_start(const srv_config *cfg, const srv_engine *eng, const prm_model *pm, srv_server **out, hn_err *err);
/* The port actually bound. */
int srv_port(const srv_server *s);
/* Generations in progress (for tests and status). */
int srv_running(const srv_server *s);
/* Stops: no new connections (and 503 on kept-alive ones); running requests
 * get shutdown_grace_ms to finish, then are cancelled and ended cleanly,
 * each in its API's format (a stream's final error event, a 503 body),
 * with up to 3 s more to send that; then closes everything and frees. */
void srv_stop(srv_server *s);

/* Writes n bytes for a log line into out (cap > 0, NUL-terminated, cut to
 * fit): printable ASCII as is, every other byte (escape sequences, CR, LF,
 * UTF-8) as \xNN, backslash as \\. Returns the length written. */
size_t srv_log_escape(const char *s, size_t n, char *out, size_t cap);

/* Constant-time comparison of a presented key with the expected one. */
bool srv_key_equal(const char *given, size_t given_len, const char *want);
/* The objects and arrays in JSON text (brackets outside strings), counting
 * no further than limit + 1. */
size_t srv_json_containers(const char *s, size_t n, size_t limit);
/* Whether n bytes are valid UTF-8 (no overlongs, surrogates or > U+10FFFF). */
bool srv_utf8_valid(const char *s, size_t n);

#endif
