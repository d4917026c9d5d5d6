/* fuzz_template.c: a libFuzzer harness for the chat template engine
 * (tpl_compile, tpl_render). Input: template source, optionally followed by
 * a NUL byte and a JSON object of variables; without one the variables are
 * a fixed conversation (system, user, assistant with a tool call, tool
 * result, tools, add_generation_prompt). Rendering runs under tight limits
 * (tpl_options), so a template that loops or grows is an error, not a hang.
 * Every outcome must be a success with NUL-terminated output or an error
 * with a message; a crash, a sanitizer report or a leak is a finding.
 * Seeds: the corpus templates (../shared/data/templates/templates, read in
 * place by `make fuzz-run`) and tests/fuzz/corpus/template. */
#include <jansson.h>
#include <string.h>

#include "fuzz_common.h"
#include "template/template.h"

static json_t *g_tvars;

static const char TPL_VARS[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
    " {\"role\": \"user\", \"content\": \"What is the weather in Paris?\"},"
    " {\"role\": \"assistant\", \"content\": \"\", \"reasoning_content\": \"Use the tool.\","
    "  \"tool_calls\": [{\"id\": \"call_1\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\","
    "   \"arguments\": {\"city\": \"Paris\"}}}]},"
    " {\"role\": \"tool\", \"tool_call_id\": \"call_1\", \"name\": \"get_weather\", \"content\": \"18 C\"},"
    " {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"Thanks.\"}]}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather\","
    "  \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}},"
    "  \"required\": [\"city\"]}}}],"
    " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\","
    " \"enable_thinking\": true}";

static void fuzz_template_init(void) {
    if (!g_tvars) g_tvars = json_loads(TPL_VARS, 0, NULL);
    if (!g_tvars) fuzz_fail("the fixed variables do not parse");
}

__attribute__((unused)) static void fuzz_template_free(void) { /* for the replay test */
    json_decref(g_tvars);
    g_tvars = NULL;
}

static void fuzz_template_one(const uint8_t *data, size_t size) {
    if (size > 256 * 1024) return;
    const char *src = (const char *)data;
    const uint8_t *nul = memchr(data, 0, size);
    size_t slen = nul ? (size_t)(nul - data) : size;
    json_t *vars = NULL;
    if (nul) {
        vars = json_loadb((const char *)nul + 1, size - slen - 1, 0, NULL);
        if (!json_is_object(vars)) {
            json_decref(vars);
            vars = NULL;
        }
    }
    tpl_template *t = NULL;
    hn_err err = {0};
    if (tpl_compile(src, slen, &t, &err) != HN_OK) {
        if (t) fuzz_fail("tpl_compile failed but set *out");
        if (!err.msg[0]) fuzz_fail("tpl_compile failed without a message");
        json_decref(vars);
        return;
    }
    tpl_options opt;
    memset(&opt, 0, sizeof opt);
    opt.max_output = 1 << 20;
    opt.max_memory = 64u << 20;
    opt.max_steps = 200000;
    opt.max_depth = 64;
    opt.now = 1700000000;
    tpl_buf out = {0};
    tpl_errkind kind = TPL_E_NONE;
    hn_status st = tpl_render(t, vars ? vars : g_tvars, &opt, &out, &kind, &err);
    if (st == HN_OK) {
        if (out.len && (!out.data || out.data[out.len] != 0)) fuzz_fail("output not NUL-terminated");
        if (out.len > opt.max_output) fuzz_fail("%zu bytes of output past the limit", out.len);
    } else if (kind != TPL_E_RAISE && !err.msg[0]) {
        fuzz_fail("tpl_render failed (kind %d) without a message", (int)kind);
    }
    tpl_buf_free(&out);
    tpl_free(t);
    json_decref(vars);
}

FUZZ_ENTRY(template)
