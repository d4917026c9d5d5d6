/* toolcall_detect.c: which tool-call parser fits a model, from its chat
 * template's source and its vocabulary (never from a file name).
 *
 * A template shows the model how to call a tool: it renders earlier assistant
 * calls and usually describes the format in the system prompt. So the markers
 * the model will emit are literally in the template text:
 *  - Qwen XML: "<tool_call>" with "<function=" and "<parameter=".
 *  - Hermes: "<tool_call>" closely followed by a {"name" JSON object.
 *  - Llama 3.x: the <|start_header_id|> chat format plus a {"name": ...,
 *    "parameters": ...} call description (3.1/3.3 also name <|python_tag|>).
 *  - Reasoning: "</think>" in the template, or <think> and </think> both
 *    single tokens in the vocabulary.
 *  - Think opened in the prompt: a string literal ending in "<think>" or
 *    "<think>\n" emitted after the template's last test of
 *    add_generation_prompt. Whether a given render does so can depend on
 *    variables (enable_thinking), so the flag means "may"; the exact answer for
 *    one request is tc_prompt_opens_think() on the rendered prompt. */
#include <ctype.h>
#include <string.h>

#include "toolcall.h"

static int has_tok(tc_has_token_fn fn, void *user, const char *text) { return fn && fn(user, text); }

/* "<tool_call>" followed within a few bytes by a JSON object opening with "name". */
static int hermes_shape(const char *src) {
    for (const char *p = strstr(src, "<tool_call>"); p; p = strstr(p + 1, "<tool_call>")) {
        const char *q = p + strlen("<tool_call>");
        for (int i = 0; i < 24 && q[i]; i++) {
            if (q[i] != '{') continue;
            const char *r = q + i + 1;
            if (*r == '\\') r++;
            if (!strncmp(r, "\"name", 5)) return 1;
        }
    }
    return 0;
}

/* A string literal (in the template source) that ends with "<think>" or
 * "<think>\n", after the last mention of add_generation_prompt. */
static int opens_think_in_prompt(const char *src) {
    const char *last = NULL;
    for (const char *p = strstr(src, "add_generation_prompt"); p; p = strstr(p + 1, "add_generation_prompt"))
        last = p;
    if (!last) return 0;
    for (const char *p = strstr(last, "<think>"); p; p = strstr(p + 1, "<think>")) {
        const char *q = p + strlen("<think>");
        if (q[0] == '\\' && q[1] == 'n') q += 2;
        else if (q[0] == '\n') q += 1;
        if (*q == '\'' || *q == '"') return 1;
    }
    return 0;
}

tc_detection tc_detect(const char *src, tc_has_token_fn has_token, void *user) {
    tc_detection d = {TC_FORMAT_NONE, 0};
    if (!src) src = "";
    int tool_call_tag = strstr(src, "<tool_call>") != NULL;
    if (tool_call_tag && strstr(src, "<function=") && strstr(src, "<parameter="))
        d.format = TC_FORMAT_QWEN_XML;
    else if (tool_call_tag && hermes_shape(src))
        d.format = TC_FORMAT_HERMES;
    else if ((strstr(src, "<|start_header_id|>") || has_tok(has_token, user, "<|start_header_id|>")) &&
             strstr(src, "\"parameters\""))
        d.format = TC_FORMAT_LLAMA3;

    if (strstr(src, "</think>") ||
        (has_tok(has_token, user, "<think>") && has_tok(has_token, user, "</think>")))
        d.flags |= TC_FLAG_REASONING;
    if (opens_think_in_prompt(src)) d.flags |= TC_FLAG_REASONING | TC_FLAG_THINK_IN_PROMPT;
    return d;
}

int tc_prompt_opens_think(const char *prompt, size_t len) {
    while (len && isspace((unsigned char)prompt[len - 1])) len--;
    size_t k = strlen("<think>");
    return len >= k && memcmp(prompt + len - k, "<think>", k) == 0;
}

const char *tc_format_name(tc_format f) {
    switch (f) {
    case TC_FORMAT_NONE: return "none";
    case TC_FORMAT_HERMES: return "hermes";
    case TC_FORMAT_QWEN_XML: return "qwen_xml";
    case TC_FORMAT_LLAMA3: return "llama3";
    default: return "unknown";
    }
}
