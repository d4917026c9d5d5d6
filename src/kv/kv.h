/* kv.h: the paged KV cache.
 *
 * Memory is a pool of fixed-size blocks. A block holds the keys and values of
 * `block_size` consecutive positions of one sequence, for every layer:
 *
 *   block = [layer][K | V][slot 0..block_size)[n_head_kv * head_dim]  (elements of `type`)
 *
 * Free blocks sit on a free list. A sequence (kv_seq) owns a block table:
 * block ids in position order, so position p lives in blocks[p / block_size],
 * slot p % block_size. The model writes and reads through kv_k / kv_v, the one
 * place that knows where a (block, layer, slot) lives; a later storage scheme
 * (f16/q8_0 elements, blocks spread over growing slabs) changes only those.
 *
 * The pool does not grow: kv_create maps all blocks up front (hn_pages_alloc,
 * so freeing the cache returns the memory to the OS). Block allocation and the
 * block-table operations never allocate heap memory once a kv_seq exists.
 * Not thread-safe: one engine thread owns the cache. */
#ifndef HN_KV_H
#define HN_KV_H

#include <stddef.h>
#include <stdint.h>

#include "../core/status.h"
#include "../quant/blocks.h"

typedef struct kv_config {
    int n_layer;
    int n_head_kv;
    int head_dim;
    int block_size;   /* positions per block; 0 means the default (16) */
    int32_t n_blocks; /* blocks in the pool */
    qt_type type;     /* element type; only QT_F32 for now */
} kv_config;

typedef struct kv_cache {
    kv_config cfg;
    size_t row_elems;     /* n_head_kv * head_dim: one position's K (or V) of one layer */
    size_t layer_bytes;   /* K and V of one layer within a block */
    size_t block_bytes;
    unsigned char *base;  /* n_blocks * block_bytes */
    size_t base_bytes;
    int32_t *free_list;   /* stack of free block ids */
    int32_t n_free;
} kv_cache;

/* A sequence's block table: blocks[0..n_blocks) cover positions
 * [0, n_blocks * block_size); n_tokens positions hold valid K/V. */
typedef struct kv_seq {
    int32_t *blocks;
    int32_t n_blocks;
    int32_t cap_blocks; /* capacity of `blocks` (fixed at kv_seq_init) */
    int32_t n_tokens;
} kv_seq;

/* Creates a cache; fails with HN_ERR_UNSUPPORTED for element types other than
 * f32 and HN_ERR_NOMEM if the pool cannot be mapped. */
hn_status kv_create(const kv_config *cfg, kv_cache **out, hn_err *err);
void kv_free(kv_cache *kv);

/* Bytes of one block (all layers, K and V). */
size_t kv_block_bytes(const kv_config *cfg);
int32_t kv_n_free(const kv_cache *kv);
/* Takes a block off the free list; -1 if the pool is exhausted. */
int32_t kv_block_alloc(kv_cache *kv);
/* Puts a block back on the free list. */
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
/* Keeps positions [0, n_tokens) and returns blocks no longer needed to the pool. */
void kv_seq_truncate(kv_cache *kv, kv_seq *s, int32_t n_tokens);

/* ---- location math: the only place that knows the layout ---- */

static inline unsigned char *kv_block_ptr(const kv_cache *kv, int32_t block) {
    return kv->base + (size_t)block * kv->block_bytes;
}
/* Keys of `layer` in `block`: block_size rows of row_elems floats, slot-major. */
static inline float *kv_block_k(const kv_cache *kv, int32_t block, int layer) {
    return (float *)(kv_block_ptr(kv, block) + (size_t)layer * kv->layer_bytes);
}
static inline float *kv_block_v(const kv_cache *kv, int32_t block, int layer) {
    return (float *)(kv_block_ptr(kv, block) + (size_t)layer * kv->layer_bytes + kv->layer_bytes / 2);
}
/* Key row of position pos of a sequence (pos must be covered by its blocks). */
static inline float *kv_k(const kv_cache *kv, const kv_seq *s, int layer, int32_t pos) {
    int bs = kv->cfg.block_size;
    return kv_block_k(kv, s->blocks[pos / bs], layer) + (size_t)(pos % bs) * kv->row_elems;
}
static inline float *kv_v(const kv_cache *kv, const kv_seq *s, int layer, int32_t pos) {
    int bs = kv->cfg.block_size;
    return kv_block_v(kv, s->blocks[pos / bs], layer) + (size_t)(pos % bs) * kv->row_elems;
}

#endif
