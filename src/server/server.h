/* server.h: the HTTP server behind `hone serve`.
 *
 * libmicrohttpd, one thread per connection (keep-alive, many concurrent
 * connections, bounded by max_connections), bound to 127.0.0.1 unless told
 * otherwise. Routes:
 *   GET|HEAD /            200 (probes by Claude Code and others)
 *   GET /health           {"status":"ok"}
 *   GET /v1/models        the loaded model under its alias (also /models, /v1/models/{id})
 *   GET /api/version, /api/tags   minimal Ollama-style probes
 *   POST /v1/chat/completions, /v1/completions, /v1/responses,
 *        /v1/messages (any query string, e.g. ?beta=true), /v1/messages/count_tokens
 *   POST /v1/chat/completions/input_tokens, /v1/responses/input_tokens  {"input_tokens": N}
 *        (each also without the /v1 prefix)
 *   POST /v1/debug/render  the prompt a request would produce (?api=chat|completions|responses|messages)
 *   GET /metrics, /v1/hone/status, and the dashboard at /   (metrics.h)
 * Limits: request headers are capped by the per-connection memory limit;
 * the API key (when set) is checked on the headers before any body is read
 * (Authorization: Bearer or x-api-key, compared in constant time); bodies
 * over max_body are refused with 413; bodies must be valid UTF-8 JSON.
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
     * /metrics, /v1/hone/status and the dashboard (metrics.h) */
    void (*stats)(void *ctx, eng_stats *out);
    int (*sessions)(void *ctx, eng_session *out, int cap);
} srv_engine;

typedef struct srv_config {
    const char *host;        /* default "127.0.0.1" */
    int port;                /* 0: any free port (see srv_port) */
    const char *api_key;     /* NULL or "": no authentication */
    const char *model_name;  /* the name reported to clients (any requested name maps to it) */
    int32_t n_ctx;           /* context length: longer prompts are refused */
    int32_t max_tokens;      /* cap per request (<= 0: no cap beyond the context) */
    int32_t default_max_tokens; /* when the request names none (<= 0: until the context is full) */
    size_t max_body;         /* default 32 MiB */
    size_t max_header;       /* per-connection header memory, default 64 KiB */
    int max_connections;     /* default 256 */
    int ping_ms;             /* keep-alive interval while nothing is produced (default 5000) */
    smp_params sampling;     /* defaults for fields a request leaves out */
    bool log_requests;       /* one line per request on stderr */
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
/* Stops accepting, cancels running generations, waits for connections, frees. */
void srv_stop(srv_server *s);

/* Constant-time comparison of a presented key with the expected one. */
bool srv_key_equal(const char *given, size_t given_len, const char *want);
/* Whether n bytes are valid UTF-8 (no overlongs, surrogates or > U+10FFFF). */
bool srv_utf8_valid(const char *s, size_t n);

#endif
