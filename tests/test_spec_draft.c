/* test_spec_draft: speculative decoding with a draft model (spec/draft.h)
 * through the engine is lossless, and the drafter stays in sync.
 *
 * Four sessions at once (repetitive prompts and free ones, some stopping at
 * end-of-generation), greedy, every KV invariant of the target's cache
 * checked after each step: the tokens with --spec draft (always drafting)
 * and --spec auto with a draft model equal plain decoding's, token for
 * token, for
 *   - the trained qwen3-agent drafting for itself: then nearly every drafted
 *     token must be accepted (the drafter's cache rolled back to the
 *     accepted prefix and caught up each step; a drafter that lost sync would
 *     draft from the wrong text and miss), with the prefix cache off and on
 *     (the drafter's own prefix cache: a second turn of the same prompts);
 *   - qwen3-agent with qwen3-real (random weights, the same Qwen3 tokenizer)
 *     as its drafter: drafts miss, output unchanged, and auto switches the
 *     drafter off (few proposals);
 *   - the random 2k models (llama, qwen3moe, and the hybrid qwen35-tiny, whose
 *     recurrent state is rolled back) with qwen3-2k as drafter (the same
 *     2048-token vocabulary), and qwen3-2k drafting for itself;
 * plus a constraint whose allowed set follows the previous token and seeded
 * sampling at temperature 0.8 (the same tokens too), the counters (requests'
 * add up to the engine's; the drafter's steps, proposals and memory), and the
 * refusals: a drafter with another vocabulary, a hybrid drafter, --spec draft
 * without a drafter. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "core/clock.h"
#include "sched/engine.h"
#include "tokenizer/tokenizer.h"
#include "test.h"

enum { NS = 4, MAXT = 512 };

typedef struct coll {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t toks[MAXT];
    int n, done;
    eng_finish fin;
    eng_req_stats st;
    int32_t last;
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

/* constraint: allowed ids are those with id % 3 == (last + 1) % 3 */
static const uint32_t *allowed(void *ctx) {
    coll *c = ctx;
    int want = (int)((c->last + 1) % 3);
    int nw = (c->n_vocab + 31) / 32;
    for (int w = 0; w < nw; w++) {
        uint32_t m = 0;
        for (int b = 0; b < 32; b++)
            if ((w * 32 + b) % 3 == want) m |= 1u << b;
        c->mask[w] = m;
    }
    return c->mask;
}

static void accept(void *ctx, int32_t tok) {
    coll *c = ctx;
    if (tok % 3 != (c->last + 1) % 3) c->bad_constraint++;
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
    bool ignore_eog[NS];
    bool constrained;
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

typedef struct cfg {
    int spec;
    const char *draft;   /* path or NULL */
    bool prefix_cache;
    int turns;           /* the workload this many times on one engine (the result: the last turn's) */
} cfg;

static void run(const char *path, const cfg *cf, const workload *w, result *r) {
    memset(r, 0, sizeof *r);
    eng_params p = eng_default_params();
    p.model_path = path;
    p.n_threads = 2;
    p.n_ctx = 2048;
    p.kv_max_bytes = (size_t)64 << 20;
    p.step_tokens = 2048; /* every prompt prefills in the first step, in every mode */
    p.max_running = NS;
    p.prefix_cache = cf->prefix_cache;
    p.debug_check = true;
    p.spec = cf->spec;
    p.draft_path = cf->draft;
    hn_err err;
    eng_engine *g = NULL;
    if (eng_create(&p, &g, &err)) {
        CHECKF(0, "%s: eng_create: %s", path, err.msg);
        return;
    }
    coll *c = calloc(NS, sizeof *c);
    const int nv = (int)tok_n_vocab(eng_vocab(g));
    r->ok = true;
    for (int turn = 0; turn < (cf->turns > 0 ? cf->turns : 1); turn++) {
        memset(c, 0, sizeof *c * NS);
        for (int i = 0; i < NS; i++) {
            pthread_mutex_init(&c[i].mu, NULL);
            pthread_cond_init(&c[i].cv, NULL);
            c[i].n_vocab = nv;
            eng_request rq = {.prompt = w->prompt[i], .n_prompt = w->n_prompt[i], .max_tokens = w->max_tokens[i],
                              .ignore_eog = w->ignore_eog[i], .on_event = on_event, .ctx = &c[i]};
            rq.sampling = smp_default_params();
            rq.sampling.temp = w->temp;
            rq.sampling.seed = 7 + (uint64_t)i;
            if (w->constrained && nv <= 4096 * 32) {
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

/* Prompts: a passage repeated, and free random text. */
static void make_workload(workload *w, int lo, int hi, bool text_model) {
    memset(w, 0, sizeof *w);
    for (int i = 0; i < NS; i++) {
        int plen = 40 + 10 * i, n = 0;
        int32_t passage[80];
        for (int j = 0; j < plen; j++) passage[j] = lo + (int32_t)(rnd() % (uint32_t)(hi - lo));
        if (i % 2 == 0) {
            for (int rep = 0; rep < 3; rep++)
                for (int j = 0; j < plen; j++) w->prompt[i][n++] = passage[j];
            for (int j = 0; j < 5; j++) w->prompt[i][n++] = passage[j];
        } else {
            for (int j = 0; j < 150; j++) w->prompt[i][n++] = lo + (int32_t)(rnd() % (uint32_t)(hi - lo));
        }
        w->n_prompt[i] = n;
        w->max_tokens[i] = 96 + 16 * i;
        w->ignore_eog[i] = i < 2 || !text_model;
    }
}

static bool model_path(char *path, size_t cap, const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "data/models/%s", name);
    test_data_path(path, cap, rel);
    FILE *f = fopen(path, "rb");
    if (!f) {
        printf("skip %s (not found)\n", name);
        return false;
    }
    fclose(f);
    return true;
}

/* The counters of a run with a draft model: the requests' add up to the
 * engine's, accepted <= verified <= proposed, the drafter ran and its memory
 * is reported. Returns the acceptance ratio (of the requests of the last turn). */
static double check_counters(const result *r, const char *what, bool one_turn) {
    uint64_t d = 0, a = 0;
    for (int i = 0; i < NS; i++) {
        d += (uint64_t)r->st[i].n_drafted;
        a += (uint64_t)r->st[i].n_accepted;
    }
    /* (after several turns the engine's counters hold every turn's, the requests' only the last) */
    bool add_up = one_turn ? d == r->es.spec_drafted && a == r->es.spec_accepted
                           : d <= r->es.spec_drafted && a <= r->es.spec_accepted;
    CHECKF(add_up && a <= d && r->es.spec_accepted <= r->es.spec_drafted, "%s: counters %llu/%llu vs %llu/%llu", what,
           (unsigned long long)d, (unsigned long long)a, (unsigned long long)r->es.spec_drafted,
           (unsigned long long)r->es.spec_accepted);
    CHECKF(r->es.draft_loaded && r->es.draft_file_bytes > 0 && r->es.draft_kv_peak_bytes > 0 && r->es.draft_steps > 0 &&
               r->es.draft_tokens >= r->es.draft_steps && r->es.draft_drafted >= r->es.spec_drafted,
           "%s: drafter stats (loaded %d, %zu file bytes, KV peak %zu, %llu steps, %llu rows, %llu proposed)", what,
           (int)r->es.draft_loaded, r->es.draft_file_bytes, r->es.draft_kv_peak_bytes,
           (unsigned long long)r->es.draft_steps, (unsigned long long)r->es.draft_tokens,
           (unsigned long long)r->es.draft_drafted);
    CHECKF(r->es.check_failures == 0, "%s: KV check: %s", what, r->es.check_error);
    return d ? (double)a / (double)d : 0;
}

static void pair_case(const char *target, const char *drafter, int lo, int hi, bool text_model, bool self) {
    char tp[512], dp[512];
    if (!model_path(tp, sizeof tp, target) || !model_path(dp, sizeof dp, drafter)) return;
    workload w;
    make_workload(&w, lo, hi, text_model);
    static result off, drf, aut;
    char what[700];
    run(tp, &(cfg){ENG_SPEC_OFF, NULL, false, 1}, &w, &off);
    run(tp, &(cfg){ENG_SPEC_DRAFT, dp, false, 1}, &w, &drf);
    run(tp, &(cfg){ENG_SPEC_AUTO, dp, false, 1}, &w, &aut);
    snprintf(what, sizeof what, "%s drafted by %s, draft vs off", target, drafter);
    bool ok1 = same(&off, &drf, what);
    double acc = check_counters(&drf, what, true);
    CHECKF(drf.es.spec == ENG_SPEC_DRAFT && drf.es.spec_drafted > 0 && drf.es.spec_verify_steps > 0,
           "%s: never drafted", what);
    if (self) /* the drafter is the target: its greedy tokens are the target's, bar near-ties between its
               * batched catch-up and the target's one-token rows */
        CHECKF(acc >= 0.95, "%s: accepted %.1f%% of its own drafts", what, 100 * acc);
    if (self && text_model)
        CHECKF(2 * drf.es.steps < off.es.steps, "%s: %llu steps vs %llu without drafts", what,
               (unsigned long long)drf.es.steps, (unsigned long long)off.es.steps);
    snprintf(what, sizeof what, "%s drafted by %s, auto vs off", target, drafter);
    bool ok2 = same(&off, &aut, what);
    CHECKF(aut.es.check_failures == 0 && aut.es.draft_loaded, "%s: KV check / no drafter: %s", what,
           aut.es.check_error);
    if (!self) /* a drafter whose drafts miss is switched off (bar probes): far fewer proposals than session-steps */
        CHECKF(aut.es.draft_drafted < off.es.steps, "%s: the drafter proposed %llu tokens in %llu steps of %d sessions",
               what, (unsigned long long)aut.es.draft_drafted, (unsigned long long)off.es.steps, NS);
    printf("%s <- %s: %s; draft: drafted %llu accepted %llu (%.1f%%), steps %llu vs %llu, %llu drafter steps; "
           "auto drafted %llu accepted %llu (drafter proposed %llu)\n",
           target, drafter, ok1 && ok2 ? "identical" : "DIFFERENT", (unsigned long long)drf.es.spec_drafted,
           (unsigned long long)drf.es.spec_accepted, 100 * acc, (unsigned long long)drf.es.steps,
           (unsigned long long)off.es.steps, (unsigned long long)drf.es.draft_steps,
           (unsigned long long)aut.es.spec_drafted, (unsigned long long)aut.es.spec_accepted,
           (unsigned long long)aut.es.draft_drafted);

    /* a constraint on every session: a drafted token it refuses is a miss */
    w.constrained = true;
    run(tp, &(cfg){ENG_SPEC_OFF, NULL, false, 1}, &w, &off);
    run(tp, &(cfg){ENG_SPEC_DRAFT, dp, false, 1}, &w, &drf);
    snprintf(what, sizeof what, "%s drafted by %s, constrained, draft vs off", target, drafter);
    same(&off, &drf, what);
    CHECKF(off.bad_constraint == 0 && drf.bad_constraint == 0, "%s: constraint broken (%d, %d)", what,
           off.bad_constraint, drf.bad_constraint);
    check_counters(&drf, what, true);
    w.constrained = false;

    if (!self) return;
    /* seeded sampling: a draft is accepted when the sampler's own draw is it, so the same tokens */
    w.temp = 0.8f;
    run(tp, &(cfg){ENG_SPEC_OFF, NULL, false, 1}, &w, &off);
    run(tp, &(cfg){ENG_SPEC_DRAFT, dp, false, 1}, &w, &drf);
    snprintf(what, sizeof what, "%s drafted by %s, sampled, draft vs off", target, drafter);
    same(&off, &drf, what);
    check_counters(&drf, what, true);
    w.temp = 0;

    /* the prefix cache on, two turns of the same prompts on one engine: the
     * drafter's sequences start from its own cached blocks the second time */
    run(tp, &(cfg){ENG_SPEC_OFF, NULL, true, 2}, &w, &off);
    run(tp, &(cfg){ENG_SPEC_DRAFT, dp, true, 2}, &w, &drf);
    snprintf(what, sizeof what, "%s drafted by %s, prefix cache, second turn, draft vs off", target, drafter);
    same(&off, &drf, what);
    acc = check_counters(&drf, what, false);
    CHECKF(acc >= 0.95, "%s: accepted %.1f%% of its own drafts", what, 100 * acc);
}

static void refused(const char *target, const char *drafter, int spec, hn_status want, const char *needle) {
    char tp[512], dp[512];
    if (!model_path(tp, sizeof tp, target) || (drafter && !model_path(dp, sizeof dp, drafter))) return;
    eng_params p = eng_default_params();
    p.model_path = tp;
    p.n_threads = 2;
    p.n_ctx = 512;
    p.kv_max_bytes = (size_t)16 << 20;
    p.spec = spec;
    p.draft_path = drafter ? dp : NULL;
    hn_err err = {0};
    eng_engine *g = NULL;
    hn_status st = eng_create(&p, &g, &err);
    CHECKF(st == want && strstr(err.msg, needle), "%s <- %s: status %d, '%s' (want %d, '%s')", target,
           drafter ? drafter : "(none)", (int)st, st ? err.msg : "", (int)want, needle);
    if (!st) eng_free(g);
    else printf("refused as expected: %s\n", err.msg);
}

int main(void) {
    /* the trained model drafting for itself, and a random drafter of its vocabulary */
    pair_case("qwen3-agent-q8_0.gguf", "qwen3-agent-q8_0.gguf", 300, 20000, true, true);
    pair_case("qwen3-agent-q8_0.gguf", "qwen3-real-q8_0.gguf", 300, 20000, true, false);
    /* the random 2k models share one 2048-token vocabulary */
    pair_case("qwen3-2k-q8_0.gguf", "qwen3-2k-q8_0.gguf", 3, 2000, false, true);
    pair_case("llama-2k-q8_0.gguf", "qwen3-2k-q8_0.gguf", 3, 2000, false, false);
    pair_case("qwen3moe-2k-q8_0.gguf", "qwen3-2k-q8_0.gguf", 3, 2000, false, false);
    /* a hybrid target (its recurrent state rolled back after rejected drafts) with a plain drafter */
    pair_case("qwen35-tiny-q8_0.gguf", "qwen3-2k-q8_0.gguf", 3, 2000, false, false);

    refused("qwen3-agent-q8_0.gguf", "qwen3-2k-q8_0.gguf", ENG_SPEC_DRAFT, HN_ERR_UNSUPPORTED, "vocabulary");
    refused("qwen3-2k-q8_0.gguf", "qwen3-agent-q8_0.gguf", ENG_SPEC_AUTO, HN_ERR_UNSUPPORTED, "vocabulary");
    refused("qwen3-2k-q8_0.gguf", "qwen35-tiny-q8_0.gguf", ENG_SPEC_DRAFT, HN_ERR_UNSUPPORTED, "hybrid");
    refused("qwen3-2k-q8_0.gguf", NULL, ENG_SPEC_DRAFT, HN_ERR_INVALID, "draft model");
    {
        char tp[512];
        if (model_path(tp, sizeof tp, "qwen3-2k-q8_0.gguf")) { /* a missing file is an error, not a crash */
            eng_params p = eng_default_params();
            p.model_path = tp;
            p.n_threads = 2;
            p.kv_max_bytes = (size_t)16 << 20;
            p.spec = ENG_SPEC_DRAFT;
            p.draft_path = "no/such/draft.gguf";
            hn_err err = {0};
            eng_engine *g = NULL;
            CHECK(eng_create(&p, &g, &err) != HN_OK && g == NULL);
        }
    }
    int v;
    CHECK(eng_spec_from_name("draft", &v) == 0 && v == ENG_SPEC_DRAFT && !strcmp(eng_spec_name(v), "draft"));
    TEST_DONE();
}
