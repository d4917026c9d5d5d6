/* writer_int.h: the writer's state, shared by writer.c and wr_*.c (private). */
#ifndef HN_SERVER_WRITER_INT_H
#define HN_SERVER_WRITER_INT_H

#include "writer.h"

typedef struct wr_call {
    char id[64];      /* call_... */
    char item_id[40]; /* Responses fc_... */
    char *name;
    sbuf args;
    int output_index; /* Responses */
    int block;        /* Anthropic content block index */
    bool custom;      /* Responses freeform tool */
    bool ended;
} wr_call;

enum { WR_OPEN_NONE, WR_OPEN_TEXT, WR_OPEN_THINKING, WR_OPEN_TOOL };

struct wr_writer {
    api_kind api;
    bool stream, include_usage;
    char id[48];
    char *model;
    int64_t created;
    json_t *custom_tools;
    bool begun, ended;

    sbuf text, reasoning; /* everything so far (non-stream bodies, done events) */
    wr_call *calls;
    int n_calls, cap_calls;

    /* Anthropic: the open block */
    int open, n_blocks;
    /* Responses: open item, its id and position; finished items for the final object */
    int seq;
    int n_items;
    char item_id[40];
    int item_index;
    sbuf item_text; /* text of the open message/reasoning item */
    json_t *items;
    int32_t n_prompt;
};

wr_call *wr_call_at(wr_writer *w, int index);

/* Appends ,"speculative":{...} (drafted, accepted, steps saved) inside a usage
 * object when the request drafted anything; nothing otherwise. */
void wr_usage_spec(const api_usage *u, sbuf *out);

void wr_anth_begin(wr_writer *w, sbuf *out);
void wr_anth_text(wr_writer *w, sbuf *out, const char *s, size_t n, bool thinking);
void wr_anth_call_start(wr_writer *w, sbuf *out, wr_call *c);
void wr_anth_call_args(wr_writer *w, sbuf *out, wr_call *c, const char *s, size_t n);
void wr_anth_call_end(wr_writer *w, sbuf *out, wr_call *c);
void wr_anth_end(wr_writer *w, sbuf *out, api_finish fin, const char *stop_seq, const api_usage *u);
void wr_anth_fail(wr_writer *w, sbuf *out, const api_error *e);

void wr_resp_begin(wr_writer *w, sbuf *out);
void wr_resp_text(wr_writer *w, sbuf *out, const char *s, size_t n, bool reasoning);
void wr_resp_call_start(wr_writer *w, sbuf *out, wr_call *c);
void wr_resp_call_args(wr_writer *w, sbuf *out, wr_call *c, const char *s, size_t n);
void wr_resp_call_end(wr_writer *w, sbuf *out, wr_call *c);
void wr_resp_end(wr_writer *w, sbuf *out, api_finish fin, const char *stop_seq, const api_usage *u);
void wr_resp_fail(wr_writer *w, sbuf *out, const api_error *e);

#endif
