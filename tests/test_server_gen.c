/* test_server_gen.c: stop strings (server/stopstr.h) under every split of
 * the text, and the token -> text -> events -> bytes pipeline (server/gen_output.h)
 * on the real Qwen3 vocabulary and chat template: reasoning, tool calls,
 * stop strings across tokens, one call only, UTF-8, engine errors. */
#include <dirent.h>
#include <jansson.h>
#include <string.h>

#include "gguf/gguf.h"
#include "server/constraint.h"
#include "server/gen_output.h"
#include "server/prompt.h"
#include "test.h"

static void feed_split(char *const *stops, int n, const char *text, const size_t *cuts, int ncuts, sbuf *out,
                       int *matched) {
    ss_matcher m;
    ss_init(&m, stops, n);
    size_t prev = 0;
    *matched = -1;
    for (int i = 0; i <= ncuts; i++) {
        size_t end = i < ncuts ? cuts[i] : strlen(text);
        int r = ss_feed(&m, text + prev, end - prev, out);
        if (r >= 0 && *matched < 0) *matched = r;
        prev = end;
    }
    if (*matched < 0) ss_flush(&m, out);
    ss_free(&m);
}

static void test_stopstr(void) {
    char *stops[] = {"STOP", "ab"};
    const char *text = "xxSTyyaSTOPzzab";
    size_t len = strlen(text);
    int bad = 0;
    /* every single cut and every pair of cuts */
    for (size_t a = 0; a <= len; a++)
        for (size_t b = a; b <= len; b++) {
            size_t cuts[2] = {a, b};
            sbuf out = {0};
            int m;
            feed_split(stops, 2, text, cuts, 2, &out, &m);
            if (m != 0 || out.len != 7 || memcmp(out.data, "xxSTyya", 7)) bad++;
            sb_free(&out);
        }
    CHECKF(bad == 0, "stop strings under all splits (%d bad)", bad);
    /* byte at a time, and held text is released when it cannot match */
    ss_matcher m;
    ss_init(&m, stops, 2);
    sbuf out = {0};
    CHECK(ss_feed(&m, "xxS", 3, &out) < 0 && out.len == 2);
    CHECK(ss_feed(&m, "T", 1, &out) < 0 && out.len == 2);
    CHECK(ss_feed(&m, "q", 1, &out) < 0 && out.len == 5 && !memcmp(out.data, "xxSTq", 5));
    CHECK(ss_feed(&m, "a", 1, &out) < 0 && out.len == 5);
    ss_flush(&m, &out);
    CHECK(out.len == 6 && out.data[5] == 'a');
    ss_free(&m);
    sb_free(&out);
    /* earliest match wins; no stops: passthrough */
    char *st2[] = {"cd", "bcde"};
    int mm;
    size_t none[1] = {0};
    feed_split(st2, 2, "abcdef", none, 0, &out, &mm);
    CHECK(mm == 1 && out.len == 1 && out.data[0] == 'a');
    sb_free(&out);
    feed_split(NULL, 0, "abc", none, 0, &out, &mm);
    CHECK(mm < 0 && out.len == 3);
    sb_free(&out);
}

static const tok_vocab *V;
static prm_model PM;

/* Runs text (tokenized) through the pipeline into a non-streaming chat body. */
static json_t *run(const char *text, const json_t *tools, char **stops, int n_stops, bool single, eng_finish fin,
                   int *reasoning_tokens) {
    int32_t toks[4096];
    int64_t n = tok_encode(V, text, strlen(text), false, true, toks, 4096);
    wr_meta wm = {.api = API_CHAT, .model = "m"};
    wr_writer *w = wr_new(&wm);
    gen_opts o = {.vocab = V, .parse = true, .format = tools ? PM.det.format : TC_FORMAT_NONE, .tc_flags = PM.det.flags,
                  .tools = tools, .stops = stops, .n_stops = n_stops, .single_call = single};
    gen_state *g = gen_new(&o, w);
    sbuf out = {0};
    int32_t i = 0;
    for (; i < n; i++)
        if (gen_token(g, toks[i], &out)) break;
    eng_req_stats st = {.n_prompt = 10, .n_generated = i};
    gen_end(g, fin, "kaput", &st, &out);
    json_t *v = json_loads(out.data ? out.data : "", 0, NULL);
    if (reasoning_tokens) {
        json_t *u = json_object_get(json_object_get(v, "usage"), "completion_tokens_details");
        *reasoning_tokens = (int)json_integer_value(json_object_get(u, "reasoning_tokens"));
    }
    gen_free(g);
    wr_free(w);
    sb_free(&out);
    return v;
}

static json_t *msg_of(json_t *v) { return json_object_get(json_array_get(json_object_get(v, "choices"), 0), "message"); }
static const char *finish_of(json_t *v) {
    return json_string_value(json_object_get(json_array_get(json_object_get(v, "choices"), 0), "finish_reason"));
}
static bool streq(const char *a, const char *b) { return a && b && !strcmp(a, b); }

static void test_gen(void) {
    json_t *tools = json_pack("[{s:s,s:{s:s,s:{s:s,s:{s:{s:s}}}}}]", "type", "function", "function", "name", "bash",
                              "parameters", "type", "object", "properties", "command", "type", "string");
    int rt = 0;
    json_t *v = run("<think>\nhmm, let me see\n</think>\n\nSure.\n<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>",
                    tools, NULL, 0, false, ENG_FINISH_EOG, &rt);
    json_t *m = msg_of(v);
    CHECKF(streq(json_string_value(json_object_get(m, "reasoning_content")), "hmm, let me see"), "reasoning: %s",
           json_string_value(json_object_get(m, "reasoning_content")));
    CHECKF(streq(json_string_value(json_object_get(m, "content")), "Sure."), "content: %s", json_string_value(json_object_get(m, "content")));
    json_t *calls = json_object_get(m, "tool_calls");
    CHECK(json_array_size(calls) == 1);
    json_t *fn = json_object_get(json_array_get(calls, 0), "function");
    CHECK(streq(json_string_value(json_object_get(fn, "name")), "bash"));
    json_t *args = json_loads(json_string_value(json_object_get(fn, "arguments")), 0, NULL);
    CHECK(streq(json_string_value(json_object_get(args, "command")), "ls"));
    json_decref(args);
    CHECK(streq(finish_of(v), "tool_calls"));
    CHECK(rt > 0);
    json_decref(v);

    /* without tools the markup is plain content */
    v = run("<tool_call>\n{\"name\": \"bash\"}\n</tool_call>", NULL, NULL, 0, false, ENG_FINISH_EOG, NULL);
    CHECK(json_object_get(msg_of(v), "tool_calls") == NULL);
    CHECK(strstr(json_string_value(json_object_get(msg_of(v), "content")), "<tool_call>") != NULL);
    json_decref(v);

    /* a stop string across token boundaries */
    char *stops[] = {"o th"};
    v = run("one two three four", NULL, stops, 1, false, ENG_FINISH_CANCELLED, NULL);
    CHECKF(streq(json_string_value(json_object_get(msg_of(v), "content")), "one tw"), "stop: %s",
           json_string_value(json_object_get(msg_of(v), "content")));
    CHECK(streq(finish_of(v), "stop"));
    json_decref(v);

    /* parallel_tool_calls false: the answer ends after the first call */
    const char *two = "<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"a\"}}\n</tool_call>\n"
                      "<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"b\"}}\n</tool_call>";
    v = run(two, tools, NULL, 0, false, ENG_FINISH_EOG, NULL);
    CHECK(json_array_size(json_object_get(msg_of(v), "tool_calls")) == 2);
    json_decref(v);
    v = run(two, tools, NULL, 0, true, ENG_FINISH_CANCELLED, NULL);
    CHECK(json_array_size(json_object_get(msg_of(v), "tool_calls")) == 1);
    CHECK(streq(finish_of(v), "tool_calls"));
    json_decref(v);

    /* UTF-8 across tokens; length finish */
    v = run("h\xc3\xa9llo \xe4\xb8\x96\xe7\x95\x8c \xf0\x9f\x8e\x89", NULL, NULL, 0, false, ENG_FINISH_LENGTH, NULL);
    CHECK(streq(json_string_value(json_object_get(msg_of(v), "content")), "h\xc3\xa9llo \xe4\xb8\x96\xe7\x95\x8c \xf0\x9f\x8e\x89"));
    CHECK(streq(finish_of(v), "length"));
    json_decref(v);

    /* an engine error becomes the API's error */
    v = run("abc", NULL, NULL, 0, false, ENG_FINISH_ERROR, NULL);
    CHECK(v && strstr(json_string_value(json_object_get(json_object_get(v, "error"), "message")), "kaput"));
    json_decref(v);
    json_decref(tools);
}

static void test_prompt(void) {
    const char *body =
        "{\"messages\":[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\"list\"},"
        "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\","
        "\"function\":{\"name\":\"bash\",\"arguments\":\"{\\\"command\\\":\\\"ls\\\"}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"out\"},{\"role\":\"user\",\"content\":\"thanks\"},"
        "{\"role\":\"assistant\",\"content\":\"Sure\"}],"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"bash\",\"parameters\":{\"type\":\"object\"}}}],"
        "\"reasoning_effort\":\"none\"}";
    json_t *b = json_loads(body, 0, NULL);
    creq r;
    api_error e;
    CHECK(b && creq_from_chat(b, &r, &e));
    prm_prompt p;
    CHECK(prm_build(&PM, &r, &p, &e));
    const char *t = p.text.data ? p.text.data : "";
    const char *head = "<|im_start|>system\nS\n\n# Tools";
    CHECK(!strncmp(t, head, strlen(head)));
    CHECK(strstr(t, "<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>") != NULL);
    CHECK(strstr(t, "<|im_start|>user\n<tool_response>\nout\n</tool_response><|im_end|>") != NULL);
    /* a final assistant message is continued (after the empty think block: thinking is off) */
    const char *tail = "<|im_start|>assistant\n<think>\n\n</think>\n\nSure";
    size_t l = strlen(t), tl = strlen(tail);
    CHECKF(l > tl && !strcmp(t + l - tl, tail), "prefill: %s", l > 60 ? t + l - 60 : t);
    CHECK(p.n_tokens > 20 && !p.start_in_reasoning);
    prm_prompt_free(&p);
    creq_free(&r);
    json_decref(b);
}

static size_t conv_len(const json_t *body) {
    const json_t *m = json_object_get(body, "messages");
    return m ? json_array_size(m) : json_array_size(json_object_get(body, "input"));
}

/* A follow-up turn (same conversation, same tools, more messages) renders to
 * a prompt that extends the previous turn's prompt token for token: what
 * lets the prefix cache serve all of it. Checked on every recorded pair. */
static void test_prefix_stability(void) {
    char dir[512];
    test_data_path(dir, sizeof dir, "data/clients");
    DIR *d = opendir(dir);
    CHECK(d != NULL);
    if (!d) return;
    int pairs = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l < 11 || strcmp(de->d_name + l - 11, "-tool.jsonl")) continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        FILE *f = fopen(path, "r");
        static char line[1 << 20];
        json_t *prev = NULL;
        while (f && fgets(line, sizeof line, f)) {
            json_t *rec = json_loads(line, 0, NULL);
            json_t *body = json_object_get(rec, "body");
            const char *p = json_string_value(json_object_get(rec, "path"));
            if (!json_is_object(body) || !p) {
                json_decref(rec);
                continue;
            }
            json_t *pb = json_object_get(prev, "body");
            const char *pp = json_string_value(json_object_get(prev, "path"));
            if (prev && !strcmp(p, pp) && json_equal(json_object_get(body, "tools"), json_object_get(pb, "tools")) &&
                json_object_get(body, "tools") && conv_len(body) > conv_len(pb)) {
                api_kind api = strstr(p, "/messages") ? API_MESSAGES : strstr(p, "/responses") ? API_RESPONSES : API_CHAT;
                creq ra, rb;
                api_error e;
                prm_prompt a = {0}, b = {0};
                bool ok = creq_parse(api, false, pb, &ra, &e);
                ok = ok && prm_build(&PM, &ra, &a, &e);
                bool ok2 = ok && creq_parse(api, false, body, &rb, &e);
                ok2 = ok2 && prm_build(&PM, &rb, &b, &e);
                CHECKF(ok && ok2, "%s renders: %s", de->d_name, e.message);
                if (ok && ok2) {
                    int32_t n = 0;
                    while (n < a.n_tokens && n < b.n_tokens && a.tokens[n] == b.tokens[n]) n++;
                    CHECKF(n == a.n_tokens && b.n_tokens > a.n_tokens, "%s: the follow-up keeps %d of %d prompt tokens",
                           de->d_name, n, a.n_tokens);
                    pairs++;
                }
                if (ok) creq_free(&ra);
                if (ok2) creq_free(&rb);
                prm_prompt_free(&a);
                prm_prompt_free(&b);
            }
            json_decref(prev);
            prev = rec;
        }
        json_decref(prev);
        if (f) fclose(f);
    }
    closedir(d);
    CHECKF(pairs >= 20, "%d follow-up pairs checked", pairs);
}

/* What the engine does with a request's constraint before sampling. */
static void constrain(const eng_request *er, float *logits, int32_t nv) {
    const uint32_t *a = er->allowed ? er->allowed(er->mask_ctx) : NULL;
    if (a) smp_apply_allowed(logits, a, nv);
}

/* Walks text through a request's constraint: returns the number of tokens
 * the mask allowed before the first refused one (all: n + 1 with EOG). */
static int walk(const char *body_json, api_kind api, const char *text, bool eog, int *n_out) {
    json_t *b = json_loads(body_json, 0, NULL);
    creq r;
    api_error e;
    prm_prompt p;
    int allowed = -1;
    if (!b || !creq_parse(api, false, b, &r, &e)) {
        json_decref(b);
        return -2;
    }
    cst_shared *cs = cst_shared_new(&PM);
    cst_req *c = NULL;
    eng_request er = {0};
    bool built = prm_build(&PM, &r, &p, &e);
    if (built && cst_attach(cs, &r, &p, &er, &c, &e) && c) {
        int32_t toks[512];
        int64_t n = tok_encode(V, text, strlen(text), false, true, toks, 500);
        if (eog) toks[n++] = tok_eos(V);
        *n_out = (int)n;
        int32_t nv = tok_n_vocab(V);
        float *logits = malloc((size_t)nv * sizeof(float));
        allowed = 0;
        for (int64_t i = 0; i < n; i++) {
            memset(logits, 0, (size_t)nv * sizeof(float));
            constrain(&er, logits, nv);
            if (logits[toks[i]] != 0.0f) break;
            er.accept(er.mask_ctx, toks[i]);
            allowed++;
        }
        free(logits);
    }
    if (built) prm_prompt_free(&p);
    cst_req_free(c);
    cst_shared_free(cs);
    creq_free(&r);
    json_decref(b);
    return allowed;
}

/* A stubborn "model" that keeps writing "a" inside the command string: near
 * max_tokens the constraint must steer it to a closed call. */
static void test_close_at_budget(const char *req) {
    json_t *b = json_loads(req, 0, NULL);
    creq r;
    api_error e;
    prm_prompt p;
    CHECK(b && creq_parse(API_CHAT, false, b, &r, &e) && prm_build(&PM, &r, &p, &e));
    cst_shared *cs = cst_shared_new(&PM);
    cst_req *c = NULL;
    eng_request er = {.max_tokens = 40};
    CHECK(cst_attach(cs, &r, &p, &er, &c, &e) && c);
    const char *pre = "<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"";
    int32_t script[64];
    int64_t ns = tok_encode(V, pre, strlen(pre), false, true, script, 64);
    int32_t a_tok;
    tok_encode(V, "a", 1, false, false, &a_tok, 1);
    int32_t nv = tok_n_vocab(V);
    float *logits = malloc((size_t)nv * sizeof(float));
    int32_t out[64];
    int n = 0;
    bool eog = false;
    while (c && n < er.max_tokens) {
        for (int32_t i = 0; i < nv; i++) logits[i] = 0;
        constrain(&er, logits, nv);
        int32_t want = n < ns ? script[n] : a_tok, pick = -1, allowed = 0;
        for (int32_t i = 0; i < nv; i++)
            if (logits[i] == 0) {
                allowed++;
                if (pick < 0) pick = i;
            }
        if (logits[want] == 0 && allowed > 1) pick = want; /* free choice: stubborn */
        if (pick < 0) break;
        er.accept(er.mask_ctx, pick);
        if (tok_is_eog(V, pick)) {
            eog = true;
            break;
        }
        out[n++] = pick;
    }
    free(logits);
    CHECKF(eog, "the constrained answer ends within max_tokens (%d tokens)", n);
    /* the text is a complete call */
    sbuf t = {0};
    char piece[256];
    for (int i = 0; i < n; i++) {
        int32_t k = tok_piece(V, out[i], true, piece, sizeof piece);
        if (k > 0) sb_add(&t, piece, (size_t)k);
    }
    CHECKF(t.data && strstr(t.data, "\"}}\n</tool_call>"), "closed call: %s", t.data ? t.data : "");
    sb_free(&t);
    cst_req_free(c);
    cst_shared_free(cs);
    prm_prompt_free(&p);
    creq_free(&r);
    json_decref(b);
}

static void test_constraint(void) {
    if (!cst_available()) {
        printf("note: this build has no grammar module: tool_choice required/named and json formats are unconstrained\n");
        return;
    }
    const char *req =
        "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tool_choice\":\"required\","
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"bash\",\"parameters\":{\"type\":\"object\","
        "\"properties\":{\"command\":{\"type\":\"string\"}},\"required\":[\"command\"]}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"read\",\"parameters\":{\"type\":\"object\","
        "\"properties\":{\"path\":{\"type\":\"string\"}},\"required\":[\"path\"]}}}]}";
    const char *call = "<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"ls -la\"}}\n</tool_call>";
    int n = 0;
    int a = walk(req, API_CHAT, call, true, &n);
    CHECKF(a == n && n > 5, "tool_choice required allows a well-formed call and then the end (%d of %d)", a, n);
    CHECKF(walk(req, API_CHAT, "Hello there", false, &n) == 0, "tool_choice required refuses plain text");
    CHECKF(walk(req, API_CHAT, "<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"cmd\": 1}}", false, &n) < n,
           "arguments must follow the schema");
    /* named (Anthropic tool_choice tool): another tool is refused */
    const char *named =
        "{\"model\":\"m\",\"max_tokens\":9,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
        "\"tool_choice\":{\"type\":\"tool\",\"name\":\"read\"},"
        "\"tools\":[{\"name\":\"bash\",\"input_schema\":{\"type\":\"object\"}},{\"name\":\"read\",\"input_schema\":{\"type\":\"object\"}}]}";
    CHECK(walk(named, API_MESSAGES, call, true, &n) < n);
    CHECKF(walk(named, API_MESSAGES, "<tool_call>\n{\"name\": \"read\", \"arguments\": {}}\n</tool_call>", true, &n) == n,
           "the named tool is allowed");
    /* response formats */
    const char *jo = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"response_format\":{\"type\":\"json_object\"}}";
    CHECK(walk(jo, API_CHAT, "{\"a\": 1}", true, &n) == n);
    CHECK(walk(jo, API_CHAT, "hello", false, &n) == 0);
    const char *js = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"response_format\":{\"type\":\"json_schema\","
                     "\"json_schema\":{\"name\":\"t\",\"schema\":{\"type\":\"object\",\"properties\":{\"title\":{\"type\":\"string\"}},"
                     "\"required\":[\"title\"],\"additionalProperties\":false}}}}";
    CHECK(walk(js, API_CHAT, "{\"title\": \"Hi\"}", true, &n) == n);
    CHECK(walk(js, API_CHAT, "{\"name\": \"Hi\"}", true, &n) < n);
    /* a named tool that is not offered is the client's error */
    const char *missing = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"nope\"}},"
                          "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"bash\",\"parameters\":{}}}]}";
    CHECK(walk(missing, API_CHAT, "x", false, &n) == -1);
    test_close_at_budget(req);
}

int main(void) {
    test_stopstr();
    char path[512];
    test_data_path(path, sizeof path, "data/models/qwen3-real-q8_0.gguf");
    gguf_ctx *g = NULL;
    tok_vocab *v = NULL;
    hn_err err = {0};
    if (gguf_open(path, &g, &err) != HN_OK || tok_load(g, &v, &err) != HN_OK) {
        CHECKF(0, "load %s: %s", path, err.msg);
        TEST_DONE();
    }
    V = v;
    CHECK(prm_model_init(&PM, g, v, &err) == HN_OK);
    CHECK(PM.det.format == TC_FORMAT_HERMES && (PM.det.flags & TC_FLAG_REASONING));
    test_gen();
    test_prompt();
    test_prefix_stability();
    test_constraint();
    prm_model_free(&PM);
    tok_free(v);
    gguf_close(g);
    TEST_DONE();
}
