/* kv.c: the paged KV block pool and per-sequence block tables. */
#include "kv.h"

#include <limits.h>

#include "../core/alloc.h"

#define KV_DEFAULT_BLOCK 16

static size_t elem_size(qt_type t) { return t == QT_F32 ? 4 : 0; }

size_t kv_block_bytes(const kv_config *cfg) {
    int bs = cfg->block_size > 0 ? cfg->block_size : KV_DEFAULT_BLOCK;
    return (size_t)cfg->n_layer * 2 * (size_t)bs * (size_t)cfg->n_head_kv * (size_t)cfg->head_dim *
           elem_size(cfg->type);
}

hn_status kv_create(const kv_config *cfg, kv_cache **out, hn_err *err) {
    *out = NULL;
    if (cfg->type != QT_F32)
        return hn_errf(err, HN_ERR_UNSUPPORTED, "kv: element type %d not supported (f32 only)", (int)cfg->type);
    if (cfg->n_layer <= 0 || cfg->n_head_kv <= 0 || cfg->head_dim <= 0 || cfg->n_blocks <= 0 ||
        cfg->block_size < 0 || cfg->block_size > 4096 || cfg->n_layer > 4096 || cfg->n_head_kv > 4096 ||
        cfg->head_dim > 4096)
        return hn_errf(err, HN_ERR_INVALID, "kv: bad config (layers %d, kv heads %d, head dim %d, blocks %d, block size %d)",
                       cfg->n_layer, cfg->n_head_kv, cfg->head_dim, (int)cfg->n_blocks, cfg->block_size);
    kv_cache *kv = hn_calloc(1, sizeof *kv);
    if (!kv) return hn_errf(err, HN_ERR_NOMEM, "kv: out of memory");
    kv->cfg = *cfg;
    if (kv->cfg.block_size == 0) kv->cfg.block_size = KV_DEFAULT_BLOCK;
    kv->row_elems = (size_t)cfg->n_head_kv * (size_t)cfg->head_dim;
    kv->layer_bytes = 2 * (size_t)kv->cfg.block_size * kv->row_elems * elem_size(cfg->type);
    kv->block_bytes = kv_block_bytes(&kv->cfg);
    if (kv->block_bytes > SIZE_MAX / (size_t)cfg->n_blocks) {
        hn_free(kv);
        return hn_errf(err, HN_ERR_RANGE, "kv: %d blocks overflow", (int)cfg->n_blocks);
    }
    kv->base_bytes = kv->block_bytes * (size_t)cfg->n_blocks;
    kv->base = hn_pages_alloc(kv->base_bytes);
    kv->free_list = hn_malloc(sizeof(int32_t) * (size_t)cfg->n_blocks);
    if (!kv->base || !kv->free_list) {
        kv_free(kv);
        return hn_errf(err, HN_ERR_NOMEM, "kv: cannot allocate %zu bytes for %d blocks", kv->base_bytes,
                       (int)cfg->n_blocks);
    }
    /* lowest ids on top of the stack: blocks are handed out in address order */
    for (int32_t i = 0; i < cfg->n_blocks; i++) kv->free_list[i] = cfg->n_blocks - 1 - i;
    kv->n_free = cfg->n_blocks;
    *out = kv;
    return HN_OK;
}

void kv_free(kv_cache *kv) {
    if (!kv) return;
    if (kv->base) hn_pages_free(kv->base, kv->base_bytes);
    hn_free(kv->free_list);
    hn_free(kv);
}

int32_t kv_n_free(const kv_cache *kv) { return kv->n_free; }

int32_t kv_block_alloc(kv_cache *kv) {
    if (kv->n_free == 0) return -1;
    return kv->free_list[--kv->n_free];
}

void kv_block_release(kv_cache *kv, int32_t block) {
    if (block < 0 || block >= kv->cfg.n_blocks || kv->n_free >= kv->cfg.n_blocks) return;
    kv->free_list[kv->n_free++] = block;
}

hn_status kv_seq_init(kv_seq *s, const kv_cache *kv, int32_t max_tokens, hn_err *err) {
    s->blocks = NULL;
    s->n_blocks = s->cap_blocks = s->n_tokens = 0;
    if (max_tokens <= 0) return hn_errf(err, HN_ERR_INVALID, "kv: sequence of %d tokens", (int)max_tokens);
    int bs = kv->cfg.block_size;
    int32_t cap = (int32_t)(((int64_t)max_tokens + bs - 1) / bs);
    s->blocks = hn_malloc(sizeof(int32_t) * (size_t)cap);
    if (!s->blocks) return hn_errf(err, HN_ERR_NOMEM, "kv: out of memory");
    s->cap_blocks = cap;
    return HN_OK;
}

void kv_seq_free(kv_seq *s, kv_cache *kv) {
    if (!s) return;
    if (kv) kv_seq_truncate(kv, s, 0);
    hn_free(s->blocks);
    s->blocks = NULL;
    s->n_blocks = s->cap_blocks = s->n_tokens = 0;
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
    while (s->n_blocks > keep) kv_block_release(kv, s->blocks[--s->n_blocks]);
    if (s->n_tokens > n_tokens) s->n_tokens = n_tokens;
}
