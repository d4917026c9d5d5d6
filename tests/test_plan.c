/* test_plan.c: the step plan (sched/plan.h): KV slots, the dense block
 * table padded with -1, sequence lengths, wanted rows, the padding of decode
 * steps to graph sizes, plan_finish, and the errors (bad tokens, positions
 * that skip ahead, too many rows, over capacity, a full pool). */
#include <string.h>

#include "kv/kv.h"
#include "sched/plan.h"
#include "test.h"

static kv_cache *make_kv(int32_t n_blocks) {
    kv_config c = {.n_layer = 1, .n_head_kv = 1, .head_dim = 32, .block_size = 4, .n_blocks = n_blocks, .type = QT_F32};
    kv_cache *kv = NULL;
    hn_err e;
    CHECK(kv_create(&c, &kv, &e) == HN_OK);
    return kv;
}

int main(void) {
    hn_err e;
    step_plan p;
    CHECK(plan_init(&p, 16, 4, 8, &e) == HN_OK);
    CHECK(plan_init(&(step_plan){0}, 0, 4, 8, &e) == HN_ERR_INVALID);
    kv_cache *kv = make_kv(32);
    kv_seq s[3];
    for (int i = 0; i < 3; i++) CHECK(kv_seq_init(&s[i], kv, 64, &e) == HN_OK);
    kv_seq *sp[3] = {&s[0], &s[1], &s[2]};

    /* prefill: 6 tokens of sequence 0, 3 of sequence 1, interleaved; logits of the last of each */
    int32_t tok[9] = {5, 6, 7, 8, 9, 10, 11, 12, 13}, pos[9] = {0, 0, 1, 1, 2, 2, 3, 4, 5};
    int32_t sid[9] = {0, 1, 0, 1, 0, 1, 0, 0, 0};
    bool want[9] = {false, false, false, false, false, true, false, false, true};
    step_batch b = {.n_tokens = 9, .token = tok, .pos = pos, .seq_id = sid, .want_logits = want, .seqs = sp, .n_seqs = 2};
    CHECK(plan_build(&p, kv, &b, 100, 4, &e) == HN_OK);
    CHECK(p.n_tokens == 9 && p.n_pad == 9 && p.n_seqs == 2 && p.block_size == 4);
    CHECKF(p.bt_stride == 2 && s[0].n_blocks == 2 && s[1].n_blocks == 1, "blocks reserved: %d %d, stride %d",
           (int)s[0].n_blocks, (int)s[1].n_blocks, (int)p.bt_stride);
    CHECK(p.block_table[0] == s[0].blocks[0] && p.block_table[1] == s[0].blocks[1]);
    CHECK(p.block_table[2] == s[1].blocks[0] && p.block_table[3] == -1);
    int ok = 1;
    for (int i = 0; i < 9; i++) {
        const kv_seq *q = sp[sid[i]];
        ok &= p.token[i] == tok[i] && p.pos[i] == pos[i] && p.seq[i] == sid[i] &&
              p.slot[i] == q->blocks[pos[i] / 4] * 4 + pos[i] % 4;
    }
    CHECKF(ok, "tokens, positions, sequences and slots");
    CHECK(p.seq_len[0] == 6 && p.seq_len[1] == 3);
    CHECK(p.n_out == 2 && p.out_rows[0] == 5 && p.out_rows[1] == 8);
    /* the forward advances nothing; plan_finish does */
    CHECK(s[0].n_tokens == 0 && s[1].n_tokens == 0);
    plan_finish(&p);
    CHECK(s[0].n_tokens == 6 && s[1].n_tokens == 3);

    /* decode: one token per sequence, padded to a graph size; want_logits NULL = the last token only */
    int32_t dt[3] = {1, 2, 3}, dp[3] = {6, 3, 0}, ds[3] = {0, 1, 2};
    step_batch d = {.n_tokens = 3, .token = dt, .pos = dp, .seq_id = ds, .seqs = sp, .n_seqs = 3};
    CHECK(plan_build(&p, kv, &d, 100, 4, &e) == HN_OK);
    CHECKF(p.n_tokens == 3 && p.n_pad == 4, "decode of 3 padded to %d", (int)p.n_pad);
    CHECK(p.slot[3] == -1 && p.token[3] == 0 && p.pos[3] == 0 && p.seq[3] == 0);
    CHECK(p.n_out == 1 && p.out_rows[0] == 2);
    CHECK(p.seq_len[0] == 7 && p.seq_len[1] == 4 && p.seq_len[2] == 1);
    plan_finish(&p);
    CHECK(s[2].n_tokens == 1);
    /* a prefill chunk is never padded */
    int32_t ct[2] = {1, 2}, cp[2] = {7, 8}, cs[2] = {0, 0};
    step_batch c2 = {.n_tokens = 2, .token = ct, .pos = cp, .seq_id = cs, .seqs = sp, .n_seqs = 1};
    CHECK(plan_build(&p, kv, &c2, 100, 4, &e) == HN_OK && p.n_pad == 2);
    CHECK(plan_pad_size(1, 16) == 1 && plan_pad_size(5, 16) == 8 && plan_pad_size(9, 12) == 12 && plan_pad_size(16, 16) == 16);

    /* errors */
    int32_t bt[1] = {100}, bp[1] = {0}, bs[1] = {2};
    step_batch bad = {.n_tokens = 1, .token = bt, .pos = bp, .seq_id = bs, .seqs = sp, .n_seqs = 3};
    CHECK(plan_build(&p, kv, &bad, 100, 4, &e) == HN_ERR_INVALID && strstr(e.msg, "token id"));
    bt[0] = 1;
    bp[0] = 5; /* sequence 2 holds 1 position */
    CHECK(plan_build(&p, kv, &bad, 100, 4, &e) == HN_ERR_INVALID && strstr(e.msg, "position"));
    bp[0] = 1;
    bs[0] = 3;
    CHECK(plan_build(&p, kv, &bad, 100, 4, &e) == HN_ERR_INVALID);
    bs[0] = 2;
    CHECK(plan_build(&p, kv, &bad, 100, 0, &e) == HN_ERR_INVALID && strstr(e.msg, "logits"));
    static int32_t many[17];
    step_batch big = {.n_tokens = 17, .token = many, .pos = many, .seq_id = many, .seqs = sp, .n_seqs = 1};
    CHECK(plan_build(&p, kv, &big, 100, 4, &e) == HN_ERR_RANGE);
    /* a sequence longer than the plan's block table */
    kv_seq lng;
    CHECK(kv_seq_init(&lng, kv, 64, &e) == HN_OK);
    int32_t lt[16], lp[16], ls[16] = {0};
    for (int i = 0; i < 16; i++) lt[i] = 1, lp[i] = i;
    kv_seq *lsp[1] = {&lng};
    step_batch lb = {.n_tokens = 16, .token = lt, .pos = lp, .seq_id = ls, .seqs = lsp, .n_seqs = 1};
    CHECK(plan_build(&p, kv, &lb, 100, 4, &e) == HN_OK); /* 4 blocks */
    plan_finish(&p);
    for (int r = 0; r < 2; r++) {
        for (int i = 0; i < 16; i++) lp[i] = 16 * (r + 1) + i;
        hn_status st = plan_build(&p, kv, &lb, 100, 4, &e);
        if (r == 0) {
            CHECK(st == HN_OK);
            plan_finish(&p);
        } else {
            CHECKF(st == HN_ERR_RANGE, "12 blocks in a plan of 8: %d (%s)", (int)st, e.msg);
        }
    }
    /* the pool runs out: HN_ERR_FULL */
    kv_cache *small = make_kv(2);
    kv_seq q;
    CHECK(kv_seq_init(&q, small, 64, &e) == HN_OK);
    kv_seq *qp[1] = {&q};
    step_batch fb = {.n_tokens = 12, .token = lt, .pos = lp, .seq_id = ls, .seqs = qp, .n_seqs = 1};
    for (int i = 0; i < 12; i++) lp[i] = i;
    CHECK(plan_build(&p, small, &fb, 100, 4, &e) == HN_ERR_FULL);
    kv_seq_free(&q, small);
    kv_free(small);
    kv_seq_free(&lng, kv);
    for (int i = 0; i < 3; i++) kv_seq_free(&s[i], kv);
    kv_free(kv);
    plan_free(&p);
    TEST_DONE();
}
