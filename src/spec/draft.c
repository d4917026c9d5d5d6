/* draft.c: the draft-model drafter of draft.h. */
#include "draft.h"

#include <string.h>

#include "../backend/cpu/cpu.h"
#include "../core/alloc.h"
#include "../core/clock.h"
#include "../kv/kv.h"
#include "../model/model.h"
#include "../sched/plan.h"
#include "../tokenizer/tokenizer.h"

#define DRF_DEFAULT_STEP 256

struct drf_seq {
    kv_seq kv;
    int32_t *fed;     /* the tokens of kv's positions (the request's, then drafted ones) */
    int32_t cap_fed;
    /* drf_draft's working state */
    int32_t pend_from; /* next position of job->toks to compute (catch-up), or -1 when drafting */
    float run;
    bool done;
};

struct drf_drafter {
    drf_params p;
    model *m;
    be_backend *be;   /* owned when it borrows the target's CPU pool (NULL: the model owns its backend) */
    kv_cache *kv;
    int32_t n_vocab;  /* drafted ids stay below: the drafter's logits rows and the shared tokens */
    int32_t cap_batch, max_seqs;
    int32_t *b_tok, *b_pos, *b_sid, *b_job;
    bool *b_want;
    kv_seq **b_seqs;
    int32_t *row_job; /* logits row -> job */
    step_plan plan;
    spc_cost cost;
    drf_stats st;
};

hn_status drf_same_vocab(const tok_vocab *a, const tok_vocab *b, const char *what, const char *path, hn_err *err) {
    int32_t na = tok_n_vocab(a), nb = tok_n_vocab(b);
    if (na != nb)
        return hn_errf(err, HN_ERR_UNSUPPORTED,
                       "%s %s: its vocabulary has %d tokens, the target's %d (a drafter needs the target's vocabulary)",
                       what, path, (int)nb, (int)na);
    for (int32_t i = 0; i < na; i++) {
        const char *ta = tok_text(a, i), *tb = tok_text(b, i);
        if (strcmp(ta ? ta : "", tb ? tb : ""))
            return hn_errf(err, HN_ERR_UNSUPPORTED,
                           "%s %s: token %d is '%.40s', the target's is '%.40s' (a drafter needs the target's vocabulary)",
                           what, path, (int)i, tb ? tb : "", ta ? ta : "");
    }
    return HN_OK;
}

hn_status drf_new(const drf_params *pin, drf_drafter **out, hn_err *err) {
    *out = NULL;
    if (!pin || !pin->path || !pin->vocab || pin->n_ctx < 1 || pin->max_seqs < 1 || pin->max_draft < 1 ||
        pin->n_blocks < 2)
        return hn_errf(err, HN_ERR_INVALID, "draft model: bad parameters");
    drf_drafter *d = hn_calloc(1, sizeof *d);
    if (!d) return hn_errf(err, HN_ERR_NOMEM, "draft model: out of memory");
    d->p = *pin;
    if (d->p.step_tokens <= 0) d->p.step_tokens = DRF_DEFAULT_STEP;
    d->max_seqs = d->p.max_seqs;
    d->cap_batch = d->p.step_tokens + d->max_seqs;
    hn_status st;
    const size_t b0 = hn_alloc_bytes();
    model_params mp = {.n_threads = d->p.n_threads, .max_batch = d->cap_batch, .max_seqs = d->max_seqs,
                       .max_logits = d->max_seqs, .device = d->p.device};
    if (d->p.target && !strcmp(d->p.target->ops->name, "cpu")) {
        if ((st = be_cpu_create(be_cpu_pool(d->p.target), &d->be, err))) goto fail;
        mp.backend = d->be;
    }
    if ((st = model_load(d->p.path, &mp, &d->m, err))) goto fail;
    d->st.model_bytes = hn_alloc_bytes() - b0;
    for (int64_t i = 0; i < gguf_n_tensors(model_gguf(d->m)); i++)
        d->st.file_bytes += gguf_tensor_at(model_gguf(d->m), i)->nbytes;
    const model_hparams *hp = model_hp(d->m);
    if (hp->hybrid) {
        st = hn_errf(err, HN_ERR_UNSUPPORTED,
                     "draft model %s: a hybrid (%s) draft model is not supported yet (its recurrent state would need "
                     "rolling back after each rejected draft)", d->p.path, hp->arch_name);
        goto fail;
    }
    {
        tok_vocab *dv = NULL;
        if ((st = tok_load(model_gguf(d->m), &dv, err))) goto fail;
        st = drf_same_vocab(d->p.vocab, dv, "draft model", d->p.path, err);
        tok_free(dv);
        if (st) goto fail;
    }
    d->n_vocab = hp->n_vocab < tok_n_vocab(d->p.vocab) ? hp->n_vocab : tok_n_vocab(d->p.vocab);
    kv_config kc = model_kv_config(d->m, d->p.n_blocks, d->p.block_size);
    kc.type = d->p.k_type;
    kc.v_type = d->p.v_type;
    if (!kv_block_bytes(&kc)) {
        st = hn_errf(err, HN_ERR_UNSUPPORTED, "draft model %s: its head dim %d does not fit the KV type", d->p.path,
                     (int)hp->head_dim);
        goto fail;
    }
    if ((st = kv_create(&kc, &d->kv, err))) goto fail;
    int32_t B = d->cap_batch, S = d->max_seqs;
    d->b_tok = hn_malloc(sizeof(int32_t) * (size_t)B);
    d->b_pos = hn_malloc(sizeof(int32_t) * (size_t)B);
    d->b_sid = hn_malloc(sizeof(int32_t) * (size_t)B);
    d->b_want = hn_malloc(sizeof(bool) * (size_t)B);
    d->b_job = hn_malloc(sizeof(int32_t) * (size_t)S);
    d->b_seqs = hn_malloc(sizeof(kv_seq *) * (size_t)S);
    d->row_job = hn_malloc(sizeof(int32_t) * (size_t)S);
    if (!d->b_tok || !d->b_pos || !d->b_sid || !d->b_want || !d->b_job || !d->b_seqs || !d->row_job) {
        st = hn_errf(err, HN_ERR_NOMEM, "draft model: out of memory");
        goto fail;
    }
    const int32_t bs = d->kv->cfg.block_size;
    if ((st = plan_init(&d->plan, B, S, (d->p.n_ctx + d->p.max_draft + bs) / bs + 1, err))) goto fail;
    if ((st = spc_cost_init(&d->cost, B, err))) goto fail;
    *out = d;
    return HN_OK;
fail:
    drf_free(d);
    return st;
}

void drf_free(drf_drafter *d) {
    if (!d) return;
    kv_free(d->kv);
    model_free(d->m);
    if (d->be) d->be->ops->free(d->be);
    hn_free(d->b_tok);
    hn_free(d->b_pos);
    hn_free(d->b_sid);
    hn_free(d->b_want);
    hn_free(d->b_job);
    hn_free(d->b_seqs);
    hn_free(d->row_job);
    plan_free(&d->plan);
    spc_cost_free(&d->cost);
    hn_free(d);
}

drf_seq *drf_seq_new(drf_drafter *d, uint64_t ns) {
    drf_seq *s = hn_calloc(1, sizeof *s);
    if (!s) return NULL;
    s->cap_fed = d->p.n_ctx + d->p.max_draft + 1;
    s->fed = hn_malloc(sizeof(int32_t) * (size_t)s->cap_fed);
    hn_err err;
    if (!s->fed || kv_seq_init(&s->kv, d->kv, s->cap_fed, &err)) {
        hn_free(s->fed);
        hn_free(s);
        return NULL;
    }
    s->kv.ns = ns;
    return s;
}

void drf_seq_free(drf_drafter *d, drf_seq *s) {
    if (!s) return;
    if (d->p.prefix_cache) kv_seq_commit(d->kv, &s->kv, s->fed, s->kv.n_tokens);
    kv_seq_truncate(d->kv, &s->kv, 0);
    kv_seq_free(&s->kv, d->kv);
    hn_free(s->fed);
    hn_free(s);
}

/* Cuts the sequence back to what it shares with the job's tokens; returns
 * false when the job cannot draft (nothing to continue). */
static bool sync_seq(drf_drafter *d, drf_job *j) {
    drf_seq *s = j->seq;
    int32_t n = s->kv.n_tokens < j->n_toks ? s->kv.n_tokens : j->n_toks;
    int32_t c = 0;
    while (c < n && s->fed[c] == j->toks[c]) c++;
    if (c == j->n_toks) c--; /* the last token must be computed: its logits give the first draft */
    if (c < 0) c = 0;
    if (c < s->kv.n_tokens) kv_seq_truncate(d->kv, &s->kv, c);
    if (s->kv.n_tokens == 0 && d->p.prefix_cache) {
        int32_t got = kv_seq_match(d->kv, &s->kv, j->toks, j->n_toks - 1);
        if (got > 0) memcpy(s->fed, j->toks, sizeof(int32_t) * (size_t)s->kv.n_tokens);
    }
    s->pend_from = s->kv.n_tokens;
    s->run = 1;
    s->done = j->k <= 0 || j->n_toks < 1 || j->n_toks + j->k > s->cap_fed;
    return !s->done;
}

hn_status drf_draft(drf_drafter *d, drf_job *jobs, int32_t n_jobs, hn_err *err) {
    const double t_start = hn_now_ms();
    if (n_jobs > d->max_seqs) n_jobs = d->max_seqs;
    for (int32_t i = 0; i < n_jobs; i++) {
        jobs[i].n_out = 0;
        if (jobs[i].k > d->p.max_draft) jobs[i].k = d->p.max_draft;
        sync_seq(d, &jobs[i]);
    }
    const int32_t V = model_hp(d->m)->n_vocab;
    hn_status st = HN_OK;
    for (;;) {
        int32_t n = 0, n_seqs = 0, n_rows = 0, budget = d->p.step_tokens, ctx = 0;
        for (int32_t i = 0; i < n_jobs; i++) {
            drf_job *j = &jobs[i];
            drf_seq *s = j->seq;
            if (s->done) continue;
            int32_t from = s->kv.n_tokens, m;
            if (s->pend_from >= 0) { /* catching up on the request's tokens */
                m = j->n_toks - from;
                if (m > budget) m = budget;
                if (m <= 0) continue; /* the budget is spent: next step */
            } else {
                m = 1; /* feeding its last drafted token */
            }
            hn_err rerr;
            if (kv_seq_reserve(d->kv, &s->kv, from + m, &rerr)) {
                /* the drafter's pool is full: this session drafts nothing now and gives its blocks back */
                kv_seq_truncate(d->kv, &s->kv, 0);
                s->done = true;
                j->n_out = 0;
                continue;
            }
            for (int32_t t = 0; t < m; t++) {
                int32_t tok = s->pend_from >= 0 ? j->toks[from + t] : j->out[j->n_out - 1];
                d->b_tok[n + t] = tok;
                d->b_pos[n + t] = from + t;
                d->b_sid[n + t] = n_seqs;
                d->b_want[n + t] = false;
                s->fed[from + t] = tok;
            }
            if (s->pend_from >= 0) budget -= m;
            bool last = s->pend_from < 0 || from + m == j->n_toks;
            if (last) {
                d->b_want[n + m - 1] = true;
                d->row_job[n_rows++] = i;
            }
            if (from + m > ctx) ctx = from + m;
            d->b_seqs[n_seqs] = &s->kv;
            d->b_job[n_seqs++] = i;
            n += m;
        }
        if (n == 0) break;
        step_batch b = {.n_tokens = n, .token = d->b_tok, .pos = d->b_pos, .seq_id = d->b_sid,
                        .want_logits = d->b_want, .seqs = d->b_seqs, .n_seqs = n_seqs};
        double t0 = hn_now_ms();
        st = plan_build(&d->plan, d->kv, &b, V, model_max_logits(d->m), err);
        if (st == HN_OK) st = model_step(d->m, d->kv, &d->plan, NULL, err);
        if (st != HN_OK) {
            for (int32_t s = 0; s < n_seqs; s++) {
                drf_job *j = &jobs[d->b_job[s]];
                kv_seq_truncate(d->kv, &j->seq->kv, 0);
                j->seq->done = true;
                j->n_out = 0;
            }
            break;
        }
        plan_finish(&d->plan);
        spc_cost_record(&d->cost, ctx, n, hn_now_ms() - t0);
        d->st.steps++;
        d->st.tokens += (uint64_t)n;
        const float *logits = model_logits(d->m);
        for (int32_t r = 0; r < n_rows; r++) {
            drf_job *j = &jobs[d->row_job[r]];
            drf_seq *s = j->seq;
            s->pend_from = -1;
            float p;
            int32_t tok = spc_argmax_p(logits + (size_t)r * (size_t)V, d->n_vocab, V, &p);
            j->out[j->n_out] = tok;
            if (j->p) j->p[j->n_out] = p;
            j->n_out++;
            d->st.drafted++;
            double qc = j->cal[spc_conf_bucket(p)] * p;
            s->run *= (float)(qc > 0.99 ? 0.99 : qc < 0 ? 0 : qc);
            if (j->n_out >= j->k || (j->n_out >= j->min_k && s->run < j->min_run)) s->done = true;
        }
    }
    d->st.ms += hn_now_ms() - t_start;
    return st;
}

void drf_trim(drf_drafter *d) { kv_trim(d->kv, 0); }

const spc_cost *drf_cost(const drf_drafter *d) { return &d->cost; }

double drf_token_cost(const drf_drafter *d, const spc_cost *tc, int32_t ctx, int32_t n_sessions, double ratio) {
    if (n_sessions < 1) n_sessions = 1;
    if (spc_cost_known(tc, ctx) && spc_cost_known(&d->cost, ctx))
        return spc_cost_est(&d->cost, ctx, n_sessions) / n_sessions;
    return ratio * spc_cost_est(tc, ctx, 1);
}

void drf_get_stats(const drf_drafter *d, drf_stats *out) {
    *out = d->st;
    kv_stats ks;
    kv_get_stats(d->kv, &ks);
    out->kv_bytes = ks.bytes + ks.meta_bytes;
    out->kv_peak_bytes = ks.total_peak_bytes;
}
