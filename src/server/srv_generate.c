/* srv_generate.c: a generation request from parsed body to response: mapping,
 * prompt, context check, engine submission, and the response (a streaming
 * reader that blocks on the job's token queue, or a wait for the whole
 * body). The engine's callback runs on the engine thread and only queues. */
#include <poll.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>

#include "../core/alloc.h"
#include "../core/clock.h"
#include "srv_int.h"

/* ---- the engine side: queue events for the HTTP thread ---- */

void srv_job_release(srv_job *j) {
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left) return;
    srv_server *s = j->s;
    cst_req_free(j->cst);
    pthread_mutex_destroy(&j->mu);
    hn_free(j->toks);
    hn_free(j);
    atomic_fetch_sub(&s->n_jobs, 1);
}

static void on_event(void *ctx, const eng_event *ev) {
    srv_job *j = ctx;
    pthread_mutex_lock(&j->mu);
    j->stats = ev->stats;
    if (ev->type == ENG_EV_TOKEN) {
        if (j->n_toks == j->cap_toks) {
            int cap = j->cap_toks ? j->cap_toks * 2 : 64;
            int32_t *t = hn_realloc(j->toks, (size_t)cap * sizeof *t);
            if (t) {
                j->toks = t;
                j->cap_toks = cap;
            }
        }
        if (j->n_toks < j->cap_toks) j->toks[j->n_toks++] = ev->token;
        else j->oom = true;
    } else {
        j->done = true;
        j->fin = ev->finish;
        j->status = ev->status;
        snprintf(j->err, sizeof j->err, "%s", ev->error ? ev->error : "");
    }
    if (j->conn) srv_wake(j->conn);
    pthread_mutex_unlock(&j->mu);
    if (ev->type == ENG_EV_DONE) srv_job_release(j); /* the engine's reference */
}

/* ---- the HTTP side ---- */

/* Runs delivered tokens through the pipeline (never waits); writes the end
 * when the job is done. Returns true once finished. */
static bool pump(srv_conn *c) {
    srv_job *j = c->job;
    int32_t local[256];
    pthread_mutex_lock(&j->mu);
    int n = j->n_toks < 256 ? j->n_toks : 256;
    if (n > 0) {
        memcpy(local, j->toks, (size_t)n * sizeof(int32_t));
        memmove(j->toks, j->toks + n, (size_t)(j->n_toks - n) * sizeof(int32_t));
        j->n_toks -= n;
    }
    bool done = j->done && j->n_toks == 0;
    bool oom = j->oom;
    eng_finish fin = j->fin;
    hn_status fst = j->status;
    eng_req_stats st = j->stats;
    char err[256];
    memcpy(err, j->err, sizeof err);
    pthread_mutex_unlock(&j->mu);
    for (int i = 0; i < n; i++)
        if (gen_token(c->g, local[i], &c->out) && !c->cancelled) {
            c->cancelled = true; /* a stop string: the rest is not wanted */
            c->s->eng.cancel(c->s->eng.ctx, j->id);
        }
    if (done) {
        if (oom && fin != ENG_FINISH_ERROR) {
            fin = ENG_FINISH_ERROR;
            snprintf(err, sizeof err, "out of memory queueing tokens");
        }
        if (fin == ENG_FINISH_CANCELLED && !gen_stopped(c->g)) fin = ENG_FINISH_EOG;
        if (fin == ENG_FINISH_ERROR && fst == HN_ERR_FULL) {
            /* the request alone outgrows the KV cache: the client's to change */
            api_error e;
            api_seterr(&e, APIE_CONTEXT, NULL, "%s (prompt %d tokens; lower max_tokens or the prompt, or give the server more --kv-bytes)",
                       err[0] ? err : "the KV cache is too small for this request", st.n_prompt);
            wr_fail(c->w, &c->out, &e);
            c->never_fits = true;
        } else {
            gen_end(c->g, fin, err, &st, &c->out);
        }
        c->finished = true;
        if (c->counted) atomic_fetch_sub(&c->s->n_running, 1);
        c->counted = false;
        if (c->s->cfg.log_requests)
            fprintf(c->s->cfg.log_file ? (FILE *)c->s->cfg.log_file : stderr, "hone serve: done: %d prompt (%d cached), %d generated, %.0f ms\n", st.n_prompt, st.n_cached,
                    st.n_generated, hn_now_ms() - c->t_start);
    }
    return done;
}

static void cancel_job(srv_conn *c) {
    if (c->job && !c->finished && !c->cancelled) {
        c->cancelled = true;
        c->s->eng.cancel(c->s->eng.ctx, c->job->id);
    }
}

/* The server stops: the request is cancelled and its response ends with an
 * error in the API's format (a stream's last event, or a 503 body). */
static void end_for_shutdown(srv_conn *c) {
    cancel_job(c);
    api_error e;
    api_seterr(&e, APIE_OVERLOADED, NULL, "the server is shutting down");
    wr_fail(c->w, &c->out, &e);
    c->finished = true;
    if (c->counted) atomic_fetch_sub(&c->s->n_running, 1);
    c->counted = false;
}

/* MHD asks for stream bytes: give what is queued, else run delivered
 * tokens, else a due ping, else park until the engine or the ticker wakes
 * the connection (returning 0 while parked). */
static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    srv_conn *c = cls;
    srv_server *s = c->s;
    for (;;) {
        if (c->out.oom) {
            cancel_job(c);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (c->out.len > c->out_off) {
            size_t n = c->out.len - c->out_off;
            if (n > max) n = max;
            memcpy(buf, c->out.data + c->out_off, n);
            c->out_off += n;
            if (c->out_off == c->out.len) {
                sb_reset(&c->out);
                c->out_off = 0;
            }
            c->last_send = hn_now_ms();
            return (ssize_t)n;
        }
        if (c->finished) return MHD_CONTENT_READER_END_OF_STREAM;
        if (srv_client_gone(c)) {
            cancel_job(c);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (pump(c) || c->out.len) continue;
        if (atomic_load(&s->stopping)) {
            end_for_shutdown(c);
            continue;
        }
        if (hn_now_ms() - c->last_send >= s->cfg.ping_ms) {
            wr_keepalive(c->w, &c->out);
            if (c->out.len) continue;
            c->last_send = hn_now_ms(); /* nothing to ping with: wait another interval */
        }
        if (srv_park(c)) return 0;
    }
}

enum MHD_Result srv_continue(srv_conn *c) {
    srv_server *s = c->s;
    api_error e;
    for (;;) {
        if (pump(c)) {
            if (c->out.oom) return srv_send_error(c, c->api, api_seterr(&e, APIE_INTERNAL, NULL, "out of memory"));
            int status = c->job->fin != ENG_FINISH_ERROR ? 200 : c->never_fits ? api_http_status(c->api, APIE_CONTEXT) : 500;
            return srv_send(c, status, "application/json", c->out.data ? c->out.data : "", c->out.len);
        }
        if (atomic_load(&s->stopping)) {
            end_for_shutdown(c);
            return srv_send_error(c, c->api, api_seterr(&e, APIE_OVERLOADED, NULL, "the server is shutting down"));
        }
        if (srv_client_gone(c)) {
            cancel_job(c);
            return MHD_NO;
        }
        if (srv_park(c)) return MHD_YES;
    }
}

static void stream_free(void *cls) { srv_conn_release(cls); }

static enum MHD_Result send_render(srv_conn *c, bool count_only) {
    json_t *v;
    if (count_only) {
        v = json_pack("{s:i}", "input_tokens", (json_int_t)c->prompt.n_tokens);
    } else {
        json_t *toks = json_array();
        for (int32_t i = 0; toks && i < c->prompt.n_tokens; i++) json_array_append_new(toks, json_integer(c->prompt.tokens[i]));
        v = json_pack("{s:s%,s:i,s:o,s:b}", "prompt", c->prompt.text.data ? c->prompt.text.data : "", c->prompt.text.len,
                      "n_tokens", (json_int_t)c->prompt.n_tokens, "tokens", toks, "starts_in_reasoning",
                      c->prompt.start_in_reasoning);
    }
    char *s = v ? json_dumps(v, JSON_COMPACT) : NULL;
    json_decref(v);
    if (!s) return MHD_NO;
    enum MHD_Result r = srv_send(c, 200, "application/json", s, strlen(s));
    free(s);
    return r;
}

static smp_params sampling_of(const srv_config *cfg, const creq *r) {
    smp_params p = cfg->sampling;
    if (r->has_temp) p.temp = r->temp;
    if (r->has_top_p) p.top_p = r->top_p > 0 ? r->top_p : 1.0f;
    if (r->has_top_k) p.top_k = r->top_k;
    if (r->has_min_p) p.min_p = r->min_p;
    if (r->has_presence) p.presence_penalty = r->presence_penalty;
    if (r->has_frequency) p.frequency_penalty = r->frequency_penalty;
    if (r->has_seed) {
        p.seed = r->seed;
    } else {
        uint64_t seed;
        if (getrandom(&seed, sizeof seed, GRND_NONBLOCK) == (ssize_t)sizeof seed) p.seed = seed;
    }
    return p;
}

enum MHD_Result srv_generate(srv_conn *c, json_t *body, bool count_only, bool render_only) {
    srv_server *s = c->s;
    api_error e;
    /* count_only changes parsing only for Anthropic (max_tokens optional) */
    if (!creq_parse(c->api, count_only && c->api == API_MESSAGES, body, &c->req, &e)) return srv_send_error(c, c->api, &e);
    c->have_req = true;
    if (!prm_build(s->pm, &c->req, &c->prompt, &e)) return srv_send_error(c, c->api, &e);
    if (render_only || count_only) return send_render(c, count_only);

    int32_t n = c->prompt.n_tokens;
    if (n <= 0) return srv_send_error(c, c->api, api_seterr(&e, APIE_INVALID, "messages", "the prompt is empty"));
    if (s->cfg.n_ctx > 0 && n >= s->cfg.n_ctx) {
        if (c->api == API_MESSAGES)
            api_seterr(&e, APIE_CONTEXT, "messages", "prompt is too long: %d tokens > %d maximum", n, s->cfg.n_ctx - 1);
        else
            api_seterr(&e, APIE_CONTEXT, "messages",
                       "This model's maximum context length is %d tokens. However, your messages resulted in %d tokens. "
                       "Please reduce the length of the messages.", s->cfg.n_ctx, n);
        return srv_send_error(c, c->api, &e);
    }
    if (s->cfg.kv_tokens > 0 && n >= s->cfg.kv_tokens)
        return srv_send_error(c, c->api,
                              api_seterr(&e, APIE_CONTEXT, "messages",
                                         "the prompt has %d tokens but the server's KV cache holds %d in all "
                                         "(the server's --kv-bytes)", n, s->cfg.kv_tokens));
    /* how much to generate: the request's limit, the server's cap, the room left */
    int32_t mt = c->req.max_tokens >= 0 ? c->req.max_tokens : s->cfg.default_max_tokens;
    bool drop = c->req.max_tokens == 0; /* Anthropic cache warm-up: nothing visible */
    if (drop) mt = 1;
    if (s->cfg.max_tokens > 0 && (mt <= 0 || mt > s->cfg.max_tokens)) mt = s->cfg.max_tokens;
    if (s->cfg.n_ctx > 0 && (mt <= 0 || mt > s->cfg.n_ctx - n)) mt = s->cfg.n_ctx - n;
    if (s->cfg.kv_tokens > 0 && (mt <= 0 || mt > s->cfg.kv_tokens - n)) mt = s->cfg.kv_tokens - n;

    wr_meta wm = {.api = c->api, .stream = c->req.stream, .include_usage = c->req.include_usage,
                  .model = s->model_name, .custom_tools = c->req.custom_tools};
    c->w = wr_new(&wm);
    bool parse = c->api != API_COMPLETIONS;
    gen_opts go = {.vocab = s->pm->vocab,
                   .parse = parse,
                   .format = c->req.tool_choice == CREQ_TOOLS_NONE || !c->req.tools ? TC_FORMAT_NONE : s->pm->det.format,
                   .tc_flags = s->pm->det.flags,
                   .start_in_reasoning = c->prompt.start_in_reasoning,
                   .tools = c->req.tools,
                   .stops = c->req.stop,
                   .n_stops = c->req.n_stop,
                   .drop_output = drop,
                   .single_call = !c->req.parallel_tool_calls};
    /* with tool_choice none the tools stay in the prompt (a stable prefix) but
     * calls are not parsed; without tools there is nothing to parse either */
    c->g = c->w ? gen_new(&go, c->w) : NULL;
    srv_job *j = hn_calloc(1, sizeof *j);
    if (!c->g || !j) {
        hn_free(j);
        return srv_send_error(c, c->api, api_seterr(&e, APIE_INTERNAL, NULL, "out of memory"));
    }
    pthread_mutex_init(&j->mu, NULL);
    j->s = s;
    j->refs = 2;
    atomic_fetch_add(&s->n_jobs, 1);
    eng_request er = {.prompt = c->prompt.tokens,
                      .n_prompt = n,
                      .sampling = sampling_of(&s->cfg, &c->req),
                      .max_tokens = mt,
                      .on_event = on_event,
                      .ctx = j,
                      .cache_ns = c->cache_ns};
    for (int i = 0; i < c->prompt.n_resume && i < ENG_RESUME_MAX; i++) er.resume[er.n_resume++] = c->prompt.resume[i];
    if (!cst_attach(s->cst, &c->req, &c->prompt, &er, &j->cst, &e)) {
        j->refs = 1;
        srv_job_release(j);
        return srv_send_error(c, c->api, &e);
    }
    hn_err herr = {0};
    hn_status st = s->eng.submit(s->eng.ctx, &er, &j->id, &herr);
    if (st != HN_OK) {
        j->refs = 1;
        srv_job_release(j);
        api_errkind k = st == HN_ERR_RANGE ? APIE_CONTEXT : st == HN_ERR_INVALID ? APIE_INVALID
                        : st == HN_ERR_FULL ? APIE_OVERLOADED : APIE_INTERNAL;
        return srv_send_error(c, c->api, api_seterr(&e, k, NULL, "%s", herr.msg[0] ? herr.msg : hn_status_str(st)));
    }
    c->job = j;
    atomic_fetch_add(&s->n_gen_conns, 1);
    pthread_mutex_lock(&j->mu);
    j->conn = c; /* from here on every engine event wakes c */
    pthread_mutex_unlock(&j->mu);
    atomic_fetch_add(&s->n_running, 1);
    c->counted = true;

    if (c->req.stream) {
        c->streaming = true;
        /* the first events go out at once, before any token */
        wr_begin(c->w, &c->out, n);
        c->last_send = hn_now_ms();
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, c, stream_free);
        if (!r) return MHD_NO;
        pthread_mutex_lock(&c->mu);
        c->refs++;
        pthread_mutex_unlock(&c->mu);
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        MHD_add_response_header(r, "X-Accel-Buffering", "no");
        srv_common_headers(c, r);
        enum MHD_Result ret = MHD_queue_response(c->mc, 200, r);
        MHD_destroy_response(r);
        return ret;
    }
    wr_begin(c->w, &c->out, n);
    return srv_continue(c);
}
