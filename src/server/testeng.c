/* testeng.c: the scripted engine for protocol tests (see testeng.h). */
#include "testeng.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "../core/alloc.h"
#include "../core/clock.h"
#include "sbuf.h"

#define TENG_RECENT 16
#define TENG_BLOCK 16

typedef struct tjob {
    eng_req_id id;
    eng_request r;      /* prompt pointer not kept */
    int32_t *out;       /* the scripted tokens */
    int32_t n_out, pos;
    bool long_mode;     /* generate until max_tokens */
    bool kv_full;       /* end at once as the engine does when the request can never fit its KV cache */
    int delay_ms;
    bool cancelled;
    eng_req_stats st;
    double t0;
    struct tjob *next;
} tjob;

struct teng {
    const tok_vocab *vocab;
    int32_t n_ctx;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t th;
    bool quit;
    eng_req_id next_id;
    tjob *jobs;
    int32_t *recent[TENG_RECENT];
    int32_t n_recent[TENG_RECENT];
    int recent_at;
};

static void script(const char *prompt, sbuf *reply, bool *long_mode, int *delay) {
    const char *d = NULL;
    for (const char *p = strstr(prompt, "MOCK:"); p; p = strstr(p + 1, "MOCK:")) d = p;
    *long_mode = false;
    *delay = 0;
    if (!d) {
        sb_adds(reply, "Hello from the hone test engine.");
        return;
    }
    if (strstr(d, "<tool_response>")) {
        sb_adds(reply, "Done: the tool ran.");
        return;
    }
    d += 5;
    if (!strncmp(d, "TOOL", 4)) {
        int n = d[4] == '2' ? 2 : 1;
        const char *p = d + 4 + (n == 2);
        while (*p == ' ') p++;
        const char *name = p;
        while (*p && *p != ' ' && *p != '\n' && *p != '<') p++;
        size_t nl = (size_t)(p - name);
        while (*p == ' ') p++;
        const char *args = p;
        if (*p == '{') { /* to the matching brace */
            int depth = 0;
            for (; *p; p++) {
                if (*p == '{') depth++;
                if (*p == '}' && --depth == 0) {
                    p++;
                    break;
                }
            }
        }
        size_t al = (size_t)(p - args);
        for (int i = 0; i < n; i++) {
            if (i) sb_adds(reply, "\n");
            sb_addf(reply, "<tool_call>\n{\"name\": \"%.*s\", \"arguments\": %.*s}\n</tool_call>", (int)nl, name,
                    (int)(al ? al : 2), al ? args : "{}");
        }
    } else if (!strncmp(d, "THINK", 5)) {
        sb_adds(reply, "<think>\nLet me think about this.\n</think>\n\nHere is my answer.");
    } else if (!strncmp(d, "LONG", 4)) {
        *long_mode = true;
        sb_adds(reply, " word");
    } else if (!strncmp(d, "STOP", 4)) {
        sb_adds(reply, "alpha beta STOPHERE gamma delta");
    } else if (!strncmp(d, "SLOW", 4)) {
        *delay = 200;
        for (int i = 0; i < 200; i++) sb_adds(reply, " slow");
    } else if (!strncmp(d, "KVFULL", 6)) {
        *delay = -1; /* see teng_submit */
    } else if (!strncmp(d, "UTF8", 4)) {
        sb_adds(reply, "h\xc3\xa9llo \xe4\xb8\x96\xe7\x95\x8c \xf0\x9f\x8e\x89 done");
    } else {
        sb_adds(reply, "Hello from the hone test engine.");
    }
}

static hn_status teng_submit(void *ctx, const eng_request *r, eng_req_id *id, hn_err *err) {
    teng *t = ctx;
    if (!r->on_event || r->n_prompt <= 0 || !r->prompt) return hn_errf(err, HN_ERR_INVALID, "empty prompt");
    if (r->n_prompt >= t->n_ctx) return hn_errf(err, HN_ERR_RANGE, "prompt of %d tokens does not fit the context (%d)", r->n_prompt, t->n_ctx);
    int32_t nv = tok_n_vocab(t->vocab);
    for (int32_t i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= nv) return hn_errf(err, HN_ERR_INVALID, "token %d out of range", r->prompt[i]);
    tjob *j = hn_calloc(1, sizeof *j);
    sbuf text = {0}, reply = {0};
    if (!j) return hn_errf(err, HN_ERR_NOMEM, "out of memory");
    char piece[512];
    for (int32_t i = 0; i < r->n_prompt; i++) {
        int32_t n = tok_piece(t->vocab, r->prompt[i], true, piece, sizeof piece);
        if (n > 0) sb_add(&text, piece, (size_t)(n < (int32_t)sizeof piece ? n : (int32_t)sizeof piece));
    }
    bool long_mode;
    script(text.data ? text.data : "", &reply, &long_mode, &j->delay_ms);
    int64_t cap = (int64_t)reply.len + 8;
    j->out = hn_malloc((size_t)cap * sizeof(int32_t));
    int64_t n = j->out ? tok_encode(t->vocab, reply.data, reply.len, false, true, j->out, cap) : -1;
    sb_free(&text);
    sb_free(&reply);
    if (n < 0 || n > cap) {
        hn_free(j->out);
        hn_free(j);
        return hn_errf(err, HN_ERR_NOMEM, "out of memory");
    }
    j->n_out = (int32_t)n;
    j->long_mode = long_mode;
    if (j->delay_ms < 0) j->kv_full = true, j->delay_ms = 0;
    j->r = *r;
    j->r.prompt = NULL;
    j->t0 = hn_now_ms();
    j->st.n_prompt = r->n_prompt;
    pthread_mutex_lock(&t->mu);
    /* prefix-cache imitation */
    int32_t best = 0;
    for (int k = 0; k < TENG_RECENT; k++) {
        int32_t l = 0, m = t->n_recent[k] < r->n_prompt ? t->n_recent[k] : r->n_prompt;
        while (l < m && t->recent[k][l] == r->prompt[l]) l++;
        if (l > best) best = l;
    }
    if (best >= r->n_prompt) best = r->n_prompt - 1;
    j->st.n_cached = best / TENG_BLOCK * TENG_BLOCK;
    int32_t *copy = hn_malloc((size_t)r->n_prompt * sizeof(int32_t));
    if (copy) {
        memcpy(copy, r->prompt, (size_t)r->n_prompt * sizeof(int32_t));
        hn_free(t->recent[t->recent_at]);
        t->recent[t->recent_at] = copy;
        t->n_recent[t->recent_at] = r->n_prompt;
        t->recent_at = (t->recent_at + 1) % TENG_RECENT;
    }
    j->id = ++t->next_id;
    *id = j->id;
    tjob **tail = &t->jobs;
    while (*tail) tail = &(*tail)->next;
    *tail = j;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
    return HN_OK;
}

static void teng_cancel(void *ctx, eng_req_id id) {
    teng *t = ctx;
    pthread_mutex_lock(&t->mu);
    for (tjob *j = t->jobs; j; j = j->next)
        if (j->id == id) j->cancelled = true;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

/* One step for a job: a token or the end. Returns true when it ended. Called
 * without the lock (the callback may call teng_cancel). */
static bool step(teng *t, tjob *j, bool cancelled) {
    eng_event ev = {.id = j->id};
    j->st.t_total_ms = hn_now_ms() - j->t0;
    int32_t limit = j->r.max_tokens > 0 ? j->r.max_tokens : t->n_ctx - j->st.n_prompt;
    eng_finish fin = ENG_FINISH_NONE;
    if (cancelled) fin = ENG_FINISH_CANCELLED;
    else if (j->st.n_generated >= limit) fin = j->r.max_tokens > 0 ? ENG_FINISH_LENGTH : ENG_FINISH_CONTEXT;
    else if (!j->long_mode && j->pos >= j->n_out) fin = ENG_FINISH_EOG;
    if (!cancelled && j->kv_full) {
        ev.type = ENG_EV_DONE;
        ev.finish = ENG_FINISH_ERROR;
        ev.status = HN_ERR_FULL;
        ev.error = "the KV cache is too small for this request";
        ev.stats = j->st;
        j->r.on_event(j->r.ctx, &ev);
        return true;
    }
    if (fin != ENG_FINISH_NONE) {
        ev.type = ENG_EV_DONE;
        ev.finish = fin;
        ev.stats = j->st;
        j->r.on_event(j->r.ctx, &ev);
        return true;
    }
    ev.type = ENG_EV_TOKEN;
    ev.token = j->out[j->pos % (j->n_out ? j->n_out : 1)];
    j->pos++;
    j->st.n_generated++;
    if (j->st.n_generated == 1) j->st.t_first_ms = hn_now_ms() - j->t0;
    ev.stats = j->st;
    if (j->r.accept) j->r.accept(j->r.mask_ctx, ev.token);
    j->r.on_event(j->r.ctx, &ev);
    return false;
}

static void *run(void *arg) {
    teng *t = arg;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (!t->jobs && !t->quit) pthread_cond_wait(&t->cv, &t->mu);
        if (!t->jobs && t->quit) break;
        /* one round: a step for every job, round-robin */
        int delay = 1;
        for (tjob **pp = &t->jobs; *pp;) {
            tjob *j = *pp;
            bool cancelled = j->cancelled || t->quit;
            if (j->delay_ms > delay) delay = j->delay_ms;
            pthread_mutex_unlock(&t->mu);
            bool ended = step(t, j, cancelled);
            pthread_mutex_lock(&t->mu);
            if (ended) {
                *pp = j->next;
                hn_free(j->out);
                hn_free(j);
            } else {
                pp = &j->next;
            }
        }
        if (t->jobs && !t->quit) { /* pace the round; cancels wake it early */
            struct timespec ts;
            hn_deadline_ms(&ts, (long)delay);
            pthread_cond_timedwait(&t->cv, &t->mu, &ts);
        }
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

hn_status teng_create(const tok_vocab *vocab, int32_t n_ctx, teng **out, hn_err *err) {
    *out = NULL;
    teng *t = hn_calloc(1, sizeof *t);
    if (!t) return hn_errf(err, HN_ERR_NOMEM, "out of memory");
    t->vocab = vocab;
    t->n_ctx = n_ctx > 0 ? n_ctx : 4096;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    if (pthread_create(&t->th, NULL, run, t)) {
        pthread_mutex_destroy(&t->mu);
        pthread_cond_destroy(&t->cv);
        hn_free(t);
        return hn_errf(err, HN_ERR_INTERNAL, "cannot start the test engine thread");
    }
    *out = t;
    return HN_OK;
}

void teng_free(teng *t) {
    if (!t) return;
    pthread_mutex_lock(&t->mu);
    t->quit = true;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
    pthread_join(t->th, NULL);
    for (int k = 0; k < TENG_RECENT; k++) hn_free(t->recent[k]);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
    hn_free(t);
}

int teng_active(teng *t) {
    pthread_mutex_lock(&t->mu);
    int n = 0;
    for (tjob *j = t->jobs; j; j = j->next) n++;
    pthread_mutex_unlock(&t->mu);
    return n;
}

srv_engine teng_engine(teng *t) {
    srv_engine e = {.ctx = t, .submit = teng_submit, .cancel = teng_cancel};
    return e;
}
