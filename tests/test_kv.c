/* test_kv.c: the paged KV cache: block pool and free list, block tables that
 * grow and truncate, the location math (positions map to distinct, in-bounds
 * rows; K and V never overlap), exhaustion and bad configs. */
#include <stdint.h>

#include "kv/kv.h"
#include "test.h"

int main(void) {
    hn_err e;
    kv_cache *kv;
    kv_config bad = {.n_layer = 2, .n_head_kv = 2, .head_dim = 8, .block_size = 4, .n_blocks = 8, .type = QT_F16};
    CHECK(kv_create(&bad, &kv, &e) == HN_ERR_UNSUPPORTED && kv == NULL);
    bad.type = QT_F32;
    bad.n_blocks = 0;
    CHECK(kv_create(&bad, &kv, &e) == HN_ERR_INVALID);

    kv_config c = {.n_layer = 3, .n_head_kv = 2, .head_dim = 8, .block_size = 4, .n_blocks = 6, .type = QT_F32};
    CHECK(kv_create(&c, &kv, &e) == HN_OK);
    CHECK(kv_block_bytes(&c) == 3 * 2 * 4 * 16 * 4);
    CHECK(kv_n_free(kv) == 6);
    kv_seq a, b;
    CHECK(kv_seq_init(&a, kv, 16, &e) == HN_OK && a.cap_blocks == 4);
    CHECK(kv_seq_init(&b, kv, 100, &e) == HN_OK);
    CHECK(kv_seq_reserve(kv, &a, 5, &e) == HN_OK && a.n_blocks == 2 && kv_n_free(kv) == 4);
    CHECK(kv_seq_reserve(kv, &a, 8, &e) == HN_OK && a.n_blocks == 2);
    CHECK(kv_seq_reserve(kv, &a, 17, &e) == HN_ERR_RANGE);
    CHECK(kv_seq_reserve(kv, &b, 16, &e) == HN_OK && kv_n_free(kv) == 0);
    CHECK(kv_seq_reserve(kv, &b, 17, &e) == HN_ERR_FULL);
    CHECK(kv_block_alloc(kv) == -1);

    /* every (seq, layer, pos) K and V row is distinct and inside the pool */
    kv_seq *seqs[2] = {&a, &b};
    int lim[2] = {8, 16}, ok = 1;
    for (int s = 0; s < 2; s++)
        for (int l = 0; l < 3; l++)
            for (int p = 0; p < lim[s]; p++) {
                float *k = kv_k(kv, seqs[s], l, p), *v = kv_v(kv, seqs[s], l, p);
                for (int i = 0; i < 16; i++) {
                    k[i] = (float)(s * 100000 + l * 1000 + p * 10) + 0.5f;
                    v[i] = -(float)(s * 100000 + l * 1000 + p * 10) - 0.5f;
                }
                ok &= (unsigned char *)k >= kv->base && (unsigned char *)(v + 16) <= kv->base + kv->base_bytes;
            }
    for (int s = 0; s < 2; s++)
        for (int l = 0; l < 3; l++)
            for (int p = 0; p < lim[s]; p++) {
                float want = (float)(s * 100000 + l * 1000 + p * 10) + 0.5f;
                ok &= kv_k(kv, seqs[s], l, p)[15] == want && kv_v(kv, seqs[s], l, p)[0] == -want;
            }
    CHECKF(ok, "rows are distinct and in bounds");

    /* truncate gives blocks back; reserve takes them again */
    a.n_tokens = 8;
    kv_seq_truncate(kv, &a, 3);
    CHECK(a.n_blocks == 1 && a.n_tokens == 3 && kv_n_free(kv) == 1);
    kv_seq_truncate(kv, &b, 0);
    CHECK(b.n_blocks == 0 && kv_n_free(kv) == 5);
    CHECK(kv_seq_reserve(kv, &b, 20, &e) == HN_OK && kv_n_free(kv) == 0);
    kv_seq_free(&a, kv);
    kv_seq_free(&b, kv);
    CHECK(kv_n_free(kv) == 6);
    kv_free(kv);
    TEST_DONE();
}
