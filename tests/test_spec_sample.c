/* test_spec_sample: the speculative rejection rule (smp_sample_draft) keeps
 * the sampler's distribution and draws as plain sampling does (same seed,
 * same tokens as smp_sample): on small fixed distributions (temperature,
 * top-k, a draft inside and outside the kept set, a likely and an unlikely
 * draft) the emitted tokens' histogram passes a chi-square test against the
 * exact distribution, the acceptance rate matches p(draft), and at
 * temperature 0 the emitted token is the greedy one. A rule that accepted
 * the draft too often (checked with a deliberately wrong reference) fails. */
#include <math.h>

#include "../src/sample/sample.h"
#include "test.h"

/* chi-square critical values at p = 0.001 for df 1..8 */
static const double chi_crit[9] = {0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12};

static double chi2(const long *obs, const double *p, int n, long total, int *df) {
    double x = 0;
    *df = -1;
    for (int i = 0; i < n; i++) {
        if (p[i] <= 0) continue;
        double e = p[i] * (double)total;
        x += ((double)obs[i] - e) * ((double)obs[i] - e) / e;
        (*df)++;
    }
    return x;
}

/* the exact distribution of the chain for these logits: softmax(l / temp) over the top k */
static void exact(const float *l, int n, float temp, int k, double *p) {
    double tot = 0;
    for (int i = 0; i < n; i++) {
        int rank = 0;
        for (int j = 0; j < n; j++) rank += l[j] > l[i] || (l[j] == l[i] && j < i);
        p[i] = (k <= 0 || rank < k) ? exp((double)l[i] / temp) : 0;
        tot += p[i];
    }
    for (int i = 0; i < n; i++) p[i] /= tot;
}

static void one(const float *l, int n, float temp, int k, int draft, const char *what) {
    smp_params sp = smp_default_params();
    sp.temp = temp;
    sp.top_k = k;
    sp.top_p = 1.0f;
    sp.min_p = 0;
    sp.seed = 1234 + (uint64_t)draft;
    smp_sampler *s = smp_new(&sp, n);
    long obs[8] = {0}, acc = 0;
    const long N = 200000;
    int bad = 0;
    for (long t = 0; t < N; t++) {
        int a;
        int32_t tok = smp_sample_draft(s, l, draft, &a);
        if (tok < 0 || tok >= n || (a != 0) != (tok == draft)) bad++;
        else obs[tok]++;
        acc += a;
    }
    double p[8];
    exact(l, n, temp, k, p);
    int df;
    double x = chi2(obs, p, n, N, &df);
    CHECKF(!bad, "%s: %d bad results", what, bad);
    CHECKF(df >= 1 && x < chi_crit[df], "%s: chi-square %.2f (df %d), critical %.2f", what, x, df, chi_crit[df]);
    double pd = draft >= 0 && draft < n ? p[draft] : 0, rate = (double)acc / (double)N;
    CHECKF(fabs(rate - pd) < 4 * sqrt(pd * (1 - pd) / (double)N) + 1e-9, "%s: accepted %.4f, p(draft) %.4f", what, rate,
           pd);
    /* the test can fail: a rule accepting the draft with probability 0.5 on
     * top of the same draw is far from p by this test */
    if (pd < 0.3) {
        long o2[8] = {0};
        smp_reset(s);
        for (long t = 0; t < N; t++) {
            int a;
            int32_t tok = smp_sample_draft(s, l, draft, &a);
            if (t % 2) tok = draft;
            o2[tok]++;
        }
        double y = chi2(o2, p, n, N, &df);
        CHECKF(y > chi_crit[df], "%s: the wrong rule passed (chi-square %.2f)", what, y);
    }
    smp_free(s);
}

int main(void) {
    const float l[6] = {1.0f, 2.5f, 0.3f, 2.0f, -1.0f, 1.9f};
    one(l, 6, 1.0f, 0, 1, "likely draft");
    one(l, 6, 1.0f, 0, 4, "unlikely draft");
    one(l, 6, 0.7f, 4, 2, "draft cut by top-k"); /* token 2 is 5th: never accepted */
    one(l, 6, 0.7f, 4, 3, "top-k, draft kept");
    one(l, 6, 1.5f, 0, 5, "hot");
    /* the same draws as plain sampling: with one seed, smp_sample_draft's
     * tokens are smp_sample's, whatever the drafts */
    {
        smp_params q = smp_default_params();
        q.temp = 0.9f;
        q.top_k = 0;
        q.top_p = 1.0f;
        q.min_p = 0;
        q.seed = 99;
        smp_sampler *x = smp_new(&q, 6), *y = smp_new(&q, 6);
        int same = 1, a;
        for (int t = 0; t < 2000; t++) same &= smp_sample(x, l) == smp_sample_draft(y, l, t % 6, &a);
        CHECK(same);
        smp_free(x);
        smp_free(y);
    }
    /* greedy: the argmax, accepted only when it is the draft */
    smp_params sp = smp_default_params();
    sp.temp = 0;
    smp_sampler *s = smp_new(&sp, 6);
    int a;
    CHECK(smp_sample_draft(s, l, 1, &a) == 1 && a == 1);
    CHECK(smp_sample_draft(s, l, 3, &a) == 1 && a == 0);
    CHECK(smp_sample(s, l) == 1);
    /* nothing allowed */
    const float none[6] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    CHECK(smp_sample_draft(s, none, 1, &a) == -1 && a == 0);
    smp_free(s);
    sp.temp = 0.8f;
    s = smp_new(&sp, 6);
    CHECK(smp_sample_draft(s, none, 1, &a) == -1 && a == 0);
    smp_free(s);
    TEST_DONE();
}
