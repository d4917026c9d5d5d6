/* prompt.c: chat template rendering and tokenization (see prompt.h). */
#include "prompt.h"

#include <string.h>

#include "../core/alloc.h"

/* The ChatML layout, for models whose file has no template. */
static const char chatml[] =
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

static int has_token(void *user, const char *text) {
    int32_t ids[4];
    return tok_encode(user, text, strlen(text), false, true, ids, 4) == 1;
}

hn_status prm_model_init(prm_model *pm, const gguf_ctx *g, const tok_vocab *vocab, hn_err *err) {
    memset(pm, 0, sizeof *pm);
    pm->vocab = vocab;
    hn_status st = g ? chat_template_from_gguf(g, vocab, &pm->ct, err) : HN_ERR_NOT_FOUND;
    if (st == HN_ERR_NOT_FOUND) {
        int32_t b = tok_bos(vocab), e = tok_eos(vocab);
        const char *bos = b >= 0 ? tok_text(vocab, b) : NULL, *eos = e >= 0 ? tok_text(vocab, e) : NULL;
        st = chat_template_new(chatml, sizeof chatml - 1, bos, eos, has_token, (void *)vocab, &pm->ct, err);
    }
    if (st != HN_OK) {
        prm_model_free(pm);
        return st;
    }
    pm->det = chat_template_format(pm->ct);
    return HN_OK;
}

void prm_model_free(prm_model *pm) {
    chat_template_free(pm->ct);
    memset(pm, 0, sizeof *pm);
}

static chat_options options_of(const creq *r) {
    chat_options opt = {.add_generation_prompt = true,
                        .thinking = r->thinking < 0 ? CHAT_THINK_DEFAULT : r->thinking ? CHAT_THINK_ON : CHAT_THINK_OFF,
                        .kwargs = r->template_kwargs};
    return opt;
}

static bool render(const prm_model *pm, const creq *r, prm_prompt *p, api_error *e) {
    const json_t *msgs = r->messages;
    json_t *head = NULL;
    const json_t *cont = NULL; /* a final assistant message to continue */
    if (r->prefill && json_array_size(msgs) > 1) {
        cont = json_object_get(json_array_get(msgs, json_array_size(msgs) - 1), "content");
        head = json_array();
        for (size_t i = 0; head && i + 1 < json_array_size(msgs); i++) json_array_append(head, json_array_get(msgs, i));
        if (!head) return api_seterr(e, APIE_INTERNAL, NULL, "out of memory"), false;
        msgs = head;
    }
    chat_options opt = options_of(r);
    chat_prompt cp;
    hn_err err = {0};
    hn_status st = chat_render(pm->ct, msgs, r->tools, &opt, &cp, &err);
    json_decref(head);
    if (st != HN_OK) {
        if (st == HN_ERR_NOMEM) api_seterr(e, APIE_INTERNAL, NULL, "out of memory rendering the chat template");
        else api_seterr(e, APIE_INVALID, "messages", "the model's chat template refused the request: %s", err.msg);
        chat_prompt_free(&cp);
        return false;
    }
    sb_add(&p->text, cp.text ? cp.text : "", cp.len);
    if (cont) sb_add(&p->text, json_string_value(cont), json_string_length(cont));
    p->start_in_reasoning = cp.opens_think && !cont;
    /* the spans, and the continued assistant text (the request's) as one more */
    size_t nc = cont && json_string_length(cont) ? 1 : 0;
    if (cp.n_spans + nc) {
        p->spans = hn_malloc((cp.n_spans + nc) * 2 * sizeof *p->spans);
        if (!p->spans) {
            chat_prompt_free(&cp);
            return api_seterr(e, APIE_INTERNAL, NULL, "out of memory"), false;
        }
        if (cp.n_spans) memcpy(p->spans, cp.spans, cp.n_spans * 2 * sizeof *p->spans);
        if (nc) p->spans[2 * cp.n_spans] = cp.len, p->spans[2 * cp.n_spans + 1] = cp.len + json_string_length(cont);
        p->n_spans = cp.n_spans + nc;
    }
    chat_prompt_free(&cp);
    if (p->text.oom) return api_seterr(e, APIE_INTERNAL, NULL, "out of memory"), false;
    return true;
}

bool prm_build(const prm_model *pm, creq *r, prm_prompt *p, api_error *e) {
    memset(p, 0, sizeof *p);
    if (r->api == API_COMPLETIONS && r->prompt_tokens) {
        int32_t nv = tok_n_vocab(pm->vocab);
        for (int32_t i = 0; i < r->n_prompt_tokens; i++)
            if (r->prompt_tokens[i] >= nv) {
                api_seterr(e, APIE_INVALID, "prompt", "token id %d is outside the vocabulary (%d)", r->prompt_tokens[i], nv);
                return false;
            }
        if (r->n_prompt_tokens <= 0) return true; /* empty: refused by the caller */
        p->tokens = hn_malloc((size_t)r->n_prompt_tokens * sizeof(int32_t));
        if (!p->tokens) return api_seterr(e, APIE_INTERNAL, NULL, "out of memory"), false;
        memcpy(p->tokens, r->prompt_tokens, (size_t)r->n_prompt_tokens * sizeof(int32_t));
        p->n_tokens = r->n_prompt_tokens;
        return true;
    }
    if (r->api == API_COMPLETIONS) {
        sb_adds(&p->text, r->prompt ? r->prompt : "");
        if (p->text.oom) {
            prm_prompt_free(p);
            return api_seterr(e, APIE_INTERNAL, NULL, "out of memory"), false;
        }
    } else if (!render(pm, r, p, e)) {
        prm_prompt_free(p);
        return false;
    }
    int64_t n = 0;
    hn_err err = {0};
    if (chat_tokenize_spans(pm->vocab, p->text.data ? p->text.data : "", p->text.len, p->spans, p->n_spans, &p->tokens, &n,
                            &err) != HN_OK ||
        n > 0x7fffffff) {
        prm_prompt_free(p);
        return api_seterr(e, APIE_INTERNAL, NULL, "tokenizing the prompt failed: %s", err.msg), false;
    }
    p->n_tokens = (int32_t)n;
    if (pm->resume && r->api != API_COMPLETIONS && !r->prefill) {
        /* where the next turn's prompt stops repeating this one: the probes render as this prompt did */
        chat_options opt = options_of(r);
        chat_prompt cp = {.text = p->text.data ? p->text.data : "", .len = p->text.len, .spans = p->spans,
                          .n_spans = p->n_spans};
        int64_t at[CHAT_RESUME_MAX];
        /* a hint: without memory for it, none (the engine keeps the prompt's end) */
        if (chat_resume_points(pm->ct, pm->vocab, r->messages, r->tools, &opt, &cp, p->tokens, n, false, at, &err))
            for (int i = 0; i < CHAT_RESUME_MAX; i++) at[i] = -1;
        for (int i = 0; i < CHAT_RESUME_MAX; i++) { /* insertion: distinct, ascending */
            if (at[i] < 0) continue;
            int j = p->n_resume;
            while (j > 0 && p->resume[j - 1] > at[i]) j--;
            if (j > 0 && p->resume[j - 1] == at[i]) continue;
            memmove(p->resume + j + 1, p->resume + j, sizeof *p->resume * (size_t)(p->n_resume - j));
            p->resume[j] = (int32_t)at[i];
            p->n_resume++;
        }
    }
    return true;
}

void prm_prompt_free(prm_prompt *p) {
    sb_free(&p->text);
    hn_free(p->spans);
    hn_free(p->tokens);
    memset(p, 0, sizeof *p);
}
