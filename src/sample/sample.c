/* sample.c: the sampler chain described in sample.h.
 *
 * Scratch (sized at smp_new): a copy of the logits, a candidate array
 * {id, logit}, the penalty window as a ring buffer and, beside it, the sparse
 * list of the window's distinct tokens with their counts (smp_penalty_list).
 * The list is kept up to date by smp_accept in O(1): a per-token index into
 * it (slot_of, -1 when absent) finds an entry, and an entry whose count drops
 * to 0 is replaced by the list's last one. Penalties walk only the list;
 * nothing walks the vocabulary for them (smp_reset clears only the listed
 * entries of the index). Top-k uses a quickselect; top-p avoids sorting the whole
 * vocabulary by first bucketing candidates by log2 of their probability
 * ratio to the best one, then sorting only the buckets that reach top_p.
 * The PRNG is xoshiro256** seeded through splitmix64. */
#include "sample.h"

#include <math.h>
#include <string.h>

#include "../core/alloc.h"

typedef struct {
    int32_t id;
    float logit;
} cand;

struct smp_sampler {
    smp_params p;
    int32_t n_vocab;
    float *logits; /* [n_vocab] working copy */
    cand *cands;   /* [n_vocab] */
    int32_t *ring;     /* [penalty_last_n] the window, oldest at ring_pos once full */
    int32_t ring_len, ring_pos;
    int32_t *pen_tok;  /* [penalty_last_n] distinct tokens of the window */
    int32_t *pen_cnt;  /* [penalty_last_n] their occurrences (>= 1) */
    int32_t n_pen;
    int32_t *slot_of;  /* [n_vocab] index into pen_tok, or -1 */
    uint64_t rng[4];
    smp_mask_fn mask;
    void *mask_ctx;
};

/* ---- PRNG ---- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void rng_seed(uint64_t st[4], uint64_t seed) {
    for (int i = 0; i < 4; i++) st[i] = splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(uint64_t st[4]) {
    uint64_t r = rotl(st[1] * 5, 7) * 9, t = st[1] << 17;
    st[2] ^= st[0];
    st[3] ^= st[1];
    st[1] ^= st[2];
    st[0] ^= st[3];
    st[2] ^= t;
    st[3] = rotl(st[3], 45);
    return r;
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_uniform(uint64_t st[4]) { return (double)(rng_next(st) >> 11) * (1.0 / 9007199254740992.0); }

/* ---- lifecycle ---- */

smp_params smp_default_params(void) {
    smp_params p = {.temp = 0.8f,
                    .top_k = 40,
                    .top_p = 0.95f,
                    .min_p = 0.05f,
                    .repeat_penalty = 1.0f,
                    .presence_penalty = 0.0f,
                    .frequency_penalty = 0.0f,
                    .penalty_last_n = 64,
                    .seed = 0};
    return p;
}

smp_sampler *smp_new(const smp_params *p, int32_t n_vocab) {
    if (!p || n_vocab < 1 || p->penalty_last_n < 0 || !(p->repeat_penalty > 0) || isnan(p->temp) ||
        isnan(p->top_p) || isnan(p->min_p) || isnan(p->presence_penalty) || isnan(p->frequency_penalty))
        return NULL;
    smp_sampler *s = hn_calloc(1, sizeof(*s));
    if (!s) return NULL;
    s->p = *p;
    s->n_vocab = n_vocab;
    s->logits = hn_malloc((size_t)n_vocab * sizeof(float));
    s->cands = hn_malloc((size_t)n_vocab * sizeof(cand));
    size_t win = (size_t)(p->penalty_last_n ? p->penalty_last_n : 1);
    s->ring = hn_malloc(win * sizeof(int32_t));
    s->pen_tok = hn_malloc(win * sizeof(int32_t));
    s->pen_cnt = hn_malloc(win * sizeof(int32_t));
    s->slot_of = hn_malloc((size_t)n_vocab * sizeof(int32_t));
    if (!s->logits || !s->cands || !s->ring || !s->pen_tok || !s->pen_cnt || !s->slot_of) {
        smp_free(s);
        return NULL;
    }
    memset(s->slot_of, 0xff, (size_t)n_vocab * sizeof(int32_t)); /* -1: not in the list */
    smp_reset(s);
    return s;
}

void smp_free(smp_sampler *s) {
    if (!s) return;
    hn_free(s->logits);
    hn_free(s->cands);
    hn_free(s->ring);
    hn_free(s->pen_tok);
    hn_free(s->pen_cnt);
    hn_free(s->slot_of);
    hn_free(s);
}

void smp_reset(smp_sampler *s) {
    for (int32_t i = 0; i < s->n_pen; i++) s->slot_of[s->pen_tok[i]] = -1;
    s->n_pen = 0;
    s->ring_len = s->ring_pos = 0;
    rng_seed(s->rng, s->p.seed);
}

void smp_set_mask(smp_sampler *s, smp_mask_fn fn, void *ctx) {
    s->mask = fn;
    s->mask_ctx = fn ? ctx : NULL;
}

const smp_params *smp_get_params(const smp_sampler *s) { return &s->p; }

int32_t smp_penalty_list(const smp_sampler *s, const int32_t **tokens, const int32_t **counts) {
    *tokens = s->pen_tok;
    *counts = s->pen_cnt;
    return s->n_pen;
}

void smp_accept(smp_sampler *s, int32_t token) {
    int32_t cap = s->p.penalty_last_n;
    if (token < 0 || token >= s->n_vocab || cap == 0) return;
    if (s->ring_len == cap) { /* evict the oldest */
        int32_t old = s->ring[s->ring_pos], k = s->slot_of[old];
        if (--s->pen_cnt[k] == 0) { /* gone from the window: the last entry takes its place */
            int32_t last = --s->n_pen;
            s->pen_tok[k] = s->pen_tok[last];
            s->pen_cnt[k] = s->pen_cnt[last];
            s->slot_of[s->pen_tok[k]] = k;
            s->slot_of[old] = -1;
        }
    } else {
        s->ring_len++;
    }
    s->ring[s->ring_pos] = token;
    s->ring_pos = (s->ring_pos + 1) % cap;
    int32_t k = s->slot_of[token];
    if (k >= 0) {
        s->pen_cnt[k]++;
    } else {
        s->slot_of[token] = s->n_pen;
        s->pen_tok[s->n_pen] = token;
        s->pen_cnt[s->n_pen++] = 1;
    }
}

/* ---- the chain ---- */

void smp_apply_penalties(float *logits, const smp_params *p, const int32_t *tokens, const int32_t *counts, int32_t n) {
    if (p->repeat_penalty == 1.0f && p->presence_penalty == 0.0f && p->frequency_penalty == 0.0f) return;
    for (int32_t i = 0; i < n; i++) {
        int32_t t = tokens[i];
        float l = logits[t];
        l = l <= 0 ? l * p->repeat_penalty : l / p->repeat_penalty;
        logits[t] = l - (float)counts[i] * p->frequency_penalty - p->presence_penalty;
    }
}

void smp_apply_allowed(float *logits, const uint32_t *allowed, int32_t n_vocab) {
    int32_t full = n_vocab / 32;
    for (int32_t w = 0; w < full; w++) {
        uint32_t m = ~allowed[w]; /* the refused tokens of this word */
        if (!m) continue;
        float *l = logits + (size_t)w * 32;
        if (m == 0xffffffffu) {
            for (int b = 0; b < 32; b++) l[b] = -INFINITY;
            continue;
        }
        do {
            l[__builtin_ctz(m)] = -INFINITY;
            m &= m - 1;
        } while (m);
    }
    for (int32_t t = full * 32; t < n_vocab; t++)
        if (!(allowed[t >> 5] >> (t & 31) & 1)) logits[t] = -INFINITY;
}

/* Strict "better than": higher logit, then lower id. */
static inline int better(const cand *a, const cand *b) {
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static inline void swap_c(cand *a, cand *b) {
    cand t = *a;
    *a = *b;
    *b = t;
}

/* Rearranges c[0..n) so that c[0..k) are the k best (in no order). */
static void select_top(cand *c, int32_t n, int32_t k) {
    int32_t lo = 0, hi = n - 1;
    while (lo < hi) {
        /* median of three as pivot, moved to hi */
        int32_t mid = lo + (hi - lo) / 2;
        if (better(&c[mid], &c[lo])) swap_c(&c[mid], &c[lo]);
        if (better(&c[hi], &c[lo])) swap_c(&c[hi], &c[lo]);
        if (better(&c[mid], &c[hi])) swap_c(&c[mid], &c[hi]);
        cand pivot = c[hi];
        int32_t st = lo;
        for (int32_t i = lo; i < hi; i++)
            if (better(&c[i], &pivot)) swap_c(&c[i], &c[st++]);
        swap_c(&c[st], &c[hi]);
        if (st == k - 1 || st == k) return;
        if (st < k) lo = st + 1;
        else hi = st - 1;
    }
}

/* Sorts best-first (insertion sort for small runs, else heapsort: no recursion, no allocation). */
static void sift(cand *c, int32_t n, int32_t i) {
    for (;;) {
        int32_t m = i, l = 2 * i + 1, r = l + 1;
        if (l < n && better(&c[m], &c[l])) m = l; /* min-heap on "better": worst at the root */
        if (r < n && better(&c[m], &c[r])) m = r;
        if (m == i) return;
        swap_c(&c[i], &c[m]);
        i = m;
    }
}

static void sort_cands(cand *c, int32_t n) {
    if (n <= 32) {
        for (int32_t i = 1; i < n; i++)
            for (int32_t j = i; j > 0 && better(&c[j], &c[j - 1]); j--) swap_c(&c[j], &c[j - 1]);
        return;
    }
    for (int32_t i = n / 2 - 1; i >= 0; i--) sift(c, n, i);
    for (int32_t end = n - 1; end > 0; end--) {
        swap_c(&c[0], &c[end]); /* worst goes last */
        sift(c, end, 0);
    }
}

static float max_logit(const cand *c, int32_t n) {
    float m = c[0].logit;
    for (int32_t i = 1; i < n; i++)
        if (c[i].logit > m) m = c[i].logit;
    return m;
}

#define N_BUCKETS 64

/* Keeps the smallest best-first prefix whose temperature-1 mass reaches top_p;
 * returns the new count. Leaves the kept candidates sorted best-first. */
static int32_t top_p_filter(cand *c, int32_t n, float top_p) {
    float mx = max_logit(c, n);
    double total = 0, mass[N_BUCKETS] = {0};
    /* bucket b holds tokens with probability ratio to the best in (2^-(b+1), 2^-b] */
    for (int32_t i = 0; i < n; i++) {
        double e = exp((double)(c[i].logit - mx));
        total += e;
        double b = (double)(mx - c[i].logit) * 1.4426950408889634;
        mass[b < N_BUCKETS - 1 ? (int)b : N_BUCKETS - 1] += e;
    }
    double need = (double)top_p * total, acc = 0;
    int nb = 0;
    do acc += mass[nb++];
    while (nb < N_BUCKETS && acc < need);
    /* gather buckets [0, nb) to the front; everything else can be dropped */
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        double b = (double)(mx - c[i].logit) * 1.4426950408889634;
        int bi = b < N_BUCKETS - 1 ? (int)b : N_BUCKETS - 1;
        if (bi < nb) swap_c(&c[m++], &c[i]);
    }
    sort_cands(c, m);
    acc = 0;
    for (int32_t i = 0; i < m; i++) {
        acc += exp((double)(c[i].logit - mx));
        if (acc >= need) return i + 1;
    }
    return m;
}

/* Stages 1-6 into s->cands: returns the candidates' count (0: none allowed);
 * greedy (temp <= 0) is not handled here. */
static int32_t prepare(smp_sampler *s) {
    const smp_params *p = &s->p;
    int32_t nv = s->n_vocab;
    cand *c = s->cands;
    int32_t n = 0;
    for (int32_t i = 0; i < nv; i++)
        if (s->logits[i] > -INFINITY) c[n++] = (cand){i, s->logits[i]};
    if (n == 0) return 0;
    if (isinf(max_logit(c, n))) { /* +inf logits: a uniform choice among them */
        int32_t m = 0;
        for (int32_t i = 0; i < n; i++)
            if (isinf(c[i].logit)) c[m++] = (cand){c[i].id, 0.0f};
        n = m;
    }

    if (p->top_k > 0 && p->top_k < n) {
        select_top(c, n, p->top_k);
        n = p->top_k;
    }
    if (p->top_p < 1.0f) n = top_p_filter(c, n, p->top_p);
    if (p->min_p > 0.0f) {
        float thr = max_logit(c, n) + logf(p->min_p);
        int32_t m = 0;
        for (int32_t i = 0; i < n; i++)
            if (c[i].logit >= thr) c[m++] = c[i]; /* keeps order; the best always stays */
        n = m;
    }
    return n;
}

/* The masked, penalised working copy; returns the greedy token when temp <= 0 (else -2). */
static int32_t load_row(smp_sampler *s, const float *logits) {
    int32_t nv = s->n_vocab;
    memcpy(s->logits, logits, (size_t)nv * sizeof(float));
    if (s->mask) s->mask(s->mask_ctx, s->logits, nv);
    smp_apply_penalties(s->logits, &s->p, s->pen_tok, s->pen_cnt, s->n_pen);
    if (s->p.temp > 0) return -2;
    int32_t best = -1;
    float bl = -INFINITY;
    for (int32_t i = 0; i < nv; i++)
        if (s->logits[i] > bl) {
            bl = s->logits[i];
            best = i;
        }
    return best;
}

int32_t smp_sample(smp_sampler *s, const float *logits) {
    int32_t g = load_row(s, logits);
    if (g != -2) return g;
    cand *c = s->cands;
    int32_t n = prepare(s);
    if (n == 0) return -1;
    /* temperature + softmax + draw; candidate order depends only on the input */
    const float temp = s->p.temp;
    float mx = max_logit(c, n);
    double total = 0;
    for (int32_t i = 0; i < n; i++) total += exp((double)((c[i].logit - mx) / temp));
    double u = rng_uniform(s->rng) * total, acc = 0;
    for (int32_t i = 0; i < n; i++) {
        acc += exp((double)((c[i].logit - mx) / temp));
        if (u < acc) return c[i].id;
    }
    return c[n - 1].id; /* rounding: u landed at the very end */
}

int32_t smp_sample_draft(smp_sampler *s, const float *logits, int32_t draft, int *accepted) {
    /* For a point-mass draft the standard rule (accept with probability
     * min(1, p(d) / q(d)) = p(d), else draw from max(0, p - q) renormalised,
     * which is p without d) gives the same joint law of (token, accepted) as
     * drawing the token from p and accepting when it is d: the token follows
     * p, and it is d with probability p(d). This form draws exactly as plain
     * sampling does (one uniform per emitted token), so a seeded request
     * gives the same tokens with and without drafts. */
    int32_t tok = smp_sample(s, logits);
    *accepted = tok >= 0 && tok == draft;
    return tok;
}
