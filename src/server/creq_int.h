/* creq_int.h: helpers shared by the creq_*.c mappers (private to creq). */
#ifndef HN_SERVER_CREQ_INT_H
#define HN_SERVER_CREQ_INT_H

#include "creq.h"
#include "sbuf.h"

/* Builds the normalised message list: leading system text is collected and
 * becomes message 0 when the first other message arrives (or at the end). */
typedef struct creq_msgs {
    json_t *arr;
    sbuf sys;        /* leading system text so far */
    bool has_sys;    /* some leading system text was given (maybe empty) */
    bool started;    /* a non-system message was added */
    sbuf reasoning;  /* Responses: reasoning items waiting for their assistant turn */
    bool has_reasoning;
    /* text appended to the last assistant message (text_of), put into its
     * content when another message follows or at the end: appending many
     * texts to one turn copies each once */
    sbuf text;
    json_t *text_of;
    /* the call names by id, for tool results: of the calls in the message
     * turn_of (its first call with an id), and of the earlier messages (the
     * latest holding the id): creq_call_name without a scan per result */
    json_t *names, *turn_names;
    const json_t *turn_of;
} creq_msgs;

bool creq_msgs_init(creq_msgs *m);
/* Adds system text: merged into the leading system message while no other
 * message was added, else kept in place as a system message. */
bool creq_msgs_system(creq_msgs *m, const char *text, size_t len);
/* Appends a message object (steals the reference). */
bool creq_msgs_push(creq_msgs *m, json_t *msg);
/* The last message if it has this role, else NULL (borrowed). */
json_t *creq_msgs_last(creq_msgs *m, const char *role);
/* Adds a tool call to the last assistant message (creating one with content
 * "" if the last message is not an assistant). args_text may be NULL when
 * args (borrowed) is given. */
bool creq_msgs_call(creq_msgs *m, const char *id, const char *name, const char *args_text,
                    const json_t *args);
/* The function name of tool call id (borrowed), from the latest message of
 * msgs holding a named call with that id (its first one), or NULL. */
const char *creq_call_name(const json_t *msgs, const char *id);
/* Marks tool message tm (NULL: nothing happens) as the result of call id (may
 * be NULL): sets "tool_call_id" to id and "name" to name, or when name is
 * NULL to the name of the call it answers (what creq_call_name over m's
 * messages so far returns, looked up in m's index of the calls). */
void creq_tool_result(creq_msgs *m, json_t *tm, const char *id, const char *name);
/* Appends text to the last assistant message (creating one), after a "\n"
 * when it has text; sets its reasoning_content when reasoning is given. */
bool creq_msgs_assistant_text(creq_msgs *m, const char *text, size_t len, const char *reasoning);
/* Adds reasoning text (Responses) for the next assistant message, after a
 * "\n" when it is not empty and some is waiting already. */
bool creq_msgs_reasoning(creq_msgs *m, const char *text, size_t len);
/* Finishes the list into r->messages (and frees m's scratch). */
bool creq_msgs_finish(creq_msgs *m, creq *r);
void creq_msgs_free(creq_msgs *m);

/* A new message {"role": role, "content": text}. */
json_t *creq_msg(const char *role, const char *text, size_t len);

/* Text of a content value: a string, or an array of parts whose text is taken
 * from "text" (types text/input_text/output_text/..., others skipped), joined
 * with "\n"; null is "". Returns false if the value has another type. */
bool creq_content_text(const json_t *content, sbuf *out);

/* Parses tool-call arguments text into a JSON value (object preferred); a
 * text that is not JSON stays a string; empty text is {}. New reference. */
json_t *creq_parse_args(const char *text);

/* Reads the shared sampling/limit fields: temperature, top_p, top_k, min_p,
 * seed, presence_penalty, frequency_penalty, stream. */
bool creq_sampling(const json_t *body, creq *r, api_error *e);
/* Reads an optional non-negative integer field into *out (unchanged if absent/null). */
bool creq_int_field(const json_t *body, const char *key, int32_t *out, api_error *e);
/* Adds stop strings from a string or array value (null: none). */
bool creq_stops(const json_t *v, const char *param, creq *r, api_error *e);
/* Copies an OpenAI-form or flat (Responses) function tool into OpenAI form;
 * returns NULL for non-function tools (skipped). New reference. */
json_t *creq_function_tool(const char *name, const char *description, const json_t *parameters,
                           const json_t *src);
/* Sets r->schema / r->format from a json_schema object holding "schema". */
bool creq_set_schema(creq *r, const json_t *schema_holder, const char *param, api_error *e);
/* A copy of a string field, or NULL if absent; false (with e) if not a string. */
bool creq_str_field(const json_t *o, const char *key, char **out, api_error *e);
char *creq_strdup(const char *s);
/* Sets an out-of-memory error and returns false. */
static inline bool creq_oom(api_error *e) {
    api_seterr(e, APIE_INTERNAL, NULL, "out of memory");
    return false;
}
/* Zeroes r and sets the defaults (max_tokens -1, thinking -1, parallel calls on). */
void creq_init(creq *r, api_kind api);

#endif
