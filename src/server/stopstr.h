/* stopstr.h: stop strings applied to streamed text.
 *
 * Text is fed in arbitrary chunks; what cannot be the start of a stop string
 * is released at once, and a tail that might still become one is held back
 * until the next chunk decides it. On a match, the text before the earliest
 * match is released and the rest is dropped. Held bytes never split a UTF-8
 * character that precedes them (stop strings start at a character). */
#ifndef HN_SERVER_STOPSTR_H
#define HN_SERVER_STOPSTR_H

#include <stddef.h>

#include "sbuf.h"

typedef struct ss_matcher {
    char *const *stops; /* borrowed, n of them (empty strings ignored) */
    int n;
    sbuf hold;
    int matched;        /* index of the matched stop, or -1 */
} ss_matcher;

/* Starts matching the given stop strings (borrowed: they must outlive m). */
void ss_init(ss_matcher *m, char *const *stops, int n);
/* Feeds text; appends releasable text to out. Returns the index of the stop
 * string that matched (after which further feeds release nothing), or -1. */
int ss_feed(ss_matcher *m, const char *s, size_t n, sbuf *out);
/* Releases the held tail (the stream ended without a match). */
void ss_flush(ss_matcher *m, sbuf *out);
void ss_free(ss_matcher *m);

#endif
