/* test_server_map.c: request mapping from each wire API into the internal
 * chat request (server/creq.h), and replay of every recorded client request
 * (mapped, then rendered by the chat layer with a small template). */
#include <dirent.h>
#include <jansson.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "server/creq.h"
#include "server/creq_int.h"
#include "template/chat.h"
#include "test.h"

/* A template that prints every message as "[role]content\n". */
static chat_template *g_tmpl;

/* The request's prompt as the chat layer renders it (hn_malloc'd), or NULL. */
static char *render(const creq *r) {
    if (!g_tmpl) return NULL;
    chat_options opt = {.add_generation_prompt = false};
    chat_prompt cp;
    hn_err err = {0};
    if (chat_render(g_tmpl, r->messages, NULL, &opt, &cp, &err) != HN_OK) {
        fprintf(stderr, "render: %s\n", err.msg);
        chat_prompt_free(&cp);
        return NULL;
    }
    return cp.text;
}

static json_t *J(const char *s) {
    json_error_t je;
    json_t *v = json_loads(s, 0, &je);
    if (!v) fprintf(stderr, "bad test json: %s: %s\n", je.text, s);
    return v;
}

static const char *role_at(const creq *r, size_t i) {
    return json_string_value(json_object_get(json_array_get(r->messages, i), "role"));
}
static const char *content_at(const creq *r, size_t i) {
    return json_string_value(json_object_get(json_array_get(r->messages, i), "content"));
}
static bool streq(const char *a, const char *b) { return a && b && !strcmp(a, b); }

static void test_chat(void) {
    creq r;
    api_error e;
    json_t *b = J("{\"model\":\"gpt-x\",\"messages\":["
                  "{\"role\":\"system\",\"content\":\"S1\"},{\"role\":\"developer\",\"content\":[{\"type\":\"text\",\"text\":\"S2\"}]},"
                  "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"image_url\",\"image_url\":{}},{\"type\":\"text\",\"text\":\"b\"}]},"
                  "{\"role\":\"assistant\",\"content\":null,\"reasoning\":\"hmm\",\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"ls\",\"arguments\":\"{\\\"z\\\":1,\\\"a\\\":2}\"}},"
                  "{\"id\":\"c2\",\"type\":\"function\",\"function\":{\"name\":\"cat\",\"arguments\":\"not json\"}}]},"
                  "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"out1\"},"
                  "{\"role\":\"tool\",\"tool_call_id\":\"c2\",\"content\":[{\"type\":\"text\",\"text\":\"out2\"}]},"
                  "{\"role\":\"system\",\"content\":\"late\"},{\"role\":\"weird\",\"content\":\"w\"}],"
                  "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"ls\",\"parameters\":{\"type\":\"object\"},\"strict\":true}},{\"type\":\"custom\",\"custom\":{\"name\":\"x\"}}],"
                  "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"ls\"}},\"parallel_tool_calls\":false,"
                  "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"schema\":{\"type\":\"object\"}}},"
                  "\"stop\":[\"END\",\"\"],\"max_tokens\":5,\"max_completion_tokens\":7,\"temperature\":0.5,\"top_p\":0.9,\"seed\":42,"
                  "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"unknown_field\":{\"x\":1}}");
    CHECK(creq_from_chat(b, &r, &e));
    CHECK(json_array_size(r.messages) == 7);
    CHECK(streq(role_at(&r, 0), "system") && streq(content_at(&r, 0), "S1\n\nS2"));
    CHECK(streq(role_at(&r, 1), "user") && streq(content_at(&r, 1), "a\nb"));
    json_t *a = json_array_get(r.messages, 2);
    CHECK(streq(role_at(&r, 2), "assistant") && streq(content_at(&r, 2), ""));
    CHECK(streq(json_string_value(json_object_get(a, "reasoning_content")), "hmm"));
    json_t *calls = json_object_get(a, "tool_calls");
    CHECK(json_array_size(calls) == 2);
    json_t *args = json_object_get(json_object_get(json_array_get(calls, 0), "function"), "arguments");
    CHECK(json_is_object(args));
    char *dump = json_dumps(args, JSON_COMPACT);
    CHECKF(dump && !strcmp(dump, "{\"z\":1,\"a\":2}"), "key order kept: %s", dump);
    free(dump);
    CHECK(json_is_string(json_object_get(json_object_get(json_array_get(calls, 1), "function"), "arguments")));
    CHECK(streq(role_at(&r, 3), "tool") && streq(content_at(&r, 3), "out1"));
    CHECK(streq(json_string_value(json_object_get(json_array_get(r.messages, 3), "name")), "ls"));
    CHECK(streq(json_string_value(json_object_get(json_array_get(r.messages, 4), "name")), "cat"));
    CHECK(streq(content_at(&r, 4), "out2"));
    CHECK(streq(role_at(&r, 5), "system") && streq(content_at(&r, 5), "late"));
    CHECK(streq(role_at(&r, 6), "user") && streq(content_at(&r, 6), "w"));
    CHECK(json_array_size(r.tools) == 1);
    CHECK(json_is_true(json_object_get(json_object_get(json_array_get(r.tools, 0), "function"), "strict")));
    CHECK(r.tool_choice == CREQ_TOOLS_NAMED && streq(r.tool_name, "ls"));
    CHECK(!r.parallel_tool_calls);
    CHECK(r.format == CREQ_FMT_JSON_SCHEMA && json_is_object(r.schema));
    CHECK(r.n_stop == 1 && streq(r.stop[0], "END"));
    CHECK(r.max_tokens == 7);
    CHECK(r.has_temp && r.temp == 0.5f && r.has_top_p && r.has_seed && r.seed == 42 && !r.has_top_k);
    CHECK(r.stream && r.include_usage);
    CHECK(streq(r.model, "gpt-x"));
    CHECK(r.echo_reasoning_as_reasoning);
    CHECK(!r.prefill);
    creq_free(&r);
    json_decref(b);

    /* errors */
    const char *bad[] = {
        "[]",
        "{\"model\":\"m\"}",
        "{\"messages\":[]}",
        "{\"messages\":[{\"content\":\"x\"}]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":5}]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":\"hot\"}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":-1}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":2}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"required\"}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{}}]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":5}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":\"yes\"}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"xml\"}}",
        "{\"messages\":[{\"role\":\"assistant\",\"content\":\"x\",\"tool_calls\":[{\"id\":\"1\"}]}]}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *v = J(bad[i]);
        memset(&e, 0, sizeof e);
        bool ok = creq_from_chat(v, &r, &e);
        CHECKF(!ok && e.kind == APIE_INVALID && e.message[0], "chat bad[%zu] refused: %s", i, bad[i]);
        if (ok) creq_free(&r);
        json_decref(v);
    }

    /* prefill: a trailing assistant message */
    b = J("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"Sure\"}],\"reasoning_effort\":\"none\"}");
    CHECK(creq_from_chat(b, &r, &e));
    CHECK(r.prefill && r.thinking == 0 && r.max_tokens == -1 && r.tool_choice == CREQ_TOOLS_AUTO && r.parallel_tool_calls);
    creq_free(&r);
    json_decref(b);
    b = J("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"chat_template_kwargs\":{\"enable_thinking\":true}}");
    CHECK(creq_from_chat(b, &r, &e));
    CHECK(r.thinking == 1 && json_is_object(r.template_kwargs));
    creq_free(&r);
    json_decref(b);
}

static void test_completions(void) {
    creq r;
    api_error e;
    json_t *b = J("{\"prompt\":\"Once\",\"max_tokens\":3,\"stop\":\"\\n\"}");
    CHECK(creq_from_completions(b, &r, &e));
    CHECK(streq(r.prompt, "Once") && r.max_tokens == 3 && r.n_stop == 1 && !r.messages);
    creq_free(&r);
    json_decref(b);
    b = J("{\"prompt\":[1,2,3]}");
    CHECK(creq_from_completions(b, &r, &e));
    CHECK(r.n_prompt_tokens == 3 && r.prompt_tokens[2] == 3);
    creq_free(&r);
    json_decref(b);
    b = J("{\"prompt\":[\"one\"]}");
    CHECK(creq_from_completions(b, &r, &e));
    CHECK(streq(r.prompt, "one"));
    creq_free(&r);
    json_decref(b);
    b = J("{\"prompt\":[1,\"x\"]}");
    CHECK(!creq_from_completions(b, &r, &e) && e.kind == APIE_INVALID);
    json_decref(b);
    b = J("{\"max_tokens\":3}");
    CHECK(!creq_from_completions(b, &r, &e) && e.kind == APIE_INVALID && streq(e.param, "prompt"));
    json_decref(b);
}

static void test_responses(void) {
    creq r;
    api_error e;
    json_t *b = J("{\"model\":\"local\",\"instructions\":\"I\",\"input\":["
                  "{\"type\":\"message\",\"role\":\"developer\",\"content\":[{\"type\":\"input_text\",\"text\":\"D\"}]},"
                  "{\"role\":\"user\",\"content\":\"hello\"},"
                  "{\"type\":\"reasoning\",\"id\":\"rs_1\",\"summary\":[{\"type\":\"summary_text\",\"text\":\"think\"}],\"content\":null,\"encrypted_content\":\"zzz\"},"
                  "{\"type\":\"function_call\",\"call_id\":\"call_1\",\"name\":\"exec\",\"arguments\":\"{\\\"cmd\\\":\\\"ls\\\"}\"},"
                  "{\"type\":\"function_call\",\"call_id\":\"call_2\",\"name\":\"exec\",\"arguments\":\"{}\"},"
                  "{\"type\":\"function_call_output\",\"call_id\":\"call_1\",\"output\":\"a.c\"},"
                  "{\"type\":\"function_call_output\",\"call_id\":\"call_2\",\"output\":[{\"type\":\"input_text\",\"text\":\"b.c\"}]},"
                  "{\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"done\"}]},"
                  "{\"type\":\"web_search_call\",\"id\":\"x\"}],"
                  "\"tools\":[{\"type\":\"function\",\"name\":\"exec\",\"parameters\":{\"type\":\"object\"},\"strict\":false},"
                  "{\"type\":\"namespace\",\"name\":\"ns\",\"tools\":[{\"type\":\"function\",\"name\":\"sub\",\"parameters\":{}}]},"
                  "{\"type\":\"web_search\"},{\"type\":\"custom\",\"name\":\"apply_patch\",\"format\":{\"type\":\"grammar\"}}],"
                  "\"tool_choice\":\"auto\",\"parallel_tool_calls\":true,\"reasoning\":{\"effort\":\"medium\"},\"max_output_tokens\":99,"
                  "\"store\":false,\"include\":[\"reasoning.encrypted_content\"],\"stream\":true,\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"x\",\"schema\":{\"type\":\"object\"}}}}");
    CHECK(creq_from_responses(b, &r, &e));
    CHECKF(json_array_size(r.messages) == 6, "responses messages: %zu", json_array_size(r.messages));
    CHECK(streq(content_at(&r, 0), "I\n\nD") && streq(role_at(&r, 0), "system"));
    CHECK(streq(role_at(&r, 1), "user") && streq(content_at(&r, 1), "hello"));
    json_t *a = json_array_get(r.messages, 2);
    CHECK(streq(role_at(&r, 2), "assistant"));
    CHECK(streq(json_string_value(json_object_get(a, "reasoning_content")), "think"));
    CHECK(json_array_size(json_object_get(a, "tool_calls")) == 2);
    CHECK(streq(role_at(&r, 3), "tool") && streq(content_at(&r, 3), "a.c"));
    CHECK(streq(json_string_value(json_object_get(json_array_get(r.messages, 3), "name")), "exec"));
    CHECK(streq(content_at(&r, 4), "b.c"));
    CHECK(streq(role_at(&r, 5), "assistant") && streq(content_at(&r, 5), "done"));
    CHECK(json_array_size(r.tools) == 3);
    CHECK(streq(json_string_value(json_object_get(json_object_get(json_array_get(r.tools, 1), "function"), "name")), "sub"));
    CHECK(streq(json_string_value(json_object_get(json_object_get(json_array_get(r.tools, 2), "function"), "name")), "apply_patch"));
    CHECK(r.max_tokens == 99 && r.thinking == 1 && r.stream && r.format == CREQ_FMT_JSON_SCHEMA);
    creq_free(&r);
    json_decref(b);

    b = J("{\"input\":\"hi\"}");
    CHECK(creq_from_responses(b, &r, &e));
    CHECK(json_array_size(r.messages) == 1 && streq(content_at(&r, 0), "hi"));
    creq_free(&r);
    json_decref(b);
    b = J("{\"input\":\"hi\",\"previous_response_id\":\"resp_1\"}");
    CHECK(!creq_from_responses(b, &r, &e) && e.kind == APIE_INVALID && streq(e.param, "previous_response_id"));
    json_decref(b);
    b = J("{\"input\":[]}");
    CHECK(!creq_from_responses(b, &r, &e) && e.kind == APIE_INVALID);
    json_decref(b);
    b = J("{\"input\":[{\"type\":\"message\",\"content\":\"x\"}]}");
    CHECK(!creq_from_responses(b, &r, &e) && e.kind == APIE_INVALID);
    json_decref(b);
}

static void test_messages(void) {
    creq r;
    api_error e;
    json_t *b = J("{\"model\":\"claude-opus-4-8\",\"max_tokens\":100,"
                  "\"system\":[{\"type\":\"text\",\"text\":\"x-anthropic-billing-header: cc_version=2.1.197.fbe; cc_entrypoint=cli; cch=ab12f;\"},"
                  "{\"type\":\"text\",\"text\":\"You are Claude.\",\"cache_control\":{\"type\":\"ephemeral\"}}],"
                  "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"<r>\"},{\"type\":\"text\",\"text\":\"run ls\"}]},"
                  "{\"role\":\"system\",\"content\":\"agents...\"},"
                  "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"T\",\"signature\":\"whatever-sig\"},"
                  "{\"type\":\"text\",\"text\":\"ok\"},{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"Bash\",\"input\":{\"command\":\"ls\",\"a\":1}}]},"
                  "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\",\"content\":[{\"type\":\"text\",\"text\":\"a.c\"}],\"is_error\":false},"
                  "{\"type\":\"text\",\"text\":\"thanks\"}]}],"
                  "\"tools\":[{\"name\":\"Bash\",\"description\":\"run\",\"input_schema\":{\"type\":\"object\",\"properties\":{\"command\":{\"type\":\"string\"}}}},"
                  "{\"type\":\"web_search_20250305\",\"name\":\"web_search\"}],"
                  "\"tool_choice\":{\"type\":\"any\",\"disable_parallel_tool_use\":true},\"stop_sequences\":[\"STOP\"],"
                  "\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":2048},\"stream\":true,\"metadata\":{\"user_id\":\"u\"},"
                  "\"context_management\":{\"edits\":[]},\"output_config\":{\"effort\":\"high\"}}");
    CHECK(creq_from_messages(b, false, &r, &e));
    CHECK(json_array_size(r.messages) == 6);
    /* the billing block is mapped as sent; the chat layer removes it at render */
    CHECKF(streq(content_at(&r, 0), "x-anthropic-billing-header: cc_version=2.1.197.fbe; cc_entrypoint=cli; cch=ab12f;\n\n"
                                    "You are Claude."),
           "system blocks joined: %s", content_at(&r, 0));
    char *p = render(&r);
    const char *head = "[system]You are Claude.\n[user]<r>\nrun ls\n";
    CHECKF(p && !strncmp(p, head, strlen(head)), "billing line rendered: %s", p);
    hn_free(p);
    CHECK(streq(role_at(&r, 1), "user") && streq(content_at(&r, 1), "<r>\nrun ls"));
    CHECK(streq(role_at(&r, 2), "system") && streq(content_at(&r, 2), "agents..."));
    json_t *a = json_array_get(r.messages, 3);
    CHECK(streq(role_at(&r, 3), "assistant") && streq(content_at(&r, 3), "ok"));
    CHECK(streq(json_string_value(json_object_get(a, "reasoning_content")), "T"));
    json_t *call = json_array_get(json_object_get(a, "tool_calls"), 0);
    CHECK(streq(json_string_value(json_object_get(call, "id")), "toolu_1"));
    CHECK(json_is_object(json_object_get(json_object_get(call, "function"), "arguments")));
    CHECK(streq(role_at(&r, 4), "tool") && streq(content_at(&r, 4), "a.c"));
    CHECK(streq(json_string_value(json_object_get(json_array_get(r.messages, 4), "name")), "Bash"));
    CHECK(streq(role_at(&r, 5), "user") && streq(content_at(&r, 5), "thanks"));
    CHECK(json_array_size(r.tools) == 1);
    CHECK(json_is_object(json_object_get(json_object_get(json_array_get(r.tools, 0), "function"), "parameters")));
    CHECK(r.tool_choice == CREQ_TOOLS_REQUIRED && !r.parallel_tool_calls);
    CHECK(r.n_stop == 1 && r.thinking == 1 && r.thinking_budget == 2048 && r.max_tokens == 100 && r.stream);
    creq_free(&r);
    json_decref(b);

    /* a billing-only system field: no system message is rendered */
    b = J("{\"model\":\"m\",\"max_tokens\":9,\"system\":[{\"type\":\"text\",\"text\":\"x-anthropic-billing-header: cch=00000;\"}],"
          "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}");
    CHECK(creq_from_messages(b, false, &r, &e));
    p = render(&r);
    CHECKF(p && !strcmp(p, "[user]hi\n"), "billing-only system rendered: %s", p);
    hn_free(p);
    creq_free(&r);
    json_decref(b);

    b = J("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"thinking\":{\"type\":\"disabled\"},"
          "\"tool_choice\":{\"type\":\"none\"},\"system\":\"plain\"}");
    CHECK(creq_from_messages(b, false, &r, &e));
    CHECK(r.thinking == 0 && r.tool_choice == CREQ_TOOLS_NONE && r.max_tokens == -1 && streq(content_at(&r, 0), "plain"));
    creq_free(&r);
    json_decref(b);
    b = J("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"The answer is\"}],"
          "\"tools\":[{\"name\":\"t\",\"input_schema\":{}}],\"tool_choice\":{\"type\":\"tool\",\"name\":\"t\"}}");
    CHECK(creq_from_messages(b, false, &r, &e));
    CHECK(r.prefill && r.tool_choice == CREQ_TOOLS_NAMED && streq(r.tool_name, "t"));
    creq_free(&r);
    json_decref(b);
    b = J("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}");
    CHECK(creq_from_messages(b, true, &r, &e) && r.count_only);
    creq_free(&r);
    json_decref(b);
    const char *bad[] = {
        "{\"model\":\"m\"}",
        "{\"model\":\"m\",\"messages\":[]}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":5}]}",
        "{\"model\":\"m\",\"messages\":[{\"content\":\"x\"}]}",
        "{\"model\":\"m\",\"max_tokens\":\"x\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
        "{\"model\":\"m\",\"system\":7,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
        "{\"model\":\"m\",\"tool_choice\":{\"type\":\"magic\"},\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
        "{\"model\":\"m\",\"tool_choice\":{\"type\":\"any\"},\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *v = J(bad[i]);
        bool ok = creq_from_messages(v, false, &r, &e);
        CHECKF(!ok && e.kind == APIE_INVALID, "messages bad[%zu] refused", i);
        if (ok) creq_free(&r);
        json_decref(v);
    }
}

/* A tool result takes the name of the latest call it answers, in every API. */
static void test_result_names(void) {
    static const char *const bodies[3] = {
        "{\"max_tokens\":9,\"messages\":["
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"A\",\"input\":{}}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"t1\",\"content\":\"r1\"}]},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"B\",\"input\":{}}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"t1\",\"content\":\"r2\"},"
        "{\"type\":\"tool_result\",\"tool_use_id\":\"zz\",\"content\":\"r3\"}]}]}",
        "{\"input\":[{\"type\":\"function_call\",\"call_id\":\"t1\",\"name\":\"A\",\"arguments\":\"{}\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"t1\",\"output\":\"r1\"},"
        "{\"type\":\"function_call\",\"call_id\":\"t1\",\"name\":\"B\",\"arguments\":\"{}\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"t1\",\"output\":\"r2\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"zz\",\"output\":\"r3\"}]}",
        "{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"t1\",\"type\":\"function\",\"function\":{\"name\":\"A\",\"arguments\":\"{}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"t1\",\"content\":\"r1\"},"
        "{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"t1\",\"type\":\"function\",\"function\":{\"name\":\"B\",\"arguments\":\"{}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"t1\",\"content\":\"r2\"},"
        "{\"role\":\"tool\",\"tool_call_id\":\"zz\",\"content\":\"r3\"}]}",
    };
    static const api_kind apis[3] = {API_MESSAGES, API_RESPONSES, API_CHAT};
    for (int k = 0; k < 3; k++) {
        creq r;
        api_error e = {0};
        json_t *b = J(bodies[k]);
        bool ok = creq_parse(apis[k], false, b, &r, &e);
        CHECKF(ok, "api %d: %s", k, e.message);
        json_decref(b);
        if (!ok) continue;
        const char *want[3] = {"A", "B", NULL};
        int seen = 0;
        for (size_t i = 0; i < json_array_size(r.messages); i++) {
            if (!streq(role_at(&r, i), "tool")) continue;
            const json_t *tm = json_array_get(r.messages, i);
            const char *nm = json_string_value(json_object_get(tm, "name"));
            CHECKF(seen < 3 && (want[seen] ? streq(nm, want[seen]) : !nm), "api %d, result %d: name %s", k, seen,
                   nm ? nm : "(none)");
            CHECK(streq(json_string_value(json_object_get(tm, "tool_call_id")), seen < 2 ? "t1" : "zz"));
            seen++;
        }
        CHECKF(seen == 3, "api %d: %d tool results", k, seen);
        creq_free(&r);
    }
}

/* A tiny deterministic generator for the shapes below. */
static uint32_t g_rng = 12345;
static uint32_t rnd(uint32_t n) {
    g_rng = g_rng * 1103515245u + 12345u;
    return (g_rng >> 16) % n;
}

/* Tool-result names over random conversations with repeated, empty and
 * unknown call ids, in every API: each is what creq_call_name finds in the
 * messages before it (the latest message holding a call with the id, its
 * first such call). */
static void test_result_names_random(void) {
    static const char *const ids[] = {"", "a", "b", "c"};
    static const char *const names[] = {"f", "g", "", "h"};
    int bad = 0, results = 0;
    for (int round = 0; round < 300; round++) {
        api_kind api = round % 3 == 0 ? API_CHAT : round % 3 == 1 ? API_RESPONSES : API_MESSAGES;
        json_t *items = json_array();
        int n = 1 + (int)rnd(12);
        for (int i = 0; i < n; i++) {
            uint32_t k = rnd(4);
            if (api == API_CHAT) {
                if (k == 0) {
                    json_t *calls = json_array();
                    for (uint32_t c = rnd(4); c > 0; c--)
                        json_array_append_new(calls, json_pack("{s:s,s:{s:s,s:s}}", "id", ids[rnd(4)], "function",
                                                               "name", names[rnd(4)], "arguments", "{}"));
                    json_array_append_new(items, json_pack("{s:s,s:o}", "role", "assistant", "tool_calls", calls));
                } else if (k == 1 || k == 2) {
                    json_array_append_new(items, rnd(5) ? json_pack("{s:s,s:s}", "role", "tool", "tool_call_id", ids[rnd(4)])
                                                        : json_pack("{s:s}", "role", "tool"));
                } else {
                    json_array_append_new(items, json_pack("{s:s,s:s}", "role", rnd(2) ? "user" : "assistant", "content", "x"));
                }
            } else if (api == API_RESPONSES) {
                if (k == 0)
                    json_array_append_new(items, json_pack("{s:s,s:s,s:s}", "type", "function_call", "call_id", ids[rnd(4)],
                                                           "name", names[rnd(4)]));
                else if (k == 1 || k == 2)
                    json_array_append_new(items, json_pack("{s:s,s:s}", "type", "function_call_output", "call_id", ids[rnd(4)]));
                else
                    json_array_append_new(items, json_pack("{s:s,s:s}", "role", rnd(2) ? "user" : "assistant", "content", "x"));
            } else {
                json_t *blocks = json_array();
                const char *role = k < 2 ? "assistant" : "user";
                for (uint32_t c = 1 + rnd(3); c > 0; c--)
                    json_array_append_new(blocks, k < 2 ? json_pack("{s:s,s:s,s:s,s:{}}", "type", "tool_use", "id", ids[rnd(4)],
                                                                  "name", names[rnd(4)], "input")
                                                        : json_pack("{s:s,s:s}", "type", "tool_result", "tool_use_id", ids[rnd(4)]));
                json_array_append_new(items, json_pack("{s:s,s:o}", "role", role, "content", blocks));
            }
        }
        json_t *b = api == API_RESPONSES ? json_pack("{s:o}", "input", items)
                                         : json_pack("{s:i,s:o}", "max_tokens", 9, "messages", items);
        creq r;
        api_error e = {0};
        bool ok = creq_parse(api, false, b, &r, &e);
        json_decref(b);
        if (!ok) {
            bad++;
            continue;
        }
        json_t *before = json_array();
        for (size_t i = 0; i < json_array_size(r.messages); i++) {
            json_t *m = json_array_get(r.messages, i);
            if (streq(role_at(&r, i), "tool")) {
                const char *id = json_string_value(json_object_get(m, "tool_call_id"));
                const char *want = creq_call_name(before, id);
                const char *got = json_string_value(json_object_get(m, "name"));
                if (want ? !streq(got, want) : got != NULL) bad++;
                results++;
            }
            json_array_append(before, m);
        }
        json_decref(before);
        creq_free(&r);
    }
    CHECKF(bad == 0 && results > 300, "%d of %d tool-result names differ from creq_call_name's", bad, results);
}

/* CPU seconds of this process. */
static double cpu_s(void) { return (double)clock() / CLOCKS_PER_SEC; }

/* Long lists map in linear time: tool results (each used to scan every
 * message before it for its call), Responses assistant texts and reasoning
 * items merged into one turn (each used to copy what came before): bodies
 * of 1 to 4 MB, which took 1.5 to 14 s of CPU each when quadratic. */
static void test_long_lists(void) {
    enum { N = 30000 };
    char hundred[100];
    memset(hundred, 'r', sizeof hundred);
    json_t *chat = json_array(), *resp = json_array(), *reas = json_array(), *msg = json_array();
    json_array_append_new(chat, json_pack("{s:s,s:[{s:s,s:{s:s}}]}", "role", "assistant", "tool_calls", "id", "c",
                                          "function", "name", "f"));
    for (int i = 0; i < N; i++) {
        json_array_append_new(chat, json_pack("{s:s,s:s}", "role", "tool", "tool_call_id", i % 2 ? "c" : "x"));
        json_array_append_new(resp, json_pack("{s:s,s:s}", "role", "assistant", "content", "0123456789"));
        json_array_append_new(reas, json_pack("{s:s,s:s#}", "type", "reasoning", "summary", hundred, (size_t)100));
        json_array_append_new(msg, json_pack("{s:s,s:s}", "type", "tool_result", "tool_use_id", "x"));
    }
    for (int i = 0; i < N; i++)
        json_array_append_new(resp, json_pack("{s:s,s:s}", "type", "function_call_output", "call_id", "x"));
    json_array_append_new(reas, json_pack("{s:s,s:s}", "role", "assistant", "content", "y"));
    json_t *bodies[4] = {json_pack("{s:o}", "messages", chat), json_pack("{s:o}", "input", resp),
                         json_pack("{s:o}", "input", reas),
                         json_pack("{s:i,s:[{s:s,s:o}]}", "max_tokens", 9, "messages", "role", "user", "content", msg)};
    static const api_kind apis[4] = {API_CHAT, API_RESPONSES, API_RESPONSES, API_MESSAGES};
    for (int k = 0; k < 4; k++) {
        creq r;
        api_error e = {0};
        double t0 = cpu_s();
        bool ok = creq_parse(apis[k], false, bodies[k], &r, &e);
        double t = cpu_s() - t0;
        CHECKF(ok, "body %d: %s", k, e.message);
        CHECKF(t < 1.0, "body %d: %.2f s of CPU to map", k, t);
        if (!ok) continue;
        size_t n = json_array_size(r.messages);
        if (k == 0) CHECK(n == N + 1 && streq(json_string_value(json_object_get(json_array_get(r.messages, 2), "name")), "f"));
        if (k == 1) { /* the texts of one turn joined by "\n" */
            const char *c = content_at(&r, 0);
            CHECK(n == N + 1 && c && strlen(c) == 11 * N - 1 && c[10] == '\n' && c[11] == '0');
        }
        if (k == 2) {
            const char *rc = json_string_value(json_object_get(json_array_get(r.messages, 0), "reasoning_content"));
            CHECK(n == 1 && rc && strlen(rc) == 101 * N - 1 && rc[100] == '\n' && rc[101] == 'r');
        }
        if (k == 3) CHECK(n == N);
        creq_free(&r);
        json_decref(bodies[k]);
    }
}

static void test_errors(void) {
    api_error e;
    sbuf b = {0};
    api_seterr(&e, APIE_CONTEXT, "messages", "too long: %d > %d", 10, 5);
    api_error_json(API_CHAT, &e, &b);
    json_t *v = json_loads(b.data, 0, NULL);
    CHECK(v && streq(json_string_value(json_object_get(json_object_get(v, "error"), "code")), "context_length_exceeded"));
    CHECK(streq(json_string_value(json_object_get(json_object_get(v, "error"), "type")), "invalid_request_error"));
    CHECK(streq(json_string_value(json_object_get(json_object_get(v, "error"), "param")), "messages"));
    json_decref(v);
    sb_reset(&b);
    api_error_json(API_MESSAGES, &e, &b);
    v = json_loads(b.data, 0, NULL);
    CHECK(v && streq(json_string_value(json_object_get(v, "type")), "error"));
    CHECK(streq(json_string_value(json_object_get(json_object_get(v, "error"), "type")), "invalid_request_error"));
    CHECK(streq(json_string_value(json_object_get(json_object_get(v, "error"), "message")), "too long: 10 > 5"));
    json_decref(v);
    sb_free(&b);
    CHECK(api_http_status(API_CHAT, APIE_CONTEXT) == 400);
    CHECK(api_http_status(API_MESSAGES, APIE_TOO_LARGE) == 413);
    CHECK(api_http_status(API_MESSAGES, APIE_OVERLOADED) == 529);
    CHECK(api_http_status(API_RESPONSES, APIE_AUTH) == 401);
    char id1[40], id2[40];
    api_make_id(id1, sizeof id1, "msg_", 24);
    api_make_id(id2, sizeof id2, "msg_", 24);
    CHECK(strlen(id1) == 28 && strncmp(id1, "msg_", 4) == 0 && strcmp(id1, id2) != 0);
}

/* Every request recorded from Claude Code, Codex, OpenCode, Pi and Cline maps. */
static void test_replay(void) {
    char dir[512];
    test_data_path(dir, sizeof dir, "data/clients");
    DIR *d = opendir(dir);
    CHECKF(d != NULL, "open %s", dir);
    if (!d) return;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l < 7 || strcmp(de->d_name + l - 6, ".jsonl")) continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        static char line[1 << 20];
        while (fgets(line, sizeof line, f)) {
            json_t *rec = json_loads(line, 0, NULL);
            const char *p = json_string_value(json_object_get(rec, "path"));
            const char *method = json_string_value(json_object_get(rec, "method"));
            json_t *body = json_object_get(rec, "body");
            if (!p || !method || strcmp(method, "POST") || !json_is_object(body)) {
                json_decref(rec);
                continue;
            }
            api_kind api;
            bool count = false, known = true;
            if (strstr(p, "/messages/count_tokens")) api = API_MESSAGES, count = true;
            else if (strstr(p, "/messages")) api = API_MESSAGES;
            else if (strstr(p, "/chat/completions")) api = API_CHAT;
            else if (strstr(p, "/responses")) api = API_RESPONSES;
            else if (strstr(p, "/completions")) api = API_COMPLETIONS;
            else known = false;
            if (known) {
                creq r;
                api_error e = {0};
                bool ok = creq_parse(api, count, body, &r, &e);
                CHECKF(ok, "%s seq %lld (%s) maps: %s", de->d_name,
                       (long long)json_integer_value(json_object_get(rec, "seq")), p, e.message);
                if (ok) {
                    CHECKF(json_array_size(r.messages) > 0, "%s has messages", de->d_name);
                    /* tools, when sent, survive (hosted-only tool lists aside) */
                    if (json_array_size(json_object_get(body, "tools")) > 3)
                        CHECKF(json_array_size(r.tools) > 3, "%s keeps its tools", de->d_name);
                    /* it renders, and no billing line reaches the prompt */
                    char *prompt = render(&r);
                    CHECKF(prompt && !strstr(prompt, "x-anthropic-billing-header"), "%s: billing header removed",
                           de->d_name);
                    hn_free(prompt);
                    creq_free(&r);
                }
                n++;
            }
            json_decref(rec);
        }
        fclose(f);
    }
    closedir(d);
    CHECKF(n >= 80, "replayed %d recorded requests", n);
}

int main(void) {
    static const char src[] = "{% for m in messages %}[{{ m.role }}]{{ m.content }}\n{% endfor %}";
    hn_err err = {0};
    CHECKF(chat_template_new(src, strlen(src), NULL, NULL, NULL, NULL, &g_tmpl, &err) == HN_OK, "template: %s",
           err.msg);
    test_chat();
    test_completions();
    test_responses();
    test_messages();
    test_result_names();
    test_result_names_random();
    test_long_lists();
    test_errors();
    test_replay();
    chat_template_free(g_tmpl);
    TEST_DONE();
}
