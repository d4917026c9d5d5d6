/* ctl.h: the speculation controller: how many drafted tokens to verify, from
 * measured costs and measured acceptance, so that speculation can stay on
 * by default and not slow decoding.
 *
 * Cost. The engine records the wall time of every step by its number of
 * rows (tokens) and context bucket (the longest sequence in the step:
 * <1K, <2K, <4K, ... >=32K; attention makes long contexts' rows dearer), as
 * a robust running mean (a sample is clipped to [0.5x, 2x] of the mean
 * before it enters). A row count not measured yet is interpolated from its
 * measured neighbours, else estimated with a prior slope of 5% of a one-row
 * step per extra row (the trained test model's verify of 8 costs ~1.3
 * steps on this CPU); only ratios between row counts are used.
 *
 * Acceptance. The drafter gives each drafted token a probability p_j (that
 * it is right when the ones before are). A calibration per match-length
 * bucket (1, 2-3, 4-15, 16+ tokens of matched context) learns how true
 * those are: cal = sum(accepted) / sum(p) over the verified positions
 * (each seen only when all before it were accepted), decayed (x0.95 per
 * observation), per request, starting from the engine-wide figure. A
 * token is then right with q_j = min(0.99, cal * p_j), and k drafted tokens
 * yield E(k) = sum_j prod_{i<=j} q_i accepted ones on average.
 *
 * Choice. Adding k drafted rows to a step of R rows that yields T tokens
 * is worth it when (T + E(k)) / cost(R + k) > (1 + margin) * T / cost(R):
 * aggregate tokens per second, so one session's drafts do not slow the
 * others' decoding for less than they give. The best k wins; none when
 * no k passes. A request whose drafts are switched off is re-probed (a
 * short draft) every 32 steps, so that acceptance that has become likely
 * (the reply started quoting) is noticed.
 *
 * A drafter that costs time (a draft model: spec/draft.h) adds its own
 * cost: k drafted tokens cost k drafter steps, d each (the drafter's own
 * step table, per session, in the target table's units), so the choice is
 * (T + E(k)) / (cost(R + k) + k d) against plain; spc_choose_q takes the
 * calibrated q_j directly (a draft model's p_j is its softmax probability,
 * calibrated per confidence bucket, spc_conf_bucket) and that d, and
 * spc_draft_floor is the running acceptance probability below which one
 * more drafted token no longer pays for its drafter step and its row.
 * Before anything is drafted a request's expected per-token acceptance is
 * spc_acc_rate (decayed, per request, starting from the engine-wide
 * figure). Nothing here allocates after spc_cost_init. */
#ifndef HN_SPEC_CTL_H
#define HN_SPEC_CTL_H

#include <stdbool.h>
#include <stdint.h>

#include "../core/status.h"

enum { SPC_CTX_B = 7, SPC_LEN_B = 4, SPC_PROBE_EVERY = 32, SPC_PROBE_LEN = 4 };

typedef struct spc_cost {
    int32_t cap;         /* most rows recorded */
    double *ms;          /* [SPC_CTX_B][cap + 1] mean step time */
    uint32_t *n;         /* [SPC_CTX_B][cap + 1] samples */
    double cal_num[SPC_LEN_B], cal_den[SPC_LEN_B]; /* engine-wide calibration */
    double margin;       /* gain needed over plain (0.02) */
    double acc_num, acc_den; /* engine-wide acceptance per verified position (decayed) */
} spc_cost;

typedef struct spc_req {
    double cal_num[SPC_LEN_B], cal_den[SPC_LEN_B];
    int32_t idle;        /* steps since its last draft while it had a proposal */
    double acc_num, acc_den; /* acceptance per verified position (decayed) */
} spc_req;

hn_status spc_cost_init(spc_cost *c, int32_t cap_rows, hn_err *err);
void spc_cost_free(spc_cost *c);
/* A request's controller state, starting from nothing (engine-wide priors apply). */
void spc_req_init(spc_req *r);

int spc_ctx_bucket(int32_t ctx);
int spc_len_bucket(int32_t match_len);
/* Records one step of `rows` rows at context ctx that took ms. */
void spc_cost_record(spc_cost *c, int32_t ctx, int32_t rows, double ms);
/* The estimated time of a step of `rows` rows at ctx (in the units recorded,
 * or relative to a one-row step when nothing is recorded). */
double spc_cost_est(const spc_cost *c, int32_t ctx, int32_t rows);

/* How many of the nprop proposed tokens (probabilities p[0..nprop)) to
 * verify in a step that has base_rows rows yielding base_tokens tokens so
 * far; force: at least one (the suffix mode, or a probe). *expect gets
 * E(k) of the choice. */
int32_t spc_choose(const spc_cost *c, const spc_req *r, int len_bucket, const float *p, int32_t nprop, int32_t ctx,
                   int32_t base_rows, double base_tokens, bool force, double *expect);
/* One verified position: its drafted probability and whether it was accepted. */
void spc_observe(spc_cost *c, spc_req *r, int len_bucket, float p, bool accepted);

/* A drafted position that was not verified (not worth its row): a miss for
 * spc_acc_rate only (the calibration sees verified positions). */
void spc_observe_miss(spc_cost *c, spc_req *r);
/* The calibration (accepted / sum of p) of bucket b: the request's when it
 * has evidence, else the engine-wide one, else 1. */
double spc_calib(const spc_cost *c, const spc_req *r, int b);
/* A draft model's confidence bucket of a drafted token's probability p
 * (<0.3, <0.6, <0.9, >=0.9), used in place of the match-length bucket. */
int spc_conf_bucket(float p);
/* Whether any step of context bucket ctx was measured (spc_cost_est is then
 * in ms, else in units of a one-row step). */
bool spc_cost_known(const spc_cost *c, int32_t ctx);
/* spc_choose with calibrated probabilities q[0..nprop) (each clipped to
 * [0, 0.99]) and draft_cost, the cost of each drafted token beyond its row
 * (a drafter step; 0 when already paid or free), in cost(R)'s units. */
int32_t spc_choose_q(const spc_cost *c, const double *q, int32_t nprop, int32_t ctx, int32_t base_rows,
                     double base_tokens, double draft_cost, bool force, double *expect);
/* The running acceptance probability below which drafting one more token
 * does not pay: (draft_cost + the marginal row's cost) * tokens / cost. */
double spc_draft_floor(const spc_cost *c, int32_t ctx, int32_t base_rows, double base_tokens, double draft_cost);
/* Expected acceptance of a drafted position (decayed mean over verified
 * positions: the request's, else the engine-wide one, else prior). */
double spc_acc_rate(const spc_cost *c, const spc_req *r, double prior);
/* A model drafter's greedy token of a logits row (the lowest id among equal
 * maxima, over the first n) and its softmax probability over all n_row
 * (~1e-4 relative: a confidence, not a law anything samples from). */
int32_t spc_argmax_p(const float *row, int32_t n, int32_t n_row, float *p);

#endif
