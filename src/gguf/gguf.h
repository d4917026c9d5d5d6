/* gguf.h: reading and writing GGUF files.
 *
 * Layout (v2 and v3; v1 is refused):
 *   u32 magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
 *   n_kv x { string key | u32 vtype | value }
 *   n_tensors x { string name | u32 n_dims | u64 ne[n_dims] | u32 type | u64 offset }
 *   padding to `general.alignment` (default 32) | tensor data
 * string = u64 length + bytes (no terminator); array = u32 elem vtype + u64 n + n values
 * (arrays may nest). All little-endian. Tensor offsets are relative to the data
 * section and must be multiples of the alignment.
 *
 * The file is untrusted: gguf_open checks every count, length, offset and size
 * against the bytes actually present (and against sane limits) before use, and
 * fails with HN_ERR_FORMAT and a message naming what is wrong. Once open, every
 * pointer the accessors return stays valid until gguf_close. Strings returned by
 * the reader are NUL-terminated copies (len is authoritative: a GGUF string may
 * contain NUL bytes). */
#ifndef HN_GGUF_H
#define HN_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../core/status.h"
#include "../quant/blocks.h"

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4

typedef enum gguf_vtype {
    GGUF_U8 = 0,
    GGUF_I8 = 1,
    GGUF_U16 = 2,
    GGUF_I16 = 3,
    GGUF_U32 = 4,
    GGUF_I32 = 5,
    GGUF_F32 = 6,
    GGUF_BOOL = 7,
    GGUF_STRING = 8,
    GGUF_ARRAY = 9,
    GGUF_U64 = 10,
    GGUF_I64 = 11,
    GGUF_F64 = 12,
    GGUF_VTYPE_COUNT
} gguf_vtype;

/* A metadata value. Scalars are widened into u64/i64/f64 (b for bool);
 * arrays hold `n` elements of `elem`: for scalar elements `data` points at the
 * raw little-endian values in the file (read them with gguf_arr_*), for string
 * and array elements `items` holds n parsed values. */
typedef struct gguf_value {
    gguf_vtype type;
    union {
        uint64_t u64;
        int64_t i64;
        double f64;
        bool b;
        struct { const char *ptr; uint64_t len; } str;
        struct {
            gguf_vtype elem;
            uint64_t n;
            const void *data;
            const struct gguf_value *items;
        } arr;
    } v;
} gguf_value;

typedef struct gguf_tensor {
    const char *name;
    qt_type type;
    int n_dims;
    int64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the row length; unused dims are 1 */
    uint64_t offset;           /* relative to the data section */
    size_t nbytes;
    const void *data;          /* into the mapping */
} gguf_tensor;

typedef struct gguf_ctx gguf_ctx;

/* Opens and validates a file (mmap, read-only). On failure *out is NULL. */
hn_status gguf_open(const char *path, gguf_ctx **out, hn_err *err);
/* Same over a caller's buffer, which must outlive the context (tests, fuzzing). */
hn_status gguf_open_mem(const void *data, size_t size, gguf_ctx **out, hn_err *err);
void gguf_close(gguf_ctx *ctx);

uint32_t gguf_version(const gguf_ctx *ctx);
size_t gguf_alignment(const gguf_ctx *ctx);
size_t gguf_data_offset(const gguf_ctx *ctx);   /* file offset of the tensor data */

int64_t gguf_n_kv(const gguf_ctx *ctx);
const char *gguf_kv_key(const gguf_ctx *ctx, int64_t i);
const gguf_value *gguf_kv_value(const gguf_ctx *ctx, int64_t i);
/* Index of a key, or -1. */
int64_t gguf_find_kv(const gguf_ctx *ctx, const char *key);
/* The value of a key, or NULL. */
const gguf_value *gguf_get(const gguf_ctx *ctx, const char *key);

/* Typed getters: return false (leaving *out unchanged) if the key is missing or
 * its value does not convert exactly (integers must fit; f32/f64 both read as float). */
bool gguf_get_u32(const gguf_ctx *ctx, const char *key, uint32_t *out);
bool gguf_get_i64(const gguf_ctx *ctx, const char *key, int64_t *out);
bool gguf_get_f32(const gguf_ctx *ctx, const char *key, float *out);
bool gguf_get_bool(const gguf_ctx *ctx, const char *key, bool *out);
/* NUL-terminated string; NULL if missing or not a string. */
const char *gguf_get_str(const gguf_ctx *ctx, const char *key);

/* Array element access (index checked by the caller against arr.n). Numeric
 * reads convert from any numeric element type. */
int64_t gguf_arr_int(const gguf_value *arr, uint64_t i);
double gguf_arr_float(const gguf_value *arr, uint64_t i);
const char *gguf_arr_str(const gguf_value *arr, uint64_t i, uint64_t *len);

int64_t gguf_n_tensors(const gguf_ctx *ctx);
const gguf_tensor *gguf_tensor_at(const gguf_ctx *ctx, int64_t i);
/* The tensor with this name, or NULL. */
const gguf_tensor *gguf_find_tensor(const gguf_ctx *ctx, const char *name);

/* Printable name of a value type ("u32", "array"...). */
const char *gguf_vtype_name(gguf_vtype t);

/* ---- writing ----
 * A writer collects metadata and tensors, then writes a v3 file. Keys and
 * values are copied; tensor data is borrowed and must stay valid until
 * gguf_writer_write returns. Setting an existing key replaces it. */
typedef struct gguf_writer gguf_writer;

gguf_writer *gguf_writer_new(void);
void gguf_writer_free(gguf_writer *w);
hn_status gguf_writer_set_alignment(gguf_writer *w, size_t alignment);
hn_status gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v);
hn_status gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v);
hn_status gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v);
hn_status gguf_writer_set_f32(gguf_writer *w, const char *key, float v);
hn_status gguf_writer_set_bool(gguf_writer *w, const char *key, bool v);
hn_status gguf_writer_set_str(gguf_writer *w, const char *key, const char *s);
/* An array of n scalars of type elem, read from `data` in the host layout. */
hn_status gguf_writer_set_arr(gguf_writer *w, const char *key, gguf_vtype elem, const void *data, uint64_t n);
hn_status gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *strs, uint64_t n);
/* Copies any value, nested arrays included (e.g. from a reader). */
hn_status gguf_writer_set_value(gguf_writer *w, const char *key, const gguf_value *v);
hn_status gguf_writer_add_tensor(gguf_writer *w, const char *name, qt_type type, int n_dims,
                                 const int64_t *ne, const void *data, size_t nbytes);
hn_status gguf_writer_write(gguf_writer *w, const char *path, hn_err *err);
/* Writes into a new hn_malloc'd buffer the caller frees with hn_free. */
hn_status gguf_writer_write_mem(gguf_writer *w, void **buf, size_t *size, hn_err *err);

#endif
