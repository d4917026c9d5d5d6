/* srv_int.h: the server's connection and job state (private to server.c and srv_generate.c). */
#ifndef HN_SERVER_SRV_INT_H
#define HN_SERVER_SRV_INT_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>

#include "constraint.h"
#include "creq.h"
#include "gen_output.h"
#include "server.h"
#include "writer.h"

/* One TCP connection (MHD's socket context), for the header deadline. */
typedef struct srv_sock {
    int fd;
    double wait_since;   /* monotonic ms: accepted, or its last request ended */
    bool in_request;     /* a request's headers are in (the handler has it) */
    bool cut;            /* shut down by the ticker */
    struct srv_sock *next, *prev;
} srv_sock;

struct srv_server {
    srv_config cfg;
    char *host, *model_name, *cors_origins, *allowed_hosts;
    char **keys;        /* the accepted API keys (none: no authentication) */
    int n_keys;
    bool isolate;       /* each key its own prefix-cache namespace (cfg.cache_isolation) */
    srv_engine eng;
    const prm_model *pm;
    cst_shared *cst;
    struct MHD_Daemon *d;
    int port;
    atomic_int n_running;
    atomic_int n_jobs;   /* jobs not yet released by both sides (the engine's DONE pending) */
    atomic_bool stopping;   /* cut what runs (after the grace) */
    atomic_bool draining;   /* srv_stop began: no new requests */
    atomic_int n_gen_conns; /* requests with an engine job whose response is not yet sent */
    atomic_size_t inflight; /* body bytes held by requests in progress */

    /* suspended connections (see srv_park), for the ticker */
    pthread_mutex_t park_mu;
    struct srv_conn *parked;
    pthread_t ticker;
    bool ticker_on;
    int tick_ms;
    /* every open connection (under sock_mu) */
    pthread_mutex_t sock_mu;
    srv_sock *socks;
};

/* One generation, shared by the HTTP thread and the engine thread's callback. */
typedef struct srv_job {
    srv_server *s;
    pthread_mutex_t mu;
    int refs;            /* HTTP side + engine side */
    int32_t *toks;       /* tokens delivered and not yet taken */
    int n_toks, cap_toks;
    bool oom;            /* a token could not be queued */
    bool done;
    eng_finish fin;
    hn_status status;    /* with fin == ENG_FINISH_ERROR: the engine's class (HN_ERR_FULL: never fits) */
    char err[256];
    eng_req_stats stats;
    eng_req_id id;
    cst_req *cst;        /* the request's grammar, freed with the job */
    struct srv_conn *conn; /* woken on each event; NULL once the request is gone (under mu) */
} srv_job;

enum srv_route {
    R_NONE, R_ROOT, R_HEALTH, R_MODELS, R_MODEL_ONE, R_OLLAMA_VERSION, R_OLLAMA_TAGS,
    R_CHAT, R_COMPLETIONS, R_RESPONSES, R_MESSAGES, R_COUNT_TOKENS, R_RENDER, R_CHAT_COUNT, R_RESPONSES_COUNT,
    R_METRICS, R_STATUS, /* metrics.h */
};

/* One HTTP request (MHD's con_cls), refcounted: the request itself and a
 * streaming response's reader each hold a reference. */
typedef struct srv_conn {
    srv_server *s;
    struct MHD_Connection *mc;
    int refs;
    pthread_mutex_t mu;
    int route;
    api_kind api;
    sbuf body;
    bool too_large;
    const char *origin;   /* the request's Origin when allowed (echoed), else NULL */
    bool overloaded;      /* the body would exceed max_inflight */
    size_t held;          /* bytes counted in s->inflight */
    double t_start;
    uint64_t cache_ns;    /* the request's prefix-cache namespace (eng_request.cache_ns) */

    /* generation */
    creq req;
    bool have_req;
    prm_prompt prompt;
    srv_job *job;
    wr_writer *w;
    gen_state *g;
    sbuf out;
    size_t out_off;
    bool finished;        /* the writer has ended the response */
    bool never_fits;      /* the engine ended it: its KV cache can never hold the request (a 400) */
    bool cancelled;
    bool counted;         /* counted in s->n_running */
    double last_send;     /* monotonic ms of the last bytes handed to MHD */

    /* suspension (under s->park_mu) */
    bool parked;          /* MHD_suspend_connection called, not yet resumed */
    bool wake_pending;    /* woken while not parked: the next park is skipped */
    bool streaming;       /* a stream's reader is installed (pings are due) */
    struct srv_conn *pnext, *pprev;
} srv_conn;

/* Suspends c's MHD connection until srv_wake (only from MHD's callbacks for
 * c). Returns false, suspending nothing, when a wake came since the last
 * park or the server is stopping: the caller then looks again. */
bool srv_park(srv_conn *c);
/* Resumes c if parked, else makes its next park return at once. Any thread. */
void srv_wake(srv_conn *c);
/* Whether the client closed its end of the connection. */
bool srv_client_gone(srv_conn *c);
/* A suspended non-streaming request resumed: finish it or park again. */
enum MHD_Result srv_continue(srv_conn *c);
/* Drops one reference to a job (HTTP or engine side); the last frees it. */
void srv_job_release(srv_job *j);
void srv_conn_release(srv_conn *c);

/* The headers every response carries (CORS, Anthropic's request-id). */
void srv_common_headers(srv_conn *c, struct MHD_Response *r);
/* Sends a JSON error in the API's format. */
enum MHD_Result srv_send_error(srv_conn *c, api_kind api, const api_error *e);
/* Sends a body with a status and content type (copied). */
enum MHD_Result srv_send(srv_conn *c, int status, const char *ctype, const char *body, size_t len);

/* Handles a generation request (chat, completions, responses, messages) or
 * count_tokens / render once the body is complete. */
enum MHD_Result srv_generate(srv_conn *c, json_t *body, bool count_only, bool render_only);

#endif
