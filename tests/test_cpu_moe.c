/* test_cpu_moe.c: experts apart (model_params.cpu_moe, `--cpu-moe N`): the
 * routed experts of the last N layers live on a second backend, which
 * computes their weighted sum from the rows and routing the main backend
 * hands it. With a CPU backend standing in for both (two instances, each
 * with its own pool; and the one model_load makes, on the main one's pool):
 *
 * - the logits of N = 0, 1, .., all (and -1) are bit for bit those of the
 *   model on one backend, on the qwen3moe and the hybrid qwen35moe files:
 *   three prompts prefilled in one step (every row's logits), a decode step
 *   of the three, a step mixing decode and prefill, and the same in steps of
 *   a few tokens; the MTP layer's drafts too when its experts are apart;
 * - a step syncs each backend once more per layer apart (the main one also
 *   at its end), and a sync of either backend that fails mid-step fails the
 *   step with its message, the steps after it right;
 * - the expert stacks of those layers are loaded onto the expert backend
 *   only (every weight_load seen on both), model_weight_bytes says so, the
 *   fit check of a backend with memory of its own counts them off (a model
 *   that fits only with its experts apart loads only so, and the refusals
 *   say why), and the scratch counts the expert backend's;
 * - nothing allocates in the token loop;
 * - through the engine, two sessions' tokens (greedy, seeded) are those of
 *   the model on one backend, its stats say where the experts are, and the
 *   allocation hook's count is the engine's and the KV's, to the byte;
 * - bad counts, a dense model and the main backend as the expert backend are
 *   refused with messages that say so. */
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "backend/cpu/cpu.h"
#include "backend/registry.h"
#include "core/alloc.h"
#include "kv/kv.h"
#include "model/model.h"
#include "mtp_fixture.h"
#include "sched/engine.h"
#include "spec/mtp.h"
#include "test.h"

/* ---- both backends, their weight loads seen ---- */

typedef struct tap {
    be_backend *b;
    const be_ops *real;
    be_ops ops;
    size_t bytes;       /* weight bytes loaded */
    int n_exps;         /* expert stacks loaded */
    uint32_t exps_of;   /* bit il: a stack of layer il */
    size_t fake_free;   /* > 0: mem_info reports this much free */
    int fail_syncs;     /* > 0: the next syncs (this many) fail, as a device error would */
    int syncs;          /* syncs seen */
} tap;

static tap taps[2];

static tap *tap_of(be_backend *b) { return b == taps[0].b ? &taps[0] : &taps[1]; }

static hn_status tap_weight_load(be_backend *b, const be_weight_src *src, unsigned flags, be_tensor **out,
                                 hn_err *err) {
    tap *t = tap_of(b);
    t->bytes += src->bytes;
    int il;
    if (strstr(src->name, "_exps.weight") && sscanf(src->name, "blk.%d.", &il) == 1) {
        t->n_exps++;
        t->exps_of |= 1u << il;
    }
    return t->real->weight_load(b, src, flags, out, err);
}

static hn_status tap_sync(be_backend *b, hn_err *err) {
    tap *t = tap_of(b);
    t->syncs++;
    hn_status st = t->real->sync(b, err);
    if (!st && t->fail_syncs > 0) {
        t->fail_syncs--;
        return hn_errf(err, HN_ERR_INTERNAL, "test: the %s backend's sync fails", t == &taps[0] ? "main" : "expert");
    }
    return st;
}

static bool tap_mem_info(be_backend *b, size_t *free_b, size_t *total_b) {
    tap *t = tap_of(b);
    if (!t->fake_free) return false;
    *free_b = t->fake_free;
    *total_b = (size_t)80 << 30;
    return true;
}

static void tap_open(tap *t) {
    hn_err e;
    be_config bc = {.n_threads = 2};
    if (be_create("cpu", &bc, &t->b, &e)) {
        fprintf(stderr, "cpu backend: %s\n", e.msg);
        exit(1);
    }
    t->real = t->b->ops;
    t->ops = *t->real;
    t->ops.weight_load = tap_weight_load;
    t->ops.mem_info = tap_mem_info;
    t->ops.sync = tap_sync;
    t->b->ops = &t->ops;
}

static void tap_close(tap *t) {
    t->b->ops = t->real;
    be_free(t->b);
    memset(t, 0, sizeof *t);
}

/* A backend holds one model's tensors for its life: a fresh pair for each load. */
static void taps_open(void) {
    tap_open(&taps[0]);
    tap_open(&taps[1]);
}

static void taps_close(void) {
    tap_close(&taps[1]);
    tap_close(&taps[0]);
}

/* The model, then the backends. */
static void unload(model **m) {
    model_free(*m);
    *m = NULL;
    taps_close();
}

/* ---- a workload: its logits rows, one after the other ---- */

enum { N_SEQ = 3, MAX_ROWS = 64 };

typedef struct {
    float *lg;     /* every step's logits rows */
    size_t n;      /* floats written */
    size_t cap;
} out_buf;

static hn_status step(model *m, kv_cache *kv, kv_seq **seqs, const int32_t *tok, const int32_t *pos,
                      const int32_t *sid, int n, out_buf *o, hn_err *e) {
    const int V = model_hp(m)->n_vocab;
    bool want[MAX_ROWS];
    for (int i = 0; i < n; i++) want[i] = true;
    if (o->n + (size_t)n * (size_t)V > o->cap) return hn_errf(e, HN_ERR_RANGE, "test: output buffer full");
    model_batch b = {.n_tokens = n, .token = tok, .pos = pos, .seq_id = sid, .want_logits = want, .seqs = seqs,
                     .n_seqs = N_SEQ};
    hn_status st = model_forward(m, kv, &b, o->lg + o->n, n, e);
    if (!st) o->n += (size_t)n * (size_t)V;
    return st;
}

/* Three prompts (7, 19, 3 tokens) interleaved in one batch, a decode step
 * of the three, then sequence 1 prefills 5 more beside the others' decode
 * tokens; every row's logits. */
static hn_status workload(model *m, out_buf *o, hn_err *e) {
    const int V = model_hp(m)->n_vocab;
    kv_config c = model_kv_config(m, 64, 16);
    kv_cache *kv;
    hn_status st = kv_create(&c, &kv, e);
    if (st) return st;
    kv_seq sq[N_SEQ];
    kv_seq *seqs[N_SEQ] = {&sq[0], &sq[1], &sq[2]};
    for (int s = 0; s < N_SEQ; s++) {
        kv_seq_init(&sq[s], kv, 256, e);
        if (model_hp(m)->hybrid && (st = kv_seq_state_acquire(kv, &sq[s], e))) return st;
    }
    static const int len[N_SEQ] = {7, 19, 3};
    int32_t tok[MAX_ROWS], pos[MAX_ROWS], sid[MAX_ROWS];
    int n = 0, at[N_SEQ] = {0, 0, 0};
    uint32_t rs = 12345;
    while (at[0] < len[0] || at[1] < len[1] || at[2] < len[2])
        for (int s = 0; s < N_SEQ; s++) {
            if (at[s] >= len[s]) continue;
            rs = rs * 1103515245u + 12345u;
            tok[n] = (int32_t)((rs >> 8) % (uint32_t)V);
            pos[n] = at[s]++;
            sid[n++] = s;
        }
    st = step(m, kv, seqs, tok, pos, sid, n, o, e);
    /* decode: one token each, in a shuffled order */
    int32_t dt[3] = {11, 12, 13}, dp[3] = {len[1], len[0], len[2]}, ds[3] = {1, 0, 2};
    if (!st) st = step(m, kv, seqs, dt, dp, ds, 3, o, e);
    /* mixed: sequence 1 prefills 5 beside the others' decode tokens */
    int32_t mt[7], mpos[7], ms[7];
    n = 0;
    for (int i = 0; i < 5; i++) mt[n] = 20 + i, mpos[n] = len[1] + 1 + i, ms[n++] = 1;
    mt[n] = 30, mpos[n] = len[0] + 1, ms[n++] = 0;
    mt[n] = 31, mpos[n] = len[2] + 1, ms[n++] = 2;
    if (!st) st = step(m, kv, seqs, mt, mpos, ms, n, o, e);
    for (int s = 0; s < N_SEQ; s++) kv_seq_free(&sq[s], kv);
    kv_free(kv);
    return st;
}

enum { XBE_NONE, XBE_SECOND, XBE_MAIN };

/* Loads with a fresh pair of backends: the main one, and as the expert
 * backend (xbe) none (model_load makes one), the second, or the main one. */
static hn_status load(const char *path, int cpu_moe, int xbe, int max_batch, model **m, hn_err *e) {
    taps_open();
    model_params p = {.max_batch = max_batch, .backend = taps[0].b, .cpu_moe = cpu_moe,
                      .moe_backend = xbe == XBE_SECOND ? taps[1].b : xbe == XBE_MAIN ? taps[0].b : NULL};
    hn_status st = model_load(path, &p, m, e);
    if (st) taps_close();
    return st;
}

/* ---- the logits ---- */

static size_t file_weight_bytes(const model *m) {
    const gguf_ctx *g = model_gguf(m);
    size_t b = 0;
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) b += gguf_tensor_at(g, i)->nbytes;
    const gguf_tensor *te = gguf_find_tensor(g, "token_embd.weight");
    if (te && !gguf_find_tensor(g, "output.weight")) b += te->nbytes;
    return b;
}

static void test_logits(const char *file) {
    char path[512], rel[256];
    snprintf(rel, sizeof rel, "data/models/%s", file);
    test_data_path(path, sizeof path, rel);
    hn_err e;
    model *m = NULL;
    /* the model on one backend: the reference */
    const size_t cap = (size_t)4 << 20;
    out_buf ref = {malloc(sizeof(float) * cap), 0, cap}, got = {malloc(sizeof(float) * cap), 0, cap};
    if (load(path, 0, XBE_NONE, 64, &m, &e)) {
        CHECKF(0, "%s: load: %s", file, e.msg);
        return;
    }
    const int L = model_hp(m)->n_layer, V = model_hp(m)->n_vocab;
    CHECKF(workload(m, &ref, &e) == HN_OK, "%s: reference workload: %s", file, e.msg);
    const size_t all_bytes = file_weight_bytes(m);
    size_t mb, xb;
    model_weight_bytes(m, &mb, &xb);
    CHECKF(mb == all_bytes && xb == 0 && !model_moe_backend(m) && taps[0].n_exps == 3 * L,
           "%s: one backend: %zu + %zu weight bytes of %zu, %d stacks", file, mb, xb, all_bytes, taps[0].n_exps);
    unload(&m);
    /* every count, on the second backend; -1 and L are all of them; 0 with
     * an expert backend given leaves it unused */
    for (int n = -1; n <= L; n++) {
        got.n = 0;
        if (load(path, n, XBE_SECOND, 64, &m, &e)) {
            CHECKF(0, "%s: cpu_moe %d: %s", file, n, e.msg);
            continue;
        }
        const int apart = n < 0 ? L : n;
        hn_status st = workload(m, &got, &e);
        CHECKF(st == HN_OK, "%s: cpu_moe %d: %s", file, n, e.msg);
        CHECKF(got.n == ref.n && !memcmp(got.lg, ref.lg, sizeof(float) * ref.n),
               "%s: cpu_moe %d: the logits are not the one-backend model's bits (%zu of %zu floats)", file, n, got.n,
               ref.n);
        /* syncs: the step's one, and per step one more on each backend for each layer apart */
        const int steps = 3, apart_n = n < 0 ? L : n;
        CHECKF(taps[0].syncs == steps * (1 + apart_n) && taps[1].syncs == steps * apart_n,
               "%s: cpu_moe %d: %d main and %d expert syncs in %d steps", file, n, taps[0].syncs, taps[1].syncs,
               steps);
        if (apart_n) {
            /* a failing sync mid-step (either backend's) fails the step with its message; the next steps are right */
            for (int which = 0; which < 2; which++) {
                taps[which].fail_syncs = 1;
                out_buf o = {got.lg, 0, got.cap};
                st = workload(m, &o, &e);
                CHECKF(st == HN_ERR_INTERNAL && strstr(e.msg, which ? "expert backend's sync" : "main backend's sync"),
                       "%s: cpu_moe %d: a failing %s sync: %d %s", file, n, which ? "expert" : "main", (int)st,
                       st ? e.msg : "");
                taps[which].fail_syncs = 0;
            }
            got.n = 0;
            CHECKF(workload(m, &got, &e) == HN_OK && got.n == ref.n && !memcmp(got.lg, ref.lg, sizeof(float) * ref.n),
                   "%s: cpu_moe %d: after failed steps the logits are not the one-backend model's bits", file, n);
        }
        CHECKF(model_moe_remote_layers(m) == apart && (model_moe_backend(m) == (apart ? taps[1].b : NULL)),
               "%s: cpu_moe %d: %d layers apart", file, n, model_moe_remote_layers(m));
        /* the stacks of the last `apart` layers on the expert backend only, the others on the main one */
        const uint32_t last = apart ? ((1u << apart) - 1) << (L - apart) : 0, every = (1u << L) - 1;
        CHECKF(taps[1].exps_of == last && taps[1].n_exps == 3 * apart && taps[0].exps_of == (every & ~last) &&
                   taps[0].n_exps == 3 * (L - apart),
               "%s: cpu_moe %d: expert stacks on the main backend 0x%x (%d), on the expert backend 0x%x (%d)", file,
               n, taps[0].exps_of, taps[0].n_exps, taps[1].exps_of, taps[1].n_exps);
        model_weight_bytes(m, &mb, &xb);
        CHECKF(mb == taps[0].bytes && xb == taps[1].bytes && mb + xb == all_bytes && (apart == 0) == (xb == 0),
               "%s: cpu_moe %d: weight bytes %zu + %zu (loads seen %zu + %zu, file %zu)", file, n, mb, xb,
               taps[0].bytes, taps[1].bytes, all_bytes);
        /* the scratch is both backends' */
        size_t s0 = taps[0].b->ops->scratch_bytes(taps[0].b), s1 = taps[1].b->ops->scratch_bytes(taps[1].b);
        CHECKF(model_scratch_bytes(m) == s0 + (apart ? s1 : 0) && (!apart || s1 > 0),
               "%s: cpu_moe %d: scratch %zu, backends %zu + %zu", file, n, model_scratch_bytes(m), s0, s1);
        if (apart) {
            /* the token loop allocates nothing (both backends' scratch grown already) */
            kv_config c = model_kv_config(m, 16, 16);
            kv_cache *kv;
            kv_create(&c, &kv, &e);
            kv_seq sq[N_SEQ];
            kv_seq *seqs[N_SEQ] = {&sq[0], &sq[1], &sq[2]};
            for (int s = 0; s < N_SEQ; s++) {
                kv_seq_init(&sq[s], kv, 64, &e);
                if (model_hp(m)->hybrid) kv_seq_state_acquire(kv, &sq[s], &e);
            }
            int32_t t3[3] = {5, 6, 7}, p3[3] = {0, 0, 0}, s3[3] = {0, 1, 2};
            out_buf o = {got.lg, 0, got.cap};
            st = step(m, kv, seqs, t3, p3, s3, 3, &o, &e);
            hn_alloc_fail_after(0);
            for (int k = 1; k < 4 && !st; k++) {
                for (int s = 0; s < N_SEQ; s++) p3[s] = k;
                o.n = 0;
                st = step(m, kv, seqs, t3, p3, s3, 3, &o, &e);
            }
            hn_alloc_fail_after(-1);
            CHECKF(st == HN_OK, "%s: cpu_moe %d: decode with every allocation failing: %s", file, n, e.msg);
            for (int s = 0; s < N_SEQ; s++) kv_seq_free(&sq[s], kv);
            kv_free(kv);
        }
        unload(&m);
    }
    /* scratch backed whole from load (scratch_fixed): the same bits */
    taps_open();
    model_params fp = {.max_batch = 64, .backend = taps[0].b, .cpu_moe = -1, .moe_backend = taps[1].b,
                       .scratch_fixed = true};
    if (model_load(path, &fp, &m, &e) == HN_OK) {
        got.n = 0;
        CHECKF(workload(m, &got, &e) == HN_OK && got.n == ref.n && !memcmp(got.lg, ref.lg, sizeof(float) * ref.n),
               "%s: cpu_moe -1 with scratch_fixed: not the one-backend bits", file);
        unload(&m);
    } else {
        CHECKF(0, "%s: scratch_fixed: %s", file, e.msg);
        taps_close();
    }
    /* the expert backend model_load makes (on the main backend's pool), and
     * steps of a few tokens (prefill split, the scratch of both grown step by step) */
    got.n = 0;
    out_buf ref4 = {malloc(sizeof(float) * cap), 0, cap};
    if (load(path, 0, XBE_NONE, 4, &m, &e) == HN_OK) {
        CHECKF(workload(m, &ref4, &e) == HN_OK, "%s: steps of 4: %s", file, e.msg);
        unload(&m);
    }
    if (load(path, 1, XBE_NONE, 4, &m, &e) == HN_OK) {
        be_backend *x = model_moe_backend(m);
        CHECKF(x && x != taps[0].b && x != taps[1].b && !strcmp(x->ops->name, "cpu") &&
                   be_cpu_pool(x) == be_cpu_pool(taps[0].b),
               "%s: the expert backend made at load is a CPU backend on the main one's pool", file);
        CHECKF(workload(m, &got, &e) == HN_OK, "%s: cpu_moe 1, steps of 4: %s", file, e.msg);
        CHECKF(got.n == ref4.n && ref4.n > 0 && !memcmp(got.lg, ref4.lg, sizeof(float) * ref4.n),
               "%s: cpu_moe 1 in steps of 4: not the one-backend bits", file);
        /* trimmed, both backends give their scratch back */
        size_t before = model_scratch_bytes(m);
        CHECK(model_scratch_trim(m, &e) == HN_OK);
        CHECKF(model_scratch_bytes(m) < before, "%s: the trim gave back nothing (%zu)", file, before);
        unload(&m);
    } else {
        CHECKF(0, "%s: cpu_moe 1 with its own expert backend: %s", file, e.msg);
    }
    (void)V;
    free(ref4.lg);
    free(ref.lg);
    free(got.lg);
}

/* ---- the fit check ---- */

static size_t fit_loaded; /* weight bytes the main backend got in the last fit_load */

/* Loads (and frees) with cpu_moe n, the main and the expert backend
 * reporting free bytes (0: host memory, no check). */
static hn_status fit_load(const char *path, int n, size_t main_free, size_t x_free, hn_err *e) {
    taps_open();
    taps[0].fake_free = main_free;
    taps[1].fake_free = x_free;
    model *m = NULL;
    model_params p = {.max_batch = 16, .backend = taps[0].b, .cpu_moe = n, .moe_backend = taps[1].b};
    hn_status st = model_load(path, &p, &m, e);
    fit_loaded = taps[0].bytes;
    unload(&m);
    return st;
}

static void test_fit(const char *file) {
    char path[512], rel[256];
    snprintf(rel, sizeof rel, "data/models/%s", file);
    test_data_path(path, sizeof path, rel);
    hn_err e;
    model *m = NULL;
    if (load(path, -1, XBE_SECOND, 16, &m, &e)) {
        CHECKF(0, "%s: %s", file, e.msg);
        return;
    }
    size_t mb, xb;
    model_weight_bytes(m, &mb, &xb);
    const int L = model_hp(m)->n_layer;
    unload(&m);
    const size_t margin = (size_t)256 << 20; /* model.c's FIT_MARGIN */
    /* free memory for everything but the experts, and half of them */
    const size_t free_b = mb + margin + xb / 2;
    hn_status st = fit_load(path, -1, free_b, 0, &e);
    CHECKF(st == HN_OK, "%s: every expert apart does not fit in %zu bytes: %s", file, free_b, e.msg);
    /* all on the main backend: refused, pointing at --cpu-moe, before any weight is loaded */
    st = fit_load(path, 0, free_b, 0, &e);
    CHECKF(st == HN_ERR_NOMEM && strstr(e.msg, "does not fit") && strstr(e.msg, "--cpu-moe") && fit_loaded == 0,
           "%s: all on the main backend: %d %s (%zu bytes loaded)", file, (int)st, e.msg, fit_loaded);
    /* too little even with every expert apart: the message says where they are */
    st = fit_load(path, -1, mb + margin - 1, 0, &e);
    char want[64];
    snprintf(want, sizeof want, "routed experts of %d layers", L);
    CHECKF(st == HN_ERR_NOMEM && strstr(e.msg, want) && strstr(e.msg, "cpu backend"), "%s: %d %s", file, (int)st,
           e.msg);
    /* an expert backend with memory of its own is checked for the experts */
    st = fit_load(path, -1, 0, xb / 2, &e);
    CHECKF(st == HN_ERR_NOMEM && strstr(e.msg, "does not fit"), "%s: expert backend too small: %d %s", file, (int)st,
           e.msg);
    st = fit_load(path, -1, 0, xb + margin, &e);
    CHECKF(st == HN_OK, "%s: expert backend large enough: %s", file, e.msg);
}

/* ---- cpu_moe auto: the fewest last layers apart that make the rest fit ---- */

static size_t layer_experts(const gguf_ctx *g, int il) {
    static const char *const stacks[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
    size_t b = 0;
    char nm[96];
    for (int j = 0; j < 3; j++) {
        snprintf(nm, sizeof nm, "blk.%d.%s.weight", il, stacks[j]);
        const gguf_tensor *t = gguf_find_tensor(g, nm);
        if (t) b += t->nbytes;
    }
    return b;
}

/* loads with cpu_moe auto, the main backend reporting main_free bytes (0: none) and a budget (0: none);
 * *layers: what it chose (-1 when the load failed) */
static hn_status auto_load(const char *path, size_t main_free, size_t budget, int *layers, size_t *scratch,
                           hn_err *e) {
    taps_open();
    taps[0].fake_free = main_free;
    model *m = NULL;
    model_params p = {.max_batch = 16, .backend = taps[0].b, .cpu_moe = MODEL_CPU_MOE_AUTO, .mem_budget = budget};
    hn_status st = model_load(path, &p, &m, e);
    *layers = st ? -1 : model_moe_remote_layers(m);
    if (scratch) *scratch = st ? 0 : taps[0].b->ops->scratch_bytes(taps[0].b);
    if (!st && *layers > 0)
        CHECKF(model_moe_backend(m) != NULL, "%s: auto chose %d layers but has no expert backend", path, *layers);
    fit_loaded = taps[0].bytes;
    if (st) taps_close();
    else unload(&m);
    return st;
}

static void test_auto(const char *file) {
    char path[512], rel[256];
    snprintf(rel, sizeof rel, "data/models/%s", file);
    test_data_path(path, sizeof path, rel);
    hn_err e;
    model *m = NULL;
    if (load(path, 0, XBE_NONE, 16, &m, &e)) {
        CHECKF(0, "%s: %s", file, e.msg);
        return;
    }
    const size_t W = file_weight_bytes(m), base = taps[0].bytes; /* base: what the main backend loads of it */
    const int L = model_hp(m)->n_layer;
    const size_t last = layer_experts(model_gguf(m), L - 1), prev = layer_experts(model_gguf(m), L - 2);
    unload(&m);
    const size_t margin = (size_t)256 << 20; /* model.c's FIT_MARGIN */
    int n;
    size_t scratch = 0;
    /* no memory figure (host memory): nothing apart */
    hn_status st = auto_load(path, 0, 0, &n, &scratch, &e);
    CHECKF(st == HN_OK && n == 0, "%s: auto without a memory figure: %d layers (%s)", file, n, st ? e.msg : "");
    /* everything fits: nothing apart */
    st = auto_load(path, W + margin, 0, &n, NULL, &e);
    CHECKF(st == HN_OK && n == 0 && fit_loaded == base,
           "%s: auto, all fits: %d layers, %zu of %zu bytes on the main backend", file, n, fit_loaded, base);
    /* half the last layer's experts short: that layer apart */
    st = auto_load(path, W + margin - last / 2, 0, &n, NULL, &e);
    CHECKF(st == HN_OK && n == 1 && fit_loaded == base - last,
           "%s: auto, short by half a layer: %d layers (%s), %zu bytes", file, n, st ? e.msg : "", fit_loaded);
    /* short by the last layer's and half the one before: two layers */
    st = auto_load(path, W + margin - last - prev / 2, 0, &n, NULL, &e);
    CHECKF(st == HN_OK && n == 2 && fit_loaded == base - last - prev, "%s: auto, short by 1.5 layers: %d layers (%s)",
           file, n, st ? e.msg : "");
    /* too little even with every expert apart: refused, saying so */
    st = auto_load(path, margin / 2, 0, &n, NULL, &e);
    char want[64];
    snprintf(want, sizeof want, "routed experts of %d layers", L);
    CHECKF(st == HN_ERR_NOMEM && strstr(e.msg, want), "%s: auto, far too little: %d %s", file, (int)st, e.msg);
    /* a budget (--vram) below what the device reports free: the budget, less the scratch, decides */
    st = auto_load(path, (size_t)64 << 30, W + margin - last / 2 + scratch, &n, NULL, &e);
    CHECKF(st == HN_OK && n == 1, "%s: auto under a budget: %d layers (%s)", file, n, st ? e.msg : "");
    st = auto_load(path, (size_t)64 << 30, W + margin + scratch + (scratch / 8 + 4096), &n, NULL, &e);
    CHECKF(st == HN_OK && n == 0, "%s: auto under a large budget: %d layers (%s)", file, n, st ? e.msg : "");
    /* an explicit count under a budget it does not fit: refused by the fit check */
    taps_open();
    taps[0].fake_free = (size_t)64 << 30;
    model_params p = {.max_batch = 16, .backend = taps[0].b, .mem_budget = W / 2};
    st = model_load(path, &p, &m, &e);
    CHECKF(st == HN_ERR_NOMEM && strstr(e.msg, "does not fit"), "%s: all at home under a small budget: %d %s", file,
           (int)st, st ? e.msg : "");
    if (st) taps_close();
    else unload(&m);
}

/* ---- the refusals ---- */

static void refused(const char *file, int n, int xbe, const char *needle) {
    char path[512], rel[256];
    snprintf(rel, sizeof rel, "data/models/%s", file);
    test_data_path(path, sizeof path, rel);
    hn_err e;
    model *m = NULL;
    size_t before = hn_alloc_bytes();
    hn_status st = load(path, n, xbe, 16, &m, &e);
    CHECKF(st == HN_ERR_INVALID && !m && strstr(e.msg, needle), "%s cpu_moe %d: %d '%s' (want '%s')", file, n,
           (int)st, st ? e.msg : "", needle);
    if (!st) unload(&m);
    CHECKF(hn_alloc_bytes() == before, "%s cpu_moe %d: %zd bytes left allocated", file, n,
           (ssize_t)(hn_alloc_bytes() - before));
}

/* ---- the MTP layer's experts apart ---- */

static void test_mtp(void) {
    char fx[512];
    if (!mtp_fixture("qwen35moe-tiny-q8_0.gguf", MTPF_RANDOM, fx, sizeof fx)) return;
    int32_t drafted[2][3];
    float prob[2][3];
    for (int v = 0; v < 2; v++) {
        hn_err e;
        model *m = NULL;
        taps_open();
        /* cpu_moe 1: only the MTP layer's (the file's last) experts apart */
        model_params mp = {.max_batch = 32, .max_seqs = 4, .max_logits = 8, .mtp = true, .backend = taps[0].b,
                           .cpu_moe = v, .moe_backend = taps[1].b};
        if (model_load(fx, &mp, &m, &e)) {
            CHECKF(0, "mtp fixture: %s", e.msg);
            taps_close();
            return;
        }
        const int L = model_hp(m)->n_layer;
        CHECKF(taps[1].exps_of == (v ? 1u << (L - 1) : 0), "mtp: expert stacks apart 0x%x", taps[1].exps_of);
        kv_config c = model_kv_config(m, 16, 16);
        kv_cache *kv;
        kv_create(&c, &kv, &e);
        kv_seq sq;
        kv_seq *seqs[1] = {&sq};
        kv_seq_init(&sq, kv, 64, &e);
        kv_seq_state_acquire(kv, &sq, &e);
        int32_t tok[9], pos[9], sid[9];
        for (int i = 0; i < 9; i++) tok[i] = 40 + 17 * i, pos[i] = i, sid[i] = 0;
        const int V = model_hp(m)->n_vocab;
        float *lg = malloc(sizeof(float) * (size_t)V);
        model_batch b = {.n_tokens = 9, .token = tok, .pos = pos, .seq_id = sid, .seqs = seqs, .n_seqs = 1};
        CHECKF(model_forward(m, kv, &b, lg, 1, &e) == HN_OK, "mtp: forward: %s", e.msg);
        mtp_drafter *d = NULL;
        mtp_params p = {.n_ctx = 64, .max_seqs = 2, .max_draft = 4, .n_blocks = 16, .k_type = QT_F32, .v_type = QT_F32};
        if (mtp_new(m, &p, &d, &e) == HN_OK) {
            mtp_seq *ms = mtp_seq_new(d, 0);
            int32_t toks[10];
            memcpy(toks, tok, sizeof tok);
            toks[9] = 3;
            mtp_job job = {.seq = ms, .toks = toks, .from = 0, .n = 9, .row0 = 0, .k = 3, .min_k = 3,
                           .out = drafted[v], .p = prob[v]};
            for (int q = 0; q < SPC_LEN_B; q++) job.cal[q] = 1;
            CHECKF(mtp_step(d, &job, 1, &e) == HN_OK && !job.failed && job.n_out == 3, "mtp_step: %s", e.msg);
            mtp_seq_free(d, ms, toks);
            mtp_free(d);
        } else {
            CHECKF(0, "mtp_new: %s", e.msg);
        }
        free(lg);
        kv_seq_free(&sq, kv);
        kv_free(kv);
        unload(&m);
    }
    CHECKF(!memcmp(drafted[0], drafted[1], sizeof drafted[0]) && !memcmp(prob[0], prob[1], sizeof prob[0]),
           "mtp: the drafts with the MTP layer's experts apart differ: %d %d %d vs %d %d %d", drafted[0][0],
           drafted[0][1], drafted[0][2], drafted[1][0], drafted[1][1], drafted[1][2]);
}

/* ---- through the engine ---- */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t toks[64];
    int n;
    bool done;
    hn_status status;
} sink;

static void on_event(void *ctx, const eng_event *ev) {
    sink *k = ctx;
    pthread_mutex_lock(&k->mu);
    if (ev->type == ENG_EV_TOKEN && k->n < 64) k->toks[k->n++] = ev->token;
    if (ev->type == ENG_EV_DONE) {
        k->done = true;
        k->status = ev->status;
        pthread_cond_broadcast(&k->cv);
    }
    pthread_mutex_unlock(&k->mu);
}

/* Two sessions (greedy and seeded) through the engine with cpu_moe n: their
 * tokens into toks[2][24]; the engine's stats say where the experts are, and
 * the allocation hook's count is the engine's and the KV's, to the byte. */
static void engine_run(const char *path, int n, int32_t toks[2][24], int32_t *layers, size_t *apart) {
    const size_t before = hn_alloc_bytes();
    eng_params ep = eng_default_params();
    ep.model_path = path;
    ep.n_threads = 2;
    ep.n_ctx = 256;
    ep.kv_max_bytes = (size_t)16 << 20;
    ep.cpu_moe = n;
    ep.debug_check = true;
    eng_engine *g = NULL;
    hn_err e;
    if (eng_create(&ep, &g, &e)) {
        CHECKF(0, "engine cpu_moe %d: %s", n, e.msg);
        return;
    }
    sink k[2];
    for (int j = 0; j < 2; j++) {
        memset(&k[j], 0, sizeof k[j]);
        pthread_mutex_init(&k[j].mu, NULL);
        pthread_cond_init(&k[j].cv, NULL);
        int32_t prompt[40];
        for (int i = 0; i < 40; i++) prompt[i] = (int32_t)((i * 7919 + 13 + 101 * j) % 2000 + 3);
        eng_request r = {.prompt = prompt, .n_prompt = 40, .max_tokens = 24, .ignore_eog = true, .on_event = on_event,
                         .ctx = &k[j]};
        r.sampling = smp_default_params();
        r.sampling.temp = j ? 0.8f : 0;
        r.sampling.seed = 5;
        eng_req_id id;
        CHECK(eng_submit(g, &r, &id, &e) == HN_OK);
    }
    for (int j = 0; j < 2; j++) {
        pthread_mutex_lock(&k[j].mu);
        while (!k[j].done) pthread_cond_wait(&k[j].cv, &k[j].mu);
        pthread_mutex_unlock(&k[j].mu);
        CHECKF(k[j].status == HN_OK && k[j].n == 24, "engine cpu_moe %d: session %d: %d tokens", n, j, k[j].n);
        memcpy(toks[j], k[j].toks, sizeof toks[j]);
    }
    eng_stats st;
    for (int i = 0; i < 400; i++) {
        eng_get_stats(g, &st);
        if (st.n_running == 0 && st.n_waiting == 0 && st.blocks_used == 0) break;
        usleep(5000);
    }
    eng_trim(g);
    eng_get_stats(g, &st);
    *layers = st.moe_apart_layers;
    *apart = st.moe_apart_bytes;
    CHECKF(st.check_failures == 0, "engine cpu_moe %d: %s", n, st.check_error);
    CHECKF(hn_alloc_bytes() - before == st.engine_bytes + st.kv_bytes,
           "engine cpu_moe %d idle: engine %zu + KV %zu bytes, the allocator %zu", n, st.engine_bytes, st.kv_bytes,
           hn_alloc_bytes() - before);
    eng_free(g);
    CHECKF(hn_alloc_bytes() == before, "engine cpu_moe %d: %zd bytes left after eng_free", n,
           (ssize_t)(hn_alloc_bytes() - before));
}

static void test_engine(const char *file) {
    char path[512], rel[256];
    snprintf(rel, sizeof rel, "data/models/%s", file);
    test_data_path(path, sizeof path, rel);
    int32_t a[2][24], b[2][24];
    int32_t la = -1, lb = -1;
    size_t xa = 1, xb = 0;
    engine_run(path, 0, a, &la, &xa);
    engine_run(path, -1, b, &lb, &xb);
    CHECKF(!memcmp(a, b, sizeof a), "%s: the engine's tokens with every expert apart differ", file);
    /* the experts' bytes, as the model counts them */
    model *m = NULL;
    hn_err e;
    size_t mb = 0, want = 0;
    if (load(path, -1, XBE_SECOND, 16, &m, &e) == HN_OK) {
        model_weight_bytes(m, &mb, &want);
        lb -= model_hp(m)->n_layer;
        unload(&m);
    }
    CHECKF(la == 0 && xa == 0 && lb == 0 && xb == want && want > 0,
           "%s: engine stats: %d layers / %zu bytes apart; with all: %d off / %zu bytes (the model's %zu)", file, la,
           xa, lb, xb, want);
}

int main(void) {
    static const char *const files[] = {"qwen3moe-2k-q8_0.gguf", "qwen3moe-2k-q4_k_m.gguf", "qwen3moe-2k-mxfp4_moe.gguf",
                                        "qwen35moe-tiny-q8_0.gguf", "qwen35moe-tiny-q4_k_m.gguf"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[512], rel[256];
        snprintf(rel, sizeof rel, "data/models/%s", files[i]);
        FILE *f = fopen(test_data_path(path, sizeof path, rel), "rb");
        if (!f) {
            printf("skip %s (not found)\n", files[i]);
            continue;
        }
        fclose(f);
        test_logits(files[i]);
    }
    test_fit("qwen3moe-2k-q8_0.gguf");
    test_fit("qwen35moe-tiny-q8_0.gguf");
    test_auto("qwen3moe-2k-q8_0.gguf");
    test_auto("qwen35moe-tiny-q8_0.gguf");
    refused("qwen3moe-2k-q8_0.gguf", -3, XBE_SECOND, "counted 0..2");
    refused("qwen3moe-2k-q8_0.gguf", 3, XBE_SECOND, "counted 0..2");
    refused("qwen35moe-tiny-q8_0.gguf", 5, XBE_NONE, "counted 0..4");
    refused("qwen3-2k-q8_0.gguf", 1, XBE_SECOND, "not a MoE model");
    refused("qwen3-2k-q8_0.gguf", -1, XBE_NONE, "not a MoE model");
    refused("qwen3moe-2k-q8_0.gguf", 1, XBE_MAIN, "the expert backend is the main backend");
    test_mtp();
    test_engine("qwen3moe-2k-q8_0.gguf");
    test_engine("qwen35moe-tiny-q8_0.gguf");
    TEST_DONE();
}
