/* mtp.c: the MTP drafter of mtp.h. */
#include "mtp.h"

#include <string.h>

#include "../core/alloc.h"
#include "../core/clock.h"
#include "../kv/kv.h"
#include "../model/model.h"
#include "../sched/plan.h"

struct mtp_seq {
    kv_seq kv;
    uint64_t ns;      /* the request's namespace (the cache's is salted with x_0) */
};

struct mtp_drafter {
    mtp_params p;
    model *m;
    kv_cache *kv;
    int32_t cap_batch, max_seqs, n_vocab;
    int32_t *b_tok, *b_pos, *b_sid, *hsel;
    bool *b_want;
    kv_seq **b_seqs;
    int32_t *row_job, *row_job2; /* wanted row -> job (this step's, the next step's) */
    float *run;                  /* per job: running acceptance probability */
    step_plan plan;
    spc_cost cost;
    mtp_stats st;
};

/* The cache namespace of a request's sequence: its own, salted with its first
 * token, which every pair depends on but no fed token names. */
static void salt(mtp_seq *s, const int32_t *toks) {
    uint64_t z = s->ns ^ (0x9e3779b97f4a7c15ull * ((uint64_t)(uint32_t)toks[0] + 1));
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    s->kv.ns = z ^ (z >> 31);
}

hn_status mtp_new(model *m, const mtp_params *pin, mtp_drafter **out, hn_err *err) {
    *out = NULL;
    if (!m || !model_has_mtp(m))
        return hn_errf(err, HN_ERR_UNSUPPORTED, "mtp: the model has no MTP (nextn) layer");
    if (!pin || pin->n_ctx < 1 || pin->max_seqs < 1 || pin->max_draft < 1 || pin->n_blocks < 2)
        return hn_errf(err, HN_ERR_INVALID, "mtp: bad parameters");
    mtp_drafter *d = hn_calloc(1, sizeof *d);
    if (!d) return hn_errf(err, HN_ERR_NOMEM, "mtp: out of memory");
    d->p = *pin;
    d->m = m;
    d->cap_batch = model_max_batch(m);
    d->max_seqs = d->p.max_seqs;
    d->n_vocab = model_hp(m)->n_vocab;
    hn_status st;
    kv_config kc = model_mtp_kv_config(m, d->p.n_blocks, d->p.block_size);
    kc.type = d->p.k_type;
    kc.v_type = d->p.v_type;
    if (!kv_block_bytes(&kc)) {
        st = hn_errf(err, HN_ERR_UNSUPPORTED, "mtp: head dim %d does not fit the KV type", (int)model_hp(m)->head_dim);
        goto fail;
    }
    if ((st = kv_create(&kc, &d->kv, err))) goto fail;
    int32_t B = d->cap_batch, S = d->max_seqs;
    d->b_tok = hn_malloc(sizeof(int32_t) * (size_t)B);
    d->b_pos = hn_malloc(sizeof(int32_t) * (size_t)B);
    d->b_sid = hn_malloc(sizeof(int32_t) * (size_t)B);
    d->hsel = hn_malloc(sizeof(int32_t) * (size_t)B);
    d->b_want = hn_malloc(sizeof(bool) * (size_t)B);
    d->b_seqs = hn_malloc(sizeof(kv_seq *) * (size_t)S);
    d->row_job = hn_malloc(sizeof(int32_t) * (size_t)S);
    d->row_job2 = hn_malloc(sizeof(int32_t) * (size_t)S);
    d->run = hn_malloc(sizeof(float) * (size_t)S);
    if (!d->b_tok || !d->b_pos || !d->b_sid || !d->hsel || !d->b_want || !d->b_seqs || !d->row_job || !d->row_job2 ||
        !d->run) {
        st = hn_errf(err, HN_ERR_NOMEM, "mtp: out of memory");
        goto fail;
    }
    const int32_t bs = d->kv->cfg.block_size;
    if ((st = plan_init(&d->plan, B, S, (d->p.n_ctx + d->p.max_draft + bs) / bs + 1, err))) goto fail;
    if ((st = spc_cost_init(&d->cost, S, err))) goto fail;
    *out = d;
    return HN_OK;
fail:
    mtp_free(d);
    return st;
}

void mtp_free(mtp_drafter *d) {
    if (!d) return;
    kv_free(d->kv);
    hn_free(d->b_tok);
    hn_free(d->b_pos);
    hn_free(d->b_sid);
    hn_free(d->hsel);
    hn_free(d->b_want);
    hn_free(d->b_seqs);
    hn_free(d->row_job);
    hn_free(d->row_job2);
    hn_free(d->run);
    plan_free(&d->plan);
    spc_cost_free(&d->cost);
    hn_free(d);
}

mtp_seq *mtp_seq_new(mtp_drafter *d, uint64_t ns) {
    mtp_seq *s = hn_calloc(1, sizeof *s);
    if (!s) return NULL;
    hn_err err;
    if (kv_seq_init(&s->kv, d->kv, d->p.n_ctx + d->p.max_draft + 1, &err)) {
        hn_free(s);
        return NULL;
    }
    s->ns = ns;
    return s;
}

void mtp_seq_reset(mtp_drafter *d, mtp_seq *s, const int32_t *toks) {
    if (d->p.prefix_cache && s->kv.n_tokens > 0) {
        salt(s, toks);
        kv_seq_commit(d->kv, &s->kv, toks + 1, s->kv.n_tokens);
    }
    kv_seq_truncate(d->kv, &s->kv, 0);
}

void mtp_seq_free(mtp_drafter *d, mtp_seq *s, const int32_t *toks) {
    if (!s) return;
    mtp_seq_reset(d, s, toks);
    kv_seq_free(&s->kv, d->kv);
    hn_free(s);
}

int32_t mtp_seq_len(const mtp_seq *s) { return s->kv.n_tokens; }
const kv_seq *mtp_seq_kv(const mtp_seq *s) { return &s->kv; }

int32_t mtp_seq_match(mtp_drafter *d, mtp_seq *s, const int32_t *toks, int32_t n) {
    if (d->p.prefix_cache && s->kv.n_tokens < n) {
        salt(s, toks);
        kv_seq_match(d->kv, &s->kv, toks + 1, n);
    }
    if (s->kv.n_tokens > n) kv_seq_truncate(d->kv, &s->kv, n);
    return s->kv.n_tokens;
}

/* A job's sequence could not follow: it holds nothing from now on. */
static void fail_job(mtp_drafter *d, mtp_job *j) {
    kv_seq_truncate(d->kv, &j->seq->kv, 0);
    j->failed = true;
    j->n_out = 0;
    d->st.left_out++;
}

/* The drafts of the wanted rows of the step just run (row r: job row_job[r]). */
static void take_drafts(mtp_drafter *d, mtp_job *jobs, int32_t n_rows) {
    const float *logits = model_logits(d->m);
    for (int32_t r = 0; r < n_rows; r++) {
        mtp_job *j = &jobs[d->row_job[r]];
        float p;
        int32_t tok = spc_argmax_p(logits + (size_t)r * (size_t)d->n_vocab, d->n_vocab, d->n_vocab, &p);
        j->out[j->n_out] = tok;
        if (j->p) j->p[j->n_out] = p;
        j->n_out++;
        d->st.drafted++;
        double qc = j->cal[spc_conf_bucket(p)] * p;
        d->run[d->row_job[r]] *= (float)(qc > 0.99 ? 0.99 : qc < 0 ? 0 : qc);
    }
}

static bool drafting(const mtp_drafter *d, const mtp_job *jobs, int32_t i) {
    const mtp_job *j = &jobs[i];
    return !j->failed && j->n_out < j->k && (j->n_out < j->min_k || d->run[i] >= j->min_run);
}

hn_status mtp_step(mtp_drafter *d, mtp_job *jobs, int32_t n_jobs, hn_err *err) {
    const double t_start = hn_now_ms();
    if (n_jobs > d->max_seqs) n_jobs = d->max_seqs;
    hn_status st = HN_OK;
    /* the catch-up step: every job's kept rows, the last one wanted where it drafts */
    int32_t n = 0, n_seqs = 0, n_rows = 0, ctx = 0;
    for (int32_t i = 0; i < n_jobs; i++) {
        mtp_job *j = &jobs[i];
        j->n_out = 0;
        j->failed = false;
        d->run[i] = 1;
        if (j->k > d->p.max_draft) j->k = d->p.max_draft;
        if (j->n <= 0) {
            j->k = 0;
            continue;
        }
        mtp_seq *s = j->seq;
        hn_err rerr;
        if (s->kv.n_tokens != j->from || n + j->n > d->cap_batch ||
            kv_seq_reserve(d->kv, &s->kv, j->from + j->n, &rerr)) {
            fail_job(d, j);
            continue;
        }
        salt(s, j->toks);
        for (int32_t t = 0; t < j->n; t++) {
            d->b_tok[n + t] = j->toks[j->from + t + 1];
            d->b_pos[n + t] = j->from + t;
            d->b_sid[n + t] = n_seqs;
            d->b_want[n + t] = false;
            d->hsel[n + t] = j->row0 + t;
        }
        if (j->k > 0) {
            d->b_want[n + j->n - 1] = true;
            d->row_job[n_rows++] = i;
        }
        if (j->from + j->n > ctx) ctx = j->from + j->n;
        d->b_seqs[n_seqs++] = &s->kv;
        n += j->n;
    }
    for (int pass = 0; n > 0; pass++) {
        step_batch b = {.n_tokens = n, .token = d->b_tok, .pos = d->b_pos, .seq_id = d->b_sid,
                        .want_logits = d->b_want, .seqs = d->b_seqs, .n_seqs = n_seqs};
        const double t0 = hn_now_ms();
        st = plan_build(&d->plan, d->kv, &b, d->n_vocab, model_max_logits(d->m), err);
        if (st == HN_OK) st = model_mtp_step(d->m, d->kv, &d->plan, d->hsel, n, err);
        if (st != HN_OK) {
            for (int32_t i = 0; i < n_jobs; i++)
                if (!jobs[i].failed) fail_job(d, &jobs[i]);
            break;
        }
        plan_finish(&d->plan);
        if (pass > 0) spc_cost_record(&d->cost, ctx, n, hn_now_ms() - t0); /* a drafting step: one row per session */
        d->st.steps++;
        d->st.tokens += (uint64_t)n;
        take_drafts(d, jobs, n_rows);
        /* the next drafted token of every job still drafting: its last draft at
         * the next position, with the state its row left (wanted row r) */
        int32_t m = 0, m_rows = 0;
        n_seqs = 0;
        ctx = 0;
        for (int32_t r = 0; r < n_rows; r++) {
            int32_t i = d->row_job[r];
            mtp_job *j = &jobs[i];
            if (!drafting(d, jobs, i)) continue;
            kv_seq *kq = &j->seq->kv;
            int32_t pos = kq->n_tokens;
            hn_err rerr;
            if (kv_seq_reserve(d->kv, kq, pos + 1, &rerr)) continue; /* no room: it stops drafting here */
            d->b_tok[m] = j->out[j->n_out - 1];
            d->b_pos[m] = pos;
            d->b_sid[m] = n_seqs;
            d->b_want[m] = true;
            d->hsel[m] = r;
            d->b_seqs[n_seqs++] = kq;
            d->row_job2[m_rows++] = i;
            if (pos + 1 > ctx) ctx = pos + 1;
            m++;
        }
        int32_t *t = d->row_job;
        d->row_job = d->row_job2;
        d->row_job2 = t;
        n = m;
        n_rows = m_rows;
    }
    /* drafted positions go; what the sequences hold is published */
    for (int32_t i = 0; i < n_jobs; i++) {
        mtp_job *j = &jobs[i];
        if (j->failed || j->n <= 0) continue;
        kv_seq_truncate(d->kv, &j->seq->kv, j->from + j->n);
        if (d->p.prefix_cache) kv_seq_commit(d->kv, &j->seq->kv, j->toks + 1, j->seq->kv.n_tokens);
        if (j->seq->kv.n_tokens != j->from + j->n) fail_job(d, j); /* cannot happen: drafts never reach a published block */
    }
    d->st.ms += hn_now_ms() - t_start;
    return st;
}

void mtp_trim(mtp_drafter *d) { kv_trim(d->kv, 0); }

double mtp_token_cost(const mtp_drafter *d, const spc_cost *tc, int32_t ctx, int32_t n_sessions, double ratio) {
    if (n_sessions < 1) n_sessions = 1;
    if (spc_cost_known(tc, ctx) && spc_cost_known(&d->cost, ctx))
        return spc_cost_est(&d->cost, ctx, n_sessions) / n_sessions;
    return ratio * spc_cost_est(tc, ctx, 1);
}

hn_status mtp_check(const mtp_drafter *d, const kv_seq *const *seqs, int n, hn_err *err) {
    return kv_check(d->kv, seqs, n, err);
}

void mtp_get_stats(const mtp_drafter *d, mtp_stats *out) {
    *out = d->st;
    kv_stats ks;
    kv_get_stats(d->kv, &ks);
    out->kv_bytes = ks.bytes + ks.meta_bytes;
    out->kv_peak_bytes = ks.total_peak_bytes;
}
