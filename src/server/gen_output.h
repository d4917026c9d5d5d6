/* gen_output.h: one request's output pipeline, from sampled tokens to API bytes.
 *
 *   token ids -> streaming detokenizer (whole UTF-8 characters)
 *             -> stop strings (held back while a partial match is possible)
 *             -> tool-call / reasoning parser (template/toolcall.h)
 *             -> response writer (writer.h) -> sbuf
 *
 * The engine delivers tokens; the HTTP thread calls gen_token for each and
 * gen_end once, and sends whatever the writer appended. Legacy completions
 * skip the parser (raw text). A stop-string match tells the caller to cancel
 * the engine request; the end then reports finish "stop" with the string. */
#ifndef HN_SERVER_GEN_OUTPUT_H
#define HN_SERVER_GEN_OUTPUT_H

#include <stdbool.h>
#include <stdint.h>

#include "../sched/engine.h"
#include "../template/toolcall.h"
#include "../tokenizer/tokenizer.h"
#include "api.h"
#include "sbuf.h"
#include "stopstr.h"
#include "writer.h"

typedef struct gen_opts {
    const tok_vocab *vocab;
    bool parse;              /* run the tool-call / reasoning parser (chat APIs) */
    tc_format format;        /* tool-call markup to parse (NONE: reasoning only) */
    unsigned tc_flags;       /* TC_FLAG_* */
    bool start_in_reasoning; /* the prompt ended inside <think> */
    const json_t *tools;     /* offered tools (for argument coercion), or NULL */
    char *const *stops;      /* borrowed */
    int n_stops;
    bool drop_output;        /* Anthropic max_tokens = 0 (cache warm-up): generate nothing visible */
    bool single_call;        /* parallel_tool_calls false: end the answer after the first call */
} gen_opts;

typedef struct gen_state gen_state;

/* Creates the pipeline writing through w (borrowed). NULL on out of memory. */
gen_state *gen_new(const gen_opts *o, wr_writer *w);
void gen_free(gen_state *g);

/* Feeds one generated token; appends API bytes to out. Returns true when a
 * stop string matched (the caller cancels the engine request; later tokens
 * are ignored). */
bool gen_token(gen_state *g, int32_t token, sbuf *out);

/* Ends the response: flushes held text, closes the parser, and writes the
 * closing events with the finish reason and usage from st. An engine error
 * (fin == ENG_FINISH_ERROR) becomes the API's error (errmsg). */
void gen_end(gen_state *g, eng_finish fin, const char *errmsg, const eng_req_stats *st, sbuf *out);

/* Whether the output ended early (a stop string, or the first call with single_call). */
bool gen_stopped(const gen_state *g);

#endif
