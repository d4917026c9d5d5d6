/* gguf_read.c: the GGUF v2/v3 reader (see gguf.h for the layout).
 *
 * The whole file is mapped (or the caller's buffer used) and parsed once by a
 * cursor that checks every length against the bytes that remain before it
 * reads or allocates anything. Strings and parsed values live in an arena
 * owned by the context; scalar array payloads and tensor data are pointers into
 * the mapping. Keys and tensor names are indexed by small open-addressing hash
 * tables, which is also how duplicates are rejected. */
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/alloc.h"
#include "gguf_int.h"

/* Sanity limits on counts and lengths in a file (far above any real model). */
#define MAX_KV (1u << 24)
#define MAX_TENSORS (1u << 24)
#define MAX_KEY_LEN 65535
#define MAX_NAME_LEN 1024
#define MAX_STRING_LEN (1ull << 31)
#define MAX_DEPTH 8
#define MAX_ALIGNMENT (1u << 24)

typedef struct arena_chunk {
    struct arena_chunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
} arena_chunk;

struct gguf_ctx {
    const uint8_t *base;
    size_t size;
    void *map;      /* non-NULL when gguf_open mapped the file */
    uint32_t version;
    size_t alignment;
    size_t data_offset;
    int64_t n_kv;
    const char **keys;
    gguf_value *vals;
    int64_t n_tensors;
    gguf_tensor *tensors;
    uint32_t *kv_hash, *t_hash; /* index + 1; 0 = empty */
    size_t kv_hash_cap, t_hash_cap;
    arena_chunk *arena;
};

/* ---- arena ---- */

/* Chunks start at about the file's size (at least 4 KiB) and double up to
 * 1 MiB: a small file (a vocabulary cut, a hostile input) does not pay for
 * a 1 MiB chunk, which malloc maps and unmaps, and a model's metadata still
 * comes in 1 MiB chunks. */
static void *arena_alloc(gguf_ctx *c, size_t n) {
    n = (n + 15) & ~(size_t)15;
    arena_chunk *a = c->arena;
    if (!a || a->cap - a->used < n) {
        size_t cap = a ? (a->cap < (1u << 19) ? a->cap * 2 : (1u << 20)) : c->size;
        if (cap < 4096) cap = 4096;
        if (cap > (1u << 20)) cap = 1u << 20;
        if (cap < n) cap = n;
        if (cap > SIZE_MAX - sizeof(arena_chunk)) return NULL;
        a = hn_malloc(sizeof(arena_chunk) + cap);
        if (!a) return NULL;
        a->used = 0;
        a->cap = cap;
        a->next = c->arena;
        c->arena = a;
    }
    void *p = a->data + a->used;
    a->used += n;
    return p;
}

/* ---- hashing (FNV-1a) ---- */

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h;
}

static size_t hash_cap_for(int64_t n) {
    size_t cap = 16;
    while (cap < (size_t)n * 2) cap <<= 1;
    return cap;
}

/* Finds name in a table whose entries index `names`; returns the slot. */
static size_t hash_slot(const uint32_t *tab, size_t cap, const char *const *names, size_t stride,
                        const char *s, size_t n) {
    size_t i = (size_t)hash_bytes(s, n) & (cap - 1);
    for (;;) {
        uint32_t e = tab[i];
        if (!e) return i;
        const char *other = *(const char *const *)((const char *)names + (size_t)(e - 1) * stride);
        if (strlen(other) == n && !memcmp(other, s, n)) return i;
        i = (i + 1) & (cap - 1);
    }
}

/* ---- cursor ---- */

typedef struct {
    gguf_ctx *c;
    size_t pos;
    hn_err *err;
    const char *ctx_what; /* current key or tensor, for messages */
} rd;

static size_t rd_left(const rd *r) { return r->c->size - r->pos; }

static hn_status rd_trunc(rd *r, size_t need, const char *what) {
    return hn_errf(r->err, HN_ERR_FORMAT,
                   "%s%s%struncated: %s needs %zu bytes at offset %zu, but the file is %zu bytes",
                   r->ctx_what ? "'" : "", r->ctx_what ? r->ctx_what : "", r->ctx_what ? "': " : "",
                   what, need, r->pos, r->c->size);
}

static hn_status rd_u32(rd *r, uint32_t *v, const char *what) {
    if (rd_left(r) < 4) return rd_trunc(r, 4, what);
    memcpy(v, r->c->base + r->pos, 4);
    r->pos += 4;
    return HN_OK;
}

static hn_status rd_u64(rd *r, uint64_t *v, const char *what) {
    if (rd_left(r) < 8) return rd_trunc(r, 8, what);
    memcpy(v, r->c->base + r->pos, 8);
    r->pos += 8;
    return HN_OK;
}

/* Reads a length-prefixed string into a NUL-terminated arena copy. */
static hn_status rd_str(rd *r, const char **out, uint64_t *len_out, uint64_t max, const char *what) {
    uint64_t len = 0;
    hn_status s = rd_u64(r, &len, what);
    if (s) return s;
    if (len > max)
        return hn_errf(r->err, HN_ERR_FORMAT, "%s%s%s%s at offset %zu has length %" PRIu64 " (limit %" PRIu64 ")",
                       r->ctx_what ? "'" : "", r->ctx_what ? r->ctx_what : "", r->ctx_what ? "': " : "",
                       what, r->pos - 8, len, max);
    if (len > rd_left(r))
        return hn_errf(r->err, HN_ERR_FORMAT,
                       "%s%s%s%s at offset %zu has length %" PRIu64 " but only %zu bytes follow (file is %zu bytes)",
                       r->ctx_what ? "'" : "", r->ctx_what ? r->ctx_what : "", r->ctx_what ? "': " : "",
                       what, r->pos - 8, len, rd_left(r), r->c->size);
    char *p = arena_alloc(r->c, (size_t)len + 1);
    if (!p) return hn_errf(r->err, HN_ERR_NOMEM, "out of memory reading %s", what);
    memcpy(p, r->c->base + r->pos, (size_t)len);
    p[len] = '\0';
    r->pos += (size_t)len;
    *out = p;
    if (len_out) *len_out = len;
    return HN_OK;
}

/* Reads a name (key or tensor name): nonempty, bounded, no NUL bytes. */
static hn_status rd_name(rd *r, const char **out, uint64_t max, const char *what, uint64_t idx) {
    uint64_t len = 0;
    size_t at = r->pos;
    hn_status s = rd_str(r, out, &len, max, what);
    if (s) return s;
    if (len == 0)
        return hn_errf(r->err, HN_ERR_FORMAT, "%s %" PRIu64 " at offset %zu is empty", what, idx, at);
    if (strlen(*out) != len)
        return hn_errf(r->err, HN_ERR_FORMAT, "%s %" PRIu64 " at offset %zu contains a NUL byte", what, idx, at);
    return HN_OK;
}

static bool vtype_valid(uint32_t t) { return t < GGUF_VTYPE_COUNT; }

/* Parses one value of type t (already read) at the cursor. */
static hn_status rd_value(rd *r, uint32_t t, gguf_value *v, int depth) {
    v->type = (gguf_vtype)t;
    size_t esz = gguf_vtype_size(t);
    if (esz) {
        if (rd_left(r) < esz) return rd_trunc(r, esz, "value");
        const uint8_t *p = r->c->base + r->pos;
        r->pos += esz;
        uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32; int32_t i32; float f;
        switch (t) {
        case GGUF_U8: memcpy(&u8, p, 1); v->v.u64 = u8; break;
        case GGUF_I8: memcpy(&i8, p, 1); v->v.i64 = i8; break;
        case GGUF_U16: memcpy(&u16, p, 2); v->v.u64 = u16; break;
        case GGUF_I16: memcpy(&i16, p, 2); v->v.i64 = i16; break;
        case GGUF_U32: memcpy(&u32, p, 4); v->v.u64 = u32; break;
        case GGUF_I32: memcpy(&i32, p, 4); v->v.i64 = i32; break;
        case GGUF_F32: memcpy(&f, p, 4); v->v.f64 = f; break;
        case GGUF_BOOL: v->v.b = p[0] != 0; break;
        case GGUF_U64: memcpy(&v->v.u64, p, 8); break;
        case GGUF_I64: memcpy(&v->v.i64, p, 8); break;
        case GGUF_F64: memcpy(&v->v.f64, p, 8); break;
        default: break;
        }
        return HN_OK;
    }
    if (t == GGUF_STRING) return rd_str(r, &v->v.str.ptr, &v->v.str.len, MAX_STRING_LEN, "string");
    /* array */
    if (depth >= MAX_DEPTH)
        return hn_errf(r->err, HN_ERR_FORMAT, "'%s': arrays nested deeper than %d at offset %zu",
                       r->ctx_what ? r->ctx_what : "?", MAX_DEPTH, r->pos);
    uint32_t et = 0;
    uint64_t n = 0;
    hn_status s = rd_u32(r, &et, "array element type");
    if (s) return s;
    if (!vtype_valid(et))
        return hn_errf(r->err, HN_ERR_FORMAT, "'%s': unknown array element type %" PRIu32 " at offset %zu",
                       r->ctx_what ? r->ctx_what : "?", et, r->pos - 4);
    s = rd_u64(r, &n, "array length");
    if (s) return s;
    size_t min_elem = gguf_vtype_size(et);
    if (!min_elem) min_elem = et == GGUF_STRING ? 8 : 12;
    if (n > rd_left(r) / min_elem)
        return hn_errf(r->err, HN_ERR_FORMAT,
                       "'%s': array of %" PRIu64 " %s at offset %zu needs at least %" PRIu64 " bytes, only %zu remain",
                       r->ctx_what ? r->ctx_what : "?", n, gguf_vtype_name((gguf_vtype)et), r->pos - 8,
                       n > UINT64_MAX / min_elem ? UINT64_MAX : n * min_elem, rd_left(r));
    v->v.arr.elem = (gguf_vtype)et;
    v->v.arr.n = n;
    v->v.arr.data = NULL;
    v->v.arr.items = NULL;
    if (gguf_vtype_size(et)) {
        v->v.arr.data = r->c->base + r->pos;
        r->pos += (size_t)(n * min_elem);
        return HN_OK;
    }
    if (n > SIZE_MAX / sizeof(gguf_value)) return hn_errf(r->err, HN_ERR_FORMAT, "array too long");
    gguf_value *items = n ? arena_alloc(r->c, (size_t)n * sizeof *items) : NULL;
    if (n && !items) return hn_errf(r->err, HN_ERR_NOMEM, "out of memory reading an array of %" PRIu64, n);
    for (uint64_t i = 0; i < n; i++) {
        /* nested arrays carry no per-element tag: each element of an array
         * of arrays is {u32 elem type, u64 n, values} */
        s = rd_value(r, et, &items[i], depth + 1);
        if (s) return s;
    }
    v->v.arr.items = items;
    return HN_OK;
}

/* ---- parse ---- */

typedef struct { uint64_t off; size_t nbytes; int64_t idx; } span;

static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->off != y->off) return x->off < y->off ? -1 : 1;
    if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
    return 0;
}

static hn_status parse(gguf_ctx *c, hn_err *err) {
    rd r = {c, 0, err, NULL};
    uint32_t version = 0;
    uint64_t n_tensors = 0, n_kv = 0;
    hn_status s;
    if (c->size < 4) return hn_errf(err, HN_ERR_FORMAT, "file is %zu bytes, too short for a GGUF header", c->size);
    if (memcmp(c->base, "GGUF", 4) != 0) return hn_errf(err, HN_ERR_FORMAT, "bad magic: not a GGUF file");
    r.pos = 4;
    if ((s = rd_u32(&r, &version, "version"))) return s;
    if (version == 1)
        return hn_errf(err, HN_ERR_FORMAT, "GGUF version 1 is not supported (only v2 and v3); re-convert the model");
    if (version != 2 && version != 3) {
        if ((version & 0xffff) == 0 && version >> 16)
            return hn_errf(err, HN_ERR_FORMAT, "GGUF version %" PRIu32 " looks big-endian; only little-endian files are supported",
                           version);
        return hn_errf(err, HN_ERR_FORMAT, "unsupported GGUF version %" PRIu32 " (only v2 and v3)", version);
    }
    c->version = version;
    if ((s = rd_u64(&r, &n_tensors, "tensor count"))) return s;
    if ((s = rd_u64(&r, &n_kv, "metadata count"))) return s;
    /* smallest possible kv: 8-byte length + 1-byte key + 4-byte type + 1-byte value;
     * smallest tensor info: 8 + 1 + 4 (n_dims) + 4 (type) + 8 (offset) */
    if (n_kv > MAX_KV || n_kv > rd_left(&r) / 14)
        return hn_errf(err, HN_ERR_FORMAT, "metadata count %" PRIu64 " is impossible for a %zu-byte file", n_kv, c->size);
    if (n_tensors > MAX_TENSORS || n_tensors > (rd_left(&r) - n_kv * 14) / 25)
        return hn_errf(err, HN_ERR_FORMAT, "tensor count %" PRIu64 " is impossible for a %zu-byte file", n_tensors, c->size);
    c->n_kv = (int64_t)n_kv;
    c->n_tensors = (int64_t)n_tensors;

    /* metadata */
    c->kv_hash_cap = hash_cap_for(c->n_kv);
    c->keys = hn_calloc(n_kv ? n_kv : 1, sizeof *c->keys);
    c->vals = hn_calloc(n_kv ? n_kv : 1, sizeof *c->vals);
    c->kv_hash = hn_calloc(c->kv_hash_cap, sizeof *c->kv_hash);
    if (!c->keys || !c->vals || !c->kv_hash) return hn_errf(err, HN_ERR_NOMEM, "out of memory for %" PRIu64 " keys", n_kv);
    for (uint64_t i = 0; i < n_kv; i++) {
        const char *key;
        uint32_t t = 0;
        if ((s = rd_name(&r, &key, MAX_KEY_LEN, "key", i))) return s;
        size_t slot = hash_slot(c->kv_hash, c->kv_hash_cap, c->keys, sizeof *c->keys, key, strlen(key));
        if (c->kv_hash[slot]) return hn_errf(err, HN_ERR_FORMAT, "duplicate key '%s' (entries %" PRIu32 " and %" PRIu64 ")",
                                              key, c->kv_hash[slot] - 1, i);
        c->keys[i] = key;
        c->kv_hash[slot] = (uint32_t)i + 1;
        r.ctx_what = key;
        if ((s = rd_u32(&r, &t, "value type"))) return s;
        if (!vtype_valid(t)) return hn_errf(err, HN_ERR_FORMAT, "key '%s': unknown value type %" PRIu32, key, t);
        if ((s = rd_value(&r, t, &c->vals[i], 0))) return s;
        r.ctx_what = NULL;
    }

    /* alignment */
    c->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_value *al = gguf_get(c, "general.alignment");
    if (al) {
        if (al->type != GGUF_U32)
            return hn_errf(err, HN_ERR_FORMAT, "general.alignment has type %s, expected u32", gguf_vtype_name(al->type));
        if (al->v.u64 == 0 || (al->v.u64 & (al->v.u64 - 1)) || al->v.u64 > MAX_ALIGNMENT)
            return hn_errf(err, HN_ERR_FORMAT, "general.alignment %" PRIu64 " is not a power of two in [1, %u]",
                           al->v.u64, MAX_ALIGNMENT);
        c->alignment = (size_t)al->v.u64;
    }

    /* tensor infos */
    c->t_hash_cap = hash_cap_for(c->n_tensors);
    c->tensors = hn_calloc(n_tensors ? n_tensors : 1, sizeof *c->tensors);
    c->t_hash = hn_calloc(c->t_hash_cap, sizeof *c->t_hash);
    if (!c->tensors || !c->t_hash) return hn_errf(err, HN_ERR_NOMEM, "out of memory for %" PRIu64 " tensors", n_tensors);
    for (uint64_t i = 0; i < n_tensors; i++) {
        gguf_tensor *t = &c->tensors[i];
        uint32_t n_dims = 0, type = 0;
        if ((s = rd_name(&r, &t->name, MAX_NAME_LEN, "tensor name", i))) return s;
        size_t slot = hash_slot(c->t_hash, c->t_hash_cap, &c->tensors[0].name, sizeof *c->tensors, t->name,
                                strlen(t->name));
        if (c->t_hash[slot])
            return hn_errf(err, HN_ERR_FORMAT, "duplicate tensor name '%s' (tensors %" PRIu32 " and %" PRIu64 ")", t->name,
                           c->t_hash[slot] - 1, i);
        c->t_hash[slot] = (uint32_t)i + 1;
        r.ctx_what = t->name;
        if ((s = rd_u32(&r, &n_dims, "n_dims"))) return s;
        if (n_dims > GGUF_MAX_DIMS)
            return hn_errf(err, HN_ERR_FORMAT, "tensor '%s': %" PRIu32 " dimensions (at most %d)", t->name, n_dims,
                           GGUF_MAX_DIMS);
        t->n_dims = (int)n_dims;
        for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < n_dims; d++) {
            uint64_t ne = 0;
            if ((s = rd_u64(&r, &ne, "dimension"))) return s;
            if (ne > (uint64_t)INT64_MAX)
                return hn_errf(err, HN_ERR_FORMAT, "tensor '%s': dimension %" PRIu32 " is negative (%" PRId64 ")", t->name,
                               d, (int64_t)ne);
            t->ne[d] = (int64_t)ne;
        }
        if ((s = rd_u32(&r, &type, "type"))) return s;
        if (!gguf_type_shape(type, NULL, NULL))
            return hn_errf(err, HN_ERR_FORMAT, "tensor '%s': unknown tensor type id %" PRIu32, t->name, type);
        t->type = (qt_type)type;
        if ((s = rd_u64(&r, &t->offset, "data offset"))) return s;
        const char *why;
        if (!gguf_tensor_size(type, t->n_dims, t->ne, &t->nbytes, &why))
            return hn_errf(err, HN_ERR_FORMAT,
                           "tensor '%s': %s (type %s, shape [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "])", t->name,
                           why, gguf_type_name(type), t->ne[0], t->ne[1], t->ne[2], t->ne[3]);
        if (t->offset % c->alignment)
            return hn_errf(err, HN_ERR_FORMAT, "tensor '%s': data offset %" PRIu64 " is not a multiple of the alignment %zu",
                           t->name, t->offset, c->alignment);
        r.ctx_what = NULL;
    }

    /* data section */
    size_t pad = (c->alignment - r.pos % c->alignment) % c->alignment;
    c->data_offset = r.pos + pad;
    if (n_tensors == 0) return HN_OK;
    if (pad > rd_left(&r))
        return hn_errf(err, HN_ERR_FORMAT, "tensor data section would start at offset %zu, past the end of the file (%zu bytes)",
                       c->data_offset, c->size);
    size_t data_size = c->size - c->data_offset;
    span *sp = hn_malloc((size_t)n_tensors * sizeof *sp);
    if (!sp) return hn_errf(err, HN_ERR_NOMEM, "out of memory");
    int64_t n_sp = 0;
    for (int64_t i = 0; i < c->n_tensors; i++) {
        gguf_tensor *t = &c->tensors[i];
        if (t->offset > data_size || t->nbytes > data_size - t->offset) {
            hn_free(sp);
            return hn_errf(err, HN_ERR_FORMAT, "tensor '%s': data [offset %" PRIu64 ", %zu bytes] extends past end of file (%zu bytes)",
                           t->name, (uint64_t)c->data_offset + t->offset, t->nbytes, c->size);
        }
        t->data = c->base + c->data_offset + t->offset;
        if (t->nbytes) sp[n_sp++] = (span){t->offset, t->nbytes, i};
    }
    qsort(sp, (size_t)n_sp, sizeof *sp, span_cmp);
    for (int64_t i = 0; i + 1 < n_sp; i++) {
        if (sp[i].off + sp[i].nbytes > sp[i + 1].off) {
            const char *a = c->tensors[sp[i].idx].name, *b = c->tensors[sp[i + 1].idx].name;
            hn_free(sp);
            return hn_errf(err, HN_ERR_FORMAT, "tensors '%s' and '%s' overlap in the data section", a, b);
        }
    }
    hn_free(sp);
    return HN_OK;
}

static hn_status open_common(gguf_ctx *c, gguf_ctx **out, hn_err *err) {
    hn_status s = parse(c, err);
    if (s) {
        gguf_close(c);
        return s;
    }
    *out = c;
    return HN_OK;
}

hn_status gguf_open_mem(const void *data, size_t size, gguf_ctx **out, hn_err *err) {
    *out = NULL;
    if (!data && size) return hn_errf(err, HN_ERR_INVALID, "gguf_open_mem: NULL buffer");
    gguf_ctx *c = hn_calloc(1, sizeof *c);
    if (!c) return hn_errf(err, HN_ERR_NOMEM, "out of memory");
    c->base = data;
    c->size = size;
    return open_common(c, out, err);
}

hn_status gguf_open(const char *path, gguf_ctx **out, hn_err *err) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return hn_errf(err, errno == ENOENT ? HN_ERR_NOT_FOUND : HN_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return hn_errf(err, HN_ERR_IO, "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return hn_errf(err, HN_ERR_IO, "%s: not a regular file", path);
    }
    if (st.st_size < 24) {
        close(fd);
        return hn_errf(err, HN_ERR_FORMAT, "%s: file is %lld bytes, too short for a GGUF header", path, (long long)st.st_size);
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        close(fd);
        return hn_errf(err, HN_ERR_FORMAT, "%s: file too large to map", path);
    }
    size_t size = (size_t)st.st_size;
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) return hn_errf(err, HN_ERR_IO, "%s: mmap: %s", path, strerror(e));
    gguf_ctx *c = hn_calloc(1, sizeof *c);
    if (!c) {
        munmap(map, size);
        return hn_errf(err, HN_ERR_NOMEM, "out of memory");
    }
    c->base = map;
    c->size = size;
    c->map = map;
    hn_err local;
    hn_err_clear(&local);
    hn_status s = open_common(c, out, &local);
    if (s) return hn_errf(err, s, "%s: %s", path, local.msg);
    return HN_OK;
}

void gguf_close(gguf_ctx *c) {
    if (!c) return;
    if (c->map) munmap(c->map, c->size);
    while (c->arena) {
        arena_chunk *n = c->arena->next;
        hn_free(c->arena);
        c->arena = n;
    }
    hn_free(c->keys);
    hn_free(c->vals);
    hn_free(c->kv_hash);
    hn_free(c->tensors);
    hn_free(c->t_hash);
    hn_free(c);
}

/* ---- accessors ---- */

uint32_t gguf_version(const gguf_ctx *c) { return c->version; }
size_t gguf_alignment(const gguf_ctx *c) { return c->alignment; }
size_t gguf_data_offset(const gguf_ctx *c) { return c->data_offset; }
int64_t gguf_n_kv(const gguf_ctx *c) { return c->n_kv; }

const char *gguf_kv_key(const gguf_ctx *c, int64_t i) {
    return i >= 0 && i < c->n_kv ? c->keys[i] : NULL;
}

const gguf_value *gguf_kv_value(const gguf_ctx *c, int64_t i) {
    return i >= 0 && i < c->n_kv ? &c->vals[i] : NULL;
}

int64_t gguf_find_kv(const gguf_ctx *c, const char *key) {
    if (!c->kv_hash || !key) return -1;
    size_t slot = hash_slot(c->kv_hash, c->kv_hash_cap, c->keys, sizeof *c->keys, key, strlen(key));
    return (int64_t)c->kv_hash[slot] - 1;
}

const gguf_value *gguf_get(const gguf_ctx *c, const char *key) {
    int64_t i = gguf_find_kv(c, key);
    return i < 0 ? NULL : &c->vals[i];
}

static bool is_unsigned(gguf_vtype t) { return t == GGUF_U8 || t == GGUF_U16 || t == GGUF_U32 || t == GGUF_U64; }
static bool is_signed(gguf_vtype t) { return t == GGUF_I8 || t == GGUF_I16 || t == GGUF_I32 || t == GGUF_I64; }

bool gguf_get_u32(const gguf_ctx *c, const char *key, uint32_t *out) {
    const gguf_value *v = gguf_get(c, key);
    if (!v) return false;
    if (is_unsigned(v->type) && v->v.u64 <= UINT32_MAX) {
        *out = (uint32_t)v->v.u64;
        return true;
    }
    if (is_signed(v->type) && v->v.i64 >= 0 && v->v.i64 <= (int64_t)UINT32_MAX) {
        *out = (uint32_t)v->v.i64;
        return true;
    }
    return false;
}

bool gguf_get_i64(const gguf_ctx *c, const char *key, int64_t *out) {
    const gguf_value *v = gguf_get(c, key);
    if (!v) return false;
    if (is_unsigned(v->type) && v->v.u64 <= (uint64_t)INT64_MAX) {
        *out = (int64_t)v->v.u64;
        return true;
    }
    if (is_signed(v->type)) {
        *out = v->v.i64;
        return true;
    }
    return false;
}

bool gguf_get_f32(const gguf_ctx *c, const char *key, float *out) {
    const gguf_value *v = gguf_get(c, key);
    if (!v) return false;
    if (v->type == GGUF_F32 || v->type == GGUF_F64) {
        *out = (float)v->v.f64;
        return true;
    }
    /* integers only where the float holds them exactly */
    if (is_unsigned(v->type) && v->v.u64 <= (1u << 24)) {
        *out = (float)v->v.u64;
        return true;
    }
    if (is_signed(v->type) && v->v.i64 >= -(1 << 24) && v->v.i64 <= (1 << 24)) {
        *out = (float)v->v.i64;
        return true;
    }
    return false;
}

bool gguf_get_bool(const gguf_ctx *c, const char *key, bool *out) {
    const gguf_value *v = gguf_get(c, key);
    if (!v || v->type != GGUF_BOOL) return false;
    *out = v->v.b;
    return true;
}

const char *gguf_get_str(const gguf_ctx *c, const char *key) {
    const gguf_value *v = gguf_get(c, key);
    return v && v->type == GGUF_STRING ? v->v.str.ptr : NULL;
}

int64_t gguf_arr_int(const gguf_value *a, uint64_t i) {
    if (a->type != GGUF_ARRAY || i >= a->v.arr.n || !a->v.arr.data) return 0;
    const uint8_t *p = (const uint8_t *)a->v.arr.data + i * gguf_vtype_size(a->v.arr.elem);
    uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32; int32_t i32; uint64_t u64; int64_t i64;
    float f; double d;
    switch (a->v.arr.elem) {
    case GGUF_U8: memcpy(&u8, p, 1); return u8;
    case GGUF_BOOL: return p[0] != 0;
    case GGUF_I8: memcpy(&i8, p, 1); return i8;
    case GGUF_U16: memcpy(&u16, p, 2); return u16;
    case GGUF_I16: memcpy(&i16, p, 2); return i16;
    case GGUF_U32: memcpy(&u32, p, 4); return u32;
    case GGUF_I32: memcpy(&i32, p, 4); return i32;
    case GGUF_U64: memcpy(&u64, p, 8); return (int64_t)u64;
    case GGUF_I64: memcpy(&i64, p, 8); return i64;
    case GGUF_F32: memcpy(&f, p, 4); return f >= -9.2e18f && f <= 9.2e18f ? (int64_t)f : 0;
    case GGUF_F64: memcpy(&d, p, 8); return d >= -9.2e18 && d <= 9.2e18 ? (int64_t)d : 0;
    default: return 0;
    }
}

double gguf_arr_float(const gguf_value *a, uint64_t i) {
    if (a->type != GGUF_ARRAY || i >= a->v.arr.n || !a->v.arr.data) return 0;
    const uint8_t *p = (const uint8_t *)a->v.arr.data + i * gguf_vtype_size(a->v.arr.elem);
    float f;
    double d;
    uint64_t u64;
    switch (a->v.arr.elem) {
    case GGUF_F32: memcpy(&f, p, 4); return f;
    case GGUF_F64: memcpy(&d, p, 8); return d;
    case GGUF_U64: memcpy(&u64, p, 8); return (double)u64;
    default: return (double)gguf_arr_int(a, i);
    }
}

const char *gguf_arr_str(const gguf_value *a, uint64_t i, uint64_t *len) {
    if (a->type != GGUF_ARRAY || a->v.arr.elem != GGUF_STRING || i >= a->v.arr.n) return NULL;
    if (len) *len = a->v.arr.items[i].v.str.len;
    return a->v.arr.items[i].v.str.ptr;
}

int64_t gguf_n_tensors(const gguf_ctx *c) { return c->n_tensors; }

const gguf_tensor *gguf_tensor_at(const gguf_ctx *c, int64_t i) {
    return i >= 0 && i < c->n_tensors ? &c->tensors[i] : NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_ctx *c, const char *name) {
    if (!c->t_hash || !name) return NULL;
    size_t slot = hash_slot(c->t_hash, c->t_hash_cap, &c->tensors[0].name, sizeof *c->tensors, name, strlen(name));
    return c->t_hash[slot] ? &c->tensors[c->t_hash[slot] - 1] : NULL;
}

const char *gguf_vtype_name(gguf_vtype t) {
    static const char *const names[GGUF_VTYPE_COUNT] = {
        "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
    };
    return (unsigned)t < GGUF_VTYPE_COUNT ? names[t] : "unknown";
}
