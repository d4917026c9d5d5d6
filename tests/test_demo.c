/* test_demo.c: the demo model is a valid, deterministic qwen3 GGUF laid out
 * like llama.cpp's converter output, with a consistent byte-level BPE vocab. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "model/demo.h"
#include "test.h"

static void *slurp(const char *path, size_t *size) {
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

static int64_t find_token(const gguf_value *toks, const char *s) {
    for (uint64_t i = 0; i < toks->v.arr.n; i++)
        if (!strcmp(gguf_arr_str(toks, i, NULL), s)) return (int64_t)i;
    return -1;
}

/* GPT-2 byte-to-unicode: the token text of a byte. */
static void byte_text(int b, char out[3]) {
    int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    unsigned cp = (unsigned)b;
    if (!printable) {
        int n = 0;
        for (int x = 0; x < b; x++)
            if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) n++;
        cp = 256u + (unsigned)n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

/* Applies the merges (lowest rank first) to one pre-token; returns the token count. */
static int bpe_count(const gguf_value *merges, const char *word) {
    char parts[64][132];
    int n = 0;
    for (const char *p = word; *p && n < 64; p++) byte_text((unsigned char)*p, parts[n++]);
    for (;;) {
        int best_rank = -1, best_at = -1;
        for (int i = 0; i + 1 < n; i++) {
            char pair[130];
            snprintf(pair, sizeof pair, "%s %s", parts[i], parts[i + 1]);
            for (uint64_t r = 0; r < merges->v.arr.n; r++) {
                if (best_rank >= 0 && (int)r >= best_rank) break;
                if (!strcmp(gguf_arr_str(merges, r, NULL), pair)) {
                    best_rank = (int)r;
                    best_at = i;
                    break;
                }
            }
        }
        if (best_at < 0) return n;
        char joined[130];
        snprintf(joined, sizeof joined, "%s%s", parts[best_at], parts[best_at + 1]);
        snprintf(parts[best_at], sizeof parts[best_at], "%s", joined);
        memmove(parts[best_at + 1], parts[best_at + 2], (size_t)(n - best_at - 2) * sizeof parts[0]);
        n--;
    }
}

int main(void) {
    char pa_buf[512], pb_buf[512], nodir[512];
    const char *pa = test_tmp_path(pa_buf, sizeof pa_buf, "test_demo_a.gguf");
    const char *pb = test_tmp_path(pb_buf, sizeof pb_buf, "test_demo_b.gguf");
    hn_err err;
    hn_err_clear(&err);
    CHECKF(demo_model_write(pa, &err) == HN_OK, "%s", err.msg);
    CHECKF(demo_model_write(pb, &err) == HN_OK, "%s", err.msg);
    size_t na = 0, nb = 0;
    void *a = slurp(pa, &na), *b = slurp(pb, &nb);
    CHECK(a && b && na == nb && na > 1000000 && !memcmp(a, b, na));
    free(a);
    free(b);
    remove(pb);
    CHECK(demo_model_write(test_tmp_path(nodir, sizeof nodir, "no-such-dir/demo.gguf"), &err) == HN_ERR_IO);

    gguf_ctx *c = NULL;
    CHECKF(gguf_open(pa, &c, &err) == HN_OK, "%s", err.msg);
    if (!c) TEST_DONE();
    uint32_t u = 0;
    float f = 0;
    bool flag = true;
    CHECK(!strcmp(gguf_get_str(c, "general.architecture"), "qwen3"));
    CHECK(gguf_get_u32(c, "qwen3.block_count", &u) && u == DEMO_N_LAYER);
    CHECK(gguf_get_u32(c, "qwen3.context_length", &u) && u == DEMO_N_CTX);
    CHECK(gguf_get_u32(c, "qwen3.embedding_length", &u) && u == DEMO_N_EMBD);
    CHECK(gguf_get_u32(c, "qwen3.feed_forward_length", &u) && u == DEMO_N_FF);
    CHECK(gguf_get_u32(c, "qwen3.attention.head_count", &u) && u == DEMO_N_HEAD);
    CHECK(gguf_get_u32(c, "qwen3.attention.head_count_kv", &u) && u == DEMO_N_HEAD_KV);
    CHECK(gguf_get_u32(c, "qwen3.attention.key_length", &u) && u == DEMO_HEAD_DIM);
    CHECK(gguf_get_u32(c, "qwen3.attention.value_length", &u) && u == DEMO_HEAD_DIM);
    CHECK(gguf_get_f32(c, "qwen3.rope.freq_base", &f) && f == 1e6f);
    CHECK(gguf_get_f32(c, "qwen3.attention.layer_norm_rms_epsilon", &f) && f == 1e-6f);
    CHECK(!strcmp(gguf_get_str(c, "tokenizer.ggml.model"), "gpt2"));
    CHECK(!strcmp(gguf_get_str(c, "tokenizer.ggml.pre"), "qwen2"));
    CHECK(gguf_get_bool(c, "tokenizer.ggml.add_bos_token", &flag) && !flag);
    const char *tmpl = gguf_get_str(c, "tokenizer.chat_template");
    CHECK(tmpl && strstr(tmpl, "<|im_start|>") && strstr(tmpl, "add_generation_prompt") && strstr(tmpl, "tool_call"));

    /* vocab */
    const gguf_value *toks = gguf_get(c, "tokenizer.ggml.tokens"), *types = gguf_get(c, "tokenizer.ggml.token_type"),
                     *merges = gguf_get(c, "tokenizer.ggml.merges");
    CHECK(toks && toks->v.arr.elem == GGUF_STRING && types && types->v.arr.elem == GGUF_I32 && merges &&
          merges->v.arr.elem == GGUF_STRING);
    if (!toks || !types || !merges) TEST_DONE();
    uint64_t n_vocab = toks->v.arr.n;
    CHECK(types->v.arr.n == n_vocab);
    CHECKF(merges->v.arr.n >= 200 && merges->v.arr.n <= DEMO_MAX_MERGES, "%llu merges",
           (unsigned long long)merges->v.arr.n);
    /* the first 256 tokens are the 256 bytes */
    int byte_seen[256] = {0}, bytes_ok = 1;
    for (int bt = 0; bt < 256; bt++) {
        char txt[3];
        byte_text(bt, txt);
        int64_t id = find_token(toks, txt);
        if (id < 0 || id >= 256 || byte_seen[id]++) bytes_ok = 0;
    }
    CHECK(bytes_ok);
    CHECK(!strcmp(gguf_arr_str(toks, 0, NULL), "!") && !strcmp(gguf_arr_str(toks, 255, NULL), "\xc5\x83"));
    /* tokens are unique */
    int dup = 0;
    for (uint64_t i = 0; i < n_vocab; i++)
        for (uint64_t j = i + 1; j < n_vocab; j++) dup += !strcmp(gguf_arr_str(toks, i, NULL), gguf_arr_str(toks, j, NULL));
    CHECK(dup == 0);
    /* each merge is "A B" with A, B and AB all tokens */
    int bad_merges = 0;
    for (uint64_t r = 0; r < merges->v.arr.n; r++) {
        const char *m = gguf_arr_str(merges, r, NULL);
        const char *sp = strchr(m, ' ');
        if (!sp || strchr(sp + 1, ' ') || sp == m || !sp[1]) {
            bad_merges++;
            continue;
        }
        char left[128], joined[256];
        snprintf(left, sizeof left, "%.*s", (int)(sp - m), m);
        snprintf(joined, sizeof joined, "%s%s", left, sp + 1);
        if (find_token(toks, left) < 0 || find_token(toks, sp + 1) < 0 || find_token(toks, joined) < 0) bad_merges++;
    }
    CHECK(bad_merges == 0);
    /* common words are single tokens */
    CHECK(bpe_count(merges, " the") == 1);
    CHECK(bpe_count(merges, " time") == 1);
    CHECK(bpe_count(merges, " and") == 1);
    CHECK(bpe_count(merges, " assistant") == 1);
    CHECKF(bpe_count(merges, "Once") + bpe_count(merges, " upon") + bpe_count(merges, " a") +
                   bpe_count(merges, " time") <=
               7,
           "Once upon a time");
    /* special tokens */
    static const struct { const char *text; int type; } sp[] = {
        {"<|endoftext|>", 3}, {"<|im_start|>", 3}, {"<|im_end|>", 3}, {"<think>", 4},
        {"</think>", 4},      {"<tool_call>", 4},  {"</tool_call>", 4},
    };
    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) {
        int64_t id = find_token(toks, sp[i].text);
        CHECKF(id >= 256 && gguf_arr_int(types, (uint64_t)id) == sp[i].type, "%s", sp[i].text);
    }
    uint32_t eos = 0, bos = 0, pad = 0;
    CHECK(gguf_get_u32(c, "tokenizer.ggml.eos_token_id", &eos) && eos < n_vocab &&
          !strcmp(gguf_arr_str(toks, eos, NULL), "<|im_end|>"));
    CHECK(gguf_get_u32(c, "tokenizer.ggml.bos_token_id", &bos) && bos < n_vocab &&
          !strcmp(gguf_arr_str(toks, bos, NULL), "<|endoftext|>"));
    CHECK(gguf_get_u32(c, "tokenizer.ggml.padding_token_id", &pad) && pad == bos);
    int normal = 0;
    for (uint64_t i = 0; i < n_vocab; i++) normal += gguf_arr_int(types, i) == 1;
    CHECK(normal == (int)n_vocab - 7);

    /* tensors: the same names and shapes as llama.cpp's qwen3 conversion */
    char ref_path[600];
    test_data_path(ref_path, sizeof ref_path, "data/models/qwen3-2k-f32.gguf");
    gguf_ctx *ref = NULL;
    CHECKF(gguf_open(ref_path, &ref, &err) == HN_OK, "%s", err.msg);
    CHECK(gguf_n_tensors(c) == 2 + 11 * DEMO_N_LAYER);
    for (int64_t i = 0; ref && i < gguf_n_tensors(ref); i++) {
        const gguf_tensor *rt = gguf_tensor_at(ref, i);
        for (int layer = 0; layer < (strncmp(rt->name, "blk.", 4) ? 1 : DEMO_N_LAYER); layer++) {
            char name[96];
            if (!strncmp(rt->name, "blk.", 4)) snprintf(name, sizeof name, "blk.%d%s", layer, strchr(rt->name + 4, '.'));
            else snprintf(name, sizeof name, "%s", rt->name);
            const gguf_tensor *t = gguf_find_tensor(c, name);
            CHECKF(t != NULL, "missing %s", name);
            if (!t) continue;
            CHECKF(t->n_dims == rt->n_dims && t->ne[0] == rt->ne[0] &&
                       (t->ne[1] == rt->ne[1] || !strcmp(name, "token_embd.weight")),
                   "%s shape", name);
            CHECK(t->type == QT_F32);
        }
    }
    gguf_close(ref);
    CHECK(gguf_find_tensor(c, "output.weight") == NULL);
    CHECK(gguf_find_tensor(c, "blk.4.attn_q.weight") == NULL);
    const gguf_tensor *emb = gguf_find_tensor(c, "token_embd.weight");
    CHECK(emb && emb->ne[0] == DEMO_N_EMBD && emb->ne[1] == (int64_t)n_vocab);
    /* weights: norms are 1, matrices ~ N(0, 0.02^2) */
    const gguf_tensor *nw = gguf_find_tensor(c, "blk.2.attn_k_norm.weight");
    CHECK(nw && ((const float *)nw->data)[0] == 1.0f && ((const float *)nw->data)[63] == 1.0f);
    for (int k = 0; k < 2; k++) {
        const gguf_tensor *t = gguf_find_tensor(c, k ? "blk.3.ffn_down.weight" : "token_embd.weight");
        if (!t) continue;
        const float *x = t->data;
        size_t n = t->nbytes / 4;
        double sum = 0, sq = 0;
        int finite = 1;
        for (size_t i = 0; i < n; i++) {
            finite &= isfinite(x[i]) && fabsf(x[i]) < 0.2f;
            sum += x[i];
            sq += (double)x[i] * x[i];
        }
        double mean = sum / (double)n, sd = sqrt(sq / (double)n - mean * mean);
        CHECKF(finite && fabs(mean) < 0.002 && sd > 0.018 && sd < 0.022, "%s mean %g sd %g", t->name, mean, sd);
    }
    gguf_close(c);
    remove(pa);
    TEST_DONE();
}
