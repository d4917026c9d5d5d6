/* test_spec_mtp: speculative decoding with the model's own MTP (nextn)
 * layer (spec/mtp.h, model_mtp_step) is lossless, and the MTP layer reads
 * the right hidden states.
 *
 * No file with trained MTP weights exists here, so the files are made from
 * the tiny random qwen35 / qwen35moe models (tests/mtp_fixture.h):
 *   - loading: the MTP layer binds (model_has_mtp only with model_params.mtp),
 *     and the main forward's logits are the original file's, bit for bit,
 *     with and without the hidden-state output;
 *   - the drafter itself, on the MTPF_HIDDEN layer (its logits are the
 *     target's at the same position): after a target step of three
 *     sequences, catching up two of them (a hidden-row selection that is not
 *     the identity) drafts, for each, the token the target's last row
 *     predicts, chained three times; the MTP cache then holds exactly the
 *     caught-up positions;
 *   - the engine, four sessions at once, every KV invariant of the target's
 *     and the MTP's caches checked after each step: greedy, constrained and
 *     seeded output with --spec mtp (and auto, which uses the MTP layer when
 *     the model has one) equals plain decoding's, token for token, on the
 *     MTPF_RANDOM layer (drafts mostly miss: counters shown); with the
 *     prefix cache, a second turn (the MTP sequences resume from their own
 *     cached blocks); and on the MTPF_COPY oracle with sessions constrained
 *     to one token (the output repeats it, so nearly every draft must be
 *     accepted, fewer steps);
 *   - the refusals: --spec mtp for a model without an MTP layer. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "core/clock.h"
#include "kv/kv.h"
#include "model/model.h"
#include "sched/engine.h"
#include "spec/mtp.h"
#include "tokenizer/tokenizer.h"
#include "mtp_fixture.h"
#include "test.h"

enum { NS = 4, MAXT = 512 };

/* HONE_TEST_DEVICE=cuda runs every case on that backend (default: the CPU) */
static const char *tdev(void) {
    const char *d = getenv("HONE_TEST_DEVICE");
    return d && *d ? d : NULL;
}

/* ---- loading ---- */

static hn_status logits_of(const char *path, bool mtp, float *out, bool *has, hn_err *e) {
    model *m = NULL;
    model_params p = {.n_threads = 2, .max_batch = 64, .mtp = mtp, .device = tdev()};
    hn_status st = model_load(path, &p, &m, e);
    if (st) return st;
    *has = model_has_mtp(m);
    kv_config c = model_kv_config(m, 16, 16);
    kv_cache *kv;
    kv_seq sq;
    kv_create(&c, &kv, e);
    kv_seq_init(&sq, kv, 64, e);
    kv_seq_state_acquire(kv, &sq, e);
    int32_t tok[24], pos[24], sid[24] = {0};
    bool want[24];
    for (int i = 0; i < 24; i++) {
        tok[i] = i * 37 + 1;
        pos[i] = i;
        want[i] = i % 5 == 4;
    }
    kv_seq *seqs[1] = {&sq};
    model_batch b = {.n_tokens = 24, .token = tok, .pos = pos, .seq_id = sid, .want_logits = want, .seqs = seqs,
                     .n_seqs = 1};
    st = model_forward(m, kv, &b, out, 4, e);
    kv_seq_free(&sq, kv);
    kv_free(kv);
    model_free(m);
    return st;
}

static void test_load(const char *src) {
    char orig[512], fx[512], rel[256];
    snprintf(rel, sizeof rel, "data/models/%s", src);
    test_data_path(orig, sizeof orig, rel);
    if (!mtp_fixture(src, MTPF_RANDOM, fx, sizeof fx)) return;
    const int V = 2048;
    float *a = malloc(sizeof(float) * 4 * V), *b = malloc(sizeof(float) * 4 * V), *c = malloc(sizeof(float) * 4 * V);
    hn_err e;
    bool h0 = true, h1 = true, h2 = false;
    CHECKF(logits_of(orig, true, a, &h0, &e) == HN_OK && !h0, "%s: original (%s)", src, e.msg);
    CHECKF(logits_of(fx, false, b, &h1, &e) == HN_OK && !h1, "%s: with an MTP layer, not asked to run it (%s)", src,
           e.msg);
    CHECKF(logits_of(fx, true, c, &h2, &e) == HN_OK && h2, "%s: with an MTP layer, runnable (%s)", src, e.msg);
    CHECKF(!memcmp(a, b, sizeof(float) * 4 * V) && !memcmp(a, c, sizeof(float) * 4 * V),
           "%s: the main forward's logits do not depend on the MTP layer", src);
    free(a);
    free(b);
    free(c);
}

/* ---- the drafter on the hidden-state oracle ---- */

static int32_t argmax(const float *r, int n) {
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (r[i] > r[b]) b = i;
    return b;
}

static void test_drafter(const char *src) {
    char fx[512];
    if (!mtp_fixture(src, MTPF_HIDDEN, fx, sizeof fx)) return;
    hn_err e;
    model *m = NULL;
    model_params mp = {.n_threads = 2, .max_batch = 64, .max_seqs = 4, .max_logits = 16, .mtp = true, .device = tdev()};
    if (model_load(fx, &mp, &m, &e)) {
        CHECKF(0, "%s: load: %s", fx, e.msg);
        return;
    }
    const int V = model_hp(m)->n_vocab;
    kv_config c = model_kv_config(m, 32, 16);
    kv_cache *kv;
    kv_create(&c, &kv, &e);
    kv_seq sq[3];
    kv_seq *seqs[3] = {&sq[0], &sq[1], &sq[2]};
    for (int s = 0; s < 3; s++) {
        kv_seq_init(&sq[s], kv, 256, &e);
        kv_seq_state_acquire(kv, &sq[s], &e);
    }
    /* one target step: three prompts of 9, 13 and 7 tokens, each one's last row wanted */
    enum { T = 29 };
    const int len[3] = {9, 13, 7};
    int32_t toks[3][16], tok[T], pos[T], sid[T];
    bool want[T];
    int n = 0, row0[3];
    for (int s = 0; s < 3; s++) {
        row0[s] = n;
        for (int i = 0; i < len[s]; i++) {
            toks[s][i] = (int32_t)((i * 131 + s * 977 + 5) % 2000 + 20);
            tok[n] = toks[s][i];
            pos[n] = i;
            sid[n] = s;
            want[n] = i == len[s] - 1;
            n++;
        }
    }
    float *lg = malloc(sizeof(float) * 3 * (size_t)V);
    model_batch b = {.n_tokens = n, .token = tok, .pos = pos, .seq_id = sid, .want_logits = want, .seqs = seqs,
                     .n_seqs = 3};
    CHECKF(model_forward(m, kv, &b, lg, 3, &e) == HN_OK, "forward: %s", e.msg);
    for (int s = 0; s < 3; s++) toks[s][len[s]] = argmax(lg + (size_t)s * V, V); /* the token each samples */
    mtp_drafter *d = NULL;
    mtp_params p = {.n_ctx = 256, .max_seqs = 4, .max_draft = 8, .n_blocks = 64, .k_type = QT_F32, .v_type = QT_F32};
    if (mtp_new(m, &p, &d, &e)) {
        CHECKF(0, "mtp_new: %s", e.msg);
    } else {
        /* sequences 0 and 2 catch up (hidden rows 0..8 and 22..28) and draft 3 tokens each */
        mtp_seq *ms[2] = {mtp_seq_new(d, 0), mtp_seq_new(d, 0)};
        int which[2] = {0, 2};
        int32_t out[2][8];
        float pr[2][8];
        mtp_job jobs[2];
        for (int j = 0; j < 2; j++) {
            int s = which[j];
            jobs[j] = (mtp_job){.seq = ms[j], .toks = toks[s], .from = 0, .n = len[s], .row0 = row0[s], .k = 3,
                                .min_k = 3, .out = out[j], .p = pr[j]};
            for (int q = 0; q < SPC_LEN_B; q++) jobs[j].cal[q] = 1;
        }
        CHECKF(mtp_step(d, jobs, 2, &e) == HN_OK, "mtp_step: %s", e.msg);
        for (int j = 0; j < 2; j++) {
            int s = which[j];
            CHECKF(!jobs[j].failed && jobs[j].n_out == 3, "sequence %d: %d drafted (failed %d)", s, jobs[j].n_out,
                   (int)jobs[j].failed);
            for (int k = 0; k < jobs[j].n_out; k++)
                CHECKF(out[j][k] == toks[s][len[s]], "sequence %d draft %d: %d, the target's row predicts %d", s, k,
                       out[j][k], toks[s][len[s]]);
            CHECKF(mtp_seq_len(ms[j]) == len[s], "sequence %d: the MTP holds %d positions, not %d", s,
                   mtp_seq_len(ms[j]), len[s]);
        }
        const kv_seq *ks[2] = {mtp_seq_kv(ms[0]), mtp_seq_kv(ms[1])};
        CHECKF(mtp_check(d, ks, 2, &e) == HN_OK, "MTP cache: %s", e.msg);
        mtp_stats st;
        mtp_get_stats(d, &st);
        CHECKF(st.steps == 3 && st.tokens == (uint64_t)(len[0] + len[2] + 2 + 2) && st.drafted == 6,
               "stats: %llu steps, %llu rows, %llu drafted", (unsigned long long)st.steps,
               (unsigned long long)st.tokens, (unsigned long long)st.drafted);
        /* a sequence that is not where its job says is left out, not computed */
        mtp_job bad = {.seq = ms[0], .toks = toks[0], .from = 3, .n = 2, .row0 = 0, .k = 1, .min_k = 1, .out = out[0]};
        CHECK(mtp_step(d, &bad, 1, &e) == HN_OK && bad.failed && mtp_seq_len(ms[0]) == 0);
        for (int j = 0; j < 2; j++) mtp_seq_free(d, ms[j], toks[which[j]]);
        mtp_free(d);
    }
    /* a model without the layer runnable has no drafter */
    model *m2 = NULL;
    mp.mtp = false;
    if (model_load(fx, &mp, &m2, &e) == HN_OK) {
        CHECK(!model_has_mtp(m2) && mtp_new(m2, &p, &d, &e) == HN_ERR_UNSUPPORTED);
        model_free(m2);
    }
    for (int s = 0; s < 3; s++) kv_seq_free(&sq[s], kv);
    kv_free(kv);
    model_free(m);
    free(lg);
}

/* ---- through the engine ---- */

typedef struct coll {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t toks[MAXT];
    int n, done;
    eng_finish fin;
    eng_req_stats st;
    int32_t last;
    int narrow; /* > 0: only token 100 + (session's) ... one allowed id; else id % 3 == (last + 1) % 3 */
    int32_t only;
    uint32_t mask[4096];
    int32_t n_vocab;
    int bad_constraint;
} coll;

static void on_event(void *ctx, const eng_event *ev) {
    coll *c = ctx;
    pthread_mutex_lock(&c->mu);
    if (ev->type == ENG_EV_TOKEN) {
        if (c->n < MAXT) c->toks[c->n] = ev->token;
        c->n++;
    } else {
        c->done = 1;
        c->fin = ev->finish;
        c->st = ev->stats;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
}

static const uint32_t *allowed(void *ctx) {
    coll *c = ctx;
    int nw = (c->n_vocab + 31) / 32;
    for (int w = 0; w < nw; w++) {
        uint32_t m = 0;
        for (int b = 0; b < 32; b++) {
            int t = w * 32 + b;
            if (c->narrow ? t == c->only : t % 3 == (int)((c->last + 1) % 3)) m |= 1u << b;
        }
        c->mask[w] = m;
    }
    return c->mask;
}

static void accept(void *ctx, int32_t tok) {
    coll *c = ctx;
    if (c->narrow ? tok != c->only : tok % 3 != (c->last + 1) % 3) c->bad_constraint++;
    c->last = tok;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

typedef struct workload {
    int32_t prompt[NS][600];
    int n_prompt[NS];
    int max_tokens[NS];
    bool constrained;
    int narrow;
    float temp;
} workload;

typedef struct result {
    int32_t toks[NS][MAXT];
    int n[NS];
    eng_finish fin[NS];
    eng_req_stats st[NS];
    eng_stats es;
    int bad_constraint;
    bool ok;
} result;

static size_t kv_bytes = (size_t)64 << 20;

static void run(const char *path, int spec, bool prefix_cache, int turns, const workload *w, result *r) {
    memset(r, 0, sizeof *r);
    eng_params p = eng_default_params();
    p.model_path = path;
    p.device = tdev();
    p.n_threads = 2;
    p.n_ctx = 2048;
    p.kv_max_bytes = kv_bytes;
    p.step_tokens = 64; /* prompts prefill over several steps: catch-up across chunks */
    p.max_running = NS;
    p.prefix_cache = prefix_cache;
    p.debug_check = true;
    p.spec = spec;
    hn_err err;
    eng_engine *g = NULL;
    if (eng_create(&p, &g, &err)) {
        CHECKF(0, "%s: eng_create: %s", path, err.msg);
        return;
    }
    coll *c = calloc(NS, sizeof *c);
    const int nv = (int)tok_n_vocab(eng_vocab(g));
    r->ok = true;
    for (int turn = 0; turn < turns; turn++) {
        memset(c, 0, sizeof *c * NS);
        for (int i = 0; i < NS; i++) {
            pthread_mutex_init(&c[i].mu, NULL);
            pthread_cond_init(&c[i].cv, NULL);
            c[i].n_vocab = nv;
            c[i].narrow = w->narrow;
            c[i].only = 100 + 37 * i;
            eng_request rq = {.prompt = w->prompt[i], .n_prompt = w->n_prompt[i], .max_tokens = w->max_tokens[i],
                              .ignore_eog = true, .on_event = on_event, .ctx = &c[i]};
            rq.sampling = smp_default_params();
            rq.sampling.temp = w->temp;
            rq.sampling.seed = 7 + (uint64_t)i;
            if (w->constrained || w->narrow) {
                rq.allowed = allowed;
                rq.accept = accept;
                rq.mask_ctx = &c[i];
            }
            eng_req_id id;
            if (eng_submit(g, &rq, &id, &err)) CHECKF(0, "submit: %s", err.msg);
        }
        r->bad_constraint = 0;
        for (int i = 0; i < NS; i++) {
            struct timespec ts;
            hn_deadline_ms(&ts, 300000);
            pthread_mutex_lock(&c[i].mu);
            while (!c[i].done)
                if (pthread_cond_timedwait(&c[i].cv, &c[i].mu, &ts)) break;
            r->ok &= c[i].done;
            r->n[i] = c[i].n < MAXT ? c[i].n : MAXT;
            memcpy(r->toks[i], c[i].toks, sizeof(int32_t) * (size_t)r->n[i]);
            r->fin[i] = c[i].fin;
            r->st[i] = c[i].st;
            r->bad_constraint += c[i].bad_constraint;
            pthread_mutex_unlock(&c[i].mu);
        }
        for (int i = 0; i < NS; i++) {
            pthread_mutex_destroy(&c[i].mu);
            pthread_cond_destroy(&c[i].cv);
        }
    }
    for (int t = 0; t < 100; t++) { /* the last step's stats are published after the events */
        eng_get_stats(g, &r->es);
        if (r->es.n_running == 0) break;
        usleep(10000);
    }
    eng_get_stats(g, &r->es);
    eng_free(g);
    free(c);
}

static bool same(const result *a, const result *b, const char *what) {
    bool ok = a->ok && b->ok;
    for (int i = 0; i < NS && ok; i++) {
        if (a->n[i] != b->n[i] || a->fin[i] != b->fin[i] ||
            memcmp(a->toks[i], b->toks[i], sizeof(int32_t) * (size_t)a->n[i])) {
            int j = 0;
            while (j < a->n[i] && j < b->n[i] && a->toks[i][j] == b->toks[i][j]) j++;
            CHECKF(0, "%s: session %d differs at token %d (%d vs %d tokens, finish %d vs %d)", what, i, j, a->n[i],
                   b->n[i], (int)a->fin[i], (int)b->fin[i]);
            ok = false;
        }
    }
    return ok;
}

static void make_workload(workload *w) {
    memset(w, 0, sizeof *w);
    for (int i = 0; i < NS; i++) {
        int plen = 40 + 10 * i, n = 0;
        int32_t passage[80];
        for (int j = 0; j < plen; j++) passage[j] = 3 + (int32_t)(rnd() % 1997u);
        if (i % 2 == 0) {
            for (int rep = 0; rep < 3; rep++)
                for (int j = 0; j < plen; j++) w->prompt[i][n++] = passage[j];
        } else {
            for (int j = 0; j < 150; j++) w->prompt[i][n++] = 3 + (int32_t)(rnd() % 1997u);
        }
        w->n_prompt[i] = n;
        w->max_tokens[i] = 60 + 12 * i;
    }
}

/* The counters of a run with the MTP layer: the requests' add up to the
 * engine's, accepted <= verified <= proposed, the MTP ran (catch-up rows
 * for every computed token at least) and its memory is reported. Returns
 * the acceptance ratio. */
static double check_counters(const result *r, const char *what, bool one_turn) {
    uint64_t d = 0, a = 0;
    for (int i = 0; i < NS; i++) {
        d += (uint64_t)r->st[i].n_drafted;
        a += (uint64_t)r->st[i].n_accepted;
    }
    bool add_up = one_turn ? d == r->es.spec_drafted && a == r->es.spec_accepted
                           : d <= r->es.spec_drafted && a <= r->es.spec_accepted;
    CHECKF(add_up && a <= d, "%s: counters %llu/%llu vs %llu/%llu", what, (unsigned long long)d, (unsigned long long)a,
           (unsigned long long)r->es.spec_drafted, (unsigned long long)r->es.spec_accepted);
    CHECKF(r->es.mtp_loaded && r->es.mtp_kv_peak_bytes > 0 && r->es.mtp_steps > 0 &&
               r->es.mtp_tokens + r->es.cached_tokens >= r->es.prompt_tokens && r->es.mtp_drafted >= r->es.spec_drafted &&
               r->es.spec_drafted > 0 && r->es.mtp_left_out == 0,
           "%s: MTP stats (loaded %d, KV peak %zu, %llu steps, %llu rows, %llu proposed, %llu verified, %llu left out)",
           what, (int)r->es.mtp_loaded, r->es.mtp_kv_peak_bytes, (unsigned long long)r->es.mtp_steps,
           (unsigned long long)r->es.mtp_tokens, (unsigned long long)r->es.mtp_drafted,
           (unsigned long long)r->es.spec_drafted, (unsigned long long)r->es.mtp_left_out);
    CHECKF(r->es.check_failures == 0, "%s: KV check: %s", what, r->es.check_error);
    return d ? (double)a / (double)d : 0;
}

static void engine_case(const char *src) {
    char fx[512], what[700];
    if (!mtp_fixture(src, MTPF_RANDOM, fx, sizeof fx)) return;
    workload w;
    make_workload(&w);
    static result off, mtp, aut;
    run(fx, ENG_SPEC_OFF, false, 1, &w, &off);
    run(fx, ENG_SPEC_MTP, false, 1, &w, &mtp);
    run(fx, ENG_SPEC_AUTO, false, 1, &w, &aut);
    snprintf(what, sizeof what, "%s, mtp vs off", src);
    bool ok1 = same(&off, &mtp, what);
    double acc = check_counters(&mtp, what, true);
    CHECKF(mtp.es.spec == ENG_SPEC_MTP && mtp.es.spec_verify_steps > 0, "%s: never verified", what);
    CHECKF(!off.es.mtp_loaded, "%s: --spec off loads no MTP drafter", what);
    snprintf(what, sizeof what, "%s, auto vs off", src);
    bool ok2 = same(&off, &aut, what);
    CHECKF(aut.es.mtp_loaded && aut.es.check_failures == 0, "%s: auto uses the MTP layer (KV check: %s)", what,
           aut.es.check_error);
    printf("%s (random MTP layer): %s; mtp: drafted %llu accepted %llu (%.1f%%), steps %llu vs %llu, %llu MTP steps "
           "(%llu rows); auto drafted %llu accepted %llu (MTP proposed %llu)\n",
           src, ok1 && ok2 ? "identical" : "DIFFERENT", (unsigned long long)mtp.es.spec_drafted,
           (unsigned long long)mtp.es.spec_accepted, 100 * acc, (unsigned long long)mtp.es.steps,
           (unsigned long long)off.es.steps, (unsigned long long)mtp.es.mtp_steps, (unsigned long long)mtp.es.mtp_tokens,
           (unsigned long long)aut.es.spec_drafted, (unsigned long long)aut.es.spec_accepted,
           (unsigned long long)aut.es.mtp_drafted);

    /* a constraint: a drafted token it refuses is a miss */
    w.constrained = true;
    run(fx, ENG_SPEC_OFF, false, 1, &w, &off);
    run(fx, ENG_SPEC_MTP, false, 1, &w, &mtp);
    snprintf(what, sizeof what, "%s, constrained, mtp vs off", src);
    same(&off, &mtp, what);
    CHECKF(off.bad_constraint == 0 && mtp.bad_constraint == 0, "%s: constraint broken (%d, %d)", what,
           off.bad_constraint, mtp.bad_constraint);
    check_counters(&mtp, what, true);
    w.constrained = false;

    /* seeded sampling: a draft is accepted when the sampler's own draw is it */
    w.temp = 0.8f;
    run(fx, ENG_SPEC_OFF, false, 1, &w, &off);
    run(fx, ENG_SPEC_MTP, false, 1, &w, &mtp);
    snprintf(what, sizeof what, "%s, sampled, mtp vs off", src);
    same(&off, &mtp, what);
    check_counters(&mtp, what, true);
    w.temp = 0;

    /* the prefix cache, two turns on one engine: the second turn's MTP
     * sequences start from the MTP's own cached blocks (none left out) */
    run(fx, ENG_SPEC_OFF, true, 2, &w, &off);
    run(fx, ENG_SPEC_MTP, true, 2, &w, &mtp);
    snprintf(what, sizeof what, "%s, prefix cache, second turn, mtp vs off", src);
    same(&off, &mtp, what);
    check_counters(&mtp, what, false);
    CHECKF(mtp.es.cached_tokens > 0, "%s: nothing came from the prefix cache", what);

    /* a pool too small for the four sessions at once: requests are preempted
     * (their MTP sequences start again with them) and resumed through both
     * prefix caches; every invariant holds and every request finishes
     * (tokens may differ from plain decoding's here: preemption points, so
     * prefill chunks, follow the blocks drafts take) */
    kv_bytes = (size_t)600 << 10;
    run(fx, ENG_SPEC_MTP, true, 1, &w, &mtp);
    kv_bytes = (size_t)64 << 20;
    snprintf(what, sizeof what, "%s, preempted, mtp", src);
    bool all = mtp.ok;
    for (int i = 0; i < NS; i++) all &= mtp.fin[i] == ENG_FINISH_LENGTH && mtp.n[i] == w.max_tokens[i];
    CHECKF(all && mtp.es.check_failures == 0 && mtp.es.preemptions > 0 && mtp.es.mtp_steps > 0,
           "%s: finished %d, %llu preemptions, KV check: %s", what, (int)all, (unsigned long long)mtp.es.preemptions,
           mtp.es.check_error);
    printf("%s: %llu preemptions, drafted %llu, %llu requests left out of the MTP\n", what,
           (unsigned long long)mtp.es.preemptions, (unsigned long long)mtp.es.spec_drafted,
           (unsigned long long)mtp.es.mtp_left_out);

    /* the oracle: sessions restricted to one token each repeat it, which the
     * MTPF_COPY layer drafts: nearly every draft is accepted */
    char ox[512];
    if (!mtp_fixture(src, MTPF_COPY, ox, sizeof ox)) return;
    w.narrow = 1;
    run(ox, ENG_SPEC_OFF, false, 1, &w, &off);
    run(ox, ENG_SPEC_MTP, false, 1, &w, &mtp);
    snprintf(what, sizeof what, "%s, oracle MTP layer, one allowed token, mtp vs off", src);
    bool ok3 = same(&off, &mtp, what);
    acc = check_counters(&mtp, what, true);
    CHECKF(acc >= 0.9 && 2 * mtp.es.steps < off.es.steps, "%s: accepted %.1f%%, %llu steps vs %llu", what, 100 * acc,
           (unsigned long long)mtp.es.steps, (unsigned long long)off.es.steps);
    CHECKF(off.bad_constraint == 0 && mtp.bad_constraint == 0, "%s: constraint broken", what);
    printf("%s (oracle MTP layer): %s; drafted %llu accepted %llu (%.1f%%), steps %llu vs %llu\n", src,
           ok3 ? "identical" : "DIFFERENT", (unsigned long long)mtp.es.spec_drafted,
           (unsigned long long)mtp.es.spec_accepted, 100 * acc, (unsigned long long)mtp.es.steps,
           (unsigned long long)off.es.steps);
}

static void refused(const char *path, int spec, hn_status want, const char *needle) {
    eng_params p = eng_default_params();
    p.model_path = path;
    p.device = tdev();
    p.n_threads = 2;
    p.n_ctx = 512;
    p.kv_max_bytes = (size_t)16 << 20;
    p.spec = spec;
    hn_err err = {0};
    eng_engine *g = NULL;
    hn_status st = eng_create(&p, &g, &err);
    CHECKF(st == want && (!needle || strstr(err.msg, needle)), "%s: status %d, '%s' (want %d, '%s')", path, (int)st,
           st ? err.msg : "", (int)want, needle ? needle : "");
    if (!st) {
        eng_stats es;
        eng_get_stats(g, &es);
        CHECKF(!es.mtp_loaded, "%s: no MTP drafter without an MTP layer", path);
        eng_free(g);
    } else {
        printf("refused as expected: %s\n", err.msg);
    }
}

int main(void) {
    test_load("qwen35-tiny-q8_0.gguf");
    test_load("qwen35moe-tiny-q8_0.gguf");
    test_drafter("qwen35-tiny-q8_0.gguf");
    test_drafter("qwen35moe-tiny-q8_0.gguf");
    engine_case("qwen35-tiny-q8_0.gguf");
    engine_case("qwen35moe-tiny-q8_0.gguf");
    char path[512];
    refused(test_data_path(path, sizeof path, "data/models/qwen35-tiny-q8_0.gguf"), ENG_SPEC_MTP, HN_ERR_UNSUPPORTED,
            "MTP");
    refused(test_data_path(path, sizeof path, "data/models/qwen3-2k-q8_0.gguf"), ENG_SPEC_MTP, HN_ERR_UNSUPPORTED, "MTP");
    refused(test_data_path(path, sizeof path, "data/models/qwen35-tiny-q8_0.gguf"), ENG_SPEC_AUTO, HN_OK, NULL);
    int v;
    CHECK(eng_spec_from_name("mtp", &v) == 0 && v == ENG_SPEC_MTP && !strcmp(eng_spec_name(v), "mtp"));
    CHECK(eng_spec_from_name("dflash", &v) == 0 && v == ENG_SPEC_DFLASH); /* tests/test_spec_dflash.c */
    TEST_DONE();
}
