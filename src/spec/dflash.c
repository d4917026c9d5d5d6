/* dflash.c: the DFlash drafter of dflash.h. */
#include "dflash.h"

#include <string.h>

#include "../core/alloc.h"
#include "../core/clock.h"
#include "../kv/kv.h"
#include "../model/model.h"
#include "../sched/plan.h"

struct dfl_seq {
    kv_seq kv;
};

struct dfl_drafter {
    dfl_params p;
    model *m;
    kv_cache *kv;
    const model_dflash_info *info;
    int32_t cap_batch, cap_out, max_seqs, n_vocab;
    int32_t per_block;           /* drafts per block */
    int32_t *b_tok, *b_pos, *b_sid, *hsel;
    bool *b_want;
    kv_seq **b_seqs;
    int32_t *b_job;              /* per batch sequence: its job */
    int32_t *row_job;            /* wanted row -> job */
    step_plan plan;
    spc_cost cost;               /* block forwards, by sessions */
    dfl_stats st;
};

hn_status dfl_new(model *m, const dfl_params *pin, dfl_drafter **out, hn_err *err) {
    *out = NULL;
    if (!m || !model_has_dflash(m))
        return hn_errf(err, HN_ERR_UNSUPPORTED, "dflash: the model was loaded without a DFlash drafter");
    if (!pin || pin->n_ctx < 1 || pin->max_seqs < 1 || pin->n_blocks < 2)
        return hn_errf(err, HN_ERR_INVALID, "dflash: bad parameters");
    const model_dflash_info *info = model_dflash(m);
    if (info->block_size > model_max_batch(m))
        return hn_errf(err, HN_ERR_UNSUPPORTED, "dflash: a block of %d tokens does not fit a step of %d",
                       (int)info->block_size, (int)model_max_batch(m));
    dfl_drafter *d = hn_calloc(1, sizeof *d);
    if (!d) return hn_errf(err, HN_ERR_NOMEM, "dflash: out of memory");
    d->p = *pin;
    d->m = m;
    d->info = info;
    d->cap_batch = model_max_batch(m);
    d->cap_out = model_max_logits(m);
    d->max_seqs = d->p.max_seqs;
    d->n_vocab = model_hp(m)->n_vocab;
    d->per_block = info->sample_from_anchor ? info->block_size : info->block_size - 1;
    hn_status st;
    kv_config kc = model_dflash_kv_config(m, d->p.n_blocks, d->p.block_size);
    kc.type = d->p.k_type;
    kc.v_type = d->p.v_type;
    if (!kv_block_bytes(&kc)) {
        st = hn_errf(err, HN_ERR_UNSUPPORTED, "dflash: head dim %d does not fit the KV type", (int)info->head_dim);
        goto fail;
    }
    if ((st = kv_create(&kc, &d->kv, err))) goto fail;
    int32_t B = d->cap_batch, S = d->max_seqs;
    d->b_tok = hn_malloc(sizeof(int32_t) * (size_t)B);
    d->b_pos = hn_malloc(sizeof(int32_t) * (size_t)B);
    d->b_sid = hn_malloc(sizeof(int32_t) * (size_t)B);
    d->hsel = hn_malloc(sizeof(int32_t) * (size_t)B);
    d->b_want = hn_malloc(sizeof(bool) * (size_t)B);
    d->row_job = hn_malloc(sizeof(int32_t) * (size_t)B);
    d->b_seqs = hn_malloc(sizeof(kv_seq *) * (size_t)S);
    d->b_job = hn_malloc(sizeof(int32_t) * (size_t)S);
    if (!d->b_tok || !d->b_pos || !d->b_sid || !d->hsel || !d->b_want || !d->row_job || !d->b_seqs || !d->b_job) {
        st = hn_errf(err, HN_ERR_NOMEM, "dflash: out of memory");
        goto fail;
    }
    const int32_t bs = d->kv->cfg.block_size;
    if ((st = plan_init(&d->plan, B, S, (d->p.n_ctx + info->block_size + bs) / bs + 1, err))) goto fail;
    if ((st = spc_cost_init(&d->cost, d->cap_out, err))) goto fail;
    *out = d;
    return HN_OK;
fail:
    dfl_free(d);
    return st;
}

void dfl_free(dfl_drafter *d) {
    if (!d) return;
    kv_free(d->kv);
    hn_free(d->b_tok);
    hn_free(d->b_pos);
    hn_free(d->b_sid);
    hn_free(d->hsel);
    hn_free(d->b_want);
    hn_free(d->row_job);
    hn_free(d->b_seqs);
    hn_free(d->b_job);
    plan_free(&d->plan);
    spc_cost_free(&d->cost);
    hn_free(d);
}

int32_t dfl_block_drafts(const dfl_drafter *d) { return d->per_block; }

dfl_seq *dfl_seq_new(dfl_drafter *d, uint64_t ns) {
    dfl_seq *s = hn_calloc(1, sizeof *s);
    if (!s) return NULL;
    hn_err err;
    if (kv_seq_init(&s->kv, d->kv, d->p.n_ctx + d->info->block_size + 1, &err)) {
        hn_free(s);
        return NULL;
    }
    s->kv.ns = ns;
    return s;
}

void dfl_seq_reset(dfl_drafter *d, dfl_seq *s, const int32_t *toks) {
    if (d->p.prefix_cache && s->kv.n_tokens > 0) kv_seq_commit(d->kv, &s->kv, toks, s->kv.n_tokens);
    kv_seq_truncate(d->kv, &s->kv, 0);
}

void dfl_seq_free(dfl_drafter *d, dfl_seq *s, const int32_t *toks) {
    if (!s) return;
    dfl_seq_reset(d, s, toks);
    kv_seq_free(&s->kv, d->kv);
    hn_free(s);
}

int32_t dfl_seq_len(const dfl_seq *s) { return s->kv.n_tokens; }
const kv_seq *dfl_seq_kv(const dfl_seq *s) { return &s->kv; }

int32_t dfl_seq_match(dfl_drafter *d, dfl_seq *s, const int32_t *toks, int32_t n) {
    if (d->p.prefix_cache && s->kv.n_tokens < n) kv_seq_match(d->kv, &s->kv, toks, n);
    if (s->kv.n_tokens > n) kv_seq_truncate(d->kv, &s->kv, n);
    return s->kv.n_tokens;
}

/* A job's sequence could not follow: it holds nothing from now on. */
static void fail_job(dfl_drafter *d, dfl_job *j) {
    kv_seq_truncate(d->kv, &j->seq->kv, 0);
    j->failed = true;
    j->n_out = 0;
    d->st.left_out++;
}

/* One drafter step over the batch of n rows of n_seqs sequences. */
static hn_status run(dfl_drafter *d, int32_t n, int32_t n_seqs, bool block, hn_err *err) {
    step_batch b = {.n_tokens = n, .token = d->b_tok, .pos = d->b_pos, .seq_id = d->b_sid,
                    .want_logits = d->b_want, .seqs = d->b_seqs, .n_seqs = n_seqs};
    hn_status st = plan_build(&d->plan, d->kv, &b, d->n_vocab, d->cap_out, err);
    if (st == HN_OK)
        st = block ? model_dflash_block(d->m, d->kv, &d->plan, err)
                   : model_dflash_inject(d->m, d->kv, &d->plan, d->hsel, n, err);
    if (st == HN_OK) plan_finish(&d->plan);
    d->st.steps++;
    d->st.tokens += (uint64_t)n;
    return st;
}

/* Injection: every job's kept rows, in one step. */
static hn_status inject(dfl_drafter *d, dfl_job *jobs, int32_t n_jobs, hn_err *err) {
    int32_t n = 0, n_seqs = 0;
    for (int32_t i = 0; i < n_jobs; i++) {
        dfl_job *j = &jobs[i];
        if (j->n <= 0) continue;
        dfl_seq *s = j->seq;
        hn_err rerr;
        if (s->kv.n_tokens != j->from || n + j->n > d->cap_batch || n_seqs == d->max_seqs ||
            kv_seq_reserve(d->kv, &s->kv, j->from + j->n, &rerr)) {
            fail_job(d, j);
            continue;
        }
        for (int32_t t = 0; t < j->n; t++) {
            d->b_tok[n + t] = j->toks[j->from + t];
            d->b_pos[n + t] = j->from + t;
            d->b_sid[n + t] = n_seqs;
            d->b_want[n + t] = false;
            d->hsel[n + t] = j->row0 + t;
        }
        d->b_job[n_seqs] = i;
        d->b_seqs[n_seqs++] = &s->kv;
        n += j->n;
    }
    if (n == 0) return HN_OK;
    hn_status st = run(d, n, n_seqs, false, err);
    for (int32_t s = 0; s < n_seqs; s++) {
        dfl_job *j = &jobs[d->b_job[s]];
        if (st != HN_OK) {
            fail_job(d, j);
            continue;
        }
        if (d->p.prefix_cache) kv_seq_commit(d->kv, &j->seq->kv, j->toks, j->seq->kv.n_tokens);
    }
    return st;
}

/* Whether job j drafts a block now: it asked, and its sequence ends right before its anchor. */
static bool wants_block(const dfl_job *j) {
    return !j->failed && j->k > 0 && j->seq->kv.n_tokens == j->from + (j->n > 0 ? j->n : 0);
}

/* Block forwards for jobs [*next, n_jobs): as many blocks as one step holds. */
static hn_status blocks(dfl_drafter *d, dfl_job *jobs, int32_t n_jobs, int32_t *next, hn_err *err) {
    const model_dflash_info *info = d->info;
    const int32_t bs = info->block_size, s0 = info->sample_from_anchor ? 0 : 1;
    int32_t n = 0, n_seqs = 0, n_rows = 0, ctx = 0;
    int32_t i = *next;
    for (; i < n_jobs; i++) {
        dfl_job *j = &jobs[i];
        if (!wants_block(j)) continue;
        int32_t k = j->k < d->per_block ? j->k : d->per_block;
        if (k > d->cap_out) k = d->cap_out;
        if (n + bs > d->cap_batch || n_rows + k > d->cap_out || n_seqs == d->max_seqs) break; /* the next step's */
        kv_seq *kq = &j->seq->kv;
        int32_t at = kq->n_tokens;
        hn_err rerr;
        if (kv_seq_reserve(d->kv, kq, at + bs, &rerr)) { /* no room: it drafts nothing */
            kv_seq_truncate(d->kv, kq, at);
            continue;
        }
        for (int32_t t = 0; t < bs; t++) {
            d->b_tok[n + t] = t == 0 ? j->toks[at] : info->mask_token;
            d->b_pos[n + t] = at + t;
            d->b_sid[n + t] = n_seqs;
            d->b_want[n + t] = t >= s0 && t < s0 + k;
            if (d->b_want[n + t]) d->row_job[n_rows++] = i;
        }
        if (at + bs > ctx) ctx = at + bs;
        d->b_job[n_seqs] = i;
        d->b_seqs[n_seqs++] = kq;
        n += bs;
    }
    *next = i > *next ? i : *next + 1; /* (the first job of a step always fits: progress) */
    if (n == 0) return HN_OK;
    const double t0 = hn_now_ms();
    hn_status st = run(d, n, n_seqs, true, err);
    if (st == HN_OK) {
        spc_cost_record(&d->cost, ctx, n_rows, hn_now_ms() - t0); /* by the tokens it drafted */
        const float *logits = model_logits(d->m);
        for (int32_t r = 0; r < n_rows; r++) {
            dfl_job *j = &jobs[d->row_job[r]];
            float p;
            int32_t tok = spc_argmax_p(logits + (size_t)r * (size_t)d->n_vocab, d->n_vocab, d->n_vocab, &p);
            j->out[j->n_out] = tok;
            if (j->p) j->p[j->n_out] = p;
            j->n_out++;
            d->st.drafted++;
        }
        d->st.blocks += (uint64_t)n_seqs;
    }
    /* the block's positions go: each sequence ends where its request's computed tokens do */
    for (int32_t s = 0; s < n_seqs; s++) {
        dfl_job *j = &jobs[d->b_job[s]];
        int32_t at = j->from + (j->n > 0 ? j->n : 0);
        kv_seq_truncate(d->kv, &j->seq->kv, at);
        if (j->seq->kv.n_tokens != at) fail_job(d, j); /* cannot happen: a block never reaches a published block */
        if (st != HN_OK) j->n_out = 0;
    }
    return st;
}

hn_status dfl_step(dfl_drafter *d, dfl_job *jobs, int32_t n_jobs, hn_err *err) {
    const double t_start = hn_now_ms();
    if (n_jobs > d->max_seqs) n_jobs = d->max_seqs;
    for (int32_t i = 0; i < n_jobs; i++) {
        jobs[i].n_out = 0;
        jobs[i].failed = false;
        if (jobs[i].k < 0) jobs[i].k = 0;
    }
    hn_status st = inject(d, jobs, n_jobs, err);
    for (int32_t next = 0; st == HN_OK && next < n_jobs;) st = blocks(d, jobs, n_jobs, &next, err);
    if (st != HN_OK)
        for (int32_t i = 0; i < n_jobs; i++)
            if (!jobs[i].failed) fail_job(d, &jobs[i]);
    d->st.ms += hn_now_ms() - t_start;
    return st;
}

void dfl_trim(dfl_drafter *d) { kv_trim(d->kv, 0); }

double dfl_token_cost(const dfl_drafter *d, const spc_cost *tc, int32_t ctx, int32_t n_sessions, double ratio) {
    if (n_sessions < 1) n_sessions = 1;
    int32_t rows = n_sessions * d->per_block < d->cap_out ? n_sessions * d->per_block : d->cap_out;
    if (spc_cost_known(tc, ctx) && spc_cost_known(&d->cost, ctx)) return spc_cost_est(&d->cost, ctx, rows) / rows;
    return ratio * spc_cost_est(tc, ctx, 1) / d->per_block;
}

hn_status dfl_check(const dfl_drafter *d, const kv_seq *const *seqs, int n, hn_err *err) {
    return kv_check(d->kv, seqs, n, err);
}

const kv_cache *dfl_cache(const dfl_drafter *d) { return d->kv; }

void dfl_get_stats(const dfl_drafter *d, dfl_stats *out) {
    *out = d->st;
    kv_stats ks;
    kv_get_stats(d->kv, &ks);
    out->kv_bytes = ks.bytes + ks.meta_bytes;
    out->kv_peak_bytes = ks.total_peak_bytes;
}
