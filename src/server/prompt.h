/* prompt.h: from a normalised chat request to prompt tokens.
 *
 * A prm_model holds what every request needs from the model file: the
 * compiled chat template (tokenizer.chat_template), the vocabulary, the BOS /
 * EOS texts the template may print, and the tool-call / reasoning format
 * detected from the template (template/toolcall.h). prm_render renders the
 * request's messages and tools with add_generation_prompt (Hugging Face
 * apply_chat_template semantics); a template that raises on a mid-conversation
 * system message gets the request again with those demoted to user text. A
 * final assistant message is continued: the prompt ends with its text.
 * Legacy completions use their prompt text (or token ids) as is. Errors are
 * the client's (400), with the template's own message. */
#ifndef HN_SERVER_PROMPT_H
#define HN_SERVER_PROMPT_H

#include <stdbool.h>
#include <stdint.h>

#include "../core/status.h"
#include "../gguf/gguf.h"
#include "../template/template.h"
#include "../template/toolcall.h"
#include "../tokenizer/tokenizer.h"
#include "api.h"
#include "creq.h"
#include "sbuf.h"

typedef struct prm_model {
    tpl_template *tpl;      /* NULL: the model has no chat template (ChatML is used) */
    char *tpl_src;
    const tok_vocab *vocab; /* borrowed */
    char *bos_text, *eos_text;
    tc_detection det;
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
} prm_prompt;

/* Renders (chat APIs) and tokenizes r into p. May rewrite r->messages
 * (system demotion). On failure fills e (APIE_INVALID for template errors,
 * APIE_INTERNAL for memory). */
bool prm_build(const prm_model *pm, creq *r, prm_prompt *p, api_error *e);
void prm_prompt_free(prm_prompt *p);

#endif
