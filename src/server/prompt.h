/* prompt.h: from a normalised chat request to prompt tokens.
 *
 * A prm_model holds what every request needs from the model file: its chat
 * template (template/chat.h: tokenizer.chat_template with the probes that make
 * renders prefix-stable; ChatML when the file has none), the vocabulary, and
 * the tool-call / reasoning format detected for the template. prm_build renders
 * the request's messages and tools with add_generation_prompt through
 * chat_render (mid-conversation system messages in place, or demoted in place
 * when the template refuses them) and tokenizes with chat_tokenize, then
 * finds where the likely next turns stop repeating the prompt
 * (chat_resume_points, when pm->resume: a hybrid model keeps its state there). A final
 * assistant message is continued: the prompt ends with its text (and no
 * resume points are found for it). Legacy
 * completions use their prompt text (or token ids) as is. Errors are the
 * client's (400), with the template's own message. */
#ifndef HN_SERVER_PROMPT_H
#define HN_SERVER_PROMPT_H

#include <stdbool.h>
#include <stdint.h>

#include "../core/status.h"
#include "../gguf/gguf.h"
#include "../template/chat.h"
#include "../template/toolcall.h"
#include "../tokenizer/tokenizer.h"
#include "api.h"
#include "creq.h"
#include "sbuf.h"

typedef struct prm_model {
    chat_template *ct;
    const tok_vocab *vocab; /* borrowed */
    tc_detection det;
    bool resume;            /* find the prompts' resume points (set for a hybrid model with the prefix
                               cache, which keeps states there; prm_model_init leaves it false) */
} prm_model;

/* Reads the chat template and special-token texts of a model (vocab is
 * borrowed and must outlive pm). Fails if the template does not compile. */
hn_status prm_model_init(prm_model *pm, const gguf_ctx *g, const tok_vocab *vocab, hn_err *err);
void prm_model_free(prm_model *pm);

/* The rendered prompt of one request. */
typedef struct prm_prompt {
    sbuf text;
    int32_t *tokens; /* hn_malloc'd */
    int32_t n_tokens;
    bool start_in_reasoning; /* the prompt ends inside an open <think> */
    size_t *spans;           /* text from the request spelling control tokens (chat_prompt.spans) */
    size_t n_spans;
    int32_t resume[CHAT_RESUME_MAX]; /* chat APIs: where a next turn's prompt may stop repeating this one
                                        (chat_resume_points: tokens it repeats), distinct, ascending */
    int n_resume;
} prm_prompt;

/* Renders (chat APIs) and tokenizes r into p. On failure fills e (APIE_INVALID for template errors,
 * APIE_INTERNAL for memory). */
bool prm_build(const prm_model *pm, creq *r, prm_prompt *p, api_error *e);
void prm_prompt_free(prm_prompt *p);

#endif
