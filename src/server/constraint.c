/* constraint.c: grammar-constrained decoding for requests (see constraint.h). */
#include "constraint.h"

#include <pthread.h>
#include <string.h>

#include "../core/alloc.h"

#include "../sample/grammar.h"

struct cst_shared {
    const prm_model *pm;
    pthread_mutex_t mu;
    gr_vocab *gv;
    bool failed;
};

/* Within this many tokens of max_tokens, the answer is steered along the
 * grammar's shortest completion, so that a call or JSON value is closed
 * rather than cut off. */
#define CST_CLOSE_WINDOW 64

struct cst_req {
    gr_grammar *g;
    gr_state *st;
    const tok_vocab *vocab;
    int32_t budget; /* the request's max_tokens (<= 0: none) */
    int32_t n;      /* tokens accepted so far */
    int32_t eog;    /* the end token to finish with */
    int32_t n_vocab; /* the grammar vocabulary's */
    uint32_t *one;  /* a bitmask with only bit `forced` set (all zero while forced < 0) */
    int32_t forced;
};

/* The token to steer towards near the end of the budget, or -1 for none. */
static int32_t steer(cst_req *c) {
    int32_t left = c->budget - c->n;
    if (c->budget <= 0 || left > CST_CLOSE_WINDOW) return -1;
    if (gr_state_done(c->st)) return c->eog;
    char text[1024];
    int64_t len = gr_state_completion(c->st, text, sizeof text);
    if (len <= 0 || len >= (int64_t)sizeof text) return -1;
    int32_t toks[512];
    int64_t nt = tok_encode(c->vocab, text, (size_t)len, false, true, toks, 512);
    /* leave room for the end token */
    return nt > 0 && nt <= 512 && nt + 1 >= left ? toks[0] : -1;
}

/* eng_request.allowed: the grammar's bitmask, or only the steered token if
 * the grammar allows it. */
static const uint32_t *cst_allowed(void *ctx) {
    cst_req *c = ctx;
    int32_t keep = steer(c);
    const uint32_t *bits = gr_state_allowed(c->st);
    if (keep < 0 || keep >= c->n_vocab || !(bits[keep >> 5] >> (keep & 31) & 1)) return bits;
    if (c->forced >= 0) c->one[c->forced >> 5] = 0;
    c->one[keep >> 5] = 1u << (keep & 31);
    c->forced = keep;
    return c->one;
}

static void cst_accept(void *ctx, int32_t token) {
    cst_req *c = ctx;
    c->n++;
    gr_accept_fn(c->st, token);
}

bool cst_available(void) { return true; }

cst_shared *cst_shared_new(const prm_model *pm) {
    cst_shared *s = hn_calloc(1, sizeof *s);
    if (!s) return NULL;
    s->pm = pm;
    pthread_mutex_init(&s->mu, NULL);
    return s;
}

void cst_shared_free(cst_shared *s) {
    if (!s) return;
    gr_vocab_free(s->gv);
    pthread_mutex_destroy(&s->mu);
    hn_free(s);
}

static gr_vocab *vocab_of(cst_shared *s, api_error *e) {
    pthread_mutex_lock(&s->mu);
    if (!s->gv && !s->failed) {
        hn_err err = {0};
        if (gr_vocab_from_tok(s->pm->vocab, &s->gv, &err) != HN_OK) s->failed = true;
    }
    gr_vocab *v = s->gv;
    pthread_mutex_unlock(&s->mu);
    if (!v) api_seterr(e, APIE_INTERNAL, NULL, "cannot index the vocabulary for constrained decoding");
    return v;
}

void cst_req_free(cst_req *c) {
    if (!c) return;
    gr_state_free(c->st);
    gr_grammar_free(c->g);
    hn_free(c->one);
    hn_free(c);
}

bool cst_attach(cst_shared *s, const creq *r, const prm_prompt *p, eng_request *er, cst_req **out, api_error *e) {
    *out = NULL;
    tc_format fmt = s->pm->det.format;
    bool tools = (r->tool_choice == CREQ_TOOLS_REQUIRED || r->tool_choice == CREQ_TOOLS_NAMED) && r->tools &&
                 fmt != TC_FORMAT_NONE;
    bool json = r->format != CREQ_FMT_TEXT && !tools;
    if (!tools && !json) return true;
    gr_vocab *v = vocab_of(s, e);
    if (!v) return false;
    cst_req *c = hn_calloc(1, sizeof *c);
    if (!c) return api_seterr(e, APIE_INTERNAL, NULL, "out of memory"), false;
    hn_err err = {0};
    hn_status st;
    if (tools) {
        gr_tool_opts o = {.format = fmt,
                          .name = r->tool_choice == CREQ_TOOLS_NAMED ? r->tool_name : NULL,
                          .parallel = r->parallel_tool_calls,
                          .think = p->start_in_reasoning ? GR_THINK_OPEN
                                   : (s->pm->det.flags & TC_FLAG_REASONING) && r->thinking != 0 ? GR_THINK_OPTIONAL
                                                                                              : GR_THINK_NONE};
        st = gr_from_tools(r->tools, &o, &c->g, &err);
    } else if (r->format == CREQ_FMT_JSON_SCHEMA) {
        st = gr_from_schema(r->schema, &c->g, &err);
    } else {
        st = gr_any_object(&c->g, &err);
    }
    if (st == HN_OK) st = gr_state_new(c->g, v, &c->st, &err);
    c->n_vocab = gr_vocab_n(v);
    c->forced = -1;
    if (st == HN_OK && !(c->one = hn_calloc(((size_t)c->n_vocab + 31) / 32, sizeof *c->one))) st = HN_ERR_NOMEM;
    if (st != HN_OK) {
        cst_req_free(c);
        if (st == HN_ERR_NOMEM) api_seterr(e, APIE_INTERNAL, NULL, "out of memory building the grammar");
        else api_seterr(e, APIE_INVALID, tools ? "tool_choice" : "response_format", "%s", err.msg[0] ? err.msg : hn_status_str(st));
        return false;
    }
    c->vocab = s->pm->vocab;
    c->budget = er->max_tokens;
    c->eog = tok_eos(s->pm->vocab);
    er->allowed = cst_allowed;
    er->accept = cst_accept;
    er->mask_ctx = c;
    *out = c;
    return true;
}
