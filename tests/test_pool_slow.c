/* test_pool_slow.c: a slow thread (an E core, or a core shared with another
 * process) does not become the step's straggler, and what it computes does
 * not change the bits.
 *
 * pool_test_slow makes one worker busy-wait S microseconds for every chunk it
 * takes. With a static split by ith/nth that worker would take half of the
 * chunks of every run and the step would last at least (chunks / 2) * S; with
 * work-sharing it takes few, the others take the rest. The checks compare
 * chunk counts (robust on a loaded machine: the slowed worker must take under
 * a quarter of them) and the time against that static bound (the run must be
 * faster than a static split could be): on the pool alone, on the
 * CPU backend's matmul (decode and prefill sizes, packed and GGUF-row
 * weights), and on model forwards (prefill and decode of a small model file).
 * Every output is bit-identical to the unslowed run and to one thread. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "backend/registry.h"
#include "core/pool.h"
#include "kv/kv.h"
#include "model/model.h"
#include "quant/quant.h"
#include "test.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* ---- the pool alone: a job of many small chunks ---- */

#define N_CHUNKS 400
typedef struct {
    _Atomic int next;
    _Atomic int done[N_CHUNKS];
    double out[N_CHUNKS];
} share_job;

static void share_fn(void *ctx, int ith, int nth) {
    (void)ith;
    (void)nth;
    share_job *j = ctx;
    for (;;) {
        int c = pool_take(&j->next, 1, N_CHUNKS);
        if (c >= N_CHUNKS) break;
        double s = 0;
        for (int i = 0; i < 20000; i++) s += sin((double)(c * 20000 + i)); /* tens of microseconds */
        j->out[c] = s;
        atomic_fetch_add(&j->done[c], 1);
    }
}

static void test_pool_job(void) {
    hn_err e;
    pool *p;
    CHECK(pool_create(2, &p, &e) == HN_OK);
    static share_job ref, j;
    memset(&ref, 0, sizeof ref);
    share_fn(&ref, 0, 1);
    const int S = 5000; /* 5 ms per chunk on worker 1 */
    pool_test_slow(p, 1, S);
    memset(&j, 0, sizeof j);
    double t0 = now_s();
    pool_run_shared(p, share_fn, &j);
    double dt = now_s() - t0;
    long c0 = pool_test_chunks(p, 0), c1 = pool_test_chunks(p, 1);
    int once = 1;
    for (int c = 0; c < N_CHUNKS; c++) once &= atomic_load(&j.done[c]) == 1;
    CHECKF(once, "pool: every chunk ran exactly once");
    CHECKF(c0 + c1 == N_CHUNKS, "pool: chunks counted %ld + %ld of %d", c0, c1, N_CHUNKS);
    CHECKF(c1 * 8 < N_CHUNKS, "pool: the slowed worker took %ld of %d chunks (static split: %d)", c1, N_CHUNKS,
           N_CHUNKS / 2);
    double bound = N_CHUNKS / 2 * S * 1e-6;
    CHECKF(dt < bound / 2, "pool: %.3f s with a slowed worker, static split at least %.3f s", dt, bound);
    CHECKF(!memcmp(ref.out, j.out, sizeof ref.out), "pool: results differ from one thread's");
    /* pool_run gives each thread its call; a 1-thread pool counts the caller's chunks */
    pool_test_slow(p, -1, 0);
    memset(&j, 0, sizeof j);
    pool_run_shared(p, share_fn, &j);
    CHECK(pool_test_chunks(p, 0) + pool_test_chunks(p, 1) == N_CHUNKS);
    pool_free(p);
    CHECK(pool_create(1, &p, &e) == HN_OK);
    pool_test_slow(p, 0, 0);
    memset(&j, 0, sizeof j);
    pool_run_shared(p, share_fn, &j);
    CHECK(pool_test_chunks(p, 0) == N_CHUNKS);
    pool_free(p);
}

/* ---- the CPU backend's matmul ---- */

static be_backend *cpu_open(int nth) {
    hn_err e;
    be_backend *b = NULL;
    be_config cfg = {.n_threads = nth};
    if (be_create("cpu", &cfg, &b, &e)) {
        fprintf(stderr, "backend: %s\n", e.msg);
        return NULL;
    }
    be_limits l = {.max_rows = 128, .max_k = 2048, .max_head_dim = 64, .max_group = 4, .max_experts = 8,
                   .arena_bytes = (size_t)64 << 20};
    if (b->ops->reserve(b, &l, &e)) fprintf(stderr, "reserve: %s\n", e.msg);
    return b;
}

typedef struct {
    be_backend *b;
    be_tensor *W, *X, *Y;
} mm_rig;

static int mm_open(mm_rig *r, int nth, qt_type t, int K, int N, int n, const void *w, const float *x) {
    hn_err e;
    memset(r, 0, sizeof *r);
    if (!(r->b = cpu_open(nth))) return 0;
    be_weight_src src = {.name = "w", .type = t, .ne = {K, N, 1}, .data = w, .bytes = qt_row_size(t, K) * (size_t)N};
    if (r->b->ops->weight_load(r->b, &src, BE_W_MATMUL, &r->W, &e) ||
        r->b->ops->tensor_new(r->b, QT_F32, K, n, &r->X, &e) || r->b->ops->tensor_new(r->b, QT_F32, N, n, &r->Y, &e)) {
        fprintf(stderr, "matmul rig: %s\n", e.msg);
        return 0;
    }
    r->b->ops->upload(r->b, r->X, 0, x, sizeof(float) * (size_t)K * (size_t)n);
    return 1;
}

/* reps matmuls; the last one's output into y; seconds */
static double mm_time(mm_rig *r, int n, int N, int reps, float *y) {
    hn_err e;
    double t0 = now_s();
    for (int i = 0; i < reps; i++) r->b->ops->matmul(r->b, r->W, 0, r->X, n, r->Y);
    const void *h = NULL;
    r->b->ops->fetch(r->b, r->Y, n, &h);
    CHECK(r->b->ops->sync(r->b, &e) == HN_OK);
    double dt = now_s() - t0;
    memcpy(y, h, sizeof(float) * (size_t)N * (size_t)n);
    return dt;
}

static void test_matmul(qt_type t, int K, int N, int n, int no_pack) {
    const qt_type_traits *tr = qt_traits(t);
    size_t rb = qt_row_size(t, K);
    unsigned char *w = malloc(rb * (size_t)N);
    float *row = malloc(sizeof(float) * (size_t)K), *x = malloc(sizeof(float) * (size_t)K * (size_t)n);
    srand(7);
    for (int j = 0; j < N; j++) {
        for (int i = 0; i < K; i++) row[i] = (float)rand() / RAND_MAX - 0.5f;
        tr->from_float(row, w + rb * (size_t)j, K);
    }
    for (int i = 0; i < K * n; i++) x[i] = (float)rand() / RAND_MAX * 2 - 1;
    if (no_pack) setenv("HONE_NO_PACK", "1", 1);
    mm_rig r1, r2;
    int ok = mm_open(&r1, 1, t, K, N, n, w, x) && mm_open(&r2, 2, t, K, N, n, w, x);
    if (no_pack) unsetenv("HONE_NO_PACK");
    CHECKF(ok, "%s matmul rigs", tr->name);
    if (!ok) return;
    size_t ny = (size_t)N * (size_t)n;
    float *y1 = malloc(sizeof(float) * ny), *y2 = malloc(sizeof(float) * ny), *ys = malloc(sizeof(float) * ny);
    mm_time(&r1, n, N, 1, y1);
    mm_time(&r2, n, N, 1, y2);
    pool *p = be_cpu_pool(r2.b);
    const int S = 4000, reps = 12; /* 4 ms per chunk on worker 1 */
    pool_test_slow(p, 1, S);
    double dt = mm_time(&r2, n, N, reps, ys);
    long c0 = pool_test_chunks(p, 0), c1 = pool_test_chunks(p, 1);
    pool_test_slow(p, -1, 0);
    const char *what = no_pack ? "rows" : "packed";
    CHECKF(!memcmp(y1, y2, sizeof(float) * ny), "%s %s n=%d: 1 vs 2 threads differ", tr->name, what, n);
    CHECKF(!memcmp(y2, ys, sizeof(float) * ny), "%s %s n=%d: slowed vs unslowed differ", tr->name, what, n);
    /* every run splits into several chunks; the slowed worker takes a small share */
    CHECKF(c0 + c1 >= 4L * reps, "%s %s n=%d: %ld chunks in %d runs", tr->name, what, n, c0 + c1, reps);
    CHECKF(c1 * 4 < c0 + c1, "%s %s n=%d: the slowed worker took %ld of %ld chunks", tr->name, what, n, c1, c0 + c1);
    double bound = (double)(c0 + c1) / 2 * S * 1e-6;
    CHECKF(dt < bound, "%s %s n=%d: %.3f s with a slowed worker, static split at least %.3f s", tr->name, what,
           n, dt, bound);
    printf("%s %s n=%d: slowed worker %ld of %ld chunks, %.1f ms (static split >= %.1f ms)\n", tr->name, what, n, c1,
           c0 + c1, dt * 1e3, bound * 1e3);
    be_free(r1.b);
    be_free(r2.b);
    free(w);
    free(row);
    free(x);
    free(y1);
    free(y2);
    free(ys);
}

/* ---- model forwards ---- */

typedef struct {
    model *m;
    kv_cache *kv;
    kv_seq seq;
    int n_vocab;
} mrig;

static int mrig_open(mrig *r, const char *path, int threads) {
    hn_err e;
    memset(r, 0, sizeof *r);
    model_params p = {.n_threads = threads, .max_batch = 64};
    if (model_load(path, &p, &r->m, &e)) {
        fprintf(stderr, "load %s: %s\n", path, e.msg);
        return 0;
    }
    kv_config c = model_kv_config(r->m, 64, 16);
    if (kv_create(&c, &r->kv, &e) || kv_seq_init(&r->seq, r->kv, 256, &e)) {
        fprintf(stderr, "kv: %s\n", e.msg);
        return 0;
    }
    r->n_vocab = model_hp(r->m)->n_vocab;
    return 1;
}

static void mrig_close(mrig *r) {
    kv_seq_free(&r->seq, r->kv);
    kv_free(r->kv);
    model_free(r->m);
}

/* prefill of n tokens, then 4 decode steps; the logits of each forward's last token */
static hn_status run(mrig *r, const int32_t *tok, int n, float *out, hn_err *e) {
    kv_seq_truncate(r->kv, &r->seq, 0);
    int32_t pos[64], sid[64] = {0};
    for (int i = 0; i < n; i++) pos[i] = i;
    kv_seq *seqs[1] = {&r->seq};
    model_batch b = {.n_tokens = n, .token = tok, .pos = pos, .seq_id = sid, .seqs = seqs, .n_seqs = 1};
    hn_status st = model_forward(r->m, r->kv, &b, out, 1, e);
    for (int d = 0; d < 4 && st == HN_OK; d++) {
        int32_t p1 = n + d;
        model_batch b1 = {.n_tokens = 1, .token = tok + d, .pos = &p1, .seq_id = sid, .seqs = seqs, .n_seqs = 1};
        st = model_forward(r->m, r->kv, &b1, out + (size_t)(d + 1) * (size_t)r->n_vocab, 1, e);
    }
    return st;
}

static void test_model(const char *file) {
    char path[1024], rel[256];
    snprintf(rel, sizeof rel, "data/models/%s", file);
    mrig r1, r2;
    if (!mrig_open(&r1, test_data_path(path, sizeof path, rel), 1) ||
        !mrig_open(&r2, test_data_path(path, sizeof path, rel), 2)) {
        CHECKF(0, "open %s", file);
        return;
    }
    int V = r1.n_vocab, n = 40;
    int32_t tok[64];
    for (int i = 0; i < n; i++) tok[i] = (int32_t)((i * 7919 + 13) % V);
    size_t nl = (size_t)5 * (size_t)V;
    float *a = malloc(sizeof(float) * nl), *b = malloc(sizeof(float) * nl), *c = malloc(sizeof(float) * nl);
    hn_err e;
    CHECK(run(&r1, tok, n, a, &e) == HN_OK);
    CHECK(run(&r2, tok, n, b, &e) == HN_OK);
    pool *p = be_cpu_pool(model_backend(r2.m));
    const int S = 1000; /* 1 ms per chunk on worker 1 */
    pool_test_slow(p, 1, S);
    double t0 = now_s();
    CHECK(run(&r2, tok, n, c, &e) == HN_OK);
    double dt = now_s() - t0;
    long c0 = pool_test_chunks(p, 0), c1 = pool_test_chunks(p, 1);
    pool_test_slow(p, -1, 0);
    CHECKF(!memcmp(a, b, sizeof(float) * nl), "%s: 1 vs 2 threads differ", file);
    CHECKF(!memcmp(b, c, sizeof(float) * nl), "%s: slowed vs unslowed differ", file);
    CHECKF(c0 + c1 >= 100, "%s: %ld chunks taken in the pool's runs", file, c0 + c1);
    CHECKF(c1 * 4 < c0 + c1, "%s: the slowed worker took %ld of %ld chunks", file, c1, c0 + c1);
    double bound = (double)(c0 + c1) / 2 * S * 1e-6;
    CHECKF(dt < bound, "%s: %.3f s with a slowed worker, static split at least %.3f s", file, dt, bound);
    printf("%s: prefill %d + 4 decode steps: slowed worker %ld of %ld chunks, %.1f ms (static split >= %.1f ms)\n",
           file, n, c1, c0 + c1, dt * 1e3, bound * 1e3);
    free(a);
    free(b);
    free(c);
    mrig_close(&r1);
    mrig_close(&r2);
}

int main(void) {
    test_pool_job();
    test_matmul(QT_Q8_0, 1024, 1024, 1, 0);
    test_matmul(QT_Q8_0, 1024, 1024, 64, 0);
    test_matmul(QT_Q4_K, 1024, 1024, 1, 0);
    test_matmul(QT_Q4_K, 1024, 1024, 64, 1);
    test_model("qwen3-2k-q8_0.gguf");
    test_model("llama-2k-q4_k_m.gguf");
    TEST_DONE();
}
