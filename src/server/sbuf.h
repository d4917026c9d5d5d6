/* sbuf.h: a growable byte buffer for building HTTP bodies and SSE events.
 *
 * The server assembles every response as bytes appended to an sbuf (JSON
 * documents, `event:`/`data:` frames). Memory comes from the hone allocator.
 * An allocation failure is sticky: the buffer remembers it (sb->oom), later
 * appends do nothing, and the caller checks once at the end, so writers need
 * not test every append. data is always NUL-terminated when non-NULL. */
#ifndef HN_SERVER_SBUF_H
#define HN_SERVER_SBUF_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct sbuf {
    char *data;
    size_t len, cap;
    bool oom; /* an append failed; contents are incomplete */
} sbuf;

/* Appends n bytes. */
void sb_add(sbuf *b, const char *s, size_t n);
/* Appends a NUL-terminated string. */
void sb_adds(sbuf *b, const char *s);
/* Appends printf-style formatted text. */
void sb_addf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends s (n bytes) as a JSON string literal, quotes included. */
void sb_add_jstr(sbuf *b, const char *s, size_t n);
/* Appends the compact JSON encoding of v (nothing for NULL). */
void sb_add_json(sbuf *b, const json_t *v);
/* Removes the first n bytes (all if n >= len). */
void sb_consume(sbuf *b, size_t n);
/* Empties the buffer, keeping its memory (and clearing oom). */
void sb_reset(sbuf *b);
/* Frees the memory and zeroes the struct. */
void sb_free(sbuf *b);
/* Hands the bytes to the caller (who frees them with hn_free) and empties b;
 * returns NULL after an allocation failure (or for an empty buffer with no memory). */
char *sb_take(sbuf *b, size_t *len);

#endif
