/* test_engine.c: the engine of sched/engine.h on a small shared model:
 *   - greedy generation equals a hand-run decode with model_forward;
 *   - penalize_prompt puts the prompt in the penalty history (as a hand-run
 *     decode whose sampler accepted the prompt), and changes the tokens;
 *   - submit errors; exactly one DONE per request; finish reasons;
 *   - a follow-up turn served from the prefix cache (prompt and reply kept)
 *     generates the same tokens as with the cache off, computing only the
 *     new part;
 *   - sessions that start together compute their shared prefix once;
 *   - a pool too small for all requests: eviction and preemption (resume by
 *     recomputation) give the same tokens as a large pool, and leave the pool
 *     consistent (zero used blocks at the end);
 *   - cancellation from a callback and from another thread, freeing the
 *     blocks at once;
 *   - a stress run of random submit / cancel / finish interleavings on a
 *     small pool with every KV invariant checked after every step;
 *   - the idle timer and eng_trim give the KV memory back; eng_free with
 *     requests in flight ends each of them;
 *   - scratch that follows the load: small after load, grown by a long
 *     prompt, back down when trimmed; no allocation in a steady decode loop;
 *   - logits and greedy tokens identical to scratch fixed at its largest.
 * Most of these run again on the hybrid qwen35-tiny model (recurrent state
 * slots, prefix cache through state checkpoints), plus: an edit in the
 * middle of a conversation resumes from the ladder checkpoint before it, the
 * checkpoint budget caps what is kept, and the state memory is reported and
 * given back. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "kv/kv.h"
#include "model/model.h"
#include "sched/engine.h"
#include "test.h"

static char model_path[512];
static hn_err e;
static bool sanitized;

typedef struct coll {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t toks[1024];
    int n, n_done;
    eng_finish fin;
    hn_status status;
    eng_req_stats st;
    eng_engine *eng;
    int cancel_after;   /* > 0: eng_cancel from the callback after this many tokens */
} coll;

static void coll_init(coll *c, eng_engine *eng) {
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->eng = eng;
}

static void coll_destroy(coll *c) {
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
}

static void on_event(void *ctx, const eng_event *ev) {
    coll *c = ctx;
    pthread_mutex_lock(&c->mu);
    if (ev->type == ENG_EV_TOKEN) {
        if (c->n < 1024) c->toks[c->n] = ev->token;
        c->n++;
        if (c->cancel_after > 0 && c->n == c->cancel_after) eng_cancel(c->eng, ev->id);
    } else {
        c->n_done++;
        c->fin = ev->finish;
        c->status = ev->status;
        c->st = ev->stats;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
}

static bool coll_wait(coll *c, int seconds) {
    struct timespec ts;
    hn_deadline_ms(&ts, seconds * 1000L);
    pthread_mutex_lock(&c->mu);
    while (!c->n_done)
        if (pthread_cond_timedwait(&c->cv, &c->mu, &ts)) break;
    bool done = c->n_done > 0;
    pthread_mutex_unlock(&c->mu);
    return done;
}

static int spec_mode = ENG_SPEC_OFF; /* the engines' speculation (engine()) */

static eng_engine *engine(int block, size_t kv_bytes, bool prefix, int32_t step, int32_t running) {
    eng_params p = eng_default_params();
    p.spec = spec_mode;
    p.model_path = model_path;
    p.n_threads = 2;
    p.n_ctx = 1024;
    p.block_size = block;
    p.kv_max_bytes = kv_bytes;
    p.prefix_cache = prefix;
    p.step_tokens = step;
    p.max_running = running;
    p.debug_check = true;
    eng_engine *g = NULL;
    if (eng_create(&p, &g, &e) != HN_OK) fprintf(stderr, "eng_create: %s\n", e.msg);
    return g;
}

static hn_status submit(eng_engine *g, coll *c, const int32_t *prompt, int n, int max_tokens, eng_req_id *id) {
    eng_request r = {.prompt = prompt, .n_prompt = n, .max_tokens = max_tokens, .ignore_eog = true,
                     .on_event = on_event, .ctx = c};
    r.sampling = smp_default_params();
    r.sampling.temp = 0;
    eng_req_id tmp;
    return eng_submit(g, &r, id ? id : &tmp, &e);
}

static void wait_idle(eng_engine *g, eng_stats *s) {
    for (int i = 0; i < 400; i++) {
        eng_get_stats(g, s);
        if (s->n_running == 0 && s->n_waiting == 0 && s->blocks_used == 0) return;
        usleep(5000);
    }
}

static void make_tokens(int32_t *t, int n, uint64_t seed, int32_t n_vocab) {
    for (int i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        t[i] = (int32_t)((seed >> 33) % (uint64_t)n_vocab);
    }
}

/* Decode by hand with the model API: greedy among the tokens whose bit is set
 * in allowed (NULL: all), or with smp (allowed must then be NULL). */
static void reference_with(const int32_t *prompt, int n, int gen, smp_sampler *smp, const uint32_t *allowed,
                           int32_t *out) {
    model *m;
    model_params mp = {.n_threads = 2, .max_batch = 256};
    if (model_load(model_path, &mp, &m, &e)) return;
    kv_config c = model_kv_config(m, 64, 16);
    c.type = c.v_type = QT_F16; /* the engine's default KV type (eng_default_params) */
    kv_cache *kv;
    kv_create(&c, &kv, &e);
    kv_seq s;
    kv_seq_init(&s, kv, 1024, &e);
    if (model_hp(m)->hybrid) kv_seq_state_acquire(kv, &s, &e);
    int nv = model_hp(m)->n_vocab;
    float *lg = hn_malloc(sizeof(float) * (size_t)nv);
    int32_t pos[256], sid[256] = {0}, tok[256];
    memcpy(tok, prompt, sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++) pos[i] = i;
    kv_seq *seqs[1] = {&s};
    model_batch b = {.n_tokens = n, .token = tok, .pos = pos, .seq_id = sid, .seqs = seqs, .n_seqs = 1};
    for (int g = 0; g < gen; g++) {
        model_forward(m, kv, &b, lg, 1, &e);
        int32_t best = -1;
        for (int i = 0; i < nv; i++)
            if ((!allowed || (allowed[i >> 5] >> (i & 31) & 1)) && (best < 0 || lg[i] > lg[best])) best = i;
        if (smp) smp_accept(smp, best = smp_sample(smp, lg));
        out[g] = best;
        tok[0] = best;
        pos[0] = n + g;
        b.n_tokens = 1;
    }
    hn_free(lg);
    kv_seq_free(&s, kv);
    kv_free(kv);
    model_free(m);
}

static void reference(const int32_t *prompt, int n, int gen, const uint32_t *allowed, int32_t *out) {
    reference_with(prompt, n, gen, NULL, allowed, out);
}

static int32_t n_vocab;

static void test_basic(void) {
    eng_engine *g = engine(16, 0, true, 64, 8);
    if (!g) {
        CHECK(0);
        return;
    }
    int32_t prompt[40], want[12];
    make_tokens(prompt, 40, 7, n_vocab);
    reference(prompt, 40, 12, NULL, want);
    coll c;
    coll_init(&c, g);
    CHECK(submit(g, &c, prompt, 40, 12, NULL) == HN_OK);
    CHECK(coll_wait(&c, 60));
    CHECK(c.n == 12 && c.n_done == 1 && c.fin == ENG_FINISH_LENGTH && c.status == HN_OK);
    CHECKF(!memcmp(c.toks, want, sizeof want), "engine tokens equal a hand-run greedy decode");
    CHECK(c.st.n_prompt == 40 && c.st.n_generated == 12 && c.st.t_first_ms > 0 && c.st.t_total_ms >= c.st.t_first_ms);
    /* submit errors: nothing is queued, no event */
    int32_t bad[2] = {1, n_vocab};
    CHECK(submit(g, &c, bad, 2, 4, NULL) == HN_ERR_INVALID);
    CHECK(submit(g, &c, bad, 0, 4, NULL) == HN_ERR_INVALID);
    static int32_t big[1100];
    CHECK(submit(g, &c, big, 1025, 4, NULL) == HN_ERR_RANGE);
    /* context: a prompt of n_ctx - 3 tokens can generate 4 */
    coll d;
    coll_init(&d, g);
    make_tokens(big, 1021, 9, n_vocab);
    CHECK(submit(g, &d, big, 1021, 0, NULL) == HN_OK);
    CHECK(coll_wait(&d, 120));
    CHECKF(d.fin == ENG_FINISH_CONTEXT && d.n == 4, "context end: finish %d after %d tokens", (int)d.fin, d.n);
    eng_stats s;
    wait_idle(g, &s);
    CHECK(c.n_done == 1 && d.n_done == 1);
    CHECK(s.blocks_used == 0 && s.check_failures == 0 && s.generated_tokens == 16);
    coll_destroy(&c);
    coll_destroy(&d);
    eng_free(g);
}

/* penalize_prompt: the prompt starts the penalty history (hone run). */
static void test_penalize_prompt(void) {
    eng_engine *g = engine(16, 0, false, 64, 4);
    if (!g) {
        CHECK(0);
        return;
    }
    /* a long prompt with a window covering it: the continuation is bound to
     * share tokens with it */
    enum { NP = 256, NG = 16 };
    static int32_t prompt[NP];
    int32_t want[2][NG];
    make_tokens(prompt, NP, 11, n_vocab);
    smp_params sp = smp_default_params();
    sp.temp = 0;
    sp.repeat_penalty = 3.0f;
    sp.penalty_last_n = NP + NG;
    for (int pen = 0; pen < 2; pen++) {
        smp_sampler *smp = smp_new(&sp, n_vocab);
        for (int i = 0; pen && i < NP; i++) smp_accept(smp, prompt[i]);
        reference_with(prompt, NP, NG, smp, NULL, want[pen]);
        smp_free(smp);
        coll c;
        coll_init(&c, g);
        eng_request r = {.prompt = prompt, .n_prompt = NP, .sampling = sp, .max_tokens = NG, .ignore_eog = true,
                         .penalize_prompt = pen, .on_event = on_event, .ctx = &c};
        eng_req_id id;
        CHECK(eng_submit(g, &r, &id, &e) == HN_OK);
        CHECK(coll_wait(&c, 60));
        CHECKF(c.n == NG && !memcmp(c.toks, want[pen], sizeof want[pen]),
               "penalize_prompt %d: engine tokens equal a hand-run decode with the same sampler", pen);
        coll_destroy(&c);
    }
    CHECKF(memcmp(want[0], want[1], sizeof want[0]), "penalizing the prompt changes the tokens of this prompt");
    eng_free(g);
}

/* The allowed-token hook: a bitmask of a few hundred tokens per request, one
 * request whose hook returns NULL (everything allowed); the tokens equal a
 * greedy decode restricted to the mask, the hook runs once per token and
 * accept sees every token. */
typedef struct {
    uint32_t *bits;
    int calls, accepted;
    int32_t last;
} allow_ctx;
static const uint32_t *allow_fn(void *ctx) {
    allow_ctx *a = ctx;
    a->calls++;
    return a->bits;
}
static void allow_accept(void *ctx, int32_t tok) {
    allow_ctx *a = ctx;
    a->accepted++;
    a->last = tok;
}

static void test_allowed(void) {
    eng_engine *g = engine(16, 0, true, 64, 8);
    if (!g) {
        CHECK(0);
        return;
    }
    int32_t words = (n_vocab + 31) / 32;
    allow_ctx ac[3] = {{0}};
    coll c[3];
    int32_t prompt[3][24], want[3][10];
    for (int k = 0; k < 3; k++) {
        make_tokens(prompt[k], 24, 100 + (uint64_t)k, n_vocab);
        if (k < 2) { /* every 7th (k = 0) or 13th (k = 1) token, plus a few from the prompt */
            ac[k].bits = hn_calloc((size_t)words, sizeof(uint32_t));
            for (int32_t t = k; t < n_vocab; t += k ? 13 : 7) ac[k].bits[t >> 5] |= 1u << (t & 31);
            for (int i = 0; i < 4; i++) ac[k].bits[prompt[k][i] >> 5] |= 1u << (prompt[k][i] & 31);
        }
        reference(prompt[k], 24, 10, ac[k].bits, want[k]);
        coll_init(&c[k], g);
    }
    for (int k = 0; k < 3; k++) {
        eng_request r = {.prompt = prompt[k], .n_prompt = 24, .max_tokens = 10, .ignore_eog = true,
                         .allowed = allow_fn, .accept = allow_accept, .mask_ctx = &ac[k], .on_event = on_event, .ctx = &c[k]};
        r.sampling = smp_default_params();
        r.sampling.temp = 0;
        eng_req_id id;
        CHECK(eng_submit(g, &r, &id, &e) == HN_OK);
    }
    for (int k = 0; k < 3; k++) {
        CHECK(coll_wait(&c[k], 120));
        int in_mask = 1;
        for (int i = 0; k < 2 && i < c[k].n && i < 10; i++) in_mask &= ac[k].bits[c[k].toks[i] >> 5] >> (c[k].toks[i] & 31) & 1;
        CHECKF(c[k].n == 10 && in_mask && !memcmp(c[k].toks, want[k], sizeof want[k]),
               "allowed hook %d: %d tokens, equal to the masked greedy decode", k, c[k].n);
        CHECKF(ac[k].calls == 10 && ac[k].accepted == 10 && ac[k].last == c[k].toks[9], "hook %d: %d calls, %d accepted", k,
               ac[k].calls, ac[k].accepted);
        coll_destroy(&c[k]);
        hn_free(ac[k].bits);
    }
    int32_t free0[10]; /* the mask mattered: unconstrained, prompt 0 leaves it */
    reference(prompt[0], 24, 10, NULL, free0);
    CHECK(memcmp(free0, want[0], sizeof free0) != 0);
    eng_free(g);
}

/* Turn 2 of a conversation reuses turn 1's prompt and reply. */
static void test_prefix_turns(void) {
    int32_t conv[200];
    make_tokens(conv, 100, 11, n_vocab);
    int32_t out[2][2][16];
    int32_t cached[2] = {0, 0};
    uint64_t computed[2];
    for (int pc = 0; pc < 2; pc++) {
        eng_engine *g = engine(16, 0, pc == 1, 64, 8);
        if (!g) {
            CHECK(0);
            return;
        }
        int n = 80;
        for (int turn = 0; turn < 2; turn++) {
            coll c;
            coll_init(&c, g);
            CHECK(submit(g, &c, conv, n, 16, NULL) == HN_OK);
            CHECK(coll_wait(&c, 60) && c.n == 16);
            memcpy(out[pc][turn], c.toks, sizeof out[pc][turn]);
            if (turn == 1) cached[pc] = c.st.n_cached;
            if (turn == 0) { /* the next prompt: conversation + reply + 20 new tokens */
                memmove(conv + n + 16, conv + n, sizeof(int32_t) * 20);
                memcpy(conv + n, c.toks, sizeof(int32_t) * 16);
                n += 36;
            }
            coll_destroy(&c);
        }
        eng_stats s;
        wait_idle(g, &s);
        computed[pc] = s.computed_tokens;
        CHECK(s.blocks_used == 0 && s.check_failures == 0);
        if (pc == 1) CHECKF(s.blocks_cached > 0 && s.cached_tokens == (uint64_t)cached[1], "cached blocks remain");
        eng_free(g);
        /* restore conv for the second engine */
        memmove(conv + 80, conv + 96, sizeof(int32_t) * 20);
    }
    CHECKF(!memcmp(out[0], out[1], sizeof out[0]), "same tokens with and without the prefix cache");
    /* turn 2 sends 116 tokens; turn 1 computed 80 + 15 of its reply: 5 full blocks of 16 are cached */
    CHECKF(cached[0] == 0 && cached[1] == 80, "turn 2 served %d tokens from the cache", (int)cached[1]);
    CHECKF(computed[1] + 80 == computed[0], "computed %llu vs %llu without the cache", (unsigned long long)computed[1],
           (unsigned long long)computed[0]);
}

/* Four sessions submitted together share a 256-token prefix: computed once. */
static void test_shared_start(void) {
    eng_engine *g = engine(16, 0, true, 64, 8);
    if (!g) {
        CHECK(0);
        return;
    }
    int32_t p[4][272];
    make_tokens(p[0], 256, 21, n_vocab);
    coll c[4];
    for (int i = 0; i < 4; i++) {
        memcpy(p[i], p[0], sizeof(int32_t) * 256);
        make_tokens(p[i] + 256, 16, 100 + (uint64_t)i, n_vocab);
        coll_init(&c[i], g);
    }
    for (int i = 0; i < 4; i++) CHECK(submit(g, &c[i], p[i], 272, 4, NULL) == HN_OK);
    for (int i = 0; i < 4; i++) CHECK(coll_wait(&c[i], 60) && c[i].n == 4);
    eng_stats s;
    wait_idle(g, &s);
    /* at most: the prefix once, each session's own 16, 4 decode tokens each */
    CHECKF(s.computed_tokens <= 256 + 4 * 16 + 4 * 4, "computed %llu tokens", (unsigned long long)s.computed_tokens);
    CHECKF(s.cached_tokens >= 3 * 256, "cached %llu of %llu", (unsigned long long)s.cached_tokens,
           (unsigned long long)s.prompt_tokens);
    CHECK(s.check_failures == 0 && s.blocks_used == 0);
    for (int i = 0; i < 4; i++) coll_destroy(&c[i]);
    eng_free(g);
}

/* A pool of 10 blocks of 16 for four requests of 100 positions each. */
static void test_preempt(void) {
    int32_t p[4][64];
    int32_t out[2][4][40];
    uint64_t preempt = 0;
    for (int small = 0; small < 2; small++) {
        size_t bb = 0;
        eng_engine *g = engine(16, 0, true, 32, 4);
        if (!g) {
            CHECK(0);
            return;
        }
        eng_stats s;
        eng_get_stats(g, &s);
        bb = s.block_bytes;
        if (small) {
            eng_free(g);
            g = engine(16, 10 * bb, true, 32, 4);
            if (!g) {
                CHECK(0);
                return;
            }
        }
        coll c[4];
        for (int i = 0; i < 4; i++) {
            make_tokens(p[i], 60, 300 + (uint64_t)i, n_vocab);
            coll_init(&c[i], g);
        }
        for (int i = 0; i < 4; i++) CHECK(submit(g, &c[i], p[i], 60, 40, NULL) == HN_OK);
        for (int i = 0; i < 4; i++) {
            CHECK(coll_wait(&c[i], 120));
            CHECKF(c[i].n == 40 && c[i].fin == ENG_FINISH_LENGTH, "request %d: %d tokens, finish %d", i, c[i].n,
                   (int)c[i].fin);
            memcpy(out[small][i], c[i].toks, sizeof out[small][i]);
            coll_destroy(&c[i]);
        }
        wait_idle(g, &s);
        if (small) {
            preempt = s.preemptions;
            CHECKF(s.blocks_max == 10 && s.evictions > 0, "pool of %d blocks, %llu evictions", (int)s.blocks_max,
                   (unsigned long long)s.evictions);
            /* hybrids: a preempted sequence left a checkpoint, which its resumption used */
            if (s.ckpt_max > 0)
                CHECKF(s.ckpt_hits > 0, "preempted hybrid sequences resumed from checkpoints (%llu hits)",
                       (unsigned long long)s.ckpt_hits);
        }
        CHECKF(s.blocks_used == 0 && s.check_failures == 0, "pool consistent: %d used, %s", (int)s.blocks_used,
               s.check_error);
        eng_free(g);
    }
    CHECKF(preempt > 0, "the small pool preempted (%llu)", (unsigned long long)preempt);
    CHECKF(!memcmp(out[0], out[1], sizeof out[0]), "preempted and resumed requests generate the same tokens");
}

static void test_cancel(void) {
    eng_engine *g = engine(16, 0, true, 32, 2);
    if (!g) {
        CHECK(0);
        return;
    }
    int32_t p[3][50];
    coll c[3];
    for (int i = 0; i < 3; i++) {
        make_tokens(p[i], 50, 500 + (uint64_t)i, n_vocab);
        coll_init(&c[i], g);
    }
    c[0].cancel_after = 5; /* from its own callback */
    eng_req_id id2;
    CHECK(submit(g, &c[0], p[0], 50, 0, NULL) == HN_OK);
    CHECK(submit(g, &c[1], p[1], 50, 0, NULL) == HN_OK);
    CHECK(submit(g, &c[2], p[2], 50, 0, &id2) == HN_OK); /* waits: max_running 2 */
    eng_cancel(g, id2);
    CHECK(coll_wait(&c[0], 60) && c[0].fin == ENG_FINISH_CANCELLED && c[0].n == 5);
    CHECK(coll_wait(&c[2], 60) && c[2].fin == ENG_FINISH_CANCELLED && c[2].n == 0);
    eng_stats s;
    for (int i = 0; i < 500; i++) { /* counters are published after each step */
        eng_get_stats(g, &s);
        if (s.n_running == 1 && s.n_waiting == 0) break;
        usleep(2000);
    }
    CHECKF(s.n_running == 1 && s.n_waiting == 0, "one request left running (%d, %d waiting)", (int)s.n_running,
           (int)s.n_waiting);
    /* find c[1]'s id: the second submitted */
    eng_cancel(g, 2);
    CHECK(coll_wait(&c[1], 60) && c[1].fin == ENG_FINISH_CANCELLED);
    eng_cancel(g, 2); /* already done: ignored */
    eng_cancel(g, 999);
    wait_idle(g, &s);
    CHECK(s.blocks_used == 0 && s.n_running == 0 && s.check_failures == 0);
    for (int i = 0; i < 3; i++) CHECK(c[i].n_done == 1);
    for (int i = 0; i < 3; i++) coll_destroy(&c[i]);
    eng_free(g);
}

static uint64_t rs = 0x243f6a8885a308d3ULL;
static uint32_t rnd(uint32_t n) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs % n);
}

static void test_stress(void) {
    enum { NREQ = 100, LIVE = 10 };
    int nreq = sanitized ? 30 : NREQ;
    size_t bb;
    eng_engine *g = engine(16, 0, true, 48, 6);
    if (!g) {
        CHECK(0);
        return;
    }
    eng_stats s;
    eng_get_stats(g, &s);
    bb = s.block_bytes;
    eng_free(g);
    g = engine(16, 14 * bb, true, 48, 6);
    if (!g) {
        CHECK(0);
        return;
    }
    int32_t fam[3][200];
    for (int f = 0; f < 3; f++) make_tokens(fam[f], 200, 900 + (uint64_t)f, n_vocab);
    static coll c[NREQ];
    static int32_t prompts[NREQ][240];
    eng_req_id ids[NREQ];
    int submitted = 0, live = 0, errors = 0;
    for (int done_all = 0; !done_all;) {
        while (submitted < nreq && live < LIVE) {
            int i = submitted++;
            coll_init(&c[i], g);
            int n = 1 + (int)rnd(230);
            int f = (int)rnd(3), shared = (int)rnd(200);
            for (int k = 0; k < n; k++) prompts[i][k] = k < shared ? fam[f][k] : (int32_t)rnd((uint32_t)n_vocab);
            if (rnd(5) == 0) c[i].cancel_after = 1 + (int)rnd(10);
            eng_request r = {.prompt = prompts[i], .n_prompt = n, .max_tokens = 1 + (int)rnd(30),
                             .ignore_eog = rnd(2) == 0, .on_event = on_event, .ctx = &c[i]};
            r.sampling = smp_default_params();
            r.sampling.seed = (uint64_t)i;
            if (eng_submit(g, &r, &ids[i], &e) != HN_OK) {
                errors++;
                c[i].n_done = 1;
                continue;
            }
            live++;
        }
        /* random cancels from this thread */
        if (submitted > 0 && rnd(16) == 0) eng_cancel(g, ids[rnd((uint32_t)submitted)]);
        usleep(1000 + rnd(4000));
        live = 0;
        done_all = submitted == nreq;
        for (int i = 0; i < submitted; i++) {
            pthread_mutex_lock(&c[i].mu);
            if (!c[i].n_done) {
                live++;
                done_all = 0;
            }
            pthread_mutex_unlock(&c[i].mu);
        }
    }
    wait_idle(g, &s);
    int once = 1, normal = 0, cancelled = 0, other = 0;
    for (int i = 0; i < nreq; i++) {
        once &= c[i].n_done == 1;
        if (c[i].fin == ENG_FINISH_LENGTH || c[i].fin == ENG_FINISH_EOG) normal++;
        else if (c[i].fin == ENG_FINISH_CANCELLED) cancelled++;
        else other++;
        coll_destroy(&c[i]);
    }
    printf("stress: %d requests: %d finished, %d cancelled, %d other; %llu preemptions, %llu evictions, %llu steps; "
           "drafted %llu, accepted %llu\n",
           nreq, normal, cancelled, other, (unsigned long long)s.preemptions, (unsigned long long)s.evictions,
           (unsigned long long)s.steps, (unsigned long long)s.spec_drafted, (unsigned long long)s.spec_accepted);
    CHECKF(spec_mode == ENG_SPEC_OFF || (s.spec_drafted > 0 && s.spec_verify_steps > 0), "stress: drafts verified");
    CHECK(errors == 0 && once);
    CHECK(normal > 0 && cancelled > 0);
    CHECKF(s.check_failures == 0, "invariants held after every step (%llu failures: %s)",
           (unsigned long long)s.check_failures, s.check_error);
    CHECK(s.blocks_used == 0 && s.n_running == 0 && s.n_waiting == 0);
    eng_free(g);
}

static void test_memory(void) {
    eng_params p = eng_default_params();
    p.model_path = model_path;
    p.n_threads = 2;
    p.n_ctx = 1024;
    p.block_size = 16;
    p.cache_idle_ms = 150;
    eng_engine *g;
    if (eng_create(&p, &g, &e) != HN_OK) {
        CHECK(0);
        return;
    }
    int32_t t[300];
    make_tokens(t, 300, 77, n_vocab);
    coll c;
    coll_init(&c, g);
    CHECK(submit(g, &c, t, 300, 4, NULL) == HN_OK);
    CHECK(coll_wait(&c, 60));
    eng_stats s;
    wait_idle(g, &s);
    CHECK(s.kv_bytes > 0 && s.blocks_cached > 0);
    for (int i = 0; i < 300 && s.kv_bytes; i++) {
        usleep(10000);
        eng_get_stats(g, &s);
    }
    CHECKF(s.kv_bytes == 0 && s.blocks_cached == 0, "the idle timer dropped the cache (%zu bytes left)", s.kv_bytes);
    /* eng_trim does it on demand */
    coll_destroy(&c);
    coll_init(&c, g);
    CHECK(submit(g, &c, t, 200, 2, NULL) == HN_OK);
    CHECK(coll_wait(&c, 60));
    wait_idle(g, &s);
    eng_trim(g);
    eng_get_stats(g, &s);
    CHECK(s.kv_bytes == 0 && s.kv_peak_bytes > 0);
    /* eng_free with requests in flight: each gets its DONE */
    coll d[3];
    for (int i = 0; i < 3; i++) {
        coll_init(&d[i], g);
        CHECK(submit(g, &d[i], t, 250, 0, NULL) == HN_OK);
    }
    eng_free(g);
    for (int i = 0; i < 3; i++) {
        CHECK(d[i].n_done == 1);
        coll_destroy(&d[i]);
    }
    coll_destroy(&c);
}

/* ---- scratch that follows the load ---- */

static bool logits_equal(const float *a, const float *b, int n) { return memcmp(a, b, sizeof(float) * (size_t)n) == 0; }

/* The model API: a dynamic and a fixed-scratch model run the same prefill
 * (over two steps) and decode; logits must be the same bits at every step.
 * The dynamic one's scratch starts small, grows with the prompt, stays put
 * (and nothing at all is allocated) over a steady decode loop, and trims
 * back to where it started. */
static void test_scratch_model(void) {
    model *md = NULL, *mf = NULL;
    model_params pd = {.n_threads = 2, .max_batch = 256, .max_logits = 16};
    model_params pf = pd;
    pf.scratch_fixed = true;
    if (model_load(model_path, &pd, &md, &e) || model_load(model_path, &pf, &mf, &e)) {
        CHECKF(0, "load: %s", e.msg);
        model_free(md);
        return;
    }
    const size_t s0 = model_scratch_bytes(md), sf = model_scratch_bytes(mf);
    CHECKF(s0 > 0 && s0 * 8 < sf, "after load the scratch holds one token (%zu bytes; fixed %zu)", s0, sf);
    kv_cache *kv[2];
    kv_seq sq[2];
    model *ms[2] = {md, mf};
    for (int j = 0; j < 2; j++) {
        kv_config c = model_kv_config(ms[j], 64, 16);
        kv_create(&c, &kv[j], &e);
        kv_seq_init(&sq[j], kv[j], 1024, &e);
        if (model_hp(ms[j])->hybrid) kv_seq_state_acquire(kv[j], &sq[j], &e);
    }
    const int nv = model_hp(md)->n_vocab, NP = 300, ND = 24;
    float *lg[2] = {hn_malloc(sizeof(float) * (size_t)nv * 4), hn_malloc(sizeof(float) * (size_t)nv * 4)};
    int32_t tok[300], pos[300], sid[300] = {0};
    bool want[300] = {false};
    make_tokens(tok, NP, 5, nv);
    for (int i = 0; i < NP; i++) pos[i] = i;
    want[NP - 1] = want[NP - 2] = want[100] = true; /* three logits rows */
    bool same = true;
    for (int j = 0; j < 2; j++) {
        kv_seq *seqs[1] = {&sq[j]};
        model_batch b = {.n_tokens = NP, .token = tok, .pos = pos, .seq_id = sid, .want_logits = want, .seqs = seqs,
                         .n_seqs = 1};
        CHECK(model_forward(ms[j], kv[j], &b, lg[j], 4, &e) == HN_OK);
    }
    same = same && logits_equal(lg[0], lg[1], 3 * nv);
    const size_t s1 = model_scratch_bytes(md);
    CHECKF(s1 > s0 && s1 < sf, "a 300-token prompt grew the scratch (%zu -> %zu bytes; fixed %zu)", s0, s1, sf);
    CHECK(model_scratch_bytes(mf) == sf);
    /* decode: greedy from the dynamic model's logits, the same tokens fed to both */
    int32_t next = 0;
    size_t a0 = 0, k0 = 0;
    for (int g = 0; g < ND; g++) {
        const float *l = lg[0];
        for (int i = 1; i < nv; i++)
            if (l[i] > l[next]) next = i;
        int32_t t1[1] = {next}, p1[1] = {NP + g}, z[1] = {0};
        if (g == 8) { /* a steady loop from here (model_forward's plan has grown for this depth) */
            a0 = hn_alloc_bytes();
            k0 = model_scratch_bytes(md);
        }
        for (int j = 0; j < 2; j++) {
            kv_seq *seqs[1] = {&sq[j]};
            model_batch b = {.n_tokens = 1, .token = t1, .pos = p1, .seq_id = z, .seqs = seqs, .n_seqs = 1};
            CHECK(model_forward(ms[j], kv[j], &b, lg[j], 1, &e) == HN_OK);
        }
        same = same && logits_equal(lg[0], lg[1], nv);
    }
    CHECKF(hn_alloc_bytes() == a0 && model_scratch_bytes(md) == k0,
           "a steady decode loop allocates nothing (%zd bytes, scratch %zd)", (ssize_t)(hn_alloc_bytes() - a0),
           (ssize_t)(model_scratch_bytes(md) - k0));
    CHECK(model_scratch_bytes(md) == s1);
    /* trimmed back down, then a decode step grows only what one token needs */
    CHECK(model_scratch_trim(md, &e) == HN_OK);
    CHECKF(model_scratch_bytes(md) == s0, "trimmed back to the load's %zu bytes (%zu)", s0, model_scratch_bytes(md));
    for (int g = 0; g < 4; g++) {
        int32_t t1[1] = {(next + g) % nv}, p1[1] = {NP + ND + g}, z[1] = {0};
        for (int j = 0; j < 2; j++) {
            kv_seq *seqs[1] = {&sq[j]};
            model_batch b = {.n_tokens = 1, .token = t1, .pos = p1, .seq_id = z, .seqs = seqs, .n_seqs = 1};
            CHECK(model_forward(ms[j], kv[j], &b, lg[j], 1, &e) == HN_OK);
        }
        same = same && logits_equal(lg[0], lg[1], nv);
    }
    CHECKF(same, "the logits are the same bits as with the scratch fixed at its largest");
    CHECK(model_scratch_bytes(md) == s0);
    for (int j = 0; j < 2; j++) {
        hn_free(lg[j]);
        kv_seq_free(&sq[j], kv[j]);
        kv_free(kv[j]);
        model_free(ms[j]);
    }
}

/* The engine: scratch small at start, grown by a long prompt, given back by
 * eng_trim; greedy tokens the same as an engine with scratch_fixed. */
static void test_scratch_engine(void) {
    int32_t t[400], toks[2][64];
    make_tokens(t, 400, 31, n_vocab);
    size_t start = 0, grown = 0, trimmed = 0, fixed = 0;
    for (int j = 0; j < 2; j++) {
        eng_params p = eng_default_params();
        p.spec = spec_mode;
        p.model_path = model_path;
        p.n_threads = 2;
        p.n_ctx = 1024;
        p.step_tokens = 256;
        p.scratch_fixed = j == 1;
        eng_engine *g;
        if (eng_create(&p, &g, &e) != HN_OK) {
            CHECKF(0, "eng_create: %s", e.msg);
            return;
        }
        eng_stats s;
        eng_get_stats(g, &s);
        if (j == 0) start = s.scratch_bytes;
        else fixed = s.scratch_bytes;
        coll c;
        coll_init(&c, g);
        CHECK(submit(g, &c, t, 400, 32, NULL) == HN_OK);
        CHECK(coll_wait(&c, 120));
        CHECK(c.n == 32);
        memcpy(toks[j], c.toks, sizeof(int32_t) * 32);
        wait_idle(g, &s);
        if (j == 0) grown = s.scratch_bytes;
        CHECK(s.scratch_peak_bytes >= s.scratch_bytes);
        eng_trim(g);
        eng_get_stats(g, &s);
        if (j == 0) trimmed = s.scratch_bytes;
        else CHECKF(s.scratch_bytes == fixed, "fixed scratch stays (%zu)", s.scratch_bytes);
        coll_destroy(&c);
        eng_free(g);
    }
    CHECKF(start > 0 && start * 8 < fixed, "the engine starts with scratch for one token (%zu bytes; fixed %zu)", start,
           fixed);
    CHECKF(grown > start && grown < fixed, "a 400-token prompt grew it (%zu bytes)", grown);
    CHECKF(trimmed == start, "eng_trim gave it back (%zu bytes, %zu at start)", trimmed, start);
    CHECKF(memcmp(toks[0], toks[1], sizeof(int32_t) * 32) == 0, "greedy tokens as with the scratch fixed");
}

/* ---- hybrids ---- */

/* One conversation of 200 tokens, then a prompt that keeps its first 150
 * and changes the rest: the match stops at the edit and resumes from the
 * deepest checkpoint at or before it (the ladder back from the last full
 * block 192: 176, 160, 128, 64), and generates what a cold engine does. */
static void test_hybrid_edit(void) {
    int32_t a[200], b[200];
    make_tokens(a, 200, 41, n_vocab);
    memcpy(b, a, sizeof b);
    make_tokens(b + 150, 50, 42, n_vocab);
    int32_t out[2][8];
    int32_t cached = -1;
    for (int pc = 0; pc < 2; pc++) {
        eng_engine *g = engine(16, 0, pc == 1, 64, 4);
        if (!g) {
            CHECK(0);
            return;
        }
        coll c;
        coll_init(&c, g);
        CHECK(submit(g, &c, a, 200, 4, NULL) == HN_OK);
        CHECK(coll_wait(&c, 60) && c.n == 4);
        coll_destroy(&c);
        coll_init(&c, g);
        CHECK(submit(g, &c, b, 200, 8, NULL) == HN_OK);
        CHECK(coll_wait(&c, 60) && c.n == 8);
        memcpy(out[pc], c.toks, sizeof out[pc]);
        if (pc) cached = c.st.n_cached;
        coll_destroy(&c);
        eng_stats s;
        wait_idle(g, &s);
        CHECKF(s.check_failures == 0 && s.blocks_used == 0, "hybrid edit: consistent (%s)", s.check_error);
        if (pc) {
            CHECKF(s.ckpts > 0 && s.ckpts <= s.ckpt_max && s.ckpt_hits >= 1 && s.state_bytes > 0,
                   "%d checkpoints (budget %d), %llu hits, %zu state bytes", (int)s.ckpts, (int)s.ckpt_max,
                   (unsigned long long)s.ckpt_hits, s.state_bytes);
            eng_trim(g);
            eng_get_stats(g, &s);
            CHECKF(s.state_bytes == 0 && s.ckpts == 0 && s.kv_bytes == 0 && s.state_peak_bytes > 0,
                   "eng_trim gives the state memory back (%zu bytes, %d checkpoints)", s.state_bytes, (int)s.ckpts);
        }
        eng_free(g);
    }
    CHECKF(cached == 128, "the edited turn resumed at %d (the checkpoint at 128)", (int)cached);
    CHECKF(!memcmp(out[0], out[1], sizeof out[0]), "an edited turn from a checkpoint = a cold turn");
}

/* The checkpoint budget: a KV budget so small that 2 checkpoints fit; many
 * distinct prompts leave at most 2 (the LRU drops the rest). */
static void test_hybrid_cap(void) {
    eng_engine *g = engine(16, 0, true, 64, 2);
    if (!g) {
        CHECK(0);
        return;
    }
    eng_stats s;
    eng_get_stats(g, &s);
    size_t bb = s.block_bytes;
    eng_free(g);
    g = engine(16, 64 * bb, true, 64, 2);
    if (!g) {
        CHECK(0);
        return;
    }
    int32_t t[6][100];
    for (int i = 0; i < 6; i++) {
        make_tokens(t[i], 100, 500 + (uint64_t)i, n_vocab);
        coll c;
        coll_init(&c, g);
        CHECK(submit(g, &c, t[i], 100, 3, NULL) == HN_OK);
        CHECK(coll_wait(&c, 60) && c.n == 3);
        coll_destroy(&c);
    }
    wait_idle(g, &s);
    CHECKF(s.ckpt_max == 2 && s.ckpts == 2, "checkpoints %d of a budget of %d", (int)s.ckpts, (int)s.ckpt_max);
    CHECK(s.check_failures == 0 && s.blocks_used == 0);
    eng_free(g);
}

/* Snapshot of sessions and stats taken from the engine thread's callback at
 * one request's Nth token (both come from the same publication). */
typedef struct snapc {
    coll c;
    int at;
    bool taken;
    eng_stats st;
    eng_session ss[8];
    int n_ss;
} snapc;

static void on_event_snap(void *ctx, const eng_event *ev) {
    snapc *s = ctx;
    if (ev->type == ENG_EV_TOKEN && s->c.n + 1 == s->at) {
        eng_get_stats(s->c.eng, &s->st);
        s->n_ss = eng_get_sessions(s->c.eng, s->ss, 8);
        s->taken = true;
    }
    on_event(&s->c, ev);
}

/* Per-session memory: own blocks plus shares of shared ones add up to the
 * pool's used blocks; the fixed cost and the KV bytes add up to what the
 * allocation hook counts. */
static void test_accounting(void) {
    size_t before = hn_alloc_bytes();
    eng_engine *g = engine(16, 0, true, 64, 4);
    if (!g) {
        CHECK(0);
        return;
    }
    eng_stats s;
    eng_get_stats(g, &s);
    CHECKF(hn_alloc_bytes() - before == s.engine_bytes + s.kv_bytes,
           "engine %zu + KV %zu bytes = the allocator's %zu", s.engine_bytes, s.kv_bytes, hn_alloc_bytes() - before);
    CHECK(s.model_bytes > 0 && s.model_bytes < s.engine_bytes && s.model_file_bytes > 0);
    int32_t t[3][100];
    make_tokens(t[0], 100, 5, n_vocab);
    for (int k = 1; k < 3; k++) {
        memcpy(t[k], t[0], sizeof(int32_t) * 64); /* a 64-token (4-block) shared prefix */
        make_tokens(t[k] + 64, 36, 50 + k, n_vocab);
    }
    /* the first turn publishes the prefix; the next two share it */
    coll a;
    coll_init(&a, g);
    CHECK(submit(g, &a, t[0], 100, 2, NULL) == HN_OK);
    CHECK(coll_wait(&a, 60));
    snapc b[2];
    eng_req_id ids[2];
    for (int k = 0; k < 2; k++) {
        memset(&b[k], 0, sizeof b[k]);
        coll_init(&b[k].c, g);
        b[k].at = 6;
        eng_request r = {.prompt = t[k + 1], .n_prompt = 100, .max_tokens = 12, .ignore_eog = true,
                         .on_event = on_event_snap, .ctx = &b[k]};
        r.sampling = smp_default_params();
        r.sampling.temp = 0;
        CHECK(eng_submit(g, &r, &ids[k], &e) == HN_OK);
    }
    for (int k = 0; k < 2; k++) CHECK(coll_wait(&b[k].c, 60));
    for (int k = 0; k < 2; k++) {
        CHECK(b[k].taken);
        const eng_stats *st = &b[k].st;
        double sum = 0;
        int found = 0;
        for (int i = 0; i < b[k].n_ss && i < 8; i++) {
            const eng_session *v = &b[k].ss[i];
            sum += (double)v->bytes_own + v->bytes_shared;
            CHECK(v->bytes_own == (size_t)v->blocks_own * st->block_bytes);
            if (v->id != ids[k]) continue;
            found++;
            CHECKF(v->state == ENG_SESS_DECODE && v->n_prompt == 100 && v->n_generated >= 4,
                   "session %llu: %s, %d prompt, %d generated", (unsigned long long)v->id,
                   eng_sess_state_name(v->state), v->n_prompt, v->n_generated);
            CHECK(v->n_ctx == v->n_tokens - 1 && v->n_tokens == 100 + v->n_generated);
            CHECKF(v->n_cached == 64 && v->n_computed == v->n_ctx - 64,
                   "cached %d, computed %lld of %d positions", v->n_cached, (long long)v->n_computed, v->n_ctx);
            /* the 4 prefix blocks are shared with the cache's other holder (the other request, when both run) */
            CHECKF(v->blocks_own + v->blocks_shared == (v->n_ctx + 15) / 16, "blocks %d + %d for %d positions",
                   v->blocks_own, v->blocks_shared, v->n_ctx);
        }
        CHECK(found == 1);
        double used = (double)st->blocks_used * (double)st->block_bytes;
        CHECKF(fabs(sum - used) <= 1e-6 * used, "sessions hold %.1f bytes, the pool's used blocks %.1f", sum, used);
    }
    /* while both ran, the prefix's 4 blocks counted half to each */
    bool halves = false;
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < b[k].n_ss && i < 8; i++)
            if (b[k].n_ss == 2 && b[k].ss[i].blocks_shared == 4 &&
                fabs(b[k].ss[i].bytes_shared - 2.0 * (double)b[k].st.block_bytes) < 1e-6)
                halves = true;
    CHECKF(halves, "two running sessions share the prefix's 4 blocks half each");
    CHECK(eng_get_sessions(g, NULL, 0) == 0);
    wait_idle(g, &s);
    CHECK(s.requests == 3 && s.finished[ENG_FINISH_LENGTH] == 3);
    /* the pool's bytes are its slabs and the block metadata sized with them */
    CHECKF(s.blocks_total > 0 && s.kv_bytes > (size_t)s.blocks_total * s.block_bytes && s.kv_peak_bytes >= s.kv_bytes,
           "KV %zu bytes (peak %zu) for %d blocks of %zu backed", s.kv_bytes, s.kv_peak_bytes, s.blocks_total,
           s.block_bytes);
    CHECK(s.ttft_hist[ENG_HIST_N - 1] == 3 && s.itl_hist[ENG_HIST_N - 1] == 1 + 2 * 11 && s.ttft_sum_ms > 0);
    eng_trim(g);
    eng_get_stats(g, &s);
    CHECKF(hn_alloc_bytes() - before == s.engine_bytes + s.kv_bytes,
           "idle: engine %zu + KV %zu bytes = the allocator's %zu", s.engine_bytes, s.kv_bytes,
           hn_alloc_bytes() - before);
    eng_free(g);
    CHECKF(hn_alloc_bytes() == before, "eng_free gives back every byte (%zu left)", hn_alloc_bytes() - before);
    coll_destroy(&a);
    for (int k = 0; k < 2; k++) coll_destroy(&b[k].c);
}

int main(void) {
    sanitized = getenv("HONE_SANITIZED") != NULL;
    test_data_path(model_path, sizeof model_path, "data/models/qwen3-2k-f32.gguf");
    model *m;
    model_params mp = {.n_threads = 1};
    if (model_load(model_path, &mp, &m, &e)) {
        CHECKF(0, "load: %s", e.msg);
        TEST_DONE();
    }
    n_vocab = model_hp(m)->n_vocab;
    model_free(m);
    test_basic();
    test_penalize_prompt();
    test_allowed();
    test_prefix_turns();
    test_shared_start();
    test_preempt();
    test_cancel();
    test_stress();
    test_memory();
    test_accounting();
    test_scratch_model();
    test_scratch_engine();
    /* the hybrid family: the same behaviour through recurrent-state slots and checkpoints */
    test_data_path(model_path, sizeof model_path, "data/models/qwen35-tiny-f32.gguf");
    if (model_load(model_path, &mp, &m, &e)) {
        CHECKF(0, "load: %s", e.msg);
        TEST_DONE();
    }
    n_vocab = model_hp(m)->n_vocab;
    model_free(m);
    printf("hybrid model (qwen35-tiny-f32):\n");
    test_basic();
    test_prefix_turns();
    test_shared_start();
    test_preempt();
    test_cancel();
    if (!sanitized) test_stress();
    test_memory();
    test_scratch_model();
    test_scratch_engine();
    test_hybrid_edit();
    test_hybrid_cap();
    /* and with speculation (drafts always verified): rejected drafts roll the
     * recurrent state back, through preemption, cancels and the stress run */
    printf("hybrid model, --spec suffix:\n");
    spec_mode = ENG_SPEC_SUFFIX;
    test_basic();
    test_prefix_turns();
    test_preempt();
    test_cancel();
    test_stress();
    test_hybrid_edit();
    spec_mode = ENG_SPEC_OFF;
    TEST_DONE();
}
