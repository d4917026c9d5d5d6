/* gguf_seeds.c: writes the seed files of the GGUF harness (fuzz_gguf.c) into
 * a directory: small synthetic files (every value type, nested arrays,
 * tensors) and cut-down tokenizer files made from the shared test
 * vocabularies (their tokenizer.* metadata with every array cut to its
 * first entries), so that the seeds reach tok_load. The files it made are
 * kept in tests/fuzz/corpus/gguf; run it again to remake them:
 *   build-fuzz/gguf_seeds tests/fuzz/corpus/gguf [SHARED_DIR] */
#include <stdio.h>
#include <string.h>

#include "gguf/gguf.h"

static int write(gguf_writer *w, const char *dir, const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    hn_err err = {0};
    int rc = gguf_writer_write(w, path, &err) == HN_OK ? 0 : 1;
    if (rc) fprintf(stderr, "gguf_seeds: %s: %s\n", path, err.msg);
    gguf_writer_free(w);
    return rc;
}

/* The tokenizer.* keys of a vocabulary file with arrays cut to n entries. */
static int cut_vocab(const char *dir, const char *shared, const char *file, uint64_t n, const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", shared, file);
    gguf_ctx *g = NULL;
    hn_err err = {0};
    if (gguf_open(path, &g, &err) != HN_OK) {
        fprintf(stderr, "gguf_seeds: %s\n", err.msg);
        return 1;
    }
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_str(w, "general.architecture", "llama");
    for (int64_t i = 0; i < gguf_n_kv(g); i++) {
        const char *key = gguf_kv_key(g, i);
        if (strncmp(key, "tokenizer.", 10) || !strcmp(key, "tokenizer.chat_template")) continue;
        gguf_value v = *gguf_kv_value(g, i);
        if (v.type == GGUF_ARRAY && v.v.arr.n > n) v.v.arr.n = n;
        uint64_t id = v.v.u64;
        if (v.type != GGUF_ARRAY && strstr(key, "_id") && id >= n) continue; /* an id past the cut */
        gguf_writer_set_value(w, key, &v);
    }
    gguf_close(g);
    return write(w, dir, name);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: gguf_seeds DIR [SHARED_DIR]\n");
        return 2;
    }
    const char *dir = argv[1], *shared = argc > 2 ? argv[2] : "../shared";
    int rc = 0;

    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_u32(w, "general.alignment", 32);
    rc |= write(w, dir, "minimal.gguf");

    w = gguf_writer_new();
    gguf_writer_set_alignment(w, 64);
    gguf_writer_set_str(w, "general.architecture", "llama");
    gguf_writer_set_u32(w, "a.u32", 7);
    gguf_writer_set_i32(w, "a.i32", -7);
    gguf_writer_set_u64(w, "a.u64", 1ull << 40);
    gguf_writer_set_f32(w, "a.f32", 0.5f);
    gguf_writer_set_bool(w, "a.bool", true);
    const uint8_t u8s[] = {1, 2, 3};
    const int16_t i16s[] = {-1, 2};
    const double f64s[] = {1.5, -2.25};
    const char *strs[] = {"a", "", "\xc3\xa9t\xc3\xa9"};
    gguf_writer_set_arr(w, "a.arr_u8", GGUF_U8, u8s, 3);
    gguf_writer_set_arr(w, "a.arr_i16", GGUF_I16, i16s, 2);
    gguf_writer_set_arr(w, "a.arr_f64", GGUF_F64, f64s, 2);
    gguf_writer_set_arr_str(w, "a.arr_str", strs, 3);
    gguf_value inner[2] = {{.type = GGUF_ARRAY}, {.type = GGUF_ARRAY}};
    inner[0].v.arr.elem = GGUF_U8, inner[0].v.arr.n = 3, inner[0].v.arr.data = u8s;
    inner[1].v.arr.elem = GGUF_I16, inner[1].v.arr.n = 2, inner[1].v.arr.data = i16s;
    gguf_value nested = {.type = GGUF_ARRAY};
    nested.v.arr.elem = GGUF_ARRAY, nested.v.arr.n = 2, nested.v.arr.items = inner;
    gguf_writer_set_value(w, "a.nested", &nested);
    static float f32[4 * 8];
    for (int i = 0; i < 32; i++) f32[i] = (float)i;
    int64_t ne[2] = {8, 4};
    gguf_writer_add_tensor(w, "t.f32", QT_F32, 2, ne, f32, sizeof f32);
    static uint8_t q8[34 * 2];
    int64_t ne1[1] = {64};
    gguf_writer_add_tensor(w, "t.q8_0", QT_Q8_0, 1, ne1, q8, sizeof q8);
    rc |= write(w, dir, "types_tensors.gguf");

    rc |= cut_vocab(dir, shared, "data/vocab/ggml-vocab-llama-spm.gguf", 300, "vocab_spm.gguf");
    rc |= cut_vocab(dir, shared, "data/vocab/ggml-vocab-gpt-2.gguf", 300, "vocab_gpt2.gguf");
    rc |= cut_vocab(dir, shared, "data/vocab/ggml-vocab-qwen3-npm.gguf", 300, "vocab_qwen3.gguf");
    return rc;
}
