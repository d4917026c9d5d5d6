/* chat.h: from a chat request's messages to the prompt tokens a model sees.
 *
 * The server maps every wire API (OpenAI chat, Responses, Anthropic) to
 * messages in the OpenAI chat form; this module renders them with the model's
 * own chat template (template.h) and tokenizes the result. On the way it makes
 * the rendering agent-friendly: an agent resends the whole conversation every
 * turn, so turn N+1's prompt should extend turn N's prompt token for token,
 * letting the prefix cache skip everything already computed. What breaks that
 * in real traffic, and what this module does about it:
 *
 *  - Claude Code's billing line. Its first system block is
 *    "x-anthropic-billing-header: cc_version=V.xyz; cc_entrypoint=E; cch=HHHHH;"
 *    where cch changes on every request and the cc_version suffix on every
 *    session. Choice: the whole line (with the blank lines after it) is removed
 *    from the leading system message (and the message dropped if nothing else
 *    is left); the server maps requests as sent and relies on this. Rewriting only
 *    cch (llama.cpp's choice) would still put a per-session token first and
 *    stop two sessions from sharing the ~20K-token system prompt + tools; the
 *    line carries no instruction for the model.
 *  - Mid-conversation system messages (Claude Code's reminders, agent lists)
 *    are rendered in place, never hoisted into the top system prompt. If the
 *    template refuses them, drops them or moves them (found once per template
 *    by a probe render, and again if a render raises), each is demoted in
 *    place to "<system-reminder>\n TEXT \n</system-reminder>" user text:
 *    appended (after "\n\n") to the user or tool message right before it
 *    (where Claude Code itself puts reminders), else prepended to the user
 *    message right after it, else a user message of its own. The rule looks
 *    only at the neighbours, which never change once the message is in the
 *    history (a new turn always starts with the assistant's reply), so earlier
 *    turns render the same every time.
 *    A leading system message that the template refuses is merged the same
 *    way into the first user message (llama.cpp does the same).
 *  - Tool-call arguments keep their key order and bytes. A probe tells how
 *    the template uses function.arguments: if it prints a JSON string as is
 *    (Qwen/Hermes), a string stays exactly as the client sent it; if it needs
 *    a mapping (tojson, .items(), XML parameters), a string is parsed into an
 *    ordered object (jansson keeps insertion order, and so does tojson).
 *    Objects are kept, or serialised json.dumps-style for string-only
 *    templates.
 *  - Reasoning of earlier turns: reasoning_content is passed through, and the
 *    template decides (Qwen3 keeps only the reasoning after the last user
 *    query); templates that read `thinking` or `reasoning` instead get it
 *    under that name too.
 *  - Also, as llama.cpp does: content null becomes "", content given as text
 *    parts is joined with "\n" for templates that cannot render parts, role
 *    "developer" becomes "system" (except for harmony templates, which know
 *    it), empty tools are no tools, and tool-call ids are mapped to 9
 *    alphanumerics (a hash, so always the same) for templates that require
 *    that shape (Mistral).
 *
 * BOS: the prompt is rendered with bos_token/eos_token set to the vocabulary's
 * texts; chat_tokenize then does what llama.cpp's server does: when the
 * vocabulary adds BOS and the rendered text already starts with the BOS text,
 * that text is dropped before tokenizing with add_special (likewise a trailing
 * EOS text when the vocabulary adds EOS), so the prompt has exactly one BOS.
 *
 * Ownership: a chat_template is immutable after creation and may be used by
 * several threads at once. jansson values are the caller's and are never
 * modified (the module works on copies). */
#ifndef HN_TEMPLATE_CHAT_H
#define HN_TEMPLATE_CHAT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../core/status.h"
#include "../gguf/gguf.h"
#include "../tokenizer/tokenizer.h"
#include "template.h"
#include "toolcall.h"

typedef struct chat_template chat_template;

/* What the probe renders found out about a template (see the top comment). */
typedef struct chat_caps {
    bool system_role;       /* a leading system message is rendered */
    bool system_in_place;   /* a later system message is rendered where it stands */
    bool parts;             /* content as a list of {"type":"text"} parts is rendered */
    bool args_string;       /* arguments given as a JSON string are printed as sent */
    bool args_object;       /* arguments given as a mapping are rendered as JSON or parameters */
    bool short_ids;         /* tool-call ids must be 9 alphanumerics */
    bool alias_thinking;    /* reasoning is read from message.thinking (not reasoning_content) */
    bool alias_reasoning;   /* reasoning is read from message.reasoning (not reasoning_content) */
    bool developer_role;    /* the template knows role "developer" (harmony) */
} chat_caps;

/* Whether to ask the template for thinking: zero-initialised = its default. */
typedef enum {
    CHAT_THINK_DEFAULT = 0, /* enable_thinking is not passed (undefined in the template) */
    CHAT_THINK_OFF,         /* enable_thinking = false */
    CHAT_THINK_ON,          /* enable_thinking = true */
} chat_think;

typedef struct chat_options {
    bool add_generation_prompt; /* end with the assistant turn's opening */
    chat_think thinking;
    const json_t *kwargs;       /* extra template variables (chat_template_kwargs), or NULL; they
                                   may set bos_token, eos_token, documents, enable_thinking (when
                                   `thinking` is DEFAULT) and others, never messages, tools or
                                   add_generation_prompt */
    int64_t now;                /* strftime_now's time (seconds since the epoch); 0 = now */
} chat_options;

/* One rendered prompt. */
typedef struct chat_prompt {
    char *text;         /* hn_malloc'd, NUL-terminated */
    size_t len;
    bool opens_think;   /* the prompt ends inside an open <think> (tc_prompt_opens_think) */
    int n_demoted;      /* system messages merged into user text for this template */
    tpl_errkind errkind;/* after a failed render: what the template reported */
    size_t *spans;      /* pairs [start, end): text from the request's strings that spells a
                           control token (to tokenize as text); hn_malloc'd, may be NULL */
    size_t n_spans;
} chat_prompt;

/* Creates a template from its source and the vocabulary's BOS/EOS texts (NULL
 * = ""); has_token (may be NULL) feeds tc_detect. Compiles the source and runs
 * the probe renders. Fails with HN_ERR_FORMAT (err says where) when the source
 * does not compile, or HN_ERR_NOMEM. */
hn_status chat_template_new(const char *src, size_t len, const char *bos, const char *eos,
                            tc_has_token_fn has_token, void *user, chat_template **out, hn_err *err);

/* Creates the template of a model: tokenizer.chat_template from the GGUF, the
 * BOS/EOS texts and special tokens from its vocabulary. HN_ERR_NOT_FOUND when
 * the GGUF has no chat template. The texts of the vocabulary's control tokens
 * are remembered: in what chat_render is given (messages, tools, kwargs)
 * they are marked before rendering and the marks turned into out->spans
 * after, so that only the template's own markup becomes control tokens
 * (chat_tokenize_spans); a prompt without such text is unchanged. */
hn_status chat_template_from_gguf(const gguf_ctx *g, const tok_vocab *v, chat_template **out, hn_err *err);

/* Frees a template (NULL is fine). */
void chat_template_free(chat_template *t);

/* Returns the probe results of a template. */
const chat_caps *chat_template_caps(const chat_template *t);

/* Returns the tool-call/reasoning format detected for the template (and vocabulary). */
tc_detection chat_template_format(const chat_template *t);

/* Returns the template source (NUL-terminated; owned by the template). */
const char *chat_template_source(const chat_template *t);

/* Returns in *out a new array: messages (OpenAI chat form) normalised for this
 * template as the top comment describes; *n_demoted (may be NULL) gets the
 * number of system messages merged into user text. demote_all forces demotion
 * of every non-leading system message. Fails with HN_ERR_INVALID when
 * messages is not an array of objects with a string role, or HN_ERR_NOMEM. */
hn_status chat_normalize(const chat_template *t, const json_t *messages, bool demote_all, json_t **out,
                         int *n_demoted, hn_err *err);

/* Renders messages (OpenAI chat form) and tools (OpenAI function list, or
 * NULL) into out (zeroed first; free with chat_prompt_free). When the template
 * raises with system messages left in place, it is rendered again with them
 * demoted. Fails with HN_ERR_INVALID for bad messages or when the template
 * fails (err->msg is the template's own message for raise_exception;
 * out->errkind says which kind), HN_ERR_NOMEM. */
hn_status chat_render(const chat_template *t, const json_t *messages, const json_t *tools,
                      const chat_options *opt, chat_prompt *out, hn_err *err);

/* Frees a prompt's text and zeroes it (NULL is fine). */
void chat_prompt_free(chat_prompt *p);

/* Tokenizes a rendered prompt: special tokens parsed, BOS/EOS as the top
 * comment says. *tokens is hn_malloc'd (free with hn_free), *n its length.
 * Fails with HN_ERR_NOMEM or HN_ERR_INTERNAL. */
hn_status chat_tokenize(const tok_vocab *v, const char *prompt, size_t len, int32_t **tokens, int64_t *n,
                        hn_err *err);
/* chat_tokenize, except that control tokens overlapping the n_spans ranges
 * (chat_prompt.spans: sorted, disjoint pairs) are not matched there. */
hn_status chat_tokenize_spans(const tok_vocab *v, const char *prompt, size_t len, const size_t *spans, size_t n_spans,
                              int32_t **tokens, int64_t *n, hn_err *err);

/* Where the next turn's prompt may stop repeating this one. A hybrid model
 * resumes only where it kept a recurrent-state checkpoint, so the engine
 * wants one at (or just before) the token where the next turn's prompt first
 * differs from this one, and the template decides where that is: Qwen3.5's
 * generation prompt ends "<|im_start|>assistant\n<think>\n" but a reply in
 * history renders as "<|im_start|>assistant\n" + its answer (2 tokens
 * earlier), or, for a tool-call turn whose reasoning the client drops, as
 * "<think>\n\n</think>" (the "\n" merges into "\n\n": 1 token earlier); a
 * user message after a run of tool calls drops the reasoning of all of them
 * (back at the first one's reply). Found by rendering likely next turns
 * (probes appended to messages) and comparing their tokens with this
 * prompt's. out[k] is, for the next turn k (CHAT_RESUME_USER: a user message
 * after a text reply; CHAT_RESUME_TOOL: a tool result after a call of the
 * first tool, the call's reasoning dropped; CHAT_RESUME_TOOL_REASONING: sent
 * back), the count of this prompt's tokens it repeats (n_tokens: all, and
 * then the reply may be repeated too), or -1 when that probe does not render
 * (or, for the tool turns, there are no tools). messages, tools and opt are
 * this prompt's (as chat_render got them), p its rendering and
 * tokens[0..n_tokens) its tokenization (chat_tokenize_spans). Only the
 * probes' tails are tokenized, from the last control token before their
 * first differing byte (text split at a control token tokenizes as its
 * parts do); reference tokenizes them whole. Fails only with HN_ERR_NOMEM. */
enum { CHAT_RESUME_USER, CHAT_RESUME_TOOL, CHAT_RESUME_TOOL_REASONING, CHAT_RESUME_MAX };
hn_status chat_resume_points(const chat_template *t, const tok_vocab *v, const json_t *messages, const json_t *tools,
                             const chat_options *opt, const chat_prompt *p, const int32_t *tokens, int64_t n_tokens,
                             bool reference, int64_t out[CHAT_RESUME_MAX], hn_err *err);

/* Removes Claude Code's billing line from a system text: returns a new
 * hn_malloc'd string without any line that starts with
 * "x-anthropic-billing-header:" (nor the newline ending it, nor the blank
 * lines right after it, which separated it from the next text), or NULL when
 * there is no such line (or on allocation failure, with *nomem set). This is
 * the one place the rule lives: chat_normalize applies it to the leading
 * system message, and the server relies on that. */
char *chat_strip_billing(const char *text, size_t len, size_t *out_len, bool *nomem);

#endif
