/* gen_output.c: the token -> text -> events -> bytes pipeline (see gen_output.h). */
#include "gen_output.h"

#include <string.h>

#include "../core/alloc.h"

struct gen_state {
    gen_opts o;
    wr_writer *w;
    tok_stream ts;
    ss_matcher ss;
    tc_parser *tc;
    sbuf text;         /* scratch: text released by the stop matcher */
    sbuf *out;         /* while feeding: where the writer appends */
    int32_t n_reasoning;
    bool saw_reasoning, saw_content; /* in the current token */
    int stop;          /* matched stop index or -1 */
    bool halted;       /* single_call: the first call ended */
};

static void on_tc(void *user, const tc_event *ev) {
    gen_state *g = user;
    if (g->halted) return;
    switch (ev->kind) {
    case TC_EV_CONTENT:
        wr_text(g->w, g->out, ev->text, ev->len);
        g->saw_content = true;
        break;
    case TC_EV_REASONING:
        wr_reasoning(g->w, g->out, ev->text, ev->len);
        g->saw_reasoning = true;
        break;
    case TC_EV_CALL_START: wr_call_start(g->w, g->out, ev->index, ev->id, ev->name); break;
    case TC_EV_CALL_ARGS: wr_call_args(g->w, g->out, ev->index, ev->text, ev->len); break;
    case TC_EV_CALL_END:
        wr_call_end(g->w, g->out, ev->index);
        if (g->o.single_call) g->halted = true;
        break;
    }
}

gen_state *gen_new(const gen_opts *o, wr_writer *w) {
    gen_state *g = hn_calloc(1, sizeof *g);
    if (!g) return NULL;
    g->o = *o;
    g->w = w;
    g->stop = -1;
    /* generated text continues the prompt: keep the first token's leading
     * space (SentencePiece vocabularies), as llama.cpp's server does */
    g->ts.first = true;
    ss_init(&g->ss, o->stops, o->n_stops);
    if (o->parse) {
        tc_options to = {.flags = o->tc_flags, .start_in_reasoning = o->start_in_reasoning};
        if (tc_parser_new(o->format, o->tools, &to, &g->tc, NULL) != HN_OK) {
            gen_free(g);
            return NULL;
        }
    }
    return g;
}

void gen_free(gen_state *g) {
    if (!g) return;
    tc_parser_free(g->tc);
    ss_free(&g->ss);
    sb_free(&g->text);
    hn_free(g);
}

bool gen_stopped(const gen_state *g) { return g->stop >= 0 || g->halted; }

/* Text released by the stop matcher goes to the parser or straight out. */
static void emit(gen_state *g, const char *s, size_t n, sbuf *out) {
    if (!n || g->o.drop_output) return;
    g->out = out;
    if (g->tc) {
        if (tc_parser_feed(g->tc, s, n, on_tc, g) != HN_OK) out->oom = true;
    } else {
        wr_text(g->w, out, s, n);
    }
}

bool gen_token(gen_state *g, int32_t token, sbuf *out) {
    if (g->stop >= 0 || g->halted) return true;
    char piece[1024];
    size_t n = tok_stream_push(g->o.vocab, &g->ts, token, piece, sizeof piece);
    g->saw_reasoning = g->saw_content = false;
    sb_reset(&g->text);
    int m = ss_feed(&g->ss, piece, n, &g->text);
    emit(g, g->text.data, g->text.len, out);
    if (g->saw_reasoning && !g->saw_content) g->n_reasoning++;
    if (m >= 0) g->stop = m;
    return m >= 0 || g->halted;
}

void gen_end(gen_state *g, eng_finish fin, const char *errmsg, const eng_req_stats *st, sbuf *out) {
    api_usage u = {0};
    if (st) {
        u.prompt_tokens = st->n_prompt;
        u.cached_tokens = st->n_cached;
        u.completion_tokens = st->n_generated;
        u.drafted_tokens = st->n_drafted;
        u.accepted_tokens = st->n_accepted;
    }
    if (fin == ENG_FINISH_ERROR) {
        api_error e;
        api_seterr(&e, APIE_INTERNAL, NULL, "generation failed: %s", errmsg && *errmsg ? errmsg : "engine error");
        wr_fail(g->w, out, &e);
        return;
    }
    /* flush: detokenizer tail, held stop-string prefix, parser */
    if (g->stop < 0 && !g->halted) {
        char tail[8];
        size_t n = tok_stream_flush(&g->ts, tail, sizeof tail);
        sb_reset(&g->text);
        if (ss_feed(&g->ss, tail, n, &g->text) >= 0) g->stop = g->ss.matched;
        if (g->stop < 0) ss_flush(&g->ss, &g->text);
        emit(g, g->text.data, g->text.len, out);
    }
    bool truncated = false;
    if (g->tc) {
        g->out = out;
        if (!g->o.drop_output && !g->halted && tc_parser_finish(g->tc, on_tc, g) != HN_OK) out->oom = true;
        truncated = tc_parser_truncated(g->tc) != 0;
    }
    u.reasoning_tokens = g->n_reasoning;
    api_finish f;
    switch (fin) {
    case ENG_FINISH_LENGTH: f = API_FIN_LENGTH; break;
    case ENG_FINISH_CONTEXT: f = API_FIN_CONTEXT; break;
    default: f = API_FIN_STOP; break;
    }
    if (g->stop >= 0) f = API_FIN_STOP_SEQ;
    else if (truncated && f == API_FIN_STOP) f = API_FIN_LENGTH;
    /* a call cut off by the token limit is not a finished tool call */
    wr_end(g->w, out, truncated && f != API_FIN_STOP_SEQ ? API_FIN_LENGTH : f,
           g->stop >= 0 ? g->o.stops[g->stop] : NULL, &u);
}
