/* writer.c: the writer object, dispatch, and the OpenAI chat / completions
 * formats (Anthropic is in wr_anthropic.c, Responses in wr_responses.c). */
#include "writer_int.h"

#include <string.h>
#include <time.h>

#include "../core/alloc.h"

wr_writer *wr_new(const wr_meta *m) {
    wr_writer *w = hn_calloc(1, sizeof *w);
    if (!w) return NULL;
    w->api = m->api;
    w->stream = m->stream;
    w->include_usage = m->include_usage;
    w->model = hn_strdup(m->model ? m->model : "");
    w->created = m->created ? m->created : (int64_t)time(NULL);
    w->custom_tools = m->custom_tools ? json_deep_copy(m->custom_tools) : NULL;
    w->items = json_array();
    const char *prefix = m->api == API_CHAT ? "chatcmpl-" : m->api == API_COMPLETIONS ? "cmpl-"
                         : m->api == API_MESSAGES ? "msg_" : "resp_";
    api_make_id(w->id, sizeof w->id, prefix, 24);
    if (!w->model || !w->items) {
        wr_free(w);
        return NULL;
    }
    return w;
}

void wr_free(wr_writer *w) {
    if (!w) return;
    hn_free(w->model);
    json_decref(w->custom_tools);
    json_decref(w->items);
    sb_free(&w->text);
    sb_free(&w->reasoning);
    sb_free(&w->item_text);
    for (int i = 0; i < w->n_calls; i++) {
        hn_free(w->calls[i].name);
        sb_free(&w->calls[i].args);
    }
    hn_free(w->calls);
    hn_free(w);
}

const char *wr_id(const wr_writer *w) { return w->id; }
int wr_ncalls(const wr_writer *w) { return w->n_calls; }

wr_call *wr_call_at(wr_writer *w, int index) {
    return index >= 0 && index < w->n_calls ? &w->calls[index] : NULL;
}

/* ---- OpenAI chat / completions ---- */

static void chunk_head(wr_writer *w, sbuf *out) {
    sb_addf(out, "data: {\"id\":\"%s\",\"object\":\"%s\",\"created\":%lld,\"model\":", w->id,
            w->api == API_CHAT ? "chat.completion.chunk" : "text_completion", (long long)w->created);
    sb_add_jstr(out, w->model, strlen(w->model));
    sb_adds(out, ",\"system_fingerprint\":\"hone\",\"choices\":[");
}

/* A chat chunk whose delta is the given JSON fields (already encoded, without braces). */
static void chat_delta(wr_writer *w, sbuf *out, const char *field, const char *s, size_t n) {
    chunk_head(w, out);
    sb_addf(out, "{\"index\":0,\"delta\":{\"%s\":", field);
    sb_add_jstr(out, s, n);
    sb_adds(out, "},\"logprobs\":null,\"finish_reason\":null}]}\n\n");
}

void wr_usage_spec(const api_usage *u, sbuf *out) {
    if (!u || u->drafted_tokens <= 0) return;
    sb_addf(out, ",\"speculative\":{\"drafted_tokens\":%d,\"accepted_tokens\":%d,\"steps_saved\":%d}",
            u->drafted_tokens, u->accepted_tokens, u->accepted_tokens);
}

static void usage_json(const api_usage *u, sbuf *out) {
    sb_addf(out,
            "{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d,"
            "\"prompt_tokens_details\":{\"cached_tokens\":%d},"
            "\"completion_tokens_details\":{\"reasoning_tokens\":%d}",
            u->prompt_tokens, u->completion_tokens, u->prompt_tokens + u->completion_tokens,
            u->cached_tokens, u->reasoning_tokens);
    wr_usage_spec(u, out);
    sb_adds(out, "}");
}

static const char *chat_finish(const wr_writer *w, api_finish f) {
    switch (f) {
    case API_FIN_LENGTH:
    case API_FIN_CONTEXT: return "length";
    case API_FIN_TOOL_CALLS: return "tool_calls";
    default: return w->n_calls ? "tool_calls" : "stop";
    }
}

static void chat_end(wr_writer *w, sbuf *out, api_finish fin, const api_usage *u) {
    const char *fr = chat_finish(w, fin);
    if (w->stream) {
        chunk_head(w, out);
        if (w->api == API_CHAT)
            sb_addf(out, "{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"%s\"}]}\n\n", fr);
        else
            sb_addf(out, "{\"index\":0,\"text\":\"\",\"logprobs\":null,\"finish_reason\":\"%s\"}]}\n\n", fr);
        if (w->include_usage) {
            chunk_head(w, out);
            sb_adds(out, "],\"usage\":");
            usage_json(u, out);
            sb_adds(out, "}\n\n");
        }
        sb_adds(out, "data: [DONE]\n\n");
        return;
    }
    if (w->api == API_COMPLETIONS) {
        sb_addf(out, "{\"id\":\"%s\",\"object\":\"text_completion\",\"created\":%lld,\"model\":", w->id,
                (long long)w->created);
        sb_add_jstr(out, w->model, strlen(w->model));
        sb_adds(out, ",\"choices\":[{\"index\":0,\"text\":");
        sb_add_jstr(out, w->text.data ? w->text.data : "", w->text.len);
        sb_addf(out, ",\"logprobs\":null,\"finish_reason\":\"%s\"}],\"usage\":", fr);
        usage_json(u, out);
        sb_adds(out, "}");
        return;
    }
    sb_addf(out, "{\"id\":\"%s\",\"object\":\"chat.completion\",\"created\":%lld,\"model\":", w->id,
            (long long)w->created);
    sb_add_jstr(out, w->model, strlen(w->model));
    sb_adds(out, ",\"system_fingerprint\":\"hone\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":");
    if (w->text.len || !w->n_calls)
        sb_add_jstr(out, w->text.data ? w->text.data : "", w->text.len);
    else
        sb_adds(out, "null");
    if (w->reasoning.len) {
        sb_adds(out, ",\"reasoning_content\":");
        sb_add_jstr(out, w->reasoning.data, w->reasoning.len);
    }
    if (w->n_calls) {
        sb_adds(out, ",\"tool_calls\":[");
        for (int i = 0; i < w->n_calls; i++) {
            wr_call *c = &w->calls[i];
            sb_addf(out, "%s{\"id\":\"%s\",\"type\":\"function\",\"function\":{\"name\":", i ? "," : "", c->id);
            sb_add_jstr(out, c->name, strlen(c->name));
            sb_adds(out, ",\"arguments\":");
            sb_add_jstr(out, c->args.data ? c->args.data : "{}", c->args.data ? c->args.len : 2);
            sb_adds(out, "}}");
        }
        sb_adds(out, "]");
    }
    sb_addf(out, "},\"logprobs\":null,\"finish_reason\":\"%s\"}],\"usage\":", fr);
    usage_json(u, out);
    sb_adds(out, "}");
}

/* ---- dispatch ---- */

void wr_begin(wr_writer *w, sbuf *out, int32_t n_prompt) {
    if (w->begun) return;
    w->begun = true;
    w->n_prompt = n_prompt;
    if (!w->stream) return;
    switch (w->api) {
    case API_CHAT:
        chunk_head(w, out);
        sb_adds(out, "{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n");
        break;
    case API_COMPLETIONS: break;
    case API_MESSAGES: wr_anth_begin(w, out); break;
    case API_RESPONSES: wr_resp_begin(w, out); break;
    }
}

static void text_or_reasoning(wr_writer *w, sbuf *out, const char *s, size_t n, bool reasoning) {
    if (!n || w->ended) return;
    if (!w->begun) wr_begin(w, out, 0);
    sb_add(reasoning ? &w->reasoning : &w->text, s, n);
    if (w->api == API_MESSAGES) {
        wr_anth_text(w, out, s, n, reasoning);
        return;
    }
    if (w->api == API_RESPONSES) {
        wr_resp_text(w, out, s, n, reasoning);
        return;
    }
    if (!w->stream) return;
    if (w->api == API_COMPLETIONS) {
        chunk_head(w, out);
        sb_adds(out, "{\"index\":0,\"text\":");
        sb_add_jstr(out, s, n);
        sb_adds(out, ",\"logprobs\":null,\"finish_reason\":null}]}\n\n");
        return;
    }
    chat_delta(w, out, reasoning ? "reasoning_content" : "content", s, n);
}

void wr_text(wr_writer *w, sbuf *out, const char *s, size_t n) { text_or_reasoning(w, out, s, n, false); }

void wr_reasoning(wr_writer *w, sbuf *out, const char *s, size_t n) {
    /* legacy completions have no reasoning channel: it is text */
    text_or_reasoning(w, out, s, n, w->api != API_COMPLETIONS);
}

void wr_call_start(wr_writer *w, sbuf *out, int index, const char *id, const char *name) {
    if (w->ended || index != w->n_calls) return; /* calls arrive in order */
    if (!w->begun) wr_begin(w, out, 0);
    if (w->n_calls == w->cap_calls) {
        int cap = w->cap_calls ? w->cap_calls * 2 : 4;
        wr_call *c = hn_realloc(w->calls, (size_t)cap * sizeof *c);
        if (!c) {
            out->oom = true;
            return;
        }
        w->calls = c;
        w->cap_calls = cap;
    }
    wr_call *c = &w->calls[w->n_calls];
    memset(c, 0, sizeof *c);
    snprintf(c->id, sizeof c->id, "%s", id ? id : "");
    c->name = hn_strdup(name ? name : "");
    if (!c->name) {
        out->oom = true;
        return;
    }
    w->n_calls++;
    if (w->api == API_MESSAGES) {
        wr_anth_call_start(w, out, c);
    } else if (w->api == API_RESPONSES) {
        wr_resp_call_start(w, out, c);
    } else if (w->stream && w->api == API_CHAT) {
        chunk_head(w, out);
        sb_addf(out, "{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":%d,\"id\":\"%s\",\"type\":\"function\",\"function\":{\"name\":",
                index, c->id);
        sb_add_jstr(out, c->name, strlen(c->name));
        sb_adds(out, ",\"arguments\":\"\"}}]},\"logprobs\":null,\"finish_reason\":null}]}\n\n");
    }
}

void wr_call_args(wr_writer *w, sbuf *out, int index, const char *s, size_t n) {
    if (w->ended || index < 0 || index >= w->n_calls || !n) return;
    wr_call *c = &w->calls[index];
    if (c->ended) return;
    sb_add(&c->args, s, n);
    if (w->api == API_MESSAGES) {
        wr_anth_call_args(w, out, c, s, n);
    } else if (w->api == API_RESPONSES) {
        wr_resp_call_args(w, out, c, s, n);
    } else if (w->stream && w->api == API_CHAT) {
        chunk_head(w, out);
        sb_addf(out, "{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":%d,\"function\":{\"arguments\":", index);
        sb_add_jstr(out, s, n);
        sb_adds(out, "}}]},\"logprobs\":null,\"finish_reason\":null}]}\n\n");
    }
}

void wr_call_end(wr_writer *w, sbuf *out, int index) {
    if (w->ended || index < 0 || index >= w->n_calls) return;
    wr_call *c = &w->calls[index];
    if (c->ended) return;
    c->ended = true;
    if (w->api == API_MESSAGES) wr_anth_call_end(w, out, c);
    else if (w->api == API_RESPONSES) wr_resp_call_end(w, out, c);
}

void wr_keepalive(wr_writer *w, sbuf *out) {
    if (!w->stream || w->ended) return;
    if (w->api == API_MESSAGES && w->begun)
        sb_adds(out, "event: ping\ndata: {\"type\":\"ping\"}\n\n");
    else
        sb_adds(out, ": keep-alive\n\n");
}

void wr_end(wr_writer *w, sbuf *out, api_finish fin, const char *stop_seq, const api_usage *u) {
    if (w->ended) return;
    if (!w->begun) wr_begin(w, out, u ? u->prompt_tokens : 0);
    api_usage zero = {0};
    if (!u) u = &zero;
    /* close calls the parser left open */
    for (int i = 0; i < w->n_calls; i++)
        if (!w->calls[i].ended) wr_call_end(w, out, i);
    if (w->n_calls && (fin == API_FIN_STOP || fin == API_FIN_STOP_SEQ)) fin = API_FIN_TOOL_CALLS;
    w->ended = true;
    switch (w->api) {
    case API_CHAT:
    case API_COMPLETIONS: chat_end(w, out, fin, u); break;
    case API_MESSAGES: wr_anth_end(w, out, fin, stop_seq, u); break;
    case API_RESPONSES: wr_resp_end(w, out, fin, stop_seq, u); break;
    }
}

void wr_fail(wr_writer *w, sbuf *out, const api_error *e) {
    if (w->ended) return;
    w->ended = true;
    if (!w->stream) {
        api_error_json(w->api, e, out);
        return;
    }
    switch (w->api) {
    case API_CHAT:
    case API_COMPLETIONS:
        sb_adds(out, "data: ");
        api_error_json(w->api, e, out);
        sb_adds(out, "\n\ndata: [DONE]\n\n");
        break;
    case API_MESSAGES: wr_anth_fail(w, out, e); break;
    case API_RESPONSES: wr_resp_fail(w, out, e); break;
    }
}
