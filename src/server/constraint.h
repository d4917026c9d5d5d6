/* constraint.h: constrained decoding for a request, through the grammar
 * module (sample/grammar.h) and eng_request.allowed/accept: each step the
 * engine applies the grammar state's allowed-token bitmask to the logits row.
 *
 *   tool_choice required / named (with tools, in a known tool-call format):
 *       the whole answer is one or more calls (one when parallel_tool_calls
 *       is false) in the model's own markup, optionally after a <think> block
 *   response_format json_schema / Anthropic output_config.format: JSON of the schema
 *   response_format json_object: any JSON object
 * The grammar's vocabulary index is built once per server (on first use) and
 * shared; each request gets its own matcher state, which lives until the
 * engine has ended the request. Within the last tokens of max_tokens the
 * answer is steered along the grammar's shortest completion (the bitmask then
 * holds only the next token of it), so a forced call (or JSON value) is
 * closed rather than cut off. */
#ifndef HN_SERVER_CONSTRAINT_H
#define HN_SERVER_CONSTRAINT_H

#include <stdbool.h>

#include "../sched/engine.h"
#include "api.h"
#include "creq.h"
#include "prompt.h"

typedef struct cst_shared cst_shared; /* per server: the vocabulary index */
typedef struct cst_req cst_req;       /* per request: grammar + matcher */

/* Whether this build can constrain decoding (always, since sample/grammar). */
bool cst_available(void);
/* Per-server state (cheap: the index is built on first use). NULL on no memory. */
cst_shared *cst_shared_new(const prm_model *pm);
void cst_shared_free(cst_shared *s);

/* Builds the constraint a request asks for, if any, and installs it in er
 * (allowed, accept, mask_ctx; er->max_tokens must already be final); *out is
 * NULL when the request is unconstrained.
 * Fails (400) for a named tool that is not offered or a schema that cannot be
 * compiled. */
bool cst_attach(cst_shared *s, const creq *r, const prm_prompt *p, eng_request *er, cst_req **out, api_error *e);
/* Frees a request's constraint (only after the engine has ended the request). */
void cst_req_free(cst_req *c);

#endif
