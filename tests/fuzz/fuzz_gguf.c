/* fuzz_gguf.c: a libFuzzer harness for the GGUF reader (gguf_open_mem) and
 * what reads a hostile file's metadata next: every key, value, array element
 * and tensor record is visited (tensor data bytes touched at both ends, so
 * ASan sees an out-of-range extent), lookups must agree with the index, and
 * the tokenizer is loaded from it (tok_load) and, when that succeeds, run on
 * a fixed text. A crash, a sanitizer report, a leak or a disagreement is a
 * finding. Seeds: tests/fuzz/corpus/gguf (small files from
 * tests/fuzz/gguf_seeds.c). */
#include <string.h>

#include "fuzz_common.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

static void fuzz_gguf_init(void) {}

static volatile uint64_t g_sink;

static void visit_value(const gguf_value *v, int depth) {
    switch (v->type) {
    case GGUF_STRING:
        if (v->v.str.len && v->v.str.ptr) g_sink += (uint8_t)v->v.str.ptr[v->v.str.len - 1];
        break;
    case GGUF_ARRAY: {
        uint64_t n = v->v.arr.n < 4096 ? v->v.arr.n : 4096;
        for (uint64_t i = 0; i < n; i++) {
            if (v->v.arr.elem == GGUF_STRING) {
                uint64_t len = 0;
                const char *s = gguf_arr_str(v, i, &len);
                if (s && len) g_sink += (uint8_t)s[len - 1];
            } else if (v->v.arr.elem == GGUF_ARRAY) {
                if (depth < 8) visit_value(&v->v.arr.items[i], depth + 1);
            } else if (v->v.arr.elem == GGUF_F32 || v->v.arr.elem == GGUF_F64) {
                g_sink += (uint64_t)(gguf_arr_float(v, i) != 0.0);
            } else {
                g_sink += (uint64_t)gguf_arr_int(v, i);
            }
        }
        break;
    }
    default:
        g_sink += v->v.u64;
    }
}

static void fuzz_gguf_one(const uint8_t *data, size_t size) {
    gguf_ctx *g = NULL;
    hn_err err = {0};
    if (gguf_open_mem(data, size, &g, &err) != HN_OK) {
        if (g) fuzz_fail("gguf_open_mem failed but set *out");
        if (!err.msg[0]) fuzz_fail("gguf_open_mem failed without a message");
        return;
    }
    (void)gguf_version(g);
    if (!gguf_alignment(g)) fuzz_fail("alignment 0");
    (void)gguf_data_offset(g); /* may pass the end when no tensor has data */
    for (int64_t i = 0; i < gguf_n_kv(g); i++) {
        const char *key = gguf_kv_key(g, i);
        const gguf_value *v = gguf_kv_value(g, i);
        if (!key || !v) fuzz_fail("kv %lld: NULL key or value", (long long)i);
        int64_t j = gguf_find_kv(g, key);
        if (j < 0 || strcmp(gguf_kv_key(g, j), key)) fuzz_fail("gguf_find_kv(%s) disagrees", key);
        (void)gguf_vtype_name(v->type);
        visit_value(v, 0);
        uint32_t u32;
        int64_t i64;
        float f;
        bool b;
        g_sink += gguf_get_u32(g, key, &u32) + gguf_get_i64(g, key, &i64) + gguf_get_f32(g, key, &f) +
                  gguf_get_bool(g, key, &b);
        const char *s = gguf_get_str(g, key);
        if (s) g_sink += strlen(s);
    }
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        if (!t || !t->name) fuzz_fail("tensor %lld: NULL", (long long)i);
        if (t->n_dims < 0 || t->n_dims > GGUF_MAX_DIMS) fuzz_fail("tensor %s: %d dims", t->name, t->n_dims);
        if (t->nbytes) {
            const uint8_t *p = t->data;
            if (p < data || p + t->nbytes > data + size) fuzz_fail("tensor %s outside the buffer", t->name);
            g_sink += p[0] + p[t->nbytes - 1];
        }
        const gguf_tensor *u = gguf_find_tensor(g, t->name);
        if (!u || strcmp(u->name, t->name)) fuzz_fail("gguf_find_tensor(%s) disagrees", t->name);
    }
    tok_vocab *v = NULL;
    if (tok_load(g, &v, &err) == HN_OK) {
        static const char text[] = "Hello world <|im_start|>user\n\xc3\xa9t\xc3\xa9 123 <s></s>\t\n";
        int32_t ids[256];
        for (int ps = 0; ps < 2; ps++) {
            int64_t n = tok_encode(v, text, sizeof text - 1, true, ps, ids, 256);
            if (n < 0) fuzz_fail("tok_encode on a loaded vocabulary: %lld", (long long)n);
            char piece[64];
            for (int64_t k = 0; k < n && k < 256; k++) {
                if (ids[k] < 0 || ids[k] >= tok_n_vocab(v)) fuzz_fail("token id %d out of range", ids[k]);
                g_sink += (uint64_t)tok_piece(v, ids[k], true, piece, sizeof piece);
            }
        }
        for (int32_t id = -1; id < tok_n_vocab(v) && id < 512; id++) {
            char piece[64];
            g_sink += (uint64_t)tok_piece(v, id, id & 1, piece, sizeof piece) + (id >= 0 && tok_is_eog(v, id));
            (void)tok_text(v, id);
        }
        tok_free(v);
    }
    gguf_close(g);
}

FUZZ_ENTRY(gguf)
