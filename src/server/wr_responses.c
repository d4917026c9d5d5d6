/* wr_responses.c: the OpenAI Responses API object and its SSE event stream
 * (see writer.h). Codex builds its history from response.output_item.done
 * and needs response.completed; both always come. Output items: reasoning
 * ("rs_", with the text as a summary_text part), message ("msg_", one
 * output_text part), function_call ("fc_", call_id "call_..."), and
 * custom_tool_call for freeform tools (input = the "input" argument, sent
 * whole when the call ends). */
#include <string.h>

#include "../core/alloc.h"
#include "writer_int.h"

static void ev(wr_writer *w, sbuf *out, const char *type) {
    sb_addf(out, "event: %s\ndata: {\"type\":\"%s\",\"sequence_number\":%d", type, type, w->seq++);
}

static bool is_custom(const wr_writer *w, const char *name) {
    size_t i;
    json_t *v;
    json_array_foreach(w->custom_tools, i, v) if (json_is_string(v) && !strcmp(json_string_value(v), name)) return true;
    return false;
}

/* The response object (status, output so far, usage or null). */
static void response_obj(wr_writer *w, sbuf *out, const char *status, const api_usage *u, const char *incomplete,
                         const api_error *err) {
    sb_addf(out, "{\"id\":\"%s\",\"object\":\"response\",\"created_at\":%lld,\"status\":\"%s\",\"model\":", w->id,
            (long long)w->created, status);
    sb_add_jstr(out, w->model, strlen(w->model));
    sb_adds(out, ",\"output\":");
    sb_add_json(out, w->items);
    sb_adds(out, ",\"parallel_tool_calls\":true,\"tool_choice\":\"auto\",\"tools\":[],\"error\":");
    if (err) {
        sb_addf(out, "{\"code\":\"%s\",\"message\":", err->kind == APIE_CONTEXT ? "context_length_exceeded" : "server_error");
        sb_add_jstr(out, err->message, strlen(err->message));
        sb_adds(out, "}");
    } else {
        sb_adds(out, "null");
    }
    if (incomplete)
        sb_addf(out, ",\"incomplete_details\":{\"reason\":\"%s\"}", incomplete);
    else
        sb_adds(out, ",\"incomplete_details\":null");
    sb_adds(out, ",\"usage\":");
    if (u) {
        sb_addf(out,
                "{\"input_tokens\":%d,\"input_tokens_details\":{\"cached_tokens\":%d},\"output_tokens\":%d,"
                "\"output_tokens_details\":{\"reasoning_tokens\":%d},\"total_tokens\":%d",
                u->prompt_tokens, u->cached_tokens, u->completion_tokens, u->reasoning_tokens,
                u->prompt_tokens + u->completion_tokens);
        wr_usage_spec(u, out);
        sb_adds(out, "}");
    } else
        sb_adds(out, "null");
    sb_adds(out, "}");
}

void wr_resp_begin(wr_writer *w, sbuf *out) {
    ev(w, out, "response.created");
    sb_adds(out, ",\"response\":");
    response_obj(w, out, "in_progress", NULL, NULL, NULL);
    sb_adds(out, "}\n\n");
    ev(w, out, "response.in_progress");
    sb_adds(out, ",\"response\":");
    response_obj(w, out, "in_progress", NULL, NULL, NULL);
    sb_adds(out, "}\n\n");
}

static json_t *text_item(wr_writer *w, int kind) {
    const char *t = w->item_text.data ? w->item_text.data : "";
    if (kind == WR_OPEN_THINKING)
        return json_pack("{s:s,s:s,s:[{s:s,s:s%}],s:n}", "id", w->item_id, "type", "reasoning", "summary", "type",
                         "summary_text", "text", t, w->item_text.len, "encrypted_content");
    return json_pack("{s:s,s:s,s:s,s:s,s:[{s:s,s:s%,s:[]}]}", "id", w->item_id, "type", "message", "status",
                     "completed", "role", "assistant", "content", "type", "output_text", "text", t, w->item_text.len,
                     "annotations");
}

static void close_item(wr_writer *w, sbuf *out) {
    if (w->open != WR_OPEN_TEXT && w->open != WR_OPEN_THINKING) {
        w->open = WR_OPEN_NONE;
        return;
    }
    const char *t = w->item_text.data ? w->item_text.data : "";
    json_t *item = text_item(w, w->open);
    if (w->stream) {
        if (w->open == WR_OPEN_THINKING) {
            ev(w, out, "response.reasoning_summary_text.done");
            sb_addf(out, ",\"item_id\":\"%s\",\"output_index\":%d,\"summary_index\":0,\"text\":", w->item_id, w->item_index);
            sb_add_jstr(out, t, w->item_text.len);
            sb_adds(out, "}\n\n");
            ev(w, out, "response.reasoning_summary_part.done");
            sb_addf(out, ",\"item_id\":\"%s\",\"output_index\":%d,\"summary_index\":0,\"part\":{\"type\":\"summary_text\",\"text\":",
                    w->item_id, w->item_index);
            sb_add_jstr(out, t, w->item_text.len);
            sb_adds(out, "}}\n\n");
        } else {
            ev(w, out, "response.output_text.done");
            sb_addf(out, ",\"item_id\":\"%s\",\"output_index\":%d,\"content_index\":0,\"text\":", w->item_id, w->item_index);
            sb_add_jstr(out, t, w->item_text.len);
            sb_adds(out, ",\"logprobs\":[]}\n\n");
            ev(w, out, "response.content_part.done");
            sb_addf(out, ",\"item_id\":\"%s\",\"output_index\":%d,\"content_index\":0,\"part\":{\"type\":\"output_text\",\"text\":",
                    w->item_id, w->item_index);
            sb_add_jstr(out, t, w->item_text.len);
            sb_adds(out, ",\"annotations\":[]}}\n\n");
        }
        ev(w, out, "response.output_item.done");
        sb_addf(out, ",\"output_index\":%d,\"item\":", w->item_index);
        sb_add_json(out, item);
        sb_adds(out, "}\n\n");
    }
    if (!item || json_array_append_new(w->items, item)) out->oom = true;
    sb_reset(&w->item_text);
    w->open = WR_OPEN_NONE;
}

void wr_resp_text(wr_writer *w, sbuf *out, const char *s, size_t n, bool reasoning) {
    int want = reasoning ? WR_OPEN_THINKING : WR_OPEN_TEXT;
    if (w->open != want) {
        close_item(w, out);
        w->open = want;
        w->item_index = w->n_items++;
        api_make_id(w->item_id, sizeof w->item_id, reasoning ? "rs_" : "msg_", 24);
        if (w->stream) {
            ev(w, out, "response.output_item.added");
            sb_addf(out, ",\"output_index\":%d,\"item\":", w->item_index);
            if (reasoning) {
                sb_addf(out, "{\"id\":\"%s\",\"type\":\"reasoning\",\"summary\":[]}}\n\n", w->item_id);
                ev(w, out, "response.reasoning_summary_part.added");
                sb_addf(out, ",\"item_id\":\"%s\",\"output_index\":%d,\"summary_index\":0,\"part\":{\"type\":\"summary_text\",\"text\":\"\"}}\n\n",
                        w->item_id, w->item_index);
            } else {
                sb_addf(out, "{\"id\":\"%s\",\"type\":\"message\",\"status\":\"in_progress\",\"role\":\"assistant\",\"content\":[]}}\n\n",
                        w->item_id);
                ev(w, out, "response.content_part.added");
                sb_addf(out, ",\"item_id\":\"%s\",\"output_index\":%d,\"content_index\":0,\"part\":{\"type\":\"output_text\",\"text\":\"\",\"annotations\":[]}}\n\n",
                        w->item_id, w->item_index);
            }
        }
    }
    sb_add(&w->item_text, s, n);
    if (!w->stream) return;
    if (reasoning) {
        ev(w, out, "response.reasoning_summary_text.delta");
        sb_addf(out, ",\"item_id\":\"%s\",\"output_index\":%d,\"summary_index\":0,\"delta\":", w->item_id, w->item_index);
    } else {
        ev(w, out, "response.output_text.delta");
        sb_addf(out, ",\"item_id\":\"%s\",\"output_index\":%d,\"content_index\":0,\"delta\":", w->item_id, w->item_index);
    }
    sb_add_jstr(out, s, n);
    sb_adds(out, reasoning ? "}\n\n" : ",\"logprobs\":[]}\n\n");
}

void wr_resp_call_start(wr_writer *w, sbuf *out, wr_call *c) {
    close_item(w, out);
    w->open = WR_OPEN_TOOL;
    c->output_index = w->n_items++;
    c->custom = is_custom(w, c->name);
    api_make_id(c->item_id, sizeof c->item_id, c->custom ? "ctc_" : "fc_", 24);
    if (!w->stream || c->custom) return; /* a custom call is announced whole at its end */
    ev(w, out, "response.output_item.added");
    sb_addf(out, ",\"output_index\":%d,\"item\":{\"id\":\"%s\",\"type\":\"function_call\",\"status\":\"in_progress\",\"call_id\":\"%s\",\"name\":",
            c->output_index, c->item_id, c->id);
    sb_add_jstr(out, c->name, strlen(c->name));
    sb_adds(out, ",\"arguments\":\"\"}}\n\n");
}

void wr_resp_call_args(wr_writer *w, sbuf *out, wr_call *c, const char *s, size_t n) {
    if (!w->stream || c->custom) return;
    ev(w, out, "response.function_call_arguments.delta");
    sb_addf(out, ",\"item_id\":\"%s\",\"output_index\":%d,\"delta\":", c->item_id, c->output_index);
    sb_add_jstr(out, s, n);
    sb_adds(out, "}\n\n");
}

void wr_resp_call_end(wr_writer *w, sbuf *out, wr_call *c) {
    const char *args = c->args.data ? c->args.data : "{}";
    size_t alen = c->args.data ? c->args.len : 2;
    json_t *item;
    if (c->custom) {
        json_t *a = json_loadb(args, alen, 0, NULL);
        const char *in = json_string_value(json_object_get(a, "input"));
        item = json_pack("{s:s,s:s,s:s,s:s,s:s,s:s}", "id", c->item_id, "type", "custom_tool_call", "status",
                         "completed", "call_id", c->id, "name", c->name, "input", in ? in : "");
        json_decref(a);
    } else {
        item = json_pack("{s:s,s:s,s:s,s:s,s:s,s:s%}", "id", c->item_id, "type", "function_call", "status",
                         "completed", "call_id", c->id, "name", c->name, "arguments", args, alen);
    }
    if (w->stream && item) {
        if (c->custom) {
            ev(w, out, "response.output_item.added");
            sb_addf(out, ",\"output_index\":%d,\"item\":", c->output_index);
            sb_add_json(out, item);
            sb_adds(out, "}\n\n");
        } else {
            ev(w, out, "response.function_call_arguments.done");
            sb_addf(out, ",\"item_id\":\"%s\",\"output_index\":%d,\"arguments\":", c->item_id, c->output_index);
            sb_add_jstr(out, args, alen);
            sb_adds(out, "}\n\n");
        }
        ev(w, out, "response.output_item.done");
        sb_addf(out, ",\"output_index\":%d,\"item\":", c->output_index);
        sb_add_json(out, item);
        sb_adds(out, "}\n\n");
    }
    if (!item || json_array_append_new(w->items, item)) out->oom = true;
    if (w->open == WR_OPEN_TOOL) w->open = WR_OPEN_NONE;
}

void wr_resp_end(wr_writer *w, sbuf *out, api_finish fin, const char *stop_seq, const api_usage *u) {
    (void)stop_seq;
    close_item(w, out);
    const char *incomplete = fin == API_FIN_LENGTH ? "max_output_tokens" : fin == API_FIN_CONTEXT ? "max_output_tokens" : NULL;
    const char *status = incomplete ? "incomplete" : "completed";
    if (!w->stream) {
        response_obj(w, out, status, u, incomplete, NULL);
        return;
    }
    ev(w, out, incomplete ? "response.incomplete" : "response.completed");
    sb_adds(out, ",\"response\":");
    response_obj(w, out, status, u, incomplete, NULL);
    sb_adds(out, "}\n\n");
}

void wr_resp_fail(wr_writer *w, sbuf *out, const api_error *e) {
    close_item(w, out);
    ev(w, out, "response.failed");
    sb_adds(out, ",\"response\":");
    response_obj(w, out, "failed", NULL, NULL, e);
    sb_adds(out, "}\n\n");
}
