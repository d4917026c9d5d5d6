/* kv.h: the paged KV cache with its prefix cache.
 *
 * Memory is a pool of fixed-size blocks. A block holds the keys and values of
 * `block_size` consecutive positions of one sequence, for every layer:
 *
 *   block = [layer][K rows 0..block_size)[V rows 0..block_size)
 *   K row = n_head_kv * head_dim elements of `type`   (k_row_bytes)
 *   V row = n_head_kv * head_dim elements of `v_type` (v_row_bytes)
 *
 * Elements are f32, f16 or q8_0 for K and f32, f16, q8_0, q4_0 or q4_1 for V
 * (q8_0 K with q4_0/q4_1 V is the "8-bit K, 4-bit V" mode); one head's part of
 * a row is contiguous (head_dim is a multiple of 32 for the block types).
 *
 * Elastic memory. Blocks live in slabs of `slab_blocks` consecutive blocks,
 * each backed (kv_storage.map) when needed inside the one reserved range. A slab is mapped when the first of its blocks is
 * needed and unmapped when its last block becomes free again (one empty slab
 * is kept as a spare), so memory follows what the sequences hold. n_blocks is
 * the cap: the most blocks the pool may ever map. Block ids are
 * slab * slab_blocks + index; new blocks come from the lowest slab with room,
 * which packs live data into few slabs.
 *
 * Prefix cache. A full block can be published under a chained hash:
 *   hash(block i) = XXH3_64(tokens of block i, seed = hash(block i-1))
 * so a hash names the block's tokens AND everything before them (and the
 * sequence's namespace, kv_seq.ns, which salts the parent of block 0: blocks
 * of one namespace are never found from another). Published
 * blocks are refcounted and shared by every sequence whose tokens start the
 * same way, without copies (a sequence never writes into a full block, so a
 * shared block is read-only by construction). A block whose last reference
 * goes away stays in the hash table as "cached" on an LRU list until the pool
 * needs its memory: allocation takes free blocks first, then maps a new slab
 * (under the cap), then evicts the least recently released cached block.
 * Sequences release their blocks tail first, so the tail of a conversation is
 * evicted before the head it shares with others. Every block is in exactly
 * one state: unbacked (its slab is not mapped), free, used (ref > 0) or cached
 * (ref == 0, hashed, on the LRU list).
 *
 * A sequence (kv_seq) owns a block table: block ids in position order, so
 * position p lives in blocks[p / block_size], slot p % block_size. The bytes
 * belong to the backend (kv_storage): kv/ reserves one range and never reads
 * or writes it; the backend stores and reads K/V (with the element
 * conversions) through the kv_block_* address math below.
 *
 * Block metadata. Each block's bookkeeping (state, refcount, LRU links, its
 * hash, parent and tokens once published, its checkpoint) lives in one heap
 * allocation that covers slabs [0, meta_slabs), grown when a slab above it
 * is mapped (to that slab, or an eighth more) and shrunk by kv_trim to the
 * highest mapped slab; the hash table is sized by the blocks covered and
 * rebuilt when that size changes. So metadata follows the mapped slabs, not
 * the cap (only the per-slab arrays, 16 bytes a slab, are sized for the cap
 * at create). Blocks never move: a block id indexes the arrays wherever they
 * are, and no pointer into them is kept across a call that maps a slab or
 * trims. A growth that fails fails the slab's mapping (the pool is full).
 *
 * Nothing here allocates heap memory once the cache and a kv_seq exist,
 * except mapping a slab (which may grow the metadata) and kv_trim (which may
 * shrink it). Not thread-safe: one engine thread owns the cache. */
#ifndef HN_KV_H
#define HN_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../core/status.h"
#include "../quant/blocks.h"

#define KV_DEFAULT_BLOCK 16
/* most shards of a sharded pool (tensor parallel ranks) */
#define KV_MAX_SHARDS 8

/* Where the pool's bytes live: provided by the backend (be_ops.kv_storage),
 * so that they are host memory on the CPU and device memory on a GPU. kv/
 * reserves one virtual range for the whole cap at create (block b at
 * base + b * block_bytes, always) and maps physical memory into it, in
 * granule-aligned pieces, as slabs are needed, unmapping them as slabs empty.
 * kv/ never dereferences base. */
typedef struct kv_storage {
    void *ctx;
    size_t granule;  /* mapping granularity in bytes (a power of two) */
    /* Reserves `bytes` of address space (maps nothing); *base its start. */
    hn_status (*reserve)(void *ctx, size_t bytes, void **base, hn_err *err);
    /* Backs [off, off + len) with memory (granule-aligned; fresh memory reads
     * zero, but kv/ assumes nothing of a block's contents). */
    hn_status (*map)(void *ctx, void *base, size_t off, size_t len, hn_err *err);
    /* Gives [off, off + len) back (granule-aligned); its contents are lost. */
    void (*unmap)(void *ctx, void *base, size_t off, size_t len);
    /* Releases the whole range (everything unmapped first). */
    void (*release)(void *ctx, void *base, size_t bytes);
} kv_storage;

/* Host memory from core/alloc (hn_vm_*), with transparent huge pages: the CPU backend's storage. */
const kv_storage *kv_host_storage(void);

typedef struct kv_config {
    int n_layer;
    int n_head_kv;
    int head_dim;
    int block_size;      /* positions per block; 0 means KV_DEFAULT_BLOCK */
    int32_t n_blocks;    /* the cap: most blocks the pool may map */
    qt_type type;        /* K element type: QT_F32, QT_F16 or QT_Q8_0 */
    qt_type v_type;      /* V element type: QT_F32 (0, the default), QT_F16, QT_Q8_0, QT_Q4_0, QT_Q4_1 */
    int32_t slab_blocks; /* blocks per slab; 0: as many as fit about 32 MiB (at least 1) */
    const kv_storage *storage; /* NULL: kv_host_storage() */
    /* Recurrent state (hybrid models): bytes of one sequence's state (conv
     * windows + delta states of every recurrent layer; the model's layout),
     * 0 for none, and the most state slots mapped at once (live sequences
     * and checkpoints together; 0: 64). */
    size_t state_bytes;
    int32_t n_state_slots;
    /* the most state checkpoints kept (their own budget, inside
     * n_state_slots; 0: none, no prefix cache for the recurrent state) */
    int32_t n_ckpt;
    /* Sharded by kv head (tensor parallel: DESIGN.md, "Several devices"):
     * n_shards > 1 splits every block's kv heads evenly over n_shards
     * storages (shard_storage[i]: rank i's backend's). Shard i holds kv
     * heads [i H / n, (i + 1) H / n) of every layer as a pool of H / n
     * heads whose block b is this cache's block b: block ids, block tables,
     * refcounts and the prefix cache stay one (this cache's), a slab is
     * mapped in every shard at once, and the backends read and write
     * through the shards (kv_shard). This cache then reserves no pool range
     * of its own; `storage` is unused. 0 or 1: not sharded. No recurrent
     * state (state_bytes 0). */
    int n_shards;
    const kv_storage *shard_storage[KV_MAX_SHARDS];
} kv_config;

/* Engine-facing counters (blocks and bytes now, plus totals since creation). */
typedef struct kv_stats {
    int32_t blocks_max;     /* the cap */
    int32_t blocks_backed;  /* in mapped slabs */
    int32_t blocks_used;    /* ref > 0 */
    int32_t blocks_cached;  /* ref == 0, reusable prefix */
    int32_t blocks_free;    /* mapped, holding nothing */
    int32_t slabs_mapped;
    size_t bytes;           /* slab memory mapped now */
    size_t peak_bytes;      /* the most `bytes` has been */
    size_t meta_bytes;      /* heap of the block metadata now (follows the mapped slabs; not in `bytes`) */
    size_t total_peak_bytes; /* the most bytes + meta_bytes has been */
    uint64_t evictions;     /* cached blocks reclaimed */
    uint64_t hit_blocks;    /* blocks reused by kv_seq_match */
    /* recurrent-state slots (hybrid models; all 0 otherwise) */
    int32_t state_slots_max;   /* the cap */
    int32_t state_slots_live;  /* held by sequences */
    size_t state_bytes;        /* state slots mapped now, live and checkpoints (not in `bytes`) */
    size_t state_peak_bytes;
    int32_t ckpt_max, ckpts;   /* checkpoint budget and checkpoints held */
    uint64_t ckpt_hits;        /* states restored from a checkpoint (kv_seq_match_ckpt) */
    uint64_t ckpt_evictions;   /* dropped by the budget's LRU (not with their block) */
} kv_stats;

typedef struct kv_cache {
    kv_config cfg;
    size_t row_elems;      /* n_head_kv * head_dim: one position's K (or V) of one layer */
    size_t k_row_bytes, v_row_bytes;
    size_t k_head_bytes, v_head_bytes; /* one kv head's part of a row */
    size_t layer_bytes;    /* K and V of one layer within a block */
    size_t block_bytes;
    int32_t slab_blocks, n_slabs;
    const kv_storage *storage;
    void *base;            /* the reserved range: block b at base + b * block_bytes (backend memory) */
    size_t range_bytes;    /* n_blocks * block_bytes */
    unsigned char **slab;  /* [n_slabs] base + the slab's offset while mapped, NULL while not */
    /* sharded (cfg.n_shards > 1): the shards, each a cache of the layout
     * fields above (its own base, row and block bytes, slab pointers) and
     * nothing else; base is NULL here */
    struct kv_cache *shard[KV_MAX_SHARDS];
    /* recurrent-state slots: slot i at state_base + i * state_slot_bytes
     * (backend memory, mapped while the slot is taken) */
    void *state_base;
    size_t state_slot_bytes;   /* cfg.state_bytes rounded up to the storage granule; 0: no state */
    int32_t n_state_slots;
    /* private to kv.c from here on */
    uint8_t *st_taken;     /* [n_state_slots] */
    int32_t n_state_taken;
    size_t state_bytes, state_peak_bytes;
    int32_t *slab_nfree;   /* [n_slabs] free blocks in each mapped slab */
    int32_t *slab_live;    /* [n_slabs] used + cached blocks in each slab */
    /* The block metadata (see the top): arrays of meta_slabs * slab_blocks
     * entries in the one allocation `meta`; blocks [0, n_meta) have
     * metadata, every other block is unbacked. NULL while nothing is mapped
     * (after kv_trim). */
    void *meta;
    int32_t meta_slabs, n_meta;
    size_t meta_bytes, total_peak_bytes; /* meta's and the hash table's bytes; the peak of bytes + meta_bytes */
    int32_t *ckpt;         /* state slot of the block's checkpoint, -1: none (NULL: no recurrent state) */
    uint8_t *ck_kind;      /* its kv_ck_kind */
    int32_t *ck_prev, *ck_next; /* checkpoint LRUs over blocks, [0] ladder, [1] kept (head: dropped first) */
    uint64_t *ck_conv;     /* the conversation of the block's checkpoint (kv_ckpt_tag), 0: none */
    int32_t *ck_pos;       /* and its position */
    int32_t ck_head[2], ck_tail[2], n_ckpt;
    uint64_t ckpt_hits, ckpt_evictions;
    int32_t *free_ids;     /* per slab: a stack of its free block ids, slab_blocks each */
    int32_t *ref;
    uint8_t *state;        /* KV_UNBACKED, KV_FREE, KV_USED, KV_CACHED */
    uint8_t *pub;          /* published in the hash table */
    uint64_t *hash, *parent;
    int32_t *btok;         /* [block][block_size] tokens of each published block */
    int32_t *lru_prev, *lru_next;
    int32_t lru_head, lru_tail; /* head: evicted first */
    int32_t *ht, *ht_next; /* hash table of published blocks (chained, -1 ends; its own allocation, NULL with meta) */
    uint32_t ht_mask;
    int32_t n_backed, n_used, n_cached, n_free, n_mapped_slabs;
    size_t bytes, peak_bytes;
    uint64_t evictions, hit_blocks;
} kv_cache;

/* A sequence's block table: blocks[0..n_blocks) cover positions
 * [0, n_blocks * block_size); n_tokens positions hold valid K/V; blocks
 * [0, n_hashed) are published (full, read-only, possibly shared). */
typedef struct kv_seq {
    int32_t *blocks;
    int32_t n_blocks;
    int32_t cap_blocks; /* capacity of `blocks` (fixed at kv_seq_init) */
    int32_t n_tokens;
    int32_t n_hashed;
    /* hybrid models: the sequence's recurrent-state slot (-1: none) and the
     * positions [0, state_len) its state has consumed (plan_finish keeps it
     * equal to n_tokens; a forward must continue there or restart at 0) */
    int32_t state;
    int32_t state_len;
    /* prefix-cache namespace: 0 (kv_seq_init's) shares blocks with every
     * other sequence of namespace 0; any other value salts the chain's root,
     * so the sequence matches and publishes only blocks of its own namespace
     * (per-tenant isolation). Set it before the first kv_seq_match/commit. */
    uint64_t ns;
} kv_seq;

/* Creates a cache; maps nothing until blocks are taken. Fails with
 * HN_ERR_UNSUPPORTED for other element types (or a head_dim the block type
 * does not divide), HN_ERR_INVALID for a bad shape, HN_ERR_NOMEM. */
hn_status kv_create(const kv_config *cfg, kv_cache **out, hn_err *err);
/* Unmaps every slab and frees the cache (sequences must be freed first). */
void kv_free(kv_cache *kv);

/* Shard i of a sharded cache (cfg.n_shards > 1): the layout that rank i's
 * backend stores and attends through (its kv heads; block b at its base +
 * b * its block_bytes). An unsharded cache is its own shard 0. */
static inline kv_cache *kv_shard(kv_cache *kv, int i) { return kv->cfg.n_shards > 1 ? kv->shard[i] : kv; }

/* Bytes of one block (all layers, K and V; of every shard together). */
size_t kv_block_bytes(const kv_config *cfg);
/* Blocks that could be handed out now: free + cached + not yet mapped under the cap. */
int32_t kv_n_free(const kv_cache *kv);
/* Takes a block (ref 1): a free one, else from a newly mapped slab, else by
 * evicting the least recently released cached block; -1 if none is left. */
int32_t kv_block_alloc(kv_cache *kv);
/* Drops one reference; at zero a published block becomes cached, another
 * becomes free (and its slab may be unmapped). */
void kv_block_release(kv_cache *kv, int32_t block);

/* Prepares an empty sequence able to hold max_tokens positions (allocates its
 * block table; no blocks are taken from the pool yet). */
hn_status kv_seq_init(kv_seq *s, const kv_cache *kv, int32_t max_tokens, hn_err *err);
/* Releases the sequence's blocks and frees its table. */
void kv_seq_free(kv_seq *s, kv_cache *kv);
/* Makes sure blocks cover positions [0, n_tokens): takes blocks from the pool
 * as needed (no heap allocation). HN_ERR_RANGE past the table's capacity,
 * HN_ERR_FULL if the pool runs out (blocks taken so far stay in the table). */
hn_status kv_seq_reserve(kv_cache *kv, kv_seq *s, int32_t n_tokens, hn_err *err);
/* Keeps positions [0, n_tokens) and releases the blocks no longer needed,
 * tail first. A kept block that is published (shared) is never written
 * again, so if n_tokens ends inside one, that block goes too and n_tokens
 * drops to its start. */
void kv_seq_truncate(kv_cache *kv, kv_seq *s, int32_t n_tokens);

/* ---- prefix cache ---- */

/* Extends a sequence with cached blocks: while the next full block of
 * tokens (the sequence's positions n_tokens.. of `tokens`) is published and
 * ends at or before n_max, takes a reference to it and appends it. Only
 * works on a sequence whose blocks are all published (n_tokens ==
 * n_hashed * block_size; e.g. an empty one); otherwise adds nothing. Returns
 * the number of positions added (a multiple of block_size). */
int32_t kv_seq_match(kv_cache *kv, kv_seq *s, const int32_t *tokens, int32_t n_max);
/* Publishes the sequence's full, computed blocks (those inside
 * [0, min(n, n_tokens)) not yet published), tokens[] being its tokens from
 * position 0. A block whose hash is already published by another block is
 * replaced by that block (one copy kept). */
void kv_seq_commit(kv_cache *kv, kv_seq *s, const int32_t *tokens, int32_t n);
/* The chained hash of the block that would follow the sequence's published
 * blocks if it held tokens[n_hashed*bs .. +bs) (for schedulers that avoid
 * computing one block twice at once); 0 if the sequence is not at a
 * published boundary or fewer than bs tokens remain below n. */
uint64_t kv_seq_next_hash(const kv_cache *kv, const kv_seq *s, const int32_t *tokens, int32_t n);
/* Whether that next block (tokens[n_hashed*bs .. +bs), below n) is published:
 * the sequence's prefix goes on in the cache. */
bool kv_seq_next_cached(const kv_cache *kv, const kv_seq *s, const int32_t *tokens, int32_t n);
/* Evicts cached blocks, least recently released first, until at most
 * keep_cached remain, then unmaps every empty slab (the spare too). */
void kv_trim(kv_cache *kv, int32_t keep_cached);
void kv_get_stats(const kv_cache *kv, kv_stats *out);
/* Checks every internal invariant (states, counters, free stacks, LRU list,
 * hash table, slab accounting) and, given every live sequence, that each
 * block's refcount equals its occurrences in their tables. HN_OK or
 * HN_ERR_INTERNAL with the first violation. For tests. */
hn_status kv_check(const kv_cache *kv, const kv_seq *const *seqs, int n_seqs, hn_err *err);

/* ---- recurrent-state slots (hybrid models) ----
 * A pool of fixed-size slots of backend memory (the same kv_storage), each
 * mapped when taken and unmapped when given back, so memory follows the
 * running sequences. kv/ never reads or writes a slot; the backend's
 * recurrent ops (ssm_conv, delta_net) and state_copy do. */

/* Takes a slot (mapping it); -1 when the cap is reached or mapping fails. */
int32_t kv_state_alloc(kv_cache *kv);
/* Gives a slot back (unmapping it). */
void kv_state_free(kv_cache *kv, int32_t slot);
/* Gives the sequence a state slot if it has none (state_len 0: a fresh
 * state). HN_ERR_FULL when none is left, HN_ERR_INVALID when the cache has
 * no recurrent state. */
hn_status kv_seq_state_acquire(kv_cache *kv, kv_seq *s, hn_err *err);
/* Gives the sequence's slot back (if any). */
void kv_seq_state_release(kv_cache *kv, kv_seq *s);
/* ---- recurrent-state checkpoints (DESIGN.md, kv/) ----
 * A checkpoint is a copy of a sequence's state right after the last token
 * of a published block, attached to that block: the block's chained hash
 * names the whole prefix, which is the state's identity. Checkpoints have
 * their own budget (cfg.n_ckpt) and go with their block when it is evicted.
 * Within the budget, ladder checkpoints go first (least recently used
 * first), kept ones (tips and branch points) only when no ladder one is
 * left, and a ladder checkpoint never displaces a kept one. kv/ only keeps
 * the bookkeeping: the caller copies the state (the backend's state_copy). */
typedef enum kv_ck_kind {
    KV_CK_LADDER = 0, /* a fallback before a possible edit: dropped first */
    KV_CK_TIP,        /* where a conversation's next turn may resume (the end of a prompt or
                         reply): kept until a match resumes past it (kv_seq_match_ckpt) or
                         kv_ckpt_pass says a deeper state of its sequence is kept */
    KV_CK_BRANCH,     /* where sequences sharing a prefix part: kept */
} kv_ck_kind;

/* A slot for a new checkpoint of `kind` at published block `block` (when the
 * budget is full: dropping the least recently used ladder checkpoint, or,
 * for a kept kind when none is left, the least recently used kept one); -1
 * if the block is not published, already has one (raised to `kind` if that
 * keeps it longer), or no slot can be had. The caller copies the state into
 * the slot before the block is used again. */
int32_t kv_ckpt_take(kv_cache *kv, int32_t block, kv_ck_kind kind);
/* The block's checkpoint, if a tip, becomes a ladder one: its sequence has
 * moved on and kept a deeper state. */
void kv_ckpt_pass(kv_cache *kv, int32_t block);
/* The block's checkpoint, if any, is in use again: at least of `kind`, and
 * the most recently used of its LRU (a request names it as its own tip,
 * computed by an earlier turn). Returns whether the block has one. */
bool kv_ckpt_touch(kv_cache *kv, int32_t block, kv_ck_kind kind);
/* Tags the block's checkpoint (if any) with the conversation it belongs to
 * (the caller's id: 0 none) and its position. */
void kv_ckpt_tag(kv_cache *kv, int32_t block, uint64_t conv, int32_t pos);
/* The conversation tag of the block's checkpoint if it is a tip, else 0. */
uint64_t kv_ckpt_conv(const kv_cache *kv, int32_t block);
/* Every tip of conversation conv past position pos becomes a ladder
 * checkpoint, the first to be dropped: the conversation's next turn
 * resumed at pos, so they hold states of a prompt end or a reply that the
 * client re-rendered differently (a branch it left). Returns how many. */
int32_t kv_ckpt_pass_past(kv_cache *kv, uint64_t conv, int32_t pos);
/* Drops the block's checkpoint (if any). */
void kv_ckpt_drop(kv_cache *kv, int32_t block);
/* References to a block (sequences holding it; 0 for an unbacked one). */
static inline int32_t kv_block_refs(const kv_cache *kv, int32_t block) {
    return block >= 0 && block < kv->n_meta ? kv->ref[block] : 0;
}
/* The block's checkpoint slot, or -1. */
static inline int32_t kv_ckpt_of(const kv_cache *kv, int32_t block) {
    return kv->ckpt && block >= 0 && block < kv->n_meta ? kv->ckpt[block] : -1;
}
/* kv_seq_match for a sequence with recurrent state: extends the sequence
 * with published blocks of `tokens` (up to n_max positions), then cuts the
 * match back to the deepest new block that carries a checkpoint, whose slot
 * it returns in *slot (-1 and nothing added when none does); tips before
 * that block become ladder checkpoints (kv_ckpt_pass). The caller
 * restores that state into the sequence's slot and sets state_len to the
 * returned n_tokens. Returns the positions added. */
int32_t kv_seq_match_ckpt(kv_cache *kv, kv_seq *s, const int32_t *tokens, int32_t n_max, int32_t *slot);

static inline unsigned char *kv_state_ptr(const kv_cache *kv, int32_t slot) {
    return (unsigned char *)kv->state_base + (size_t)slot * kv->state_slot_bytes;
}

/* ---- location math: the only place that knows the layout ----
 * Backends compute addresses inside the pool with these (on a GPU, base is a
 * device address and the results are device addresses). */

static inline unsigned char *kv_block_ptr(const kv_cache *kv, int32_t block) {
    return (unsigned char *)kv->base + (size_t)block * kv->block_bytes;
}
/* Raw K rows of `layer` in `block`: block_size rows of k_row_bytes, slot-major. */
static inline unsigned char *kv_block_kraw(const kv_cache *kv, int32_t block, int layer) {
    return kv_block_ptr(kv, block) + (size_t)layer * kv->layer_bytes;
}
static inline unsigned char *kv_block_vraw(const kv_cache *kv, int32_t block, int layer) {
    return kv_block_kraw(kv, block, layer) + (size_t)kv->cfg.block_size * kv->k_row_bytes;
}
/* Host storage and f32 caches only (tests): the key row of position pos of a
 * sequence (pos must be covered by its blocks). */
static inline float *kv_k(const kv_cache *kv, const kv_seq *s, int layer, int32_t pos) {
    int bs = kv->cfg.block_size;
    return (float *)kv_block_kraw(kv, s->blocks[pos / bs], layer) + (size_t)(pos % bs) * kv->row_elems;
}
static inline float *kv_v(const kv_cache *kv, const kv_seq *s, int layer, int32_t pos) {
    int bs = kv->cfg.block_size;
    return (float *)kv_block_vraw(kv, s->blocks[pos / bs], layer) + (size_t)(pos % bs) * kv->row_elems;
}

#endif
