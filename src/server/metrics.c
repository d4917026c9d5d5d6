/* metrics.c: GET /metrics, GET /v1/hone/status and the dashboard's route
 * (see metrics.h). Everything is read from one eng_get_stats snapshot and
 * one eng_get_sessions list, so the numbers of one response agree. */
#include "metrics.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "../core/alloc.h"
#include "../core/clock.h"

static const char *const finish_names[ENG_FINISH_ERROR + 1] = {"none", "eog", "length", "context", "cancelled", "error"};

/* Resident set of this process (bytes), 0 if unknown. */
static size_t rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    unsigned long size = 0, res = 0;
    int n = fscanf(f, "%lu %lu", &size, &res);
    fclose(f);
    long ps = sysconf(_SC_PAGESIZE);
    return n == 2 && ps > 0 ? (size_t)res * (size_t)ps : 0;
}

/* The engine's figures: stats and a session list (hn_malloc'd, *n entries); false without an engine that reports them. */
static bool engine_snapshot(srv_server *s, eng_stats *st, eng_session **ss, int *n) {
    *ss = NULL;
    *n = 0;
    if (!s->eng.stats) return false;
    s->eng.stats(s->eng.ctx, st);
    if (!s->eng.sessions) return true;
    for (int tries = 0; tries < 4; tries++) {
        int want = s->eng.sessions(s->eng.ctx, NULL, 0) + 8;
        eng_session *v = hn_malloc(sizeof *v * (size_t)want);
        if (!v) return true;
        int got = s->eng.sessions(s->eng.ctx, v, want);
        if (got <= want) {
            *ss = v;
            *n = got;
            return true;
        }
        hn_free(v); /* more arrived meanwhile: again */
    }
    return true;
}

static void hist(sbuf *o, const char *name, const char *help, const uint64_t *h, const double *bounds_ms, double sum_ms) {
    sb_addf(o, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (int i = 0; i < ENG_HIST_N; i++) {
        if (i == ENG_HIST_N - 1) sb_addf(o, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)h[i]);
        else sb_addf(o, "%s_bucket{le=\"%g\"} %llu\n", name, bounds_ms[i] / 1000.0, (unsigned long long)h[i]);
    }
    sb_addf(o, "%s_sum %.6f\n%s_count %llu\n", name, sum_ms / 1000.0, name, (unsigned long long)h[ENG_HIST_N - 1]);
}

static void metric(sbuf *o, const char *name, const char *type, const char *help, double v) {
    sb_addf(o, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

void srv_metrics_text(srv_server *s, sbuf *o) {
    eng_stats st;
    eng_session *ss;
    int n;
    metric(o, "hone_http_generations", "gauge", "Generation requests the HTTP server is serving now.",
           (double)atomic_load(&s->n_running));
    metric(o, "hone_alloc_bytes", "gauge", "Bytes allocated through hone's allocation hook (heap and pages).",
           (double)hn_alloc_bytes());
    metric(o, "hone_resident_bytes", "gauge", "Resident set size of the process.", (double)rss_bytes());
    if (!engine_snapshot(s, &st, &ss, &n)) return;
    metric(o, "hone_requests_total", "counter", "Requests submitted to the engine.", (double)st.requests);
    sb_adds(o, "# HELP hone_requests_finished_total Requests that ended, by reason.\n"
               "# TYPE hone_requests_finished_total counter\n");
    for (int i = ENG_FINISH_EOG; i <= ENG_FINISH_ERROR; i++)
        sb_addf(o, "hone_requests_finished_total{reason=\"%s\"} %llu\n", finish_names[i],
                (unsigned long long)st.finished[i]);
    metric(o, "hone_requests_running", "gauge", "Requests in the running batch.", st.n_running);
    metric(o, "hone_queue_length", "gauge", "Requests waiting to run (new and preempted).", st.n_waiting);
    metric(o, "hone_prompt_tokens_total", "counter", "Prompt tokens submitted.", (double)st.prompt_tokens);
    metric(o, "hone_cached_tokens_total", "counter", "Prompt tokens served from the prefix cache.",
           (double)st.cached_tokens);
    metric(o, "hone_generated_tokens_total", "counter", "Tokens generated.", (double)st.generated_tokens);
    metric(o, "hone_computed_tokens_total", "counter", "Tokens run through the model (prefill, recomputation, decode).",
           (double)st.computed_tokens);
    hist(o, "hone_ttft_seconds", "Time from submit to the first generated token.", st.ttft_hist, eng_ttft_bounds_ms,
         st.ttft_sum_ms);
    hist(o, "hone_inter_token_seconds", "Time between a request's consecutive tokens.", st.itl_hist,
         eng_itl_bounds_ms, st.itl_sum_ms);
    sb_adds(o, "# HELP hone_kv_blocks KV cache blocks by state.\n# TYPE hone_kv_blocks gauge\n");
    sb_addf(o, "hone_kv_blocks{state=\"used\"} %d\nhone_kv_blocks{state=\"cached\"} %d\nhone_kv_blocks{state=\"free\"} %d\n",
            (int)st.blocks_used, (int)st.blocks_cached, (int)st.blocks_free);
    metric(o, "hone_kv_blocks_backed", "gauge", "KV blocks backed by memory now.", st.blocks_total);
    metric(o, "hone_kv_blocks_max", "gauge", "The KV pool's cap in blocks.", st.blocks_max);
    metric(o, "hone_kv_block_bytes", "gauge", "Bytes of one KV block (all layers, K and V).", (double)st.block_bytes);
    metric(o, "hone_kv_bytes", "gauge", "Memory of the KV pool now: its slabs and their block metadata.", (double)st.kv_bytes);
    metric(o, "hone_kv_peak_bytes", "gauge", "Most memory the KV pool has held.", (double)st.kv_peak_bytes);
    metric(o, "hone_kv_evictions_total", "counter", "Cached KV blocks reclaimed for other use.", (double)st.evictions);
    metric(o, "hone_preemptions_total", "counter", "Requests pushed out of the batch for memory.",
           (double)st.preemptions);
    metric(o, "hone_steps_total", "counter", "Engine steps run.", (double)st.steps);
    sb_adds(o, "# HELP hone_spec_mode Speculative decoding in effect (1 for the mode named).\n"
               "# TYPE hone_spec_mode gauge\n");
    sb_addf(o, "hone_spec_mode{mode=\"%s\"} 1\n", eng_spec_name(st.spec));
    metric(o, "hone_spec_drafted_tokens_total", "counter", "Tokens drafted and verified (speculative decoding).",
           (double)st.spec_drafted);
    metric(o, "hone_spec_accepted_tokens_total", "counter", "Drafted tokens accepted: decode steps saved.",
           (double)st.spec_accepted);
    metric(o, "hone_spec_verify_steps_total", "counter", "Engine steps that verified a drafted block.",
           (double)st.spec_verify_steps);
    if (st.draft_loaded) { /* the draft model (--draft): its own KV pool, beside hone_kv_bytes */
        metric(o, "hone_draft_kv_bytes", "gauge", "Memory backing the draft model's KV pool now.", (double)st.draft_kv_bytes);
        metric(o, "hone_draft_model_bytes", "gauge", "What loading the draft model allocated (inside hone_engine_bytes).",
               (double)st.draft_model_bytes);
        metric(o, "hone_draft_steps_total", "counter", "Draft-model steps run.", (double)st.draft_steps);
        metric(o, "hone_draft_proposed_tokens_total", "counter", "Tokens the draft model proposed.",
               (double)st.draft_drafted);
    }
    if (st.mtp_loaded) { /* the model's MTP layer: its own KV pool, beside hone_kv_bytes */
        metric(o, "hone_mtp_kv_bytes", "gauge", "Memory backing the MTP layer's KV pool now.", (double)st.mtp_kv_bytes);
        metric(o, "hone_mtp_steps_total", "counter", "MTP-layer steps run (catch-up and drafting).", (double)st.mtp_steps);
        metric(o, "hone_mtp_proposed_tokens_total", "counter", "Tokens the MTP layer proposed.", (double)st.mtp_drafted);
    }
    if (st.dflash_loaded) { /* the DFlash drafter: its own KV pool, beside hone_kv_bytes */
        metric(o, "hone_dflash_kv_bytes", "gauge", "Memory backing the DFlash drafter's KV pool now.",
               (double)st.dflash_kv_bytes);
        metric(o, "hone_dflash_steps_total", "counter", "DFlash drafter steps run (injection and block forwards).",
               (double)st.dflash_steps);
        metric(o, "hone_dflash_blocks_total", "counter", "Blocks the DFlash drafter drafted.", (double)st.dflash_blocks);
        metric(o, "hone_dflash_proposed_tokens_total", "counter", "Tokens the DFlash drafter proposed.",
               (double)st.dflash_drafted);
    }
    if (st.state_slot_bytes) { /* hybrid models: recurrent state beside the KV pool */
        metric(o, "hone_state_bytes", "gauge",
               "Recurrent-state memory now (hybrid models): live sequences' slots and checkpoints, beside hone_kv_bytes.",
               (double)st.state_bytes);
        metric(o, "hone_state_peak_bytes", "gauge", "The most hone_state_bytes has been.", (double)st.state_peak_bytes);
        metric(o, "hone_state_slot_bytes", "gauge", "Bytes of one sequence's recurrent state.", (double)st.state_slot_bytes);
        metric(o, "hone_state_checkpoints", "gauge", "State checkpoints the prefix cache holds.", st.ckpts);
        metric(o, "hone_state_checkpoints_max", "gauge", "The checkpoints' budget.", st.ckpt_max);
        metric(o, "hone_state_checkpoint_hits_total", "counter", "Prefixes resumed from a state checkpoint.",
               (double)st.ckpt_hits);
    }
    metric(o, "hone_engine_bytes", "gauge", "The engine's fixed cost: everything but the KV pool.",
           (double)st.engine_bytes);
    metric(o, "hone_model_bytes", "gauge", "Of it, what loading the model allocated (repacked weights, activations).",
           (double)st.model_bytes);
    metric(o, "hone_model_file_bytes", "gauge", "Weight bytes in the model file (mapped, read in place).",
           (double)st.model_file_bytes);
    metric(o, "hone_model_moe_apart_bytes", "gauge",
           "Of hone_model_file_bytes, the routed experts held by the expert backend (--cpu-moe), not the main one.",
           (double)st.moe_apart_bytes);
    metric(o, "hone_scratch_bytes", "gauge",
           "The backend's activations and scratch now: sized for the largest step since idle (in model_bytes as after load).",
           (double)st.scratch_bytes);
    metric(o, "hone_scratch_peak_bytes", "gauge", "The most hone_scratch_bytes has been.", (double)st.scratch_peak_bytes);
    sb_adds(o, "# HELP hone_session_kv_bytes KV bytes of each live request: its own blocks, and its share of blocks "
               "shared with others (a block with refcount r counts 1/r).\n# TYPE hone_session_kv_bytes gauge\n");
    for (int i = 0; i < n; i++) {
        sb_addf(o, "hone_session_kv_bytes{id=\"%llu\",kind=\"own\"} %zu\n", (unsigned long long)ss[i].id,
                ss[i].bytes_own);
        sb_addf(o, "hone_session_kv_bytes{id=\"%llu\",kind=\"shared\"} %.1f\n", (unsigned long long)ss[i].id,
                ss[i].bytes_shared);
    }
    if (st.state_slot_bytes) {
        sb_adds(o, "# HELP hone_session_state_bytes Recurrent-state bytes of each live request (its live slot).\n"
                   "# TYPE hone_session_state_bytes gauge\n");
        for (int i = 0; i < n; i++)
            sb_addf(o, "hone_session_state_bytes{id=\"%llu\"} %zu\n", (unsigned long long)ss[i].id, ss[i].state_bytes);
    }
    hn_free(ss);
}

#define JSET(o, k, v) json_object_set_new(o, k, v)
#define JI(v) json_integer((json_int_t)(v))

json_t *srv_status_json(srv_server *s) {
    json_t *o = json_object();
    if (!o) return NULL;
    eng_stats st;
    eng_session *ss;
    int n;
    bool have = engine_snapshot(s, &st, &ss, &n);
    JSET(o, "time_ms", json_real(hn_now_ms()));
    json_t *proc = json_object();
    JSET(proc, "alloc_bytes", JI(hn_alloc_bytes()));
    JSET(proc, "rss_bytes", JI(rss_bytes()));
    JSET(proc, "http_generations", JI(atomic_load(&s->n_running)));
    JSET(o, "process", proc);
    json_t *model = json_object();
    JSET(model, "name", json_string(s->model_name));
    JSET(model, "n_ctx", JI(s->cfg.n_ctx));
    if (have) {
        JSET(model, "kv_type", json_string(eng_kv_type_name(st.kv_type)));
        JSET(model, "file_bytes", JI(st.model_file_bytes));
        JSET(model, "moe_apart_layers", JI(st.moe_apart_layers));
        JSET(model, "moe_apart_bytes", JI(st.moe_apart_bytes));
        JSET(model, "alloc_bytes", JI(st.model_bytes));
        JSET(model, "engine_bytes", JI(st.engine_bytes));
        JSET(model, "scratch_bytes", JI(st.scratch_bytes));
        JSET(model, "scratch_peak_bytes", JI(st.scratch_peak_bytes));
    }
    JSET(o, "model", model);
    if (!have) {
        JSET(o, "engine", json_false());
        JSET(o, "sessions", json_array());
        return o;
    }
    JSET(o, "engine", json_true());
    json_t *pool = json_object();
    JSET(pool, "block_size", JI(st.block_size));
    JSET(pool, "block_bytes", JI(st.block_bytes));
    JSET(pool, "blocks_max", JI(st.blocks_max));
    JSET(pool, "blocks_backed", JI(st.blocks_total));
    JSET(pool, "blocks_used", JI(st.blocks_used));
    JSET(pool, "blocks_cached", JI(st.blocks_cached));
    JSET(pool, "blocks_free", JI(st.blocks_free));
    JSET(pool, "kv_bytes", JI(st.kv_bytes));
    JSET(pool, "kv_peak_bytes", JI(st.kv_peak_bytes));
    JSET(pool, "state_bytes", JI(st.state_bytes));
    JSET(pool, "state_peak_bytes", JI(st.state_peak_bytes));
    JSET(pool, "state_slot_bytes", JI(st.state_slot_bytes));
    JSET(pool, "checkpoints", JI(st.ckpts));
    JSET(pool, "checkpoints_max", JI(st.ckpt_max));
    JSET(pool, "checkpoint_hits", JI(st.ckpt_hits));
    JSET(pool, "evictions", JI(st.evictions));
    JSET(pool, "preemptions", JI(st.preemptions));
    JSET(o, "pool", pool);
    json_t *req = json_object();
    JSET(req, "submitted", JI(st.requests));
    JSET(req, "running", JI(st.n_running));
    JSET(req, "waiting", JI(st.n_waiting));
    json_t *fin = json_object();
    for (int i = ENG_FINISH_EOG; i <= ENG_FINISH_ERROR; i++) JSET(fin, finish_names[i], JI(st.finished[i]));
    JSET(req, "finished", fin);
    JSET(o, "requests", req);
    json_t *tok = json_object();
    JSET(tok, "prompt", JI(st.prompt_tokens));
    JSET(tok, "cached", JI(st.cached_tokens));
    JSET(tok, "generated", JI(st.generated_tokens));
    JSET(tok, "computed", JI(st.computed_tokens));
    JSET(o, "tokens", tok);
    JSET(o, "steps", JI(st.steps));
    json_t *arr = json_array();
    for (int i = 0; i < n; i++) {
        const eng_session *v = &ss[i];
        json_t *j = json_object();
        JSET(j, "id", JI(v->id));
        JSET(j, "state", json_string(eng_sess_state_name(v->state)));
        JSET(j, "n_ctx", JI(v->n_ctx));
        JSET(j, "n_tokens", JI(v->n_tokens));
        JSET(j, "n_prompt", JI(v->n_prompt));
        JSET(j, "n_cached", JI(v->n_cached));
        JSET(j, "n_generated", JI(v->n_generated));
        JSET(j, "n_computed", JI(v->n_computed));
        JSET(j, "blocks_own", JI(v->blocks_own));
        JSET(j, "blocks_shared", JI(v->blocks_shared));
        JSET(j, "bytes_own", JI(v->bytes_own));
        JSET(j, "bytes_shared", json_real(v->bytes_shared));
        JSET(j, "state_bytes", JI(v->state_bytes));
        JSET(j, "tok_per_s", json_real(v->tok_per_s));
        JSET(j, "age_ms", json_real(v->age_ms));
        json_array_append_new(arr, j);
    }
    JSET(o, "sessions", arr);
    hn_free(ss);
    return o;
}

enum MHD_Result srv_metrics(srv_conn *c) {
    sbuf b = {0};
    srv_metrics_text(c->s, &b);
    enum MHD_Result r = b.oom ? MHD_NO : srv_send(c, 200, "text/plain; version=0.0.4; charset=utf-8", b.data ? b.data : "", b.len);
    sb_free(&b);
    return r;
}

enum MHD_Result srv_status(srv_conn *c) {
    json_t *v = srv_status_json(c->s);
    char *s = v ? json_dumps(v, JSON_COMPACT) : NULL;
    json_decref(v);
    if (!s) return MHD_NO;
    enum MHD_Result r = srv_send(c, 200, "application/json", s, strlen(s));
    free(s);
    return r;
}

enum MHD_Result srv_dashboard(srv_conn *c) {
    return srv_send(c, 200, "text/html; charset=utf-8", srv_dashboard_html, strlen(srv_dashboard_html));
}
