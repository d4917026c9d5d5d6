/* test_gguf.c: the GGUF reader and writer: every shared model and vocab file
 * loads with the expected keys and tensors; round trips through the writer for
 * every value type; truncation at every header byte, seeded bit flips and
 * hand-made hostile headers all fail cleanly with HN_ERR_FORMAT. */
#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "gguf/gguf.h"
#include "test.h"

static int sanitized(void) {
    const char *s = getenv("HONE_SANITIZED");
    return s && *s && strcmp(s, "0") != 0;
}

static void *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = malloc(n > 0 ? (size_t)n : 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *size = (size_t)n;
    return buf;
}

/* Opens a copy of exactly `size` bytes (so ASan sees any read past the end);
 * returns the status, closing the context on success. */
static hn_status open_exact(const void *data, size_t size, hn_err *err) {
    void *copy = malloc(size ? size : 1);
    memcpy(copy, data, size);
    gguf_ctx *c = NULL;
    hn_status s = gguf_open_mem(copy, size, &c, err);
    if (s == HN_OK) {
        /* touch everything the reader hands out */
        for (int64_t i = 0; i < gguf_n_kv(c); i++) {
            const gguf_value *v = gguf_kv_value(c, i);
            if (v->type == GGUF_ARRAY && v->v.arr.n) {
                (void)gguf_arr_int(v, v->v.arr.n - 1);
                (void)gguf_arr_str(v, v->v.arr.n - 1, NULL);
            }
        }
        for (int64_t i = 0; i < gguf_n_tensors(c); i++) {
            const gguf_tensor *t = gguf_tensor_at(c, i);
            if (t->nbytes) {
                volatile unsigned char x = ((const unsigned char *)t->data)[t->nbytes - 1];
                (void)x;
            }
        }
        gguf_close(c);
    } else if (c != NULL) {
        s = HN_ERR_INTERNAL;
    }
    free(copy);
    return s;
}

/* ---- real files ---- */

typedef struct {
    const char *file, *arch;
    int64_t n_tensors;
    qt_type weight_type; /* type of blk.0.attn_q.weight, or -1 */
} model_case;

static void test_real_models(void) {
    static const model_case cases[] = {
        {"llama-2k-f32.gguf", "llama", 21, QT_F32},       {"llama-2k-f16.gguf", "llama", 21, QT_F16},
        {"llama-2k-bf16.gguf", "llama", 21, QT_BF16},     {"llama-2k-q8_0.gguf", "llama", 21, QT_Q8_0},
        {"llama-2k-q4_0.gguf", "llama", 21, QT_Q4_0},     {"llama-2k-q4_1.gguf", "llama", 21, QT_Q4_1},
        {"llama-2k-q5_0.gguf", "llama", 21, QT_Q5_0},     {"llama-2k-q5_1.gguf", "llama", 21, QT_Q5_1},
        {"llama-2k-q2_k.gguf", "llama", 21, -1},          {"llama-2k-q3_k_m.gguf", "llama", 21, -1},
        {"llama-2k-q4_k_m.gguf", "llama", 21, -1},        {"llama-2k-q5_k_m.gguf", "llama", 21, -1},
        {"llama-2k-q6_k.gguf", "llama", 21, QT_Q6_K},     {"llama-2k-iq4_nl.gguf", "llama", 21, QT_IQ4_NL},
        {"llama-2k-iq4_xs.gguf", "llama", 21, QT_IQ4_XS}, {"qwen2-2k-f16.gguf", "qwen2", 26, QT_F16},
        {"qwen2-2k-q8_0.gguf", "qwen2", 26, QT_Q8_0},     {"qwen3-2k-f32.gguf", "qwen3", 24, QT_F32},
        {"qwen3-2k-f16.gguf", "qwen3", 24, QT_F16},       {"qwen3-2k-q8_0.gguf", "qwen3", 24, QT_Q8_0},
        {"qwen3-2k-q4_k_m.gguf", "qwen3", 24, -1},        {"qwen3-real-q8_0.gguf", "qwen3", 24, QT_Q8_0},
        {"qwen3moe-2k-f16.gguf", "qwen3moe", 27, QT_F16}, {"qwen3moe-2k-q8_0.gguf", "qwen3moe", 27, QT_Q8_0},
        {"qwen3moe-2k-q4_k_m.gguf", "qwen3moe", 27, -1},  {"qwen3moe-2k-mxfp4_moe.gguf", "qwen3moe", 27, -1},
    };
    char path[512], key[128];
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const model_case *mc = &cases[k];
        snprintf(path, sizeof path, "data/models/%s", mc->file);
        char full[600];
        test_data_path(full, sizeof full, path);
        gguf_ctx *c = NULL;
        hn_err err;
        hn_err_clear(&err);
        hn_status s = gguf_open(full, &c, &err);
        CHECKF(s == HN_OK, "%s: %s", mc->file, err.msg);
        if (s) continue;
        CHECK(gguf_version(c) == 3);
        CHECK(gguf_alignment(c) == 32);
        CHECK(gguf_data_offset(c) % 32 == 0);
        const char *arch = gguf_get_str(c, "general.architecture");
        CHECKF(arch && !strcmp(arch, mc->arch), "%s: arch %s", mc->file, arch ? arch : "(null)");
        CHECKF(gguf_n_tensors(c) == mc->n_tensors, "%s: %" PRId64 " tensors", mc->file, gguf_n_tensors(c));
        uint32_t u = 0;
        snprintf(key, sizeof key, "%s.embedding_length", mc->arch);
        bool ok = gguf_get_u32(c, key, &u);
        uint32_t expect_width = strstr(mc->file, "real") ? 64 : 256;
        CHECKF(ok && u == expect_width, "%s: %s = %u", mc->file, key, u);
        snprintf(key, sizeof key, "%s.block_count", mc->arch);
        CHECK(gguf_get_u32(c, key, &u) && u == 2);
        float eps = 0;
        snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", mc->arch);
        CHECK(gguf_get_f32(c, key, &eps) && eps > 0 && eps < 1e-3f);
        const gguf_value *toks = gguf_get(c, "tokenizer.ggml.tokens");
        CHECK(toks && toks->type == GGUF_ARRAY && toks->v.arr.elem == GGUF_STRING && toks->v.arr.n >= 2048);
        const gguf_tensor *emb = gguf_find_tensor(c, "token_embd.weight");
        CHECKF(emb && emb->ne[0] == expect_width && toks && emb->ne[1] == (int64_t)toks->v.arr.n,
               "%s: token_embd shape", mc->file);
        const gguf_tensor *q = gguf_find_tensor(c, "blk.0.attn_q.weight");
        CHECKF(q && q->n_dims == 2 && q->ne[0] == expect_width, "%s: attn_q", mc->file);
        if (q && (int)mc->weight_type >= 0)
            CHECKF(q->type == mc->weight_type, "%s: attn_q type %d", mc->file, (int)q->type);
        CHECK(gguf_find_tensor(c, "no.such.tensor") == NULL);
        CHECK(gguf_find_kv(c, "no.such.key") == -1);
        /* data spans are inside the file and ordered */
        uint64_t end = 0;
        for (int64_t i = 0; i < gguf_n_tensors(c); i++) {
            const gguf_tensor *t = gguf_tensor_at(c, i);
            CHECK(t && gguf_find_tensor(c, t->name) == t);
            if (t) end = t->offset + t->nbytes > end ? t->offset + t->nbytes : end;
        }
        CHECK(end > 0);
        gguf_close(c);
    }
}

static void test_real_vocab(void) {
    static const struct { const char *file, *model; uint64_t min_tokens; } cases[] = {
        {"ggml-vocab-bert-bge.gguf", "bert", 30000},       {"ggml-vocab-deepseek-coder.gguf", "gpt2", 32000},
        {"ggml-vocab-deepseek-llm.gguf", "gpt2", 100000},  {"ggml-vocab-falcon.gguf", "gpt2", 65000},
        {"ggml-vocab-gpt-2.gguf", "gpt2", 50000},          {"ggml-vocab-llama-spm.gguf", "llama", 32000},
        {"ggml-vocab-llama3-npm.gguf", "gpt2", 128000},    {"ggml-vocab-mpt.gguf", "gpt2", 50000},
        {"ggml-vocab-phi-3.gguf", "llama", 32000},         {"ggml-vocab-qwen3-npm.gguf", "gpt2", 150000},
        {"ggml-vocab-refact.gguf", "gpt2", 49000},         {"ggml-vocab-starcoder.gguf", "gpt2", 49000},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char rel[256], full[600];
        snprintf(rel, sizeof rel, "data/vocab/%s", cases[k].file);
        test_data_path(full, sizeof full, rel);
        gguf_ctx *c = NULL;
        hn_err err;
        hn_err_clear(&err);
        hn_status s = gguf_open(full, &c, &err);
        CHECKF(s == HN_OK, "%s: %s", cases[k].file, err.msg);
        if (s) continue;
        CHECK(gguf_n_tensors(c) == 0);
        const char *m = gguf_get_str(c, "tokenizer.ggml.model");
        CHECKF(m && !strcmp(m, cases[k].model), "%s: model %s", cases[k].file, m ? m : "(null)");
        const gguf_value *toks = gguf_get(c, "tokenizer.ggml.tokens");
        CHECKF(toks && toks->type == GGUF_ARRAY && toks->v.arr.elem == GGUF_STRING &&
                   toks->v.arr.n >= cases[k].min_tokens,
               "%s: tokens", cases[k].file);
        if (toks && toks->v.arr.n) {
            uint64_t len = 0;
            const char *t0 = gguf_arr_str(toks, 0, &len);
            CHECK(t0 && strlen(t0) == len);
            CHECK(gguf_arr_str(toks, toks->v.arr.n, NULL) == NULL);
        }
        const gguf_value *tt = gguf_get(c, "tokenizer.ggml.token_type");
        if (tt) CHECK(tt->type == GGUF_ARRAY && toks && tt->v.arr.n == toks->v.arr.n);
        gguf_close(c);
    }
    /* qwen3: a known token and the chat template */
    char full[600];
    test_data_path(full, sizeof full, "data/vocab/ggml-vocab-qwen3-npm.gguf");
    gguf_ctx *c = NULL;
    if (gguf_open(full, &c, NULL) == HN_OK) {
        const char *tmpl = gguf_get_str(c, "tokenizer.chat_template");
        CHECK(tmpl && strstr(tmpl, "<|im_start|>"));
        const gguf_value *toks = gguf_get(c, "tokenizer.ggml.tokens");
        uint32_t eos = 0;
        CHECK(gguf_get_u32(c, "tokenizer.ggml.eos_token_id", &eos));
        CHECK(toks && eos < toks->v.arr.n);
        gguf_close(c);
    } else {
        CHECK(!"qwen3 vocab opens");
    }
}

static void test_missing_file(void) {
    gguf_ctx *c = (gguf_ctx *)1;
    hn_err err;
    hn_err_clear(&err);
    CHECK(gguf_open("tests/no-such-file.gguf", &c, &err) == HN_ERR_NOT_FOUND);
    CHECK(c == NULL);
    CHECK(strstr(err.msg, "no-such-file") != NULL);
}

/* ---- truncation of a real file's first KB ---- */

static void test_truncate_real(void) {
    char full[600];
    test_data_path(full, sizeof full, "data/models/qwen3-2k-q8_0.gguf");
    size_t size = 0;
    unsigned char *buf = read_file(full, &size);
    CHECK(buf != NULL);
    if (!buf) return;
    hn_err err;
    CHECK(open_exact(buf, size, &err) == HN_OK);
    /* every prefix of the metadata + tensor-info region (the first ~37 KB here
     * is mostly the vocab), stepping through the first 4 KB byte by byte */
    gguf_ctx *c = NULL;
    CHECK(gguf_open_mem(buf, size, &c, NULL) == HN_OK);
    size_t hdr = c ? gguf_data_offset(c) : 4096;
    gguf_close(c);
    size_t step_after = sanitized() ? 1024 : 4096;
    int bad = 0;
    for (size_t n = 0; n < hdr + 64 && n < size; n += n < step_after ? 1 : 97) {
        hn_err_clear(&err);
        hn_status s = open_exact(buf, n, &err);
        if (s != HN_ERR_FORMAT || !err.msg[0]) bad++;
    }
    CHECKF(bad == 0, "%d truncated prefixes did not fail with HN_ERR_FORMAT", bad);
    free(buf);
}

/* ---- hand-made hostile files ---- */

typedef struct { unsigned char *p; size_t n, cap; } bytes;

static void b_put(bytes *b, const void *x, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, x, n);
    b->n += n;
}
static void b_u32(bytes *b, uint32_t v) { b_put(b, &v, 4); }
static void b_u64(bytes *b, uint64_t v) { b_put(b, &v, 8); }
static void b_str(bytes *b, const char *s) {
    b_u64(b, strlen(s));
    b_put(b, s, strlen(s));
}
static void b_hdr(bytes *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    b->n = 0;
    b_put(b, "GGUF", 4);
    b_u32(b, version);
    b_u64(b, n_tensors);
    b_u64(b, n_kv);
}
static void b_pad(bytes *b, size_t align) {
    static const unsigned char z[64];
    while (b->n % align) b_put(b, z, 1);
}
/* a tensor info: 1-D f32 of ne elements at offset */
static void b_tensor(bytes *b, const char *name, uint32_t n_dims, const int64_t *ne, uint32_t type, uint64_t off) {
    b_str(b, name);
    b_u32(b, n_dims);
    for (uint32_t i = 0; i < n_dims; i++) b_u64(b, (uint64_t)ne[i]);
    b_u32(b, type);
    b_u64(b, off);
}
static void b_zeros(bytes *b, size_t n) {
    for (size_t i = 0; i < n; i++) b_put(b, "", 1);
}

#define EXPECT_FORMAT(b, what, needle)                                                          \
    do {                                                                                        \
        hn_err e_;                                                                              \
        hn_err_clear(&e_);                                                                      \
        hn_status s_ = open_exact((b)->p, (b)->n, &e_);                                         \
        CHECKF(s_ == HN_ERR_FORMAT, "%s: got %s (%s)", what, hn_status_name(s_), e_.msg);      \
        CHECKF(strstr(e_.msg, needle) != NULL, "%s: message '%s' lacks '%s'", what, e_.msg, needle); \
    } while (0)

#define EXPECT_OK(b, what)                                                   \
    do {                                                                     \
        hn_err e_;                                                           \
        hn_err_clear(&e_);                                                   \
        hn_status s_ = open_exact((b)->p, (b)->n, &e_);                      \
        CHECKF(s_ == HN_OK, "%s: got %s (%s)", what, hn_status_name(s_), e_.msg); \
    } while (0)

static void test_hostile(void) {
    bytes b = {0};
    int64_t ne4[4] = {32, 1, 1, 1};

    /* a valid minimal file first, so the cases below differ in one thing */
    b_hdr(&b, 3, 1, 1);
    b_str(&b, "general.architecture");
    b_u32(&b, GGUF_STRING);
    b_str(&b, "x");
    b_tensor(&b, "t", 1, ne4, QT_F32, 0);
    b_pad(&b, 32);
    b_zeros(&b, 128);
    EXPECT_OK(&b, "minimal");
    b_hdr(&b, 2, 0, 0);
    EXPECT_OK(&b, "v2 empty");

    b_hdr(&b, 3, 0, 0);
    memcpy(b.p, "GGUG", 4);
    EXPECT_FORMAT(&b, "bad magic", "magic");
    b_hdr(&b, 1, 0, 0);
    EXPECT_FORMAT(&b, "v1", "version 1");
    b_hdr(&b, 4, 0, 0);
    EXPECT_FORMAT(&b, "v4", "version 4");
    b_hdr(&b, 0x03000000, 0, 0);
    EXPECT_FORMAT(&b, "big-endian", "big-endian");

    b_hdr(&b, 3, 0, UINT64_MAX);
    EXPECT_FORMAT(&b, "huge n_kv", "metadata count");
    b_hdr(&b, 3, UINT64_MAX / 2, 0);
    EXPECT_FORMAT(&b, "huge n_tensors", "tensor count");

    b_hdr(&b, 3, 0, 1);
    b_u64(&b, UINT64_MAX);
    b_zeros(&b, 16);
    EXPECT_FORMAT(&b, "huge key length", "key");
    b_hdr(&b, 3, 0, 1);
    b_u64(&b, 1000);
    b_zeros(&b, 16);
    EXPECT_FORMAT(&b, "key past end", "only");
    b_hdr(&b, 3, 0, 1);
    b_u64(&b, 0);
    b_u32(&b, GGUF_U8);
    b_zeros(&b, 8);
    EXPECT_FORMAT(&b, "empty key", "empty");

    b_hdr(&b, 3, 0, 1);
    b_str(&b, "k");
    b_u32(&b, GGUF_STRING);
    b_u64(&b, (uint64_t)1 << 40);
    b_zeros(&b, 16);
    EXPECT_FORMAT(&b, "huge string", "length");
    b_hdr(&b, 3, 0, 1);
    b_str(&b, "k");
    b_u32(&b, 13);
    b_zeros(&b, 8);
    EXPECT_FORMAT(&b, "bad vtype", "unknown value type 13");
    b_hdr(&b, 3, 0, 1);
    b_str(&b, "k");
    b_u32(&b, GGUF_ARRAY);
    b_u32(&b, GGUF_U32);
    b_u64(&b, UINT64_MAX / 2);
    b_zeros(&b, 64);
    EXPECT_FORMAT(&b, "huge array", "array of");
    b_hdr(&b, 3, 0, 1);
    b_str(&b, "k");
    b_u32(&b, GGUF_ARRAY);
    b_u32(&b, GGUF_STRING);
    b_u64(&b, 1000000);
    b_zeros(&b, 64);
    EXPECT_FORMAT(&b, "huge string array", "array of");
    b_hdr(&b, 3, 0, 1);
    b_str(&b, "k");
    b_u32(&b, GGUF_ARRAY);
    b_u32(&b, 99);
    b_u64(&b, 0);
    EXPECT_FORMAT(&b, "bad elem type", "element type");
    /* nesting: 8 levels deep is fine, 9 is refused */
    for (int depth = 8; depth <= 9; depth++) {
        b_hdr(&b, 3, 0, 1);
        b_str(&b, "k");
        b_u32(&b, GGUF_ARRAY);
        for (int i = 0; i < depth - 1; i++) {
            b_u32(&b, GGUF_ARRAY);
            b_u64(&b, 1);
        }
        b_u32(&b, GGUF_U8);
        b_u64(&b, 1);
        b_zeros(&b, 1);
        if (depth == 8) EXPECT_OK(&b, "depth 8");
        else EXPECT_FORMAT(&b, "depth 9", "nested");
    }
    /* duplicate key */
    b_hdr(&b, 3, 0, 2);
    for (int i = 0; i < 2; i++) {
        b_str(&b, "dup");
        b_u32(&b, GGUF_U8);
        b_zeros(&b, 1);
    }
    EXPECT_FORMAT(&b, "duplicate key", "duplicate key 'dup'");

    /* alignment */
    static const struct { uint32_t type; uint64_t v; const char *needle; } al[] = {
        {GGUF_U32, 0, "power of two"}, {GGUF_U32, 3, "power of two"}, {GGUF_U64, 32, "expected u32"},
        {GGUF_U32, 1u << 30, "power of two"},
    };
    for (size_t i = 0; i < sizeof al / sizeof al[0]; i++) {
        b_hdr(&b, 3, 0, 1);
        b_str(&b, "general.alignment");
        b_u32(&b, al[i].type);
        if (al[i].type == GGUF_U32) b_u32(&b, (uint32_t)al[i].v);
        else b_u64(&b, al[i].v);
        EXPECT_FORMAT(&b, "alignment", al[i].needle);
    }
    b_hdr(&b, 3, 1, 1);
    b_str(&b, "general.alignment");
    b_u32(&b, GGUF_U32);
    b_u32(&b, 64);
    b_tensor(&b, "t", 1, ne4, QT_F32, 0);
    b_pad(&b, 64);
    b_zeros(&b, 128);
    EXPECT_OK(&b, "alignment 64");

    /* tensor infos */
    struct tcase {
        uint32_t n_dims;
        int64_t ne[4];
        uint32_t type;
        uint64_t off;
        const char *what, *needle;
    };
    static const struct tcase tc[] = {
        {5, {32, 1, 1, 1}, QT_F32, 0, "n_dims 5", "dimensions"},
        {2, {-1, 1, 1, 1}, QT_F32, 0, "negative ne", "negative"},
        {1, {32}, 4, 0, "retired type", "unknown tensor type id 4"},
        {1, {32}, 40, 0, "unknown type", "unknown tensor type id 40"},
        {1, {33}, QT_Q8_0, 0, "row not block multiple", "block size"},
        {4, {INT64_MAX / 2, 4, 4, 4}, QT_F32, 0, "element overflow", "overflow"},
        {2, {1 << 30, 1 << 30}, QT_F32, 0, "size overflow / past end", "past end"},
        {1, {32}, QT_F32, 16, "misaligned offset", "multiple of the alignment"},
        {1, {32}, QT_F32, 1024, "offset past end", "extends past end of file"},
        {1, {64}, QT_F32, 0, "data past end", "extends past end of file"},
        {1, {32}, QT_F32, UINT64_MAX - 31, "offset wraps", "extends past end"},
    };
    for (size_t i = 0; i < sizeof tc / sizeof tc[0]; i++) {
        b_hdr(&b, 3, 1, 0);
        b_tensor(&b, "blk.0.attn_q.weight", tc[i].n_dims, tc[i].ne, tc[i].type, tc[i].off);
        b_pad(&b, 32);
        b_zeros(&b, 128);
        EXPECT_FORMAT(&b, tc[i].what, tc[i].needle);
    }
    /* zero-sized dims are allowed */
    {
        int64_t ne0[2] = {0, 7};
        b_hdr(&b, 3, 1, 0);
        b_tensor(&b, "empty", 2, ne0, QT_Q8_0, 0);
        b_pad(&b, 32);
        EXPECT_OK(&b, "zero-size tensor");
    }
    /* duplicate tensor names, overlapping data */
    b_hdr(&b, 3, 2, 0);
    b_tensor(&b, "a", 1, ne4, QT_F32, 0);
    b_tensor(&b, "a", 1, ne4, QT_F32, 128);
    b_pad(&b, 32);
    b_zeros(&b, 256);
    EXPECT_FORMAT(&b, "duplicate tensor", "duplicate tensor name 'a'");
    b_hdr(&b, 3, 2, 0);
    b_tensor(&b, "a", 1, ne4, QT_F32, 0);
    b_tensor(&b, "b", 1, ne4, QT_F32, 96); /* a covers [0,128) */
    b_pad(&b, 32);
    b_zeros(&b, 256);
    EXPECT_FORMAT(&b, "overlap", "overlap");
    b_hdr(&b, 3, 2, 0);
    b_tensor(&b, "a", 1, ne4, QT_F32, 0);
    b_tensor(&b, "b", 1, ne4, QT_F32, 128); /* adjacent is fine */
    b_pad(&b, 32);
    b_zeros(&b, 256);
    EXPECT_OK(&b, "adjacent");
    /* tensor name with a NUL, empty name, over-long name */
    b_hdr(&b, 3, 1, 0);
    b_u64(&b, 3);
    b_put(&b, "a\0b", 3);
    b_u32(&b, 1);
    b_u64(&b, 32);
    b_u32(&b, QT_F32);
    b_u64(&b, 0);
    b_pad(&b, 32);
    b_zeros(&b, 128);
    EXPECT_FORMAT(&b, "NUL in name", "NUL");
    {
        char longname[2000];
        memset(longname, 'x', sizeof longname - 1);
        longname[sizeof longname - 1] = 0;
        b_hdr(&b, 3, 1, 0);
        b_tensor(&b, longname, 1, ne4, QT_F32, 0);
        b_pad(&b, 32);
        b_zeros(&b, 128);
        EXPECT_FORMAT(&b, "long name", "limit");
    }
    /* tensors present but the data section starts past the end */
    b_hdr(&b, 3, 1, 0);
    b_tensor(&b, "a", 1, (int64_t[]){0}, QT_F32, 0);
    while ((b.n + 0) % 32 == 0) b_zeros(&b, 1);
    EXPECT_FORMAT(&b, "no data section", "past the end");
    free(b.p);
}

int main(void) {
    test_real_models();
    test_real_vocab();
    test_missing_file();
    test_truncate_real();
    test_hostile();
    TEST_DONE();
}
