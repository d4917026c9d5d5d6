/* test_server_http.c: the HTTP server in-process (server/server.h) with the
 * scripted engine (server/testeng.h) on the real Qwen3 tokenizer and chat
 * template, driven by a raw-socket HTTP/1.1 client: routes, authentication,
 * limits and errors per API, streaming sequences, stop strings, keep-alive
 * pings, connection reuse, concurrent streams, and cancellation when the
 * client disconnects. */
#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "server/prompt.h"
#include "server/server.h"
#include "server/testeng.h"
#include "test.h"
#include "tokenizer/tokenizer.h"

#include "srv_client.h"

static json_t *body_json(const resp *r) { return r->body.data ? json_loads(r->body.data, 0, NULL) : NULL; }
static bool streq(const char *a, const char *b) { return a && b && !strcmp(a, b); }
static const char *S(const json_t *o, const char *k) { return json_string_value(json_object_get(o, k)); }

static const char *KEY = "x-api-key: sekrit\r\n";
static const char *BEARER = "Authorization: Bearer sekrit\r\n";

static void test_simple(void) {
    resp r;
    CHECK(http("GET", "/", NULL, NULL, &r) == 200);
    sb_free(&r.body);
    CHECK(http("HEAD", "/", NULL, NULL, &r) == 200);
    sb_free(&r.body);
    CHECK(http("GET", "/health", NULL, NULL, &r) == 200);
    sb_free(&r.body);
    /* key required beyond / and /health */
    CHECK(http("GET", "/v1/models", NULL, NULL, &r) == 401);
    json_t *v = body_json(&r);
    CHECK(streq(S(json_object_get(v, "error"), "type"), "authentication_error"));
    json_decref(v);
    sb_free(&r.body);
    CHECK(http("GET", "/v1/models", "Authorization: Bearer wrong\r\n", NULL, &r) == 401);
    sb_free(&r.body);
    CHECK(http("GET", "/v1/models", BEARER, NULL, &r) == 200);
    v = body_json(&r);
    CHECK(streq(S(json_array_get(json_object_get(v, "data"), 0), "id"), "test-model"));
    json_decref(v);
    sb_free(&r.body);
    CHECK(http("GET", "/v1/models", KEY, NULL, &r) == 200);
    sb_free(&r.body);
    /* Anthropic-format 401 on /v1/messages */
    CHECK(http("POST", "/v1/messages", NULL, "{}", &r) == 401);
    v = body_json(&r);
    CHECK(streq(S(v, "type"), "error") && streq(S(json_object_get(v, "error"), "type"), "authentication_error"));
    json_decref(v);
    sb_free(&r.body);
    CHECK(http("GET", "/nowhere", KEY, NULL, &r) == 404);
    sb_free(&r.body);
    CHECK(http("GET", "/v1/chat/completions", KEY, NULL, &r) == 405);
    sb_free(&r.body);
}

static void test_errors(void) {
    resp r;
    json_t *v;
    /* malformed JSON, each API in its own format */
    CHECK(http("POST", "/v1/chat/completions", KEY, "{\"messages\": [", &r) == 400);
    v = body_json(&r);
    CHECK(streq(S(json_object_get(v, "error"), "type"), "invalid_request_error"));
    json_decref(v);
    sb_free(&r.body);
    CHECK(http("POST", "/v1/messages?beta=true", KEY, "not json", &r) == 400);
    v = body_json(&r);
    CHECK(streq(S(v, "type"), "error") && streq(S(json_object_get(v, "error"), "type"), "invalid_request_error"));
    json_decref(v);
    sb_free(&r.body);
    /* missing fields */
    CHECK(http("POST", "/v1/messages", KEY, "{\"model\":\"m\",\"max_tokens\":5}", &r) == 400);
    sb_free(&r.body);
    CHECK(http("POST", "/v1/responses", KEY, "{\"model\":\"m\"}", &r) == 400);
    sb_free(&r.body);
    /* invalid UTF-8 */
    CHECK(http("POST", "/v1/chat/completions", KEY, "{\"messages\":[{\"role\":\"user\",\"content\":\"\xc3\x28\"}]}", &r) == 400);
    v = body_json(&r);
    CHECK(v && strstr(S(json_object_get(v, "error"), "message"), "UTF-8"));
    json_decref(v);
    sb_free(&r.body);
    /* too large: refused from Content-Length before reading */
    size_t big = (1u << 20) + 10;
    char *b = malloc(big + 1);
    memset(b, 'a', big);
    b[big] = 0;
    CHECK(http("POST", "/v1/messages", KEY, b, &r) == 413);
    v = body_json(&r);
    CHECK(streq(S(json_object_get(v, "error"), "type"), "request_too_large"));
    json_decref(v);
    sb_free(&r.body);
    free(b);
    /* prompt longer than the context (512 here) */
    sbuf p = {0};
    sb_adds(&p, "{\"model\":\"gpt\",\"messages\":[{\"role\":\"user\",\"content\":\"");
    for (int i = 0; i < 600; i++) sb_adds(&p, "hello ");
    sb_adds(&p, "\"}]}");
    CHECK(http("POST", "/v1/chat/completions", KEY, p.data, &r) == 400);
    v = body_json(&r);
    CHECK(streq(S(json_object_get(v, "error"), "code"), "context_length_exceeded"));
    json_decref(v);
    sb_free(&r.body);
    char *anth = malloc(p.len + 64);
    snprintf(anth, p.len + 64, "{\"max_tokens\":5,%s", p.data + 1);
    CHECK(http("POST", "/v1/messages", KEY, anth, &r) == 400);
    v = body_json(&r);
    CHECK(v && strstr(S(json_object_get(v, "error"), "message"), "prompt is too long"));
    json_decref(v);
    sb_free(&r.body);
    free(anth);
    sb_free(&p);
    /* the server is still fine */
    CHECK(http("GET", "/health", NULL, NULL, &r) == 200);
    sb_free(&r.body);
}

static int count(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay ? strstr(hay, needle) : NULL; p; p = strstr(p + 1, needle)) n++;
    return n;
}

static void test_generate(void) {
    resp r;
    json_t *v;
    /* non-streaming chat; an unknown model name maps to the loaded one */
    CHECK(http("POST", "/v1/chat/completions", KEY, "{\"model\":\"gpt-5\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &r) == 200);
    v = body_json(&r);
    CHECK(streq(S(v, "model"), "test-model"));
    CHECK(streq(S(json_object_get(json_array_get(json_object_get(v, "choices"), 0), "message"), "content"),
                "Hello from the hone test engine."));
    json_decref(v);
    sb_free(&r.body);
    /* the same prompt again: a cached prefix is reported */
    CHECK(http("POST", "/v1/chat/completions", KEY, "{\"model\":\"gpt-5\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &r) == 200);
    v = body_json(&r);
    json_t *u = json_object_get(v, "usage");
    CHECK(json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens")) >= 0);
    json_decref(v);
    sb_free(&r.body);

    /* streaming Anthropic tool call */
    const char *tool_req =
        "{\"model\":\"claude-sonnet\",\"max_tokens\":200,\"stream\":true,"
        "\"messages\":[{\"role\":\"user\",\"content\":\"MOCK:TOOL Bash {\\\"command\\\": \\\"ls\\\"}\"}],"
        "\"tools\":[{\"name\":\"Bash\",\"input_schema\":{\"type\":\"object\",\"properties\":{\"command\":{\"type\":\"string\"}}}}]}";
    CHECK(http("POST", "/v1/messages?beta=true", KEY, tool_req, &r) == 200);
    CHECK(strcasestr(r.headers, "text/event-stream") != NULL);
    const char *b = r.body.data;
    CHECK(b && !strncmp(b, "event: message_start", 20));
    CHECK(count(b, "\"type\":\"tool_use\"") == 1 && count(b, "input_json_delta") >= 1);
    CHECK(strstr(b, "\"stop_reason\":\"tool_use\"") != NULL);
    CHECK(b && strstr(b, "event: message_stop") != NULL);
    sb_free(&r.body);

    /* stop strings: the text before it, finish stop */
    CHECK(http("POST", "/v1/chat/completions", KEY,
               "{\"messages\":[{\"role\":\"user\",\"content\":\"MOCK:STOP\"}],\"stop\":[\"STOPHERE\"]}", &r) == 200);
    v = body_json(&r);
    json_t *c0 = json_array_get(json_object_get(v, "choices"), 0);
    CHECKF(streq(S(json_object_get(c0, "message"), "content"), "alpha beta "), "stop: %s", r.body.data);
    CHECK(streq(S(c0, "finish_reason"), "stop"));
    json_decref(v);
    sb_free(&r.body);
    CHECK(http("POST", "/v1/messages", KEY,
               "{\"model\":\"m\",\"max_tokens\":50,\"messages\":[{\"role\":\"user\",\"content\":\"MOCK:STOP\"}],\"stop_sequences\":[\"STOPHERE\"]}", &r) == 200);
    v = body_json(&r);
    CHECK(streq(S(v, "stop_reason"), "stop_sequence") && streq(S(v, "stop_sequence"), "STOPHERE"));
    json_decref(v);
    sb_free(&r.body);

    /* max_tokens: finish length / max_tokens / incomplete */
    CHECK(http("POST", "/v1/responses", KEY, "{\"input\":\"MOCK:LONG\",\"max_output_tokens\":5}", &r) == 200);
    v = body_json(&r);
    CHECK(streq(S(v, "status"), "incomplete"));
    CHECK(json_integer_value(json_object_get(json_object_get(v, "usage"), "output_tokens")) == 5);
    json_decref(v);
    sb_free(&r.body);

    /* multi-byte text survives token splits */
    CHECK(http("POST", "/v1/completions", KEY, "{\"prompt\":\"MOCK:UTF8\"}", &r) == 200);
    v = body_json(&r);
    CHECK(streq(S(json_array_get(json_object_get(v, "choices"), 0), "text"), "h\xc3\xa9llo \xe4\xb8\x96\xe7\x95\x8c \xf0\x9f\x8e\x89 done"));
    json_decref(v);
    sb_free(&r.body);

    /* count_tokens and render agree */
    const char *msg = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hello there\"}]}";
    CHECK(http("POST", "/v1/messages/count_tokens", KEY, msg, &r) == 200);
    v = body_json(&r);
    json_int_t nt = json_integer_value(json_object_get(v, "input_tokens"));
    json_decref(v);
    sb_free(&r.body);
    CHECK(http("POST", "/v1/chat/completions/input_tokens", KEY, msg, &r) == 200);
    v = body_json(&r);
    CHECK(json_integer_value(json_object_get(v, "input_tokens")) == nt);
    json_decref(v);
    sb_free(&r.body);
    CHECK(http("POST", "/v1/responses/input_tokens", KEY, "{\"input\":\"hello there\"}", &r) == 200);
    v = body_json(&r);
    CHECK(json_integer_value(json_object_get(v, "input_tokens")) == nt);
    json_decref(v);
    sb_free(&r.body);
    CHECK(http("POST", "/v1/debug/render?api=messages", KEY, msg, &r) == 200);
    v = body_json(&r);
    CHECK(nt > 0 && json_integer_value(json_object_get(v, "n_tokens")) == nt);
    CHECK(streq(S(v, "prompt"), "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n"));
    json_decref(v);
    sb_free(&r.body);
}

/* Keep-alive pings while nothing is produced, then a disconnect cancels. */
static void test_stream_ping_and_cancel(srv_server *srv, teng *te) {
    int fd = dial();
    const char *req = "{\"model\":\"m\",\"max_tokens\":500,\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"MOCK:SLOW\"}]}";
    send_req(fd, "POST", "/v1/messages", KEY, req, strlen(req), true);
    sbuf got = {0};
    char buf[4096];
    double t0 = (double)time(NULL);
    while (count(got.data, "event: ping") < 3 && (double)time(NULL) - t0 < 10) {
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n <= 0) break;
        sb_add(&got, buf, (size_t)n);
    }
    CHECKF(count(got.data, "event: ping") >= 3, "pings while slow");
    CHECK(got.data && strstr(got.data, "message_start") && strstr(got.data, "text_delta"));
    CHECK(srv_running(srv) == 1);
    close(fd);
    for (int i = 0; i < 100 && srv_running(srv) > 0; i++) usleep(20000);
    CHECKF(srv_running(srv) == 0, "a disconnect ends the request");
    for (int i = 0; i < 100 && teng_active(te) > 0; i++) usleep(20000);
    CHECKF(teng_active(te) == 0, "a disconnect cancels the engine request");
    sb_free(&got);
}

/* A client that leaves a non-streaming request also cancels it. */
static void test_nonstream_cancel(srv_server *srv, teng *te) {
    int fd = dial();
    const char *req = "{\"input\":\"MOCK:SLOW\",\"max_output_tokens\":400}";
    send_req(fd, "POST", "/v1/responses", KEY, req, strlen(req), true);
    for (int i = 0; i < 100 && teng_active(te) == 0; i++) usleep(10000);
    CHECK(teng_active(te) == 1);
    close(fd);
    for (int i = 0; i < 150 && (teng_active(te) > 0 || srv_running(srv) > 0); i++) usleep(20000);
    CHECKF(teng_active(te) == 0 && srv_running(srv) == 0, "non-streaming disconnect cancels");
}

/* Two requests on one connection. */
static void test_keepalive_reuse(void) {
    int fd = dial();
    resp r;
    send_req(fd, "GET", "/health", NULL, NULL, 0, true);
    CHECK(read_resp(fd, &r) && r.status == 200);
    sb_free(&r.body);
    const char *req = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stream\":true}";
    send_req(fd, "POST", "/v1/chat/completions", KEY, req, strlen(req), true);
    CHECK(read_resp(fd, &r) && r.status == 200);
    CHECK(r.body.data && strstr(r.body.data, "data: [DONE]"));
    sb_free(&r.body);
    send_req(fd, "GET", "/health", NULL, NULL, 0, true);
    CHECK(read_resp(fd, &r) && r.status == 200);
    sb_free(&r.body);
    close(fd);
}

static void *one_stream(void *arg) {
    resp r;
    const char *req = "{\"input\":\"MOCK:THINK\",\"stream\":true}";
    int st = http("POST", "/v1/responses", KEY, req, &r);
    *(int *)arg = st == 200 && r.body.data && strstr(r.body.data, "response.completed") &&
                  strstr(r.body.data, "Here is my answer") ? 1 : 0;
    sb_free(&r.body);
    return NULL;
}

static void test_concurrent(void) {
    enum { N = 8 };
    pthread_t th[N];
    int ok[N];
    for (int i = 0; i < N; i++) pthread_create(&th[i], NULL, one_stream, &ok[i]);
    int good = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        good += ok[i];
    }
    CHECKF(good == N, "%d of %d concurrent streams complete", good, N);
}

int main(void) {
    char path[512];
    test_data_path(path, sizeof path, "data/models/qwen3-real-q8_0.gguf");
    gguf_ctx *g = NULL;
    tok_vocab *v = NULL;
    hn_err err = {0};
    if (gguf_open(path, &g, &err) != HN_OK || tok_load(g, &v, &err) != HN_OK) {
        CHECKF(0, "load %s: %s", path, err.msg);
        TEST_DONE();
    }
    prm_model pm;
    CHECK(prm_model_init(&pm, g, v, &err) == HN_OK);
    teng *te;
    CHECK(teng_create(v, 512, &te, &err) == HN_OK);
    srv_engine se = teng_engine(te);
    srv_config cfg = srv_default_config();
    cfg.port = 0;
    cfg.api_key = "sekrit";
    cfg.model_name = "test-model";
    cfg.n_ctx = 512;
    cfg.max_body = 1u << 20;
    cfg.ping_ms = 50;
    srv_server *srv = NULL;
    CHECK(srv_start(&cfg, &se, &pm, &srv, &err) == HN_OK);
    if (!srv) TEST_DONE();
    g_port = srv_port(srv);
    CHECK(g_port > 0);
    test_simple();
    test_errors();
    test_generate();
    test_stream_ping_and_cancel(srv, te);
    test_nonstream_cancel(srv, te);
    test_keepalive_reuse();
    test_concurrent();
    srv_stop(srv);
    teng_free(te);
    prm_model_free(&pm);
    tok_free(v);
    gguf_close(g);
    TEST_DONE();
}
