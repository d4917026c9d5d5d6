/* grammar_int.h: the compiled grammar's layout, private to src/sample/grammar*.c
 * (and the tests).
 *
 * code[] holds every rule as its alternatives, each a run of elements ended by
 * GR_ALT_END, the rule ended by GR_RULE_END. An element >= 0 is a byte set
 * (an index into sets), <= GR_REF_BASE a reference to rule GR_REF_BASE - v.
 * A matcher position is an index into code[]. */
#ifndef HN_GRAMMAR_INT_H
#define HN_GRAMMAR_INT_H

#include <stdint.h>

#include "grammar.h"

#define GR_ALT_END (-1)
#define GR_RULE_END (-2)
#define GR_REF_BASE (-3)
#define GR_REF(r) (GR_REF_BASE - (r))

typedef struct gr_set {
    uint32_t w[8];   /* bit b: byte b is in the set */
    uint32_t literal; /* 1: the set comes from literal text (control tokens may match it) */
} gr_set;

struct gr_grammar {
    int32_t *code;
    int32_t n_code;
    int32_t n_rules;
    int32_t root;
    int32_t *alt_off; /* [n_rules + 1]: rule r's alternatives are alts[alt_off[r] .. alt_off[r+1]) */
    int32_t *alts;    /* start positions of alternatives */
    gr_set *sets;
    int32_t n_sets;
};

/* gr_state_completion trying every byte of every configuration: the
 * reference its byte classes are tested against (test_grammar). */
int64_t gr_state_completion_ref(gr_state *s, char *out, size_t cap);

static inline int gr_set_has(const gr_set *s, unsigned b) { return (s->w[b >> 5] >> (b & 31)) & 1u; }

#endif
