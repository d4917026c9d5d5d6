/* engine_spec.c: the engine's speculation (DESIGN.md, "Speculative
 * decoding"): how many tokens each decoding request drafts into a step and
 * from which drafter (the suffix structure, a draft model, the MTP layer,
 * DFlash), the hybrids' spare state slots for the drafted rows' snapshots,
 * and the verification of a drafted block against the target's rows (the
 * accepted tokens delivered, the rest rolled back). */
#include <math.h>
#include <string.h>

#include "../core/alloc.h"
#include "../core/clock.h"
#include "engine_int.h"

/* Hybrids speculating: makes n spare state slots available for this step's
 * snapshots beyond those taken (mapping more as needed); returns how many
 * are (fewer only when a slot cannot be mapped). */
static int32_t spare_room(eng_engine *e, int32_t n) {
    while (e->n_spare < e->spare_used + n && e->n_spare < e->spare_cap) {
        int32_t slot = kv_state_alloc(e->kv);
        if (slot < 0) break;
        e->spare[e->n_spare++] = slot;
    }
    int32_t room = e->n_spare - e->spare_used;
    return room < n ? room : n;
}

/* Gives the spare slots back (the engine is idle: memory follows the running sequences). */
void eng_spares_release(eng_engine *e) {
    while (e->n_spare > 0) kv_state_free(e->kv, e->spare[--e->n_spare]);
    e->spare_used = 0;
}

/* The most tokens a decoding request may draft now (context, max_tokens, the engine's cap). */
static int32_t draft_room(const eng_engine *e, const ereq *q) {
    int32_t kmax = e->spec_max, L = q->seq.n_tokens;
    if (kmax > e->n_ctx - 1 - L) kmax = e->n_ctx - 1 - L;
    if (q->max_gen > 0 && kmax > q->max_gen - q->n_gen - 1) kmax = q->max_gen - q->n_gen - 1;
    return kmax;
}

/* k drafted rows taken for q in this step (k may be 0): the step's row and
 * token budget, and on a hybrid a snapshot slot per drafted row */
static int32_t take_draft(eng_engine *e, ereq *q, int32_t k, double ex, int32_t *rows_left, int32_t *rows, double *toks) {
    q->n_draft = k;
    if (e->hybrid && k > 0) {
        q->snap0 = e->spare_used;
        q->v_pos = INT32_MAX; /* verify sets it */
        e->spare_used += k;
    }
    *rows_left -= k;
    *rows += k;
    *toks += ex;
    return k;
}

/* Speculation: drafts tokens to verify after a decoding request's token
 * this step (q->n_draft, q->draft), as many as the controller finds worth
 * their rows (spec/ctl.h) within what is left of the step's drafted rows
 * (spec_rows, beside the token budget: drafts never change how prefill
 * is chunked), of the context and of max_tokens. rows and toks are
 * the step's planned rows and expected tokens so far (updated). */
int32_t eng_choose_draft(eng_engine *e, ereq *q, int32_t *rows_left, int32_t *rows, double *toks, int32_t ctx) {
    q->n_draft = 0;
    if (q->draft_model) { /* the draft model's proposal (model_drafts): its cost is paid, choose how many to verify */
        int32_t np = q->n_mprop;
        if (np > *rows_left) np = *rows_left;
        if (np > 0 && e->hybrid) np = spare_room(e, np); /* a snapshot slot per drafted row */
        if (np <= 0) return 0;
        double qv[ENG_SPEC_MAX], ex = 0;
        for (int32_t j = 0; j < np; j++)
            qv[j] = spc_calib(&e->dcal, &q->dctl, spc_conf_bucket(q->draft_p[j])) * q->draft_p[j];
        int32_t k = spc_choose_q(&e->cost, qv, np, ctx, *rows, *toks, 0, q->draft_force, &ex);
        if (k == 0 && !q->draft_noted) /* drafted but not worth a row: a miss for the acceptance rate,
                                          else a drafter too unsure to be verified would never be switched off */
            spc_observe_miss(&e->dcal, &q->dctl);
        q->draft_noted = true; /* (plan() may run twice after a preemption) */
        return take_draft(e, q, k, ex, rows_left, rows, toks);
    }
    if (!q->sfx) return 0;
    if (sfx_len(q->sfx) != q->n_toks) { /* cannot happen; never draft from a text that is not the request's */
        sfx_free(q->sfx);
        q->sfx = NULL;
        return 0;
    }
    int32_t kmax = draft_room(e, q);
    if (kmax > *rows_left) kmax = *rows_left;
    if (kmax <= 0) return 0;
    int32_t np = sfx_propose(q->sfx, 1, kmax, q->draft, q->draft_p);
    if (np > 0 && e->hybrid) np = spare_room(e, np); /* a snapshot slot per drafted row */
    if (np <= 0) return 0;
    int b = spc_len_bucket(sfx_match_len(q->sfx));
    double ex = 0;
    int32_t k = spc_choose(&e->cost, &q->ctl, b, q->draft_p, np, ctx, *rows, *toks, e->spec == ENG_SPEC_SUFFIX, &ex);
    if (k == 0 && ++q->ctl.idle >= SPC_PROBE_EVERY) /* switched off: a short probe now and then */
        k = spc_choose(&e->cost, &q->ctl, b, q->draft_p, np, ctx, *rows, *toks, true, &ex);
    if (k > 0) q->ctl.idle = 0;
    q->draft_bucket = b;
    return take_draft(e, q, k, ex, rows_left, rows, toks);
}

/* A model drafter's choice for a decoding request (the draft model's, before
 * the plan; the MTP layer's, after the step before): 0 when it does not draft
 * now, else the most tokens to draft, at least *min_k, and in *pick (NULL:
 * not wanted) how many the controller chose for the expected acceptance
 * (DFlash drafts that many: its tokens come at once). The controller decides
 * from the expected acceptance (spc_acc_rate) and the drafter's cost per
 * token dcost whether drafting pays and how far (in auto mode a suffix
 * proposal worth verifying comes first and the model is not run for it; in
 * draft and mtp mode it always drafts, at least a probe's length; a
 * switched-off request is probed every SPC_PROBE_EVERY steps or rarer).
 * nd decoding requests at context ctx; c1: a one-row target step; per:
 * each request's share of the step's drafted rows. */
static int32_t model_draft_k(eng_engine *e, ereq *q, int32_t ctx, int32_t nd, double dcost, double c1, int32_t per,
                             int32_t *min_k, int32_t *pick) {
    int32_t kmax = draft_room(e, q);
    if (kmax > per) kmax = per;
    if (kmax <= 0) return 0;
    if (e->spec == ENG_SPEC_AUTO && q->sfx && sfx_len(q->sfx) == q->n_toks) {
        int32_t np = sfx_propose(q->sfx, 1, kmax, q->draft, q->draft_p);
        double ex = 0;
        if (np > 0 && spc_choose(&e->cost, &q->ctl, spc_len_bucket(sfx_match_len(q->sfx)), q->draft_p, np, ctx, nd,
                                 nd, false, &ex) > 0)
            return 0; /* the free drafter's proposal pays: plan() takes it */
    }
    double a = spc_acc_rate(&e->dcal, &q->dctl, 0.6), qa[ENG_SPEC_MAX], ex = 0;
    for (int32_t j = 0; j < kmax; j++) qa[j] = a;
    bool force = e->spec == ENG_SPEC_DRAFT || e->spec == ENG_SPEC_MTP || e->spec == ENG_SPEC_DFLASH;
    int32_t k = spc_choose_q(&e->cost, qa, kmax, ctx, nd, nd, dcost, force, &ex);
    /* switched off: a short probe now and then, rarer as the drafter's steps cost more than
     * a target step (so that probing costs at most about 1/SPC_PROBE_EVERY of the time) and
     * after each probe that had nothing accepted */
    int32_t every = (SPC_PROBE_EVERY << (q->dprobe_fails < 4 ? q->dprobe_fails : 4)) *
                    (1 + (int32_t)(DRAFT_PROBE_LEN * dcost / c1));
    if (k == 0 && ++q->dctl.idle >= every) {
        k = kmax < DRAFT_PROBE_LEN ? kmax : DRAFT_PROBE_LEN;
        force = q->dprobe = true;
    }
    if (k == 0) return 0;
    q->dctl.idle = 0;
    q->draft_force = force;
    *min_k = force ? (k < DRAFT_PROBE_LEN ? k : DRAFT_PROBE_LEN) : 1;
    if (pick) *pick = k;
    return kmax;
}

/* The step's decoding requests (each one token to compute: nd of them) and
 * their longest context, for a model drafter; each request's proposal is
 * reset. */
static int32_t decoding_ctx(eng_engine *e, int32_t *ctx) {
    int32_t nd = 0;
    *ctx = 0;
    for (int32_t i = 0; i < e->n_running; i++) {
        ereq *q = e->running[i];
        q->draft_model = q->draft_force = q->draft_noted = q->dprobe = false;
        q->n_mprop = 0;
        if (q->n_toks - q->seq.n_tokens == 1) {
            nd++;
            if (q->n_toks > *ctx) *ctx = q->n_toks;
        }
    }
    return nd;
}

/* Speculation with a draft model, before the plan: for each decoding
 * request the controller decides whether and how far it drafts
 * (model_draft_k); then one drf_draft call drafts for all of them, every
 * drafter step batching all sessions' rows, each stopping once its
 * calibrated running acceptance falls below what one more token costs.
 * choose_draft then picks how many of the proposal to verify. */
void eng_model_drafts(eng_engine *e) {
    int32_t ctx, nj = 0, nd = decoding_ctx(e, &ctx);
    if (!nd) return;
    const double dcost = drf_token_cost(e->drf, &e->cost, ctx, nd, e->draft_ratio);
    const double floor = spc_draft_floor(&e->cost, ctx, nd, nd, dcost), c1 = spc_cost_est(&e->cost, ctx, 1);
    int32_t per = e->spec_rows / nd > 0 ? e->spec_rows / nd : 1;
    for (int32_t i = 0; i < e->n_running; i++) {
        ereq *q = e->running[i];
        if (q->n_toks - q->seq.n_tokens != 1 || !q->dseq) continue;
        int32_t min_k = 1, kmax = model_draft_k(e, q, ctx, nd, dcost, c1, per, &min_k, NULL);
        if (kmax == 0) continue;
        drf_job *j = &e->djobs[nj++];
        *j = (drf_job){.seq = q->dseq, .toks = q->toks, .n_toks = q->n_toks, .k = kmax, .min_k = min_k,
                       .min_run = (float)floor, .out = q->draft, .p = q->draft_p};
        for (int b = 0; b < SPC_LEN_B; b++) j->cal[b] = spc_calib(&e->dcal, &q->dctl, b);
        q->draft_model = true;
    }
    if (!nj) return;
    hn_err err;
    drf_draft(e->drf, e->djobs, nj, &err); /* a failed job drafts nothing; the target decodes plainly */
    for (int32_t i = 0, j = 0; i < e->n_running && j < nj; i++) {
        ereq *q = e->running[i];
        if (!q->draft_model) continue;
        q->n_mprop = e->djobs[j++].n_out;
        if (q->n_mprop == 0) q->draft_model = false;
    }
}

/* Speculation with a drafter that reads the target's hidden states (the
 * MTP layer or DFlash), right after a step (it reads the step's hidden
 * states): every request the step computed rows of, whose drafter sequence
 * follows it, catches up on the rows it kept, and those that will decode
 * next step draft as model_draft_k decides (MTP: the first token from the
 * catch-up's last row, each further one an MTP step, spec/mtp.h; DFlash: a
 * block forward after the injection, spec/dflash.h); the proposal waits in
 * q->draft for the next plan, where choose_draft picks how many to verify.
 * In auto mode a request whose probes keep missing (the fourth in a row, at
 * the longest interval) stops following (no catch-up rows for it from then
 * on). */
void eng_hd_drafts(eng_engine *e) {
    int32_t ctx, nj = 0, nd = decoding_ctx(e, &ctx);
    const double dcost = !nd ? 0 : e->mtp ? mtp_token_cost(e->mtp, &e->cost, ctx, nd, e->draft_ratio)
                                          : dfl_token_cost(e->dfl, &e->cost, ctx, nd, e->draft_ratio);
    const double floor = nd ? spc_draft_floor(&e->cost, ctx, nd, nd, dcost) : 0, c1 = spc_cost_est(&e->cost, ctx, 1);
    int32_t per = nd && e->spec_rows / nd > 0 ? e->spec_rows / nd : 1;
    for (int32_t i = 0; i < e->n_running; i++) {
        ereq *q = e->running[i];
        if (q->row0 < 0 || !hd_has(q) || !q->hd_ok) continue;
        int32_t kept = q->seq.n_tokens - q->L0;
        if (hd_len(q) != q->L0 || kept < 0 || (e->spec == ENG_SPEC_AUTO && q->dprobe_fails >= 4)) {
            eng_hd_leave(e, q); /* (kept < 0: the target recomputes from scratch, which cannot happen) */
            continue;
        }
        if (kept == 0) continue;
        int32_t at = nj++; /* in the order of the step's rows */
        while (at > 0 && e->mreq[at - 1]->row0 > q->row0) {
            e->mreq[at] = e->mreq[at - 1];
            at--;
        }
        e->mreq[at] = q;
    }
    if (!nj) return;
    for (int32_t i = 0; i < nj; i++) {
        ereq *q = e->mreq[i];
        int32_t min_k = 1, k = 0, pick = 0;
        if (q->n_toks - q->seq.n_tokens == 1) k = model_draft_k(e, q, ctx, nd, dcost, c1, per, &min_k, &pick);
        if (e->dfl) { /* a block's slots come at once: as many as the controller chose (their head rows cost) */
            e->fjobs[i] = (dfl_job){.seq = q->fseq, .toks = q->toks, .from = q->L0, .n = q->seq.n_tokens - q->L0,
                                    .row0 = q->row0, .k = k ? pick : 0, .out = q->draft, .p = q->draft_p};
            continue;
        }
        mtp_job *j = &e->mjobs[i];
        *j = (mtp_job){.seq = q->mseq, .toks = q->toks, .from = q->L0, .n = q->seq.n_tokens - q->L0, .row0 = q->row0,
                       .k = k, .min_k = min_k, .min_run = (float)floor, .out = q->draft, .p = q->draft_p};
        for (int b = 0; b < SPC_LEN_B; b++) j->cal[b] = spc_calib(&e->dcal, &q->dctl, b);
    }
    hn_err err;
    /* a failed job drafts nothing (and stops following) */
    if (e->dfl) dfl_step(e->dfl, e->fjobs, nj, &err);
    else mtp_step(e->mtp, e->mjobs, nj, &err);
    for (int32_t i = 0; i < nj; i++) {
        ereq *q = e->mreq[i];
        bool failed = e->dfl ? e->fjobs[i].failed : e->mjobs[i].failed;
        if (failed) {
            q->hd_ok = false;
            e->hd_off++;
        }
        q->n_mprop = e->dfl ? e->fjobs[i].n_out : e->mjobs[i].n_out;
        q->draft_model = q->n_mprop > 0;
        if (!q->draft_model) q->draft_force = q->dprobe = false;
    }
}


/* Verifies a drafted block: rows[0..n_draft] are the logits after the decode
 * token and after each drafted token. Position by position, in order, the
 * token is sampled as plain decoding would (the constraint's mask for the
 * state reached so far applied on the host; row 0 had its mask on the
 * backend), the draft accepted by smp_sample_draft's rule, and delivered;
 * the first rejection's token (or, all accepted, the last row's) ends it.
 * Then the K/V of the positions whose tokens were not kept are rolled back
 * (the sequence truncated: emptied blocks go back to the pool). Returns
 * false if the request finished. */
bool eng_verify(eng_engine *e, ereq *q, float *rows, eng_finish *fin, hn_status *st, const char **msg) {
    const int32_t k = q->n_draft, L = q->n_toks - 1, V = e->n_vocab;
    int32_t acc_n = 0;
    bool go = true;
    for (int32_t j = 0; j <= k; j++) {
        float *row = rows + (size_t)j * (size_t)V;
        if (j > 0 && q->r.allowed) {
            const uint32_t *m = q->r.allowed(q->r.mask_ctx);
            if (m) smp_apply_allowed(row, m, V);
        }
        int acc = 0;
        int32_t tok = j < k ? smp_sample_draft(q->smp, row, q->draft[j], &acc) : smp_sample(q->smp, row);
        if (j < k && q->draft_model)
            spc_observe(&e->dcal, &q->dctl, spc_conf_bucket(q->draft_p[j]), q->draft_p[j], acc != 0);
        else if (j < k) spc_observe(&e->cost, &q->ctl, q->draft_bucket, q->draft_p[j], acc != 0);
        acc_n += acc;
        go = eng_deliver(e, q, tok, fin, st, msg);
        /* a cancel from the callback (a stop string) takes no further tokens */
        if (!go || !acc || atomic_load(&q->cancel)) break;
    }
    if (q->draft_model) q->dprobe_fails = acc_n > 0 ? 0 : q->dprobe ? q->dprobe_fails + 1 : q->dprobe_fails;
    q->st.n_drafted += k;
    q->st.n_accepted += acc_n;
    e->spec_drafted += (uint64_t)k;
    e->spec_accepted += (uint64_t)acc_n;
    /* keep the positions whose K/V hold the request's tokens: the decode
     * token's and the accepted drafts' (an EOG is accepted but not kept) */
    int32_t keep = L + 1;
    for (int32_t m = 0; m < k && keep < q->n_toks && q->toks[keep] == q->draft[m]; m++) keep++;
    kv_seq_truncate(e->kv, &q->seq, keep);
    if (q->snap0 >= 0 && q->seq.state >= 0) {
        /* hybrids: the recurrent state rolls back to the last kept row's,
         * which the step wrote into a spare slot (the last row's is the live
         * slot's already): the two slots swap roles, nothing is copied */
        int32_t m = keep - (L + 1);
        if (m < k) {
            int32_t t = q->seq.state;
            q->seq.state = e->spare[q->snap0 + m];
            e->spare[q->snap0 + m] = t;
        }
        q->v_pos = L;
        q->seq.state_len = q->seq.n_tokens;
        if (q->seq.n_tokens != keep) { /* cannot happen (drafts never reach a published block): recompute it all */
            kv_seq_truncate(e->kv, &q->seq, 0);
            q->seq.state_len = 0;
            q->snap0 = -1;
            q->ck_roll = q->ck_from = -1; /* blocks it no longer holds */
        }
    }
    q->n_draft = 0;
    return go;
}
