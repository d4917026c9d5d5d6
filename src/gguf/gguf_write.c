/* gguf_write.c: the GGUF v3 writer (see gguf.h for the layout).
 *
 * The writer keeps its own deep copies of keys and values and borrows tensor
 * data. Writing lays tensors out in the order they were added, each at the
 * next multiple of the alignment, with zero padding between them and after
 * the last one, so files it writes read back with the same offsets. The same
 * serializer runs against a counting sink (to size the header), a memory
 * buffer, or a file. */
#include "gguf.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "../core/alloc.h"
#include "gguf_int.h"

#define W_MAX_DEPTH 8 /* the reader's nesting limit */
#define W_MAX_NAME 1024

typedef struct {
    char *key;
    gguf_value val; /* owns its strings, payloads and items */
} wkv;

typedef struct {
    char *name;
    qt_type type;
    int n_dims;
    int64_t ne[GGUF_MAX_DIMS];
    const void *data;
    size_t nbytes;
} wtensor;

struct gguf_writer {
    wkv *kv;
    size_t n_kv, cap_kv;
    wtensor *t;
    size_t n_t, cap_t;
};

/* ---- owned value copies ---- */

static void value_free(gguf_value *v) {
    if (v->type == GGUF_STRING) {
        hn_free((void *)v->v.str.ptr);
    } else if (v->type == GGUF_ARRAY) {
        hn_free((void *)v->v.arr.data);
        if (v->v.arr.items) {
            gguf_value *items = (gguf_value *)v->v.arr.items;
            for (uint64_t i = 0; i < v->v.arr.n; i++) value_free(&items[i]);
            hn_free(items);
        }
    }
    memset(v, 0, sizeof *v);
}

/* Checks that v is well formed and nests at most W_MAX_DEPTH arrays deep. */
static bool value_valid(const gguf_value *v, int depth) {
    if ((unsigned)v->type >= GGUF_VTYPE_COUNT) return false;
    if (v->type == GGUF_STRING) return v->v.str.ptr || v->v.str.len == 0;
    if (v->type != GGUF_ARRAY) return true;
    if (depth >= W_MAX_DEPTH) return false;
    gguf_vtype e = v->v.arr.elem;
    if ((unsigned)e >= GGUF_VTYPE_COUNT) return false;
    if (v->v.arr.n == 0) return true;
    if (gguf_vtype_size(e)) return v->v.arr.data != NULL && v->v.arr.n <= SIZE_MAX / gguf_vtype_size(e);
    if (!v->v.arr.items || v->v.arr.n > SIZE_MAX / sizeof(gguf_value)) return false;
    for (uint64_t i = 0; i < v->v.arr.n; i++) {
        if (v->v.arr.items[i].type != e || !value_valid(&v->v.arr.items[i], depth + 1)) return false;
    }
    return true;
}

/* Deep-copies a validated value into dst; on failure dst is left freeable. */
static hn_status value_copy(gguf_value *dst, const gguf_value *src) {
    memset(dst, 0, sizeof *dst);
    dst->type = src->type;
    if (src->type == GGUF_STRING) {
        uint64_t len = src->v.str.len;
        if (len >= SIZE_MAX) return HN_ERR_NOMEM;
        char *p = hn_malloc((size_t)len + 1);
        if (!p) return HN_ERR_NOMEM;
        if (len) memcpy(p, src->v.str.ptr, (size_t)len);
        p[len] = '\0';
        dst->v.str.ptr = p;
        dst->v.str.len = len;
        return HN_OK;
    }
    if (src->type != GGUF_ARRAY) {
        dst->v = src->v;
        return HN_OK;
    }
    gguf_vtype e = src->v.arr.elem;
    uint64_t n = src->v.arr.n;
    dst->v.arr.elem = e;
    size_t esz = gguf_vtype_size(e);
    if (esz) {
        if (n) {
            void *p = hn_malloc((size_t)n * esz);
            if (!p) return HN_ERR_NOMEM;
            memcpy(p, src->v.arr.data, (size_t)n * esz);
            dst->v.arr.data = p;
        }
        dst->v.arr.n = n;
        return HN_OK;
    }
    if (!n) return HN_OK;
    gguf_value *items = hn_calloc((size_t)n, sizeof *items);
    if (!items) return HN_ERR_NOMEM;
    dst->v.arr.items = items;
    for (uint64_t i = 0; i < n; i++) {
        dst->v.arr.n = i; /* so a partial copy frees only what exists */
        hn_status s = value_copy(&items[i], &src->v.arr.items[i]);
        if (s) {
            value_free(&items[i]);
            return s;
        }
    }
    dst->v.arr.n = n;
    return HN_OK;
}

/* ---- writer ---- */

gguf_writer *gguf_writer_new(void) { return hn_calloc(1, sizeof(gguf_writer)); }

void gguf_writer_free(gguf_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n_kv; i++) {
        hn_free(w->kv[i].key);
        value_free(&w->kv[i].val);
    }
    hn_free(w->kv);
    for (size_t i = 0; i < w->n_t; i++) hn_free(w->t[i].name);
    hn_free(w->t);
    hn_free(w);
}

hn_status gguf_writer_set_value(gguf_writer *w, const char *key, const gguf_value *v) {
    if (!w || !key || !*key || strlen(key) > 65535 || !v || !value_valid(v, 0)) return HN_ERR_INVALID;
    gguf_value copy;
    hn_status s = value_copy(&copy, v);
    if (s) {
        value_free(&copy);
        return s;
    }
    for (size_t i = 0; i < w->n_kv; i++) {
        if (!strcmp(w->kv[i].key, key)) {
            value_free(&w->kv[i].val);
            w->kv[i].val = copy;
            return HN_OK;
        }
    }
    if (w->n_kv == w->cap_kv) {
        size_t cap = w->cap_kv ? w->cap_kv * 2 : 32;
        wkv *kv = hn_realloc(w->kv, cap * sizeof *kv);
        if (!kv) {
            value_free(&copy);
            return HN_ERR_NOMEM;
        }
        w->kv = kv;
        w->cap_kv = cap;
    }
    char *k = hn_strdup(key);
    if (!k) {
        value_free(&copy);
        return HN_ERR_NOMEM;
    }
    w->kv[w->n_kv].key = k;
    w->kv[w->n_kv].val = copy;
    w->n_kv++;
    return HN_OK;
}

hn_status gguf_writer_set_alignment(gguf_writer *w, size_t alignment) {
    if (!alignment || (alignment & (alignment - 1)) || alignment > (1u << 24)) return HN_ERR_INVALID;
    return gguf_writer_set_u32(w, "general.alignment", (uint32_t)alignment);
}

hn_status gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t x) {
    gguf_value v = {.type = GGUF_U32, .v.u64 = x};
    return gguf_writer_set_value(w, key, &v);
}

hn_status gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t x) {
    gguf_value v = {.type = GGUF_I32, .v.i64 = x};
    return gguf_writer_set_value(w, key, &v);
}

hn_status gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t x) {
    gguf_value v = {.type = GGUF_U64, .v.u64 = x};
    return gguf_writer_set_value(w, key, &v);
}

hn_status gguf_writer_set_f32(gguf_writer *w, const char *key, float x) {
    gguf_value v = {.type = GGUF_F32, .v.f64 = x};
    return gguf_writer_set_value(w, key, &v);
}

hn_status gguf_writer_set_bool(gguf_writer *w, const char *key, bool x) {
    gguf_value v = {.type = GGUF_BOOL, .v.b = x};
    return gguf_writer_set_value(w, key, &v);
}

hn_status gguf_writer_set_str(gguf_writer *w, const char *key, const char *str) {
    if (!str) return HN_ERR_INVALID;
    gguf_value v = {.type = GGUF_STRING, .v.str = {str, strlen(str)}};
    return gguf_writer_set_value(w, key, &v);
}

hn_status gguf_writer_set_arr(gguf_writer *w, const char *key, gguf_vtype elem, const void *data, uint64_t n) {
    if (!gguf_vtype_size(elem)) return HN_ERR_INVALID;
    gguf_value v = {.type = GGUF_ARRAY};
    v.v.arr.elem = elem;
    v.v.arr.n = n;
    v.v.arr.data = data;
    return gguf_writer_set_value(w, key, &v);
}

hn_status gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *strs, uint64_t n) {
    if (n && !strs) return HN_ERR_INVALID;
    if (n > SIZE_MAX / sizeof(gguf_value)) return HN_ERR_INVALID;
    gguf_value *items = n ? hn_malloc((size_t)n * sizeof *items) : NULL;
    if (n && !items) return HN_ERR_NOMEM;
    for (uint64_t i = 0; i < n; i++) {
        if (!strs[i]) {
            hn_free(items);
            return HN_ERR_INVALID;
        }
        items[i] = (gguf_value){.type = GGUF_STRING, .v.str = {strs[i], strlen(strs[i])}};
    }
    gguf_value v = {.type = GGUF_ARRAY};
    v.v.arr.elem = GGUF_STRING;
    v.v.arr.n = n;
    v.v.arr.items = items;
    hn_status s = gguf_writer_set_value(w, key, &v);
    hn_free(items);
    return s;
}

hn_status gguf_writer_add_tensor(gguf_writer *w, const char *name, qt_type type, int n_dims, const int64_t *ne,
                                 const void *data, size_t nbytes) {
    if (!w || !name || !*name || strlen(name) > W_MAX_NAME || n_dims < 0 || n_dims > GGUF_MAX_DIMS ||
        (n_dims && !ne))
        return HN_ERR_INVALID;
    int64_t shape[GGUF_MAX_DIMS] = {1, 1, 1, 1};
    for (int d = 0; d < n_dims; d++) shape[d] = ne[d];
    size_t expect;
    const char *why;
    if (!gguf_tensor_size((uint32_t)type, n_dims, shape, &expect, &why)) return HN_ERR_INVALID;
    if (expect != nbytes || (nbytes && !data)) return HN_ERR_INVALID;
    for (size_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name)) return HN_ERR_INVALID;
    if (w->n_t == w->cap_t) {
        size_t cap = w->cap_t ? w->cap_t * 2 : 64;
        wtensor *t = hn_realloc(w->t, cap * sizeof *t);
        if (!t) return HN_ERR_NOMEM;
        w->t = t;
        w->cap_t = cap;
    }
    char *nm = hn_strdup(name);
    if (!nm) return HN_ERR_NOMEM;
    wtensor *t = &w->t[w->n_t++];
    t->name = nm;
    t->type = type;
    t->n_dims = n_dims;
    memcpy(t->ne, shape, sizeof shape);
    t->data = data;
    t->nbytes = nbytes;
    return HN_OK;
}

/* ---- serialization ---- */

typedef struct {
    size_t n;         /* bytes emitted so far */
    unsigned char *buf; /* memory sink, or NULL */
    FILE *f;          /* file sink, or NULL; neither = counting only */
    bool failed;
} sink;

static void emit(sink *s, const void *p, size_t n) {
    if (!n || s->failed) return;
    if (s->buf) memcpy(s->buf + s->n, p, n);
    else if (s->f && fwrite(p, 1, n, s->f) != n) s->failed = true;
    s->n += n;
}

static void emit_zeros(sink *s, size_t n) {
    static const unsigned char z[256];
    while (n) {
        size_t k = n < sizeof z ? n : sizeof z;
        emit(s, z, k);
        n -= k;
    }
}

static void emit_u32(sink *s, uint32_t v) { emit(s, &v, 4); }
static void emit_u64(sink *s, uint64_t v) { emit(s, &v, 8); }

static void emit_str(sink *s, const char *p, uint64_t len) {
    emit_u64(s, len);
    emit(s, p, (size_t)len);
}

/* The value's payload (no type tag). */
static void emit_value(sink *s, const gguf_value *v) {
    uint8_t u8; uint16_t u16; uint32_t u32; float f;
    switch (v->type) {
    case GGUF_U8: case GGUF_I8: u8 = (uint8_t)v->v.u64; emit(s, &u8, 1); break;
    case GGUF_BOOL: u8 = v->v.b ? 1 : 0; emit(s, &u8, 1); break;
    case GGUF_U16: case GGUF_I16: u16 = (uint16_t)v->v.u64; emit(s, &u16, 2); break;
    case GGUF_U32: case GGUF_I32: u32 = (uint32_t)v->v.u64; emit(s, &u32, 4); break;
    case GGUF_F32: f = (float)v->v.f64; emit(s, &f, 4); break;
    case GGUF_U64: case GGUF_I64: case GGUF_F64: emit(s, &v->v.u64, 8); break;
    case GGUF_STRING: emit_str(s, v->v.str.ptr, v->v.str.len); break;
    case GGUF_ARRAY:
        emit_u32(s, (uint32_t)v->v.arr.elem);
        emit_u64(s, v->v.arr.n);
        if (gguf_vtype_size(v->v.arr.elem)) {
            emit(s, v->v.arr.data, (size_t)v->v.arr.n * gguf_vtype_size(v->v.arr.elem));
        } else {
            for (uint64_t i = 0; i < v->v.arr.n; i++) emit_value(s, &v->v.arr.items[i]);
        }
        break;
    default: break;
    }
}

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* Alignment the file will declare (general.alignment if set, else the default). */
static hn_status writer_alignment(const gguf_writer *w, size_t *out, hn_err *err) {
    *out = GGUF_DEFAULT_ALIGNMENT;
    for (size_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kv[i].key, "general.alignment")) continue;
        const gguf_value *v = &w->kv[i].val;
        if (v->type != GGUF_U32 || !v->v.u64 || (v->v.u64 & (v->v.u64 - 1)) || v->v.u64 > (1u << 24))
            return hn_errf(err, HN_ERR_INVALID, "general.alignment must be a u32 power of two");
        *out = (size_t)v->v.u64;
    }
    return HN_OK;
}

/* Emits the whole file; offsets[] receives each tensor's data offset. */
static void emit_file(const gguf_writer *w, sink *s, size_t align) {
    emit(s, "GGUF", 4);
    emit_u32(s, 3);
    emit_u64(s, w->n_t);
    emit_u64(s, w->n_kv);
    for (size_t i = 0; i < w->n_kv; i++) {
        emit_str(s, w->kv[i].key, strlen(w->kv[i].key));
        emit_u32(s, (uint32_t)w->kv[i].val.type);
        emit_value(s, &w->kv[i].val);
    }
    size_t off = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        emit_str(s, t->name, strlen(t->name));
        emit_u32(s, (uint32_t)t->n_dims);
        for (int d = 0; d < t->n_dims; d++) emit_u64(s, (uint64_t)t->ne[d]);
        emit_u32(s, (uint32_t)t->type);
        emit_u64(s, off);
        off = align_up(off + t->nbytes, align);
    }
    if (w->n_t == 0) return;
    emit_zeros(s, align_up(s->n, align) - s->n);
    for (size_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        emit(s, t->data, t->nbytes);
        emit_zeros(s, align_up(t->nbytes, align) - t->nbytes);
    }
}

hn_status gguf_writer_write_mem(gguf_writer *w, void **buf, size_t *size, hn_err *err) {
    *buf = NULL;
    *size = 0;
    size_t align;
    hn_status st = writer_alignment(w, &align, err);
    if (st) return st;
    sink count = {0};
    emit_file(w, &count, align);
    unsigned char *p = hn_malloc(count.n ? count.n : 1);
    if (!p) return hn_errf(err, HN_ERR_NOMEM, "out of memory for a %zu-byte GGUF file", count.n);
    sink s = {.buf = p};
    emit_file(w, &s, align);
    *buf = p;
    *size = s.n;
    return HN_OK;
}

hn_status gguf_writer_write(gguf_writer *w, const char *path, hn_err *err) {
    size_t align;
    hn_status st = writer_alignment(w, &align, err);
    if (st) return st;
    /* write beside the target and rename, so readers never see a partial file */
    size_t n = strlen(path) + 32;
    char *tmp = hn_malloc(n);
    if (!tmp) return hn_errf(err, HN_ERR_NOMEM, "out of memory");
    snprintf(tmp, n, "%s.tmp%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        st = hn_errf(err, HN_ERR_IO, "%s: %s", tmp, strerror(errno));
        hn_free(tmp);
        return st;
    }
    sink s = {.f = f};
    emit_file(w, &s, align);
    bool bad = s.failed;
    int e = errno;
    if (fclose(f) != 0 && !bad) {
        bad = true;
        e = errno;
    }
    if (!bad && rename(tmp, path) != 0) {
        bad = true;
        e = errno;
    }
    if (bad) {
        remove(tmp);
        st = hn_errf(err, HN_ERR_IO, "writing %s: %s", path, strerror(e));
    }
    hn_free(tmp);
    return st;
}
