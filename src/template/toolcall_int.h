/* toolcall_int.h: private to the toolcall module (toolcall*.c). The offered
 * tools and their schemas, lenient JSON, coercion to a schema, JSON text
 * helpers and a growable byte buffer. */
#ifndef HN_TEMPLATE_TOOLCALL_INT_H
#define HN_TEMPLATE_TOOLCALL_INT_H

#include <jansson.h>
#include <stddef.h>

#include "../core/status.h"

/* A growable byte buffer on the hone allocator; p is NUL-terminated when non-NULL. */
typedef struct {
    char *p;
    size_t n, cap;
} tc_buf;

/* Appends n bytes; returns HN_ERR_NOMEM on failure (the buffer is unchanged). */
hn_status tc_buf_add(tc_buf *b, const char *s, size_t n);
hn_status tc_buf_adds(tc_buf *b, const char *s);
void tc_buf_clear(tc_buf *b);
void tc_buf_free(tc_buf *b);
/* Appends s as the inside of a JSON string (no quotes): escapes what JSON
 * requires, replaces invalid UTF-8 with U+FFFD. */
hn_status tc_buf_add_escaped(tc_buf *b, const char *s, size_t n);

/* One offered tool: its name and its parameters schema (a JSON object or NULL). */
typedef struct {
    char *name;
    json_t *schema;
} tc_tool;

typedef struct {
    tc_tool *v;
    int n;
} tc_tools;

/* Reads the tools of a request (entries of unknown shape are skipped). */
hn_status tc_tools_load(tc_tools *t, const json_t *tools);
void tc_tools_free(tc_tools *t);
/* Returns the tool named name[0..len), or NULL. */
const tc_tool *tc_tools_find(const tc_tools *t, const char *name, size_t len);

/* Returns the schema of property `pname` of an object schema (borrowed), or NULL. */
const json_t *tc_schema_prop(const json_t *schema, const char *pname);
/* Returns non-zero when values of this schema are plain strings (streamable). */
int tc_schema_is_string(const json_t *schema);

/* Parses one JSON value from s[0..n) (leading whitespace skipped, trailing text
 * ignored), repairing single quotes, Python True/False/None, trailing commas and
 * raw control characters in strings; with close_open also unterminated strings,
 * objects and arrays. Returns a new reference or NULL. */
json_t *tc_json_parse_lenient(const char *s, size_t n, int close_open);

/* Coerces v (reference stolen) to schema (may be NULL); returns a new reference
 * (NULL only on allocation failure). */
json_t *tc_coerce(json_t *v, const json_t *schema);
/* Builds the value of a raw-text parameter (Qwen XML) for schema (may be NULL). */
json_t *tc_coerce_raw(const char *s, size_t n, const json_t *schema);

/* Appends the compact JSON text of v (key order kept; reals printed with the
 * fewest of 15/17 significant digits that round-trip). */
hn_status tc_buf_add_json(tc_buf *b, const json_t *v);

/* Incremental scan for the end of a JSON object/array (string-aware, either
 * quote style). Zero-initialise, then call with the growing text. */
typedef struct {
    size_t pos;
    int depth;
    char quote;
    int esc;
    int begun;
} tc_jscan;

/* Returns the offset one past the bracket that closes the first object/array of
 * s[0..n), or 0 while it is not complete. */
size_t tc_json_extent(const char *s, size_t n, tc_jscan *st);

#endif
