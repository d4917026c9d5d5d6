/* test_spec_suffix: the suffix drafter (spec/suffix.h) against a brute-force
 * reference on random, small-alphabet and repetitive token sequences: after
 * every appended token the match length is the longest suffix that ends at
 * an earlier position, the reported end is such an occurrence, its count is
 * the true number of occurrences (the walk cap set high), and the draft is
 * the occurrence's continuation (wrapped periodically), with probabilities in
 * [0, 1] equal to the brute-force continuation frequencies where the walk
 * stays inside the text. */
#include <math.h>

#include "../src/core/alloc.h"
#include "../src/spec/suffix.h"
#include "test.h"

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

/* Whether s[0..n) has the len-suffix ending at e too. */
static int ends_at(const int32_t *s, int32_t n, int32_t len, int32_t e) {
    if (e - len + 1 < 0) return 0;
    for (int32_t i = 0; i < len; i++)
        if (s[e - i] != s[n - 1 - i]) return 0;
    return 1;
}

static int32_t brute_match(const int32_t *s, int32_t n) {
    int32_t best = 0;
    for (int32_t e = 0; e + 1 < n; e++) {
        int32_t l = 0;
        while (l <= e && s[e - l] == s[n - 1 - l]) l++;
        if (l > best) best = l;
    }
    return best;
}

/* Occurrences of w[0..len) in s[0..n), and of them those followed by tok (tok < 0: any) */
static int32_t brute_count(const int32_t *s, int32_t n, const int32_t *w, int32_t len, int32_t tok, int32_t *followed) {
    int32_t c = 0, f = 0;
    for (int32_t e = len - 1; e < n; e++) {
        int ok = 1;
        for (int32_t i = 0; i < len && ok; i++) ok = s[e - len + 1 + i] == w[i];
        if (!ok) continue;
        c++;
        if (e + 1 < n && (tok < 0 || s[e + 1] == tok)) f++;
    }
    if (followed) *followed = f;
    return c;
}

static int failures_before;

static void run_seq(const int32_t *s, int32_t n, int32_t cap0, const char *what) {
    sfx_drafter *d = sfx_new(cap0, 1 << 30);
    CHECK(d != NULL);
    if (!d) return;
    hn_err err;
    int bad = 0;
    int32_t draft[48];
    float p[48];
    int32_t *w = hn_malloc(sizeof(int32_t) * (size_t)(n + 64));
    for (int32_t i = 0; i < n && bad < 5; i++) {
        if (sfx_append(d, s[i], &err)) {
            CHECKF(0, "%s: append %d failed: %s", what, (int)i, err.msg);
            break;
        }
        int32_t len = i + 1, ml = sfx_match_len(d), me = sfx_match_end(d), want = brute_match(s, len);
        if (ml != want) {
            CHECKF(0, "%s: at %d match %d, brute force %d", what, (int)len, (int)ml, (int)want);
            bad++;
            continue;
        }
        if (ml == 0) {
            if (me != -1 || sfx_propose(d, 1, 8, draft, p) != 0) {
                CHECKF(0, "%s: at %d no match but end %d or a draft", what, (int)len, (int)me);
                bad++;
            }
            continue;
        }
        if (me < 0 || me + 1 >= len || !ends_at(s, len, ml, me)) {
            CHECKF(0, "%s: at %d end %d is not an earlier occurrence of the %d-suffix", what, (int)len, (int)me, (int)ml);
            bad++;
            continue;
        }
        int32_t cnt = brute_count(s, len, s + len - ml, ml, -1, NULL);
        if (sfx_match_count(d) != cnt) {
            CHECKF(0, "%s: at %d count %d, brute force %d", what, (int)len, (int)sfx_match_count(d), (int)cnt);
            bad++;
        }
        int32_t k = sfx_propose(d, 1, 48, draft, p);
        if (k != 48) {
            CHECKF(0, "%s: at %d proposed %d, wanted 48", what, (int)len, (int)k);
            bad++;
            continue;
        }
        /* the continuation of the occurrence, periodic past the end */
        int32_t avail = len - 1 - me;
        for (int32_t j = 0; j < k && !bad; j++) {
            int32_t want_t = j < avail ? s[me + 1 + j] : draft[j - avail];
            if (draft[j] != want_t || !(p[j] >= 0 && p[j] <= 1)) {
                CHECKF(0, "%s: at %d draft[%d] = %d (p %g), want %d", what, (int)len, (int)j, (int)draft[j], p[j],
                       (int)want_t);
                bad++;
            }
        }
        /* probabilities: the brute-force frequency of each drafted token after
         * its context, for as long as context+draft occurs in the text */
        memcpy(w, s + len - ml, sizeof(int32_t) * (size_t)ml);
        int32_t wl = ml;
        for (int32_t j = 0; j < k && !bad; j++) {
            int32_t foll_any, foll_tok;
            brute_count(s, len, w, wl, -1, &foll_any);
            brute_count(s, len, w, wl, draft[j], &foll_tok);
            if (foll_tok == 0) break; /* the walk left the text: p is carried over */
            /* the automaton's state may hold the context under a longer
             * string with the same occurrences; counts are the same */
            float want_p = (float)foll_tok / (float)foll_any;
            if (fabsf(p[j] - want_p) > 1e-6f) {
                CHECKF(0, "%s: at %d p[%d] = %g, brute force %d/%d", what, (int)len, (int)j, p[j], (int)foll_tok,
                       (int)foll_any);
                bad++;
            }
            w[wl++] = draft[j];
        }
    }
    CHECKF(bad == 0, "%s: %d mismatches", what, bad);
    CHECK(sfx_len(d) == n || bad);
    /* reset and replay: same answers */
    sfx_reset(d);
    CHECK(sfx_len(d) == 0 && sfx_match_len(d) == 0);
    CHECK(sfx_append_n(d, s, n, &err) == HN_OK && sfx_match_len(d) == brute_match(s, n));
    hn_free(w);
    sfx_free(d);
}

int main(void) {
    enum { N = 700 };
    int32_t s[N];
    (void)failures_before;
    /* random over a large vocabulary: short matches */
    for (int i = 0; i < N; i++) s[i] = (int32_t)(rnd() % 50000);
    run_seq(s, N, 16, "random-large");
    /* small alphabets: many repeats, deep suffix links, clones */
    for (int a = 2; a <= 5; a++) {
        for (int i = 0; i < N; i++) s[i] = (int32_t)(rnd() % (uint32_t)a);
        char nm[32];
        snprintf(nm, sizeof nm, "random-alpha%d", a);
        run_seq(s, N, 16, nm);
    }
    /* all the same token, and a period-7 pattern */
    for (int i = 0; i < N; i++) s[i] = 42;
    run_seq(s, N, 16, "constant");
    for (int i = 0; i < N; i++) s[i] = 100 + i % 7;
    run_seq(s, N, 700, "periodic");
    /* an agent-like stream: a passage, then copies of it with edits */
    int32_t passage[150];
    for (int i = 0; i < 150; i++) passage[i] = (int32_t)(rnd() % 3000);
    int n = 0;
    while (n < N) {
        for (int i = 0; i < 150 && n < N; i++) {
            s[n++] = passage[i];
            if (rnd() % 40 == 0 && n < N) s[n++] = (int32_t)(rnd() % 3000); /* an insertion */
        }
    }
    run_seq(s, N, 64, "copy-edit");

    /* a default-capped drafter on a constant stream: counts are a lower bound, ends stay valid */
    sfx_drafter *d = sfx_new(16, 0);
    hn_err err;
    int ok = 1;
    for (int i = 0; i < 2000 && ok; i++) {
        ok = sfx_append(d, 7, &err) == HN_OK;
        if (i > 0) {
            int32_t me = sfx_match_end(d);
            ok = ok && sfx_match_len(d) == i && me >= 0 && me < i && sfx_match_count(d) <= i + 1 && sfx_match_count(d) >= 2;
        }
    }
    CHECKF(ok, "capped constant stream");
    int32_t dr[8];
    CHECK(sfx_propose(d, 1, 8, dr, NULL) == 8 && dr[0] == 7 && dr[7] == 7);
    CHECK(sfx_propose(d, 5000, 8, dr, NULL) == 0); /* under the minimum match */
    CHECK(sfx_append(d, -1, &err) == HN_ERR_INVALID);
    CHECK(sfx_bytes(d) > 2000 * 4);
    sfx_free(d);

    /* allocation failure while growing: the drafter is unchanged and keeps working */
    d = sfx_new(16, 0);
    for (int i = 0; i < 16; i++) sfx_append(d, i % 3, &err);
    hn_alloc_fail_after(0);
    hn_status st = sfx_append(d, 1, &err);
    hn_alloc_fail_after(-1);
    CHECK(st == HN_ERR_NOMEM && sfx_len(d) == 16);
    CHECK(sfx_append(d, 1, &err) == HN_OK && sfx_len(d) == 17);
    sfx_free(d);
    TEST_DONE();
}
