/* test_kv.c: the paged KV cache: block pool and block tables, the location
 * math (positions map to distinct rows inside mapped slabs), element types,
 * slabs mapped on demand and unmapped when empty (hn_alloc_bytes and RSS
 * fall), the prefix cache (chained hashes, sharing, refcounts, LRU eviction
 * tail first, duplicates, truncation), and a random stress run that checks
 * every invariant after each operation. */
#include <math.h>
#include <stdint.h>
#include <unistd.h>

#include "backend/cpu/cpu_int.h"
#include "core/alloc.h"
#include "core/pool.h"
#include "kv/kv.h"
#include "quant/quant.h"
#include "test.h"

static hn_err e;

static long rss_pages(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long size = 0, res = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &size, &res) != 2) res = 0;
        fclose(f);
    }
    return res;
}

static int check(const kv_cache *kv, const kv_seq *const *seqs, int n) {
    hn_status st = kv_check(kv, seqs, n, &e);
    if (st) fprintf(stderr, "kv_check: %s\n", e.msg);
    return st == HN_OK;
}

static void test_basics(void) {
    kv_cache *kv;
    kv_config bad = {.n_layer = 2, .n_head_kv = 2, .head_dim = 8, .block_size = 4, .n_blocks = 8, .type = QT_Q4_K};
    CHECK(kv_create(&bad, &kv, &e) == HN_ERR_UNSUPPORTED && kv == NULL);
    bad.type = QT_Q8_0; /* head_dim 8 is not a multiple of 32 */
    CHECK(kv_create(&bad, &kv, &e) == HN_ERR_UNSUPPORTED);
    bad.type = QT_F32;
    bad.v_type = QT_Q4_K;
    CHECK(kv_create(&bad, &kv, &e) == HN_ERR_UNSUPPORTED);
    bad.v_type = QT_F32;
    bad.n_blocks = 0;
    CHECK(kv_create(&bad, &kv, &e) == HN_ERR_INVALID);

    kv_config c = {.n_layer = 3, .n_head_kv = 2, .head_dim = 8, .block_size = 4, .n_blocks = 6, .type = QT_F32,
                   .slab_blocks = 4};
    CHECK(kv_create(&c, &kv, &e) == HN_OK);
    CHECK(kv_block_bytes(&c) == 3 * 2 * 4 * 16 * 4);
    CHECK(kv_n_free(kv) == 6);
    kv_stats ks;
    kv_get_stats(kv, &ks);
    CHECK(ks.bytes == 0 && ks.slabs_mapped == 0); /* nothing mapped before use */
    kv_seq a, b;
    CHECK(kv_seq_init(&a, kv, 16, &e) == HN_OK && a.cap_blocks == 4);
    CHECK(kv_seq_init(&b, kv, 100, &e) == HN_OK);
    CHECK(kv_seq_reserve(kv, &a, 5, &e) == HN_OK && a.n_blocks == 2 && kv_n_free(kv) == 4);
    kv_get_stats(kv, &ks);
    CHECK(ks.slabs_mapped == 1 && ks.blocks_backed == 4 && ks.bytes == 4 * kv->block_bytes);
    CHECK(kv_seq_reserve(kv, &a, 8, &e) == HN_OK && a.n_blocks == 2);
    CHECK(kv_seq_reserve(kv, &a, 17, &e) == HN_ERR_RANGE);
    CHECK(kv_seq_reserve(kv, &b, 16, &e) == HN_OK && kv_n_free(kv) == 0);
    kv_get_stats(kv, &ks);
    CHECK(ks.slabs_mapped == 2 && ks.blocks_backed == 6); /* the last slab holds 2 */
    CHECK(kv_seq_reserve(kv, &b, 17, &e) == HN_ERR_FULL);
    CHECK(kv_block_alloc(kv) == -1);
    const kv_seq *all[2] = {&a, &b};
    CHECK(check(kv, all, 2));

    /* every (seq, layer, pos) K and V row is distinct and inside a mapped slab */
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
                int in = 0;
                for (int sl = 0; sl < kv->n_slabs; sl++) {
                    unsigned char *lo = kv->slab[sl];
                    size_t n = (size_t)(sl == kv->n_slabs - 1 ? 2 : 4) * kv->block_bytes;
                    in |= lo && (unsigned char *)k >= lo && (unsigned char *)(v + 16) <= lo + n &&
                          (unsigned char *)(k + 16) <= lo + n;
                }
                ok &= in;
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
    CHECK(check(kv, all, 2));
    CHECK(kv_seq_reserve(kv, &b, 20, &e) == HN_OK && kv_n_free(kv) == 0);
    kv_seq_free(&a, kv);
    kv_seq_free(&b, kv);
    CHECK(kv_n_free(kv) == 6);
    kv_get_stats(kv, &ks);
    CHECK(ks.blocks_used == 0 && ks.slabs_mapped <= 1); /* one empty slab kept as a spare */
    kv_trim(kv, 0);
    kv_get_stats(kv, &ks);
    CHECK(ks.slabs_mapped == 0 && ks.bytes == 0 && ks.peak_bytes == 6 * kv->block_bytes);
    CHECK(check(kv, NULL, 0));
    kv_free(kv);
}

/* Rows stored in each element type read back within that type's error
 * (stored and read through the CPU backend's K/V conversions, the one place
 * that converts, at the kv_block_* addresses). */
static void test_types(void) {
    pool *pl = NULL;
    be_backend *b = NULL;
    if (pool_create(1, &pl, &e) != HN_OK || be_cpu_create(pl, &b, &e) != HN_OK) {
        CHECKF(0, "cpu backend: %s", e.msg);
        pool_free(pl);
        return;
    }
    const cpu_be *cb = cpu_of(b);
    struct {
        qt_type k, v;
        float tol_k, tol_v; /* relative to max |x| */
    } cases[] = {
        {QT_F32, QT_F32, 0, 0},          {QT_F16, QT_F16, 1e-3f, 1e-3f},
        {QT_Q8_0, QT_Q8_0, 1e-2f, 1e-2f}, {QT_Q8_0, QT_Q4_0, 1e-2f, 0.15f},
        {QT_Q8_0, QT_Q4_1, 1e-2f, 0.1f},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        kv_config c = {.n_layer = 2, .n_head_kv = 2, .head_dim = 64, .block_size = 8, .n_blocks = 4,
                       .type = cases[ci].k, .v_type = cases[ci].v};
        kv_cache *kv;
        if (kv_create(&c, &kv, &e) != HN_OK) {
            CHECKF(0, "create %s/%s: %s", qt_name(c.type), qt_name(c.v_type), e.msg);
            continue;
        }
        kv_seq s;
        kv_seq_init(&s, kv, 32, &e);
        kv_seq_reserve(kv, &s, 20, &e);
        float k[128], v[128], out[128];
        float errk = 0, errv = 0;
        for (int layer = 0; layer < 2; layer++)
            for (int p = 0; p < 20; p++) {
                for (int i = 0; i < 128; i++) {
                    k[i] = sinf((float)(i * 7 + p * 13 + layer)) * 3.0f;
                    v[i] = cosf((float)(i * 5 + p * 11 + layer)) * 2.0f;
                }
                int32_t slot = s.blocks[p / kv->cfg.block_size] * kv->cfg.block_size + p % kv->cfg.block_size;
                cpu_kv_store_rows(cb, kv, layer, 1, k, v, &slot);
            }
        for (int layer = 0; layer < 2; layer++)
            for (int p = 0; p < 20; p++) {
                int bs = kv->cfg.block_size;
                for (int h = 0; h < 2; h++) {
                    const unsigned char *kr = kv_block_kraw(kv, s.blocks[p / bs], layer) +
                                              (size_t)(p % bs) * kv->k_row_bytes + (size_t)h * kv->k_head_bytes;
                    const unsigned char *vr = kv_block_vraw(kv, s.blocks[p / bs], layer) +
                                              (size_t)(p % bs) * kv->v_row_bytes + (size_t)h * kv->v_head_bytes;
                    cpu_kv_rows_to_f32(kv->cfg.type, kv->cfg.head_dim, kr, kv->k_row_bytes, 1, out);
                    for (int i = 0; i < 64; i++) {
                        float want = sinf((float)((h * 64 + i) * 7 + p * 13 + layer)) * 3.0f;
                        if (fabsf(out[i] - want) / 3.0f > errk) errk = fabsf(out[i] - want) / 3.0f;
                    }
                    cpu_kv_rows_to_f32(kv->cfg.v_type, kv->cfg.head_dim, vr, kv->v_row_bytes, 1, out);
                    for (int i = 0; i < 64; i++) {
                        float want = cosf((float)((h * 64 + i) * 5 + p * 11 + layer)) * 2.0f;
                        if (fabsf(out[i] - want) / 2.0f > errv) errv = fabsf(out[i] - want) / 2.0f;
                    }
                }
            }
        CHECKF(errk <= cases[ci].tol_k && errv <= cases[ci].tol_v, "%s/%s: K error %g, V error %g",
               qt_name(c.type), qt_name(c.v_type), errk, errv);
        kv_seq_free(&s, kv);
        kv_free(kv);
    }
    be_free(b);
    pool_free(pl);
}

/* Slabs come from the OS and go back: hn_alloc_bytes and RSS fall. */
static void test_slab_shrink(void) {
    /* 1 MiB blocks, 4 per slab, up to 64 blocks */
    kv_config c = {.n_layer = 4, .n_head_kv = 4, .head_dim = 64, .block_size = 128, .n_blocks = 64, .type = QT_F32,
                   .slab_blocks = 4};
    kv_cache *kv;
    CHECK(kv_create(&c, &kv, &e) == HN_OK);
    CHECK(kv->block_bytes == (size_t)1 << 20);
    size_t a0 = hn_alloc_bytes();
    long r0 = rss_pages();
    kv_seq s[4];
    for (int i = 0; i < 4; i++) {
        kv_seq_init(&s[i], kv, 128 * 16, &e);
        CHECK(kv_seq_reserve(kv, &s[i], 128 * 12, &e) == HN_OK);
        for (int b = 0; b < s[i].n_blocks; b++) memset(kv_block_ptr(kv, s[i].blocks[b]), 1, kv->block_bytes);
    }
    size_t a1 = hn_alloc_bytes();
    long r1 = rss_pages();
    long page = sysconf(_SC_PAGESIZE);
    CHECKF(a1 - a0 >= (size_t)48 << 20, "48 MiB mapped: %zu", a1 - a0);
    CHECKF((r1 - r0) * page >= 40L << 20, "RSS grew by %ld KiB", (r1 - r0) * page / 1024);
    /* two sequences end: their slabs go back (blocks were packed into low slabs) */
    kv_seq_free(&s[2], kv);
    kv_seq_free(&s[3], kv);
    const kv_seq *live[2] = {&s[0], &s[1]};
    CHECK(check(kv, live, 2));
    size_t a2 = hn_alloc_bytes();
    CHECKF(a1 - a2 >= (size_t)20 << 20, "freed %zu bytes after two of four sequences", a1 - a2);
    kv_seq_free(&s[0], kv);
    kv_seq_free(&s[1], kv);
    size_t a3 = hn_alloc_bytes();
    long r3 = rss_pages();
    kv_stats ks;
    kv_get_stats(kv, &ks);
    CHECKF(a3 - a0 == ks.bytes + ks.meta_bytes && ks.bytes <= (size_t)4 << 20,
           "at most one spare slab left: %zu bytes, the allocator %zu beside the metadata's %zu", ks.bytes, a3 - a0,
           ks.meta_bytes);
    CHECKF((r1 - r3) * page >= 40L << 20, "RSS fell by %ld KiB", (r1 - r3) * page / 1024);
    kv_trim(kv, 0);
    CHECK(hn_alloc_bytes() == a0);
    for (int i = 0; i < 4; i++) kv_seq_free(&s[i], kv);
    kv_free(kv);
}

static void fill_tokens(int32_t *t, int n, int seed) {
    for (int i = 0; i < n; i++) t[i] = (int32_t)((i * 131 + seed * 7919) % 1000);
}

static void test_prefix(void) {
    kv_config c = {.n_layer = 1, .n_head_kv = 1, .head_dim = 32, .block_size = 4, .n_blocks = 12, .type = QT_F32,
                   .slab_blocks = 3};
    kv_cache *kv;
    CHECK(kv_create(&c, &kv, &e) == HN_OK);
    int32_t ta[32], tb[32];
    fill_tokens(ta, 32, 1);
    memcpy(tb, ta, sizeof tb);
    tb[13] = 999; /* b shares a's first 3 blocks (12 tokens), differs in block 3 */
    kv_seq a, b, x;
    kv_seq_init(&a, kv, 32, &e);
    kv_seq_init(&b, kv, 32, &e);
    kv_seq_init(&x, kv, 32, &e);
    CHECK(kv_seq_match(kv, &a, ta, 18) == 0); /* nothing cached yet */
    CHECK(kv_seq_reserve(kv, &a, 18, &e) == HN_OK);
    a.n_tokens = 18;
    kv_seq_commit(kv, &a, ta, 18);
    CHECK(a.n_hashed == 4);
    kv_stats ks;
    kv_get_stats(kv, &ks);
    CHECK(ks.blocks_used == 5 && ks.blocks_cached == 0);
    /* b reuses a's first three blocks (same ids, refcount 2), not the fourth */
    CHECK(kv_seq_match(kv, &b, tb, 20) == 12);
    CHECK(b.n_tokens == 12 && b.n_hashed == 3 && b.blocks[0] == a.blocks[0] && b.blocks[2] == a.blocks[2]);
    CHECK(kv->ref[a.blocks[0]] == 2 && kv->ref[a.blocks[3]] == 1);
    const kv_seq *ab[3] = {&a, &b, &x};
    CHECK(check(kv, ab, 2));
    /* n_max bounds the match: a prompt of exactly 12 tokens reuses 8 (the last token is recomputed) */
    CHECK(kv_seq_match(kv, &x, ta, 11) == 8);
    kv_seq_truncate(kv, &x, 0);
    CHECK(x.n_tokens == 0 && x.n_hashed == 0 && x.n_blocks == 0);
    /* a ends: its unshared blocks become cached, shared ones stay used by b */
    kv_seq_truncate(kv, &a, 0);
    kv_get_stats(kv, &ks);
    CHECK(ks.blocks_used == 3 && ks.blocks_cached == 1 && kv_n_free(kv) == 9);
    CHECK(check(kv, ab, 3));
    /* a's whole prefix comes back from the cache */
    CHECK(kv_seq_match(kv, &x, ta, 32) == 16);
    kv_get_stats(kv, &ks);
    CHECK(ks.blocks_cached == 0 && ks.hit_blocks == 3 + 2 + 4);
    kv_seq_truncate(kv, &x, 0);
    /* b computes its own block 3 and a 5th; after b ends, 5 blocks are cached */
    CHECK(kv_seq_reserve(kv, &b, 20, &e) == HN_OK);
    b.n_tokens = 20;
    kv_seq_commit(kv, &b, tb, 20);
    CHECK(b.n_hashed == 5);
    kv_seq_truncate(kv, &b, 0);
    kv_get_stats(kv, &ks);
    CHECK(ks.blocks_used == 0 && ks.blocks_cached == 6);
    CHECK(check(kv, ab, 3));
    /* eviction: fill the pool; the tails (released first) go before the shared head */
    kv_seq big;
    kv_seq_init(&big, kv, 64, &e);
    CHECK(kv_seq_reserve(kv, &big, 4 * 8, &e) == HN_OK); /* 6 free + 2 evicted */
    kv_get_stats(kv, &ks);
    CHECK(ks.blocks_cached == 4 && ks.evictions == 2);
    CHECK(kv_seq_match(kv, &x, tb, 32) == 16); /* a's tail and b's last block went first; b's head survived */
    kv_seq_truncate(kv, &x, 0);
    const kv_seq *bx[2] = {&big, &x};
    CHECK(check(kv, bx, 2));
    kv_seq_free(&big, kv);
    /* a duplicate computed by two sequences at once keeps one published copy */
    kv_trim(kv, 0);
    kv_seq p, q;
    kv_seq_init(&p, kv, 32, &e);
    kv_seq_init(&q, kv, 32, &e);
    kv_seq_reserve(kv, &p, 8, &e);
    kv_seq_reserve(kv, &q, 8, &e);
    p.n_tokens = q.n_tokens = 8;
    kv_seq_commit(kv, &p, ta, 8);
    kv_seq_commit(kv, &q, ta, 8);
    CHECK(p.blocks[0] == q.blocks[0] && p.blocks[1] == q.blocks[1] && kv->ref[p.blocks[0]] == 2);
    kv_get_stats(kv, &ks);
    CHECK(ks.blocks_used == 2);
    /* truncating into a published block drops the whole block */
    kv_seq_truncate(kv, &q, 6);
    CHECK(q.n_tokens == 4 && q.n_blocks == 1 && q.n_hashed == 1);
    const kv_seq *pq[2] = {&p, &q};
    CHECK(check(kv, pq, 2));
    /* next_hash: the hash of the next full block, 0 when not at a boundary */
    CHECK(kv_seq_next_hash(kv, &q, ta, 8) != 0 && kv_seq_next_hash(kv, &q, ta, 7) == 0);
    kv_seq_free(&p, kv);
    kv_seq_free(&q, kv);
    kv_seq_free(&a, kv);
    kv_seq_free(&b, kv);
    kv_seq_free(&x, kv);
    kv_get_stats(kv, &ks);
    CHECK(ks.blocks_used == 0);
    CHECK(check(kv, NULL, 0));
    kv_free(kv);
}

/* When the OS refuses a new slab, allocation falls back to evicting cached
 * blocks, then reports the pool full; nothing is left half done. Blocks are
 * one mapping granule each (1 KiB per layer), so a new slab needs new
 * memory (smaller slabs would share a granule with the mapped one). */
/* Namespaces (kv_seq.ns): a sequence of another namespace never matches a
 * block published under this one, even for identical tokens (no shared KV,
 * no cached_tokens to time), while the same namespace still does; each
 * namespace publishes its own copy; namespace 0 is the shared default. */
static void test_prefix_ns(void) {
    kv_config c = {.n_layer = 1, .n_head_kv = 1, .head_dim = 32, .block_size = 4, .n_blocks = 16, .type = QT_F32,
                   .slab_blocks = 4};
    kv_cache *kv;
    CHECK(kv_create(&c, &kv, &e) == HN_OK);
    int32_t t[16];
    fill_tokens(t, 16, 3);
    kv_seq a, b, a2, z, z2;
    kv_seq_init(&a, kv, 16, &e);
    kv_seq_init(&b, kv, 16, &e);
    kv_seq_init(&a2, kv, 16, &e);
    kv_seq_init(&z, kv, 16, &e);
    kv_seq_init(&z2, kv, 16, &e);
    CHECK(a.ns == 0); /* kv_seq_init: the shared namespace */
    a.ns = a2.ns = 1;
    b.ns = 2;
    CHECK(kv_seq_reserve(kv, &a, 12, &e) == HN_OK);
    a.n_tokens = 12;
    kv_seq_commit(kv, &a, t, 12);
    CHECK(a.n_hashed == 3);
    CHECK(kv_seq_match(kv, &b, t, 16) == 0);  /* another namespace: nothing */
    CHECK(kv_seq_match(kv, &z, t, 16) == 0);  /* nor the shared one */
    CHECK(kv_seq_next_hash(kv, &b, t, 16) != kv_seq_next_hash(kv, &a2, t, 16));
    CHECK(kv_seq_match(kv, &a2, t, 16) == 12); /* the same namespace: all of it */
    CHECK(a2.blocks[0] == a.blocks[0]);
    /* b computes and publishes its own copy; both stay findable, each in its namespace */
    CHECK(kv_seq_reserve(kv, &b, 12, &e) == HN_OK);
    b.n_tokens = 12;
    kv_seq_commit(kv, &b, t, 12);
    CHECK(b.n_hashed == 3 && b.blocks[0] != a.blocks[0]);
    kv_seq_truncate(kv, &a, 0);
    kv_seq_truncate(kv, &a2, 0);
    kv_seq_truncate(kv, &b, 0);
    kv_stats ks;
    kv_get_stats(kv, &ks);
    CHECK(ks.blocks_cached == 6);
    kv_seq b2;
    kv_seq_init(&b2, kv, 16, &e);
    b2.ns = 2;
    CHECK(kv_seq_match(kv, &b2, t, 16) == 12 && b2.blocks[0] != a.blocks[0]);
    CHECK(kv_seq_match(kv, &z, t, 16) == 0);
    /* namespace 0 shares among itself as before */
    CHECK(kv_seq_reserve(kv, &z, 8, &e) == HN_OK);
    z.n_tokens = 8;
    kv_seq_commit(kv, &z, t, 8);
    CHECK(kv_seq_match(kv, &z2, t, 16) == 8 && z2.blocks[1] == z.blocks[1]);
    const kv_seq *all[3] = {&b2, &z, &z2};
    CHECK(check(kv, all, 3));
    kv_seq_free(&a, kv);
    kv_seq_free(&a2, kv);
    kv_seq_free(&b, kv);
    kv_seq_free(&b2, kv);
    kv_seq_free(&z, kv);
    kv_seq_free(&z2, kv);
    kv_free(kv);
}

static void test_map_failure(void) {
    size_t gran = kv_host_storage()->granule;
    kv_config c = {.n_layer = gran > 1024 ? (int)(gran / 1024) : 1, .n_head_kv = 1, .head_dim = 32, .block_size = 4,
                   .n_blocks = 8, .type = QT_F32, .slab_blocks = 2};
    kv_cache *kv;
    CHECK(kv_create(&c, &kv, &e) == HN_OK);
    int32_t t[16];
    fill_tokens(t, 16, 3);
    kv_seq a, b;
    kv_seq_init(&a, kv, 16, &e);
    kv_seq_init(&b, kv, 16, &e);
    CHECK(kv_seq_reserve(kv, &a, 8, &e) == HN_OK);
    a.n_tokens = 8;
    kv_seq_commit(kv, &a, t, 8);
    kv_seq_truncate(kv, &a, 0); /* 2 cached blocks in the one mapped slab */
    hn_alloc_fail_after(0);
    hn_status st = kv_seq_reserve(kv, &b, 12, &e);
    hn_alloc_fail_after(-1);
    kv_stats ks;
    kv_get_stats(kv, &ks);
    CHECKF(st == HN_ERR_FULL && b.n_blocks == 2 && ks.evictions == 2 && ks.slabs_mapped == 1,
           "slab mapping failed: %d, %d blocks taken by eviction", (int)st, (int)b.n_blocks);
    const kv_seq *ab[2] = {&a, &b};
    CHECK(check(kv, ab, 2));
    CHECK(kv_seq_reserve(kv, &b, 12, &e) == HN_OK && b.n_blocks == 3); /* maps again once memory is back */
    CHECK(check(kv, ab, 2));
    kv_seq_free(&a, kv);
    kv_seq_free(&b, kv);
    kv_free(kv);
}

/* The block metadata (refcounts, hashes, each block's tokens, the hash
 * table) follows the backed slabs, not the cap: a pool whose cap is 2^18
 * blocks and which backs a few dozen holds metadata for those few (the
 * allocator's counters), and kv_trim gives it back. */
static void test_meta_sized(void) {
    kv_config c = {.n_layer = 1, .n_head_kv = 1, .head_dim = 32, .block_size = 4, .n_blocks = 1 << 18, .type = QT_F32,
                   .slab_blocks = 16};
    const size_t a0 = hn_alloc_bytes();
    kv_cache *kv;
    CHECK(kv_create(&c, &kv, &e) == HN_OK);
    if (!kv) return;
    kv_seq s;
    CHECK(kv_seq_init(&s, kv, 4 * 100, &e) == HN_OK);
    const size_t a1 = hn_alloc_bytes();
    /* at create: the cache, its per-slab arrays (16384 slabs) and the table of s */
    const size_t fixed = sizeof *kv + 32 * (size_t)kv->n_slabs + sizeof(int32_t) * 100;
    CHECKF(a1 - a0 <= fixed, "a pool of 2^18 blocks allocates %zu bytes at create (at most %zu: nothing per block)",
           a1 - a0, fixed);
    CHECK(kv_seq_reserve(kv, &s, 4 * 100, &e) == HN_OK);
    kv_stats ks;
    kv_get_stats(kv, &ks);
    const size_t meta = hn_alloc_bytes() - a1 - ks.bytes;
    CHECKF(meta == ks.meta_bytes, "the allocator counts %zu bytes of metadata, the pool %zu", meta, ks.meta_bytes);
    /* about 70 bytes per block at block size 4 (16 of them its tokens), a slab or an eighth more covered */
    CHECKF(ks.blocks_backed == 112 && meta >= 54 * (size_t)ks.blocks_backed &&
               meta <= 128 * (size_t)(ks.blocks_backed + kv->slab_blocks),
           "%d blocks backed hold %zu bytes of metadata", (int)ks.blocks_backed, meta);
    const kv_seq *one[1] = {&s};
    CHECK(check(kv, one, 1));
    kv_seq_free(&s, kv);
    kv_trim(kv, 0);
    CHECKF(hn_alloc_bytes() == a1 - sizeof(int32_t) * 100, "trimmed: %zd bytes beside the cache's fixed ones",
           (ssize_t)(hn_alloc_bytes() - (a1 - sizeof(int32_t) * 100)));
    CHECK(check(kv, NULL, 0));
    kv_free(kv);
    CHECK(hn_alloc_bytes() == a0);
}

/* Growth across many slab mappings (a slab per block: the metadata grows, and
 * the hash table is rebuilt, hundreds of times while blocks are published)
 * keeps every published block findable and every refcount right, and so
 * does a trim that shrinks the metadata under cached blocks. */
static void test_meta_growth(void) {
    enum { NB = 300, T = NB * 4 };
    kv_config c = {.n_layer = 1, .n_head_kv = 1, .head_dim = 32, .block_size = 4, .n_blocks = 4096, .type = QT_F32,
                   .slab_blocks = 1};
    kv_cache *kv;
    CHECK(kv_create(&c, &kv, &e) == HN_OK);
    if (!kv) return;
    static int32_t ta[T], tc[T];
    fill_tokens(ta, T, 11);
    fill_tokens(tc, T, 12);
    kv_seq a, b, cq, d;
    kv_seq_init(&a, kv, T, &e);
    kv_seq_init(&b, kv, T, &e);
    kv_seq_init(&cq, kv, T, &e);
    kv_seq_init(&d, kv, T, &e);
    const size_t a0 = hn_alloc_bytes();
    const kv_seq *all[4] = {&a, &b, &cq, &d};
    kv_seq *mut[4] = {&a, &b, &cq, &d};
    /* a and c grow 7 positions at a time, publishing as they go */
    int bad = 0;
    kv_seq *grow[2] = {&a, &cq};
    const int32_t *gt[2] = {ta, tc};
    for (int g = 0; g < 2; g++)
        for (int32_t n = 7;; n += 7) {
            if (n > T) n = T;
            if (kv_seq_reserve(kv, grow[g], n, &e) != HN_OK) bad++;
            grow[g]->n_tokens = n;
            kv_seq_commit(kv, grow[g], gt[g], n);
            if (n % 70 == 0 && !check(kv, all, 4)) bad++;
            if (n == T) break;
            if (g == 0 && n == 7 * 40) { /* b finds a's prefix while a is still growing */
                if (kv_seq_match(kv, &b, ta, T) != n / 4 * 4) bad++;
            }
        }
    kv_stats ks;
    kv_get_stats(kv, &ks);
    CHECKF(!bad && ks.blocks_backed == 2 * NB && kv->meta_slabs >= 2 * NB && kv->meta_slabs <= 2 * NB + 2 * NB / 8,
           "%d failures, %d blocks backed, metadata for %d slabs", bad, (int)ks.blocks_backed, (int)kv->meta_slabs);
    CHECKF(hn_alloc_bytes() - a0 == ks.bytes + ks.meta_bytes && ks.meta_bytes > 0,
           "the allocator's %zu bytes = slabs %zu + metadata %zu", hn_alloc_bytes() - a0, ks.bytes, ks.meta_bytes);
    /* b picks up the rest of a's blocks; d finds all of them after c's growth */
    CHECK(kv_seq_match(kv, &b, ta, T) == T - 7 * 40 && b.n_blocks == NB);
    CHECK(kv_seq_match(kv, &d, ta, T) == T && d.n_blocks == NB);
    bool same = true;
    for (int32_t i = 0; i < NB; i++)
        same = same && b.blocks[i] == a.blocks[i] && d.blocks[i] == a.blocks[i] &&
               kv_block_refs(kv, a.blocks[i]) == 3 && kv_block_refs(kv, cq.blocks[i]) == 1;
    CHECKF(same, "b and d hold a's blocks, 3 references each; c's have 1");
    CHECK(check(kv, all, 4));
    /* c's blocks released first (the LRU's head), then a's: a trim keeping
     * NB cached blocks drops c's, unmaps their slabs and shrinks the
     * metadata to a's slabs, rebuilding the hash table smaller */
    const size_t meta_full = ks.meta_bytes;
    kv_seq_truncate(kv, &cq, 0);
    kv_seq_truncate(kv, &a, 0);
    kv_seq_truncate(kv, &b, 0);
    kv_seq_truncate(kv, &d, 0);
    kv_trim(kv, NB);
    kv_get_stats(kv, &ks);
    CHECKF(ks.blocks_cached == NB && ks.slabs_mapped == NB && kv->meta_slabs == NB &&
               ks.meta_bytes < meta_full / 2 + 1024 && hn_alloc_bytes() - a0 == ks.bytes + ks.meta_bytes,
           "trimmed to %d cached blocks in %d slabs: metadata for %d slabs, %zu bytes (was %zu)", (int)ks.blocks_cached,
           (int)ks.slabs_mapped, (int)kv->meta_slabs, ks.meta_bytes, meta_full);
    CHECK(check(kv, all, 4));
    CHECK(kv_seq_match(kv, &a, ta, T) == T && kv_seq_match(kv, &cq, tc, T) == 0);
    /* grown again for other tokens: a's blocks are still found, the new ones too */
    if (kv_seq_reserve(kv, &cq, T, &e) != HN_OK) bad++;
    cq.n_tokens = T;
    kv_seq_commit(kv, &cq, tc, T);
    CHECK(!bad && kv_seq_match(kv, &b, ta, T) == T && kv_seq_match(kv, &d, tc, T) == T);
    same = true;
    for (int32_t i = 0; i < NB; i++)
        same = same && b.blocks[i] == a.blocks[i] && d.blocks[i] == cq.blocks[i] &&
               kv_block_refs(kv, a.blocks[i]) == 2 && kv_block_refs(kv, cq.blocks[i]) == 2;
    CHECKF(same, "after the shrink and a regrowth: 2 references to each of a's and c's blocks");
    CHECK(check(kv, all, 4));
    for (int i = 0; i < 4; i++) kv_seq_truncate(kv, mut[i], 0);
    kv_trim(kv, 0);
    kv_get_stats(kv, &ks);
    CHECKF(ks.meta_bytes == 0 && kv->meta == NULL && hn_alloc_bytes() == a0, "trimmed: %zu bytes of metadata, %zd left",
           ks.meta_bytes, (ssize_t)(hn_alloc_bytes() - a0));
    CHECK(check(kv, NULL, 0) && kv_seq_match(kv, &a, ta, T) == 0);
    for (int i = 0; i < 4; i++) kv_seq_free(mut[i], kv);
    kv_free(kv);
}

/* The checkpoint arrays (hybrid models) grow with the rest: checkpoints
 * taken early stay attached to their blocks across many growths and a
 * shrink, and a match resumes from the deepest. */
static void test_meta_ckpt(void) {
    kv_config c = {.n_layer = 1, .n_head_kv = 1, .head_dim = 32, .block_size = 4, .n_blocks = 256, .type = QT_F32,
                   .slab_blocks = 1, .state_bytes = 5000, .n_state_slots = 8, .n_ckpt = 4};
    kv_cache *kv;
    CHECK(kv_create(&c, &kv, &e) == HN_OK);
    if (!kv) return;
    int32_t t[160];
    fill_tokens(t, 160, 4);
    kv_seq a, b;
    kv_seq_init(&a, kv, 160, &e);
    kv_seq_init(&b, kv, 160, &e);
    int32_t slot[2] = {-1, -1}, at[2] = {3, 20}; /* checkpoints at blocks 3 and 20, taken as a reaches them */
    for (int32_t n = 4; n <= 160; n += 4) {
        CHECK(kv_seq_reserve(kv, &a, n, &e) == HN_OK);
        a.n_tokens = n;
        kv_seq_commit(kv, &a, t, n);
        for (int k = 0; k < 2; k++)
            if (n / 4 - 1 == at[k]) slot[k] = kv_ckpt_take(kv, a.blocks[at[k]], KV_CK_TIP);
    }
    const kv_seq *one[1] = {&a};
    CHECK(slot[0] >= 0 && slot[1] >= 0 && check(kv, one, 1));
    CHECK(kv_ckpt_of(kv, a.blocks[3]) == slot[0] && kv_ckpt_of(kv, a.blocks[20]) == slot[1] &&
          kv_ckpt_of(kv, a.blocks[21]) < 0 && kv_ckpt_of(kv, 255) < 0);
    /* a keeps its first 24 blocks; the rest are freed and trimmed away */
    kv_seq_truncate(kv, &a, 24 * 4);
    kv_trim(kv, 0);
    CHECKF(kv->meta_slabs == 24 && kv_ckpt_of(kv, a.blocks[20]) == slot[1], "metadata for %d slabs",
           (int)kv->meta_slabs);
    int32_t got = -1;
    CHECK(kv_seq_match_ckpt(kv, &b, t, 160, &got) == 21 * 4 && got == slot[1]);
    const kv_seq *two[2] = {&a, &b};
    CHECK(check(kv, two, 2));
    kv_seq_free(&a, kv);
    kv_seq_free(&b, kv);
    kv_free(kv);
}

/* A metadata growth that fails (the allocator made to fail at each of the
 * reserve's allocations in turn: a growth, a hash table, a slab's pages)
 * fails that slab's mapping: the pool behaves as full, nothing leaks or
 * breaks, and it grows once memory is back. A shrink that fails keeps the
 * metadata as it was. */
static void test_meta_fail(void) {
    /* blocks of a granule (page), so that the allocator counts slabs as the pool does */
    size_t gran = kv_host_storage()->granule;
    kv_config c = {.n_layer = gran > 1024 ? (int)(gran / 1024) : 1, .n_head_kv = 1, .head_dim = 32, .block_size = 4,
                   .n_blocks = 64, .type = QT_F32, .slab_blocks = 2};
    int32_t t[128];
    fill_tokens(t, 128, 9);
    int fulls = 0, oks = 0;
    long first_bad = -1;
    for (long n = 0; n < 48; n++) {
        kv_cache *kv;
        if (kv_create(&c, &kv, &e) != HN_OK) {
            CHECK(0);
            return;
        }
        kv_seq a, b, m;
        kv_seq_init(&a, kv, 128, &e);
        kv_seq_init(&b, kv, 128, &e);
        kv_seq_init(&m, kv, 128, &e);
        bool ok = kv_seq_reserve(kv, &a, 24, &e) == HN_OK; /* 6 blocks in 3 slabs */
        a.n_tokens = 24;
        kv_seq_commit(kv, &a, t, 24);
        const size_t a1 = hn_alloc_bytes();
        kv_stats k1, k2;
        kv_get_stats(kv, &k1);
        const int32_t meta1 = kv->meta_slabs;
        hn_alloc_fail_after(n);
        hn_status st = kv_seq_reserve(kv, &b, 128, &e); /* 32 blocks more: 16 growths */
        hn_alloc_fail_after(-1);
        kv_get_stats(kv, &k2);
        const kv_seq *ab[2] = {&a, &b}, *abm[3] = {&a, &b, &m};
        ok = ok && check(kv, ab, 2);
        ok = ok && hn_alloc_bytes() - a1 == k2.bytes + k2.meta_bytes - k1.bytes - k1.meta_bytes;
        if (st == HN_ERR_FULL) {
            fulls++;
            ok = ok && b.n_blocks < 32;
        } else {
            oks += st == HN_OK;
            ok = ok && st == HN_OK && b.n_blocks == 32;
        }
        if (n == 0) /* the first allocation is the growth for slab 3 */
            ok = ok && st == HN_ERR_FULL && b.n_blocks == 0 && kv->meta_slabs == meta1 &&
                 k2.meta_bytes == k1.meta_bytes;
        ok = ok && kv_seq_match(kv, &m, t, 24) == 24 && kv_block_refs(kv, a.blocks[5]) == 2;
        ok = ok && kv_seq_reserve(kv, &b, 128, &e) == HN_OK && b.n_blocks == 32 && check(kv, abm, 3);
        const int32_t meta2 = kv->meta_slabs;
        /* b's blocks go; a trim whose shrink fails keeps the metadata, exactly counted */
        kv_seq_truncate(kv, &b, 0);
        hn_alloc_fail_after(0);
        kv_trim(kv, 64);
        hn_alloc_fail_after(-1);
        kv_stats k3;
        kv_get_stats(kv, &k3);
        ok = ok && check(kv, abm, 3) && k3.slabs_mapped == 3 && kv->meta_slabs == meta2 && meta2 > 3 &&
             hn_alloc_bytes() - a1 == k3.bytes + k3.meta_bytes - k1.bytes - k1.meta_bytes;
        kv_trim(kv, 64);
        kv_get_stats(kv, &k3);
        ok = ok && check(kv, abm, 3) && kv->meta_slabs == 3 && k3.meta_bytes == k1.meta_bytes && hn_alloc_bytes() == a1;
        kv_seq_truncate(kv, &m, 0);
        ok = ok && kv_seq_match(kv, &m, t, 24) == 24;
        if (!ok && first_bad < 0) first_bad = n;
        kv_seq_free(&a, kv);
        kv_seq_free(&b, kv);
        kv_seq_free(&m, kv);
        kv_free(kv);
    }
    CHECKF(first_bad < 0, "a failure injected at allocation %ld of the growth", first_bad);
    CHECKF(fulls > 0 && oks > 0, "%d reserves failed clean, %d ran to the end", fulls, oks);
}

/* Random interleavings over a small pool; invariants after every operation. */
static uint64_t rng = 88172645463325252ULL;
static uint32_t rnd(uint32_t n) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

static void test_stress(void) {
    enum { NS = 6, MAXT = 96 };
    kv_config c = {.n_layer = 1, .n_head_kv = 1, .head_dim = 32, .block_size = 4, .n_blocks = 20, .type = QT_F32,
                   .slab_blocks = 3};
    kv_cache *kv;
    CHECK(kv_create(&c, &kv, &e) == HN_OK);
    kv_seq s[NS];
    int32_t toks[NS][MAXT];
    for (int i = 0; i < NS; i++) kv_seq_init(&s[i], kv, MAXT, &e);
    const kv_seq *all[NS];
    for (int i = 0; i < NS; i++) all[i] = &s[i];
    int iters = getenv("HONE_SANITIZED") ? 4000 : 20000, bad = 0;
    for (int it = 0; it < iters && !bad; it++) {
        int i = (int)rnd(NS);
        switch (rnd(6)) {
        case 0: /* new conversation: tokens from a few shared families */
            kv_seq_truncate(kv, &s[i], 0);
            for (int t = 0; t < MAXT; t++) toks[i][t] = t < 8 + (int)rnd(4) * 4 ? t : (int32_t)rnd(3) * 100 + t;
            kv_seq_match(kv, &s[i], toks[i], 1 + (int32_t)rnd(MAXT));
            break;
        case 1:
        case 2: { /* compute some tokens */
            int32_t n = s[i].n_tokens + 1 + (int32_t)rnd(10);
            if (n > MAXT) n = MAXT;
            if (kv_seq_reserve(kv, &s[i], n, &e) == HN_OK) s[i].n_tokens = n;
            kv_seq_commit(kv, &s[i], toks[i], s[i].n_tokens);
            break;
        }
        case 3: /* finish or preempt */
            kv_seq_commit(kv, &s[i], toks[i], s[i].n_tokens);
            kv_seq_truncate(kv, &s[i], 0);
            break;
        case 4: /* resume from the cache */
            kv_seq_match(kv, &s[i], toks[i], MAXT);
            break;
        case 5:
            if (rnd(4) == 0) kv_trim(kv, (int32_t)rnd(6));
            else kv_seq_truncate(kv, &s[i], (int32_t)rnd((uint32_t)s[i].n_tokens + 1));
            break;
        }
        if (!check(kv, all, NS)) {
            fprintf(stderr, "stress: iteration %d\n", it);
            bad = 1;
        }
    }
    CHECKF(!bad, "invariants hold over %d random operations", iters);
    for (int i = 0; i < NS; i++) kv_seq_free(&s[i], kv);
    kv_stats ks;
    kv_get_stats(kv, &ks);
    CHECK(ks.blocks_used == 0 && ks.evictions > 0 && ks.hit_blocks > 0);
    kv_trim(kv, 0);
    kv_get_stats(kv, &ks);
    CHECK(ks.bytes == 0);
    CHECK(check(kv, NULL, 0));
    kv_free(kv);
}

/* Recurrent-state slots and checkpoints (hybrid models): slots map and
 * unmap with their use, the cap holds, checkpoints attach only to published
 * blocks, have their own budget and LRU, go with their block on eviction,
 * and kv_seq_match_ckpt cuts a match back to the deepest checkpoint. */
static void test_state(void) {
    kv_config c = {.n_layer = 1, .n_head_kv = 1, .head_dim = 32, .block_size = 4, .n_blocks = 8, .type = QT_F32,
                   .slab_blocks = 2, .state_bytes = 5000, .n_state_slots = 4, .n_ckpt = 2};
    kv_cache *kv;
    CHECK(kv_create(&c, &kv, &e) == HN_OK);
    CHECK(kv->state_slot_bytes >= 5000 && kv->state_slot_bytes % kv->storage->granule == 0);
    kv_stats ks;
    kv_get_stats(kv, &ks);
    CHECK(ks.state_bytes == 0 && ks.state_slots_max == 4 && ks.ckpt_max == 2 && ks.ckpts == 0);
    kv_seq a, b;
    kv_seq_init(&a, kv, 32, &e);
    kv_seq_init(&b, kv, 32, &e);
    CHECK(a.state == -1);
    CHECK(kv_seq_state_acquire(kv, &a, &e) == HN_OK && a.state >= 0 && a.state_len == 0);
    int32_t sa = a.state;
    CHECK(kv_seq_state_acquire(kv, &a, &e) == HN_OK && a.state == sa); /* already has one */
    /* the slot is backed memory: writable */
    memset(kv_state_ptr(kv, sa), 0x5a, 5000);
    int32_t x1 = kv_state_alloc(kv), x2 = kv_state_alloc(kv), x3 = kv_state_alloc(kv);
    CHECK(x1 >= 0 && x2 >= 0 && x3 >= 0 && kv_state_alloc(kv) == -1); /* the cap */
    CHECK(kv_seq_state_acquire(kv, &b, &e) == HN_ERR_FULL && b.state == -1);
    kv_get_stats(kv, &ks);
    CHECK(ks.state_slots_live == 4 && ks.state_bytes == 4 * kv->state_slot_bytes);
    kv_state_free(kv, x1);
    kv_state_free(kv, x2);
    kv_state_free(kv, x3);
    CHECK(kv_seq_state_acquire(kv, &b, &e) == HN_OK);
    /* checkpoints: a's 12 positions published */
    int32_t t[32];
    fill_tokens(t, 32, 5);
    CHECK(kv_seq_reserve(kv, &a, 12, &e) == HN_OK);
    a.n_tokens = a.state_len = 12;
    CHECK(kv_ckpt_take(kv, a.blocks[0], KV_CK_LADDER) == -1); /* not published yet */
    kv_seq_commit(kv, &a, t, 12);
    int32_t c0 = kv_ckpt_take(kv, a.blocks[0], KV_CK_LADDER), c2 = kv_ckpt_take(kv, a.blocks[2], KV_CK_LADDER);
    CHECK(c0 >= 0 && c2 >= 0 && kv_ckpt_take(kv, a.blocks[2], KV_CK_LADDER) == -1 && kv_ckpt_of(kv, a.blocks[2]) == c2);
    const kv_seq *ab[2] = {&a, &b};
    CHECK(check(kv, ab, 2));
    /* b matches a's prefix through the deepest checkpoint (block 2) */
    int32_t slot;
    kv_seq_state_release(kv, &b);
    CHECK(kv_seq_state_acquire(kv, &b, &e) == HN_OK);
    CHECK(kv_seq_match_ckpt(kv, &b, t, 20, &slot) == 12 && slot == c2 && b.n_blocks == 3);
    kv_get_stats(kv, &ks);
    CHECK(ks.ckpt_hits == 1 && ks.ckpts == 2);
    kv_seq_truncate(kv, &b, 0);
    /* the budget: a third checkpoint drops the least recently used one (block 0: block 2 was just used) */
    CHECK(kv_seq_reserve(kv, &a, 16, &e) == HN_OK);
    a.n_tokens = 16;
    kv_seq_commit(kv, &a, t, 16);
    int32_t c3 = kv_ckpt_take(kv, a.blocks[3], KV_CK_LADDER);
    CHECK(c3 >= 0 && kv_ckpt_of(kv, a.blocks[0]) == -1 && kv_ckpt_of(kv, a.blocks[2]) == c2);
    kv_get_stats(kv, &ks);
    CHECK(ks.ckpts == 2 && ks.ckpt_evictions == 1);
    CHECK(check(kv, ab, 2));
    /* a match only as deep as block 1 finds no checkpoint there: nothing is taken */
    CHECK(kv_seq_match_ckpt(kv, &b, t, 9, &slot) == 0 && slot == -1 && b.n_blocks == 0);
    /* checkpoints go with their blocks: a releases, kv_trim evicts every cached block */
    kv_seq_state_release(kv, &a);
    kv_seq_truncate(kv, &a, 0);
    CHECK(check(kv, ab, 2));
    kv_trim(kv, 0);
    kv_get_stats(kv, &ks);
    CHECK(ks.ckpts == 0 && ks.blocks_cached == 0 && ks.state_slots_live == 1 && ks.state_bytes == kv->state_slot_bytes);
    CHECK(check(kv, ab, 2));
    kv_seq_free(&a, kv);
    kv_seq_free(&b, kv);
    kv_get_stats(kv, &ks);
    CHECK(ks.state_bytes == 0 && ks.state_peak_bytes == 4 * kv->state_slot_bytes && b.state == -1);
    kv_free(kv);
    /* a cache without recurrent state refuses a slot */
    kv_config c2cfg = {.n_layer = 1, .n_head_kv = 1, .head_dim = 32, .n_blocks = 2, .type = QT_F32};
    CHECK(kv_create(&c2cfg, &kv, &e) == HN_OK);
    kv_seq_init(&a, kv, 8, &e);
    CHECK(kv_seq_state_acquire(kv, &a, &e) == HN_ERR_INVALID && kv_ckpt_take(kv, 0, KV_CK_LADDER) == -1);
    kv_seq_free(&a, kv);
    kv_free(kv);
}

/* Checkpoint kinds: within the budget, ladder checkpoints go first, kept
 * ones (tips, branch points) only for another kept one and least recently
 * used first; a ladder checkpoint never displaces a kept one; a take on a
 * block that has one raises its kind; a passed tip becomes a ladder one, and
 * a match passes the tips before the block it resumes from. */
static void test_ckpt_kinds(void) {
    kv_config c = {.n_layer = 1, .n_head_kv = 1, .head_dim = 32, .block_size = 4, .n_blocks = 16, .type = QT_F32,
                   .state_bytes = 5000, .n_state_slots = 8, .n_ckpt = 3};
    kv_cache *kv;
    CHECK(kv_create(&c, &kv, &e) == HN_OK);
    kv_seq a, b;
    kv_seq_init(&a, kv, 32, &e);
    kv_seq_init(&b, kv, 32, &e);
    CHECK(kv_seq_state_acquire(kv, &a, &e) == HN_OK && kv_seq_state_acquire(kv, &b, &e) == HN_OK);
    int32_t t[32];
    fill_tokens(t, 32, 9);
    CHECK(kv_seq_reserve(kv, &a, 24, &e) == HN_OK);
    a.n_tokens = a.state_len = 24;
    kv_seq_commit(kv, &a, t, 24);
    const int32_t *ab = a.blocks;
    const kv_seq *seqs[2] = {&a, &b};
    kv_stats ks;
    CHECK(kv_ckpt_take(kv, ab[0], KV_CK_LADDER) >= 0 && kv_ckpt_take(kv, ab[1], KV_CK_TIP) >= 0 &&
          kv_ckpt_take(kv, ab[2], KV_CK_BRANCH) >= 0);
    /* full: a ladder checkpoint displaces the ladder one, twice */
    CHECK(kv_ckpt_take(kv, ab[3], KV_CK_LADDER) >= 0 && kv_ckpt_of(kv, ab[0]) == -1);
    CHECK(kv_ckpt_take(kv, ab[4], KV_CK_LADDER) >= 0 && kv_ckpt_of(kv, ab[3]) == -1);
    /* a tip displaces the ladder one too, not the older kept ones */
    CHECK(kv_ckpt_take(kv, ab[5], KV_CK_TIP) >= 0 && kv_ckpt_of(kv, ab[4]) == -1);
    CHECK(kv_ckpt_of(kv, ab[1]) >= 0 && kv_ckpt_of(kv, ab[2]) >= 0);
    /* all three kept: a ladder checkpoint is refused, nothing dropped */
    kv_get_stats(kv, &ks);
    uint64_t ev = ks.ckpt_evictions;
    CHECK(kv_ckpt_take(kv, ab[0], KV_CK_LADDER) == -1 && kv_ckpt_of(kv, ab[0]) == -1);
    kv_get_stats(kv, &ks);
    CHECKF(ks.ckpts == 3 && ks.ckpt_evictions == ev, "%d checkpoints, %llu evictions", (int)ks.ckpts,
           (unsigned long long)ks.ckpt_evictions);
    CHECK(check(kv, seqs, 2));
    /* the tip at block 1 raised to a branch point: passing it changes nothing;
     * the tip at block 5 passed: the next ladder checkpoint displaces it */
    int32_t s1 = kv_ckpt_of(kv, ab[1]);
    CHECK(kv_ckpt_take(kv, ab[1], KV_CK_BRANCH) == -1 && kv_ckpt_of(kv, ab[1]) == s1);
    kv_ckpt_pass(kv, ab[1]);
    kv_ckpt_pass(kv, ab[5]);
    CHECK(check(kv, seqs, 2));
    CHECK(kv_ckpt_take(kv, ab[0], KV_CK_LADDER) >= 0 && kv_ckpt_of(kv, ab[5]) == -1 && kv_ckpt_of(kv, ab[1]) == s1);
    /* kept ones go least recently used first: block 2 (block 1 was raised since) */
    CHECK(kv_ckpt_take(kv, ab[3], KV_CK_TIP) >= 0 && kv_ckpt_of(kv, ab[0]) == -1);
    CHECK(kv_ckpt_take(kv, ab[4], KV_CK_TIP) >= 0 && kv_ckpt_of(kv, ab[2]) == -1 && kv_ckpt_of(kv, ab[1]) == s1);
    CHECK(check(kv, seqs, 2));
    /* held: branch 1, tips 3 and 4. b resumes from block 4 (5 blocks matched
     * of 23 positions): the tip at 3 is passed, the branch point is not */
    int32_t slot;
    CHECK(kv_seq_match_ckpt(kv, &b, t, 23, &slot) == 20 && slot == kv_ckpt_of(kv, ab[4]));
    CHECK(kv_ckpt_take(kv, ab[5], KV_CK_LADDER) >= 0 && kv_ckpt_of(kv, ab[3]) == -1);
    CHECK(kv_ckpt_of(kv, ab[1]) == s1 && kv_ckpt_of(kv, ab[4]) >= 0);
    CHECK(check(kv, seqs, 2));
    /* the block after b's 5 is a's sixth: cached; other tokens, or fewer than a block left, not */
    b.state_len = b.n_tokens;
    CHECK(kv_seq_next_cached(kv, &b, t, 24) && !kv_seq_next_cached(kv, &b, t, 23));
    int32_t u[24];
    memcpy(u, t, sizeof u);
    u[22]++;
    CHECK(!kv_seq_next_cached(kv, &b, u, 24));
    kv_seq_free(&a, kv);
    kv_seq_free(&b, kv);
    kv_free(kv);
}

/* Conversation tags: a conversation that resumes at one of its tips passes
 * its tips past there (a branch its client left) to the head of the ladder
 * LRU, and no other conversation's; touching a checkpoint keeps it (a tip,
 * the most recently used) against the LRU. */
static void test_ckpt_conv(void) {
    kv_config c = {.n_layer = 1, .n_head_kv = 1, .head_dim = 32, .block_size = 4, .n_blocks = 16, .type = QT_F32,
                   .state_bytes = 5000, .n_state_slots = 8, .n_ckpt = 5};
    kv_cache *kv;
    CHECK(kv_create(&c, &kv, &e) == HN_OK);
    kv_seq a;
    kv_seq_init(&a, kv, 32, &e);
    CHECK(kv_seq_state_acquire(kv, &a, &e) == HN_OK);
    int32_t t[32];
    fill_tokens(t, 32, 5);
    CHECK(kv_seq_reserve(kv, &a, 24, &e) == HN_OK);
    a.n_tokens = a.state_len = 24;
    kv_seq_commit(kv, &a, t, 24);
    const int32_t *ab = a.blocks;
    const kv_seq *seqs[1] = {&a};
    /* conversation 7: tips at blocks 1, 3, 4; conversation 9: a tip at block 5; a ladder one at 2 */
    for (int i = 1; i <= 5; i++) CHECK(kv_ckpt_take(kv, ab[i], i == 2 ? KV_CK_LADDER : KV_CK_TIP) >= 0);
    kv_ckpt_tag(kv, ab[1], 7, 8);
    kv_ckpt_tag(kv, ab[3], 7, 16);
    kv_ckpt_tag(kv, ab[4], 7, 20);
    kv_ckpt_tag(kv, ab[5], 9, 24);
    kv_ckpt_tag(kv, ab[2], 7, 12);
    CHECK(kv_ckpt_conv(kv, ab[1]) == 7 && kv_ckpt_conv(kv, ab[5]) == 9 && kv_ckpt_conv(kv, ab[2]) == 0);
    /* 7 resumes at 8: its tips at 16 and 20 pass, 9's does not, nor 7's at 8 */
    CHECK(kv_ckpt_pass_past(kv, 7, 8) == 2 && kv_ckpt_pass_past(kv, 7, 8) == 0);
    CHECK(kv_ckpt_conv(kv, ab[3]) == 0 && kv_ckpt_conv(kv, ab[4]) == 0 && kv_ckpt_conv(kv, ab[1]) == 7 &&
          kv_ckpt_conv(kv, ab[5]) == 9);
    CHECK(check(kv, seqs, 1));
    /* full: the passed ones go before the older ladder one (at the head) */
    CHECK(kv_ckpt_take(kv, ab[0], KV_CK_LADDER) >= 0 && kv_ckpt_of(kv, ab[2]) >= 0 &&
          (kv_ckpt_of(kv, ab[3]) < 0) + (kv_ckpt_of(kv, ab[4]) < 0) == 1);
    /* touching: the tip at 1 is the most recently used kept one, the one at 5 goes first */
    CHECK(kv_ckpt_touch(kv, ab[1], KV_CK_TIP) && !kv_ckpt_touch(kv, 15, KV_CK_TIP));
    kv_ckpt_drop(kv, ab[2]);
    kv_ckpt_drop(kv, ab[3]);
    kv_ckpt_drop(kv, ab[4]);
    kv_ckpt_drop(kv, ab[0]);
    for (int i = 2; i <= 4; i++) CHECK(kv_ckpt_take(kv, ab[i], KV_CK_TIP) >= 0); /* 5 held: 1, 5, 2, 3, 4 */
    CHECK(kv_ckpt_take(kv, ab[0], KV_CK_TIP) >= 0 && kv_ckpt_of(kv, ab[5]) < 0 && kv_ckpt_of(kv, ab[1]) >= 0);
    /* a ladder checkpoint touched as a tip is kept again; a dropped one has no tag */
    kv_ckpt_pass(kv, ab[2]);
    CHECK(kv_ckpt_touch(kv, ab[2], KV_CK_TIP) && kv_ckpt_take(kv, ab[5], KV_CK_LADDER) == -1);
    kv_ckpt_drop(kv, ab[1]);
    CHECK(kv_ckpt_conv(kv, ab[1]) == 0);
    CHECK(check(kv, seqs, 1));
    kv_seq_free(&a, kv);
    kv_free(kv);
}

int main(void) {
    test_basics();
    test_state();
    test_ckpt_kinds();
    test_ckpt_conv();
    test_types();
    test_slab_shrink();
    test_prefix();
    test_prefix_ns();
    test_map_failure();
    test_meta_sized();
    test_meta_growth();
    test_meta_ckpt();
    test_meta_fail();
    test_stress();
    TEST_DONE();
}
