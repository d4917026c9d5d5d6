/* tok_map.c: the tokenizer's hash maps: a string-interning map (byte string
 * -> dense id) and a merge map ((left id, right id) -> rank, result). Both are
 * open-addressing tables with linear probing, sized to stay under half full,
 * hashed with XXH3. Built once at load, then only read (safe to share between
 * threads). */
#include <string.h>
#include <xxhash.h>

#include "../core/alloc.h"
#include "tok_int.h"

static size_t pow2_at_least(size_t n) {
    size_t p = 16;
    while (p < n) p <<= 1;
    return p;
}

hn_status tok_strmap_init(tok_strmap *m, int32_t expect) {
    memset(m, 0, sizeof *m);
    if (expect < 16) expect = 16;
    m->cap = expect;
    m->off = hn_malloc((size_t)m->cap * sizeof *m->off);
    m->len = hn_malloc((size_t)m->cap * sizeof *m->len);
    m->pool_cap = (size_t)expect * 8;
    m->pool = hn_malloc(m->pool_cap);
    m->n_slots = pow2_at_least((size_t)expect * 2);
    m->slots = hn_calloc(m->n_slots, sizeof *m->slots);
    m->slot_hash = hn_malloc(m->n_slots * sizeof *m->slot_hash);
    if (!m->off || !m->len || !m->pool || !m->slots || !m->slot_hash) {
        tok_strmap_free(m);
        return HN_ERR_NOMEM;
    }
    return HN_OK;
}

void tok_strmap_free(tok_strmap *m) {
    hn_free(m->pool);
    hn_free(m->off);
    hn_free(m->len);
    hn_free(m->slots);
    hn_free(m->slot_hash);
    memset(m, 0, sizeof *m);
}

static size_t strmap_probe(const tok_strmap *m, const char *s, size_t n, uint64_t h) {
    size_t mask = m->n_slots - 1, i = (size_t)h & mask;
    for (;;) {
        int32_t e = m->slots[i];
        if (!e) return i;
        int32_t id = e - 1;
        if (m->slot_hash[i] == h && m->len[id] == n && memcmp(m->pool + m->off[id], s, n) == 0) return i;
        i = (i + 1) & mask;
    }
}

int32_t tok_strmap_find(const tok_strmap *m, const char *s, size_t n) {
    if (!m->slots) return -1;
    uint64_t h = XXH3_64bits(s, n);
    size_t i = strmap_probe(m, s, n, h);
    return m->slots[i] ? m->slots[i] - 1 : -1;
}

static bool strmap_grow_slots(tok_strmap *m) {
    size_t ns = m->n_slots * 2;
    int32_t *slots = hn_calloc(ns, sizeof *slots);
    uint64_t *hashes = hn_malloc(ns * sizeof *hashes);
    if (!slots || !hashes) {
        hn_free(slots);
        hn_free(hashes);
        return false;
    }
    for (size_t i = 0; i < m->n_slots; i++) {
        if (!m->slots[i]) continue;
        size_t j = (size_t)m->slot_hash[i] & (ns - 1);
        while (slots[j]) j = (j + 1) & (ns - 1);
        slots[j] = m->slots[i];
        hashes[j] = m->slot_hash[i];
    }
    hn_free(m->slots);
    hn_free(m->slot_hash);
    m->slots = slots;
    m->slot_hash = hashes;
    m->n_slots = ns;
    return true;
}

int32_t tok_strmap_intern(tok_strmap *m, const char *s, size_t n, bool *added) {
    if (added) *added = false;
    if (n > UINT32_MAX || m->n == INT32_MAX) return -1;
    uint64_t h = XXH3_64bits(s, n);
    size_t i = strmap_probe(m, s, n, h);
    if (m->slots[i]) return m->slots[i] - 1;
    if ((size_t)m->n + 2 >= m->n_slots) return -1; /* a failed grow left it full: never probe a full table */
    if (m->n == m->cap) {
        int32_t nc = m->cap > INT32_MAX / 2 ? INT32_MAX : m->cap * 2;
        uint64_t *off = hn_realloc(m->off, (size_t)nc * sizeof *off);
        if (!off) return -1;
        m->off = off;
        uint32_t *len = hn_realloc(m->len, (size_t)nc * sizeof *len);
        if (!len) return -1;
        m->len = len;
        m->cap = nc;
    }
    if (m->pool_cap - m->pool_len < n + 1) {
        size_t nc = m->pool_cap * 2;
        while (nc - m->pool_len < n + 1) nc *= 2;
        char *pool = hn_realloc(m->pool, nc);
        if (!pool) return -1;
        m->pool = pool;
        m->pool_cap = nc;
    }
    int32_t id = m->n++;
    m->off[id] = m->pool_len;
    m->len[id] = (uint32_t)n;
    memcpy(m->pool + m->pool_len, s, n);
    m->pool[m->pool_len + n] = 0;
    m->pool_len += n + 1;
    m->slots[i] = id + 1;
    m->slot_hash[i] = h;
    if ((size_t)m->n * 2 > m->n_slots && !strmap_grow_slots(m)) {
        /* the string is stored and findable; the table is just fuller than planned */
    }
    if (added) *added = true;
    return id;
}

/* ---- merge map ---- */

static uint64_t pair_hash(uint64_t key) {
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    key *= 0xc4ceb9fe1a85ec53ULL;
    key ^= key >> 33;
    return key;
}

hn_status tok_mergemap_init(tok_mergemap *m, size_t expect) {
    m->n = 0;
    m->n_slots = pow2_at_least(expect * 2 + 16);
    m->ents = hn_malloc(m->n_slots * sizeof *m->ents);
    if (!m->ents) return HN_ERR_NOMEM;
    for (size_t i = 0; i < m->n_slots; i++) m->ents[i].key = UINT64_MAX;
    return HN_OK;
}

void tok_mergemap_free(tok_mergemap *m) {
    hn_free(m->ents);
    memset(m, 0, sizeof *m);
}

void tok_mergemap_put(tok_mergemap *m, int32_t left, int32_t right, int32_t rank, int32_t result) {
    /* sized at init for every merge in the file, so it never fills past half */
    if (!m->ents || m->n * 2 >= m->n_slots) return;
    uint64_t key = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
    size_t mask = m->n_slots - 1, i = (size_t)pair_hash(key) & mask;
    while (m->ents[i].key != UINT64_MAX) {
        if (m->ents[i].key == key) return;
        i = (i + 1) & mask;
    }
    m->ents[i].key = key;
    m->ents[i].rank = rank;
    m->ents[i].result = result;
    m->n++;
}

const tok_merge_ent *tok_mergemap_find(const tok_mergemap *m, int32_t left, int32_t right) {
    if (!m->ents || left < 0 || right < 0) return NULL;
    uint64_t key = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
    size_t mask = m->n_slots - 1, i = (size_t)pair_hash(key) & mask;
    while (m->ents[i].key != UINT64_MAX) {
        if (m->ents[i].key == key) return &m->ents[i];
        i = (i + 1) & mask;
    }
    return NULL;
}

/* ---- id vector ---- */

void tok_ids_push(tok_ids *ids, int32_t id) {
    if (ids->oom) return;
    if (ids->n == ids->cap) {
        size_t nc = ids->cap ? ids->cap * 2 : 64;
        int32_t *v = hn_realloc(ids->v, nc * sizeof *v);
        if (!v) {
            ids->oom = true;
            return;
        }
        ids->v = v;
        ids->cap = nc;
    }
    ids->v[ids->n++] = id;
}
