/* test_sample.c: the sampler chain: greedy, top-k/top-p/min-p filtering,
 * penalties, seeding, the distribution it draws from, and the mask hook. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "sample/sample.h"
#include "test.h"

static smp_params plain(void) {
    smp_params p = {.temp = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .repeat_penalty = 1.0f,
                    .penalty_last_n = 0, .seed = 42};
    return p;
}

/* Samples `draws` times and writes the frequency of each token into freq. */
static void histogram(smp_sampler *s, const float *logits, int nv, int draws, double *freq) {
    for (int i = 0; i < nv; i++) freq[i] = 0;
    for (int i = 0; i < draws; i++) {
        int32_t t = smp_sample(s, logits);
        if (t >= 0 && t < nv) freq[t] += 1.0 / draws;
    }
}

static int g_mask_calls;
static void mask_even(void *ctx, float *logits, int32_t n) {
    (void)ctx;
    g_mask_calls++;
    for (int32_t i = 0; i < n; i += 2) logits[i] = -INFINITY;
}
static void mask_all(void *ctx, float *logits, int32_t n) {
    (void)ctx;
    for (int32_t i = 0; i < n; i++) logits[i] = -INFINITY;
}

/* The old dense rule, kept as the reference: a count per vocabulary token
 * over the window, then every token with a count is penalised. */
static void dense_penalties(float *l, int32_t nv, const smp_params *p, const int32_t *win, int32_t n_win, int32_t *cnt) {
    for (int32_t t = 0; t < nv; t++) cnt[t] = 0;
    for (int32_t i = 0; i < n_win; i++) cnt[win[i]]++;
    if (n_win == 0 || (p->repeat_penalty == 1.0f && p->presence_penalty == 0.0f && p->frequency_penalty == 0.0f))
        return;
    for (int32_t t = 0; t < nv; t++) {
        if (!cnt[t]) continue;
        float x = l[t];
        x = x <= 0 ? x * p->repeat_penalty : x / p->repeat_penalty;
        l[t] = x - (float)cnt[t] * p->frequency_penalty - p->presence_penalty;
    }
}

/* Sparse penalties against the dense reference over random histories: the
 * exported list is exactly the window's distinct tokens and counts, applying
 * it gives the same bits, and a penalised sampler draws what an unpenalised
 * one (same seed) draws from the reference's logits. Small alphabets make
 * repeats, the window wraps many times, some histories start with "prompt"
 * tokens and out-of-range ids, some are reset halfway, logits tie. */
static void test_sparse_penalties(void) {
    static const int32_t nvs[] = {1, 7, 64, 1000};
    static const int32_t last_ns[] = {0, 1, 3, 8, 64, 300};
    static const float reps[] = {1.0f, 0.5f, 1.3f, 2.0f}, pres[] = {0.0f, 0.5f, -0.3f}, freqs[] = {0.0f, 0.25f, 1.5f};
    *test_rng_state() = 0x9e3779b97f4a7c15ull;
    int list_ok = 1, bits_ok = 1, draw_ok = 1, trials = 0, max_list = 0;
    int64_t steps = 0;
    for (int trial = 0; trial < 240; trial++) {
        int32_t nv = nvs[trial % 4], last_n = last_ns[(trial / 4) % 6];
        size_t nvz = (uint32_t)nv; /* sizes: (uint32_t) keeps GCC's range analysis from seeing a negative */
        smp_params p = plain();
        p.repeat_penalty = reps[test_rnd() % 4];
        p.presence_penalty = pres[test_rnd() % 3];
        p.frequency_penalty = freqs[test_rnd() % 3];
        p.penalty_last_n = last_n;
        p.seed = test_rnd();
        p.temp = test_rnd() % 4 ? 0.7f : 0.0f;
        p.top_k = test_rnd() % 2 ? 20 : 0;
        p.min_p = test_rnd() % 2 ? 0.05f : 0.0f;
        smp_params q = p; /* the same chain without penalties */
        q.repeat_penalty = 1.0f;
        q.presence_penalty = q.frequency_penalty = 0.0f;
        q.penalty_last_n = 0;
        smp_sampler *a = smp_new(&p, nv), *b = smp_new(&q, nv);
        int32_t alpha = 1 + (int32_t)(test_rnd() % (uint32_t)(nv < 12 ? nv : 12)); /* tokens drawn from [0, alpha) */
        int32_t len = 3 * last_n + 20 + (int32_t)(test_rnd() % 50), n_hist = 0;
        int32_t *hist = malloc(sizeof(int32_t) * (size_t)(len + 40)); /* prompt + generated */
        int32_t *cnt = malloc(sizeof(int32_t) * nvz);
        uint8_t *seen = malloc(nvz);
        float *l = malloc(sizeof(float) * nvz), *ref = malloc(sizeof(float) * nvz),
              *mine = malloc(sizeof(float) * nvz);
        int32_t n_prompt = trial % 3 ? (int32_t)(test_rnd() % 40) : 0;
        for (int32_t i = 0; i < n_prompt; i++) { /* prompt tokens, with a few bad ids (ignored) */
            int32_t t = test_rnd() % 8 == 0 ? (test_rnd() % 2 ? -1 : nv + (int32_t)(test_rnd() % 3)) : (int32_t)(test_rnd() % (uint32_t)alpha);
            smp_accept(a, t);
            if (t >= 0 && t < nv) hist[n_hist++] = t;
        }
        int32_t reset_at = trial % 5 == 0 ? len / 2 : -1;
        for (int32_t step = 0; step < len; step++, steps++) {
            if (step == reset_at) {
                smp_reset(a);
                smp_reset(b);
                n_hist = 0;
            }
            int32_t n_win = n_hist < last_n ? n_hist : last_n;
            const int32_t *win = hist + n_hist - n_win;
            /* ties and both signs: logits on a coarse grid around 0 */
            for (int32_t t = 0; t < nv; t++) l[t] = (float)((int32_t)(test_rnd() % 9) - 4) * 0.5f;
            memcpy(ref, l, sizeof(float) * nvz);
            memcpy(mine, l, sizeof(float) * nvz);
            dense_penalties(ref, nv, &p, win, n_win, cnt);
            const int32_t *lt, *lc;
            int32_t n = smp_penalty_list(a, &lt, &lc), distinct = 0;
            memset(seen, 0, nvz);
            for (int32_t t = 0; t < nv; t++) distinct += cnt[t] > 0;
            int ok = n == distinct;
            for (int32_t i = 0; ok && i < n; i++) {
                ok = lt[i] >= 0 && lt[i] < nv && !seen[lt[i]] && lc[i] >= 1 && lc[i] == cnt[lt[i]];
                if (ok) seen[lt[i]] = 1;
            }
            if (!ok && list_ok) fprintf(stderr, "penalty list: trial %d step %d: %d entries, %d distinct\n", trial, (int)step, (int)n, (int)distinct);
            list_ok &= ok;
            if (n > max_list) max_list = n;
            smp_apply_penalties(mine, &p, lt, lc, n);
            bits_ok &= !memcmp(mine, ref, sizeof(float) * nvz);
            int32_t ta = smp_sample(a, l), tb = smp_sample(b, ref);
            if (ta != tb && draw_ok) fprintf(stderr, "penalty draw: trial %d step %d: %d vs %d\n", trial, (int)step, (int)ta, (int)tb);
            draw_ok &= ta == tb;
            /* mostly accept the drawn token, sometimes a bad id or one from the alphabet (ties in the window) */
            int32_t acc = test_rnd() % 16 == 0 ? nv : test_rnd() % 3 ? ta : (int32_t)(test_rnd() % (uint32_t)alpha);
            smp_accept(a, acc);
            if (acc >= 0 && acc < nv) hist[n_hist++] = acc;
        }
        trials++;
        free(hist);
        free(cnt);
        free(seen);
        free(l);
        free(ref);
        free(mine);
        smp_free(a);
        smp_free(b);
    }
    CHECKF(list_ok, "sparse penalty list == dense window counts (%d trials, %lld steps)", trials, (long long)steps);
    CHECKF(bits_ok, "smp_apply_penalties == dense reference, bit for bit");
    CHECKF(draw_ok, "penalised sampler == unpenalised sampler on the reference's logits");
    CHECKF(max_list > 1 && max_list <= 300, "the list held up to %d tokens", max_list);
}

/* smp_apply_allowed against a per-token reference, at row lengths around word
 * boundaries and with all-clear, all-set and mixed words. */
static void test_apply_allowed(void) {
    static const int32_t nvs[] = {1, 5, 31, 32, 33, 63, 64, 65, 1000, 1023, 4096};
    *test_rng_state() = 0xdeadbeefcafef00dull;
    int ok = 1, cleared = 0, kept = 0;
    for (size_t k = 0; k < sizeof nvs / sizeof nvs[0]; k++) {
        int32_t nv = nvs[k], words = (nv + 31) / 32;
        for (int rep = 0; rep < 20; rep++) {
            uint32_t *bits = malloc(sizeof(uint32_t) * (size_t)words);
            float *row = malloc(sizeof(float) * (size_t)nv), *ref = malloc(sizeof(float) * (size_t)nv);
            for (int32_t w = 0; w < words; w++) {
                uint32_t r = test_rnd() % 4;
                bits[w] = r == 0 ? 0 : r == 1 ? 0xffffffffu : test_rnd() & test_rnd();
            }
            for (int32_t t = 0; t < nv; t++) row[t] = ref[t] = test_gauss();
            for (int32_t t = 0; t < nv; t++)
                if (!((bits[t / 32] >> (t % 32)) & 1)) ref[t] = -INFINITY;
            smp_apply_allowed(row, bits, nv);
            ok &= !memcmp(row, ref, sizeof(float) * (size_t)nv);
            for (int32_t t = 0; t < nv; t++) {
                cleared += ref[t] == -INFINITY;
                kept += ref[t] != -INFINITY;
            }
            free(bits);
            free(row);
            free(ref);
        }
    }
    CHECKF(ok && cleared > 1000 && kept > 1000, "smp_apply_allowed == per-token reference (%d cleared, %d kept)", cleared, kept);
}

int main(void) {
    test_sparse_penalties();
    test_apply_allowed();

    enum { NV = 1000 };
    static float logits[NV];
    uint64_t x = 12345;
    for (int i = 0; i < NV; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        logits[i] = (float)((x >> 33) % 2000) / 200.0f - 5.0f; /* [-5, 5) */
    }
    int amax = 0;
    for (int i = 1; i < NV; i++)
        if (logits[i] > logits[amax]) amax = i;

    /* invalid parameters */
    smp_params bad = plain();
    CHECK(smp_new(&bad, 0) == NULL);
    bad.penalty_last_n = -1;
    CHECK(smp_new(&bad, NV) == NULL);
    bad = plain();
    bad.repeat_penalty = 0;
    CHECK(smp_new(&bad, NV) == NULL);
    bad = plain();
    bad.temp = NAN;
    CHECK(smp_new(&bad, NV) == NULL);

    /* greedy, ties go to the lowest id */
    smp_params p = plain();
    p.temp = 0;
    smp_sampler *s = smp_new(&p, NV);
    CHECK(s != NULL);
    CHECK(smp_sample(s, logits) == amax);
    float tie[8] = {1, 3, 2, 3, 3, -1, 0, 2};
    smp_free(s);
    s = smp_new(&p, 8);
    CHECK(smp_sample(s, tie) == 1);
    smp_set_mask(s, mask_all, NULL);
    CHECK(smp_sample(s, tie) == -1);
    smp_free(s);

    /* top-k = 1, a tiny top-p and min-p = 1 all reduce to greedy at any temperature */
    p = plain();
    p.temp = 5.0f;
    p.top_k = 1;
    s = smp_new(&p, NV);
    int ok = 1;
    for (int i = 0; i < 200; i++) ok &= smp_sample(s, logits) == amax;
    CHECK(ok);
    smp_free(s);
    p.top_k = 0;
    p.top_p = 1e-6f;
    s = smp_new(&p, NV);
    ok = 1;
    for (int i = 0; i < 200; i++) ok &= smp_sample(s, logits) == amax;
    CHECK(ok);
    smp_free(s);
    p.top_p = 1.0f;
    p.min_p = 1.0f;
    s = smp_new(&p, 8);
    ok = 1;
    for (int i = 0; i < 200; i++) {
        int32_t t = smp_sample(s, tie);
        ok &= t == 1 || t == 3 || t == 4; /* the three tied best */
    }
    CHECK(ok);
    smp_free(s);

    /* top-k: only the k best ever come out */
    p = plain();
    p.top_k = 3;
    p.temp = 10.0f; /* flatten, so the other candidates are likely if they were kept */
    float lk[6] = {0.0f, 5.0f, 1.0f, 4.0f, 3.0f, 2.0f};
    s = smp_new(&p, 6);
    double freq[NV];
    histogram(s, lk, 6, 3000, freq);
    CHECK(freq[0] == 0 && freq[2] == 0 && freq[5] == 0);
    CHECK(freq[1] > 0.2 && freq[3] > 0.2 && freq[4] > 0.2);
    smp_free(s);

    /* min-p: probabilities (temperature 1) of {0.5, 0.3, 0.15, 0.05}; min_p 0.2
     * keeps p >= 0.1, i.e. tokens 0,1,2 */
    float lm[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
    p = plain();
    p.min_p = 0.2f;
    s = smp_new(&p, 4);
    histogram(s, lm, 4, 20000, freq);
    CHECK(freq[3] == 0);
    CHECKF(fabs(freq[0] - 0.5 / 0.95) < 0.02 && fabs(freq[2] - 0.15 / 0.95) < 0.02, "min-p %f %f", freq[0], freq[2]);
    smp_free(s);

    /* top-p 0.7 on the same distribution keeps {0.5, 0.3} (mass reaches 0.8) */
    p = plain();
    p.top_p = 0.7f;
    s = smp_new(&p, 4);
    histogram(s, lm, 4, 20000, freq);
    CHECK(freq[2] == 0 && freq[3] == 0);
    CHECKF(fabs(freq[0] - 0.625) < 0.02, "top-p %f", freq[0]);
    smp_free(s);
    /* top-p 0.45 keeps exactly the first (its mass alone reaches it) */
    p.top_p = 0.45f;
    s = smp_new(&p, 4);
    histogram(s, lm, 4, 2000, freq);
    CHECK(freq[0] > 0.99 && freq[1] == 0 && freq[2] == 0 && freq[3] == 0);
    smp_free(s);

    /* top-p (bucketed selection) against a brute-force sort on a random vocabulary */
    {
        enum { V = 2000 };
        static float lv[V];
        static int order[V], kept[V];
        for (int i = 0; i < V; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            lv[i] = (float)((x >> 33) % 100000) / 10000.0f; /* [0, 10): a long tail */
            order[i] = i;
        }
        double z = 0;
        for (int i = 0; i < V; i++) z += exp(lv[i]);
        for (int i = 1; i < V; i++) /* insertion sort, best first, ties by id */
            for (int j = i; j > 0 && (lv[order[j]] > lv[order[j - 1]] ||
                                      (lv[order[j]] == lv[order[j - 1]] && order[j] < order[j - 1])); j--) {
                int t = order[j];
                order[j] = order[j - 1];
                order[j - 1] = t;
            }
        double cum = 0;
        int nkept = 0;
        memset(kept, 0, sizeof(kept));
        while (cum < 0.6 * z) {
            cum += exp(lv[order[nkept]]);
            kept[order[nkept++]] = 1;
        }
        p = plain();
        p.top_p = 0.6f;
        s = smp_new(&p, V);
        int outside = 0, seen_top = 0;
        for (int i = 0; i < 4000; i++) {
            int32_t t = smp_sample(s, lv);
            outside += !(t >= 0 && t < V && kept[t]);
            seen_top |= t == order[0];
        }
        CHECKF(outside == 0 && seen_top && nkept > 10, "top-p brute force: %d outside of %d kept", outside, nkept);
        smp_free(s);
    }

    /* distribution: plain sampling at temperature 1 and 2 matches the softmax */
    float ld[5] = {1.0f, 2.0f, 0.0f, -1.0f, 1.5f};
    for (int ti = 0; ti < 2; ti++) {
        float temp = ti ? 2.0f : 1.0f;
        p = plain();
        p.temp = temp;
        s = smp_new(&p, 5);
        int draws = 40000;
        histogram(s, ld, 5, draws, freq);
        double z = 0, want[5];
        for (int i = 0; i < 5; i++) z += want[i] = exp(ld[i] / temp);
        double worst = 0;
        for (int i = 0; i < 5; i++) {
            want[i] /= z;
            double sd = sqrt(want[i] * (1 - want[i]) / draws);
            worst = fmax(worst, fabs(freq[i] - want[i]) / sd);
        }
        CHECKF(worst < 5.0, "temp %.1f: worst deviation %.2f sigma", temp, worst);
        smp_free(s);
    }

    /* same seed, same sequence; different seeds differ; reset restarts */
    p = plain();
    p.seed = 7;
    smp_sampler *a = smp_new(&p, NV), *b = smp_new(&p, NV);
    p.seed = 8;
    smp_sampler *c = smp_new(&p, NV);
    int32_t seq[64];
    int same_ab = 1, same_ac = 1;
    for (int i = 0; i < 64; i++) {
        int32_t ta = smp_sample(a, logits), tb = smp_sample(b, logits), tc = smp_sample(c, logits);
        seq[i] = ta;
        same_ab &= ta == tb;
        same_ac &= ta == tc;
    }
    CHECK(same_ab);
    CHECK(!same_ac);
    smp_reset(a);
    int same_reset = 1;
    for (int i = 0; i < 64; i++) same_reset &= smp_sample(a, logits) == seq[i];
    CHECK(same_reset);
    smp_free(a);
    smp_free(b);
    smp_free(c);

    /* penalties: exactly the tokens in the window change, by the stated rule */
    p = plain();
    p.temp = 0;
    p.repeat_penalty = 2.0f;
    p.frequency_penalty = 0.25f;
    p.presence_penalty = 0.5f;
    p.penalty_last_n = 3;
    float lp[6] = {4.0f, -2.0f, 3.0f, 1.0f, 0.5f, 3.9f};
    s = smp_new(&p, 6);
    CHECK(smp_sample(s, lp) == 0);
    smp_accept(s, 0);
    /* token 0: 4/2 - 0.25 - 0.5 = 1.25 -> token 5 (3.9) wins */
    CHECK(smp_sample(s, lp) == 5);
    smp_accept(s, 5);
    smp_accept(s, 5);
    /* window {0,5,5}: 0 -> 1.25, 5 -> 3.9/2 - 0.5 - 0.5 = 0.95, 2 -> 3.0 wins */
    CHECK(smp_sample(s, lp) == 2);
    smp_accept(s, 2);
    /* window {5,5,2} (0 left the window): 0 is back at 4.0 */
    CHECK(smp_sample(s, lp) == 0);
    smp_accept(s, 1);
    smp_accept(s, 1);
    smp_accept(s, 1);
    /* window {1,1,1}: negative logit is multiplied: -2*2 - 0.75 - 0.5; others untouched */
    CHECK(smp_sample(s, lp) == 0);
    smp_accept(s, 99); /* out of range: ignored */
    smp_accept(s, -1);
    CHECK(smp_sample(s, lp) == 0);
    smp_reset(s);
    CHECK(smp_sample(s, lp) == 0);
    smp_free(s);
    /* a penalty that pushes the negative logit the right way: only token 1 left unmasked */
    p.penalty_last_n = 4;
    s = smp_new(&p, 6);
    float ln2[3] = {-1.0f, -1.5f, -3.0f};
    smp_free(s);
    s = smp_new(&p, 3);
    smp_accept(s, 0); /* -1 -> -2 - 0.25 - 0.5 = -2.75, token 1 (-1.5) wins */
    CHECK(smp_sample(s, ln2) == 1);
    smp_free(s);

    /* mask hook: masked tokens never come out, the hook sees every sample */
    p = plain();
    p.temp = 1.0f;
    s = smp_new(&p, NV);
    smp_set_mask(s, mask_even, NULL);
    g_mask_calls = 0;
    ok = 1;
    for (int i = 0; i < 500; i++) ok &= (smp_sample(s, logits) & 1) == 1;
    CHECK(ok && g_mask_calls == 500);
    smp_set_mask(s, NULL, NULL);
    int any_even = 0;
    for (int i = 0; i < 500; i++) any_even |= (smp_sample(s, logits) & 1) == 0;
    CHECK(any_even);
    smp_free(s);

    /* large vocabulary with top-p only (the bucketed path), and nothing allocates per token */
    enum { BV = 150000 };
    float *big = hn_malloc(BV * sizeof(float));
    for (int i = 0; i < BV; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        big[i] = (float)((x >> 33) % 10000) / 1000.0f;
    }
    big[777] = 30.0f; /* dominant: mass ~ 1 */
    p = plain();
    p.top_p = 0.9f;
    s = smp_new(&p, BV);
    size_t before = hn_alloc_bytes();
    hn_alloc_fail_after(0);
    ok = 1;
    for (int i = 0; i < 20; i++) ok &= smp_sample(s, big) == 777;
    hn_alloc_fail_after(-1);
    CHECK(ok && hn_alloc_bytes() == before);
    smp_free(s);
    hn_free(big);
    TEST_DONE();
}
