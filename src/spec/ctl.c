/* ctl.c: the speculation controller of ctl.h. */
#include "ctl.h"

#include <math.h>
#include <string.h>

#include "../core/alloc.h"

#define PRIOR_SLOPE 0.05 /* extra cost per row, relative to a one-row step */
#define DECAY 0.95

hn_status spc_cost_init(spc_cost *c, int32_t cap_rows, hn_err *err) {
    memset(c, 0, sizeof *c);
    if (cap_rows < 1) cap_rows = 1;
    c->cap = cap_rows;
    size_t n = (size_t)SPC_CTX_B * (size_t)(cap_rows + 1);
    c->ms = hn_calloc(n, sizeof *c->ms);
    c->n = hn_calloc(n, sizeof *c->n);
    if (!c->ms || !c->n) {
        spc_cost_free(c);
        return hn_errf(err, HN_ERR_NOMEM, "speculation: out of memory");
    }
    c->margin = 0.02;
    return HN_OK;
}

void spc_cost_free(spc_cost *c) {
    hn_free(c->ms);
    hn_free(c->n);
    c->ms = NULL;
    c->n = NULL;
}

void spc_req_init(spc_req *r) { memset(r, 0, sizeof *r); }

int spc_ctx_bucket(int32_t ctx) {
    int b = 0;
    for (int32_t lim = 1024; b < SPC_CTX_B - 1 && ctx >= lim; lim *= 2) b++;
    return b;
}

int spc_len_bucket(int32_t ml) { return ml <= 1 ? 0 : ml <= 3 ? 1 : ml <= 15 ? 2 : 3; }

void spc_cost_record(spc_cost *c, int32_t ctx, int32_t rows, double ms) {
    if (rows < 1 || rows > c->cap || !(ms > 0)) return;
    size_t i = (size_t)spc_ctx_bucket(ctx) * (size_t)(c->cap + 1) + (size_t)rows;
    uint32_t n = c->n[i];
    if (n == 0) {
        c->ms[i] = ms;
    } else {
        double m = c->ms[i];
        if (ms > 2 * m) ms = 2 * m; /* a descheduled step, or a page fault: do not let it dominate */
        if (ms < 0.5 * m) ms = 0.5 * m;
        double w = n < 8 ? 1.0 / (n + 1) : 0.1; /* a mean first, then a running one */
        c->ms[i] = m + w * (ms - m);
    }
    if (n < 0xffffffffu) c->n[i] = n + 1;
}

double spc_cost_est(const spc_cost *c, int32_t ctx, int32_t rows) {
    if (rows < 1) rows = 1;
    if (rows > c->cap) rows = c->cap;
    const size_t off = (size_t)spc_ctx_bucket(ctx) * (size_t)(c->cap + 1);
    const double *ms = c->ms + off;
    const uint32_t *n = c->n + off;
    if (n[rows] >= 2) return ms[rows];
    int32_t lo = rows - 1, hi = rows + 1;
    while (lo >= 1 && n[lo] < 2) lo--;
    while (hi <= c->cap && n[hi] < 2) hi++;
    if (lo >= 1 && hi <= c->cap) return ms[lo] + (ms[hi] - ms[lo]) * (double)(rows - lo) / (double)(hi - lo);
    if (lo >= 1) return ms[lo] * (1 + PRIOR_SLOPE * (rows - 1)) / (1 + PRIOR_SLOPE * (lo - 1));
    if (hi <= c->cap) return ms[hi] * (1 + PRIOR_SLOPE * (rows - 1)) / (1 + PRIOR_SLOPE * (hi - 1));
    return 1 + PRIOR_SLOPE * (rows - 1);
}

double spc_calib(const spc_cost *c, const spc_req *r, int b) {
    if (r && r->cal_den[b] >= 4) return r->cal_num[b] / r->cal_den[b];
    if (c->cal_den[b] >= 4) return c->cal_num[b] / c->cal_den[b];
    return 1.0; /* no evidence yet: believe the drafter */
}

int spc_conf_bucket(float p) { return p < 0.3f ? 0 : p < 0.6f ? 1 : p < 0.9f ? 2 : 3; }

bool spc_cost_known(const spc_cost *c, int32_t ctx) {
    const uint32_t *n = c->n + (size_t)spc_ctx_bucket(ctx) * (size_t)(c->cap + 1);
    for (int32_t r = 1; r <= c->cap; r++)
        if (n[r] >= 2) return true;
    return false;
}

static double clip_q(double q) { return q > 0.99 ? 0.99 : q < 0 ? 0 : q; }

int32_t spc_choose_q(const spc_cost *c, const double *q, int32_t nprop, int32_t ctx, int32_t base_rows,
                     double base_tokens, double draft_cost, bool force, double *expect) {
    *expect = 0;
    if (nprop <= 0 || base_rows < 1) return 0;
    if (base_tokens <= 0) base_tokens = 1;
    if (base_rows + nprop > c->cap) nprop = c->cap - base_rows;
    if (nprop <= 0) return 0;
    if (draft_cost < 0) draft_cost = 0;
    double c0 = spc_cost_est(c, ctx, base_rows);
    double plain = base_tokens / c0;
    double best = (1 + c->margin) * plain, e = 0, run = 1;
    int32_t bk = 0;
    double be = 0;
    for (int32_t k = 1; k <= nprop; k++) {
        run *= clip_q(q[k - 1]);
        e += run;
        double ck = spc_cost_est(c, ctx, base_rows + k);
        if (ck < c0) ck = c0; /* noise: more rows never cost less */
        double g = (base_tokens + e) / (ck + k * draft_cost);
        if (g > best) {
            best = g;
            bk = k;
            be = e;
        }
        if (run < 1e-3) break;
    }
    if (bk == 0 && force) {
        bk = nprop < SPC_PROBE_LEN ? nprop : SPC_PROBE_LEN;
        be = 0;
        run = 1;
        for (int32_t k = 1; k <= bk; k++) {
            run *= clip_q(q[k - 1]);
            be += run;
        }
    }
    *expect = be;
    return bk;
}

int32_t spc_choose(const spc_cost *c, const spc_req *r, int b, const float *p, int32_t nprop, int32_t ctx,
                   int32_t base_rows, double base_tokens, bool force, double *expect) {
    enum { QMAX = 256 };
    double q[QMAX];
    if (nprop > QMAX) nprop = QMAX;
    double cal = spc_calib(c, r, b);
    for (int32_t k = 0; k < nprop; k++) q[k] = cal * p[k];
    return spc_choose_q(c, q, nprop, ctx, base_rows, base_tokens, 0, force, expect);
}

double spc_draft_floor(const spc_cost *c, int32_t ctx, int32_t base_rows, double base_tokens, double draft_cost) {
    if (base_rows < 1) base_rows = 1;
    if (base_tokens <= 0) base_tokens = 1;
    double c0 = spc_cost_est(c, ctx, base_rows), c1 = spc_cost_est(c, ctx, base_rows + 1);
    double row = c1 > c0 ? c1 - c0 : 0;
    return (draft_cost + row) * base_tokens / c0;
}

double spc_acc_rate(const spc_cost *c, const spc_req *r, double prior) {
    if (r && r->acc_den >= 4) return r->acc_num / r->acc_den;
    if (c->acc_den >= 4) return c->acc_num / c->acc_den;
    return prior;
}

void spc_observe(spc_cost *c, spc_req *r, int b, float p, bool acc) {
    r->cal_num[b] = DECAY * r->cal_num[b] + (acc ? 1 : 0);
    r->cal_den[b] = DECAY * r->cal_den[b] + p;
    c->cal_num[b] = DECAY * c->cal_num[b] + (acc ? 1 : 0);
    c->cal_den[b] = DECAY * c->cal_den[b] + p;
    r->acc_num = DECAY * r->acc_num + (acc ? 1 : 0);
    r->acc_den = DECAY * r->acc_den + 1;
    c->acc_num = DECAY * c->acc_num + (acc ? 1 : 0);
    c->acc_den = DECAY * c->acc_den + 1;
}

void spc_observe_miss(spc_cost *c, spc_req *r) {
    r->acc_num *= DECAY;
    r->acc_den = DECAY * r->acc_den + 1;
    c->acc_num *= DECAY;
    c->acc_den = DECAY * c->acc_den + 1;
}

/* exp(x) for x <= 0 to ~1e-4 relative (a confidence estimate, not a
 * probability anything samples from), in a loop the compiler vectorizes:
 * 2^(x log2 e) split into an integer power (the exponent bits) and a
 * degree-5 polynomial of the fraction; 0 below -80. */
static inline float exp_neg(float x) {
    float t = x * 1.44269504f;
    t = t < -126.0f ? -126.0f : t;
    float fi = (float)(int32_t)t;
    if (fi > t) fi -= 1.0f;
    float f = t - fi; /* [0, 1) */
    float p = 1.8775767e-3f;
    p = p * f + 8.9893397e-3f;
    p = p * f + 5.5826318e-2f;
    p = p * f + 2.4015361e-1f;
    p = p * f + 6.9315308e-1f;
    p = p * f + 9.9999994e-1f;
    union { uint32_t u; float f; } b = {.u = (uint32_t)((int32_t)fi + 127) << 23};
    return x < -80.0f ? 0.0f : p * b.f;
}

int32_t spc_argmax_p(const float *row, int32_t n, int32_t n_row, float *p) {
    int32_t best = 0;
    float mx = row[0];
    for (int32_t i = 1; i < n; i++)
        if (row[i] > mx) {
            mx = row[i];
            best = i;
        }
    float top = mx;
    for (int32_t i = n; i < n_row; i++) top = row[i] > top ? row[i] : top;
    float sum = 0;
    for (int32_t i = 0; i < n_row; i++) sum += exp_neg(row[i] - top);
    *p = isfinite(top) && sum > 0 ? exp_neg(mx - top) / sum : 0.0f;
    return best;
}
