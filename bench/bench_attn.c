/* bench_attn.c: attention over the paged KV cache by block size and KV type,
 * to pick the default block size: decode (one query per sequence, S
 * sequences) and a prefill chunk, at a few context lengths, on the
 * Qwen3-0.6B attention shape (16 query heads, 8 KV heads of 128).
 * usage: bench/run_attn.sh [threads] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/cpu_int.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "kv/kv.h"
#include "sched/plan.h"

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    enum { H = 16, HKV = 8, HD = 128, NSEQ = 4, CHUNK = 128 };
    static const int sizes[] = {16, 32, 64, 128};
    static const int ctxs[] = {1024, 4096};
    static const struct { qt_type k, v; const char *name; } types[] = {
        {QT_F32, QT_F32, "f32"}, {QT_Q8_0, QT_Q8_0, "q8_0"}, {QT_Q8_0, QT_Q4_1, "k8v4"}};
    hn_err e;
    pool *p;
    be_backend *be;
    if (pool_create(threads, &p, &e) || be_cpu_create(p, &be, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    be_limits lim = {.max_rows = CHUNK, .max_k = H * HD, .max_head_dim = HD, .max_group = H / HKV};
    if (be->ops->reserve(be, &lim, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    float *q = malloc(sizeof(float) * CHUNK * H * HD), *out = malloc(sizeof(float) * CHUNK * H * HD);
    float *row = malloc(sizeof(float) * HKV * HD);
    step_plan plan;
    if (plan_init(&plan, CHUNK, NSEQ, (4096 + CHUNK) / 16 + 1, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    be_tensor Q = be_cpu_host(QT_F32, q), O = be_cpu_host(QT_F32, out);
    for (int i = 0; i < CHUNK * H * HD; i++) q[i] = sinf((float)i * 0.37f);
    printf("%-5s %5s %6s  %12s  %14s  %s\n", "kv", "block", "ctx", "decode x4 ms", "prefill128 ms", "mean waste/seq");
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (size_t ci = 0; ci < sizeof ctxs / sizeof ctxs[0]; ci++)
            for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
                int bs = sizes[si], ctx = ctxs[ci];
                kv_config c = {.n_layer = 1, .n_head_kv = HKV, .head_dim = HD, .block_size = bs,
                               .n_blocks = NSEQ * (ctx / bs + 2), .type = types[ti].k, .v_type = types[ti].v};
                kv_cache *kv;
                if (kv_create(&c, &kv, &e)) {
                    fprintf(stderr, "%s\n", e.msg);
                    return 1;
                }
                kv_seq s[NSEQ];
                kv_seq *sp[NSEQ];
                int32_t pos[CHUNK], sid[CHUNK], tok[CHUNK] = {0};
                for (int j = 0; j < NSEQ; j++) {
                    kv_seq_init(&s[j], kv, ctx + CHUNK, &e);
                    kv_seq_reserve(kv, &s[j], ctx, &e);
                    for (int t = 0; t < ctx; t++) {
                        for (int i = 0; i < HKV * HD; i++) row[i] = cosf((float)(i + t * 3 + j) * 0.11f);
                        int32_t slot = s[j].blocks[t / bs] * bs + t % bs;
                        cpu_kv_store_rows(cpu_of(be), kv, 0, 1, row, row, &slot);
                    }
                    s[j].n_tokens = ctx;
                }
                /* decode: one query per sequence at its last position */
                for (int j = 0; j < NSEQ; j++) {
                    sp[j] = &s[j];
                    pos[j] = ctx - 1;
                    sid[j] = j;
                }
                step_batch sb = {.n_tokens = NSEQ, .token = tok, .pos = pos, .seq_id = sid, .seqs = sp, .n_seqs = NSEQ};
                if (plan_build(&plan, kv, &sb, 1, 1, &e)) {
                    fprintf(stderr, "%s\n", e.msg);
                    return 1;
                }
                be->ops->plan_set(be, &plan);
                be_attn_args a = {.q = &Q, .out = &O, .n_tokens = NSEQ, .n_head = H, .n_head_kv = HKV, .head_dim = HD,
                                  .scale = 1.0f / sqrtf(HD), .kv = kv, .layer = 0};
                double best_d = 1e30, best_p = 1e30;
                for (int r = 0; r < 5; r++) {
                    double t0 = hn_now_ms();
                    be->ops->attention(be, &a);
                    be->ops->sync(be, &e);
                    double t1 = hn_now_ms() - t0;
                    if (t1 < best_d) best_d = t1;
                }
                /* prefill: the last CHUNK positions of one sequence */
                for (int t = 0; t < CHUNK; t++) {
                    sid[t] = 0;
                    pos[t] = ctx - CHUNK + t;
                }
                sb = (step_batch){.n_tokens = CHUNK, .token = tok, .pos = pos, .seq_id = sid, .seqs = sp, .n_seqs = 1};
                if (plan_build(&plan, kv, &sb, 1, 1, &e)) {
                    fprintf(stderr, "%s\n", e.msg);
                    return 1;
                }
                be->ops->plan_set(be, &plan);
                a.n_tokens = CHUNK;
                for (int r = 0; r < 3; r++) {
                    double t0 = hn_now_ms();
                    be->ops->attention(be, &a);
                    be->ops->sync(be, &e);
                    double t1 = hn_now_ms() - t0;
                    if (t1 < best_p) best_p = t1;
                }
                printf("%-5s %5d %6d  %12.3f  %14.2f  %.1f KiB/layer\n", types[ti].name, bs, ctx, best_d, best_p,
                       (double)bs / 2 * (double)(kv->k_row_bytes + kv->v_row_bytes) / 1024.0);
                for (int j = 0; j < NSEQ; j++) kv_seq_free(&s[j], kv);
                kv_free(kv);
            }
    plan_free(&plan);
    be_free(be);
    pool_free(p);
    free(q);
    free(out);
    free(row);
    return 0;
}
