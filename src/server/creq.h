/* creq.h: one internal chat request, mapped from any of the wire APIs.
 *
 * OpenAI chat completions, legacy completions, the Responses API and the
 * Anthropic Messages API (and count_tokens) all become a creq: messages in the
 * normalised form a chat template consumes, tools in OpenAI function form,
 * the tool/format constraints, sampling and limits. Everything after this
 * point (prompt rendering, generation, constraints) is API-independent; only
 * the response writers look at `api` again.
 *
 * Normalised messages (a jansson array, owned by the creq):
 *   {"role":"system"|"user"|"assistant"|"tool",
 *    "content": string (always present, "" when empty),
 *    "reasoning_content": string (assistant, when the client sent reasoning),
 *    "tool_calls": [{"id","type":"function","function":{"name","arguments":{...}}}],
 *    "tool_call_id", "name" (tool results)}
 *   - leading system/developer/instructions text is merged into one system
 *     message at index 0; later system messages stay in place (the renderer,
 *     template/chat.h, demotes them in place if the template refuses them);
 *   - content parts are joined with "\n" (non-text parts are dropped);
 *   - tool-call arguments are parsed into objects, key order preserved, so
 *     re-rendered history is byte-stable (a string that is not JSON is kept);
 *   - Claude Code's per-request billing block ("x-anthropic-billing-header:
 *     ... cch=...") is kept as sent; the chat layer removes it when it
 *     renders the leading system message (chat_strip_billing, template/chat.h);
 *   - unknown fields, roles, block and item types are tolerated.
 * Tools: [{"type":"function","function":{"name","description","parameters",...}}]. */
#ifndef HN_SERVER_CREQ_H
#define HN_SERVER_CREQ_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "api.h"

#define CREQ_MAX_STOP 16

typedef enum creq_toolchoice {
    CREQ_TOOLS_AUTO,     /* the model may call a tool */
    CREQ_TOOLS_NONE,     /* tools stay in the prompt, calls are not parsed */
    CREQ_TOOLS_REQUIRED, /* at least one call (OpenAI required, Anthropic any) */
    CREQ_TOOLS_NAMED,    /* a call to tool_name */
} creq_toolchoice;

typedef enum creq_format {
    CREQ_FMT_TEXT,
    CREQ_FMT_JSON_OBJECT, /* any JSON object */
    CREQ_FMT_JSON_SCHEMA, /* JSON matching `schema` */
} creq_format;

typedef struct creq {
    api_kind api;
    bool count_only;          /* /v1/messages/count_tokens: render and count, no generation */
    char *model;              /* as sent, or NULL */

    json_t *messages;         /* normalised (see above); NULL for API_COMPLETIONS */
    json_t *tools;            /* OpenAI function form, or NULL when none */
    json_t *custom_tools;     /* Responses: names of freeform (custom) tools among them, or NULL */
    char *prompt;             /* API_COMPLETIONS: the raw prompt text (or NULL) */
    int32_t *prompt_tokens;   /* API_COMPLETIONS given as token ids (hn_malloc'd) */
    int32_t n_prompt_tokens;
    bool prefill;             /* the last message is an assistant turn to continue */

    creq_toolchoice tool_choice;
    char *tool_name;          /* CREQ_TOOLS_NAMED */
    bool parallel_tool_calls; /* default true */
    creq_format format;
    json_t *schema;           /* CREQ_FMT_JSON_SCHEMA */

    char *stop[CREQ_MAX_STOP];
    int n_stop;
    int32_t max_tokens;       /* -1: not given */

    /* sampling: has_* says whether the client set the value */
    bool has_temp, has_top_p, has_top_k, has_min_p, has_seed, has_presence, has_frequency;
    float temp, top_p, min_p, presence_penalty, frequency_penalty;
    int32_t top_k;
    uint64_t seed;

    bool stream;
    bool include_usage;       /* OpenAI chat/completions stream_options.include_usage */
    int thinking;             /* -1: template default, 0: off, 1: on */
    int32_t thinking_budget;  /* Anthropic budget_tokens (0: none) */
    json_t *template_kwargs;  /* chat_template_kwargs object, or NULL */
    bool echo_reasoning_as_reasoning; /* OpenAI chat: the client sent `reasoning` (not reasoning_content) */
} creq;

/* Parses a request body of the given API into r (zeroed first). On failure
 * returns false with e filled (the body is the client's fault: 400) and r
 * empty. count_only is for /v1/messages/count_tokens (max_tokens optional). */
bool creq_from_chat(const json_t *body, creq *r, api_error *e);
bool creq_from_completions(const json_t *body, creq *r, api_error *e);
bool creq_from_responses(const json_t *body, creq *r, api_error *e);
bool creq_from_messages(const json_t *body, bool count_only, creq *r, api_error *e);

/* Dispatches on api to one of the above. */
bool creq_parse(api_kind api, bool count_only, const json_t *body, creq *r, api_error *e);

/* Frees everything r owns and zeroes it. */
void creq_free(creq *r);

#endif
