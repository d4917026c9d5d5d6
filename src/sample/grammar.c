/* grammar.c: matching a compiled grammar against the vocabulary, token by token.
 *
 * Vocabulary index: the token strings sorted and laid out as a byte trie in
 * preorder (node = byte, depth, index just past its subtree, the tokens that
 * end there), so a walk is one forward pass that skips dead subtrees. Control
 * tokens get a second trie, walked in "literal" mode.
 *
 * Configurations: a set of stacks of grammar positions, canonical (every top
 * is a byte set, or the stack is empty = complete), sorted and deduplicated,
 * interned in a per-state pool. trans(c, byte, mode) -> c' is memoised in a
 * hash table, so the automaton is a DFA built lazily over the configurations
 * actually met; a byte that no top set of c holds (the union is kept with c)
 * is dead without advancing or a memo entry (most bytes at the top of a
 * vocabulary walk). A configuration's token mask (the allowed-token bitmask of
 * sample.h: (n_vocab + 31) / 32 little-endian uint32 words) is cached in one
 * of GR_SLOTS slots; one more all-zero mask stands for "nothing" (after the
 * end). When the tables outgrow their limits they are flushed
 * between steps (only the current configuration survives). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/alloc.h"
#include "../tokenizer/tokenizer.h"
#include "grammar_int.h"
#include "sample.h"

#define GR_MAX_DEPTH 256        /* frames per stack (JSON nesting ~ depth / 2) */
#define GR_MAX_STACKS 512       /* stacks per configuration */
#define GR_SCRATCH (1 << 16)    /* ints for expansion frames */
#define GR_SLOTS 32             /* cached masks */
#define GR_MAX_CFGS (1 << 16)   /* flush beyond these */
#define GR_MAX_TRANS (1 << 22)
#define GR_MAX_POOL (1 << 24)

typedef struct {
    int32_t end;       /* preorder index just past this node's subtree */
    int32_t tok_first; /* into toks[] */
    int32_t tok_n;
    uint16_t depth;    /* 1 for children of the root */
    uint8_t byte;
} gr_node;

typedef struct {
    gr_node *nodes;
    int32_t n_nodes;
    int32_t *toks;
} gr_trie;

struct gr_vocab {
    int32_t n_vocab;
    int32_t max_len;
    uint8_t *flags;
    char *pool;
    int64_t *off;
    int32_t *len;
    gr_trie trie, strie; /* normal tokens; control tokens (literal only) */
    int32_t *eog;
    int32_t n_eog;
};

typedef struct {
    int64_t off;       /* into pool: n_stacks, then per stack: len, frames */
    int32_t n_ints;
    uint32_t hash;
    int32_t slot;      /* mask slot or -1 */
    uint8_t accepting;
    uint32_t live[8];  /* bit b: some stack's top set holds byte b (else trans is dead) */
} gr_cfg;

typedef struct {
    int64_t off;
    int32_t len;
    uint32_t hash;
} gr_sref;

struct gr_state {
    const gr_grammar *g;
    const gr_vocab *v;
    int32_t start, cur;
    bool finished, failed, overflow;
    hn_status mem;
    /* interned configurations */
    int32_t *pool;
    int64_t pool_n, pool_cap;
    gr_cfg *cfgs;
    int32_t n_cfgs, cap_cfgs;
    int32_t *ht;       /* cfg ids, -1 empty */
    int32_t ht_cap;
    /* transition memo: key (cfg << 9 | mode << 8 | byte) + 1, 0 = empty */
    uint64_t *tk;
    int32_t *tv;
    int64_t t_n, t_cap;
    /* stack-set builder */
    int32_t *sb;
    int64_t sb_n, sb_cap;
    gr_sref *sr;
    int32_t n_sr, cap_sr;
    int32_t *scratch;
    int32_t scratch_top;
    /* masks */
    uint32_t *masks; /* (GR_SLOTS + 1) x words; the last stays all zero */
    int32_t words;
    int32_t slot_cfg[GR_SLOTS];
    int64_t slot_cost[GR_SLOTS]; /* trie nodes its walk visited, aged: cheap masks are evicted first */
    int32_t *walk;   /* [max_len + 1] */
    int64_t n_masks;
};

/* ---- vocabulary ---- */

typedef struct {
    const uint8_t *p;
    int32_t len, id;
} tok_ref;

static int cmp_tok(const void *a, const void *b) {
    const tok_ref *x = a, *y = b;
    int32_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->p, y->p, (size_t)n);
    if (c) return c;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static hn_status build_trie(gr_trie *t, tok_ref *r, int32_t n, int32_t max_len) {
    qsort(r, (size_t)n, sizeof *r, cmp_tok);
    int64_t total = 0;
    for (int32_t i = 0; i < n; i++) total += r[i].len;
    t->nodes = hn_malloc((size_t)(total ? total : 1) * sizeof *t->nodes);
    t->toks = hn_malloc((size_t)(n ? n : 1) * sizeof *t->toks);
    int32_t *path = hn_malloc(((size_t)max_len + 1) * sizeof *path);
    if (!t->nodes || !t->toks || !path) {
        hn_free(path);
        return HN_ERR_NOMEM;
    }
    int32_t nn = 0, depth = 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t lcp = 0;
        if (i) {
            int32_t m = r[i - 1].len < r[i].len ? r[i - 1].len : r[i].len;
            while (lcp < m && r[i - 1].p[lcp] == r[i].p[lcp]) lcp++;
        }
        if (lcp > depth) lcp = depth;
        while (depth > lcp) t->nodes[path[depth--]].end = nn;
        for (; depth < r[i].len; depth++) {
            gr_node *nd = &t->nodes[nn];
            nd->byte = r[i].p[depth];
            nd->depth = (uint16_t)(depth + 1);
            nd->tok_first = i;
            nd->tok_n = 0;
            nd->end = -1;
            path[depth + 1] = nn++;
        }
        gr_node *at = &t->nodes[path[r[i].len]];
        if (!at->tok_n) at->tok_first = i;
        at->tok_n++;
        t->toks[i] = r[i].id;
    }
    while (depth > 0) t->nodes[path[depth--]].end = nn;
    t->n_nodes = nn;
    hn_free(path);
    return HN_OK;
}

void gr_vocab_free(gr_vocab *v) {
    if (!v) return;
    hn_free(v->flags);
    hn_free(v->pool);
    hn_free(v->off);
    hn_free(v->len);
    hn_free(v->trie.nodes);
    hn_free(v->trie.toks);
    hn_free(v->strie.nodes);
    hn_free(v->strie.toks);
    hn_free(v->eog);
    hn_free(v);
}

int32_t gr_vocab_n(const gr_vocab *v) { return v ? v->n_vocab : 0; }

hn_status gr_vocab_new(int32_t n_vocab, const char *const *bytes, const int32_t *lens, const uint8_t *flags,
                       gr_vocab **out, hn_err *err) {
    *out = NULL;
    if (n_vocab < 1 || !bytes || !lens) return hn_errf(err, HN_ERR_INVALID, "grammar: empty vocabulary");
    int64_t total = 0;
    int32_t max_len = 1;
    for (int32_t i = 0; i < n_vocab; i++) {
        if (lens[i] < 0 || lens[i] > 65535 || (lens[i] && !bytes[i]))
            return hn_errf(err, HN_ERR_INVALID, "grammar: token %d has a bad length", i);
        total += lens[i];
        if (lens[i] > max_len) max_len = lens[i];
    }
    gr_vocab *v = hn_calloc(1, sizeof *v);
    tok_ref *r = NULL, *sr = NULL;
    if (!v) goto nomem;
    v->n_vocab = n_vocab;
    v->max_len = max_len;
    v->flags = hn_calloc((size_t)n_vocab, 1);
    v->pool = hn_malloc((size_t)(total ? total : 1));
    v->off = hn_malloc((size_t)n_vocab * sizeof *v->off);
    v->len = hn_malloc((size_t)n_vocab * sizeof *v->len);
    v->eog = hn_malloc((size_t)n_vocab * sizeof *v->eog);
    r = hn_malloc((size_t)n_vocab * sizeof *r);
    sr = hn_malloc((size_t)n_vocab * sizeof *sr);
    if (!v->flags || !v->pool || !v->off || !v->len || !v->eog || !r || !sr) goto nomem;
    int64_t o = 0;
    int32_t nr = 0, nsr = 0;
    for (int32_t i = 0; i < n_vocab; i++) {
        uint8_t f = flags ? flags[i] : 0;
        v->flags[i] = f;
        v->off[i] = o;
        v->len[i] = lens[i];
        if (lens[i]) memcpy(v->pool + o, bytes[i], (size_t)lens[i]);
        o += lens[i];
    }
    for (int32_t i = 0; i < n_vocab; i++) {
        uint8_t f = v->flags[i];
        if (f & GR_TOK_NEVER) continue;
        if (f & GR_TOK_EOG) {
            v->eog[v->n_eog++] = i;
            continue;
        }
        if (!v->len[i]) continue;
        tok_ref t = {(const uint8_t *)v->pool + v->off[i], v->len[i], i};
        if (f & GR_TOK_SPECIAL) sr[nsr++] = t;
        else r[nr++] = t;
    }
    if (build_trie(&v->trie, r, nr, max_len) != HN_OK || build_trie(&v->strie, sr, nsr, max_len) != HN_OK)
        goto nomem;
    hn_free(r);
    hn_free(sr);
    *out = v;
    return HN_OK;
nomem:
    hn_free(r);
    hn_free(sr);
    gr_vocab_free(v);
    return hn_errf(err, HN_ERR_NOMEM, "grammar: out of memory building the vocabulary index");
}

hn_status gr_vocab_from_tok(const struct tok_vocab *tv, gr_vocab **out, hn_err *err) {
    *out = NULL;
    int32_t n = tok_n_vocab(tv);
    if (n < 1) return hn_errf(err, HN_ERR_INVALID, "grammar: empty vocabulary");
    int32_t *lens = hn_malloc((size_t)n * sizeof *lens);
    uint8_t *flags = hn_calloc((size_t)n, 1);
    const char **ptrs = hn_malloc((size_t)n * sizeof *ptrs);
    char *pool = NULL;
    hn_status st = HN_ERR_NOMEM;
    if (!lens || !flags || !ptrs) goto done;
    int64_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t plain = tok_piece(tv, i, false, NULL, 0), sp = tok_piece(tv, i, true, NULL, 0);
        if (plain < 0) plain = 0;
        if (sp < 0) sp = 0;
        if (tok_is_eog(tv, i)) flags[i] = GR_TOK_EOG;
        else if (!plain && sp) flags[i] = GR_TOK_SPECIAL;
        lens[i] = plain ? plain : sp;
        total += lens[i];
    }
    pool = hn_malloc((size_t)(total ? total : 1));
    if (!pool) goto done;
    int64_t o = 0;
    for (int32_t i = 0; i < n; i++) {
        ptrs[i] = pool + o;
        tok_piece(tv, i, flags[i] != 0, pool + o, lens[i]);
        o += lens[i];
    }
    st = gr_vocab_new(n, ptrs, lens, flags, out, err);
    hn_free(pool);
    hn_free(lens);
    hn_free(flags);
    hn_free(ptrs);
    return st;
done:
    hn_free(pool);
    hn_free(lens);
    hn_free(flags);
    hn_free(ptrs);
    return hn_errf(err, st, "grammar: out of memory reading the vocabulary");
}

/* ---- configurations ---- */

static uint32_t hash_ints(const int32_t *p, int32_t n, uint32_t h) {
    for (int32_t i = 0; i < n; i++) {
        h ^= (uint32_t)p[i];
        h *= 0x01000193u;
        h ^= h >> 15;
    }
    return h;
}

static bool grow(void **p, int64_t *cap, int64_t need, size_t elem) {
    if (need <= *cap) return true;
    int64_t nc = *cap ? *cap : 64;
    while (nc < need) nc *= 2;
    void *np = hn_realloc(*p, (size_t)nc * elem);
    if (!np) return false;
    *p = np;
    *cap = nc;
    return true;
}

/* Adds a canonical stack fr[0..d) to the builder (deduplicated). */
static void sb_add(gr_state *s, const int32_t *fr, int32_t d) {
    uint32_t h = hash_ints(fr, d, 0x811c9dc5u ^ (uint32_t)d);
    for (int32_t i = 0; i < s->n_sr; i++)
        if (s->sr[i].hash == h && s->sr[i].len == d && !memcmp(s->sb + s->sr[i].off, fr, (size_t)d * sizeof *fr))
            return;
    if (s->n_sr >= GR_MAX_STACKS) {
        s->overflow = true;
        return;
    }
    int64_t cap_sr = s->cap_sr;
    if (!grow((void **)&s->sb, &s->sb_cap, s->sb_n + d, sizeof *s->sb) ||
        !grow((void **)&s->sr, &cap_sr, s->n_sr + 1, sizeof *s->sr)) {
        s->mem = HN_ERR_NOMEM;
        return;
    }
    s->cap_sr = (int32_t)cap_sr;
    memcpy(s->sb + s->sb_n, fr, (size_t)d * sizeof *fr);
    s->sr[s->n_sr++] = (gr_sref){s->sb_n, d, h};
    s->sb_n += d;
}

/* Expands fr[0..d) (whose top may be a rule reference or an alternative's
 * end) into canonical stacks, added to the builder. */
static void canon(gr_state *s, int32_t *fr, int32_t d) {
    const gr_grammar *g = s->g;
    for (;;) {
        if (d == 0) {
            sb_add(s, fr, 0);
            return;
        }
        int32_t p = fr[d - 1], x = g->code[p];
        if (x >= 0) {
            sb_add(s, fr, d);
            return;
        }
        if (x == GR_ALT_END) {
            d--;
            continue;
        }
        int32_t r = GR_REF_BASE - x;
        fr[d - 1] = p + 1;
        while (d > 0 && g->code[fr[d - 1]] == GR_ALT_END) d--; /* tail call */
        if (d >= GR_MAX_DEPTH || s->scratch_top + d + 1 > GR_SCRATCH) {
            s->overflow = true;
            return;
        }
        int32_t *nf = s->scratch + s->scratch_top;
        s->scratch_top += d + 1;
        for (int32_t a = g->alt_off[r]; a < g->alt_off[r + 1]; a++) {
            memcpy(nf, fr, (size_t)d * sizeof *fr);
            nf[d] = g->alts[a];
            canon(s, nf, d + 1);
        }
        s->scratch_top -= d + 1;
        return;
    }
}

static int cmp_sref(const gr_state *s, const gr_sref *a, const gr_sref *b) {
    if (a->hash != b->hash) return a->hash < b->hash ? -1 : 1;
    if (a->len != b->len) return a->len < b->len ? -1 : 1;
    return memcmp(s->sb + a->off, s->sb + b->off, (size_t)a->len * sizeof(int32_t));
}

static bool ht_grow(gr_state *s) {
    int32_t nc = s->ht_cap ? s->ht_cap * 2 : 1024;
    int32_t *nh = hn_malloc((size_t)nc * sizeof *nh);
    if (!nh) return false;
    memset(nh, 0xff, (size_t)nc * sizeof *nh);
    for (int32_t i = 0; i < s->n_cfgs; i++) {
        uint32_t j = s->cfgs[i].hash & (uint32_t)(nc - 1);
        while (nh[j] >= 0) j = (j + 1) & (uint32_t)(nc - 1);
        nh[j] = i;
    }
    hn_free(s->ht);
    s->ht = nh;
    s->ht_cap = nc;
    return true;
}

/* Interns the builder's stack set as a configuration; returns its id, or -1
 * if the set is empty or memory ran out. Clears the builder. */
static int32_t intern(gr_state *s) {
    int32_t n = s->n_sr;
    if (!n || s->mem != HN_OK) {
        s->n_sr = 0;
        s->sb_n = 0;
        return -1;
    }
    for (int32_t i = 1; i < n; i++) { /* insertion sort: sets are small */
        gr_sref t = s->sr[i];
        int32_t j = i;
        while (j > 0 && cmp_sref(s, &s->sr[j - 1], &t) > 0) {
            s->sr[j] = s->sr[j - 1];
            j--;
        }
        s->sr[j] = t;
    }
    int64_t n_ints = 1 + n;
    for (int32_t i = 0; i < n; i++) n_ints += s->sr[i].len;
    if (!grow((void **)&s->pool, &s->pool_cap, s->pool_n + n_ints, sizeof *s->pool)) {
        s->mem = HN_ERR_NOMEM;
        return -1;
    }
    int32_t *dst = s->pool + s->pool_n, *w = dst;
    bool acc = false;
    *w++ = n;
    for (int32_t i = 0; i < n; i++) {
        *w++ = s->sr[i].len;
        memcpy(w, s->sb + s->sr[i].off, (size_t)s->sr[i].len * sizeof *w);
        w += s->sr[i].len;
        if (!s->sr[i].len) acc = true;
    }
    s->n_sr = 0;
    s->sb_n = 0;
    uint32_t h = hash_ints(dst, (int32_t)n_ints, 0x9747b28cu);
    if (s->ht_cap) {
        uint32_t j = h & (uint32_t)(s->ht_cap - 1);
        for (; s->ht[j] >= 0; j = (j + 1) & (uint32_t)(s->ht_cap - 1)) {
            gr_cfg *c = &s->cfgs[s->ht[j]];
            if (c->hash == h && c->n_ints == n_ints && !memcmp(s->pool + c->off, dst, (size_t)n_ints * sizeof *dst))
                return s->ht[j];
        }
    }
    int64_t cap = s->cap_cfgs;
    if (!grow((void **)&s->cfgs, &cap, s->n_cfgs + 1, sizeof *s->cfgs)) {
        s->mem = HN_ERR_NOMEM;
        return -1;
    }
    s->cap_cfgs = (int32_t)cap;
    if ((int64_t)(s->n_cfgs + 1) * 2 > s->ht_cap && !ht_grow(s)) {
        s->mem = HN_ERR_NOMEM;
        return -1;
    }
    int32_t id = s->n_cfgs++;
    gr_cfg *nc = &s->cfgs[id];
    *nc = (gr_cfg){s->pool_n, (int32_t)n_ints, h, -1, acc, {0}};
    const int32_t *p = dst + 1;
    for (int32_t i = 0; i < n; i++) {
        int32_t len = *p++;
        if (len) {
            const gr_set *set = &s->g->sets[s->g->code[p[len - 1]]];
            for (int k = 0; k < 8; k++) nc->live[k] |= set->w[k];
        }
        p += len;
    }
    s->pool_n += n_ints;
    uint32_t j = h & (uint32_t)(s->ht_cap - 1);
    while (s->ht[j] >= 0) j = (j + 1) & (uint32_t)(s->ht_cap - 1);
    s->ht[j] = id;
    return id;
}

/* Loads configuration c's stacks, advanced over byte b, into the builder. */
static void advance(gr_state *s, int32_t c, unsigned b, int mode) {
    const gr_grammar *g = s->g;
    const int32_t *p = s->pool + s->cfgs[c].off;
    int32_t n = *p++;
    for (int32_t i = 0; i < n; i++) {
        int32_t len = *p++;
        const int32_t *fr = p;
        p += len;
        if (!len) continue;
        const gr_set *set = &g->sets[g->code[fr[len - 1]]];
        if (!gr_set_has(set, b) || (mode && !set->literal)) continue;
        int32_t *nf = s->scratch;
        memcpy(nf, fr, (size_t)len * sizeof *nf);
        nf[len - 1]++;
        s->scratch_top = len;
        canon(s, nf, len);
        s->scratch_top = 0;
    }
}

static inline uint64_t tkey(int32_t c, unsigned b, int mode) {
    return (((uint64_t)(uint32_t)c << 9) | ((uint64_t)mode << 8) | b) + 1;
}

static bool tr_grow(gr_state *s) {
    int64_t nc = s->t_cap ? s->t_cap * 2 : 4096;
    uint64_t *nk = hn_calloc((size_t)nc, sizeof *nk);
    int32_t *nv = hn_malloc((size_t)nc * sizeof *nv);
    if (!nk || !nv) {
        hn_free(nk);
        hn_free(nv);
        return false;
    }
    for (int64_t i = 0; i < s->t_cap; i++) {
        if (!s->tk[i]) continue;
        uint64_t j = (s->tk[i] * 0x9E3779B97F4A7C15ull) >> 20 & (uint64_t)(nc - 1);
        while (nk[j]) j = (j + 1) & (uint64_t)(nc - 1);
        nk[j] = s->tk[i];
        nv[j] = s->tv[i];
    }
    hn_free(s->tk);
    hn_free(s->tv);
    s->tk = nk;
    s->tv = nv;
    s->t_cap = nc;
    return true;
}

/* The configuration after byte b from c (mode 1: literal sets only); -1 dead. */
static int32_t trans(gr_state *s, int32_t c, unsigned b, int mode) {
    uint64_t key = tkey(c, b, mode);
    uint64_t mask = (uint64_t)s->t_cap - 1, j = 0;
    if (s->t_cap) {
        j = (key * 0x9E3779B97F4A7C15ull) >> 20 & mask;
        for (; s->tk[j]; j = (j + 1) & mask)
            if (s->tk[j] == key) return s->tv[j];
    }
    /* no stack takes b: dead, without a memo entry (asked after the memo, so
     * that a walk over live bytes pays nothing for it) */
    if (!(s->cfgs[c].live[b >> 5] >> (b & 31) & 1u)) return -1;
    advance(s, c, b, mode);
    int32_t nx = intern(s);
    if (s->mem != HN_OK) return -1;
    if ((s->t_n + 1) * 2 > s->t_cap) {
        if (!tr_grow(s)) {
            s->mem = HN_ERR_NOMEM;
            return nx;
        }
        mask = (uint64_t)s->t_cap - 1;
    }
    j = (key * 0x9E3779B97F4A7C15ull) >> 20 & mask;
    while (s->tk[j]) j = (j + 1) & mask;
    s->tk[j] = key;
    s->tv[j] = nx;
    s->t_n++;
    return nx;
}

/* Drops every table but the current configuration (between steps). */
static void flush(gr_state *s) {
    const int32_t *p = s->pool + s->cfgs[s->cur].off;
    int32_t n = *p++;
    s->n_sr = 0;
    s->sb_n = 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t len = *p++;
        sb_add(s, p, len);
        p += len;
    }
    s->pool_n = 0;
    s->n_cfgs = 0;
    if (s->ht) memset(s->ht, 0xff, (size_t)s->ht_cap * sizeof *s->ht);
    if (s->tk) memset(s->tk, 0, (size_t)s->t_cap * sizeof *s->tk);
    s->t_n = 0;
    for (int i = 0; i < GR_SLOTS; i++) s->slot_cfg[i] = -1;
    s->cur = intern(s);
    /* the start configuration is rebuilt lazily by reset */
    s->start = -1;
}

static void maybe_flush(gr_state *s) {
    if (s->n_cfgs > GR_MAX_CFGS || s->t_n > GR_MAX_TRANS || s->pool_n > GR_MAX_POOL) flush(s);
}

static int32_t start_cfg(gr_state *s) {
    int32_t fr[1] = {s->g->alts[s->g->alt_off[s->g->root]]};
    /* the root rule's alternatives, each a stack of one frame */
    for (int32_t a = s->g->alt_off[s->g->root]; a < s->g->alt_off[s->g->root + 1]; a++) {
        fr[0] = s->g->alts[a];
        s->scratch[0] = fr[0];
        s->scratch_top = 1;
        canon(s, s->scratch, 1);
        s->scratch_top = 0;
    }
    return intern(s);
}

void gr_state_free(gr_state *s) {
    if (!s) return;
    hn_free(s->pool);
    hn_free(s->cfgs);
    hn_free(s->ht);
    hn_free(s->tk);
    hn_free(s->tv);
    hn_free(s->sb);
    hn_free(s->sr);
    hn_free(s->scratch);
    hn_free(s->masks);
    hn_free(s->walk);
    hn_free(s);
}

hn_status gr_state_new(const gr_grammar *g, const gr_vocab *v, gr_state **out, hn_err *err) {
    *out = NULL;
    if (!g || !v) return hn_errf(err, HN_ERR_INVALID, "grammar: no grammar or vocabulary");
    gr_state *s = hn_calloc(1, sizeof *s);
    if (!s) return hn_errf(err, HN_ERR_NOMEM, "grammar: out of memory");
    s->g = g;
    s->v = v;
    s->words = (v->n_vocab + 31) / 32;
    s->scratch = hn_malloc(GR_SCRATCH * sizeof *s->scratch);
    s->masks = hn_calloc((size_t)(GR_SLOTS + 1) * (size_t)s->words, sizeof *s->masks);
    s->walk = hn_malloc(((size_t)v->max_len + 1) * sizeof *s->walk);
    for (int i = 0; i < GR_SLOTS; i++) s->slot_cfg[i] = -1;
    if (!s->scratch || !s->masks || !s->walk) {
        gr_state_free(s);
        return hn_errf(err, HN_ERR_NOMEM, "grammar: out of memory");
    }
    s->start = s->cur = start_cfg(s);
    if (s->cur < 0) {
        hn_status st = s->mem != HN_OK ? s->mem : HN_ERR_INVALID;
        gr_state_free(s);
        return hn_errf(err, st, "grammar: the grammar matches nothing");
    }
    *out = s;
    return HN_OK;
}

void gr_state_reset(gr_state *s) {
    if (s->start < 0) s->start = start_cfg(s);
    s->cur = s->start;
    s->finished = s->failed = false;
}

/* ---- masks ---- */

/* Sets the bits of the tokens that can follow; returns the nodes visited. */
static int64_t walk_trie(gr_state *s, const gr_trie *t, int mode, uint32_t *bits) {
    const gr_node *nd = t->nodes;
    int32_t *cur = s->walk;
    int64_t visited = 0;
    cur[0] = s->cur;
    for (int32_t i = 0; i < t->n_nodes;) {
        int32_t nx = trans(s, cur[nd[i].depth - 1], nd[i].byte, mode);
        visited++;
        if (nx < 0) {
            i = nd[i].end;
            continue;
        }
        cur[nd[i].depth] = nx;
        for (int32_t k = 0; k < nd[i].tok_n; k++) {
            int32_t id = t->toks[nd[i].tok_first + k];
            bits[id >> 5] |= 1u << (id & 31);
        }
        i++;
    }
    return visited;
}

/* The current configuration's mask (computed or cached); the zero mask if finished. */
static const uint32_t *cur_mask(gr_state *s) {
    if (s->finished || s->cur < 0) return s->masks + (size_t)GR_SLOTS * (size_t)s->words;
    int32_t c = s->cur;
    if (s->cfgs[c].slot >= 0) return s->masks + (size_t)s->cfgs[c].slot * (size_t)s->words;
    int32_t slot = 0;
    for (int i = 0; i < GR_SLOTS; i++) {
        if (s->slot_cfg[i] < 0) {
            slot = i;
            break;
        }
        if (s->slot_cost[i] < s->slot_cost[slot]) slot = i;
    }
    for (int i = 0; i < GR_SLOTS; i++) s->slot_cost[i] -= s->slot_cost[i] >> 4;
    if (s->slot_cfg[slot] >= 0 && s->slot_cfg[slot] < s->n_cfgs) s->cfgs[s->slot_cfg[slot]].slot = -1;
    s->slot_cfg[slot] = -1;
    uint32_t *bits = s->masks + (size_t)slot * (size_t)s->words;
    memset(bits, 0, (size_t)s->words * sizeof *bits);
    s->slot_cost[slot] = walk_trie(s, &s->v->trie, 0, bits) + walk_trie(s, &s->v->strie, 1, bits);
    if (s->cfgs[c].accepting)
        for (int32_t i = 0; i < s->v->n_eog; i++) bits[s->v->eog[i] >> 5] |= 1u << (s->v->eog[i] & 31);
    s->n_masks++;
    if (s->mem != HN_OK) return bits; /* partial: not cached */
    s->slot_cfg[slot] = c;
    s->cfgs[c].slot = slot;
    return bits;
}

const uint32_t *gr_state_allowed(gr_state *s) {
    maybe_flush(s);
    return cur_mask(s);
}

void gr_state_mask(gr_state *s, float *logits, int32_t n_vocab) {
    int32_t nv = s->v->n_vocab < n_vocab ? s->v->n_vocab : n_vocab;
    smp_apply_allowed(logits, gr_state_allowed(s), nv);
    for (int32_t i = nv; i < n_vocab; i++) logits[i] = -INFINITY;
}

bool gr_state_allows(gr_state *s, int32_t token) {
    if (token < 0 || token >= s->v->n_vocab) return false;
    return gr_state_allowed(s)[token >> 5] >> (token & 31) & 1;
}

/* ---- advancing ---- */

static int32_t run_bytes(gr_state *s, int32_t c, const uint8_t *p, int32_t n, int mode) {
    for (int32_t i = 0; i < n && c >= 0; i++) c = trans(s, c, p[i], mode);
    return c;
}

hn_status gr_state_accept(gr_state *s, int32_t token, hn_err *err) {
    if (token < 0 || token >= s->v->n_vocab) return hn_errf(err, HN_ERR_INVALID, "grammar: token %d out of range", token);
    if (s->finished) return hn_errf(err, HN_ERR_INVALID, "grammar: token %d after the end", token);
    maybe_flush(s);
    uint8_t f = s->v->flags[token];
    if (f & GR_TOK_NEVER) return hn_errf(err, HN_ERR_INVALID, "grammar: token %d is never allowed", token);
    if (f & GR_TOK_EOG) {
        if (!s->cfgs[s->cur].accepting)
            return hn_errf(err, HN_ERR_INVALID, "grammar: end of generation before the grammar is complete");
        s->finished = true;
        return HN_OK;
    }
    if (!s->v->len[token]) return hn_errf(err, HN_ERR_INVALID, "grammar: empty token %d", token);
    int32_t c = run_bytes(s, s->cur, (const uint8_t *)s->v->pool + s->v->off[token], s->v->len[token],
                          (f & GR_TOK_SPECIAL) ? 1 : 0);
    if (s->mem != HN_OK) return hn_errf(err, s->mem, "grammar: out of memory");
    if (c < 0) return hn_errf(err, HN_ERR_INVALID, "grammar: token %d does not fit the grammar here", token);
    s->cur = c;
    return HN_OK;
}

hn_status gr_state_accept_bytes(gr_state *s, const char *text, size_t len, hn_err *err) {
    if (s->finished) return hn_errf(err, HN_ERR_INVALID, "grammar: text after the end");
    if (len > INT32_MAX) return hn_errf(err, HN_ERR_RANGE, "grammar: text too long");
    maybe_flush(s);
    int32_t c = run_bytes(s, s->cur, (const uint8_t *)text, (int32_t)len, 0);
    if (s->mem != HN_OK) return hn_errf(err, s->mem, "grammar: out of memory");
    if (c < 0) return hn_errf(err, HN_ERR_INVALID, "grammar: text does not fit the grammar");
    s->cur = c;
    return HN_OK;
}

/* The bytes worth trying from configuration c (mode 0), in increasing
 * order: one per class of bytes that the same stacks' top sets hold (any
 * byte of a class leads to the same configuration, since advance only asks
 * which stacks take the byte), none that no top set holds (dead). Past 64
 * stacks every live byte is its own class. Returns how many. */
static int byte_classes(const gr_state *s, int32_t c, uint8_t rep[256]) {
    const gr_grammar *g = s->g;
    const int32_t *p = s->pool + s->cfgs[c].off;
    int32_t n = *p++, k = 0;
    uint64_t sig[256] = {0};
    bool wide = false;
    for (int32_t i = 0; i < n; i++) {
        int32_t len = *p++;
        const int32_t *fr = p;
        p += len;
        if (!len) continue;
        const gr_set *set = &g->sets[g->code[fr[len - 1]]];
        uint64_t bit = k < 64 ? 1ull << k : 1;
        if (k++ >= 64) wide = true;
        for (int w = 0; w < 8; w++)
            for (uint32_t m = set->w[w]; m; m &= m - 1) sig[w * 32 + __builtin_ctz(m)] |= bit;
    }
    uint64_t cls[256];
    int nr = 0, ncls = 0;
    for (int b = 0; b < 256; b++) {
        if (!sig[b]) continue;
        if (!wide) {
            int j = 0;
            while (j < ncls && cls[j] != sig[b]) j++;
            if (j < ncls) continue;
            cls[ncls++] = sig[b];
        }
        rep[nr++] = (uint8_t)b;
    }
    return nr;
}

/* The search of gr_state_completion; classes = false tries every byte of
 * every configuration (the reference, gr_state_completion_ref). Both give
 * the same text and stop at the same point: the bytes skipped could only
 * have led to a dead end or to a configuration already seen, and the step
 * bound counts every byte of a configuration either way. */
static int64_t completion(gr_state *s, char *out, size_t cap, bool classes) {
    if (s->finished) return 0;
    maybe_flush(s);
    if (s->cfgs[s->cur].accepting) return 0;
    /* breadth-first over (configuration, byte) transitions, bounded: at most
     * LIMIT configurations queued, STEPS transitions considered and NEW
     * configurations interned on the way (a transition that makes a new one
     * is the expensive kind), so that a hostile grammar cannot make one
     * search take seconds (it runs on the engine thread, every step near
     * the end of a constrained request's budget) */
    enum { LIMIT = 1 << 15, STEPS = 1 << 21, NEW = GR_COMPLETION_NEW_CFGS };
    uint8_t rep[256];
    int64_t steps = 0, cfgs0 = s->n_cfgs;
    int32_t *cfg = hn_malloc(LIMIT * sizeof *cfg), *parent = hn_malloc(LIMIT * sizeof *parent);
    uint8_t *by = hn_malloc(LIMIT);
    uint8_t *seen = NULL;
    int64_t seen_cap = 0, result = -1;
    if (!cfg || !parent || !by) goto done;
    int32_t head = 0, tail = 0, found = -1;
    cfg[tail] = s->cur;
    parent[tail++] = -1;
    while (head < tail && found < 0) {
        int32_t q = head++;
        int nb = 256;
        if (classes) nb = byte_classes(s, cfg[q], rep);
        for (int k = 0; k < nb && found < 0; k++) {
            unsigned b = classes ? rep[k] : (unsigned)k;
            if ((steps = (int64_t)q * 256 + b + 1) > STEPS || s->n_cfgs - cfgs0 > NEW) goto done;
            int32_t nx = trans(s, cfg[q], b, 0);
            if (nx < 0) continue;
            if (nx >= seen_cap) {
                int64_t nc = (int64_t)s->n_cfgs + 4096;
                uint8_t *ns = hn_realloc(seen, (size_t)nc);
                if (!ns) goto done;
                memset(ns + seen_cap, 0, (size_t)(nc - seen_cap));
                seen = ns;
                seen_cap = nc;
                seen[s->cur] = 1;
            }
            if (seen[nx]) continue;
            if (tail >= LIMIT) goto done;
            seen[nx] = 1;
            cfg[tail] = nx;
            parent[tail] = q;
            by[tail++] = (uint8_t)b;
            if (s->cfgs[nx].accepting) found = tail - 1;
        }
    }
    if (found >= 0) {
        int64_t n = 0;
        for (int32_t i = found; parent[i] >= 0; i = parent[i]) n++;
        result = n;
        int64_t k = n;
        for (int32_t i = found; parent[i] >= 0; i = parent[i]) {
            k--;
            if ((size_t)k < cap) out[k] = (char)by[i];
        }
    }
done:
    hn_free(cfg);
    hn_free(parent);
    hn_free(by);
    hn_free(seen);
    return result;
}

int64_t gr_state_completion(gr_state *s, char *out, size_t cap) { return completion(s, out, cap, true); }
int64_t gr_state_completion_ref(gr_state *s, char *out, size_t cap) { return completion(s, out, cap, false); }

bool gr_state_done(const gr_state *s) { return s->finished || (s->cur >= 0 && s->cfgs[s->cur].accepting); }
bool gr_state_failed(const gr_state *s) { return s->failed; }

void gr_state_counters(const gr_state *s, int64_t *n_cfgs, int64_t *n_masks) {
    if (n_cfgs) *n_cfgs = s->n_cfgs;
    if (n_masks) *n_masks = s->n_masks;
}

void gr_mask_fn(void *ctx, float *logits, int32_t n_vocab) { gr_state_mask(ctx, logits, n_vocab); }
const uint32_t *gr_allowed_fn(void *ctx) { return gr_state_allowed(ctx); }

void gr_accept_fn(void *ctx, int32_t token) {
    gr_state *s = ctx;
    if (gr_state_accept(s, token, NULL) != HN_OK) s->failed = true;
}
