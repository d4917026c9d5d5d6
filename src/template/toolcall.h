/* toolcall.h: tool calls and reasoning out of the model's streamed text.
 *
 * A model answers an agent in its own family's markup: Qwen/Hermes wrap a JSON
 * object in <tool_call>...</tool_call>, Qwen3-Coder / Qwen3.5 write XML-ish
 * <function=NAME><parameter=P>raw value</parameter></function>, Llama 3.x writes
 * a bare {"name": ..., "parameters": {...}} (maybe after <|python_tag|>), and
 * reasoning models think inside <think>...</think>. This module turns that text,
 * fed in arbitrary chunks as tokens are detokenized, into a stream of events:
 * content deltas, reasoning deltas, and tool calls (start with id and name,
 * argument JSON fragments, end).
 *
 * Shape of the design:
 *  - tc_detect() picks the format from the chat template's source and the
 *    vocabulary's special tokens, never from a file name.
 *  - The parser is a state machine over a pending buffer. Text that might be the
 *    start of a tag (or a trailing newline that a tag would swallow) is held back
 *    until decided, so half a tool call never leaks into content. Every decision
 *    depends only on bytes already seen, so the coalesced event sequence is the
 *    same however the text is split into feeds.
 *  - Output that cannot be parsed never fails: at worst it comes back as content,
 *    raw. Recovery: missing closing tags at end of stream, trailing garbage after
 *    the JSON, single quotes / Python literals / trailing commas, arguments given
 *    as a JSON string holding JSON, unknown keys, missing </parameter> or
 *    </function>, a Hermes JSON body inside a Qwen XML <tool_call>, a bare
 *    <function=...> without <tool_call>, a bare JSON call at the start of the
 *    output (Hermes and Llama 3 formats, when tools were offered).
 *  - Arguments are coerced to the tool's JSON schema: "5" becomes 5 for an
 *    integer, "true" a boolean, a JSON text an object/array, a number a string
 *    when the schema says string (nested properties and array items too).
 *  - Qwen XML string parameters stream character by character (a file being
 *    written arrives as it is generated); other parameters arrive when complete.
 *    Hermes and Llama 3 JSON calls are emitted when the call's JSON is complete
 *    (start, whole arguments, end together), because only then can they be
 *    recovered and coerced.
 *  - Unknown tool names: the call is kept (the client can answer "no such tool",
 *    which agents handle) and flagged with known_tool = 0 on its start event.
 *  - Every call gets an id "call_" + 24 alphanumerics, unique within the process.
 *  - Emitted text deltas never split a UTF-8 sequence (except at finish, for
 *    invalid input); argument fragments are valid UTF-8 JSON text.
 *
 * Memory: the parser's own buffers go through the hone allocator; jansson
 * values use jansson's allocator. A parser is used by one thread at a time. */
#ifndef HN_TEMPLATE_TOOLCALL_H
#define HN_TEMPLATE_TOOLCALL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "../core/status.h"

typedef enum {
    TC_FORMAT_NONE = 0,  /* no tool-call markup known: content (and reasoning) only */
    TC_FORMAT_HERMES,    /* <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call> */
    TC_FORMAT_QWEN_XML,  /* <tool_call>\n<function=N>\n<parameter=P>\nV\n</parameter>\n</function>\n</tool_call> */
    TC_FORMAT_LLAMA3,    /* [<|python_tag|>]{"name": ..., "parameters": {...}} [; {...}] */
    TC_FORMAT_COUNT
} tc_format;

enum {
    TC_FLAG_REASONING = 1u << 0,       /* the model may open its output with <think>...</think> */
    TC_FLAG_THINK_IN_PROMPT = 1u << 1, /* the generation prompt may end with an open "<think>\n" */
};

typedef struct {
    tc_format format;
    unsigned flags; /* TC_FLAG_* */
} tc_detection;

/* Returns non-zero when the vocabulary has `text` as one (special) token. */
typedef int (*tc_has_token_fn)(void *user, const char *text);

/* Returns the format and flags that fit a chat template's source; has_token may
 * be NULL (then only the template text is used). Never fails: unknown -> NONE. */
tc_detection tc_detect(const char *template_src, tc_has_token_fn has_token, void *user);

/* Returns non-zero when a rendered prompt ends inside an open <think> block
 * (its last non-whitespace text is "<think>"): the exact per-request answer to
 * what TC_FLAG_THINK_IN_PROMPT says the template may do. */
int tc_prompt_opens_think(const char *prompt, size_t len);

/* Returns the lower-case name of a format ("hermes", "qwen_xml", ...). */
const char *tc_format_name(tc_format f);

typedef enum {
    TC_EV_CONTENT,    /* text: a delta of the visible answer */
    TC_EV_REASONING,  /* text: a delta of the reasoning */
    TC_EV_CALL_START, /* index, id, name, known_tool */
    TC_EV_CALL_ARGS,  /* index, text: a fragment; a call's fragments concatenate to one JSON object */
    TC_EV_CALL_END,   /* index */
} tc_event_kind;

typedef struct {
    tc_event_kind kind;
    const char *text; /* CONTENT, REASONING, CALL_ARGS: valid only during the callback */
    size_t len;
    int index;        /* calls: 0, 1, 2, ... in order of appearance */
    const char *id;   /* CALL_START: "call_" + 24 alphanumerics, NUL-terminated */
    const char *name; /* CALL_START: the tool name as the model wrote it, NUL-terminated */
    int known_tool;   /* CALL_START: 1 when the name is one of the offered tools */
} tc_event;

typedef void (*tc_event_fn)(void *user, const tc_event *ev);

typedef struct {
    unsigned flags;         /* TC_FLAG_REASONING enables <think> parsing */
    int start_in_reasoning; /* the prompt ended inside <think> (see tc_prompt_opens_think) */
    uint64_t id_seed;       /* 0: ids from a process-wide random source (unique in the process);
                               else ids are a deterministic function of seed and call number */
} tc_options;

typedef struct tc_parser tc_parser;

/* Creates a parser for one generation. tools is the request's `tools` array
 * (OpenAI chat {"type":"function","function":{...}}, Responses/normalised
 * {"name","parameters"}, or Anthropic {"name","input_schema"}) or NULL; it is
 * copied. opt may be NULL. Fails only with HN_ERR_NOMEM / HN_ERR_INVALID. */
hn_status tc_parser_new(tc_format fmt, const json_t *tools, const tc_options *opt,
                        tc_parser **out, hn_err *err);

/* Feeds the next len bytes of model output; calls fn for every event decided so
 * far (text that may still turn into markup is held back). Fails only on
 * allocation failure (the parser is then unusable). */
hn_status tc_parser_feed(tc_parser *p, const char *text, size_t len, tc_event_fn fn, void *user);

/* Ends the stream: flushes held-back text, closes or gives back as content any
 * unfinished call. Further feeds are ignored. */
hn_status tc_parser_finish(tc_parser *p, tc_event_fn fn, void *user);

/* Returns the number of tool calls started so far. */
int tc_parser_ncalls(const tc_parser *p);

/* Returns non-zero when the stream ended inside a committed Qwen XML call (in
 * a parameter, or before </function>): the call was closed with what had
 * arrived, so its last value may be cut short. Servers should not report such
 * a call as complete (e.g. finish_reason "length" rather than "tool_calls"). */
int tc_parser_truncated(const tc_parser *p);

/* Frees a parser (NULL is fine). */
void tc_parser_free(tc_parser *p);

#endif
