/* test_server_writer.c: the response writers (server/writer.h): exact SSE
 * event sequences per API, non-streaming bodies, usage and errors. */
#include <jansson.h>
#include <string.h>

#include "server/writer.h"
#include "test.h"

/* One parsed SSE frame. */
typedef struct {
    char event[64];
    json_t *data; /* NULL for [DONE] or comments */
    bool done, comment;
} frame;

static int parse_sse(const char *s, frame *f, int cap) {
    int n = 0;
    while (*s && n < cap) {
        const char *end = strstr(s, "\n\n");
        if (!end) break;
        frame *fr = &f[n++];
        memset(fr, 0, sizeof *fr);
        const char *line = s;
        while (line < end) {
            const char *nl = memchr(line, '\n', (size_t)(end - line));
            if (!nl) nl = end;
            if (!strncmp(line, "event: ", 7)) snprintf(fr->event, sizeof fr->event, "%.*s", (int)(nl - line - 7), line + 7);
            else if (!strncmp(line, "data: [DONE]", 12)) fr->done = true;
            else if (!strncmp(line, "data: ", 6)) fr->data = json_loadb(line + 6, (size_t)(nl - line - 6), 0, NULL);
            else if (line[0] == ':') fr->comment = true;
            line = nl + 1;
        }
        s = end + 2;
    }
    return n;
}

static void free_frames(frame *f, int n) {
    for (int i = 0; i < n; i++) json_decref(f[i].data);
}

static const char *S(const json_t *o, const char *k) { return json_string_value(json_object_get(o, k)); }
static bool streq(const char *a, const char *b) { return a && b && !strcmp(a, b); }

static const api_usage usage = {.prompt_tokens = 100, .cached_tokens = 64, .completion_tokens = 9, .reasoning_tokens = 3};

/* reasoning, text, two calls (one split in fragments), end */
static void drive(wr_writer *w, sbuf *out) {
    wr_begin(w, out, 100);
    wr_keepalive(w, out);
    wr_reasoning(w, out, "think ", 6);
    wr_reasoning(w, out, "more", 4);
    wr_text(w, out, "Hi \"there\"\n", 11);
    wr_call_start(w, out, 0, "call_AAA", "read");
    wr_call_args(w, out, 0, "{\"path\": ", 9);
    wr_call_args(w, out, 0, "\"a.c\"}", 6);
    wr_call_end(w, out, 0);
    wr_call_start(w, out, 1, "call_BBB", "read");
    wr_call_args(w, out, 1, "{\"path\": \"b.c\"}", 15);
    wr_call_end(w, out, 1);
    wr_end(w, out, API_FIN_STOP, NULL, &usage);
}

static void test_chat_stream(void) {
    wr_meta m = {.api = API_CHAT, .stream = true, .include_usage = true, .model = "qwen"};
    wr_writer *w = wr_new(&m);
    sbuf out = {0};
    drive(w, &out);
    CHECK(!out.oom);
    frame f[64];
    int n = parse_sse(out.data, f, 64);
    CHECKF(n == 13, "chat frames: %d\n%s", n, out.data);
    CHECK(f[0].data && streq(S(json_object_get(json_array_get(json_object_get(f[0].data, "choices"), 0), "delta"), "role"), "assistant"));
    CHECK(streq(S(f[0].data, "object"), "chat.completion.chunk") && streq(S(f[0].data, "id"), wr_id(w)));
    CHECK(f[1].comment);
    /* reasoning, text deltas */
    json_t *d2 = json_object_get(json_array_get(json_object_get(f[2].data, "choices"), 0), "delta");
    CHECK(streq(S(d2, "reasoning_content"), "think "));
    json_t *d4 = json_object_get(json_array_get(json_object_get(f[4].data, "choices"), 0), "delta");
    CHECK(streq(S(d4, "content"), "Hi \"there\"\n"));
    /* tool calls: id/type/name only in the first fragment; distinct indices */
    json_t *t5 = json_array_get(json_object_get(json_object_get(json_array_get(json_object_get(f[5].data, "choices"), 0), "delta"), "tool_calls"), 0);
    CHECK(json_integer_value(json_object_get(t5, "index")) == 0 && streq(S(t5, "id"), "call_AAA") && streq(S(t5, "type"), "function"));
    CHECK(streq(S(json_object_get(t5, "function"), "name"), "read"));
    json_t *t6 = json_array_get(json_object_get(json_object_get(json_array_get(json_object_get(f[6].data, "choices"), 0), "delta"), "tool_calls"), 0);
    CHECK(json_integer_value(json_object_get(t6, "index")) == 0 && !json_object_get(t6, "id"));
    CHECK(streq(S(json_object_get(t6, "function"), "arguments"), "{\"path\": "));
    json_t *t8 = json_array_get(json_object_get(json_object_get(json_array_get(json_object_get(f[8].data, "choices"), 0), "delta"), "tool_calls"), 0);
    CHECK(json_integer_value(json_object_get(t8, "index")) == 1 && streq(S(t8, "id"), "call_BBB"));
    /* finish, usage, DONE */
    json_t *c10 = json_array_get(json_object_get(f[10].data, "choices"), 0);
    CHECKF(streq(S(c10, "finish_reason"), "tool_calls"), "finish %s", out.data);
    json_t *u = json_object_get(f[11].data, "usage");
    CHECK(json_array_size(json_object_get(f[11].data, "choices")) == 0 && f[12].done);
    CHECK(json_integer_value(json_object_get(u, "prompt_tokens")) == 100 && json_integer_value(json_object_get(u, "total_tokens")) == 109);
    CHECK(json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens")) == 64);
    free_frames(f, n);
    CHECK(strstr(out.data, "data: [DONE]\n\n") == out.data + out.len - 14);
    sb_free(&out);
    wr_free(w);

    /* no include_usage: no usage chunk; plain stop */
    m.include_usage = false;
    w = wr_new(&m);
    wr_begin(w, &out, 3);
    wr_text(w, &out, "x", 1);
    wr_end(w, &out, API_FIN_LENGTH, NULL, &usage);
    n = parse_sse(out.data, f, 64);
    CHECK(n == 4 && f[3].done);
    CHECK(streq(S(json_array_get(json_object_get(f[2].data, "choices"), 0), "finish_reason"), "length"));
    CHECK(!strstr(out.data, "\"usage\""));
    free_frames(f, n);
    sb_free(&out);
    wr_free(w);
}

static void test_chat_body(void) {
    wr_meta m = {.api = API_CHAT, .model = "qwen"};
    wr_writer *w = wr_new(&m);
    sbuf out = {0};
    drive(w, &out);
    json_t *v = json_loads(out.data, 0, NULL);
    CHECKF(v != NULL, "chat body parses: %s", out.data);
    json_t *c = json_array_get(json_object_get(v, "choices"), 0);
    json_t *msg = json_object_get(c, "message");
    CHECK(streq(S(c, "finish_reason"), "tool_calls"));
    CHECK(streq(S(msg, "content"), "Hi \"there\"\n") && streq(S(msg, "reasoning_content"), "think more"));
    json_t *tc = json_object_get(msg, "tool_calls");
    CHECK(json_array_size(tc) == 2);
    CHECK(streq(S(json_object_get(json_array_get(tc, 0), "function"), "arguments"), "{\"path\": \"a.c\"}"));
    CHECK(streq(S(json_array_get(tc, 1), "id"), "call_BBB"));
    CHECK(json_integer_value(json_object_get(json_object_get(json_object_get(v, "usage"), "prompt_tokens_details"), "cached_tokens")) == 64);
    json_decref(v);
    sb_free(&out);
    wr_free(w);

    /* only calls: content is null */
    w = wr_new(&m);
    wr_call_start(w, &out, 0, "call_X", "f");
    wr_end(w, &out, API_FIN_STOP, NULL, &usage);
    v = json_loads(out.data, 0, NULL);
    msg = json_object_get(json_array_get(json_object_get(v, "choices"), 0), "message");
    CHECK(json_is_null(json_object_get(msg, "content")));
    CHECK(streq(S(json_object_get(json_array_get(json_object_get(msg, "tool_calls"), 0), "function"), "arguments"), "{}"));
    json_decref(v);
    sb_free(&out);
    wr_free(w);

    /* legacy completions: reasoning is text */
    wr_meta mc = {.api = API_COMPLETIONS, .model = "qwen"};
    w = wr_new(&mc);
    wr_reasoning(w, &out, "a", 1);
    wr_text(w, &out, "b", 1);
    wr_end(w, &out, API_FIN_STOP_SEQ, "\n", &usage);
    v = json_loads(out.data, 0, NULL);
    c = json_array_get(json_object_get(v, "choices"), 0);
    CHECK(streq(S(v, "object"), "text_completion") && streq(S(c, "text"), "ab") && streq(S(c, "finish_reason"), "stop"));
    json_decref(v);
    sb_free(&out);
    wr_free(w);
}

static void test_anthropic_stream(void) {
    wr_meta m = {.api = API_MESSAGES, .stream = true, .model = "claude-x"};
    wr_writer *w = wr_new(&m);
    sbuf out = {0};
    drive(w, &out);
    frame f[64];
    int n = parse_sse(out.data, f, 64);
    const char *want[] = {"message_start", "ping", "ping", "content_block_start", "content_block_delta", "content_block_delta",
                          "content_block_delta", "content_block_stop", "content_block_start", "content_block_delta",
                          "content_block_stop", "content_block_start", "content_block_delta", "content_block_delta",
                          "content_block_stop", "content_block_start", "content_block_delta", "content_block_stop",
                          "message_delta", "message_stop"};
    int nw = (int)(sizeof want / sizeof want[0]);
    CHECKF(n == nw, "anthropic frames %d\n%s", n, out.data);
    for (int i = 0; i < n && i < nw; i++) {
        CHECKF(streq(f[i].event, want[i]), "frame %d: %s, want %s", i, f[i].event, want[i]);
        CHECKF(f[i].data && streq(S(f[i].data, "type"), f[i].event), "frame %d type matches event", i);
    }
    if (n == nw) {
        json_t *msg = json_object_get(f[0].data, "message");
        CHECK(streq(S(msg, "id"), wr_id(w)) && streq(S(msg, "role"), "assistant") && json_array_size(json_object_get(msg, "content")) == 0);
        CHECK(json_integer_value(json_object_get(json_object_get(msg, "usage"), "input_tokens")) == 100);
        /* thinking block 0: deltas then one signature_delta just before its stop */
        CHECK(streq(S(json_object_get(f[3].data, "content_block"), "type"), "thinking"));
        CHECK(json_integer_value(json_object_get(f[3].data, "index")) == 0);
        CHECK(streq(S(json_object_get(f[4].data, "delta"), "type"), "thinking_delta"));
        CHECK(streq(S(json_object_get(f[4].data, "delta"), "thinking"), "think "));
        CHECK(streq(S(json_object_get(f[6].data, "delta"), "type"), "signature_delta"));
        CHECK(json_integer_value(json_object_get(f[7].data, "index")) == 0);
        /* text block 1 */
        CHECK(streq(S(json_object_get(f[8].data, "content_block"), "type"), "text"));
        CHECK(json_integer_value(json_object_get(f[9].data, "index")) == 1);
        CHECK(streq(S(json_object_get(f[9].data, "delta"), "text"), "Hi \"there\"\n"));
        /* tool_use blocks 2 and 3 */
        json_t *cb = json_object_get(f[11].data, "content_block");
        CHECK(streq(S(cb, "type"), "tool_use") && streq(S(cb, "id"), "toolu_AAA") && streq(S(cb, "name"), "read"));
        CHECK(json_is_object(json_object_get(cb, "input")) && json_integer_value(json_object_get(f[11].data, "index")) == 2);
        CHECK(streq(S(json_object_get(f[12].data, "delta"), "type"), "input_json_delta"));
        CHECK(streq(S(json_object_get(f[12].data, "delta"), "partial_json"), "{\"path\": "));
        CHECK(json_integer_value(json_object_get(f[15].data, "index")) == 3);
        /* message_delta: stop_reason and cumulative usage */
        json_t *md = f[18].data;
        CHECK(streq(S(json_object_get(md, "delta"), "stop_reason"), "tool_use"));
        json_t *u = json_object_get(md, "usage");
        CHECK(json_integer_value(json_object_get(u, "output_tokens")) == 9);
        CHECK(json_integer_value(json_object_get(u, "cache_read_input_tokens")) == 64);
        CHECK(json_integer_value(json_object_get(u, "input_tokens")) == 36);
    }
    free_frames(f, n);
    sb_free(&out);
    wr_free(w);

    /* a stop sequence; text after thinking closes it first */
    w = wr_new(&m);
    wr_begin(w, &out, 5);
    wr_text(w, &out, "a", 1);
    wr_reasoning(w, &out, "r", 1);
    wr_text(w, &out, "b", 1);
    wr_end(w, &out, API_FIN_STOP_SEQ, "###", &usage);
    n = parse_sse(out.data, f, 64);
    int starts = 0, stops = 0, open = 0, bad = 0;
    for (int i = 0; i < n; i++) {
        if (streq(f[i].event, "content_block_start")) {
            if (open) bad++;
            open = 1;
            CHECK(json_integer_value(json_object_get(f[i].data, "index")) == starts);
            starts++;
        }
        if (streq(f[i].event, "content_block_stop")) {
            open = 0;
            stops++;
        }
    }
    CHECK(starts == 3 && stops == 3 && bad == 0);
    CHECK(streq(S(json_object_get(f[n - 2].data, "delta"), "stop_reason"), "stop_sequence"));
    CHECK(streq(S(json_object_get(f[n - 2].data, "delta"), "stop_sequence"), "###"));
    free_frames(f, n);
    sb_free(&out);
    wr_free(w);

    /* mid-stream error */
    w = wr_new(&m);
    wr_begin(w, &out, 5);
    api_error e;
    api_seterr(&e, APIE_INTERNAL, NULL, "boom");
    wr_fail(w, &out, &e);
    n = parse_sse(out.data, f, 64);
    CHECK(streq(f[n - 1].event, "error") && streq(S(json_object_get(f[n - 1].data, "error"), "type"), "api_error"));
    free_frames(f, n);
    sb_free(&out);
    wr_free(w);
}

static void test_anthropic_body(void) {
    wr_meta m = {.api = API_MESSAGES, .model = "claude-x"};
    wr_writer *w = wr_new(&m);
    sbuf out = {0};
    drive(w, &out);
    json_t *v = json_loads(out.data, 0, NULL);
    CHECKF(v != NULL, "anthropic body parses: %s", out.data);
    json_t *c = json_object_get(v, "content");
    CHECK(json_array_size(c) == 4);
    CHECK(streq(S(json_array_get(c, 0), "type"), "thinking") && streq(S(json_array_get(c, 0), "thinking"), "think more"));
    CHECK(json_is_string(json_object_get(json_array_get(c, 0), "signature")));
    CHECK(streq(S(json_array_get(c, 1), "type"), "text") && streq(S(json_array_get(c, 1), "text"), "Hi \"there\"\n"));
    json_t *tu = json_array_get(c, 2);
    CHECK(streq(S(tu, "type"), "tool_use") && streq(S(tu, "id"), "toolu_AAA"));
    CHECK(streq(S(json_object_get(tu, "input"), "path"), "a.c"));
    CHECK(streq(S(v, "stop_reason"), "tool_use") && streq(S(v, "type"), "message"));
    CHECK(json_integer_value(json_object_get(json_object_get(v, "usage"), "cache_read_input_tokens")) == 64);
    json_decref(v);
    sb_free(&out);
    wr_free(w);

    /* interleaved text/thinking/text keeps each block's own text */
    w = wr_new(&m);
    wr_text(w, &out, "one", 3);
    wr_reasoning(w, &out, "r", 1);
    wr_text(w, &out, "two", 3);
    wr_end(w, &out, API_FIN_LENGTH, NULL, &usage);
    v = json_loads(out.data, 0, NULL);
    c = json_object_get(v, "content");
    CHECK(json_array_size(c) == 3 && streq(S(json_array_get(c, 0), "text"), "one") && streq(S(json_array_get(c, 2), "text"), "two"));
    CHECK(streq(S(v, "stop_reason"), "max_tokens"));
    json_decref(v);
    sb_free(&out);
    wr_free(w);
}

static void test_responses_stream(void) {
    json_t *custom = json_pack("[s]", "apply_patch");
    wr_meta m = {.api = API_RESPONSES, .stream = true, .model = "local", .custom_tools = custom};
    wr_writer *w = wr_new(&m);
    sbuf out = {0};
    drive(w, &out);
    wr_free(w);
    frame f[80];
    int n = parse_sse(out.data, f, 80);
    CHECK(n > 10);
    int seq_ok = 1, added = 0, done = 0, types_ok = 1;
    json_t *done_items = json_array();
    for (int i = 0, k = 0; i < n; i++) {
        if (f[i].comment) continue;
        if (!f[i].data || json_integer_value(json_object_get(f[i].data, "sequence_number")) != k++) seq_ok = 0;
        if (!streq(S(f[i].data, "type"), f[i].event)) types_ok = 0;
        if (streq(f[i].event, "response.output_item.added")) added++;
        if (streq(f[i].event, "response.output_item.done")) {
            done++;
            json_array_append(done_items, json_object_get(f[i].data, "item"));
        }
    }
    CHECK(seq_ok && types_ok);
    CHECK(streq(f[0].event, "response.created") && streq(f[1].event, "response.in_progress"));
    CHECK(streq(S(json_object_get(f[0].data, "response"), "status"), "in_progress"));
    CHECK(added == 4 && done == 4);
    CHECK(streq(S(json_array_get(done_items, 0), "type"), "reasoning"));
    CHECK(streq(S(json_array_get(json_object_get(json_array_get(done_items, 0), "summary"), 0), "text"), "think more"));
    json_t *msg = json_array_get(done_items, 1);
    CHECK(streq(S(msg, "type"), "message") && streq(S(msg, "role"), "assistant"));
    CHECK(streq(S(json_array_get(json_object_get(msg, "content"), 0), "text"), "Hi \"there\"\n"));
    json_t *fc = json_array_get(done_items, 2);
    CHECK(streq(S(fc, "type"), "function_call") && streq(S(fc, "call_id"), "call_AAA") && streq(S(fc, "arguments"), "{\"path\": \"a.c\"}"));
    frame *last = &f[n - 1];
    CHECK(streq(last->event, "response.completed"));
    json_t *resp = json_object_get(last->data, "response");
    CHECK(streq(S(resp, "status"), "completed") && json_array_size(json_object_get(resp, "output")) == 4);
    json_t *u = json_object_get(resp, "usage");
    CHECK(json_integer_value(json_object_get(u, "input_tokens")) == 100 && json_integer_value(json_object_get(u, "output_tokens")) == 9);
    CHECK(json_integer_value(json_object_get(json_object_get(u, "input_tokens_details"), "cached_tokens")) == 64);
    CHECK(json_integer_value(json_object_get(json_object_get(u, "output_tokens_details"), "reasoning_tokens")) == 3);
    json_decref(done_items);
    free_frames(f, n);
    sb_free(&out);

    /* a freeform (custom) tool call comes out as custom_tool_call with its input */
    w = wr_new(&m);
    wr_begin(w, &out, 1);
    wr_call_start(w, &out, 0, "call_C", "apply_patch");
    wr_call_args(w, &out, 0, "{\"input\": \"*** Begin Patch\"}", 28);
    wr_call_end(w, &out, 0);
    wr_end(w, &out, API_FIN_LENGTH, NULL, &usage);
    n = parse_sse(out.data, f, 80);
    bool found = false;
    for (int i = 0; i < n; i++)
        if (streq(f[i].event, "response.output_item.done")) {
            json_t *it = json_object_get(f[i].data, "item");
            found = streq(S(it, "type"), "custom_tool_call") && streq(S(it, "input"), "*** Begin Patch");
        }
    CHECK(found);
    CHECK(streq(f[n - 1].event, "response.incomplete"));
    CHECK(streq(S(json_object_get(json_object_get(f[n - 1].data, "response"), "incomplete_details"), "reason"), "max_output_tokens"));
    free_frames(f, n);
    sb_free(&out);
    wr_free(w);
    json_decref(custom);
}

static void test_responses_body(void) {
    wr_meta m = {.api = API_RESPONSES, .model = "local"};
    wr_writer *w = wr_new(&m);
    sbuf out = {0};
    drive(w, &out);
    json_t *v = json_loads(out.data, 0, NULL);
    CHECKF(v != NULL, "responses body parses");
    CHECK(streq(S(v, "object"), "response") && streq(S(v, "status"), "completed") && streq(S(v, "id"), wr_id(w)));
    CHECK(json_array_size(json_object_get(v, "output")) == 4);
    json_decref(v);
    sb_free(&out);
    wr_free(w);

    /* a failed stream */
    m.stream = true;
    w = wr_new(&m);
    wr_begin(w, &out, 1);
    wr_text(w, &out, "x", 1);
    api_error e;
    api_seterr(&e, APIE_CONTEXT, NULL, "context full");
    wr_fail(w, &out, &e);
    frame f[32];
    int n = parse_sse(out.data, f, 32);
    CHECK(streq(f[n - 1].event, "response.failed"));
    CHECK(streq(S(json_object_get(json_object_get(f[n - 1].data, "response"), "error"), "code"), "context_length_exceeded"));
    free_frames(f, n);
    sb_free(&out);
    wr_free(w);
}

int main(void) {
    test_chat_stream();
    test_chat_body();
    test_anthropic_stream();
    test_anthropic_body();
    test_responses_stream();
    test_responses_body();
    TEST_DONE();
}
