/* test_spec_engine: speculative decoding through the engine is lossless.
 *
 * On each shared model (llama-2k, qwen3-2k, qwen3moe-2k, all q8_0, and the
 * trained qwen3-agent), four sessions at once (repetitive prompts, where
 * drafts are accepted, and free ones, where they mostly miss; some stopping
 * at end-of-generation, some not), greedy: the tokens with --spec suffix
 * (drafts always verified) and auto (the controller) equal plain decoding's,
 * token for token, with every KV invariant checked after each step (the
 * rollback of rejected drafts). Also: a constraint whose allowed set depends
 * on the previous token (a drafted token it refuses must count as a miss,
 * and the mask of each verified position must be the state's after the
 * tokens before it), max_tokens and EOG inside an accepted draft, seeded
 * sampling at temperature > 0 (the same tokens too), and the counters
 * (engine and request) add up. The hybrids (qwen35, qwen35moe: recurrent
 * Gated DeltaNet layers + attention) likewise, where a rejected draft rolls
 * the recurrent state back to a verified row's snapshot; since their random
 * weights do not copy the prompt, sessions restricted to a few tokens make
 * drafts accepted in part (checked: some accepted, some not); and with the
 * prefix cache, a second turn resumes from the reply's checkpoints as plain
 * decoding does, with the same tokens. */
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
    /* constraint: allowed ids are those with id % 3 == (last + 1) % 3, or
     * (narrow > 0) only NARROW_BASE .. NARROW_BASE + narrow - 1 */
    bool constrained;
    int narrow;
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

enum { NARROW_BASE = 100 };

static const uint32_t *allowed(void *ctx) {
    coll *c = ctx;
    int want = (int)((c->last + 1) % 3);
    int nw = (c->n_vocab + 31) / 32;
    if (c->narrow) {
        memset(c->mask, 0, sizeof(uint32_t) * (size_t)nw);
        for (int t = NARROW_BASE; t < NARROW_BASE + c->narrow; t++) c->mask[t / 32] |= 1u << (t % 32);
        return c->mask;
    }
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
    if (c->narrow ? tok < NARROW_BASE || tok >= NARROW_BASE + c->narrow : tok % 3 != (c->last + 1) % 3)
        c->bad_constraint++;
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
    bool constrained[NS];
    int narrow[NS];
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

static void run(const char *path, int spec, const workload *w, result *r) {
    memset(r, 0, sizeof *r);
    eng_params p = eng_default_params();
    p.model_path = path;
    p.n_threads = 2;
    p.n_ctx = 2048;
    p.kv_max_bytes = (size_t)64 << 20;
    p.step_tokens = 2048; /* every prompt prefills in the first step, as in both runs */
    p.max_running = NS;
    p.prefix_cache = false;
    p.debug_check = true;
    p.spec = spec;
    hn_err err;
    eng_engine *g = NULL;
    if (eng_create(&p, &g, &err)) {
        CHECKF(0, "%s: eng_create: %s", path, err.msg);
        return;
    }
    coll *c = calloc(NS, sizeof *c);
    int nv = 0;
    {
        const tok_vocab *v = eng_vocab(g);
        nv = (int)tok_n_vocab(v);
    }
    for (int i = 0; i < NS; i++) {
        pthread_mutex_init(&c[i].mu, NULL);
        pthread_cond_init(&c[i].cv, NULL);
        c[i].n_vocab = nv;
        c[i].last = 0;
        c[i].narrow = w->narrow[i];
        eng_request rq = {.prompt = w->prompt[i], .n_prompt = w->n_prompt[i], .max_tokens = w->max_tokens[i],
                          .ignore_eog = w->ignore_eog[i], .on_event = on_event, .ctx = &c[i]};
        rq.sampling = smp_default_params();
        rq.sampling.temp = w->temp;
        rq.sampling.seed = 7 + (uint64_t)i;
        if ((w->constrained[i] || w->narrow[i]) && nv <= 4096 * 32) {
            rq.allowed = allowed;
            rq.accept = accept;
            rq.mask_ctx = &c[i];
        }
        eng_req_id id;
        if (eng_submit(g, &rq, &id, &err)) CHECKF(0, "submit: %s", err.msg);
    }
    r->ok = true;
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
    for (int t = 0; t < 100; t++) { /* the last step's stats are published after the events */
        eng_get_stats(g, &r->es);
        if (r->es.n_running == 0) break;
        usleep(10000);
    }
    eng_get_stats(g, &r->es);
    eng_free(g);
    for (int i = 0; i < NS; i++) {
        pthread_mutex_destroy(&c[i].mu);
        pthread_cond_destroy(&c[i].cv);
    }
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

/* Prompts: a passage repeated (copying pays), and free random text. */
static void make_workload(workload *w, int lo, int hi, bool text_model, const char *path) {
    memset(w, 0, sizeof *w);
    (void)path;
    for (int i = 0; i < NS; i++) {
        int plen = 40 + 10 * i, n = 0;
        int32_t passage[80];
        for (int j = 0; j < plen; j++) passage[j] = lo + (int32_t)(rnd() % (uint32_t)(hi - lo));
        if (i % 2 == 0) { /* repetitive: the passage three times, then its first tokens */
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

static void model_case(const char *name, int lo, int hi, bool text_model, bool hybrid) {
    char path[512], rel[256];
    snprintf(rel, sizeof rel, "data/models/%s", name);
    test_data_path(path, sizeof path, rel);
    FILE *f = fopen(path, "rb");
    if (!f) {
        printf("skip %s (not found)\n", name);
        return;
    }
    fclose(f);
    workload w;
    make_workload(&w, lo, hi, text_model, path);
    static result off, suf, aut;
    run(path, ENG_SPEC_OFF, &w, &off);
    run(path, ENG_SPEC_SUFFIX, &w, &suf);
    run(path, ENG_SPEC_AUTO, &w, &aut);
    char what[600];
    snprintf(what, sizeof what, "%s suffix vs off", name);
    bool ok1 = same(&off, &suf, what);
    snprintf(what, sizeof what, "%s auto vs off", name);
    bool ok2 = same(&off, &aut, what);
    CHECKF(off.es.spec == ENG_SPEC_OFF && off.es.spec_drafted == 0, "%s: off drafted", name);
    CHECKF(suf.es.spec == ENG_SPEC_SUFFIX && suf.es.spec_drafted > 0 && suf.es.spec_verify_steps > 0,
           "%s: suffix never drafted", name);

    CHECKF(suf.es.check_failures == 0 && aut.es.check_failures == 0, "%s: KV check: %s%s", name, suf.es.check_error,
           aut.es.check_error);
    /* counters: the requests' add up to the engine's; accepted <= drafted;
     * fewer steps than tokens when drafts were accepted */
    uint64_t d = 0, a = 0;
    for (int i = 0; i < NS; i++) {
        d += (uint64_t)suf.st[i].n_drafted;
        a += (uint64_t)suf.st[i].n_accepted;
    }
    CHECKF(d == suf.es.spec_drafted && a == suf.es.spec_accepted && a <= d, "%s: counters %llu/%llu vs %llu/%llu",
           name, (unsigned long long)d, (unsigned long long)a, (unsigned long long)suf.es.spec_drafted,
           (unsigned long long)suf.es.spec_accepted);
    /* (the sessions may join over the first steps, as the engine thread picks them up) */
    CHECKF(suf.es.steps <= off.es.steps + NS, "%s: %llu steps with drafts, %llu without", name,
           (unsigned long long)suf.es.steps, (unsigned long long)off.es.steps);
    if (text_model) /* the trained model copies: most drafts accepted, far fewer steps */
        CHECKF(2 * a > d && 2 * suf.es.steps < off.es.steps && aut.es.spec_accepted > 0,
               "%s: accepted %llu of %llu, %llu steps vs %llu", name, (unsigned long long)a, (unsigned long long)d,
               (unsigned long long)suf.es.steps, (unsigned long long)off.es.steps);
    printf("%s: %s; suffix drafted %llu accepted %llu, steps %llu vs %llu; auto drafted %llu accepted %llu\n", name,
           ok1 && ok2 ? "identical" : "DIFFERENT", (unsigned long long)suf.es.spec_drafted,
           (unsigned long long)suf.es.spec_accepted, (unsigned long long)suf.es.steps,
           (unsigned long long)off.es.steps, (unsigned long long)aut.es.spec_drafted,
           (unsigned long long)aut.es.spec_accepted);

    if (hybrid) {
        /* Random-weight models do not copy their prompt, so few drafts are
         * accepted above; restricted to a few tokens (a constraint), their
         * greedy choices repeat often enough that drafts are accepted in part:
         * the recurrent state is both kept (accepted rows) and rolled back to
         * a verified row's snapshot (rejected ones) */
        for (int i = 0; i < NS; i++) w.narrow[i] = 2 + i % 3;
        run(path, ENG_SPEC_OFF, &w, &off);
        run(path, ENG_SPEC_SUFFIX, &w, &suf);
        run(path, ENG_SPEC_AUTO, &w, &aut);
        snprintf(what, sizeof what, "%s few tokens, suffix vs off", name);
        bool n1 = same(&off, &suf, what);
        snprintf(what, sizeof what, "%s few tokens, auto vs off", name);
        bool n2 = same(&off, &aut, what);
        CHECKF(off.bad_constraint == 0 && suf.bad_constraint == 0 && aut.bad_constraint == 0,
               "%s: few tokens: constraint broken", name);
        CHECKF(suf.es.check_failures == 0 && aut.es.check_failures == 0, "%s: KV check (few tokens): %s%s", name,
               suf.es.check_error, aut.es.check_error);
        CHECKF(suf.es.spec_accepted > 0 && suf.es.spec_accepted < suf.es.spec_drafted &&
                   2 * suf.es.spec_accepted > suf.es.spec_drafted / 4 && suf.es.steps < off.es.steps,
               "%s: few tokens: accepted %llu of %llu drafted (steps %llu vs %llu): the rollback is not exercised",
               name, (unsigned long long)suf.es.spec_accepted, (unsigned long long)suf.es.spec_drafted,
               (unsigned long long)suf.es.steps, (unsigned long long)off.es.steps);
        printf("%s, few tokens: %s; suffix drafted %llu accepted %llu, steps %llu vs %llu; auto drafted %llu "
               "accepted %llu\n",
               name, n1 && n2 ? "identical" : "DIFFERENT", (unsigned long long)suf.es.spec_drafted,
               (unsigned long long)suf.es.spec_accepted, (unsigned long long)suf.es.steps,
               (unsigned long long)off.es.steps, (unsigned long long)aut.es.spec_drafted,
               (unsigned long long)aut.es.spec_accepted);
        w.temp = 0.8f; /* seeded sampling: the same draws */
        run(path, ENG_SPEC_OFF, &w, &off);
        run(path, ENG_SPEC_SUFFIX, &w, &suf);
        snprintf(what, sizeof what, "%s few tokens, sampled, suffix vs off", name);
        same(&off, &suf, what);
        CHECKF(suf.es.spec_accepted > 0 && suf.es.spec_accepted < suf.es.spec_drafted && suf.es.check_failures == 0,
               "%s: few tokens, sampled: accepted %llu of %llu", name, (unsigned long long)suf.es.spec_accepted,
               (unsigned long long)suf.es.spec_drafted);
        w.temp = 0;
        for (int i = 0; i < NS; i++) w.narrow[i] = 0;
    }

    /* a constraint on every session (the allowed set follows the previous token) */
    for (int i = 0; i < NS; i++) w.constrained[i] = true;
    run(path, ENG_SPEC_OFF, &w, &off);
    run(path, ENG_SPEC_SUFFIX, &w, &suf);
    snprintf(what, sizeof what, "%s constrained, suffix vs off", name);
    same(&off, &suf, what);
    CHECKF(off.bad_constraint == 0 && suf.bad_constraint == 0, "%s: constraint broken (%d, %d)", name,
           off.bad_constraint, suf.bad_constraint);
    CHECKF(suf.es.check_failures == 0, "%s: KV check (constrained): %s", name, suf.es.check_error);

    /* sampling (seeded): the same tokens too, since a draft is accepted when
     * the sampler's own draw is it; the constraint holds */
    w.temp = 0.8f;
    run(path, ENG_SPEC_OFF, &w, &off);
    run(path, ENG_SPEC_SUFFIX, &w, &suf);
    snprintf(what, sizeof what, "%s sampled, constrained, suffix vs off", name);
    same(&off, &suf, what);
    CHECKF(suf.ok && suf.bad_constraint == 0 && suf.es.check_failures == 0, "%s: sampling with drafts", name);
    for (int i = 0; i < NS; i++) w.constrained[i] = false;
    run(path, ENG_SPEC_OFF, &w, &off);
    run(path, ENG_SPEC_AUTO, &w, &aut);
    snprintf(what, sizeof what, "%s sampled, auto vs off", name);
    same(&off, &aut, what);
}

/* Hybrids with the prefix cache: two conversations at once, two turns each
 * (turn 2 = turn 1's prompt and reply, then a few tokens), on one engine;
 * greedy, a few allowed tokens so that drafts are accepted in part. The
 * second turn resumes from a checkpoint inside the first turn's reply (the
 * rolling checkpoint, taken from a verified row's snapshot when a verify
 * step crossed the block boundary) at least as deep as without
 * speculation, and every token equals plain decoding's. */
enum { CT = 2 };
typedef struct conv_result {
    int32_t toks[2][CT][MAXT];
    int n[2][CT];
    int32_t cached[CT];
    eng_stats es;
    bool ok;
} conv_result;

static void conversations(const char *path, int spec, const int32_t (*p1)[100], conv_result *r) {
    memset(r, 0, sizeof *r);
    eng_params p = eng_default_params();
    p.model_path = path;
    p.n_threads = 2;
    p.n_ctx = 2048;
    p.kv_max_bytes = (size_t)64 << 20;
    p.max_running = NS;
    p.prefix_cache = true;
    p.debug_check = true;
    p.spec = spec;
    hn_err err;
    eng_engine *g = NULL;
    if (eng_create(&p, &g, &err)) {
        CHECKF(0, "%s: eng_create: %s", path, err.msg);
        return;
    }
    int nv = (int)tok_n_vocab(eng_vocab(g));
    static int32_t prompt[CT][100 + MAXT + 8];
    int np[CT];
    r->ok = true;
    for (int turn = 0; turn < 2; turn++) {
        coll *c = calloc(CT, sizeof *c);
        for (int i = 0; i < CT; i++) {
            if (turn == 0) {
                memcpy(prompt[i], p1[i], sizeof p1[i]);
                np[i] = 100;
            } else { /* the first turn's reply, then a few more tokens */
                memcpy(prompt[i] + np[i], r->toks[0][i], sizeof(int32_t) * (size_t)r->n[0][i]);
                np[i] += r->n[0][i];
                for (int j = 0; j < 5; j++) prompt[i][np[i]++] = 50 + j + i;
            }
            pthread_mutex_init(&c[i].mu, NULL);
            pthread_cond_init(&c[i].cv, NULL);
            c[i].n_vocab = nv;
            c[i].narrow = 3;
            eng_request rq = {.prompt = prompt[i], .n_prompt = np[i], .max_tokens = turn ? 40 : 90 + 7 * i,
                              .ignore_eog = true, .on_event = on_event, .ctx = &c[i]};
            rq.sampling = smp_default_params();
            rq.sampling.temp = 0;
            rq.allowed = allowed;
            rq.accept = accept;
            rq.mask_ctx = &c[i];
            eng_req_id id;
            if (eng_submit(g, &rq, &id, &err)) CHECKF(0, "submit: %s", err.msg);
        }
        for (int i = 0; i < CT; i++) {
            struct timespec ts;
            hn_deadline_ms(&ts, 300000);
            pthread_mutex_lock(&c[i].mu);
            while (!c[i].done)
                if (pthread_cond_timedwait(&c[i].cv, &c[i].mu, &ts)) break;
            r->ok &= c[i].done && c[i].bad_constraint == 0;
            r->n[turn][i] = c[i].n < MAXT ? c[i].n : MAXT;
            memcpy(r->toks[turn][i], c[i].toks, sizeof(int32_t) * (size_t)r->n[turn][i]);
            if (turn) r->cached[i] = c[i].st.n_cached;
            pthread_mutex_unlock(&c[i].mu);
            pthread_mutex_destroy(&c[i].mu);
            pthread_cond_destroy(&c[i].cv);
        }
        free(c);
    }
    for (int t = 0; t < 100; t++) {
        eng_get_stats(g, &r->es);
        if (r->es.n_running == 0) break;
        usleep(10000);
    }
    eng_get_stats(g, &r->es);
    eng_free(g);
}

static void ckpt_case(const char *name) {
    char path[512], rel[256];
    snprintf(rel, sizeof rel, "data/models/%s", name);
    test_data_path(path, sizeof path, rel);
    FILE *f = fopen(path, "rb");
    if (!f) {
        printf("skip %s (not found)\n", name);
        return;
    }
    fclose(f);
    static int32_t p1[CT][100];
    for (int i = 0; i < CT; i++)
        for (int j = 0; j < 100; j++) p1[i][j] = 3 + (int32_t)(rnd() % 1990u);
    static conv_result off, suf;
    conversations(path, ENG_SPEC_OFF, p1, &off);
    conversations(path, ENG_SPEC_SUFFIX, p1, &suf);
    bool same_out = off.ok && suf.ok;
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < CT; i++)
            if (off.n[t][i] != suf.n[t][i] || memcmp(off.toks[t][i], suf.toks[t][i], sizeof(int32_t) * (size_t)off.n[t][i])) {
                int j = 0;
                while (j < off.n[t][i] && j < suf.n[t][i] && off.toks[t][i][j] == suf.toks[t][i][j]) j++;
                CHECKF(0, "%s, prefix cache: turn %d of conversation %d differs at token %d", name, t + 1, i, j);
                same_out = false;
            }
    CHECKF(suf.es.spec_accepted > 0 && suf.es.spec_accepted < suf.es.spec_drafted, "%s, prefix cache: accepted %llu of %llu",
           name, (unsigned long long)suf.es.spec_accepted, (unsigned long long)suf.es.spec_drafted);
    CHECKF(off.es.check_failures == 0 && suf.es.check_failures == 0, "%s, prefix cache: KV check: %s%s", name,
           off.es.check_error, suf.es.check_error);
    for (int i = 0; i < CT; i++)
        CHECKF(suf.cached[i] > 100 + 16 && suf.cached[i] >= off.cached[i],
               "%s, prefix cache: conversation %d's second turn resumed at %d (%d without speculation)", name, i,
               (int)suf.cached[i], (int)off.cached[i]);
    CHECKF(suf.es.ckpt_hits >= CT && suf.es.spec == ENG_SPEC_SUFFIX, "%s, prefix cache: %llu checkpoint hits", name,
           (unsigned long long)suf.es.ckpt_hits);
    printf("%s, prefix cache: %s; turn 2 resumed at %d, %d (without speculation %d, %d); drafted %llu accepted %llu\n",
           name, same_out ? "identical" : "DIFFERENT", (int)suf.cached[0], (int)suf.cached[1], (int)off.cached[0],
           (int)off.cached[1], (unsigned long long)suf.es.spec_drafted, (unsigned long long)suf.es.spec_accepted);
}

int main(void) {
    model_case("llama-2k-q8_0.gguf", 3, 2000, false, false);
    model_case("qwen3-2k-q8_0.gguf", 3, 2000, false, false);
    model_case("qwen3moe-2k-q8_0.gguf", 3, 2000, false, false);
    model_case("qwen3-agent-q8_0.gguf", 300, 20000, true, false);
    /* the hybrids (Gated DeltaNet + attention): the recurrent state rolled back after a rejection */
    model_case("qwen35-tiny-q8_0.gguf", 3, 2000, false, true);
    model_case("qwen35moe-tiny-q8_0.gguf", 3, 2000, false, true);

    ckpt_case("qwen35-tiny-q8_0.gguf");
    ckpt_case("qwen35moe-tiny-q8_0.gguf");

    /* a hybrid model speculates, visibly in the stats */
    char path[512];
    test_data_path(path, sizeof path, "data/models/qwen35-tiny-q8_0.gguf");
    eng_params p = eng_default_params();
    p.model_path = path;
    p.n_threads = 2;
    p.n_ctx = 512;
    p.kv_max_bytes = (size_t)16 << 20;
    p.spec = ENG_SPEC_AUTO;
    hn_err err;
    eng_engine *g = NULL;
    if (eng_create(&p, &g, &err) == HN_OK) {
        eng_stats s;
        eng_get_stats(g, &s);
        CHECK(s.spec == ENG_SPEC_AUTO);
        eng_free(g);
    } else {
        printf("skip hybrid: %s\n", err.msg);
    }
    /* names */
    int v;
    CHECK(eng_spec_from_name("auto", &v) == 0 && v == ENG_SPEC_AUTO);
    CHECK(eng_spec_from_name("off", &v) == 0 && v == ENG_SPEC_OFF);
    CHECK(eng_spec_from_name("suffix", &v) == 0 && v == ENG_SPEC_SUFFIX);
    CHECK(eng_spec_from_name("dflash", &v) == 0 && v == ENG_SPEC_DFLASH && eng_spec_from_name("mtp", &v) == 0 && v == ENG_SPEC_MTP);
    CHECK(eng_spec_from_name("draft", &v) == 0 && v == ENG_SPEC_DRAFT); /* tests/test_spec_draft.c */
    CHECK(eng_spec_from_name("bogus", &v) == 1);
    p.spec = 7;
    CHECK(eng_create(&p, &g, &err) == HN_ERR_INVALID);
    TEST_DONE();
}
