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

struct srv_server {
    srv_config cfg;
    char *host, *api_key, *model_name;
    srv_engine eng;
    const prm_model *pm;
    cst_shared *cst;
    struct MHD_Daemon *d;
    int port;
    atomic_int n_running;
    atomic_int n_jobs;   /* jobs not yet released by both sides (the engine's DONE pending) */
    atomic_bool stopping;
};

/* One generation, shared by the HTTP thread and the engine thread's callback. */
typedef struct srv_job {
    srv_server *s;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;            /* HTTP side + engine side */
    int32_t *toks;       /* tokens delivered and not yet taken */
    int n_toks, cap_toks;
    bool oom;            /* a token could not be queued */
    bool done;
    eng_finish fin;
    char err[256];
    eng_req_stats stats;
    eng_req_id id;
    cst_req *cst;        /* the request's grammar, freed with the job */
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
    double t_start;

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
    bool cancelled;
    bool counted;         /* counted in s->n_running */
    double last_send;     /* monotonic ms of the last bytes handed to MHD */
} srv_conn;

/* Drops one reference to a job (HTTP or engine side); the last frees it. */
void srv_job_release(srv_job *j);
void srv_conn_release(srv_conn *c);

/* Sends a JSON error in the API's format. */
enum MHD_Result srv_send_error(srv_conn *c, api_kind api, const api_error *e);
/* Sends a body with a status and content type (copied). */
enum MHD_Result srv_send(srv_conn *c, int status, const char *ctype, const char *body, size_t len);

/* Handles a generation request (chat, completions, responses, messages) or
 * count_tokens / render once the body is complete. */
enum MHD_Result srv_generate(srv_conn *c, json_t *body, bool count_only, bool render_only);

#endif
