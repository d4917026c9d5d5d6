/* test_chat.c: the chat glue (template/chat.h) on the 68 real templates of the
 * shared corpus: probes, the prefix property (turn N+1's prompt extends turn
 * N's, byte for byte, and token for token with the real Qwen3 tokenizer for
 * Qwen's templates) with an explicit list of the templates where it cannot
 * hold and why, in-place and demoted system messages, tool-argument key order,
 * reasoning aliases, and BOS handling in chat_tokenize. The recorded Claude
 * Code requests are tested in test_chat_claude.c. */
#include <jansson.h>
#include <stdbool.h>
#include <time.h>

#include "core/alloc.h"
#include "gguf/gguf.h"
#include "template/chat.h"
#include "test.h"
#include "tokenizer/tokenizer.h"

static int64_t fixed_now(void) {
    struct tm tm = {0};
    tm.tm_year = 2025 - 1900;
    tm.tm_mon = 5;
    tm.tm_mday = 15;
    tm.tm_hour = 10;
    tm.tm_min = 30;
    tm.tm_isdst = -1;
    return (int64_t)mktime(&tm);
}

static bool verbose(void) { return getenv("HONE_TEST_VERBOSE") && *getenv("HONE_TEST_VERBOSE"); }

/* ---- the shared Qwen3 vocabulary ---- */

static gguf_ctx *qwen_gguf;
static tok_vocab *qwen_vocab;

static void load_qwen(void) {
    char path[1024];
    hn_err err = {0};
    test_data_path(path, sizeof path, "data/models/qwen3-real-q8_0.gguf");
    CHECKF(gguf_open(path, &qwen_gguf, &err) == HN_OK, "open %s: %s", path, err.msg);
    if (qwen_gguf) CHECKF(tok_load(qwen_gguf, &qwen_vocab, &err) == HN_OK, "tok_load: %s", err.msg);
}

/* ---- an agent conversation of our own ---- */

/* Tool calls with arguments as JSON strings (the OpenAI wire form) in an
 * unusual key order, reasoning, parallel calls, and Claude Code-style system
 * reminders in the middle (after a tool result and after a user message). */
static const char AGENT_TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"read_file\",\"description\":\"Read a file.\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"path\":{\"type\":\"string\"},\"offset\":{\"type\":"
    "\"integer\"},\"limit\":{\"type\":\"integer\"}},\"required\":[\"path\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"run\",\"description\":\"Run a shell command.\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"command\":{\"type\":\"string\"},\"timeout\":{\"type\":"
    "\"integer\"}},\"required\":[\"command\"]}}}]";

#define CALL(id, name, args)                                                                                     \
    "{\"id\":\"" id "\",\"type\":\"function\",\"function\":{\"name\":\"" name "\",\"arguments\":\"" args "\"}}"

static const char AGENT_PLAIN[] =
    "[{\"role\":\"system\",\"content\":\"You are a coding agent.\"},"
    "{\"role\":\"user\",\"content\":\"Fix the failing test in src/a.c.\"},"
    "{\"role\":\"assistant\",\"content\":\"I will look at the file.\",\"tool_calls\":["
    CALL("call_Ab3dE5gH7jK9mN1pQ3sT5vX7", "read_file", "{\\\"path\\\": \\\"src/a.c\\\", \\\"limit\\\": 40, \\\"offset\\\": 1}") "]},"
    "{\"role\":\"tool\",\"tool_call_id\":\"call_Ab3dE5gH7jK9mN1pQ3sT5vX7\",\"name\":\"read_file\",\"content\":\"int main(void) { return 1; }\"},"
    "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":["
    CALL("call_Zy9xW8vU7tS6rQ5pO4nM3lK2", "run", "{\\\"timeout\\\": 30, \\\"command\\\": \\\"make test\\\"}") "]},"
    "{\"role\":\"tool\",\"tool_call_id\":\"call_Zy9xW8vU7tS6rQ5pO4nM3lK2\",\"name\":\"run\",\"content\":\"1 passed, 1 failed\"},"
    "{\"role\":\"assistant\",\"content\":\"The test expects 0. Fixing.\",\"tool_calls\":["
    CALL("call_Qq1Ww2Ee3Rr4Tt5Yy6Uu7Ii8", "read_file", "{\\\"path\\\": \\\"tests/t.c\\\"}") ","
    CALL("call_Pp9Oo8Ii7Uu6Yy5Tt4Rr3Ee2", "run", "{\\\"timeout\\\": 5, \\\"command\\\": \\\"git diff\\\"}") "]},"
    "{\"role\":\"tool\",\"tool_call_id\":\"call_Qq1Ww2Ee3Rr4Tt5Yy6Uu7Ii8\",\"name\":\"read_file\",\"content\":\"assert(main() == 0);\"},"
    "{\"role\":\"tool\",\"tool_call_id\":\"call_Pp9Oo8Ii7Uu6Yy5Tt4Rr3Ee2\",\"name\":\"run\",\"content\":\"\"},"
    "{\"role\":\"assistant\",\"content\":\"Fixed: main now returns 0.\"},"
    "{\"role\":\"user\",\"content\":\"Thanks. Now commit it.\"},"
    "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":["
    CALL("call_Mm1Nn2Bb3Vv4Cc5Xx6Zz7Ll8", "run", "{\\\"command\\\": \\\"git commit -am fix\\\"}") "]},"
    "{\"role\":\"tool\",\"tool_call_id\":\"call_Mm1Nn2Bb3Vv4Cc5Xx6Zz7Ll8\",\"name\":\"run\",\"content\":\"[main 1a2b3c4] fix\"}]";

/* The same with reasoning on every assistant turn and mid-conversation system messages. */
static const char AGENT_FULL[] =
    "[{\"role\":\"system\",\"content\":\"You are a coding agent.\"},"
    "{\"role\":\"user\",\"content\":\"Fix the failing test in src/a.c.\"},"
    "{\"role\":\"assistant\",\"reasoning_content\":\"Read the file first.\",\"content\":\"I will look at the file.\",\"tool_calls\":["
    CALL("call_Ab3dE5gH7jK9mN1pQ3sT5vX7", "read_file", "{\\\"path\\\": \\\"src/a.c\\\", \\\"limit\\\": 40, \\\"offset\\\": 1}") "]},"
    "{\"role\":\"tool\",\"tool_call_id\":\"call_Ab3dE5gH7jK9mN1pQ3sT5vX7\",\"name\":\"read_file\",\"content\":\"int main(void) { return 1; }\"},"
    "{\"role\":\"system\",\"content\":\"<total_tokens>12000 tokens left</total_tokens>\"},"
    "{\"role\":\"assistant\",\"reasoning_content\":\"Run the tests.\",\"content\":\"\",\"tool_calls\":["
    CALL("call_Zy9xW8vU7tS6rQ5pO4nM3lK2", "run", "{\\\"timeout\\\": 30, \\\"command\\\": \\\"make test\\\"}") "]},"
    "{\"role\":\"tool\",\"tool_call_id\":\"call_Zy9xW8vU7tS6rQ5pO4nM3lK2\",\"name\":\"run\",\"content\":\"1 passed, 1 failed\"},"
    "{\"role\":\"assistant\",\"reasoning_content\":\"main returns 1.\",\"content\":\"Fixed: main now returns 0.\"},"
    "{\"role\":\"user\",\"content\":\"Thanks. Now commit it.\"},"
    "{\"role\":\"system\",\"content\":\"Reminder: the todo list is empty.\"},"
    "{\"role\":\"assistant\",\"reasoning_content\":\"Commit.\",\"content\":\"\",\"tool_calls\":["
    CALL("call_Mm1Nn2Bb3Vv4Cc5Xx6Zz7Ll8", "run", "{\\\"command\\\": \\\"git commit -am fix\\\"}") "]},"
    "{\"role\":\"tool\",\"tool_call_id\":\"call_Mm1Nn2Bb3Vv4Cc5Xx6Zz7Ll8\",\"name\":\"run\",\"content\":\"[main 1a2b3c4] fix\"}]";

static bool is_role_str(const json_t *m, const char *role) {
    const char *r = json_string_value(json_object_get(m, "role"));
    return r && !strcmp(r, role);
}

/* ---- corpus access ---- */

typedef struct {
    const char *name; /* file name */
    char *src;
    size_t len;
    const char *bos, *eos;
    chat_template *t;
} tmpl_entry;

static json_t *g_index, *g_convs;
static tmpl_entry g_tmpl[128];
static int g_ntmpl;

static void load_corpus(void) {
    char path[1024];
    json_error_t jerr;
    g_index = json_load_file(test_data_path(path, sizeof path, "data/templates/index.json"), 0, &jerr);
    g_convs = json_load_file(test_data_path(path, sizeof path, "data/templates/conversations.json"), 0, &jerr);
    CHECKF(g_index && g_convs, "cannot load the template corpus");
    if (!g_index || !g_convs) return;
    const char *name;
    json_t *info;
    json_object_foreach(json_object_get(g_index, "templates"), name, info) {
        if (g_ntmpl == (int)(sizeof g_tmpl / sizeof g_tmpl[0])) break;
        tmpl_entry *e = &g_tmpl[g_ntmpl];
        char rel[512];
        snprintf(rel, sizeof rel, "data/templates/templates/%s", name);
        e->name = name;
        e->src = test_slurp(test_data_path(path, sizeof path, rel), &e->len);
        e->bos = json_string_value(json_object_get(info, "bos_token"));
        e->eos = json_string_value(json_object_get(info, "eos_token"));
        hn_err err = {0};
        CHECKF(e->src && chat_template_new(e->src, e->len, e->bos, e->eos, NULL, NULL, &e->t, &err) == HN_OK,
               "%s: %s", name, err.msg);
        g_ntmpl++;
    }
    CHECKF(g_ntmpl == 68, "%d templates", g_ntmpl);
}

static tmpl_entry *tmpl(const char *name) {
    for (int i = 0; i < g_ntmpl; i++)
        if (!strcmp(g_tmpl[i].name, name)) return &g_tmpl[i];
    CHECKF(0, "no template %s", name);
    return NULL;
}

static json_t *conv(const char *id) {
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(g_convs, "conversations"), i, c) if (!strcmp(
        json_string_value(json_object_get(c, "id")), id)) return c;
    return NULL;
}

/* ---- probes on known templates ---- */

static void test_caps(void) {
    struct {
        const char *name;
        int system_role, in_place, parts, args_string, args_object, short_ids;
    } want[] = {
        /* Qwen3 renders a later system message as <|im_start|>system in place, and prints string arguments */
        {"Qwen-Qwen3-0.6B.jinja", 1, 1, 0, 1, 1, 0},
        /* Qwen3.5 raises "System message must be at the beginning."; renders parts; XML parameters */
        {"Qwen3.5-4B.jinja", 1, 0, 1, 0, 1, 0},
        {"Qwen3-Coder.jinja", 1, 1, 0, 0, 1, 0},
        /* gemma 2 refuses system messages altogether */
        {"google-gemma-2-2b-it.jinja", 0, 0, 0, -1, -1, 0},
        /* Mistral's templates want 9-character alphanumeric tool-call ids */
        {"mistralai-Mistral-Nemo-Instruct-2407.jinja", 1, 0, 0, -1, -1, 1},
        {"Mistral-Small-3.2-24B-Instruct-2506.jinja", 1, 0, 1, -1, -1, 1},
        /* (unsloth's Devstral template does not check ids) */
        {"unsloth-mistral-Devstral-Small-2507.jinja", 1, -1, -1, -1, -1, 0},
        {"meta-llama-Llama-3.1-8B-Instruct.jinja", 1, 1, 0, 0, 1, 0},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        tmpl_entry *e = tmpl(want[i].name);
        if (!e || !e->t) continue;
        const chat_caps *c = chat_template_caps(e->t);
        int got[6] = {c->system_role, c->system_in_place, c->parts, c->args_string, c->args_object, c->short_ids};
        int w[6] = {want[i].system_role, want[i].in_place, want[i].parts, want[i].args_string, want[i].args_object,
                    want[i].short_ids};
        for (int k = 0; k < 6; k++)
            CHECKF(w[k] < 0 || w[k] == got[k], "%s: cap %d is %d, want %d", want[i].name, k, got[k], w[k]);
    }
    if (verbose())
        for (int i = 0; i < g_ntmpl; i++) {
            if (!g_tmpl[i].t) continue;
            const chat_caps *c = chat_template_caps(g_tmpl[i].t);
            printf("caps %-50s sys=%d in_place=%d parts=%d str=%d obj=%d short=%d think=%d reas=%d dev=%d fmt=%s\n",
                   g_tmpl[i].name, c->system_role, c->system_in_place, c->parts, c->args_string, c->args_object,
                   c->short_ids, c->alias_thinking, c->alias_reasoning, c->developer_role,
                   tc_format_name(chat_template_format(g_tmpl[i].t).format));
        }
}

/* ---- the prefix property ---- */

/* Two properties, checked between consecutive turns (a turn's prompt is the
 * conversation up to an assistant reply, add_generation_prompt on):
 *  - "full": turn N+1's prompt extends turn N's prompt, generation prompt
 *    included: the cache reuses all of turn N;
 *  - "history": turn N+1's prompt extends turn N's conversation rendered
 *    without the generation prompt: the cache reuses all but the few tokens
 *    of the generation prompt.
 * Where one cannot hold the template is listed below with the reason ("*"
 * matches every conversation). Each entry must really fail somewhere (so the
 * list stays exact); every other pair that renders must hold. */
typedef struct {
    const char *tmpl, *conv, *why;
} prefix_exception;

#define GENTHINK "the generation prompt opens a think block (or writes an empty one) that history renders differently"
#define DROPS "earlier turns' reasoning (or empty think blocks) is dropped once a later user message or final answer arrives"
#define MOVES "the system prompt / tool list is rendered next to the last user message, so it moves every turn"
static const prefix_exception full_exceptions[] = {
    {"Apertus-8B-Instruct.jinja", "*", "tool results live inside the assistant turn; the generation prompt after them opens a new <|assistant_start|>"},
    {"Apriel-1.6-15b-Thinker-fixed.jinja", "*", "the generation prompt starts the reasoning ('Here are my reasoning steps:') that history omits"},
    {"Bielik-11B-v3.0-Instruct.jinja", "*", "a tool result followed by an assistant turn is not closed with <|im_end|> (the template's own quirk)"},
    {"Cohere2MoE.jinja", "*", GENTHINK},
    {"CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja", "*", GENTHINK},
    {"GLM-4.6.jinja", "agent_full", DROPS},
    {"GLM-4.7-Flash.jinja", "*", GENTHINK},
    {"LFM2.5-8B-A1B.jinja", "agent_full", DROPS},
    {"MiniMax-M2.jinja", "*", GENTHINK},
    {"Mistral-Small-3.2-24B-Instruct-2506.jinja", "*", MOVES},
    {"NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", "*", GENTHINK},
    {"NVIDIA-Nemotron-Nano-v2.jinja", "*", GENTHINK},
    {"NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", "*", "a tool result's closing <|im_end|> depends on what follows it"},
    {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", "*", "a tool result's closing <|im_end|> depends on what follows it"},
    {"Qwen-QwQ-32B.jinja", "*", GENTHINK},
    {"Qwen-Qwen3-0.6B.jinja", "agent_full", DROPS},
    {"Qwen3.5-4B.jinja", "*", GENTHINK " (and its '<think>\\n' + '\\n</think>' newlines merge into one token)"},
    {"StepFun3.5-Flash.jinja", "*", GENTHINK},
    {"deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", "*", GENTHINK},
    {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "*", GENTHINK},
    {"deepseek-ai-DeepSeek-V3.2.jinja", "*", GENTHINK},
    {"google-gemma-4-31B-it-interleaved.jinja", "*", GENTHINK},
    {"google-gemma-4-31B-it.jinja", "*", GENTHINK},
    {"llama-cpp-deepseek-r1.jinja", "*", GENTHINK},
    {"mistralai-Mistral-Nemo-Instruct-2407.jinja", "*", MOVES},
    {"openai-gpt-oss-120b.jinja", "agent_plain", DROPS},
    {"openbmb-MiniCPM5-1B.jinja", "agent_full", DROPS},
    {"poolside-Laguna-XS-2.1.jinja", "*", GENTHINK},
    {"poolside-Laguna-XS.2.jinja", "*", GENTHINK},
    {"tencent-Hy3.jinja", "agent_full", GENTHINK},
    {"upstage-Solar-Open-100B.jinja", "agent_full", DROPS},
    {NULL, NULL, NULL},
};
/* Where even history (everything but the generation prompt) is re-rendered. */
static const prefix_exception history_exceptions[] = {
    {"Bielik-11B-v3.0-Instruct.jinja", "*", "a tool result followed by an assistant turn is not closed with <|im_end|>"},
    {"CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja", "*", "without add_generation_prompt the template still ends with an empty thinking block"},
    {"GLM-4.6.jinja", "agent_full", DROPS},
    {"GLM-4.7-Flash.jinja", "agent_full", DROPS},
    {"LFM2.5-8B-A1B.jinja", "agent_full", DROPS},
    {"MiniMax-M2.jinja", "agent_full", DROPS},
    {"Mistral-Small-3.2-24B-Instruct-2506.jinja", "*", MOVES},
    {"NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", "agent_full", DROPS},
    {"NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", "*", "a tool result's closing <|im_end|> depends on what follows it"},
    {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", "*", "a tool result's closing <|im_end|> depends on what follows it"},
    {"Qwen-Qwen3-0.6B.jinja", "agent_full", DROPS},
    {"Qwen3.5-4B.jinja", "*", DROPS},
    {"StepFun3.5-Flash.jinja", "*", DROPS},
    {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "*", "the end of the tool outputs depends on what follows them"},
    {"google-gemma-4-31B-it-interleaved.jinja", "agent_full", DROPS},
    {"google-gemma-4-31B-it.jinja", "agent_full", DROPS},
    {"mistralai-Mistral-Nemo-Instruct-2407.jinja", "*", MOVES},
    {"openai-gpt-oss-120b.jinja", "agent_plain", DROPS},
    {"openbmb-MiniCPM5-1B.jinja", "agent_full", DROPS},
    {"upstage-Solar-Open-100B.jinja", "agent_full", DROPS},
    {NULL, NULL, NULL},
};

static const char *exception_for(const prefix_exception *list, const char *t, const char *c) {
    for (size_t i = 0; list[i].tmpl; i++)
        if (!strcmp(list[i].tmpl, t) && (!strcmp(list[i].conv, "*") || !strcmp(list[i].conv, c))) return list[i].why;
    return NULL;
}

static bool is_qwen(const char *name) { return strstr(name, "Qwen") || strstr(name, "QwQ"); }

/* Renders msgs[0..n) with or without the generation prompt; malloc'd text or NULL. */
static char *render_gen(const chat_template *t, const json_t *msgs, size_t n, const json_t *tools,
                        const json_t *kwargs, bool gen, hn_err *err) {
    json_t *sub = json_array();
    for (size_t i = 0; i < n; i++) json_array_append(sub, json_array_get(msgs, i));
    chat_options o = {0};
    o.add_generation_prompt = gen;
    o.kwargs = kwargs;
    o.now = fixed_now();
    chat_prompt p;
    hn_status st = chat_render(t, sub, tools, &o, &p, err);
    json_decref(sub);
    if (st != HN_OK) return NULL;
    char *r = strdup(p.text);
    chat_prompt_free(&p);
    return r;
}

static bool extends(const char *cur, const char *prev, char *why, size_t whycap, const char *what, int turn) {
    if (!strncmp(cur, prev, strlen(prev))) return true;
    size_t d = 0;
    while (prev[d] && prev[d] == cur[d]) d++;
    snprintf(why, whycap, "%s: turn %d differs at byte %zu: was [%.40s] now [%.40s]", what, turn, d, prev + d, cur + d);
    return false;
}

/* Checks one template on one conversation: *full and *hist get 1 held, 0
 * broken, -1 could not render or fewer than two turns. Qwen templates are also
 * checked token for token (counted in *tok_checks). */
static void prefix_check(const tmpl_entry *e, const char *cid, const json_t *msgs, const json_t *tools,
                         const json_t *kwargs, int *full, int *hist, char *why, size_t whycap, int *tok_checks) {
    size_t n = json_array_size(msgs);
    char *prev = NULL, *prev_hist = NULL;
    int32_t *prev_tok = NULL;
    int64_t prev_n = 0;
    int turns = 0;
    *full = *hist = 1;
    for (size_t i = 1; i <= n; i++) {
        bool boundary = i == n ? !is_role_str(json_array_get(msgs, n - 1), "assistant")
                               : is_role_str(json_array_get(msgs, i), "assistant");
        if (!boundary) continue;
        hn_err err = {0};
        char *cur = render_gen(e->t, msgs, i, tools, kwargs, true, &err);
        char *cur_hist = cur ? render_gen(e->t, msgs, i, tools, kwargs, false, &err) : NULL;
        if (!cur || !cur_hist) {
            snprintf(why, whycap, "render of %zu messages failed: %.200s", i, err.msg);
            *full = *hist = -1;
            free(cur);
            break;
        }
        turns++;
        const char *dump = getenv("HONE_TEST_DUMP"), *dconv = getenv("HONE_TEST_DUMP_CONV");
        if (dump && strstr(e->name, dump) && dconv && !strcmp(dconv, cid))
            printf("==== %s %s %zu messages\n%s\n", e->name, cid, i, cur);
        if (prev && *full == 1 && !extends(cur, prev, why, whycap, "full", turns)) *full = 0;
        if (prev_hist && *hist == 1 && !extends(cur, prev_hist, why, whycap, "history", turns)) *hist = 0;
        if (*full == 1 && qwen_vocab && is_qwen(e->name)) {
            int32_t *tok;
            int64_t nt;
            hn_err terr = {0};
            CHECKF(chat_tokenize(qwen_vocab, cur, strlen(cur), &tok, &nt, &terr) == HN_OK, "tokenize: %s", terr.msg);
            if (prev_tok && (nt < prev_n || memcmp(tok, prev_tok, (size_t)prev_n * sizeof *tok))) {
                int64_t d = 0;
                while (d < prev_n && d < nt && tok[d] == prev_tok[d]) d++;
                snprintf(why, whycap, "tokens: turn %d differs at token %lld of %lld", turns, (long long)d,
                         (long long)prev_n);
                *full = 0;
            } else if (prev_tok) {
                (*tok_checks)++;
            }
            hn_free(prev_tok);
            prev_tok = tok;
            prev_n = nt;
        }
        free(prev);
        free(prev_hist);
        prev = cur;
        prev_hist = cur_hist;
    }
    free(prev);
    free(prev_hist);
    hn_free(prev_tok);
    if (turns < 2 && *full != -1) {
        snprintf(why, whycap, "fewer than two turns");
        *full = *hist = -1;
    }
}

static void check_exceptions_used(const prefix_exception *list, const int *seen, const char *what) {
    for (size_t k = 0; list[k].tmpl; k++)
        CHECKF(seen[k] > 0, "%s exception no longer fails (remove it): %s on %s", what, list[k].tmpl, list[k].conv);
}

static void note_exception(const prefix_exception *list, int *seen, const char *t, const char *c) {
    for (size_t k = 0; list[k].tmpl; k++)
        if (!strcmp(list[k].tmpl, t) && (!strcmp(list[k].conv, "*") || !strcmp(list[k].conv, c))) seen[k]++;
}

static void test_prefix(void) {
    static const char *corpus_convs[] = {"system_multi_turn", "multi_turn_no_gen", "unicode_emoji", "content_parts",
                                         "reasoning_history", "tools_single_call", "tools_parallel_calls",
                                         "tool_call_null_content"};
    json_t *agent_tools = json_loads(AGENT_TOOLS, 0, NULL);
    json_t *agent_plain = json_loads(AGENT_PLAIN, 0, NULL), *agent_full = json_loads(AGENT_FULL, 0, NULL);
    CHECK(agent_tools && agent_plain && agent_full);
    int full_templates = 0, hist_templates = 0, tok_checks = 0, full_pairs = 0, hist_pairs = 0, pairs = 0;
    int full_seen[64] = {0}, hist_seen[64] = {0};
    for (int ti = 0; ti < g_ntmpl; ti++) {
        tmpl_entry *e = &g_tmpl[ti];
        if (!e->t) continue;
        int full_held = 0, hist_held = 0;
        size_t nc = sizeof corpus_convs / sizeof corpus_convs[0];
        for (size_t ci = 0; ci < nc + 2; ci++) {
            const char *cid;
            const json_t *msgs, *tools, *kwargs = NULL;
            if (ci < nc) {
                json_t *c = conv(corpus_convs[ci]);
                cid = corpus_convs[ci];
                msgs = json_object_get(c, "messages");
                tools = json_object_get(c, "tools");
                kwargs = json_object_get(c, "extra_variables");
            } else {
                cid = ci == nc ? "agent_plain" : "agent_full";
                msgs = ci == nc ? agent_plain : agent_full;
                tools = agent_tools;
            }
            char why[400] = "";
            int full, hist;
            prefix_check(e, cid, msgs, tools, kwargs, &full, &hist, why, sizeof why, &tok_checks);
            if (full < 0) {
                if (verbose()) printf("NORENDER %s %s: %s\n", e->name, cid, why);
                continue;
            }
            pairs++;
            const char *fx = exception_for(full_exceptions, e->name, cid);
            const char *hx = exception_for(history_exceptions, e->name, cid);
            if (full == 0 && fx) note_exception(full_exceptions, full_seen, e->name, cid);
            if (hist == 0 && hx) note_exception(history_exceptions, hist_seen, e->name, cid);
            CHECKF(full == 1 || fx, "prefix property (full) broken: %s on %s: %s", e->name, cid, why);
            CHECKF(hist == 1 || hx || full == 1, "prefix property (history) broken: %s on %s: %s", e->name, cid, why);
            if (verbose() && (full != 1 || hist != 1))
                printf("BROKEN full=%d hist=%d %s %s: %s%s\n", full, hist, e->name, cid, why, fx ? " (expected)" : "");
            full_held += full == 1;
            hist_held += hist == 1;
            full_pairs += full == 1;
            hist_pairs += hist == 1;
        }
        full_templates += full_held > 0;
        hist_templates += hist_held > 0;
    }
    check_exceptions_used(full_exceptions, full_seen, "full");
    check_exceptions_used(history_exceptions, hist_seen, "history");
    printf("prefix property over %d rendered template x conversation pairs: full %d, history %d; "
           "templates holding somewhere: full %d, history %d; Qwen turn pairs equal token for token: %d\n",
           pairs, full_pairs, hist_pairs, full_templates, hist_templates, tok_checks);
    /* not vacuous */
    CHECKF(pairs >= 450, "only %d pairs rendered", pairs);
    CHECKF(tok_checks >= 40, "only %d Qwen token checks", tok_checks);
    json_decref(agent_tools);
    json_decref(agent_plain);
    json_decref(agent_full);
}

/* ---- where the next turn stops repeating a prompt (chat_resume_points) ---- */

/* Renders msgs[0..n) with the generation prompt and tokenizes it with the Qwen vocabulary. */
static bool render_tokens(const chat_template *t, const json_t *msgs, size_t n, const json_t *tools, json_t **sub,
                          chat_prompt *p, int32_t **tok, int64_t *nt) {
    *sub = json_array();
    for (size_t i = 0; i < n; i++) json_array_append(*sub, json_array_get(msgs, i));
    chat_options o = {.add_generation_prompt = true, .now = fixed_now()};
    hn_err err = {0};
    if (chat_render(t, *sub, tools, &o, p, &err) != HN_OK) {
        json_decref(*sub);
        return false;
    }
    CHECKF(chat_tokenize_spans(qwen_vocab, p->text, p->len, p->spans, p->n_spans, tok, nt, &err) == HN_OK, "tokenize: %s",
           err.msg);
    return true;
}

/* On every template and turn of the two agent conversations: the tail
 * tokenizing agrees with tokenizing the probes whole. On the Qwen templates,
 * with their tokenizer: each point is exactly where the conversation's real
 * next turn stops repeating the prompt (a user message; a tool result, the
 * call's reasoning sent back or not); on Qwen3.5: 2 tokens before the end for
 * a user message after a text reply (its "<think>\n" is not repeated), back
 * at the loop's first reply after tool results, 1 token before for a tool
 * result without the reasoning ("\n" + "\n" is one token), the whole prompt
 * with it. */
static void test_resume(void) {
    json_t *agent_tools = json_loads(AGENT_TOOLS, 0, NULL);
    json_t *convs[2] = {json_loads(AGENT_PLAIN, 0, NULL), json_loads(AGENT_FULL, 0, NULL)};
    CHECK(agent_tools && convs[0] && convs[1] && qwen_vocab);
    if (!qwen_vocab) return;
    int same = 0, differ = 0, real_checked = 0, real_bad = 0, q35 = 0;
    char first[300] = "";
    for (int ti = 0; ti < g_ntmpl; ti++) {
        tmpl_entry *e = &g_tmpl[ti];
        if (!e->t) continue;
        bool qwen = is_qwen(e->name), is35 = !strcmp(e->name, "Qwen3.5-4B.jinja");
        for (int ci = 0; ci < 2; ci++) {
            const json_t *msgs = convs[ci];
            size_t n = json_array_size(msgs);
            int64_t prev_out[CHAT_RESUME_MAX] = {0}, prev_n = 0, loop_start = -1;
            int32_t *prev_tok = NULL;
            for (size_t i = 1; i <= n; i++) {
                if (i < n && !is_role_str(json_array_get(msgs, i), "assistant")) continue;
                json_t *sub;
                chat_prompt p;
                int32_t *tok = NULL;
                int64_t nt = 0;
                if (!render_tokens(e->t, msgs, i, agent_tools, &sub, &p, &tok, &nt)) break;
                int64_t fast[CHAT_RESUME_MAX], ref[CHAT_RESUME_MAX];
                hn_err err = {0};
                chat_options o = {.add_generation_prompt = true, .now = fixed_now()};
                CHECK(chat_resume_points(e->t, qwen_vocab, sub, agent_tools, &o, &p, tok, nt, false, fast, &err) == HN_OK);
                CHECK(chat_resume_points(e->t, qwen_vocab, sub, agent_tools, &o, &p, tok, nt, true, ref, &err) == HN_OK);
                bool eq = !memcmp(fast, ref, sizeof fast);
                same += eq;
                differ += !eq;
                if (!eq && !first[0])
                    snprintf(first, sizeof first, "%s, %s, %zu messages: fast %lld %lld %lld, reference %lld %lld %lld",
                             e->name, ci ? "agent_full" : "agent_plain", i, (long long)fast[0], (long long)fast[1],
                             (long long)fast[2], (long long)ref[0], (long long)ref[1], (long long)ref[2]);
                /* the previous turn's point for the kind of message that followed its reply */
                if (qwen && prev_tok) {
                    size_t k = i - 1; /* this prompt's last message; the previous prompt's reply is before */
                    while (k > 0 && !is_role_str(json_array_get(msgs, k), "assistant")) k--;
                    const json_t *a = json_array_get(msgs, k), *next = json_array_get(msgs, k + 1);
                    int kind = is_role_str(next, "user") ? CHAT_RESUME_USER
                               : json_object_get(a, "reasoning_content") ? CHAT_RESUME_TOOL_REASONING
                                                                           : CHAT_RESUME_TOOL;
                    int64_t d = 0;
                    while (d < prev_n && d < nt && prev_tok[d] == tok[d]) d++;
                    real_checked++;
                    if (d != prev_out[kind]) {
                        real_bad++;
                        CHECKF(0, "%s, %s, %zu messages: the next turn repeats %lld tokens of the previous prompt's %lld, "
                               "its point (kind %d) says %lld", e->name, ci ? "agent_full" : "agent_plain", i,
                               (long long)d, (long long)prev_n, kind, (long long)prev_out[kind]);
                    }
                }
                if (is35) {
                    size_t l = i - 1; /* the last message but system reminders (demoted into it) */
                    while (l > 0 && is_role_str(json_array_get(msgs, l), "system")) l--;
                    bool after_user = is_role_str(json_array_get(msgs, l), "user");
                    if (after_user) loop_start = nt - 2;
                    CHECKF(fast[CHAT_RESUME_USER] == (after_user ? nt - 2 : loop_start) &&
                           fast[CHAT_RESUME_TOOL] == nt - 1 && fast[CHAT_RESUME_TOOL_REASONING] == nt,
                           "Qwen3.5, %s, %zu messages (%lld tokens): %lld %lld %lld", ci ? "agent_full" : "agent_plain", i,
                           (long long)nt, (long long)fast[0], (long long)fast[1], (long long)fast[2]);
                    q35++;
                }
                hn_free(prev_tok);
                prev_tok = tok;
                prev_n = nt;
                memcpy(prev_out, fast, sizeof prev_out);
                chat_prompt_free(&p);
                json_decref(sub);
            }
            hn_free(prev_tok);
        }
    }
    printf("resume points: tail = whole on %d of %d prompts (first difference: %s); the real next turn where the "
           "point says on %d of %d Qwen turns; %d Qwen3.5 turns checked\n",
           same, same + differ, first[0] ? first : "none", real_checked - real_bad, real_checked, q35);
    CHECKF(differ == 0, "tail tokenizing differs: %s", first);
    CHECKF(same >= 300 && real_checked >= 30 && q35 == 11, "%d prompts, %d real turns, %d Qwen3.5",
           same, real_checked, q35);
    json_decref(agent_tools);
    json_decref(convs[0]);
    json_decref(convs[1]);
}

/* chat_render is the identity on well-formed input: on every corpus pair
 * that renders, it gives jinja2's output byte for byte (except the pairs where
 * a normalisation applies by design: content null -> "", which lets more
 * templates render tool_call_null_content; text parts joined for templates
 * that would print the list's Python repr). */
static void test_corpus_identity(void) {
    size_t i, same = 0, total = 0;
    json_t *p;
    char path[1024];
    json_array_foreach(json_object_get(g_index, "pairs"), i, p) {
        const char *cid = json_string_value(json_object_get(p, "conversation"));
        if (strcmp(json_string_value(json_object_get(p, "outcome")), "ok") || !strcmp(cid, "tool_call_null_content"))
            continue;
        tmpl_entry *e = tmpl(json_string_value(json_object_get(p, "template")));
        json_t *c = conv(cid);
        if (!e || !e->t || !c) continue;
        if (!strcmp(cid, "content_parts") && !chat_template_caps(e->t)->parts) continue;
        char rel[600];
        snprintf(rel, sizeof rel, "data/templates/%s", json_string_value(json_object_get(p, "output_file")));
        size_t elen = 0;
        char *want = test_slurp(test_data_path(path, sizeof path, rel), &elen);
        chat_options o = {0};
        o.add_generation_prompt = json_is_true(json_object_get(c, "add_generation_prompt"));
        o.kwargs = json_object_get(c, "extra_variables");
        o.now = fixed_now();
        chat_prompt out;
        hn_err err = {0};
        hn_status st = chat_render(e->t, json_object_get(c, "messages"), json_object_get(c, "tools"), &o, &out, &err);
        bool ok = st == HN_OK && want && out.len == elen && !memcmp(out.text, want, elen);
        total++;
        same += ok;
        CHECKF(ok, "chat_render differs from jinja2 on %s__%s: %s", e->name, cid, st == HN_OK ? "output" : err.msg);
        chat_prompt_free(&out);
        free(want);
    }
    printf("chat_render == jinja2 on %zu/%zu rendered corpus pairs\n", same, total);
    CHECK(total > 600);
}

/* ---- unit tests ---- */

static char *render_json(const chat_template *t, const char *msgs, const char *tools, bool gen, chat_think th,
                         chat_prompt *full) {
    json_t *m = json_loads(msgs, 0, NULL), *tl = tools ? json_loads(tools, 0, NULL) : NULL;
    CHECKF(m != NULL, "bad test JSON: %s", msgs);
    chat_options o = {0};
    o.add_generation_prompt = gen;
    o.thinking = th;
    o.now = fixed_now();
    chat_prompt p;
    hn_err err = {0};
    char *r = NULL;
    if (chat_render(t, m, tl, &o, &p, &err) == HN_OK) {
        r = strdup(p.text);
        if (full) *full = p;
        else chat_prompt_free(&p);
    } else if (verbose()) {
        printf("render failed: %s\n", err.msg);
    }
    json_decref(m);
    json_decref(tl);
    return r;
}

static void test_billing(void) {
    struct {
        const char *in, *out;
    } cases[] = {
        {"x-anthropic-billing-header: cc_version=2.1.197.3aa; cc_entrypoint=cli; cch=1a2b3;\nYou are Claude.",
         "You are Claude."},
        {"You are Claude.\n  x-anthropic-billing-header: cch=00000;\nMore.", "You are Claude.\nMore."},
        {"x-anthropic-billing-header: cc_version=2.1.197.fbe; cc_entrypoint=sdk-cli;", ""},
        /* the blank lines that separated it go with it (a server joins blocks with "\n\n") */
        {"x-anthropic-billing-header: cch=1a2b3;\n\nYou are Claude.\n\nBe brief.", "You are Claude.\n\nBe brief."},
        {"Intro.\n\nx-anthropic-billing-header: cch=1a2b3;\n \n\nMore.", "Intro.\n\nMore."},
        {"You are Claude. x-anthropic-billing-header: is quoted mid-line", NULL},
        {"no header here", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = 0;
        bool nomem;
        char *r = chat_strip_billing(cases[i].in, strlen(cases[i].in), &n, &nomem);
        CHECKF(cases[i].out ? r && n == strlen(cases[i].out) && !strcmp(r, cases[i].out) : !r,
               "strip_billing(%s) = [%s]", cases[i].in, r ? r : "(none)");
        hn_free(r);
    }
    /* in a request: string content, parts, a billing-only block; all render as without the line */
    tmpl_entry *e = tmpl("Qwen-Qwen3-0.6B.jinja");
    if (!e || !e->t) return;
    char *plain = render_json(e->t, "[{\"role\":\"system\",\"content\":\"You are Claude.\"},{\"role\":\"user\",\"content\":\"hi\"}]",
                              NULL, true, CHAT_THINK_DEFAULT, NULL);
    char *s1 = render_json(e->t, "[{\"role\":\"system\",\"content\":\"x-anthropic-billing-header: cc_version=2.1.1.aaa; cch=11111;\\nYou are Claude.\"},{\"role\":\"user\",\"content\":\"hi\"}]",
                           NULL, true, CHAT_THINK_DEFAULT, NULL);
    char *s2 = render_json(e->t, "[{\"role\":\"system\",\"content\":[{\"type\":\"text\",\"text\":\"x-anthropic-billing-header: cc_version=2.1.1.bbb; cch=22222;\"},{\"type\":\"text\",\"text\":\"You are Claude.\"}]},{\"role\":\"user\",\"content\":\"hi\"}]",
                           NULL, true, CHAT_THINK_DEFAULT, NULL);
    char *s3 = render_json(e->t, "[{\"role\":\"system\",\"content\":\"x-anthropic-billing-header: cch=33333;\"},{\"role\":\"user\",\"content\":\"hi\"}]",
                           NULL, true, CHAT_THINK_DEFAULT, NULL);
    char *nosys = render_json(e->t, "[{\"role\":\"user\",\"content\":\"hi\"}]", NULL, true, CHAT_THINK_DEFAULT, NULL);
    CHECKF(plain && s1 && !strcmp(plain, s1), "billing line in a string: [%s]", s1 ? s1 : "");
    CHECKF(plain && s2 && !strcmp(plain, s2), "billing line as a part: [%s]", s2 ? s2 : "");
    CHECKF(nosys && s3 && !strcmp(nosys, s3), "billing-only system: [%s]", s3 ? s3 : "");
    free(plain), free(s1), free(s2), free(s3), free(nosys);
}

static void test_system_in_place(void) {
    static const char conv_mid[] =
        "[{\"role\":\"system\",\"content\":\"SYS\"},{\"role\":\"user\",\"content\":\"U1\"},"
        "{\"role\":\"system\",\"content\":\"MID\"},{\"role\":\"assistant\",\"content\":\"A1\"},"
        "{\"role\":\"user\",\"content\":\"U2\"}]";
    /* Qwen3 renders it where it stands, as a system turn */
    tmpl_entry *q3 = tmpl("Qwen-Qwen3-0.6B.jinja"), *q35 = tmpl("Qwen3.5-4B.jinja");
    char *r = q3 && q3->t ? render_json(q3->t, conv_mid, NULL, true, CHAT_THINK_DEFAULT, NULL) : NULL;
    CHECKF(r && strstr(r, "<|im_start|>system\nSYS<|im_end|>\n<|im_start|>user\nU1<|im_end|>\n<|im_start|>system\nMID<|im_end|>\n<|im_start|>assistant\nA1"),
           "Qwen3 mid system: [%s]", r ? r : "");
    free(r);
    /* Qwen3.5 refuses it: merged into the user turn before it, in place */
    chat_prompt p = {0};
    r = q35 && q35->t ? render_json(q35->t, conv_mid, NULL, true, CHAT_THINK_DEFAULT, &p) : NULL;
    CHECKF(r && strstr(r, "<|im_start|>system\nSYS<|im_end|>\n<|im_start|>user\nU1\n\n<system-reminder>\nMID\n</system-reminder><|im_end|>\n<|im_start|>assistant\n"),
           "Qwen3.5 demoted system: [%s]", r ? r : "");
    CHECK(p.n_demoted == 1);
    chat_prompt_free(&p);
    free(r);
    /* after an assistant turn and before a user: prepended to that user message */
    r = q35 && q35->t ? render_json(q35->t, "[{\"role\":\"user\",\"content\":\"U1\"},{\"role\":\"assistant\",\"content\":\"A1\"},"
                                             "{\"role\":\"system\",\"content\":\"MID\"},{\"role\":\"user\",\"content\":\"U2\"}]",
                                    NULL, true, CHAT_THINK_DEFAULT, NULL)
                      : NULL;
    CHECKF(r && strstr(r, "<|im_start|>user\n<system-reminder>\nMID\n</system-reminder>\n\nU2<|im_end|>"), "Qwen3.5 prepended: [%s]",
           r ? r : "");
    free(r);
    /* never hoisted: the top system prompt is the same with and without a later system message */
    r = q35 && q35->t ? render_json(q35->t, conv_mid, NULL, true, CHAT_THINK_DEFAULT, NULL) : NULL;
    CHECKF(r && !strncmp(r, "<|im_start|>system\nSYS<|im_end|>\n<|im_start|>user\nU1", 48), "not hoisted: [%.80s]", r ? r : "");
    free(r);
    /* gemma 2 refuses every system message: the leading one goes into the first user turn */
    tmpl_entry *g2 = tmpl("google-gemma-2-2b-it.jinja");
    r = g2 && g2->t ? render_json(g2->t, "[{\"role\":\"system\",\"content\":\"SYS\"},{\"role\":\"user\",\"content\":\"U1\"}]", NULL,
                                  true, CHAT_THINK_DEFAULT, NULL)
                    : NULL;
    CHECKF(r && strstr(r, "<start_of_turn>user\nSYS\n\nU1<end_of_turn>"), "gemma 2 leading system: [%s]", r ? r : "");
    free(r);
}

/* A run of demoted system messages: each is joined to the user (or tool)
 * turn before it, in order, and the run costs time linear in its length
 * (each join used to copy the turn's text so far: 20,000 took seconds). */
static void test_system_runs(void) {
    tmpl_entry *q35 = tmpl("Qwen3.5-4B.jinja");
    if (!q35 || !q35->t) return;
    /* a user turn given as parts, then a tool turn, each followed by a run */
    const char *heads[2] = {"[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"U1\"},{\"type\":\"text\",\"text\":\"U2\"}]}]",
                            "[{\"role\":\"user\",\"content\":\"Q\"},{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":"
                            "[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":{}}}]},"
                            "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"R\"}]"};
    const char *joined[2] = {"U1\nU2", "R"};
    enum { N = 20000 };
    for (int k = 0; k < 2; k++) {
        json_t *m = json_loads(heads[k], 0, NULL);
        char *want = malloc(64 * (size_t)N + 64), *w = want;
        w += sprintf(w, "%s", joined[k]);
        for (int i = 0; i < N; i++) {
            char text[32];
            snprintf(text, sizeof text, "S%d", i);
            json_array_append_new(m, json_pack("{s:s,s:s}", "role", "system", "content", text));
            w += sprintf(w, "\n\n<system-reminder>\n%s\n</system-reminder>", text);
        }
        json_array_append_new(m, json_pack("{s:s,s:s}", "role", "assistant", "content", "A"));
        chat_options o = {.add_generation_prompt = false, .now = fixed_now()};
        chat_prompt p = {0};
        hn_err err = {0};
        clock_t c0 = clock();
        hn_status st = chat_render(q35->t, m, NULL, &o, &p, &err);
        double cpu = (double)(clock() - c0) / CLOCKS_PER_SEC;
        CHECKF(st == HN_OK, "run %d: %s", k, err.msg);
        CHECKF(st == HN_OK && p.n_demoted == N && strstr(p.text, want), "run %d: %d demoted, joined text %s", k,
               p.n_demoted, st == HN_OK && strstr(p.text, want) ? "found" : "not found");
        CHECKF(cpu < 2.0, "run %d: %d system messages took %.2f s of CPU", k, N, cpu);
        chat_prompt_free(&p);
        free(want);
        json_decref(m);
    }
}

static void test_key_order(void) {
    /* arguments as a JSON string in an odd key order with odd spacing */
    static const char conv_args[] =
        "[{\"role\":\"user\",\"content\":\"go\"},{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"call_1\","
        "\"type\":\"function\",\"function\":{\"name\":\"run\",\"arguments\":\"{\\\"zeta\\\":1,  \\\"alpha\\\": {\\\"b\\\": 2, \\\"a\\\": [1.0, \\\"x\\\"]}}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"name\":\"run\",\"content\":\"ok\"}]";
    /* Qwen3 prints a string as it came */
    tmpl_entry *q3 = tmpl("Qwen-Qwen3-0.6B.jinja"), *coder = tmpl("Qwen3-Coder.jinja");
    tmpl_entry *l31 = tmpl("meta-llama-Llama-3.1-8B-Instruct.jinja");
    char *r = q3 && q3->t ? render_json(q3->t, conv_args, AGENT_TOOLS, true, CHAT_THINK_DEFAULT, NULL) : NULL;
    CHECKF(r && strstr(r, "\"arguments\": {\"zeta\":1,  \"alpha\": {\"b\": 2, \"a\": [1.0, \"x\"]}}"), "Qwen3 args: [%s]", r ? r : "");
    free(r);
    /* Qwen3-Coder needs a mapping: parameters in the sent order */
    r = coder && coder->t ? render_json(coder->t, conv_args, AGENT_TOOLS, true, CHAT_THINK_DEFAULT, NULL) : NULL;
    const char *z = r ? strstr(r, "<parameter=zeta>") : NULL, *a = r ? strstr(r, "<parameter=alpha>") : NULL;
    CHECKF(z && a && z < a && strstr(r, "{\"b\": 2, \"a\": [1.0, \"x\"]}"), "Qwen3-Coder args: [%s]", r ? r : "");
    free(r);
    /* Llama 3.1 serialises the mapping with tojson: same order */
    r = l31 && l31->t ? render_json(l31->t, conv_args, AGENT_TOOLS, true, CHAT_THINK_DEFAULT, NULL) : NULL;
    CHECKF(r && strstr(r, "\"parameters\": {\"zeta\": 1, \"alpha\": {\"b\": 2, \"a\": [1.0, \"x\"]}}"), "Llama 3.1 args: [%s]",
           r ? r : "");
    free(r);
    /* muse-glimmer raises on string arguments: it renders because the string was parsed */
    tmpl_entry *mg = tmpl("muse-glimmer.jinja");
    r = mg && mg->t ? render_json(mg->t, conv_args, AGENT_TOOLS, true, CHAT_THINK_DEFAULT, NULL) : NULL;
    CHECKF(r != NULL, "muse-glimmer renders parsed arguments");
    free(r);
    /* ids for Mistral: 9 alphanumerics, the same for the call and its result, stable */
    tmpl_entry *ms = tmpl("Mistral-Small-3.2-24B-Instruct-2506.jinja");
    char *r1 = ms && ms->t ? render_json(ms->t, conv_args, AGENT_TOOLS, true, CHAT_THINK_DEFAULT, NULL) : NULL;
    char *r2 = ms && ms->t ? render_json(ms->t, conv_args, AGENT_TOOLS, true, CHAT_THINK_DEFAULT, NULL) : NULL;
    CHECKF(r1 && r2 && !strcmp(r1, r2) && !strstr(r1, "call_1"), "Mistral ids: [%s]", r1 ? r1 : "");
    free(r1);
    free(r2);
}

static void test_reasoning(void) {
    static const char conv_r[] =
        "[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"reasoning_content\":\"THOUGHT-1\",\"content\":\"A1\"},"
        "{\"role\":\"user\",\"content\":\"q2\"},{\"role\":\"assistant\",\"reasoning_content\":\"THOUGHT-2\",\"content\":\"A2\"},"
        "{\"role\":\"user\",\"content\":\"q3\"}]";
    /* Solar reads message.reasoning: it gets the reasoning under that name */
    tmpl_entry *solar = tmpl("upstage-Solar-Open-100B.jinja"), *q3 = tmpl("Qwen-Qwen3-0.6B.jinja");
    CHECK(solar && solar->t && chat_template_caps(solar->t)->alias_reasoning);
    static const char conv_tail[] =
        "[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"reasoning_content\":\"THOUGHT-1\",\"content\":\"A1\"}]";
    char *r = solar && solar->t ? render_json(solar->t, conv_tail, NULL, false, CHAT_THINK_DEFAULT, NULL) : NULL;
    CHECKF(r && strstr(r, "THOUGHT-1"), "Solar reasoning: [%s]", r ? r : "");
    free(r);
    /* Qwen3 keeps only the reasoning after the last user message: dropped here */
    r = q3 && q3->t ? render_json(q3->t, conv_r, NULL, true, CHAT_THINK_DEFAULT, NULL) : NULL;
    CHECKF(r && !strstr(r, "THOUGHT-1") && !strstr(r, "THOUGHT-2") && strstr(r, "A2"), "Qwen3 history reasoning: [%s]",
           r ? r : "");
    free(r);
    /* ... and kept for the turn in progress (after the last user message) */
    r = q3 && q3->t ? render_json(q3->t, conv_tail, NULL, false, CHAT_THINK_DEFAULT, NULL) : NULL;
    CHECKF(r && strstr(r, "<think>\nTHOUGHT-1\n</think>\n\nA1"), "Qwen3 current reasoning: [%s]", r ? r : "");
    free(r);
    /* whether generation starts inside <think> */
    tmpl_entry *q35 = tmpl("Qwen3.5-4B.jinja");
    chat_prompt p = {0};
    r = q35 && q35->t ? render_json(q35->t, "[{\"role\":\"user\",\"content\":\"q\"}]", NULL, true, CHAT_THINK_DEFAULT, &p) : NULL;
    CHECKF(r && p.opens_think, "Qwen3.5 opens think: [%s]", r ? r : "");
    chat_prompt_free(&p);
    free(r);
    r = q35 && q35->t ? render_json(q35->t, "[{\"role\":\"user\",\"content\":\"q\"}]", NULL, true, CHAT_THINK_OFF, &p) : NULL;
    CHECKF(r && !p.opens_think && strstr(r, "</think>"), "Qwen3.5 thinking off: [%s]", r ? r : "");
    chat_prompt_free(&p);
    free(r);
}

/* The real Qwen3 GGUF: template from the file, format detection, tokens. */
static void test_gguf(void) {
    if (!qwen_gguf || !qwen_vocab) return;
    chat_template *t = NULL;
    hn_err err = {0};
    CHECKF(chat_template_from_gguf(qwen_gguf, qwen_vocab, &t, &err) == HN_OK, "from_gguf: %s", err.msg);
    if (!t) return;
    CHECK(chat_template_format(t).format == TC_FORMAT_HERMES);
    CHECK(chat_template_caps(t)->system_in_place && chat_template_caps(t)->args_string);
    chat_prompt p = {0};
    char *r = render_json(t, "[{\"role\":\"user\",\"content\":\"hi\"}]", NULL, true, CHAT_THINK_DEFAULT, &p);
    CHECKF(r && !strcmp(r, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"), "qwen3 gguf render: [%s]", r ? r : "");
    int32_t *tok = NULL;
    int64_t n = 0;
    if (r) CHECK(chat_tokenize(qwen_vocab, p.text, p.len, &tok, &n, &err) == HN_OK);
    /* <|im_start|> user \n hi <|im_end|> \n <|im_start|> assistant \n */
    CHECKF(n == 9 && tok[0] == 151644 && tok[4] == 151645 && tok[6] == 151644, "qwen3 tokens: %lld", (long long)n);
    hn_free(tok);
    chat_prompt_free(&p);
    free(r);
    chat_template_free(t);
    /* missing template */
    gguf_writer *w = gguf_writer_new();
    void *buf = NULL;
    size_t size = 0;
    gguf_ctx *g = NULL;
    if (w && gguf_writer_write_mem(w, &buf, &size, &err) == HN_OK && gguf_open_mem(buf, size, &g, &err) == HN_OK) {
        CHECK(chat_template_from_gguf(g, qwen_vocab, &t, &err) == HN_ERR_NOT_FOUND && t == NULL);
        gguf_close(g);
    }
    hn_free(buf);
    gguf_writer_free(w);
}

/* BOS: exactly one, whether or not the template writes it (llama.cpp's rule). */
static void test_bos(void) {
    char path[1024];
    hn_err err = {0};
    gguf_ctx *g = NULL;
    tok_vocab *v = NULL;
    if (gguf_open(test_data_path(path, sizeof path, "data/models/llama-2k-q8_0.gguf"), &g, &err) != HN_OK ||
        tok_load(g, &v, &err) != HN_OK) {
        CHECKF(0, "llama vocab: %s", err.msg);
        gguf_close(g);
        return;
    }
    CHECK(tok_add_bos(v) && tok_bos(v) >= 0);
    char bos[64];
    int32_t bl = tok_piece(v, tok_bos(v), true, bos, sizeof bos - 1);
    bos[bl > 0 ? bl : 0] = 0;
    const char *with = "{{ bos_token }}{% for m in messages %}[{{ m.content }}]{% endfor %}";
    const char *without = "{% for m in messages %}[{{ m.content }}]{% endfor %}";
    chat_template *tw = NULL, *to = NULL;
    CHECK(chat_template_new(with, strlen(with), bos, "", NULL, NULL, &tw, &err) == HN_OK);
    CHECK(chat_template_new(without, strlen(without), bos, "", NULL, NULL, &to, &err) == HN_OK);
    char *a = tw ? render_json(tw, "[{\"role\":\"user\",\"content\":\"hello\"}]", NULL, true, CHAT_THINK_DEFAULT, NULL) : NULL;
    char *b = to ? render_json(to, "[{\"role\":\"user\",\"content\":\"hello\"}]", NULL, true, CHAT_THINK_DEFAULT, NULL) : NULL;
    int32_t *ta = NULL, *tb = NULL;
    int64_t na = 0, nb = 0;
    if (a && b) {
        CHECK(!strncmp(a, bos, strlen(bos)) && strcmp(a, b));
        CHECK(chat_tokenize(v, a, strlen(a), &ta, &na, &err) == HN_OK);
        CHECK(chat_tokenize(v, b, strlen(b), &tb, &nb, &err) == HN_OK);
        CHECKF(na == nb && na > 1 && !memcmp(ta, tb, (size_t)na * sizeof *ta), "BOS twice or missing: %lld vs %lld",
               (long long)na, (long long)nb);
        int bos_count = 0;
        for (int64_t i = 0; i < na; i++) bos_count += ta[i] == tok_bos(v);
        CHECK(ta[0] == tok_bos(v) && bos_count == 1);
    }
    hn_free(ta);
    hn_free(tb);
    free(a);
    free(b);
    chat_template_free(tw);
    chat_template_free(to);
    tok_free(v);
    gguf_close(g);
}

/* Bad shapes are HN_ERR_INVALID, odd ones render, nothing crashes. */
static void test_bad_input(void) {
    tmpl_entry *e = tmpl("Qwen-Qwen3-0.6B.jinja");
    if (!e || !e->t) return;
    static const char *bad[] = {"{}", "[1]", "[{\"content\":\"x\"}]", "[{\"role\":5}]"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *m = json_loads(bad[i], 0, NULL);
        chat_prompt p;
        hn_err err = {0};
        chat_options o = {0};
        CHECKF(chat_render(e->t, m, NULL, &o, &p, &err) == HN_ERR_INVALID && !p.text, "%s accepted", bad[i]);
        json_decref(m);
    }
    static const char *odd[] = {
        "[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":5}}]}]",
        "[{\"role\":\"assistant\",\"tool_calls\":[7,{\"id\":3},{\"function\":{\"arguments\":\"not json\"}}]}]",
        "[{\"role\":\"system\",\"content\":[5,{\"text\":7}]},{\"role\":\"system\",\"content\":{}},{\"role\":\"developer\",\"content\":\"d\"}]",
        "[{\"role\":\"weird\",\"content\":\"x\",\"reasoning_content\":[1]}]",
    };
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
        json_t *m = json_loads(odd[i], 0, NULL);
        CHECKF(m != NULL, "bad test JSON %zu", i);
        chat_prompt p;
        hn_err err = {0};
        chat_options o = {0};
        hn_status st = chat_render(e->t, m, NULL, &o, &p, &err);
        CHECKF(st == HN_OK || st == HN_ERR_INVALID, "odd input %zu: %s", i, err.msg);
        chat_prompt_free(&p);
        json_decref(m);
    }
}

/* Every allocation failure is a clean error, never a crash or a leak (ASan). */
static void test_alloc_failures(void) {
    tmpl_entry *e = tmpl("Qwen3.5-4B.jinja");
    if (!e || !e->src) return;
    json_t *m = json_loads(AGENT_FULL, 0, NULL), *tl = json_loads(AGENT_TOOLS, 0, NULL);
    int ok_at = -1;
    for (long n = 0; n < 100000 && ok_at < 0; n += n < 200 ? 1 : 37) {
        chat_template *t = NULL;
        hn_err err = {0};
        hn_alloc_fail_after(n);
        hn_status st = chat_template_new(e->src, e->len, e->bos, e->eos, NULL, NULL, &t, &err);
        chat_prompt p = {0};
        if (st == HN_OK) {
            chat_options o = {0};
            o.add_generation_prompt = true;
            st = chat_render(t, m, tl, &o, &p, &err);
            CHECKF(st == HN_OK || st == HN_ERR_NOMEM || st == HN_ERR_INVALID, "fail after %ld: %s", n, err.msg);
            if (st == HN_OK) ok_at = (int)n;
        } else {
            CHECKF(st == HN_ERR_NOMEM, "create, fail after %ld: %s", n, err.msg);
        }
        hn_alloc_fail_after(-1);
        chat_prompt_free(&p);
        chat_template_free(t);
    }
    CHECKF(ok_at > 0, "never rendered under allocation failure");
    /* the resume points: out of memory, or each point right (or -1: that probe failed to render) */
    chat_options o = {.add_generation_prompt = true};
    chat_prompt p;
    int32_t *tok = NULL;
    int64_t nt = 0, want[CHAT_RESUME_MAX];
    hn_err err = {0};
    CHECK(qwen_vocab && chat_render(e->t, m, tl, &o, &p, &err) == HN_OK &&
          chat_tokenize_spans(qwen_vocab, p.text, p.len, p.spans, p.n_spans, &tok, &nt, &err) == HN_OK &&
          chat_resume_points(e->t, qwen_vocab, m, tl, &o, &p, tok, nt, false, want, &err) == HN_OK);
    ok_at = -1;
    for (long n = 0; tok && n < 100000 && ok_at < 0; n += n < 200 ? 1 : 37) {
        int64_t got[CHAT_RESUME_MAX];
        hn_alloc_fail_after(n);
        hn_status st = chat_resume_points(e->t, qwen_vocab, m, tl, &o, &p, tok, nt, false, got, &err);
        hn_alloc_fail_after(-1);
        bool right = st == HN_OK;
        for (int i = 0; right && i < CHAT_RESUME_MAX; i++) right = got[i] == want[i] || got[i] == -1;
        CHECKF(right || st == HN_ERR_NOMEM, "resume points, fail after %ld: %d %s: %lld %lld %lld of %lld %lld %lld", n, (int)st, err.msg, (long long)got[0], (long long)got[1], (long long)got[2], (long long)want[0], (long long)want[1], (long long)want[2]);
        if (st == HN_OK && !memcmp(got, want, sizeof got)) ok_at = (int)n;
    }
    CHECKF(ok_at > 0, "never found the resume points under allocation failure");
    hn_free(tok);
    chat_prompt_free(&p);
    json_decref(m);
    json_decref(tl);
}

int main(void) {
    load_qwen();
    load_corpus();
    test_caps();
    test_prefix();
    test_corpus_identity();
    test_resume();
    test_billing();
    test_system_in_place();
    test_system_runs();
    test_key_order();
    test_reasoning();
    test_gguf();
    test_bos();
    test_bad_input();
    test_alloc_failures();
    for (int i = 0; i < g_ntmpl; i++) {
        chat_template_free(g_tmpl[i].t);
        free(g_tmpl[i].src);
    }
    json_decref(g_index);
    json_decref(g_convs);
    tok_free(qwen_vocab);
    gguf_close(qwen_gguf);
    TEST_DONE();
}
