/* test_spec_ctl: the speculation controller (spec/ctl.h): the cost table
 * (means, clipping, interpolation, the prior), the choice of a draft length
 * (long drafts when verification is cheap and the drafter is right; none
 * when the drafter is mostly wrong or when a verify step costs several
 * decode steps, as in the 16K-context failure the field reported), the
 * probe, and calibration from observed acceptance. */
#include <math.h>

#include "../src/spec/ctl.h"
#include "test.h"

int main(void) {
    spc_cost c;
    hn_err err;
    CHECK(spc_cost_init(&c, 64, &err) == HN_OK);
    CHECK(spc_ctx_bucket(0) == 0 && spc_ctx_bucket(1023) == 0 && spc_ctx_bucket(1024) == 1 &&
          spc_ctx_bucket(5000) == 3 && spc_ctx_bucket(1 << 30) == SPC_CTX_B - 1);
    CHECK(spc_len_bucket(1) == 0 && spc_len_bucket(3) == 1 && spc_len_bucket(15) == 2 && spc_len_bucket(16) == 3);
    /* nothing measured: the prior (ratios only) */
    CHECK(fabs(spc_cost_est(&c, 100, 1) - 1.0) < 1e-9 && fabs(spc_cost_est(&c, 100, 11) - 1.5) < 1e-9);
    /* a mean of the first samples, clipped outliers */
    for (int i = 0; i < 3; i++) spc_cost_record(&c, 100, 1, 10.0);
    spc_cost_record(&c, 100, 1, 1000.0); /* a descheduled step: counts as 20 */
    CHECK(fabs(spc_cost_est(&c, 100, 1) - 12.5) < 1e-9);
    for (int i = 0; i < 4; i++) spc_cost_record(&c, 100, 9, 14.0);
    CHECK(fabs(spc_cost_est(&c, 100, 5) - (12.5 + 1.5 * 4 / 8)) < 1e-9); /* interpolated */
    CHECK(spc_cost_est(&c, 100, 20) > 14.0);                            /* extrapolated with the prior slope */
    CHECK(fabs(spc_cost_est(&c, 5000, 1) - 1.0) < 1e-9);                /* another context bucket: its own */

    spc_req r;
    spc_req_init(&r);
    float hi[16], lo[16];
    for (int i = 0; i < 16; i++) {
        hi[i] = 1.0f;
        lo[i] = 0.01f;
    }
    double ex;
    /* cheap verification, a drafter that is right: a long draft */
    int32_t k = spc_choose(&c, &r, 3, hi, 16, 100, 1, 1, false, &ex);
    CHECKF(k >= 8 && ex > 5, "cheap and right: k %d, E %.2f", (int)k, ex);
    /* mostly wrong: nothing, unless forced (a probe of SPC_PROBE_LEN) */
    CHECK(spc_choose(&c, &r, 0, lo, 16, 100, 1, 1, false, &ex) == 0);
    CHECK(spc_choose(&c, &r, 0, lo, 16, 100, 1, 1, true, &ex) == SPC_PROBE_LEN && ex < 0.1);
    /* the long-context failure: a verify step costs 5 decode steps; even a perfect drafter of 4 loses */
    for (int i = 0; i < 4; i++) {
        spc_cost_record(&c, 20000, 1, 10.0);
        for (int n = 2; n <= 64; n++) spc_cost_record(&c, 20000, n, 52.0);
    }
    CHECK(spc_choose(&c, &r, 3, hi, 4, 20000, 1, 1, false, &ex) == 0);
    /* but 16 right tokens for the price of 5 steps still pay */
    CHECK(spc_choose(&c, &r, 3, hi, 16, 20000, 1, 1, false, &ex) > 4);
    /* other sessions in the step: a draft must pay for slowing their tokens too */
    for (int i = 0; i < 4; i++)
        for (int n = 1; n <= 64; n++) spc_cost_record(&c, 3000, n, 10.0 * (1 + 0.2 * (n - 1)));
    float mid[4] = {0.6f, 0.6f, 0.6f, 0.6f};
    CHECK(spc_choose(&c, &r, 2, mid, 4, 3000, 1, 1, false, &ex) >= 1);  /* alone: 1.6 tokens for 1.2x */
    CHECK(spc_choose(&c, &r, 2, mid, 4, 3000, 8, 8, false, &ex) == 0);  /* with 7 others: not worth slowing 8 */
    /* calibration: a drafter that claims p = 1 but is right a fifth of the time */
    for (int i = 0; i < 200; i++) spc_observe(&c, &r, 3, 1.0f, i % 5 == 0);
    k = spc_choose(&c, &r, 3, hi, 16, 100, 1, 1, false, &ex);
    CHECKF(k <= 3 && ex < 0.3, "calibrated to 0.2: k %d, E %.2f", (int)k, ex);
    /* a fresh request starts from the engine-wide calibration, and learns its own */
    spc_req r2;
    spc_req_init(&r2);
    k = spc_choose(&c, &r2, 3, hi, 16, 100, 1, 1, false, &ex);
    CHECK(k <= 3 && ex < 0.3);
    for (int i = 0; i < 100; i++) spc_observe(&c, &r2, 3, 1.0f, true);
    CHECK(spc_choose(&c, &r2, 3, hi, 16, 100, 1, 1, false, &ex) >= 8);
    /* limits: no proposal, no room */
    CHECK(spc_choose(&c, &r2, 3, hi, 0, 100, 1, 1, false, &ex) == 0);
    CHECK(spc_choose(&c, &r2, 3, hi, 16, 100, 64, 1, false, &ex) == 0);

    /* a drafter that costs time (a draft model): ctx 100 has 1 row at 12.5 ms, 9 rows at 14 ms */
    CHECK(spc_cost_known(&c, 100) && spc_cost_known(&c, 20000) && !spc_cost_known(&c, 1500));
    CHECK(spc_conf_bucket(0.1f) == 0 && spc_conf_bucket(0.5f) == 1 && spc_conf_bucket(0.8f) == 2 &&
          spc_conf_bucket(0.95f) == 3);
    double q9[16], q5[16], ex0 = 0, ex1 = 0;
    for (int i = 0; i < 16; i++) {
        q9[i] = 0.9;
        q5[i] = 0.5;
    }
    int32_t k0 = spc_choose_q(&c, q9, 16, 100, 1, 1, 0, false, &ex0);
    int32_t k1 = spc_choose_q(&c, q9, 16, 100, 1, 1, 2.0, false, &ex1); /* a drafter step of 2 ms per token */
    CHECKF(k0 >= 8 && k1 >= 1 && k1 < k0 && ex1 < ex0, "draft cost shortens the draft: %d -> %d", (int)k0, (int)k1);
    /* a drafter as dear as the target: never worth it at 0.5 acceptance, nor even at 0.9 */
    CHECK(spc_choose_q(&c, q5, 16, 100, 1, 1, 12.5, false, &ex) == 0);
    CHECK(spc_choose_q(&c, q9, 16, 100, 1, 1, 12.5, false, &ex) == 0);
    /* ... unless forced (the draft mode, a probe): a probe's length */
    CHECK(spc_choose_q(&c, q5, 16, 100, 1, 1, 12.5, true, &ex) == SPC_PROBE_LEN && ex > 0.9 && ex < 1.0);
    /* free drafting with q = cal * p is spc_choose */
    float p7[16];
    double q7[16];
    for (int i = 0; i < 16; i++) p7[i] = 0.7f;
    double cal = spc_calib(&c, &r2, 2);
    for (int i = 0; i < 16; i++) q7[i] = cal * p7[i];
    CHECK(spc_choose(&c, &r2, 2, p7, 16, 100, 1, 1, false, &ex0) == spc_choose_q(&c, q7, 16, 100, 1, 1, 0, false, &ex1) &&
          fabs(ex0 - ex1) < 1e-12);
    /* the floor: one more token must be accepted at least (drafter + marginal row) / step of the time */
    double fl = spc_draft_floor(&c, 100, 1, 1, 2.0), row = spc_cost_est(&c, 100, 2) - spc_cost_est(&c, 100, 1);
    CHECKF(fabs(fl - (2.0 + row) / 12.5) < 1e-9, "floor %.4f", fl);
    /* the acceptance rate: prior, then engine-wide, then the request's own */
    spc_cost c2;
    CHECK(spc_cost_init(&c2, 8, &err) == HN_OK);
    spc_req r3, r4;
    spc_req_init(&r3);
    spc_req_init(&r4);
    CHECK(spc_acc_rate(&c2, &r3, 0.6) == 0.6);
    for (int i = 0; i < 40; i++) spc_observe(&c2, &r3, 0, 0.5f, i % 4 != 0);
    double a3 = spc_acc_rate(&c2, &r3, 0.6), a4 = spc_acc_rate(&c2, &r4, 0.6);
    CHECKF(a3 > 0.6 && a3 < 0.9 && fabs(a4 - a3) < 1e-9, "acceptance %.3f, fresh %.3f", a3, a4);
    for (int i = 0; i < 40; i++) spc_observe(&c2, &r4, 0, 0.5f, false);
    CHECK(spc_acc_rate(&c2, &r4, 0.6) < 0.1 && spc_acc_rate(&c2, &r3, 0.6) == a3);
    /* proposals not worth verifying count as misses for the rate */
    spc_req r5;
    spc_req_init(&r5);
    for (int i = 0; i < 10; i++) spc_observe(&c2, &r5, 0, 0.5f, true);
    double a5 = spc_acc_rate(&c2, &r5, 0.6);
    for (int i = 0; i < 40; i++) spc_observe_miss(&c2, &r5);
    CHECKF(a5 > 0.99 && spc_acc_rate(&c2, &r5, 0.6) < 0.2, "misses: %.3f -> %.3f", a5, spc_acc_rate(&c2, &r5, 0.6));
    spc_cost_free(&c2);
    spc_cost_free(&c);
    TEST_DONE();
}
