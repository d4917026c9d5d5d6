/* suffix.c: the online suffix automaton of suffix.h.
 *
 * States: len (longest string), link (suffix link), lastpos (end of a recent
 * occurrence), cnt (occurrences), head (first outgoing edge). Edges: a list
 * per state (to copy a state's edges when it is cloned) plus an open-
 * addressing hash of (state, token) -> edge for lookups. Capacities follow
 * the automaton's bounds (states <= 2n, edges <= 3n for n tokens), so an
 * append never grows anything mid-way: sfx_append grows first (all arrays,
 * or none on failure), then extends.
 *
 * The match (state m, length ml, end me) is the longest suffix of the text
 * that ends at an earlier position. It is advanced against the automaton
 * of the text before the new token is added (so the occurrence found ends
 * before the new one): either the same occurrence continues (the token that
 * followed it is the new token: ml + 1, which is then also the longest), or
 * the standard suffix-link descent finds the longest suffix that occurred.
 * Adding the token may clone the match's state; then the match moves to the
 * clone when its length fits the clone. */
#include "suffix.h"

#include <string.h>

#include "../core/alloc.h"

struct sfx_drafter {
    int32_t *tok;
    int32_t n, cap_tok;
    /* states, [cap_st] */
    int32_t *len, *link, *lastpos, *cnt, *head;
    int32_t n_st, cap_st;
    /* edges, [cap_e] */
    int32_t *e_from, *e_tok, *e_to, *e_next;
    int32_t n_e, cap_e;
    int32_t *hash; /* [hash_mask + 1] edge index or -1 */
    uint32_t hash_mask;
    int32_t last;        /* the state of the whole text */
    int32_t m, ml, me;   /* the match */
    int prop_cap;
};

static inline uint32_t hkey(int32_t s, int32_t t) {
    uint64_t x = ((uint64_t)(uint32_t)s << 32) | (uint32_t)t;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return (uint32_t)x;
}

/* Edge index of (s, t), or -1. */
static int32_t edge_find(const sfx_drafter *d, int32_t s, int32_t t) {
    for (uint32_t h = hkey(s, t) & d->hash_mask;; h = (h + 1) & d->hash_mask) {
        int32_t e = d->hash[h];
        if (e < 0) return -1;
        if (d->e_from[e] == s && d->e_tok[e] == t) return e;
    }
}

static inline int32_t trans(const sfx_drafter *d, int32_t s, int32_t t) {
    int32_t e = edge_find(d, s, t);
    return e < 0 ? -1 : d->e_to[e];
}

static void hash_put(sfx_drafter *d, int32_t e) {
    uint32_t h = hkey(d->e_from[e], d->e_tok[e]) & d->hash_mask;
    while (d->hash[h] >= 0) h = (h + 1) & d->hash_mask;
    d->hash[h] = e;
}

static void edge_add(sfx_drafter *d, int32_t s, int32_t t, int32_t to) {
    int32_t e = d->n_e++;
    d->e_from[e] = s;
    d->e_tok[e] = t;
    d->e_to[e] = to;
    d->e_next[e] = d->head[s];
    d->head[s] = e;
    hash_put(d, e);
}

static int32_t state_new(sfx_drafter *d, int32_t len, int32_t link, int32_t lastpos, int32_t cnt) {
    int32_t s = d->n_st++;
    d->len[s] = len;
    d->link[s] = link;
    d->lastpos[s] = lastpos;
    d->cnt[s] = cnt;
    d->head[s] = -1;
    return s;
}

/* Grows every array to hold cap_tok tokens; all or nothing. */
static hn_status grow(sfx_drafter *d, int32_t cap_tok) {
    int64_t cs = 2 * (int64_t)cap_tok + 2, ce = 3 * (int64_t)cap_tok + 4;
    uint64_t hc = 16;
    while (hc < 2 * (uint64_t)ce) hc <<= 1;
    if (hc > (1ull << 31)) return HN_ERR_NOMEM;
    int32_t *nt = hn_malloc(sizeof(int32_t) * (size_t)cap_tok);
    int32_t *st = hn_malloc(sizeof(int32_t) * 5 * (size_t)cs);
    int32_t *ed = hn_malloc(sizeof(int32_t) * 4 * (size_t)ce);
    int32_t *hs = hn_malloc(sizeof(int32_t) * (size_t)hc);
    if (!nt || !st || !ed || !hs) {
        hn_free(nt);
        hn_free(st);
        hn_free(ed);
        hn_free(hs);
        return HN_ERR_NOMEM;
    }
    if (d->n) memcpy(nt, d->tok, sizeof(int32_t) * (size_t)d->n);
    int32_t *arr_s[5] = {st, st + cs, st + 2 * cs, st + 3 * cs, st + 4 * cs};
    int32_t *old_s[5] = {d->len, d->link, d->lastpos, d->cnt, d->head};
    int32_t *arr_e[4] = {ed, ed + ce, ed + 2 * ce, ed + 3 * ce};
    int32_t *old_e[4] = {d->e_from, d->e_tok, d->e_to, d->e_next};
    for (int i = 0; i < 5; i++)
        if (d->n_st) memcpy(arr_s[i], old_s[i], sizeof(int32_t) * (size_t)d->n_st);
    for (int i = 0; i < 4; i++)
        if (d->n_e) memcpy(arr_e[i], old_e[i], sizeof(int32_t) * (size_t)d->n_e);
    hn_free(d->tok);
    hn_free(d->len); /* the state block starts at len, the edge block at e_from */
    hn_free(d->e_from);
    hn_free(d->hash);
    d->tok = nt;
    d->len = arr_s[0];
    d->link = arr_s[1];
    d->lastpos = arr_s[2];
    d->cnt = arr_s[3];
    d->head = arr_s[4];
    d->e_from = arr_e[0];
    d->e_tok = arr_e[1];
    d->e_to = arr_e[2];
    d->e_next = arr_e[3];
    d->hash = hs;
    d->hash_mask = (uint32_t)(hc - 1);
    memset(d->hash, 0xff, sizeof(int32_t) * (size_t)hc);
    for (int32_t e = 0; e < d->n_e; e++) hash_put(d, e);
    d->cap_tok = cap_tok;
    d->cap_st = (int32_t)cs;
    d->cap_e = (int32_t)ce;
    return HN_OK;
}

void sfx_reset(sfx_drafter *d) {
    d->n = d->n_st = d->n_e = 0;
    memset(d->hash, 0xff, sizeof(int32_t) * ((size_t)d->hash_mask + 1));
    d->last = state_new(d, 0, -1, -1, 0);
    d->m = 0;
    d->ml = 0;
    d->me = -1;
}

sfx_drafter *sfx_new(int32_t cap_tokens, int prop_cap) {
    sfx_drafter *d = hn_calloc(1, sizeof *d);
    if (!d) return NULL;
    d->prop_cap = prop_cap > 0 ? prop_cap : 64;
    if (grow(d, cap_tokens < 16 ? 16 : cap_tokens)) {
        sfx_free(d);
        return NULL;
    }
    sfx_reset(d);
    return d;
}

void sfx_free(sfx_drafter *d) {
    if (!d) return;
    hn_free(d->tok);
    hn_free(d->len);
    hn_free(d->e_from);
    hn_free(d->hash);
    hn_free(d);
}

/* Adds token c at position pos = n (the classic construction), with the
 * occurrence ends and counts kept along the new end's suffix links. */
static void extend(sfx_drafter *d, int32_t c) {
    int32_t pos = d->n;
    int32_t cur = state_new(d, d->len[d->last] + 1, 0, pos, 1);
    int32_t p = d->last;
    while (p >= 0 && trans(d, p, c) < 0) {
        edge_add(d, p, c, cur);
        p = d->link[p];
    }
    if (p >= 0) {
        int32_t q = trans(d, p, c);
        if (d->len[p] + 1 == d->len[q]) {
            d->link[cur] = q;
        } else {
            int32_t cl = state_new(d, d->len[p] + 1, d->link[q], d->lastpos[q], d->cnt[q]);
            for (int32_t e = d->head[q]; e >= 0; e = d->e_next[e]) edge_add(d, cl, d->e_tok[e], d->e_to[e]);
            for (; p >= 0; p = d->link[p]) {
                int32_t e = edge_find(d, p, c);
                if (e < 0 || d->e_to[e] != q) break;
                d->e_to[e] = cl;
            }
            d->link[q] = d->link[cur] = cl;
            if (d->m == q && d->ml <= d->len[cl]) d->m = cl; /* the match's strings moved to the clone */
        }
    }
    d->last = cur;
    /* every state on cur's suffix path gains the end pos */
    int steps = 0;
    for (int32_t s = d->link[cur]; s > 0 && steps < d->prop_cap; s = d->link[s], steps++) {
        d->lastpos[s] = pos;
        d->cnt[s]++;
    }
    d->tok[d->n++] = c;
}

hn_status sfx_append(sfx_drafter *d, int32_t c, hn_err *err) {
    if (c < 0) return hn_errf(err, HN_ERR_INVALID, "suffix drafter: negative token %d", (int)c);
    if (d->n + 1 > d->cap_tok) {
        if (d->cap_tok > (1 << 28)) return hn_errf(err, HN_ERR_NOMEM, "suffix drafter: too many tokens");
        if (grow(d, d->cap_tok * 2)) return hn_errf(err, HN_ERR_NOMEM, "suffix drafter: out of memory");
    }
    /* the match, against the automaton of the text without c */
    if (d->ml > 0 && d->me + 1 < d->n && d->tok[d->me + 1] == c) {
        d->m = trans(d, d->m, c);
        d->ml++;
        d->me++;
    } else {
        int32_t m = d->m, ml = d->ml;
        while (m > 0 && trans(d, m, c) < 0) {
            m = d->link[m];
            ml = d->len[m];
        }
        int32_t t = trans(d, m, c);
        if (t >= 0) {
            d->m = t;
            d->ml = ml + 1;
            d->me = d->lastpos[t];
        } else {
            d->m = 0;
            d->ml = 0;
            d->me = -1;
        }
    }
    extend(d, c);
    return HN_OK;
}

hn_status sfx_append_n(sfx_drafter *d, const int32_t *tok, int32_t n, hn_err *err) {
    for (int32_t i = 0; i < n; i++) {
        hn_status st = sfx_append(d, tok[i], err);
        if (st) return st;
    }
    return HN_OK;
}

int32_t sfx_len(const sfx_drafter *d) { return d->n; }
int32_t sfx_match_len(const sfx_drafter *d) { return d->ml; }
int32_t sfx_match_end(const sfx_drafter *d) { return d->ml > 0 ? d->me : -1; }
int32_t sfx_match_count(const sfx_drafter *d) { return d->ml > 0 ? d->cnt[d->m] : 0; }

int32_t sfx_propose(const sfx_drafter *d, int32_t min_match, int32_t max_k, int32_t *out, float *p) {
    if (d->ml <= 0 || d->ml < min_match || max_k <= 0) return 0;
    int32_t n = d->n, e = d->me, k = 0;
    /* the continuation of the earlier occurrence; past the text's end it
     * repeats itself with period n - 1 - e (the pattern continues) */
    int32_t avail = n - 1 - e;
    if (avail <= 0) return 0;
    for (; k < max_k; k++) out[k] = k < avail ? d->tok[e + 1 + k] : out[k - avail];
    if (p) {
        /* how often each drafted token followed its context: walk the
         * automaton along the draft; an occurrence ending at the text's end
         * has no continuation, so it is not counted in the context's */
        int32_t s = d->m;
        float last = 0.5f;
        for (int32_t j = 0; j < k; j++) {
            int32_t t = s >= 0 ? trans(d, s, out[j]) : -1;
            if (t < 0) {
                p[j] = last;
                s = -1;
                continue;
            }
            int32_t ctx = d->cnt[s] - (d->lastpos[s] == n - 1 ? 1 : 0);
            float v = ctx > 0 ? (float)d->cnt[t] / (float)ctx : 1.0f;
            p[j] = last = v > 1.0f ? 1.0f : v;
            s = t;
        }
    }
    return k;
}

size_t sfx_bytes(const sfx_drafter *d) {
    return sizeof *d + sizeof(int32_t) * ((size_t)d->cap_tok + 5 * (size_t)d->cap_st + 4 * (size_t)d->cap_e +
                                          (size_t)d->hash_mask + 1);
}
