/* prompt.c: chat template rendering and tokenization (see prompt.h). */
#include "prompt.h"

#include <string.h>

#include "../core/alloc.h"

/* The ChatML layout, for models whose file has no template. */
static const char chatml[] =
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

static int has_token(void *user, const char *text) {
    const tok_vocab *v = user;
    int32_t ids[4];
    int64_t n = tok_encode(v, text, strlen(text), false, true, ids, 4);
    return n == 1;
}

static char *token_text(const tok_vocab *v, int32_t id) {
    if (id < 0) return hn_strdup("");
    const char *t = tok_text(v, id);
    return hn_strdup(t ? t : "");
}

hn_status prm_model_init(prm_model *pm, const gguf_ctx *g, const tok_vocab *vocab, hn_err *err) {
    memset(pm, 0, sizeof *pm);
    pm->vocab = vocab;
    const char *src = g ? gguf_get_str(g, "tokenizer.chat_template") : NULL;
    pm->tpl_src = hn_strdup(src ? src : chatml);
    pm->bos_text = token_text(vocab, tok_bos(vocab));
    pm->eos_text = token_text(vocab, tok_eos(vocab));
    if (!pm->tpl_src || !pm->bos_text || !pm->eos_text) {
        prm_model_free(pm);
        return hn_errf(err, HN_ERR_NOMEM, "out of memory");
    }
    hn_status st = tpl_compile(pm->tpl_src, strlen(pm->tpl_src), &pm->tpl, err);
    if (st != HN_OK) {
        prm_model_free(pm);
        return st;
    }
    pm->det = tc_detect(pm->tpl_src, has_token, (void *)vocab);
    return HN_OK;
}

void prm_model_free(prm_model *pm) {
    tpl_free(pm->tpl);
    hn_free(pm->tpl_src);
    hn_free(pm->bos_text);
    hn_free(pm->eos_text);
    memset(pm, 0, sizeof *pm);
}

static json_t *render_vars(const prm_model *pm, const creq *r, const json_t *msgs) {
    json_t *v = json_object();
    if (!v) return NULL;
    json_object_set(v, "messages", (json_t *)msgs);
    json_object_set_new(v, "tools", r->tools ? json_incref(r->tools) : json_null());
    json_object_set_new(v, "add_generation_prompt", json_true());
    json_object_set_new(v, "bos_token", json_string(pm->bos_text));
    json_object_set_new(v, "eos_token", json_string(pm->eos_text));
    if (r->thinking >= 0) json_object_set_new(v, "enable_thinking", json_boolean(r->thinking));
    if (r->template_kwargs) {
        const char *k;
        json_t *val;
        json_object_foreach(r->template_kwargs, k, val) {
            if (!strcmp(k, "messages") || !strcmp(k, "tools")) continue;
            json_object_set(v, k, val);
        }
    }
    return v;
}

static bool render(const prm_model *pm, creq *r, sbuf *out, api_error *e) {
    json_t *msgs = r->messages;
    const char *cont = NULL; /* text of a final assistant message to continue */
    size_t cont_len = 0;
    json_t *head = NULL;
    if (r->prefill && json_array_size(msgs) > 1) {
        json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
        cont = json_string_value(json_object_get(last, "content"));
        cont_len = json_string_length(json_object_get(last, "content"));
        head = json_array();
        for (size_t i = 0; i + 1 < json_array_size(msgs); i++) json_array_append(head, json_array_get(msgs, i));
        msgs = head;
    }
    for (int attempt = 0; attempt < 2; attempt++) {
        json_t *vars = render_vars(pm, r, msgs);
        tpl_buf buf = {0};
        tpl_errkind kind = TPL_E_NONE;
        hn_err err = {0};
        hn_status st = vars ? tpl_render(pm->tpl, vars, NULL, &buf, &kind, &err) : HN_ERR_NOMEM;
        json_decref(vars);
        if (st == HN_OK) {
            sb_add(out, buf.data ? buf.data : "", buf.len);
            if (cont) sb_add(out, cont, cont_len);
            tpl_buf_free(&buf);
            json_decref(head);
            if (out->oom) return api_seterr(e, APIE_INTERNAL, NULL, "out of memory"), false;
            return true;
        }
        tpl_buf_free(&buf);
        if (st == HN_ERR_NOMEM || kind == TPL_E_NOMEM) {
            json_decref(head);
            api_seterr(e, APIE_INTERNAL, NULL, "out of memory rendering the chat template");
            return false;
        }
        /* a template that refuses system messages after the first: demote them, once */
        if (attempt == 0 && kind == TPL_E_RAISE && creq_demote_system(r) > 0) {
            if (head) { /* rebuild the head from the rewritten messages */
                json_decref(head);
                head = json_array();
                for (size_t i = 0; i + 1 < json_array_size(r->messages); i++)
                    json_array_append(head, json_array_get(r->messages, i));
                msgs = head;
            } else {
                msgs = r->messages;
            }
            continue;
        }
        json_decref(head);
        api_seterr(e, APIE_INVALID, "messages", "the model's chat template refused the request: %s", err.msg);
        return false;
    }
    json_decref(head);
    api_seterr(e, APIE_INVALID, "messages", "the model's chat template refused the request");
    return false;
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
        p->tokens = hn_malloc((size_t)r->n_prompt_tokens * sizeof(int32_t));
        if (!p->tokens) return api_seterr(e, APIE_INTERNAL, NULL, "out of memory"), false;
        memcpy(p->tokens, r->prompt_tokens, (size_t)r->n_prompt_tokens * sizeof(int32_t));
        p->n_tokens = r->n_prompt_tokens;
        return true;
    }
    if (r->api == API_COMPLETIONS) {
        sb_adds(&p->text, r->prompt ? r->prompt : "");
    } else if (!render(pm, r, &p->text, e)) {
        prm_prompt_free(p);
        return false;
    }
    if (p->text.oom) {
        prm_prompt_free(p);
        return api_seterr(e, APIE_INTERNAL, NULL, "out of memory"), false;
    }
    const char *t = p->text.data ? p->text.data : "";
    /* BOS once: when the template already printed it, the tokenizer must not add another */
    bool add_special = tok_add_bos(pm->vocab) && !(pm->bos_text[0] && !strncmp(t, pm->bos_text, strlen(pm->bos_text)));
    int64_t cap = (int64_t)p->text.len + 16;
    for (int tries = 0; tries < 2; tries++) {
        p->tokens = hn_malloc((size_t)cap * sizeof(int32_t));
        if (!p->tokens) break;
        int64_t n = tok_encode(pm->vocab, t, p->text.len, add_special, true, p->tokens, cap);
        if (n < 0) {
            prm_prompt_free(p);
            return api_seterr(e, APIE_INTERNAL, NULL, "tokenizer failed"), false;
        }
        if (n <= cap) {
            if (n > 0x7fffffff) break;
            p->n_tokens = (int32_t)n;
            p->start_in_reasoning = r->api != API_COMPLETIONS && (pm->det.flags & TC_FLAG_THINK_IN_PROMPT) &&
                                    tc_prompt_opens_think(t, p->text.len);
            return true;
        }
        hn_free(p->tokens);
        p->tokens = NULL;
        cap = n;
    }
    prm_prompt_free(p);
    return api_seterr(e, APIE_INTERNAL, NULL, "out of memory"), false;
}

void prm_prompt_free(prm_prompt *p) {
    sb_free(&p->text);
    hn_free(p->tokens);
    memset(p, 0, sizeof *p);
}
