/* wr_anthropic.c: the Anthropic Messages response and its SSE event stream
 * (see writer.h for the sequence). Tool call ids "call_X" are reported as
 * "toolu_X"; thinking blocks carry an empty signature (any signature sent
 * back is accepted by the request mapper). */
#include <string.h>

#include "writer_int.h"

static void ev(sbuf *out, const char *name) { sb_addf(out, "event: %s\ndata: ", name); }

static void toolu_id(const char *call_id, char *out, size_t cap) {
    const char *suffix = strncmp(call_id, "call_", 5) ? call_id : call_id + 5;
    snprintf(out, cap, "toolu_%s", suffix);
}

static const char *stop_reason(api_finish f) {
    switch (f) {
    case API_FIN_STOP_SEQ: return "stop_sequence";
    case API_FIN_LENGTH: return "max_tokens";
    case API_FIN_CONTEXT: return "model_context_window_exceeded";
    case API_FIN_TOOL_CALLS: return "tool_use";
    default: return "end_turn";
    }
}

static void usage(const api_usage *u, int32_t n_prompt_fallback, sbuf *out) {
    int32_t prompt = u ? u->prompt_tokens : n_prompt_fallback;
    int32_t cached = u ? u->cached_tokens : 0;
    /* Anthropic counts input_tokens without the cached part */
    sb_addf(out,
            "{\"input_tokens\":%d,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":%d,"
            "\"output_tokens\":%d",
            prompt - cached, cached, u ? u->completion_tokens : 0);
    wr_usage_spec(u, out);
    sb_adds(out, "}");
}

static void close_block(wr_writer *w, sbuf *out) {
    if (w->open == WR_OPEN_NONE) return;
    if (w->stream) {
        if (w->open == WR_OPEN_THINKING) {
            ev(out, "content_block_delta");
            sb_addf(out, "{\"type\":\"content_block_delta\",\"index\":%d,\"delta\":{\"type\":\"signature_delta\",\"signature\":\"\"}}\n\n",
                    w->n_blocks - 1);
        }
        ev(out, "content_block_stop");
        sb_addf(out, "{\"type\":\"content_block_stop\",\"index\":%d}\n\n", w->n_blocks - 1);
    }
    w->open = WR_OPEN_NONE;
}

/* Non-streaming bodies list blocks in order: keep that order in items. */
static void record_block(wr_writer *w, int kind, int call) {
    json_t *b = json_pack("{s:i,s:i}", "k", kind, "c", call);
    if (b) json_array_append_new(w->items, b);
}

void wr_anth_begin(wr_writer *w, sbuf *out) {
    ev(out, "message_start");
    sb_addf(out, "{\"type\":\"message_start\",\"message\":{\"id\":\"%s\",\"type\":\"message\",\"role\":\"assistant\",\"model\":", w->id);
    sb_add_jstr(out, w->model, strlen(w->model));
    sb_adds(out, ",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":");
    api_usage u = {.prompt_tokens = w->n_prompt};
    usage(&u, 0, out);
    sb_adds(out, "}}\n\n");
    sb_adds(out, "event: ping\ndata: {\"type\":\"ping\"}\n\n");
}

void wr_anth_text(wr_writer *w, sbuf *out, const char *s, size_t n, bool thinking) {
    int want = thinking ? WR_OPEN_THINKING : WR_OPEN_TEXT;
    if (w->open != want) {
        close_block(w, out);
        w->open = want;
        w->n_blocks++;
        if (!w->stream) {
            record_block(w, want, -1);
            /* text of this block starts here in w->text / w->reasoning */
            json_t *b = json_array_get(w->items, json_array_size(w->items) - 1);
            json_object_set_new(b, "o", json_integer((json_int_t)((thinking ? w->reasoning.len : w->text.len) - n)));
        } else {
            ev(out, "content_block_start");
            sb_addf(out, "{\"type\":\"content_block_start\",\"index\":%d,\"content_block\":%s}\n\n", w->n_blocks - 1,
                    thinking ? "{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}"
                             : "{\"type\":\"text\",\"text\":\"\"}");
        }
    }
    if (!w->stream) return;
    ev(out, "content_block_delta");
    sb_addf(out, "{\"type\":\"content_block_delta\",\"index\":%d,\"delta\":{\"type\":\"%s\",\"%s\":", w->n_blocks - 1,
            thinking ? "thinking_delta" : "text_delta", thinking ? "thinking" : "text");
    sb_add_jstr(out, s, n);
    sb_adds(out, "}}\n\n");
}

void wr_anth_call_start(wr_writer *w, sbuf *out, wr_call *c) {
    close_block(w, out);
    w->open = WR_OPEN_TOOL;
    c->block = w->n_blocks++;
    if (!w->stream) {
        record_block(w, WR_OPEN_TOOL, (int)(c - w->calls));
        return;
    }
    char id[80];
    toolu_id(c->id, id, sizeof id);
    ev(out, "content_block_start");
    sb_addf(out, "{\"type\":\"content_block_start\",\"index\":%d,\"content_block\":{\"type\":\"tool_use\",\"id\":\"%s\",\"name\":",
            c->block, id);
    sb_add_jstr(out, c->name, strlen(c->name));
    sb_adds(out, ",\"input\":{}}}\n\n");
}

void wr_anth_call_args(wr_writer *w, sbuf *out, wr_call *c, const char *s, size_t n) {
    if (!w->stream) return;
    ev(out, "content_block_delta");
    sb_addf(out, "{\"type\":\"content_block_delta\",\"index\":%d,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":",
            c->block);
    sb_add_jstr(out, s, n);
    sb_adds(out, "}}\n\n");
}

void wr_anth_call_end(wr_writer *w, sbuf *out, wr_call *c) {
    if (w->open == WR_OPEN_TOOL && c->block == w->n_blocks - 1) close_block(w, out);
}

static void body(wr_writer *w, sbuf *out, api_finish fin, const char *stop_seq, const api_usage *u) {
    sb_addf(out, "{\"id\":\"%s\",\"type\":\"message\",\"role\":\"assistant\",\"model\":", w->id);
    sb_add_jstr(out, w->model, strlen(w->model));
    sb_adds(out, ",\"content\":[");
    size_t n = json_array_size(w->items);
    for (size_t i = 0; i < n; i++) {
        json_t *b = json_array_get(w->items, i);
        int k = (int)json_integer_value(json_object_get(b, "k"));
        if (i) sb_adds(out, ",");
        if (k == WR_OPEN_TOOL) {
            wr_call *c = &w->calls[json_integer_value(json_object_get(b, "c"))];
            char id[80];
            toolu_id(c->id, id, sizeof id);
            sb_addf(out, "{\"type\":\"tool_use\",\"id\":\"%s\",\"name\":", id);
            sb_add_jstr(out, c->name, strlen(c->name));
            sb_adds(out, ",\"input\":");
            json_t *in = c->args.len ? json_loadb(c->args.data, c->args.len, 0, NULL) : NULL;
            if (json_is_object(in)) sb_add_json(out, in);
            else sb_adds(out, "{}");
            json_decref(in);
            sb_adds(out, "}");
            continue;
        }
        /* a text/thinking block runs from its offset to the next block of its kind */
        sbuf *src = k == WR_OPEN_THINKING ? &w->reasoning : &w->text;
        size_t from = (size_t)json_integer_value(json_object_get(b, "o")), to = src->len;
        for (size_t j = i + 1; j < n; j++) {
            json_t *nb = json_array_get(w->items, j);
            if (json_integer_value(json_object_get(nb, "k")) == k) {
                to = (size_t)json_integer_value(json_object_get(nb, "o"));
                break;
            }
        }
        if (k == WR_OPEN_THINKING) {
            sb_adds(out, "{\"type\":\"thinking\",\"thinking\":");
            sb_add_jstr(out, src->data + from, to - from);
            sb_adds(out, ",\"signature\":\"\"}");
        } else {
            sb_adds(out, "{\"type\":\"text\",\"text\":");
            sb_add_jstr(out, src->data + from, to - from);
            sb_adds(out, "}");
        }
    }
    sb_addf(out, "],\"stop_reason\":\"%s\",\"stop_sequence\":", stop_reason(fin));
    if (fin == API_FIN_STOP_SEQ && stop_seq)
        sb_add_jstr(out, stop_seq, strlen(stop_seq));
    else
        sb_adds(out, "null");
    sb_adds(out, ",\"usage\":");
    usage(u, w->n_prompt, out);
    sb_adds(out, "}");
}

void wr_anth_end(wr_writer *w, sbuf *out, api_finish fin, const char *stop_seq, const api_usage *u) {
    if (!w->stream) {
        body(w, out, fin, stop_seq, u);
        return;
    }
    close_block(w, out);
    ev(out, "message_delta");
    sb_addf(out, "{\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"%s\",\"stop_sequence\":", stop_reason(fin));
    if (fin == API_FIN_STOP_SEQ && stop_seq)
        sb_add_jstr(out, stop_seq, strlen(stop_seq));
    else
        sb_adds(out, "null");
    sb_adds(out, "},\"usage\":");
    usage(u, w->n_prompt, out);
    sb_adds(out, "}\n\n");
    ev(out, "message_stop");
    sb_adds(out, "{\"type\":\"message_stop\"}\n\n");
}

void wr_anth_fail(wr_writer *w, sbuf *out, const api_error *e) {
    (void)w;
    ev(out, "error");
    api_error_json(API_MESSAGES, e, out);
    sb_adds(out, "\n\n");
}
