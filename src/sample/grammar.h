/* grammar.h: constrained decoding, a grammar over the tokenizer's vocabulary.
 *
 * A grammar is a byte-level context-free grammar (rules of alternatives of
 * sequences of byte sets and rule references, GBNF-like), compiled from a JSON
 * schema, from "any JSON object", or from a request's tools in the model's
 * tool-call format. Byte sets make it UTF-8 aware by construction: every
 * "any character" class is spelled as the valid UTF-8 byte sequences, so a
 * generated string is always valid UTF-8 even when tokens split characters.
 *
 * Matching is a pushdown automaton run as a set of stacks (positions in the
 * grammar), normalised so that every stack's top is a byte set; tail calls do
 * not grow a stack, so a JSON string's characters keep one and the same
 * configuration. Each request's gr_state interns the configurations it meets
 * and memoises (configuration, byte) -> configuration: a lazily built DFA.
 * The token mask of a configuration is computed by walking the vocabulary's
 * byte trie (shared by all requests) against that memo, pruning dead
 * subtrees, and is cached per configuration. Inside a string or a number the
 * configuration repeats, so most steps cost a cache lookup plus applying the
 * bitmask to the logits; nothing allocates per token once the memo tables
 * have grown to the request's working set. The mask is exported as it is
 * kept, in sample.h's allowed-token bitmask format (gr_state_allowed), so a
 * device can apply it to a logits row in one op (the backend's mask_logits).
 *
 * JSON is generated in one canonical layout, the one Python's json.dumps and
 * the chat templates' tojson use: ", " between items and ": " after keys, no
 * other whitespace. Schema support (the subset agents send):
 *   type (string, number, integer, boolean, null, object, array, or a list),
 *   enum, const, anyOf/oneOf (as alternatives), allOf (one member, or object
 *   members merged: properties and required),
 *   $ref to #/$defs/... or #/definitions/... (recursion allowed), properties
 *   (emitted in the schema's order) with required; additionalProperties:
 *   allowed only when true or a schema, so a weak model cannot invent keys
 *   (an object schema with no properties and no additionalProperties accepts
 *   any object); items, minItems, maxItems (maxItems above 256 is treated as
 *   unbounded, minItems above 256 is refused). Ignored: pattern, format, minLength/maxLength, minimum/
 *   maximum, multipleOf, prefixItems, not, if/then/else. Numbers have at most
 *   16 integer digits, 15 fraction digits and 2 exponent digits; \u escapes
 *   exclude surrogates and \u0000 (so that every output decodes as JSON).
 *
 * Tool calls (formats from template/toolcall.h):
 *   TC_FORMAT_HERMES   <tool_call>\n{"name": "N", "arguments": {...}}\n</tool_call>
 *   TC_FORMAT_QWEN_XML <tool_call>\n<function=N>\n<parameter=P>\nV\n</parameter>\n...</function>\n</tool_call>
 *   TC_FORMAT_LLAMA3   {"name": "N", "parameters": {...}}
 * Parallel calls are joined with "\n" (Hermes, Qwen XML) or "; " (Llama 3).
 * In Qwen XML, string parameters are raw text that never contains
 * "</parameter>", "</function>", "<parameter=" or "</tool_call>"; other
 * types are their JSON text, as the templates render them. JSON strings inside
 * a call never contain the format's tags either (Hermes: "<tool_call>",
 * "</tool_call>"), which the tool-call parser would take for markup. Optionally a <think>...</think> block may (GR_THINK_OPTIONAL) or must
 * (GR_THINK_OPEN: the prompt already opened it) come first; no other free
 * text is allowed before the call.
 *
 * Vocabulary: the byte string of every token plus flags. End-of-generation
 * tokens are allowed only when the grammar is complete. Control tokens
 * (GR_TOK_SPECIAL: they have text only when rendered as special) may match
 * only literal text of the grammar (so <tool_call> can come as its own token,
 * but <|im_start|> never appears inside a JSON string). Empty tokens and
 * GR_TOK_NEVER tokens are never allowed.
 *
 * Threads: a gr_vocab and a gr_grammar are immutable once built and may be
 * shared by any number of states on any threads; a gr_state is used by one
 * thread at a time. */
#ifndef HN_GRAMMAR_H
#define HN_GRAMMAR_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../core/status.h"
#include "../template/toolcall.h"

struct tok_vocab;

typedef struct gr_vocab gr_vocab;
typedef struct gr_grammar gr_grammar;
typedef struct gr_state gr_state;

enum {
    GR_TOK_EOG = 1u << 0,     /* end of generation: allowed only when the grammar is complete */
    GR_TOK_SPECIAL = 1u << 1, /* control token: may match only literal grammar text */
    GR_TOK_NEVER = 1u << 2,   /* never allowed */
};

/* Builds the vocabulary index from n_vocab token byte strings (bytes[i] of
 * lens[i] bytes; copied) and per-token GR_TOK_* flags (flags may be NULL). */
hn_status gr_vocab_new(int32_t n_vocab, const char *const *bytes, const int32_t *lens,
                       const uint8_t *flags, gr_vocab **out, hn_err *err);
/* Builds it from a loaded tokenizer: pieces as tok_piece gives them, EOG from
 * tok_is_eog, GR_TOK_SPECIAL for tokens that have text only as special. */
hn_status gr_vocab_from_tok(const struct tok_vocab *tv, gr_vocab **out, hn_err *err);
int32_t gr_vocab_n(const gr_vocab *v);
void gr_vocab_free(gr_vocab *v);

/* Compiles a JSON schema (the subset above) into a grammar for one JSON value. */
hn_status gr_from_schema(const json_t *schema, gr_grammar **out, hn_err *err);
/* A grammar for any JSON object (response_format "json_object"). */
hn_status gr_any_object(gr_grammar **out, hn_err *err);

typedef enum { GR_THINK_NONE = 0, GR_THINK_OPTIONAL, GR_THINK_OPEN } gr_think;

typedef struct gr_tool_opts {
    tc_format format;  /* HERMES, QWEN_XML or LLAMA3 */
    const char *name;  /* tool_choice named: only this tool; NULL: any offered tool (required) */
    bool parallel;     /* one or more calls; else exactly one */
    gr_think think;
} gr_tool_opts;

/* Compiles a grammar for the full tool-call text. tools is the request's array
 * (OpenAI {"type":"function","function":{"name","parameters"}}, or
 * {"name","parameters"} / {"name","input_schema"}). HN_ERR_INVALID when no tool
 * (or not the named one) is offered, HN_ERR_UNSUPPORTED for an unknown format. */
hn_status gr_from_tools(const json_t *tools, const gr_tool_opts *opt, gr_grammar **out, hn_err *err);
/* Number of rules (for tests and logs). */
int32_t gr_grammar_rules(const gr_grammar *g);
void gr_grammar_free(gr_grammar *g);

/* Starts matching g over v (both must outlive the state). */
hn_status gr_state_new(const gr_grammar *g, const gr_vocab *v, gr_state **out, hn_err *err);
void gr_state_free(gr_state *s);
/* Back to the start of the grammar (keeps the memo tables). */
void gr_state_reset(gr_state *s);
/* The tokens that may come next as an allowed-token bitmask (sample.h's
 * format): (gr_vocab_n(v) + 31) / 32 little-endian words, bit t set = token t
 * allowed, the bits past the vocabulary clear; all zero after an EOG token.
 * Owned by s and valid until the next call on s other than gr_state_done,
 * gr_state_failed and gr_state_counters; never NULL. Cached per configuration
 * (GR_SLOTS of them, cheap ones evicted first): the first visit of a
 * configuration, or a visit after its mask was evicted, walks the
 * vocabulary's trie against the DFA memo, which may grow it (the only
 * allocation; on out of memory the mask may be partial and is not cached);
 * later visits are a lookup. */
const uint32_t *gr_state_allowed(gr_state *s);
/* Sets logits[i] = -INFINITY for every token i < n_vocab that cannot come next
 * (ids outside the vocabulary included): gr_state_allowed applied with
 * smp_apply_allowed. Allocates only while the memo grows. */
void gr_state_mask(gr_state *s, float *logits, int32_t n_vocab);
/* Returns whether token may come next (the mask's answer for one token). */
bool gr_state_allows(gr_state *s, int32_t token);
/* Advances over a token; HN_ERR_INVALID (state unchanged) if it is not allowed,
 * HN_ERR_NOMEM if the memo cannot grow. After an EOG token nothing more is allowed. */
hn_status gr_state_accept(gr_state *s, int32_t token, hn_err *err);
/* Advances over raw text (normal, non-special bytes), e.g. a forced prefix. */
hn_status gr_state_accept_bytes(gr_state *s, const char *text, size_t len, hn_err *err);
/* Finds the shortest text that completes the grammar from here (e.g. to
 * close a call when max_tokens is near: tokenize it or pick tokens along it).
 * Writes up to cap bytes into out and returns the full length; -1 when none
 * is found within the search limits (2M transitions tried, 4096 new
 * configurations interned: GR_COMPLETION_NEW_CFGS, so that one search stays
 * short whatever the grammar). Allocates scratch memory. */
#define GR_COMPLETION_NEW_CFGS 4096
int64_t gr_state_completion(gr_state *s, char *out, size_t cap);
/* Returns whether the text so far is a complete sentence of the grammar. */
bool gr_state_done(const gr_state *s);
/* Returns whether a token was refused since the last reset (by the adapter below). */
bool gr_state_failed(const gr_state *s);
/* Distinct configurations interned and masks computed so far (for benchmarks). */
void gr_state_counters(const gr_state *s, int64_t *n_cfgs, int64_t *n_masks);

/* Adapters: ctx is a gr_state. gr_mask_fn matches smp_mask_fn,
 * gr_allowed_fn eng_request.allowed, gr_accept_fn eng_request.accept (a
 * refused token marks the state failed, see gr_state_failed). */
void gr_mask_fn(void *ctx, float *logits, int32_t n_vocab);
const uint32_t *gr_allowed_fn(void *ctx);
void gr_accept_fn(void *ctx, int32_t token);

#endif
