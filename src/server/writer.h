/* writer.h: response bodies and SSE event streams for each API.
 *
 * The generation pipeline reports what the model produced as a small set of
 * events (visible text, reasoning text, tool call start / argument fragment /
 * end, the end with a finish reason and usage); a writer turns them into the
 * exact bytes of one API's response, appended to an sbuf the HTTP layer
 * drains:
 *
 *   OpenAI chat, stream: `data: {chunk}` frames: a first chunk with the role,
 *     content / reasoning_content deltas, tool_calls deltas (id, type, name
 *     only in a call's first fragment; a distinct index per call), a chunk
 *     with finish_reason, a usage chunk (choices: []) when include_usage, then
 *     `data: [DONE]`. Not streaming: one chat.completion object.
 *   Legacy completions: text_completion chunks / object.
 *   Anthropic: message_start, then per block content_block_start / _delta
 *     (text_delta, thinking_delta then one signature_delta, input_json_delta)
 *     / _stop with increasing indices (a block is closed before the next one
 *     opens), message_delta (stop_reason, cumulative usage with
 *     cache_read_input_tokens), message_stop; `ping` as keep-alive.
 *   Responses: response.created, response.in_progress, then per output item
 *     output_item.added ... output_item.done (reasoning items with summary
 *     text events, message items with content_part / output_text events,
 *     function_call items with function_call_arguments events), and
 *     response.completed (or response.incomplete at max_output_tokens) with
 *     usage; every event has a sequence_number.
 * Non-streaming writers buffer the events and write the whole JSON at the end.
 * A writer is used by one thread at a time; allocation failures are sticky in
 * the sbuf (out->oom). */
#ifndef HN_SERVER_WRITER_H
#define HN_SERVER_WRITER_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api.h"
#include "sbuf.h"

typedef struct wr_meta {
    api_kind api;
    bool stream;
    bool include_usage;         /* OpenAI chat/completions streams: a final usage chunk */
    const char *model;          /* the model name to report */
    int64_t created;            /* unix seconds; 0: now */
    const json_t *custom_tools; /* Responses: names (strings) of freeform tools, or NULL */
} wr_meta;

typedef struct wr_writer wr_writer;

/* Creates a writer (copies what it needs from m); NULL when out of memory. */
wr_writer *wr_new(const wr_meta *m);
void wr_free(wr_writer *w);
/* The response id ("chatcmpl-...", "cmpl-...", "msg_...", "resp_..."). */
const char *wr_id(const wr_writer *w);

/* Opens the response (stream: the first events, sent at once; n_prompt is
 * the prompt's token count as far as known). */
void wr_begin(wr_writer *w, sbuf *out, int32_t n_prompt);
/* Visible text. */
void wr_text(wr_writer *w, sbuf *out, const char *s, size_t n);
/* Reasoning text. */
void wr_reasoning(wr_writer *w, sbuf *out, const char *s, size_t n);
/* A tool call begins (index 0, 1, ... in order; id "call_..."). */
void wr_call_start(wr_writer *w, sbuf *out, int index, const char *id, const char *name);
/* A fragment of the call's arguments JSON. */
void wr_call_args(wr_writer *w, sbuf *out, int index, const char *s, size_t n);
/* The call's arguments are complete. */
void wr_call_end(wr_writer *w, sbuf *out, int index);
/* Something to keep an idle stream alive (nothing when not streaming). */
void wr_keepalive(wr_writer *w, sbuf *out);
/* Ends the response: stream: the closing events; else the whole body.
 * stop_seq is the matched stop string for API_FIN_STOP_SEQ (may be NULL). */
void wr_end(wr_writer *w, sbuf *out, api_finish fin, const char *stop_seq, const api_usage *u);
/* Ends a started stream with an error event in the API's format. */
void wr_fail(wr_writer *w, sbuf *out, const api_error *e);
/* Number of tool calls seen. */
int wr_ncalls(const wr_writer *w);

#endif
