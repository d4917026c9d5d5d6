/* test_gguf.c: the GGUF reader and writer: every shared model and vocab file
 * loads with the expected keys and tensors; round trips through the writer for
 * every value type; truncation at every header byte, seeded bit flips and
 * hand-made hostile headers all fail cleanly with HN_ERR_FORMAT. */
#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "core/alloc.h"
#include "gguf/gguf.h"
#include "gguf/gguf_int.h"
#include "quant/quant.h"
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
    /* bit flips in the real header (metadata, vocab, tensor infos) */
    unsigned char *m = malloc(size);
    uint64_t rng = 12345;
    int n_mut = sanitized() ? 60 : 300, odd = 0;
    for (int k = 0; k < n_mut; k++) {
        memcpy(m, buf, size);
        for (int f = 0; f < 3; f++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            size_t pos = (size_t)((rng >> 20) % hdr);
            m[pos] ^= (unsigned char)(1u << ((rng >> 8) & 7));
        }
        hn_err_clear(&err);
        hn_status s = open_exact(m, size, &err);
        if (s != HN_OK && (s != HN_ERR_FORMAT || !err.msg[0])) odd++;
    }
    CHECKF(odd == 0, "%d mutants of a real file failed with something other than HN_ERR_FORMAT", odd);
    free(m);
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

/* ---- writer round trips ---- */

/* A small file with every value type, nested arrays, strings with NULs and a
 * few tensors of different types; the caller frees *buf with hn_free. */
static gguf_writer *make_small(size_t align) {
    gguf_writer *w = gguf_writer_new();
    CHECK(w != NULL);
    if (align) CHECK(gguf_writer_set_alignment(w, align) == HN_OK);
    CHECK(gguf_writer_set_str(w, "general.architecture", "test") == HN_OK);
    CHECK(gguf_writer_set_u32(w, "u32", 4000000000u) == HN_OK);
    CHECK(gguf_writer_set_i32(w, "i32", -123456) == HN_OK);
    CHECK(gguf_writer_set_u64(w, "u64", UINT64_MAX - 5) == HN_OK);
    CHECK(gguf_writer_set_f32(w, "f32", 1e-6f) == HN_OK);
    CHECK(gguf_writer_set_bool(w, "bool", true) == HN_OK);
    gguf_value v;
    v = (gguf_value){.type = GGUF_U8, .v.u64 = 200};
    CHECK(gguf_writer_set_value(w, "u8", &v) == HN_OK);
    v = (gguf_value){.type = GGUF_I8, .v.i64 = -100};
    CHECK(gguf_writer_set_value(w, "i8", &v) == HN_OK);
    v = (gguf_value){.type = GGUF_U16, .v.u64 = 65000};
    CHECK(gguf_writer_set_value(w, "u16", &v) == HN_OK);
    v = (gguf_value){.type = GGUF_I16, .v.i64 = -32000};
    CHECK(gguf_writer_set_value(w, "i16", &v) == HN_OK);
    v = (gguf_value){.type = GGUF_I64, .v.i64 = INT64_MIN + 7};
    CHECK(gguf_writer_set_value(w, "i64", &v) == HN_OK);
    v = (gguf_value){.type = GGUF_F64, .v.f64 = 3.141592653589793};
    CHECK(gguf_writer_set_value(w, "f64", &v) == HN_OK);
    v = (gguf_value){.type = GGUF_STRING, .v.str = {"a\0b\0c", 5}};
    CHECK(gguf_writer_set_value(w, "nul.string", &v) == HN_OK);
    v = (gguf_value){.type = GGUF_STRING, .v.str = {"", 0}};
    CHECK(gguf_writer_set_value(w, "empty.string", &v) == HN_OK);
    CHECK(gguf_writer_set_str(w, "replaced", "first") == HN_OK);
    CHECK(gguf_writer_set_str(w, "replaced", "second") == HN_OK);

    static const int32_t ai32[] = {1, -2, 3, -4};
    static const float af32[] = {0.5f, -1.5f, 2.25f};
    static const uint8_t au8[] = {0, 255};
    static const bool abool[] = {true, false, true};
    static const int16_t ai16[] = {-1, 2};
    static const uint64_t au64[] = {1, UINT64_MAX};
    static const double af64[] = {1e300, -2.5};
    CHECK(gguf_writer_set_arr(w, "arr.i32", GGUF_I32, ai32, 4) == HN_OK);
    CHECK(gguf_writer_set_arr(w, "arr.f32", GGUF_F32, af32, 3) == HN_OK);
    CHECK(gguf_writer_set_arr(w, "arr.u8", GGUF_U8, au8, 2) == HN_OK);
    CHECK(gguf_writer_set_arr(w, "arr.bool", GGUF_BOOL, abool, 3) == HN_OK);
    CHECK(gguf_writer_set_arr(w, "arr.i16", GGUF_I16, ai16, 2) == HN_OK);
    CHECK(gguf_writer_set_arr(w, "arr.u64", GGUF_U64, au64, 2) == HN_OK);
    CHECK(gguf_writer_set_arr(w, "arr.f64", GGUF_F64, af64, 2) == HN_OK);
    CHECK(gguf_writer_set_arr(w, "arr.empty", GGUF_U32, NULL, 0) == HN_OK);
    const char *strs[] = {"hello", "", "wörld"};
    CHECK(gguf_writer_set_arr_str(w, "arr.str", strs, 3) == HN_OK);
    /* [[1,2],[],[["x", "y\0z"]]]: an array of arrays, one holding an array of strings */
    gguf_value s2[2] = {{.type = GGUF_STRING, .v.str = {"x", 1}}, {.type = GGUF_STRING, .v.str = {"y\0z", 3}}};
    gguf_value inner_s = {.type = GGUF_ARRAY, .v.arr = {GGUF_STRING, 2, NULL, s2}};
    static const int32_t two[] = {1, 2};
    gguf_value outer[3] = {
        {.type = GGUF_ARRAY, .v.arr = {GGUF_I32, 2, two, NULL}},
        {.type = GGUF_ARRAY, .v.arr = {GGUF_U8, 0, NULL, NULL}},
        {.type = GGUF_ARRAY, .v.arr = {GGUF_ARRAY, 1, NULL, &inner_s}},
    };
    gguf_value nested = {.type = GGUF_ARRAY, .v.arr = {GGUF_ARRAY, 3, NULL, outer}};
    CHECK(gguf_writer_set_value(w, "arr.nested", &nested) == HN_OK);

    static float f32data[64];
    static uint16_t f16data[32 * 3];
    static unsigned char q8data[34 * 2 * 2];
    for (int i = 0; i < 64; i++) f32data[i] = (float)i;
    for (int i = 0; i < 96; i++) f16data[i] = (uint16_t)(i * 3);
    for (size_t i = 0; i < sizeof q8data; i++) q8data[i] = (unsigned char)(i * 7 + 1);
    CHECK(gguf_writer_add_tensor(w, "f32.vec", QT_F32, 1, (int64_t[]){64}, f32data, sizeof f32data) == HN_OK);
    CHECK(gguf_writer_add_tensor(w, "f16.mat", QT_F16, 2, (int64_t[]){32, 3}, f16data, sizeof f16data) == HN_OK);
    CHECK(gguf_writer_add_tensor(w, "q8.mat", QT_Q8_0, 3, (int64_t[]){64, 2, 1}, q8data, sizeof q8data) == HN_OK);
    CHECK(gguf_writer_add_tensor(w, "empty", QT_F32, 2, (int64_t[]){0, 5}, NULL, 0) == HN_OK);
    return w;
}

static void test_roundtrip(void) {
    for (int pass = 0; pass < 2; pass++) {
        size_t align = pass ? 128 : 0;
        gguf_writer *w = make_small(align);
        void *buf = NULL;
        size_t size = 0;
        hn_err err;
        hn_err_clear(&err);
        CHECK(gguf_writer_write_mem(w, &buf, &size, &err) == HN_OK);
        gguf_ctx *c = NULL;
        CHECKF(gguf_open_mem(buf, size, &c, &err) == HN_OK, "%s", err.msg);
        if (!c) {
            gguf_writer_free(w);
            hn_free(buf);
            continue;
        }
        CHECK(gguf_version(c) == 3);
        CHECK(gguf_alignment(c) == (align ? align : 32));
        CHECK(gguf_data_offset(c) % gguf_alignment(c) == 0);
        uint32_t u32 = 0;
        int64_t i64 = 0;
        float f = 0;
        bool b = false;
        CHECK(gguf_get_u32(c, "u32", &u32) && u32 == 4000000000u);
        CHECK(gguf_get_i64(c, "i32", &i64) && i64 == -123456);
        CHECK(!gguf_get_u32(c, "i32", &u32));         /* negative does not fit */
        CHECK(!gguf_get_i64(c, "u64", &i64));         /* > INT64_MAX */
        CHECK(gguf_get(c, "u64")->v.u64 == UINT64_MAX - 5);
        CHECK(gguf_get_f32(c, "f32", &f) && f == 1e-6f);
        CHECK(gguf_get_bool(c, "bool", &b) && b);
        CHECK(!gguf_get_bool(c, "u32", &b));
        CHECK(gguf_get(c, "u8")->type == GGUF_U8 && gguf_get(c, "u8")->v.u64 == 200);
        CHECK(gguf_get(c, "i8")->type == GGUF_I8 && gguf_get(c, "i8")->v.i64 == -100);
        CHECK(gguf_get(c, "u16")->v.u64 == 65000 && gguf_get(c, "i16")->v.i64 == -32000);
        CHECK(gguf_get(c, "i64")->type == GGUF_I64 && gguf_get(c, "i64")->v.i64 == INT64_MIN + 7);
        CHECK(gguf_get(c, "f64")->type == GGUF_F64 && gguf_get(c, "f64")->v.f64 == 3.141592653589793);
        CHECK(gguf_get_f32(c, "f64", &f) && f == (float)3.141592653589793);
        CHECK(gguf_get_f32(c, "u8", &f) && f == 200.0f);
        const gguf_value *ns = gguf_get(c, "nul.string");
        CHECK(ns && ns->type == GGUF_STRING && ns->v.str.len == 5 && !memcmp(ns->v.str.ptr, "a\0b\0c", 6));
        CHECK(gguf_get_str(c, "empty.string") && !strcmp(gguf_get_str(c, "empty.string"), ""));
        CHECK(gguf_get_str(c, "replaced") && !strcmp(gguf_get_str(c, "replaced"), "second"));
        CHECK(gguf_get_str(c, "u32") == NULL);
        CHECK(!strcmp(gguf_get_str(c, "general.architecture"), "test"));
        /* key order is insertion order, replacement keeps the slot */
        CHECK(!strcmp(gguf_kv_key(c, align ? 1 : 0), "general.architecture"));
        CHECK(gguf_kv_key(c, -1) == NULL && gguf_kv_key(c, gguf_n_kv(c)) == NULL);

        const gguf_value *a = gguf_get(c, "arr.i32");
        CHECK(a && a->v.arr.elem == GGUF_I32 && a->v.arr.n == 4 && gguf_arr_int(a, 3) == -4);
        CHECK(gguf_arr_float(a, 1) == -2.0);
        a = gguf_get(c, "arr.f32");
        CHECK(a && a->v.arr.n == 3 && gguf_arr_float(a, 2) == 2.25 && gguf_arr_int(a, 1) == -1);
        a = gguf_get(c, "arr.u8");
        CHECK(a && gguf_arr_int(a, 1) == 255);
        a = gguf_get(c, "arr.bool");
        CHECK(a && a->v.arr.elem == GGUF_BOOL && gguf_arr_int(a, 0) == 1 && gguf_arr_int(a, 1) == 0);
        a = gguf_get(c, "arr.i16");
        CHECK(a && gguf_arr_int(a, 0) == -1);
        a = gguf_get(c, "arr.u64");
        CHECK(a && gguf_arr_float(a, 1) == (double)UINT64_MAX);
        a = gguf_get(c, "arr.f64");
        CHECK(a && gguf_arr_float(a, 0) == 1e300);
        a = gguf_get(c, "arr.empty");
        CHECK(a && a->v.arr.elem == GGUF_U32 && a->v.arr.n == 0);
        a = gguf_get(c, "arr.str");
        uint64_t len = 99;
        CHECK(a && a->v.arr.elem == GGUF_STRING && a->v.arr.n == 3);
        CHECK(a && !strcmp(gguf_arr_str(a, 0, &len), "hello") && len == 5);
        CHECK(a && !strcmp(gguf_arr_str(a, 1, &len), "") && len == 0);
        CHECK(a && !strcmp(gguf_arr_str(a, 2, NULL), "wörld"));
        CHECK(a && gguf_arr_int(a, 0) == 0); /* not numeric */
        a = gguf_get(c, "arr.nested");
        CHECK(a && a->v.arr.elem == GGUF_ARRAY && a->v.arr.n == 3);
        if (a && a->v.arr.n == 3) {
            const gguf_value *o = a->v.arr.items;
            CHECK(o[0].type == GGUF_ARRAY && o[0].v.arr.elem == GGUF_I32 && o[0].v.arr.n == 2 &&
                  gguf_arr_int(&o[0], 1) == 2);
            CHECK(o[1].v.arr.elem == GGUF_U8 && o[1].v.arr.n == 0);
            CHECK(o[2].v.arr.elem == GGUF_ARRAY && o[2].v.arr.n == 1);
            if (o[2].v.arr.n == 1) {
                const gguf_value *in = &o[2].v.arr.items[0];
                CHECK(in->v.arr.elem == GGUF_STRING && in->v.arr.n == 2);
                CHECK(gguf_arr_str(in, 1, &len) && len == 3 && !memcmp(gguf_arr_str(in, 1, NULL), "y\0z", 4));
            }
        }

        CHECK(gguf_n_tensors(c) == 4);
        const gguf_tensor *t = gguf_find_tensor(c, "f32.vec");
        CHECK(t && t->type == QT_F32 && t->n_dims == 1 && t->ne[0] == 64 && t->ne[1] == 1 && t->nbytes == 256);
        CHECK(t && ((const float *)t->data)[63] == 63.0f);
        t = gguf_find_tensor(c, "f16.mat");
        CHECK(t && t->type == QT_F16 && t->ne[0] == 32 && t->ne[1] == 3 && t->nbytes == 192);
        CHECK(t && t->offset % gguf_alignment(c) == 0);
        CHECK(t && ((const uint16_t *)t->data)[95] == 95 * 3);
        t = gguf_find_tensor(c, "q8.mat");
        CHECK(t && t->type == QT_Q8_0 && t->n_dims == 3 && t->nbytes == 136);
        CHECK(t && ((const unsigned char *)t->data)[135] == (unsigned char)(135 * 7 + 1));
        t = gguf_find_tensor(c, "empty");
        CHECK(t && t->nbytes == 0 && t->ne[0] == 0 && t->ne[1] == 5);
        /* padding between tensors is zero */
        const unsigned char *p = buf;
        const gguf_tensor *t0 = gguf_tensor_at(c, 0), *t1 = gguf_tensor_at(c, 1);
        size_t zero_ok = 1;
        for (size_t i = gguf_data_offset(c) + t0->offset + t0->nbytes; i < gguf_data_offset(c) + t1->offset; i++)
            zero_ok &= p[i] == 0;
        CHECK(zero_ok);

        /* copy every value through gguf_writer_set_value: identical bytes */
        gguf_writer *w2 = gguf_writer_new();
        for (int64_t i = 0; i < gguf_n_kv(c); i++)
            CHECK(gguf_writer_set_value(w2, gguf_kv_key(c, i), gguf_kv_value(c, i)) == HN_OK);
        for (int64_t i = 0; i < gguf_n_tensors(c); i++) {
            const gguf_tensor *ti = gguf_tensor_at(c, i);
            CHECK(gguf_writer_add_tensor(w2, ti->name, ti->type, ti->n_dims, ti->ne, ti->data, ti->nbytes) == HN_OK);
        }
        void *buf2 = NULL;
        size_t size2 = 0;
        CHECK(gguf_writer_write_mem(w2, &buf2, &size2, NULL) == HN_OK);
        CHECK(size2 == size && !memcmp(buf, buf2, size));
        /* and through a file */
        char path[512], name[64];
        snprintf(name, sizeof name, "test_gguf_rt%d.gguf", pass);
        test_tmp_path(path, sizeof path, name);
        CHECK(gguf_writer_write(w2, path, &err) == HN_OK);
        size_t fsize = 0;
        void *fbuf = read_file(path, &fsize);
        CHECK(fbuf && fsize == size && !memcmp(fbuf, buf, size));
        free(fbuf);
        gguf_ctx *fc = NULL;
        CHECK(gguf_open(path, &fc, &err) == HN_OK);
        CHECK(fc && gguf_n_kv(fc) == gguf_n_kv(c));
        gguf_close(fc);
        remove(path);
        gguf_writer_free(w2);
        hn_free(buf2);
        gguf_close(c);
        gguf_writer_free(w);
        hn_free(buf);
    }
}

/* The reader's arena grows from about the file's size (4 KiB at least) by
 * doubling up to 1 MiB chunks, and a string past 1 MiB gets a chunk of its
 * own: a file whose strings fill every size of chunk (keys, values, an array
 * of strings, one 1.5 MiB string between them) reads back every byte. */
static void fill_str(char *s, size_t len, unsigned seed) {
    for (size_t i = 0; i < len; i++) s[i] = (char)('a' + (seed * 31u + (unsigned)i * 7u) % 26u);
    s[len] = 0;
}

static void test_arena_chunks(void) {
    enum { NK = 6000, NA = 20000, BIG = 3 << 19 };
    gguf_writer *w = gguf_writer_new();
    char key[32], val[400];
    char *big = malloc(BIG + 1);
    char **arr = malloc(NA * sizeof *arr);
    if (!big || !arr) {
        CHECK(0);
        return;
    }
    fill_str(big, BIG, 99);
    for (int i = 0; i < NA; i++) {
        arr[i] = malloc(40);
        fill_str(arr[i], (size_t)(i % 37), (unsigned)i + 7);
    }
    for (int i = 0; i < NK; i++) {
        snprintf(key, sizeof key, "k.%d", i);
        fill_str(val, (size_t)(i * 13) % 390, (unsigned)i);
        CHECK(gguf_writer_set_str(w, key, val) == HN_OK);
        if (i == NK / 2) {
            CHECK(gguf_writer_set_str(w, "big", big) == HN_OK);
            CHECK(gguf_writer_set_arr_str(w, "arr", (const char *const *)arr, NA) == HN_OK);
        }
    }
    void *buf = NULL;
    size_t size = 0;
    hn_err err = {0};
    CHECK(gguf_writer_write_mem(w, &buf, &size, &err) == HN_OK);
    gguf_ctx *c = NULL;
    CHECKF(buf && gguf_open_mem(buf, size, &c, &err) == HN_OK, "%s", err.msg);
    if (c) {
        int bad = 0;
        for (int i = 0; i < NK; i++) {
            snprintf(key, sizeof key, "k.%d", i);
            fill_str(val, (size_t)(i * 13) % 390, (unsigned)i);
            const char *got = gguf_get_str(c, key);
            bad += !got || strcmp(got, val);
        }
        const char *gb = gguf_get_str(c, "big");
        CHECK(gb && strlen(gb) == BIG && !memcmp(gb, big, BIG));
        const gguf_value *a = gguf_get(c, "arr");
        CHECK(a && a->type == GGUF_ARRAY && a->v.arr.n == NA);
        for (int i = 0; a && i < NA; i++) {
            uint64_t len = 0;
            const char *e = gguf_arr_str(a, (uint64_t)i, &len);
            bad += !e || len != strlen(arr[i]) || memcmp(e, arr[i], len) || e[len];
        }
        CHECKF(bad == 0, "%d strings read back wrong", bad);
        gguf_close(c);
    }
    for (int i = 0; i < NA; i++) free(arr[i]);
    free(arr);
    free(big);
    hn_free(buf);
    gguf_writer_free(w);
}

static void test_writer_rejects(void) {
    gguf_writer *w = gguf_writer_new();
    float d[32] = {0};
    CHECK(gguf_writer_set_alignment(w, 0) == HN_ERR_INVALID);
    CHECK(gguf_writer_set_alignment(w, 48) == HN_ERR_INVALID);
    CHECK(gguf_writer_set_str(w, "", "x") == HN_ERR_INVALID);
    CHECK(gguf_writer_set_str(w, "k", NULL) == HN_ERR_INVALID);
    CHECK(gguf_writer_set_arr(w, "k", GGUF_STRING, d, 1) == HN_ERR_INVALID);
    CHECK(gguf_writer_set_arr(w, "k", GGUF_U32, NULL, 3) == HN_ERR_INVALID);
    gguf_value bad = {.type = (gguf_vtype)42};
    CHECK(gguf_writer_set_value(w, "k", &bad) == HN_ERR_INVALID);
    CHECK(gguf_writer_add_tensor(w, "t", QT_F32, 1, (int64_t[]){32}, d, 64) == HN_ERR_INVALID);  /* wrong size */
    CHECK(gguf_writer_add_tensor(w, "t", QT_Q8_0, 1, (int64_t[]){16}, d, 17) == HN_ERR_INVALID); /* partial block */
    CHECK(gguf_writer_add_tensor(w, "t", QT_F32, 5, (int64_t[]){1, 1, 1, 1, 1}, d, 4) == HN_ERR_INVALID);
    CHECK(gguf_writer_add_tensor(w, "t", (qt_type)4, 1, (int64_t[]){32}, d, 128) == HN_ERR_INVALID);
    CHECK(gguf_writer_add_tensor(w, "t", QT_F32, 1, (int64_t[]){32}, d, 128) == HN_OK);
    CHECK(gguf_writer_add_tensor(w, "t", QT_F32, 1, (int64_t[]){32}, d, 128) == HN_ERR_INVALID); /* duplicate */
    /* nesting deeper than the reader accepts */
    gguf_value lv[10];
    lv[0] = (gguf_value){.type = GGUF_ARRAY, .v.arr = {GGUF_U8, 0, NULL, NULL}};
    for (int i = 1; i < 10; i++) lv[i] = (gguf_value){.type = GGUF_ARRAY, .v.arr = {GGUF_ARRAY, 1, NULL, &lv[i - 1]}};
    CHECK(gguf_writer_set_value(w, "deep8", &lv[7]) == HN_OK);
    CHECK(gguf_writer_set_value(w, "deep9", &lv[8]) == HN_ERR_INVALID);
    /* general.alignment set by hand with the wrong type is refused at write time */
    CHECK(gguf_writer_set_u64(w, "general.alignment", 64) == HN_OK);
    void *buf = NULL;
    size_t size = 0;
    hn_err err;
    CHECK(gguf_writer_write_mem(w, &buf, &size, &err) == HN_ERR_INVALID);
    CHECK(gguf_writer_set_u32(w, "general.alignment", 64) == HN_OK);
    CHECK(gguf_writer_write_mem(w, &buf, &size, &err) == HN_OK);
    gguf_ctx *c = NULL;
    CHECK(gguf_open_mem(buf, size, &c, &err) == HN_OK);
    CHECK(c && gguf_alignment(c) == 64 && gguf_get(c, "deep8") != NULL);
    gguf_close(c);
    hn_free(buf);
    char nodir[512];
    CHECK(gguf_writer_write(w, test_tmp_path(nodir, sizeof nodir, "no-such-dir/x.gguf"), &err) == HN_ERR_IO);
    gguf_writer_free(w);

    /* allocation failures while building and writing fail cleanly */
    int ok_runs = 0;
    for (long n = 0; n < 400; n++) {
        hn_alloc_fail_after(n);
        gguf_writer *wf = gguf_writer_new();
        hn_status s = HN_ERR_NOMEM;
        void *b = NULL;
        if (wf) {
            const char *strs[] = {"a", "b", "c"};
            s = gguf_writer_set_str(wf, "general.architecture", "x");
            if (!s) s = gguf_writer_set_arr_str(wf, "toks", strs, 3);
            if (!s) s = gguf_writer_add_tensor(wf, "t", QT_F32, 1, (int64_t[]){32}, d, 128);
            if (!s) s = gguf_writer_write_mem(wf, &b, &size, NULL);
        }
        gguf_ctx *rc = NULL;
        if (!s) s = gguf_open_mem(b, size, &rc, NULL);
        hn_alloc_fail_after(-1);
        if (!s) ok_runs++;
        CHECK(s == HN_OK || s == HN_ERR_NOMEM);
        gguf_close(rc);
        hn_free(b);
        gguf_writer_free(wf);
    }
    CHECK(ok_runs > 0);
}

/* Truncation at every byte of a small written file, then seeded bit flips. */
static void test_truncate_and_flip(void) {
    gguf_writer *w = make_small(0);
    void *buf = NULL;
    size_t size = 0;
    CHECK(gguf_writer_write_mem(w, &buf, &size, NULL) == HN_OK);
    gguf_writer_free(w);
    gguf_ctx *c = NULL;
    CHECK(gguf_open_mem(buf, size, &c, NULL) == HN_OK);
    size_t hdr = c ? gguf_data_offset(c) : size;
    size_t need = hdr; /* bytes a valid file needs: the end of the furthest tensor */
    for (int64_t i = 0; c && i < gguf_n_tensors(c); i++) {
        const gguf_tensor *t = gguf_tensor_at(c, i);
        if (hdr + t->offset + t->nbytes > need) need = hdr + t->offset + t->nbytes;
    }
    gguf_close(c);
    int bad = 0;
    for (size_t n = 0; n < need; n++) {
        hn_err err;
        hn_err_clear(&err);
        hn_status s = open_exact(buf, n, &err);
        if (s != HN_ERR_FORMAT || !err.msg[0]) {
            bad++;
            if (bad < 5) fprintf(stderr, "prefix %zu: %s %s\n", n, hn_status_name(s), err.msg);
        }
    }
    CHECKF(bad == 0, "%d of %zu prefixes did not fail with HN_ERR_FORMAT", bad, need);
    CHECK(open_exact(buf, need, NULL) == HN_OK); /* trailing padding after the last tensor is optional */

    /* bit flips: each mutant loads or fails with HN_ERR_FORMAT */
    unsigned char *m = malloc(size);
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    int n_mut = sanitized() ? 3000 : 20000, loaded = 0, odd = 0;
    for (int k = 0; k < n_mut; k++) {
        memcpy(m, buf, size);
        int flips = 1 + (int)(k % 4);
        for (int f = 0; f < flips; f++) {
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            size_t pos = (size_t)(rng % hdr); /* mutate the header region */
            if (k % 3 == 0) m[pos] ^= (unsigned char)(1u << ((rng >> 32) & 7));
            else m[pos] = (unsigned char)(rng >> 40);
        }
        hn_err err;
        hn_err_clear(&err);
        hn_status s = open_exact(m, size, &err);
        if (s == HN_OK) loaded++;
        else if (s != HN_ERR_FORMAT || !err.msg[0]) odd++;
    }
    CHECKF(odd == 0, "%d mutants failed with something other than HN_ERR_FORMAT", odd);
    CHECK(loaded > 0 && loaded < n_mut);
    free(m);
    hn_free(buf);
}

/* ---- hone info ---- */

/* Runs `$HONE_BIN info ARG`, returns the exit code and stdout+stderr in out. */
static int run_info(const char *arg, char *out, size_t cap) {
    const char *bin = getenv("HONE_BIN");
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "'%s' info %s 2>&1", bin, arg);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_cli_info(void) {
    if (!getenv("HONE_BIN") || !*getenv("HONE_BIN")) {
        fprintf(stderr, "note: HONE_BIN not set, skipping the hone info tests\n");
        return;
    }
    static char out[1 << 16];
    char path[600], arg[700];
    test_data_path(path, sizeof path, "data/models/qwen3-real-q8_0.gguf");
    snprintf(arg, sizeof arg, "'%s'", path);
    int rc = run_info(arg, out, sizeof out);
    CHECKF(rc == 0, "info rc %d: %.300s", rc, out);
    CHECK(strstr(out, "version: 3") != NULL);
    CHECK(strstr(out, "general.architecture") && strstr(out, "\"qwen3\""));
    CHECK(strstr(out, "string[151936]") != NULL);                 /* the vocab, abbreviated */
    CHECK(strstr(out, "blk.1.ffn_up.weight") && strstr(out, "q8_0"));
    CHECK(strstr(out, "[64, 151936]") != NULL);
    CHECK(strstr(out, "total: 24 tensors") != NULL);
    CHECK(strstr(out, "1e-06") != NULL);
    /* one line per key: the whole output stays small despite 150k tokens */
    size_t lines = 0;
    for (const char *q = out; *q; q++) lines += *q == '\n';
    CHECKF(lines < 70, "%zu lines", lines);

    /* a broken file: truncated copy of a real model */
    size_t size = 0;
    void *buf = read_file(path, &size);
    char bad_buf[512];
    const char *bad = test_tmp_path(bad_buf, sizeof bad_buf, "test_gguf_broken.gguf");
    FILE *f = fopen(bad, "wb");
    CHECK(f && buf);
    if (f && buf) fwrite(buf, 1, 5000, f);
    if (f) fclose(f);
    free(buf);
    rc = run_info(bad, out, sizeof out);
    CHECK(rc == 1);
    CHECKF(strstr(out, "hone info:") && strstr(out, "test_gguf_broken.gguf") && (strstr(out, "truncated") || strstr(out, "remain")), "%s", out);
    remove(bad);
    char missing[512];
    rc = run_info(test_tmp_path(missing, sizeof missing, "no-such-file.gguf"), out, sizeof out);
    CHECK(rc == 1 && strstr(out, "no-such-file"));
    rc = run_info("--help", out, sizeof out);
    CHECK(rc == 0 && strstr(out, "usage: hone info"));
    rc = run_info("", out, sizeof out);
    CHECK(rc == 2);
}

/* gguf's private block-shape table agrees with the quant module's traits */
static void test_type_table(void) {
    int known = 0;
    for (uint32_t id = 0; id < 64; id++) {
        int64_t blck = 0;
        size_t size = 0;
        bool g = gguf_type_shape(id, &blck, &size);
        const qt_type_traits *tr = id < QT_TYPE_COUNT ? qt_traits((qt_type)id) : NULL;
        if (g) known++;
        if (g && tr) CHECKF(tr->blck_size == blck && tr->type_size == size, "type %u: %lld/%zu vs %lld/%zu", id,
                            (long long)blck, size, (long long)tr->blck_size, tr->type_size);
        if (tr) CHECKF(g, "type %u (%s) known to quant but not to gguf", id, tr->name);
        if (g && tr) CHECKF(!strcmp(gguf_type_name(id), tr->name), "type %u name %s vs %s", id, gguf_type_name(id), tr->name);
    }
    CHECK(known == 32);
}

int main(void) {
    test_type_table();
    test_real_models();
    test_real_vocab();
    test_missing_file();
    test_truncate_real();
    test_hostile();
    test_roundtrip();
    test_arena_chunks();
    test_writer_rejects();
    test_truncate_and_flip();
    test_cli_info();
    TEST_DONE();
}
