/* kv.c: the paged KV block pool (slabs mapped on demand), per-sequence block
 * tables, and the prefix cache (chained block hashes, refcounts, LRU of
 * cached blocks). See kv.h for the model. */
#include "kv.h"

#include <limits.h>
#include <pthread.h>
#include <string.h>
#include <xxhash.h>

#include "../core/alloc.h"
#include "../quant/quant.h"

enum { KV_UNBACKED = 0, KV_FREE, KV_USED, KV_CACHED };

#define KV_SLAB_TARGET ((size_t)32 << 20)
#define KV_ROOT_SEED 0x686f6e652d6b7631ULL /* the parent of block 0 */

static bool k_type_ok(qt_type t) { return t == QT_F32 || t == QT_F16 || t == QT_Q8_0; }
static bool v_type_ok(qt_type t) { return k_type_ok(t) || t == QT_Q4_0 || t == QT_Q4_1; }

static int cfg_bs(const kv_config *cfg) { return cfg->block_size > 0 ? cfg->block_size : KV_DEFAULT_BLOCK; }

size_t kv_block_bytes(const kv_config *cfg) {
    int64_t row = (int64_t)cfg->n_head_kv * cfg->head_dim;
    return (size_t)cfg->n_layer * (size_t)cfg_bs(cfg) * (qt_row_size(cfg->type, row) + qt_row_size(cfg->v_type, row));
}

/* ---- block metadata ---- */

/* The per-block arrays inside the one allocation kv->meta, widest element
 * first (so each starts aligned): element type, name, entries per block (0:
 * absent), and the byte a block that gains metadata starts with (0xff: -1).
 * The checkpoint arrays exist with recurrent state (ck 1). */
#define KV_META(X, bs, ck)             \
    X(uint64_t, hash, 1, 0)            \
    X(uint64_t, parent, 1, 0)          \
    X(uint64_t, ck_conv, ck, 0)        \
    X(int32_t, ref, 1, 0)              \
    X(int32_t, lru_prev, 1, 0xff)      \
    X(int32_t, lru_next, 1, 0xff)      \
    X(int32_t, ht_next, 1, 0xff)       \
    X(int32_t, free_ids, 1, 0)         \
    X(int32_t, btok, bs, 0)            \
    X(int32_t, ckpt, ck, 0xff)         \
    X(int32_t, ck_prev, ck, 0xff)      \
    X(int32_t, ck_next, ck, 0xff)      \
    X(int32_t, ck_pos, ck, 0)          \
    X(uint8_t, state, 1, KV_UNBACKED)  \
    X(uint8_t, pub, 1, 0)              \
    X(uint8_t, ck_kind, ck, KV_CK_LADDER)

/* Bytes of metadata per block (the hash table aside). */
static size_t meta_per_block(const kv_cache *kv) {
    const size_t bs = (size_t)kv->cfg.block_size, ck = kv->cfg.state_bytes ? 1 : 0;
    size_t z = 0;
#define X(T, name, k, fill) z += sizeof(T) * (size_t)(k);
    KV_META(X, bs, ck)
#undef X
    return z;
}

/* Buckets of the hash table for n blocks with metadata: a power of two, at least 2n (0 for none). */
static uint32_t ht_buckets(int32_t n) {
    if (n <= 0) return 0;
    uint32_t h = 16;
    while (h < (uint32_t)n * 2u) h <<= 1;
    return h;
}

static void note_peak(kv_cache *kv) {
    if (kv->bytes + kv->meta_bytes > kv->total_peak_bytes) kv->total_peak_bytes = kv->bytes + kv->meta_bytes;
}

/* Makes the metadata cover slabs [0, slabs), growing or shrinking it (the
 * blocks it stops covering must be unbacked): a new allocation, the kept
 * blocks' entries copied, new blocks unbacked; the hash table is rebuilt when
 * its size changes. False, with nothing changed, when memory cannot be had. */
static bool meta_resize(kv_cache *kv, int32_t slabs) {
    const size_t sb = (size_t)kv->slab_blocks, n0 = (size_t)kv->meta_slabs * sb, n1 = (size_t)slabs * sb;
    const size_t per = meta_per_block(kv), keep = n0 < n1 ? n0 : n1;
    const int32_t nm = n1 < (size_t)kv->cfg.n_blocks ? (int32_t)n1 : kv->cfg.n_blocks;
    const uint32_t h0 = kv->ht ? kv->ht_mask + 1 : 0, h1 = ht_buckets(nm);
    if (n1 > SIZE_MAX / per) return false;
    unsigned char *m = n1 ? hn_malloc(per * n1) : NULL;
    int32_t *ht = h1 && h1 != h0 ? hn_malloc(sizeof(int32_t) * h1) : NULL;
    if ((n1 && !m) || (h1 && h1 != h0 && !ht)) {
        hn_free(m);
        hn_free(ht);
        return false;
    }
    const size_t bs = (size_t)kv->cfg.block_size, ck = kv->cfg.state_bytes ? 1 : 0;
    size_t off = 0;
#define X(T, name, k, fill)                                                   \
    if ((k) && m) {                                                           \
        T *p = (T *)(void *)(m + off);                                        \
        const size_t w = sizeof(T) * (size_t)(k);                             \
        if (keep) memcpy(p, kv->name, w * keep);                              \
        memset((unsigned char *)p + w * keep, fill, w * (n1 - keep));         \
        kv->name = p;                                                         \
        off += w * n1;                                                        \
    } else {                                                                  \
        kv->name = NULL;                                                      \
    }
    KV_META(X, bs, ck)
#undef X
    hn_free(kv->meta);
    kv->meta = m;
    if (h1 != h0) {
        hn_free(kv->ht);
        kv->ht = ht;
        kv->ht_mask = h1 ? h1 - 1 : 0;
        if (ht) memset(ht, 0xff, sizeof(int32_t) * h1);
        for (int32_t b = 0; b < nm; b++) /* rehash the published blocks */
            if (kv->pub[b]) {
                uint32_t i = (uint32_t)kv->hash[b] & kv->ht_mask;
                kv->ht_next[b] = ht[i];
                ht[i] = b;
            }
    }
    kv->meta_slabs = slabs;
    kv->n_meta = nm;
    kv->meta_bytes = per * n1 + sizeof(int32_t) * h1;
    note_peak(kv);
    return true;
}

/* ---- slabs ---- */

static int32_t slab_size(const kv_cache *kv, int32_t s) {
    int32_t first = s * kv->slab_blocks, left = kv->cfg.n_blocks - first;
    return left < kv->slab_blocks ? left : kv->slab_blocks;
}

/* Byte range of slab s inside the reserved range. */
static size_t slab_off(const kv_cache *kv, int32_t s) { return (size_t)s * (size_t)kv->slab_blocks * kv->block_bytes; }

/* Whether granule g (of the storage's mapping granularity) is touched by a mapped slab other than s. */
static bool granule_shared(const kv_cache *kv, size_t g, int32_t s) {
    size_t G = kv->storage->granule, sb = (size_t)kv->slab_blocks * kv->block_bytes;
    int32_t lo = (int32_t)(g * G / sb), hi = (int32_t)(((g + 1) * G - 1) / sb);
    for (int32_t o = lo; o <= hi && o < kv->n_slabs; o++)
        if (o != s && kv->slab[o]) return true;
    return false;
}

/* Maps (on) or unmaps the granules of slab s that no other mapped slab touches. */
static bool slab_back(kv_cache *kv, int32_t s, bool on) {
    const kv_storage *st = kv->storage;
    size_t G = st->granule, off = slab_off(kv, s), end = off + (size_t)slab_size(kv, s) * kv->block_bytes;
    size_t g0 = off / G, g1 = (end + G - 1) / G; /* granules [g0, g1) */
    if (g1 > g0 && granule_shared(kv, g0, s)) g0++;
    if (g1 > g0 && granule_shared(kv, g1 - 1, s)) g1--;
    if (g1 <= g0) return true;
    if (!on) {
        st->unmap(st->ctx, kv->base, g0 * G, (g1 - g0) * G);
        return true;
    }
    hn_err e;
    return st->map(st->ctx, kv->base, g0 * G, (g1 - g0) * G, &e) == HN_OK;
}

/* A sharded cache maps and unmaps slab s in every shard (all or none). */
static bool shards_back(kv_cache *kv, int32_t s, bool on) {
    for (int i = 0; i < kv->cfg.n_shards; i++) {
        kv_cache *sh = kv->shard[i];
        if (!on) {
            sh->slab[s] = NULL;
            slab_back(sh, s, false);
            continue;
        }
        if (!slab_back(sh, s, true)) {
            for (int j = 0; j < i; j++) {
                kv->shard[j]->slab[s] = NULL;
                slab_back(kv->shard[j], s, false);
            }
            return false;
        }
        sh->slab[s] = (unsigned char *)sh->base + slab_off(sh, s);
    }
    return true;
}

static bool slab_map(kv_cache *kv, int32_t s) {
    int32_t nb = slab_size(kv, s);
    size_t bytes = (size_t)nb * kv->block_bytes;
    if (s >= kv->meta_slabs) { /* metadata for this slab first: to it, or an eighth more */
        int32_t want = kv->meta_slabs + kv->meta_slabs / 8;
        if (want < s + 1) want = s + 1;
        if (want > kv->n_slabs) want = kv->n_slabs;
        if (!meta_resize(kv, want)) return false;
    }
    if (kv->cfg.n_shards > 1) {
        if (!shards_back(kv, s, true)) return false;
        kv->slab[s] = kv->shard[0]->slab[s]; /* mapped (the shards hold the bytes) */
    } else {
        if (!slab_back(kv, s, true)) return false;
        kv->slab[s] = (unsigned char *)kv->base + slab_off(kv, s);
    }
    int32_t *stack = kv->free_ids + (size_t)s * (size_t)kv->slab_blocks;
    for (int32_t i = 0; i < nb; i++) {
        int32_t b = s * kv->slab_blocks + (nb - 1 - i); /* lowest id on top */
        stack[i] = b;
        kv->state[b] = KV_FREE;
    }
    kv->slab_nfree[s] = nb;
    kv->slab_live[s] = 0;
    kv->n_backed += nb;
    kv->n_free += nb;
    kv->n_mapped_slabs++;
    kv->bytes += bytes;
    if (kv->bytes > kv->peak_bytes) kv->peak_bytes = kv->bytes;
    note_peak(kv);
    return true;
}

static void slab_unmap(kv_cache *kv, int32_t s) {
    int32_t nb = slab_size(kv, s);
    for (int32_t i = 0; i < nb; i++) kv->state[s * kv->slab_blocks + i] = KV_UNBACKED;
    kv->slab[s] = NULL;
    if (kv->cfg.n_shards > 1) shards_back(kv, s, false);
    else slab_back(kv, s, false);
    kv->slab_nfree[s] = 0;
    kv->n_backed -= nb;
    kv->n_free -= nb;
    kv->n_mapped_slabs--;
    kv->bytes -= (size_t)nb * kv->block_bytes;
}

/* Slab s just became empty: keep one empty slab mapped as a spare (the
 * lowest), unmap any other. */
static void slab_emptied(kv_cache *kv, int32_t s) {
    for (int32_t o = 0; o < kv->n_slabs; o++) {
        if (o == s || !kv->slab[o] || kv->slab_live[o] != 0) continue;
        slab_unmap(kv, o > s ? o : s);
        return;
    }
}

/* ---- LRU of cached blocks and the hash table ---- */

static void lru_unlink(kv_cache *kv, int32_t b) {
    int32_t p = kv->lru_prev[b], n = kv->lru_next[b];
    if (p >= 0) kv->lru_next[p] = n;
    else kv->lru_head = n;
    if (n >= 0) kv->lru_prev[n] = p;
    else kv->lru_tail = p;
    kv->lru_prev[b] = kv->lru_next[b] = -1;
}

static void lru_push_tail(kv_cache *kv, int32_t b) {
    kv->lru_prev[b] = kv->lru_tail;
    kv->lru_next[b] = -1;
    if (kv->lru_tail >= 0) kv->lru_next[kv->lru_tail] = b;
    else kv->lru_head = b;
    kv->lru_tail = b;
}

static void ht_insert(kv_cache *kv, int32_t b) {
    uint32_t i = (uint32_t)kv->hash[b] & kv->ht_mask;
    kv->ht_next[b] = kv->ht[i];
    kv->ht[i] = b;
    kv->pub[b] = 1;
}

static void ht_remove(kv_cache *kv, int32_t b) {
    int32_t *pp = &kv->ht[(uint32_t)kv->hash[b] & kv->ht_mask];
    while (*pp >= 0 && *pp != b) pp = &kv->ht_next[*pp];
    if (*pp == b) *pp = kv->ht_next[b];
    kv->ht_next[b] = -1;
    kv->pub[b] = 0;
}

static int32_t ht_find(const kv_cache *kv, uint64_t h, uint64_t parent, const int32_t *toks) {
    int bs = kv->cfg.block_size;
    if (!kv->ht) return -1; /* nothing mapped: no metadata */
    for (int32_t b = kv->ht[(uint32_t)h & kv->ht_mask]; b >= 0; b = kv->ht_next[b])
        if (kv->hash[b] == h && kv->parent[b] == parent &&
            !memcmp(kv->btok + (size_t)b * (size_t)bs, toks, sizeof(int32_t) * (size_t)bs))
            return b;
    return -1;
}

static uint64_t chain_hash(const kv_cache *kv, uint64_t parent, const int32_t *toks) {
    uint64_t h = XXH3_64bits_withSeed(toks, sizeof(int32_t) * (size_t)kv->cfg.block_size, parent);
    return h ? h : 1; /* 0 means "none" to callers */
}

/* ---- create / free ---- */

/* The layout fields of a cache of cfg's shape. */
static void layout(kv_cache *kv, const kv_config *cfg) {
    kv->row_elems = (size_t)cfg->n_head_kv * (size_t)cfg->head_dim;
    kv->k_row_bytes = qt_row_size(cfg->type, (int64_t)kv->row_elems);
    kv->v_row_bytes = qt_row_size(cfg->v_type, (int64_t)kv->row_elems);
    kv->k_head_bytes = qt_row_size(cfg->type, cfg->head_dim);
    kv->v_head_bytes = qt_row_size(cfg->v_type, cfg->head_dim);
    kv->layer_bytes = (size_t)cfg->block_size * (kv->k_row_bytes + kv->v_row_bytes);
    kv->block_bytes = kv_block_bytes(cfg);
}

/* Shard i of kv (its heads, its storage's range for every block); NULL when out of memory or the reserve fails. */
static kv_cache *shard_new(const kv_cache *kv, int i, hn_err *err) {
    kv_cache *sh = hn_calloc(1, sizeof *sh);
    if (!sh) return NULL;
    sh->cfg = kv->cfg;
    sh->cfg.n_head_kv = kv->cfg.n_head_kv / kv->cfg.n_shards;
    sh->cfg.n_shards = 0;
    sh->cfg.storage = sh->storage = kv->cfg.shard_storage[i];
    layout(sh, &sh->cfg);
    sh->slab_blocks = kv->slab_blocks;
    sh->n_slabs = kv->n_slabs;
    sh->range_bytes = sh->block_bytes * (size_t)kv->cfg.n_blocks;
    sh->slab = hn_calloc((size_t)sh->n_slabs, sizeof *sh->slab);
    if (!sh->slab || sh->storage->reserve(sh->storage->ctx, sh->range_bytes, &sh->base, err)) {
        hn_free(sh->slab);
        hn_free(sh);
        return NULL;
    }
    return sh;
}

hn_status kv_create(const kv_config *cfg, kv_cache **out, hn_err *err) {
    *out = NULL;
    if (!k_type_ok(cfg->type) || !v_type_ok(cfg->v_type))
        return hn_errf(err, HN_ERR_UNSUPPORTED, "kv: element types K %s, V %s not supported", qt_name(cfg->type),
                       qt_name(cfg->v_type));
    if (cfg->n_layer <= 0 || cfg->n_head_kv <= 0 || cfg->head_dim <= 0 || cfg->n_blocks <= 0 ||
        cfg->block_size < 0 || cfg->block_size > 4096 || cfg->n_layer > 4096 || cfg->n_head_kv > 4096 ||
        cfg->head_dim > 4096 || cfg->n_blocks > (1 << 26) || cfg->slab_blocks < 0)
        return hn_errf(err, HN_ERR_INVALID, "kv: bad config (layers %d, kv heads %d, head dim %d, blocks %d, block size %d)",
                       cfg->n_layer, cfg->n_head_kv, cfg->head_dim, (int)cfg->n_blocks, cfg->block_size);
    if (!qt_row_size(cfg->type, cfg->head_dim) || !qt_row_size(cfg->v_type, cfg->head_dim))
        return hn_errf(err, HN_ERR_UNSUPPORTED, "kv: head dim %d is not a multiple of the %s/%s block", cfg->head_dim,
                       qt_name(cfg->type), qt_name(cfg->v_type));
    const int nsh = cfg->n_shards > 1 ? cfg->n_shards : 0;
    if (cfg->n_shards > KV_MAX_SHARDS || cfg->n_shards < 0 || (nsh && cfg->n_head_kv % nsh))
        return hn_errf(err, HN_ERR_INVALID, "kv: %d kv heads cannot be split into %d shards (at most %d, evenly)",
                       cfg->n_head_kv, cfg->n_shards, KV_MAX_SHARDS);
    if (nsh && cfg->state_bytes)
        return hn_errf(err, HN_ERR_UNSUPPORTED, "kv: a sharded cache holds no recurrent state (hybrid models)");
    for (int i = 0; i < nsh; i++)
        if (!cfg->shard_storage[i]) return hn_errf(err, HN_ERR_INVALID, "kv: shard %d has no storage", i);
    kv_cache *kv = hn_calloc(1, sizeof *kv);
    if (!kv) return hn_errf(err, HN_ERR_NOMEM, "kv: out of memory");
    kv->cfg = *cfg;
    kv->cfg.block_size = cfg_bs(cfg);
    layout(kv, &kv->cfg);
    int32_t nb = cfg->n_blocks;
    if (kv->block_bytes > SIZE_MAX / (size_t)nb) {
        hn_free(kv);
        return hn_errf(err, HN_ERR_RANGE, "kv: %d blocks overflow", (int)nb);
    }
    int32_t sb = cfg->slab_blocks;
    if (sb <= 0) {
        size_t fit = KV_SLAB_TARGET / kv->block_bytes;
        sb = fit < 1 ? 1 : fit > (size_t)nb ? nb : (int32_t)fit;
    }
    if (sb > nb) sb = nb;
    kv->slab_blocks = sb;
    kv->n_slabs = (nb + sb - 1) / sb;
    kv->storage = cfg->storage ? cfg->storage : kv_host_storage();
    size_t n = (size_t)nb;
    /* per slab, for the cap; the per-block metadata comes with the slabs (meta_resize) */
    kv->slab = hn_calloc((size_t)kv->n_slabs, sizeof *kv->slab);
    kv->slab_nfree = hn_calloc((size_t)kv->n_slabs, sizeof(int32_t));
    kv->slab_live = hn_calloc((size_t)kv->n_slabs, sizeof(int32_t));
    if (!kv->slab || !kv->slab_nfree || !kv->slab_live) {
        kv_free(kv);
        return hn_errf(err, HN_ERR_NOMEM, "kv: out of memory for %d slabs", (int)kv->n_slabs);
    }
    kv->range_bytes = kv->block_bytes * n;
    if (nsh) {
        /* the shards hold the pool; this cache holds the block ids */
        for (int i = 0; i < nsh; i++) {
            hn_err e = {0};
            if (!(kv->shard[i] = shard_new(kv, i, &e))) {
                kv_free(kv);
                return e.code ? hn_errf(err, e.code, "kv: shard %d: %s", i, e.msg) : hn_errf(err, HN_ERR_NOMEM, "kv: out of memory");
            }
        }
    } else {
        hn_status rst = kv->storage->reserve(kv->storage->ctx, kv->range_bytes, &kv->base, err);
        if (rst) {
            kv->base = NULL;
            kv_free(kv);
            return rst;
        }
    }
    hn_status rst;
    if (cfg->state_bytes) {
        size_t G = kv->storage->granule;
        int32_t ns = cfg->n_state_slots > 0 ? cfg->n_state_slots : 64;
        kv->state_slot_bytes = (cfg->state_bytes + G - 1) / G * G;
        if (ns > (1 << 20) || kv->state_slot_bytes > SIZE_MAX / 2 / (size_t)ns) {
            kv_free(kv);
            return hn_errf(err, HN_ERR_RANGE, "kv: %d state slots of %zu bytes overflow", (int)ns, cfg->state_bytes);
        }
        kv->n_state_slots = ns;
        kv->st_taken = hn_calloc((size_t)ns, 1);
        kv->ck_head[0] = kv->ck_tail[0] = kv->ck_head[1] = kv->ck_tail[1] = -1;
        if (!kv->st_taken) {
            kv_free(kv);
            return hn_errf(err, HN_ERR_NOMEM, "kv: out of memory");
        }
        rst = kv->storage->reserve(kv->storage->ctx, kv->state_slot_bytes * (size_t)ns, &kv->state_base, err);
        if (rst) {
            kv->state_base = NULL;
            kv_free(kv);
            return rst;
        }
    }
    kv->lru_head = kv->lru_tail = -1;
    *out = kv;
    return HN_OK;
}

void kv_free(kv_cache *kv) {
    if (!kv) return;
    if (kv->slab)
        for (int32_t s = 0; s < kv->n_slabs; s++)
            if (kv->slab[s]) slab_unmap(kv, s);
    hn_free(kv->slab);
    hn_free(kv->slab_nfree);
    hn_free(kv->slab_live);
    hn_free(kv->meta);
    hn_free(kv->ht);
    if (kv->base) kv->storage->release(kv->storage->ctx, kv->base, kv->range_bytes);
    for (int i = 0; i < KV_MAX_SHARDS; i++) {
        kv_cache *sh = kv->shard[i];
        if (!sh) continue;
        sh->storage->release(sh->storage->ctx, sh->base, sh->range_bytes);
        hn_free(sh->slab);
        hn_free(sh);
    }
    if (kv->state_base) {
        for (int32_t i = 0; i < kv->n_state_slots; i++)
            if (kv->st_taken[i]) kv_state_free(kv, i);
        kv->storage->release(kv->storage->ctx, kv->state_base, kv->state_slot_bytes * (size_t)kv->n_state_slots);
    }
    hn_free(kv->st_taken);
    hn_free(kv);
}

/* ---- blocks ---- */

int32_t kv_n_free(const kv_cache *kv) { return kv->n_free + kv->n_cached + (kv->cfg.n_blocks - kv->n_backed); }

static int32_t take_free(kv_cache *kv, int32_t s) {
    int32_t b = kv->free_ids[(size_t)s * (size_t)kv->slab_blocks + (size_t)--kv->slab_nfree[s]];
    kv->state[b] = KV_USED;
    kv->ref[b] = 1;
    kv->n_free--;
    kv->n_used++;
    kv->slab_live[s]++;
    return b;
}

/* Drops a cached block's publication: it leaves the LRU and the hash table. */
static void unpublish_cached(kv_cache *kv, int32_t b) {
    kv_ckpt_drop(kv, b); /* a checkpoint goes with its block */
    lru_unlink(kv, b);
    ht_remove(kv, b);
    kv->n_cached--;
    kv->evictions++;
}

int32_t kv_block_alloc(kv_cache *kv) {
    for (int32_t s = 0; s < kv->n_slabs; s++)
        if (kv->slab[s] && kv->slab_nfree[s] > 0) return take_free(kv, s);
    for (int32_t s = 0; s < kv->n_slabs; s++)
        if (!kv->slab[s]) {
            if (slab_map(kv, s)) return take_free(kv, s);
            break; /* out of memory: fall back to eviction */
        }
    int32_t b = kv->lru_head;
    if (b < 0) return -1;
    unpublish_cached(kv, b);
    kv->state[b] = KV_USED;
    kv->ref[b] = 1;
    kv->n_used++;
    return b;
}

/* Makes a block free (from used or cached) and unmaps its slab if it emptied. */
static void make_free(kv_cache *kv, int32_t b) {
    int32_t s = b / kv->slab_blocks;
    kv->state[b] = KV_FREE;
    kv->ref[b] = 0;
    kv->free_ids[(size_t)s * (size_t)kv->slab_blocks + (size_t)kv->slab_nfree[s]++] = b;
    kv->n_free++;
    if (--kv->slab_live[s] == 0) slab_emptied(kv, s);
}

void kv_block_release(kv_cache *kv, int32_t b) {
    if (b < 0 || b >= kv->n_meta || kv->state[b] != KV_USED || kv->ref[b] <= 0) return;
    if (--kv->ref[b] > 0) return;
    kv->n_used--;
    if (kv->pub[b]) {
        kv->state[b] = KV_CACHED;
        lru_push_tail(kv, b);
        kv->n_cached++;
    } else {
        make_free(kv, b);
    }
}

/* Takes a reference to a published block (reviving it if cached). */
static void block_ref(kv_cache *kv, int32_t b) {
    if (kv->state[b] == KV_CACHED) {
        lru_unlink(kv, b);
        kv->state[b] = KV_USED;
        kv->n_cached--;
        kv->n_used++;
    }
    kv->ref[b]++;
}

/* ---- sequences ---- */

hn_status kv_seq_init(kv_seq *s, const kv_cache *kv, int32_t max_tokens, hn_err *err) {
    memset(s, 0, sizeof *s);
    if (max_tokens <= 0) return hn_errf(err, HN_ERR_INVALID, "kv: sequence of %d tokens", (int)max_tokens);
    int bs = kv->cfg.block_size;
    int32_t cap = (int32_t)(((int64_t)max_tokens + bs - 1) / bs);
    s->blocks = hn_malloc(sizeof(int32_t) * (size_t)cap);
    if (!s->blocks) return hn_errf(err, HN_ERR_NOMEM, "kv: out of memory");
    s->cap_blocks = cap;
    s->state = -1;
    return HN_OK;
}

void kv_seq_free(kv_seq *s, kv_cache *kv) {
    if (!s) return;
    if (kv) {
        kv_seq_truncate(kv, s, 0);
        kv_seq_state_release(kv, s);
    }
    hn_free(s->blocks);
    memset(s, 0, sizeof *s);
    s->state = -1;
}

hn_status kv_seq_reserve(kv_cache *kv, kv_seq *s, int32_t n_tokens, hn_err *err) {
    int bs = kv->cfg.block_size;
    int32_t need = (int32_t)(((int64_t)n_tokens + bs - 1) / bs);
    if (need > s->cap_blocks)
        return hn_errf(err, HN_ERR_RANGE, "kv: %d positions exceed the sequence's capacity of %d",
                       (int)n_tokens, (int)s->cap_blocks * bs);
    while (s->n_blocks < need) {
        int32_t b = kv_block_alloc(kv);
        if (b < 0) return hn_errf(err, HN_ERR_FULL, "kv: block pool exhausted (%d blocks)", (int)kv->cfg.n_blocks);
        s->blocks[s->n_blocks++] = b;
    }
    return HN_OK;
}

void kv_seq_truncate(kv_cache *kv, kv_seq *s, int32_t n_tokens) {
    if (n_tokens < 0) n_tokens = 0;
    int bs = kv->cfg.block_size;
    int32_t keep = (int32_t)(((int64_t)n_tokens + bs - 1) / bs);
    if (keep > s->n_blocks) keep = s->n_blocks;
    if (n_tokens % bs && keep > 0 && keep - 1 < s->n_hashed && keep * bs > n_tokens) {
        keep--; /* never write into a published block */
        n_tokens = keep * bs;
    }
    while (s->n_blocks > keep) kv_block_release(kv, s->blocks[--s->n_blocks]);
    if (s->n_hashed > s->n_blocks) s->n_hashed = s->n_blocks;
    if (s->n_tokens > n_tokens) s->n_tokens = n_tokens;
}

/* ---- recurrent-state slots ---- */

int32_t kv_state_alloc(kv_cache *kv) {
    for (int32_t i = 0; i < kv->n_state_slots; i++) {
        if (kv->st_taken[i]) continue;
        hn_err e;
        if (kv->storage->map(kv->storage->ctx, kv->state_base, (size_t)i * kv->state_slot_bytes, kv->state_slot_bytes,
                             &e))
            return -1;
        kv->st_taken[i] = 1;
        kv->n_state_taken++;
        kv->state_bytes += kv->state_slot_bytes;
        if (kv->state_bytes > kv->state_peak_bytes) kv->state_peak_bytes = kv->state_bytes;
        return i;
    }
    return -1;
}

void kv_state_free(kv_cache *kv, int32_t slot) {
    if (slot < 0 || slot >= kv->n_state_slots || !kv->st_taken[slot]) return;
    kv->storage->unmap(kv->storage->ctx, kv->state_base, (size_t)slot * kv->state_slot_bytes, kv->state_slot_bytes);
    kv->st_taken[slot] = 0;
    kv->n_state_taken--;
    kv->state_bytes -= kv->state_slot_bytes;
}

hn_status kv_seq_state_acquire(kv_cache *kv, kv_seq *s, hn_err *err) {
    if (!kv->state_slot_bytes) return hn_errf(err, HN_ERR_INVALID, "kv: this cache holds no recurrent state");
    if (s->state >= 0) return HN_OK;
    int32_t slot = kv_state_alloc(kv);
    if (slot < 0)
        return hn_errf(err, HN_ERR_FULL, "kv: no recurrent-state slot left (%d of %zu bytes)", (int)kv->n_state_slots,
                       kv->state_slot_bytes);
    s->state = slot;
    s->state_len = 0;
    return HN_OK;
}

void kv_seq_state_release(kv_cache *kv, kv_seq *s) {
    if (s->state >= 0) kv_state_free(kv, s->state);
    s->state = -1;
    s->state_len = 0;
}

/* ---- checkpoints ---- */

/* Which LRU a checkpoint kind lives on: 0 ladder (dropped first), 1 kept. */
static int ck_list(int kind) { return kind != KV_CK_LADDER; }

static void ck_unlink(kv_cache *kv, int32_t b) {
    int l = ck_list(kv->ck_kind[b]);
    int32_t p = kv->ck_prev[b], n = kv->ck_next[b];
    if (p >= 0) kv->ck_next[p] = n;
    else kv->ck_head[l] = n;
    if (n >= 0) kv->ck_prev[n] = p;
    else kv->ck_tail[l] = p;
    kv->ck_prev[b] = kv->ck_next[b] = -1;
}

static void ck_push_tail(kv_cache *kv, int32_t b) {
    int l = ck_list(kv->ck_kind[b]);
    kv->ck_prev[b] = kv->ck_tail[l];
    kv->ck_next[b] = -1;
    if (kv->ck_tail[l] >= 0) kv->ck_next[kv->ck_tail[l]] = b;
    else kv->ck_head[l] = b;
    kv->ck_tail[l] = b;
}

/* Moves a held checkpoint to `kind` (and to its LRU's tail). */
static void ck_set_kind(kv_cache *kv, int32_t b, int kind) {
    ck_unlink(kv, b);
    kv->ck_kind[b] = (uint8_t)kind;
    ck_push_tail(kv, b);
}

void kv_ckpt_drop(kv_cache *kv, int32_t b) {
    if (!kv->ckpt || b < 0 || b >= kv->n_meta || kv->ckpt[b] < 0) return;
    ck_unlink(kv, b);
    kv_state_free(kv, kv->ckpt[b]);
    kv->ckpt[b] = -1;
    kv->ck_kind[b] = KV_CK_LADDER;
    kv->ck_conv[b] = 0;
    kv->n_ckpt--;
}

void kv_ckpt_pass(kv_cache *kv, int32_t b) {
    if (kv->ckpt && b >= 0 && b < kv->n_meta && kv->ckpt[b] >= 0 && kv->ck_kind[b] == KV_CK_TIP)
        ck_set_kind(kv, b, KV_CK_LADDER);
}

void kv_ckpt_tag(kv_cache *kv, int32_t b, uint64_t conv, int32_t pos) {
    if (!kv->ckpt || b < 0 || b >= kv->n_meta || kv->ckpt[b] < 0) return;
    kv->ck_conv[b] = conv;
    kv->ck_pos[b] = pos;
}

uint64_t kv_ckpt_conv(const kv_cache *kv, int32_t b) {
    if (!kv->ckpt || b < 0 || b >= kv->n_meta || kv->ckpt[b] < 0 || kv->ck_kind[b] != KV_CK_TIP) return 0;
    return kv->ck_conv[b];
}

int32_t kv_ckpt_pass_past(kv_cache *kv, uint64_t conv, int32_t pos) {
    int32_t n = 0;
    if (!kv->ckpt || !conv) return 0;
    for (int32_t b = kv->ck_head[1], nx; b >= 0; b = nx) {
        nx = kv->ck_next[b];
        if (kv->ck_kind[b] != KV_CK_TIP || kv->ck_conv[b] != conv || kv->ck_pos[b] <= pos) continue;
        ck_unlink(kv, b); /* a ladder checkpoint now, the first to go */
        kv->ck_kind[b] = KV_CK_LADDER;
        kv->ck_prev[b] = -1;
        kv->ck_next[b] = kv->ck_head[0];
        if (kv->ck_head[0] >= 0) kv->ck_prev[kv->ck_head[0]] = b;
        else kv->ck_tail[0] = b;
        kv->ck_head[0] = b;
        n++;
    }
    return n;
}

bool kv_ckpt_touch(kv_cache *kv, int32_t b, kv_ck_kind kind) {
    if (!kv->ckpt || b < 0 || b >= kv->n_meta || kv->ckpt[b] < 0) return false;
    ck_set_kind(kv, b, kind > kv->ck_kind[b] ? (int)kind : kv->ck_kind[b]);
    return true;
}

int32_t kv_ckpt_take(kv_cache *kv, int32_t b, kv_ck_kind kind) {
    if (!kv->ckpt || kv->cfg.n_ckpt <= 0 || b < 0 || b >= kv->n_meta || !kv->pub[b]) return -1;
    if (kv->ckpt[b] >= 0) { /* one per block; a stronger kind keeps it longer */
        if (kind > kv->ck_kind[b]) ck_set_kind(kv, b, kind);
        return -1;
    }
    if (kv->n_ckpt >= kv->cfg.n_ckpt) {
        int32_t victim = kv->ck_head[0] >= 0 ? kv->ck_head[0] : kind != KV_CK_LADDER ? kv->ck_head[1] : -1;
        if (victim < 0) return -1; /* every held one is kept: a ladder checkpoint does not displace them */
        kv_ckpt_drop(kv, victim);
        kv->ckpt_evictions++;
    }
    int32_t slot = kv_state_alloc(kv);
    if (slot < 0) return -1;
    kv->ckpt[b] = slot;
    kv->ck_kind[b] = (uint8_t)kind;
    kv->n_ckpt++;
    ck_push_tail(kv, b);
    return slot;
}

int32_t kv_seq_match_ckpt(kv_cache *kv, kv_seq *s, const int32_t *tokens, int32_t n_max, int32_t *slot) {
    *slot = -1;
    int32_t before = s->n_blocks, n0 = s->n_tokens;
    int32_t got = kv_seq_match(kv, s, tokens, n_max);
    if (!got || !kv->ckpt) return 0;
    int32_t keep = s->n_blocks;
    while (keep > before && kv->ckpt[s->blocks[keep - 1]] < 0) keep--;
    int bs = kv->cfg.block_size;
    if (keep == before) {
        kv_seq_truncate(kv, s, n0); /* no state to resume from: give the blocks back */
        kv->hit_blocks -= (uint64_t)(got / bs);
        return 0;
    }
    int32_t b = s->blocks[keep - 1];
    kv->hit_blocks -= (uint64_t)(s->n_blocks - keep);
    kv_seq_truncate(kv, s, keep * bs);
    /* the tips this sequence resumes past are interior now (an earlier turn's prompt end) */
    for (int32_t i = before; i < keep - 1; i++) kv_ckpt_pass(kv, s->blocks[i]);
    *slot = kv->ckpt[b];
    ck_unlink(kv, b); /* used: to its LRU's tail */
    ck_push_tail(kv, b);
    kv->ckpt_hits++;
    return keep * bs - n0;
}

/* ---- prefix cache ---- */

/* The parent of block 0: the root seed, salted by a non-zero namespace. */
static uint64_t seq_root(const kv_seq *s) {
    return s->ns ? XXH3_64bits_withSeed(&s->ns, sizeof s->ns, KV_ROOT_SEED) : KV_ROOT_SEED;
}

static uint64_t seq_parent(const kv_cache *kv, const kv_seq *s) {
    return s->n_hashed ? kv->hash[s->blocks[s->n_hashed - 1]] : seq_root(s);
}

int32_t kv_seq_match(kv_cache *kv, kv_seq *s, const int32_t *tokens, int32_t n_max) {
    int bs = kv->cfg.block_size;
    if (s->n_tokens != s->n_hashed * bs || s->n_blocks != s->n_hashed) return 0;
    uint64_t parent = seq_parent(kv, s);
    int32_t added = 0;
    while ((int64_t)(s->n_hashed + 1) * bs <= n_max && s->n_blocks < s->cap_blocks) {
        const int32_t *toks = tokens + (size_t)s->n_hashed * (size_t)bs;
        uint64_t h = chain_hash(kv, parent, toks);
        int32_t b = ht_find(kv, h, parent, toks);
        if (b < 0) break;
        block_ref(kv, b);
        s->blocks[s->n_blocks++] = b;
        s->n_hashed++;
        s->n_tokens += bs;
        added += bs;
        kv->hit_blocks++;
        parent = h;
    }
    return added;
}

void kv_seq_commit(kv_cache *kv, kv_seq *s, const int32_t *tokens, int32_t n) {
    int bs = kv->cfg.block_size;
    int32_t lim = n < s->n_tokens ? n : s->n_tokens;
    int32_t full = lim / bs;
    if (full > s->n_blocks) full = s->n_blocks;
    uint64_t parent = seq_parent(kv, s);
    while (s->n_hashed < full) {
        int32_t i = s->n_hashed, b = s->blocks[i];
        const int32_t *toks = tokens + (size_t)i * (size_t)bs;
        uint64_t h = chain_hash(kv, parent, toks);
        int32_t e = ht_find(kv, h, parent, toks);
        if (e >= 0 && e != b) {
            /* computed twice (two sequences at once): keep the published copy */
            block_ref(kv, e);
            s->blocks[i] = e;
            kv_block_release(kv, b);
        } else if (e < 0) {
            kv->hash[b] = h;
            kv->parent[b] = parent;
            memcpy(kv->btok + (size_t)b * (size_t)bs, toks, sizeof(int32_t) * (size_t)bs);
            ht_insert(kv, b);
        }
        s->n_hashed++;
        parent = h;
    }
}

uint64_t kv_seq_next_hash(const kv_cache *kv, const kv_seq *s, const int32_t *tokens, int32_t n) {
    int bs = kv->cfg.block_size;
    if (s->n_tokens != s->n_hashed * bs || (int64_t)(s->n_hashed + 1) * bs > n) return 0;
    return chain_hash(kv, seq_parent(kv, s), tokens + (size_t)s->n_hashed * (size_t)bs);
}

bool kv_seq_next_cached(const kv_cache *kv, const kv_seq *s, const int32_t *tokens, int32_t n) {
    uint64_t h = kv_seq_next_hash(kv, s, tokens, n);
    if (!h) return false;
    return ht_find(kv, h, seq_parent(kv, s), tokens + (size_t)s->n_hashed * (size_t)kv->cfg.block_size) >= 0;
}

void kv_trim(kv_cache *kv, int32_t keep_cached) {
    if (keep_cached < 0) keep_cached = 0;
    while (kv->n_cached > keep_cached && kv->lru_head >= 0) {
        int32_t b = kv->lru_head;
        unpublish_cached(kv, b);
        make_free(kv, b);
    }
    for (int32_t s = 0; s < kv->n_slabs; s++)
        if (kv->slab[s] && kv->slab_live[s] == 0) slab_unmap(kv, s);
    int32_t hi = kv->meta_slabs; /* the metadata down to the highest mapped slab */
    while (hi > 0 && !kv->slab[hi - 1]) hi--;
    if (hi < kv->meta_slabs) meta_resize(kv, hi); /* out of memory: it stays as it was */
}

void kv_get_stats(const kv_cache *kv, kv_stats *o) {
    o->blocks_max = kv->cfg.n_blocks;
    o->blocks_backed = kv->n_backed;
    o->blocks_used = kv->n_used;
    o->blocks_cached = kv->n_cached;
    o->blocks_free = kv->n_free;
    o->slabs_mapped = kv->n_mapped_slabs;
    o->bytes = kv->bytes;
    o->peak_bytes = kv->peak_bytes;
    o->meta_bytes = kv->meta_bytes;
    o->total_peak_bytes = kv->total_peak_bytes;
    o->evictions = kv->evictions;
    o->hit_blocks = kv->hit_blocks;
    o->state_slots_max = kv->n_state_slots;
    o->state_slots_live = kv->n_state_taken;
    o->state_bytes = kv->state_bytes;
    o->state_peak_bytes = kv->state_peak_bytes;
    o->ckpt_max = kv->cfg.state_bytes ? kv->cfg.n_ckpt : 0;
    o->ckpts = kv->n_ckpt;
    o->ckpt_hits = kv->ckpt_hits;
    o->ckpt_evictions = kv->ckpt_evictions;
}

/* ---- invariants (tests) ---- */

hn_status kv_check(const kv_cache *kv, const kv_seq *const *seqs, int n_seqs, hn_err *err) {
    const int32_t nb = kv->cfg.n_blocks, nm = kv->n_meta, sb = kv->slab_blocks;
    int32_t cnt[4] = {0};
    /* the metadata covers slabs [0, meta_slabs), each slab above it unmapped */
    const int32_t want_nm = (int64_t)kv->meta_slabs * sb < nb ? kv->meta_slabs * sb : nb;
    const uint32_t hb = ht_buckets(nm);
    if (kv->meta_slabs < 0 || kv->meta_slabs > kv->n_slabs || nm != want_nm || !kv->meta != !kv->meta_slabs ||
        !kv->ht != !hb || (kv->ht && kv->ht_mask + 1 != hb) ||
        kv->meta_bytes != meta_per_block(kv) * (size_t)kv->meta_slabs * (size_t)sb + sizeof(int32_t) * hb)
        return hn_errf(err, HN_ERR_INTERNAL, "kv: metadata for %d slabs (%d blocks, %zu bytes, %u buckets) is wrong",
                       (int)kv->meta_slabs, (int)nm, kv->meta_bytes, kv->ht ? kv->ht_mask + 1 : 0);
    if (kv->bytes + kv->meta_bytes > kv->total_peak_bytes)
        return hn_errf(err, HN_ERR_INTERNAL, "kv: %zu + %zu bytes above the peak %zu", kv->bytes, kv->meta_bytes,
                       kv->total_peak_bytes);
    for (int32_t b = 0; b < nm; b++) {
        int st = kv->state[b];
        if (st > KV_CACHED) return hn_errf(err, HN_ERR_INTERNAL, "kv: block %d has state %d", (int)b, st);
        cnt[st]++;
        bool mapped = kv->slab[b / kv->slab_blocks] != NULL;
        if (mapped != (st != KV_UNBACKED))
            return hn_errf(err, HN_ERR_INTERNAL, "kv: block %d state %d in a %smapped slab", (int)b, st, mapped ? "" : "un");
        if ((st == KV_USED) != (kv->ref[b] > 0))
            return hn_errf(err, HN_ERR_INTERNAL, "kv: block %d state %d with ref %d", (int)b, st, (int)kv->ref[b]);
        if (st == KV_CACHED && !kv->pub[b]) return hn_errf(err, HN_ERR_INTERNAL, "kv: cached block %d unpublished", (int)b);
        if ((st == KV_FREE || st == KV_UNBACKED) && kv->pub[b])
            return hn_errf(err, HN_ERR_INTERNAL, "kv: free block %d still published", (int)b);
    }
    if (cnt[KV_FREE] != kv->n_free || cnt[KV_USED] != kv->n_used || cnt[KV_CACHED] != kv->n_cached ||
        nm - cnt[KV_UNBACKED] != kv->n_backed)
        return hn_errf(err, HN_ERR_INTERNAL, "kv: counters free %d used %d cached %d backed %d, states say %d %d %d %d",
                       (int)kv->n_free, (int)kv->n_used, (int)kv->n_cached, (int)kv->n_backed, (int)cnt[KV_FREE],
                       (int)cnt[KV_USED], (int)cnt[KV_CACHED], (int)(nm - cnt[KV_UNBACKED]));
    size_t bytes = 0;
    int32_t mapped = 0;
    for (int32_t s = 0; s < kv->n_slabs; s++) {
        int32_t live = 0, nfree = 0, sz = slab_size(kv, s);
        if (s >= kv->meta_slabs && kv->slab[s])
            return hn_errf(err, HN_ERR_INTERNAL, "kv: slab %d mapped above the metadata's %d slabs", (int)s,
                           (int)kv->meta_slabs);
        for (int32_t i = 0; i < sz && s < kv->meta_slabs; i++) {
            int st = kv->state[s * kv->slab_blocks + i];
            live += st == KV_USED || st == KV_CACHED;
            nfree += st == KV_FREE;
        }
        if (!kv->slab[s]) {
            if (kv->slab_nfree[s]) return hn_errf(err, HN_ERR_INTERNAL, "kv: unmapped slab %d has free blocks", (int)s);
            continue;
        }
        mapped++;
        bytes += (size_t)sz * kv->block_bytes;
        if (live != kv->slab_live[s] || nfree != kv->slab_nfree[s])
            return hn_errf(err, HN_ERR_INTERNAL, "kv: slab %d live %d free %d, counted %d %d", (int)s,
                           (int)kv->slab_live[s], (int)kv->slab_nfree[s], (int)live, (int)nfree);
        const int32_t *stack = kv->free_ids + (size_t)s * (size_t)kv->slab_blocks;
        for (int32_t i = 0; i < nfree; i++) {
            int32_t b = stack[i];
            if (b / kv->slab_blocks != s || kv->state[b] != KV_FREE)
                return hn_errf(err, HN_ERR_INTERNAL, "kv: slab %d free stack holds block %d", (int)s, (int)b);
            for (int32_t j = 0; j < i; j++)
                if (stack[j] == b) return hn_errf(err, HN_ERR_INTERNAL, "kv: block %d twice on a free stack", (int)b);
        }
    }
    if (bytes != kv->bytes || mapped != kv->n_mapped_slabs)
        return hn_errf(err, HN_ERR_INTERNAL, "kv: %zu bytes in %d slabs, counted %zu in %d", kv->bytes,
                       (int)kv->n_mapped_slabs, bytes, (int)mapped);
    int32_t n_lru = 0, prev = -1;
    for (int32_t b = kv->lru_head; b >= 0; b = kv->lru_next[b]) {
        if (b >= nm || kv->state[b] != KV_CACHED || kv->lru_prev[b] != prev || ++n_lru > nb)
            return hn_errf(err, HN_ERR_INTERNAL, "kv: LRU list broken at block %d", (int)b);
        prev = b;
    }
    if (prev != kv->lru_tail || n_lru != kv->n_cached)
        return hn_errf(err, HN_ERR_INTERNAL, "kv: LRU holds %d blocks, %d cached", (int)n_lru, (int)kv->n_cached);
    int32_t n_pub = 0, n_chain = 0;
    for (int32_t b = 0; b < nm; b++) n_pub += kv->pub[b];
    for (uint32_t i = 0; kv->ht && i <= kv->ht_mask; i++)
        for (int32_t b = kv->ht[i]; b >= 0; b = kv->ht_next[b]) {
            if (b >= nm || !kv->pub[b] || ((uint32_t)kv->hash[b] & kv->ht_mask) != i || ++n_chain > nb)
                return hn_errf(err, HN_ERR_INTERNAL, "kv: hash table bucket %u holds block %d wrongly", i, (int)b);
            if (ht_find(kv, kv->hash[b], kv->parent[b], kv->btok + (size_t)b * (size_t)kv->cfg.block_size) != b)
                return hn_errf(err, HN_ERR_INTERNAL, "kv: block %d published twice under one hash", (int)b);
        }
    if (n_chain != n_pub)
        return hn_errf(err, HN_ERR_INTERNAL, "kv: %d published blocks, %d in the hash table", (int)n_pub, (int)n_chain);
    if (kv->cfg.state_bytes) {
        int32_t n_ck = 0, n_lru = 0;
        for (int32_t b = 0; b < nm; b++) {
            if (kv->ckpt[b] < 0) continue;
            n_ck++;
            if (!kv->pub[b]) return hn_errf(err, HN_ERR_INTERNAL, "kv: unpublished block %d has a checkpoint", (int)b);
            if (kv->ckpt[b] >= kv->n_state_slots || !kv->st_taken[kv->ckpt[b]])
                return hn_errf(err, HN_ERR_INTERNAL, "kv: block %d's checkpoint slot %d is not taken", (int)b,
                               (int)kv->ckpt[b]);
        }
        for (int l = 0; l < 2; l++)
            for (int32_t b = kv->ck_head[l]; b >= 0 && n_lru <= nb; b = kv->ck_next[b]) {
                if (b >= nm) return hn_errf(err, HN_ERR_INTERNAL, "kv: checkpoint LRU %d holds block %d", l, (int)b);
                if (kv->ckpt[b] < 0 || ck_list(kv->ck_kind[b]) != l || kv->ck_kind[b] > KV_CK_BRANCH)
                    return hn_errf(err, HN_ERR_INTERNAL, "kv: block %d on checkpoint LRU %d (kind %d, slot %d)",
                                   (int)b, l, (int)kv->ck_kind[b], (int)kv->ckpt[b]);
                n_lru++;
            }
        if (n_ck != kv->n_ckpt || n_lru != n_ck || n_ck > kv->cfg.n_ckpt)
            return hn_errf(err, HN_ERR_INTERNAL, "kv: %d checkpoints, %d counted, %d on the LRU, budget %d", (int)n_ck,
                           (int)kv->n_ckpt, (int)n_lru, (int)kv->cfg.n_ckpt);
    }
    if (!seqs) return HN_OK;
    int32_t *refs = hn_calloc((size_t)nm + 1, sizeof(int32_t));
    if (!refs) return hn_errf(err, HN_ERR_NOMEM, "kv: out of memory");
    hn_status st = HN_OK;
    for (int i = 0; i < n_seqs && !st; i++) {
        const kv_seq *s = seqs[i];
        if (s->n_hashed > s->n_blocks || s->n_tokens > s->n_blocks * kv->cfg.block_size || s->n_blocks > s->cap_blocks)
            st = hn_errf(err, HN_ERR_INTERNAL, "kv: sequence %d: %d tokens, %d blocks, %d published", i, (int)s->n_tokens,
                         (int)s->n_blocks, (int)s->n_hashed);
        for (int32_t j = 0; j < s->n_blocks && !st; j++) {
            int32_t b = s->blocks[j];
            if (b < 0 || b >= nm || kv->state[b] != KV_USED)
                st = hn_errf(err, HN_ERR_INTERNAL, "kv: sequence %d holds block %d in state %d", i, (int)b,
                             b >= 0 && b < nm ? kv->state[b] : -1);
            else if (j < s->n_hashed && !kv->pub[b])
                st = hn_errf(err, HN_ERR_INTERNAL, "kv: sequence %d block %d should be published", i, (int)j);
            else refs[b]++;
        }
    }
    for (int32_t b = 0; b < nm && !st; b++)
        if (refs[b] != kv->ref[b])
            st = hn_errf(err, HN_ERR_INTERNAL, "kv: block %d has ref %d, held %d times", (int)b, (int)kv->ref[b],
                         (int)refs[b]);
    hn_free(refs);
    return st;
}

/* ---- host storage ---- */

static hn_status host_reserve(void *ctx, size_t bytes, void **base, hn_err *err) {
    (void)ctx;
    *base = hn_vm_reserve(bytes);
    if (!*base) return hn_errf(err, HN_ERR_NOMEM, "kv: cannot reserve %zu bytes of address space", bytes);
    return HN_OK;
}

static hn_status host_map(void *ctx, void *base, size_t off, size_t len, hn_err *err) {
    (void)ctx;
    if (!hn_vm_commit((unsigned char *)base + off, len))
        return hn_errf(err, HN_ERR_NOMEM, "kv: cannot back %zu bytes", len);
    return HN_OK;
}

static void host_unmap(void *ctx, void *base, size_t off, size_t len) {
    (void)ctx;
    hn_vm_decommit((unsigned char *)base + off, len);
}

static void host_release(void *ctx, void *base, size_t bytes) {
    (void)ctx;
    hn_vm_release(base, bytes);
}

static kv_storage host_storage = {.reserve = host_reserve, .map = host_map, .unmap = host_unmap, .release = host_release};
static pthread_once_t host_once = PTHREAD_ONCE_INIT;
static void host_init(void) { host_storage.granule = hn_page_size(); }

const kv_storage *kv_host_storage(void) {
    pthread_once(&host_once, host_init);
    return &host_storage;
}
