/* test_agent_turns: agent-shaped conversations on the hybrids (qwen35,
 * qwen35moe: recurrent Gated DeltaNet layers + attention) through the prefix
 * cache, the way a server drives the engine: four sessions at once in one
 * engine, six turns each, a 384-token prefix shared by all, every turn's
 * prompt the previous prompt + the reply it generated + some new tokens, the
 * next turn of a session submitted as soon as its previous one is done (so
 * the sessions' prefills and decodes interleave). A recurrent state cannot
 * be rebuilt from KV blocks, so a turn resumes only where a checkpoint is;
 * checked for every turn after the first of every session: it resumed at
 * least at the end of its previous reply's last full block (cached tokens
 * >= that; for one session, whose client sends each reply back changed,
 * at least at the previous prompt's last full block), with a checkpoint budget of a dozen states (what a 4B hybrid
 * gets from the default KV budget on a 24 GB host: the budget's LRU is
 * under pressure) and with a large one, speculation off, suffix and auto.
 * Also: every reply equals a cold engine's (prefix cache off), token for
 * token, and every KV invariant holds after each step. */
#include <pthread.h>
#include <string.h>

#include "core/clock.h"
#include "kv/kv.h"
#include "model/model.h"
#include "sched/engine.h"
#include "test.h"

enum { NS = 4, NT = 6, SHARED = 384, BS = 16, MAXTOK = 2048, MAXGEN = 32 };

typedef struct sess {
    int32_t toks[MAXTOK];     /* the conversation so far (the current turn's prompt, then its reply) */
    int32_t n_prompt;
    int32_t n_gen;
    bool done;
    eng_req_stats st;
    int turn;
    int32_t cached[NT], want[NT];      /* per turn: served from the cache, and the floor asked for */
    int32_t reply[NT][MAXGEN], n_reply[NT];
} sess;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static sess ss[NS];
static char model_path[512];
static int32_t n_vocab;
static bool sanitized;
static hn_err e;

static void on_event(void *ctx, const eng_event *ev) {
    sess *s = ctx;
    pthread_mutex_lock(&mu);
    if (ev->type == ENG_EV_TOKEN) {
        if (s->n_prompt + s->n_gen < MAXTOK) s->toks[s->n_prompt + s->n_gen] = ev->token;
        s->n_gen++;
    } else {
        s->done = true;
        s->st = ev->stats;
        pthread_cond_broadcast(&cv);
    }
    pthread_mutex_unlock(&mu);
}

static void make_tokens(int32_t *t, int n, uint64_t seed) {
    for (int i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        t[i] = 3 + (int32_t)((seed >> 33) % (uint64_t)(n_vocab - 3)); /* no control tokens */
    }
}

/* Per session and turn: the reply's length and the new tokens after it,
 * varied so that turns end anywhere within a block. */
static int gen_len(int k, int t) { return 6 + (k * 5 + t * 7) % 19; }
static int new_len(int k, int t) { return 40 + (k * 11 + t * 13) % 53; }

static hn_status submit(eng_engine *g, sess *s) {
    eng_request r = {.prompt = s->toks, .n_prompt = s->n_prompt, .max_tokens = gen_len((int)(s - ss), s->turn),
                     .ignore_eog = true, .on_event = on_event, .ctx = s};
    r.sampling = smp_default_params();
    r.sampling.temp = 0;
    eng_req_id id;
    return eng_submit(g, &r, &id, &e);
}

/* Runs the four conversations to the end; false on a timeout or an error. */
static bool run_sessions(eng_engine *g) {
    int32_t shared[SHARED];
    make_tokens(shared, SHARED, 7);
    for (int k = 0; k < NS; k++) {
        sess *s = &ss[k];
        memset(s, 0, sizeof *s);
        memcpy(s->toks, shared, sizeof shared);
        make_tokens(s->toks + SHARED, 24 + 5 * k, 100 + (uint64_t)k);
        s->n_prompt = SHARED + 24 + 5 * k;
    }
    for (int k = 0; k < NS; k++)
        if (submit(g, &ss[k]) != HN_OK) return false;
    int left = NS * NT;
    struct timespec ts;
    hn_deadline_ms(&ts, 300 * 1000L);
    pthread_mutex_lock(&mu);
    while (left > 0) {
        int k = 0;
        while (k < NS && !ss[k].done) k++;
        if (k == NS) {
            if (pthread_cond_timedwait(&cv, &mu, &ts)) break;
            continue;
        }
        sess *s = &ss[k];
        s->done = false;
        left--;
        int t = s->turn;
        s->cached[t] = s->st.n_cached;
        s->n_reply[t] = s->n_gen < MAXGEN ? s->n_gen : MAXGEN;
        memcpy(s->reply[t], s->toks + s->n_prompt, sizeof(int32_t) * (size_t)s->n_reply[t]);
        if (s->n_gen != gen_len(k, t) || t + 1 == NT) {
            if (s->n_gen != gen_len(k, t)) left = -1; /* an error ended it */
            continue;
        }
        /* the previous turn computed its prompt and all of its reply but the
         * last token: the next one must resume at least at that's last full
         * block; the last session's client sends its replies back changed
         * (as a chat template that re-renders a reply differently would), so
         * its turns must resume at least at the previous prompt's last full block */
        int32_t computed = s->n_prompt + s->n_gen - 1;
        s->want[t + 1] = k == NS - 1 ? s->n_prompt / BS * BS : computed / BS * BS;
        if (k == NS - 1) s->toks[s->n_prompt] = s->toks[s->n_prompt] == 3 ? 4 : 3;
        s->n_prompt += s->n_gen;
        make_tokens(s->toks + s->n_prompt, new_len(k, t), 1000 + (uint64_t)(k * NT + t));
        s->n_prompt += new_len(k, t);
        s->n_gen = 0;
        s->turn++;
        pthread_mutex_unlock(&mu);
        hn_status st = submit(g, s);
        pthread_mutex_lock(&mu);
        if (st != HN_OK) left = -1;
    }
    pthread_mutex_unlock(&mu);
    return left == 0;
}

static eng_engine *engine(size_t kv_bytes, bool prefix, int spec) {
    eng_params p = eng_default_params();
    p.model_path = model_path;
    p.n_threads = 2;
    p.n_ctx = MAXTOK;
    p.block_size = BS;
    p.kv_max_bytes = kv_bytes;
    p.prefix_cache = prefix;
    p.spec = spec;
    p.debug_check = true;
    eng_engine *g = NULL;
    if (eng_create(&p, &g, &e) != HN_OK) fprintf(stderr, "eng_create: %s\n", e.msg);
    return g;
}

static void wait_idle(eng_engine *g, eng_stats *s) {
    for (int i = 0; i < 400; i++) {
        eng_get_stats(g, s);
        if (s->n_running == 0 && s->n_waiting == 0 && s->blocks_used == 0) return;
        struct timespec d = {0, 5000000};
        nanosleep(&d, NULL);
    }
}

static int32_t ref_reply[NS][NT][MAXGEN];

static void one_model(const char *rel) {
    test_data_path(model_path, sizeof model_path, rel);
    model *m;
    model_params mp = {.n_threads = 1};
    if (model_load(model_path, &mp, &m, &e)) {
        CHECKF(0, "load %s: %s", rel, e.msg);
        return;
    }
    n_vocab = model_hp(m)->n_vocab;
    size_t state_bytes = model_kv_config(m, 1, BS).state_bytes;
    model_free(m);
    printf("%s (recurrent state %zu bytes):\n", rel, state_bytes);
    /* the reference: no prefix cache, no speculation */
    eng_engine *g = engine(0, false, ENG_SPEC_OFF);
    if (!g) {
        CHECK(0);
        return;
    }
    CHECK(run_sessions(g));
    for (int k = 0; k < NS; k++) memcpy(ref_reply[k], ss[k].reply, sizeof ref_reply[k]);
    eng_free(g);
    static const int specs[] = {ENG_SPEC_OFF, ENG_SPEC_SUFFIX, ENG_SPEC_AUTO};
    /* checkpoint budgets: a tenth of the KV budget, in states: a dozen, and the engine's default */
    static const size_t budgets[] = {12, 0};
    for (int bi = 0; bi < 2; bi++)
        for (int si = 0; si < 3; si++) {
            if (sanitized && bi == 1) continue; /* the tight budget is the case; the large one is slow under ASan */
            g = engine(budgets[bi] * 10 * state_bytes, true, specs[si]);
            if (!g) {
                CHECK(0);
                return;
            }
            bool ran = run_sessions(g);
            eng_stats s;
            wait_idle(g, &s);
            int bad = 0, same = 0;
            char first[160] = "";
            for (int k = 0; k < NS; k++)
                for (int t = 1; t < NT; t++) {
                    if (ss[k].cached[t] >= ss[k].want[t]) continue;
                    if (!bad++)
                        snprintf(first, sizeof first, "session %d turn %d: %d cached, wanted %d", k, t,
                                 (int)ss[k].cached[t], (int)ss[k].want[t]);
                }
            if (getenv("HONE_VERBOSE"))
                for (int k = 0; k < NS; k++) {
                    printf("  spec %s budget %d session %d:", eng_spec_name(specs[si]), (int)s.ckpt_max, k);
                    for (int t = 0; t < NT; t++) printf(" %d/%d", (int)ss[k].cached[t], (int)ss[k].want[t]);
                    printf("\n");
                }
            for (int k = 0; k < NS; k++) same += !memcmp(ref_reply[k], ss[k].reply, sizeof ref_reply[k]);
            CHECKF(ran && s.check_failures == 0 && s.blocks_used == 0, "spec %s, %d checkpoints of %d: ran (%s)",
                   eng_spec_name(specs[si]), (int)s.ckpts, (int)s.ckpt_max, s.check_error);
            CHECKF(bad == 0, "spec %s, checkpoint budget %d: every later turn resumed at its previous reply's end "
                   "(%d of %d short; first: %s)",
                   eng_spec_name(specs[si]), (int)s.ckpt_max, bad, NS * (NT - 1), first);
            CHECKF(same == NS, "spec %s, budget %d: replies = the cold engine's (%d of %d sessions)",
                   eng_spec_name(specs[si]), (int)s.ckpt_max, same, NS);
            eng_free(g);
        }
}

int main(void) {
    sanitized = getenv("HONE_SANITIZED") != NULL;
    one_model("data/models/qwen35-tiny-q8_0.gguf");
    one_model("data/models/qwen35moe-tiny-q8_0.gguf");
    TEST_DONE();
}
