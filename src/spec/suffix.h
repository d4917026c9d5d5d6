/* suffix.h: the model-free drafter of speculative decoding: a suffix
 * automaton over a request's own tokens (prompt, then the reply as it grows),
 * proposing what followed the longest earlier occurrence of the text's
 * current ending.
 *
 * Agents re-emit what they have read (a file comes back with a few lines
 * changed, a tool result is quoted), so the continuation of the longest
 * suffix of the text that occurred before is often the next tokens. The
 * automaton is built online (amortised O(1) per token) and keeps, per state,
 * the end of its most recent occurrence and its number of occurrences, both
 * updated along at most `prop_cap` suffix links per token (so on very
 * self-similar text they are a valid occurrence and a lower bound, not
 * exact). With them a draft is the continuation of that occurrence (wrapped
 * periodically when it runs into the text's own end, as a repeated pattern
 * continues), and each drafted token carries the empirical probability that
 * it follows its context: occurrences of context+token / occurrences of the
 * context that have a continuation. The controller (sched/) turns those into
 * an expected accepted length and chooses how many to verify.
 *
 * Memory: about 120 bytes per token (at most 2n states, 3n transitions, a
 * hash of the transitions), in arrays that grow by doubling; sfx_new sizes
 * them for a first capacity, so within it appending allocates nothing. The
 * structure holds its own copy of the tokens. Not thread-safe (one request's
 * engine thread owns it). */
#ifndef HN_SPEC_SUFFIX_H
#define HN_SPEC_SUFFIX_H

#include <stddef.h>
#include <stdint.h>

#include "../core/status.h"

typedef struct sfx_drafter sfx_drafter;

/* A drafter sized for cap_tokens tokens before its first growth (at least
 * 16); prop_cap (<= 0: 64) bounds the suffix-link walk that keeps
 * occurrence ends and counts. NULL on no memory. */
sfx_drafter *sfx_new(int32_t cap_tokens, int prop_cap);
void sfx_free(sfx_drafter *d);
/* Forgets every token (keeps the memory). */
void sfx_reset(sfx_drafter *d);

/* Appends one token (any int32 >= 0). HN_ERR_NOMEM if the arrays had to grow
 * and could not (the drafter is unchanged then), HN_ERR_INVALID for a
 * negative token. */
hn_status sfx_append(sfx_drafter *d, int32_t tok, hn_err *err);
/* Appends n tokens (stops at the first failure). */
hn_status sfx_append_n(sfx_drafter *d, const int32_t *tok, int32_t n, hn_err *err);
/* Tokens appended so far. */
int32_t sfx_len(const sfx_drafter *d);

/* The current match: the length of the longest suffix of the text that also
 * ends at an earlier position (0: none), and that earlier end (-1: none). */
int32_t sfx_match_len(const sfx_drafter *d);
int32_t sfx_match_end(const sfx_drafter *d);
/* How often the matched suffix occurs in the text, its current end included
 * (exact while the suffix-link walks stay within prop_cap). */
int32_t sfx_match_count(const sfx_drafter *d);

/* Proposes at most max_k tokens into out (and, when p is not NULL, p[j]: the
 * estimated probability that out[j] is right given out[0..j) are), if the
 * current match is at least min_match tokens long; returns how many (0: no
 * draft). Allocates nothing. */
int32_t sfx_propose(const sfx_drafter *d, int32_t min_match, int32_t max_k, int32_t *out, float *p);

/* Bytes the drafter holds now. */
size_t sfx_bytes(const sfx_drafter *d);

#endif
