/* dflash_fixture.h: DFlash drafter files (general.architecture "dflash",
 * the form llama.cpp's converter writes: model.h, "DFlash") for the shared
 * small targets, with random or arranged f32 weights (no trained DFlash
 * weights exist here). Each carries the target's tokenizer keys, its width,
 * two layers of 4 heads of 64, a block of 8 and the mask token V - 1.
 *
 *   DFLF_RANDOM  taps {n/2, n} (n: the target's layers), GQA (2 kv heads),
 *                random weights and norms, the target's embedding and
 *                output (a drafter as untrained as the targets: its drafts
 *                mostly miss);
 *   DFLF_ANCHOR  DFLF_RANDOM with dflash.sample_from_anchor (slot 0 drafts
 *                too);
 *   DFLF_CAUSAL  DFLF_RANDOM with dflash.attention.causal;
 *   DFLF_PROBE   one tap, the final residual (n), fc = I, enc.output_norm =
 *                the target's output_norm and layer 0's attn_v = I: the V
 *                injected at layer 0 for position p is the target's normed
 *                final hidden state there, whose product with the output
 *                matrix is the target's logits at p (the rest random);
 *   DFLF_COPY    an oracle for "the next tokens repeat the anchor": its own
 *                embedding and output, one ±0.1 pattern per token on all but
 *                the last two dims, which flag the mask token (dim E-2) and
 *                every other token (dim E-1); layer 0's q reads the mask
 *                flag and k the token flag on the slowest rope pair of each
 *                head, so a mask slot attends to the anchor alone (the
 *                context's K are 0: fc = 0), v = I and o = I copy the
 *                anchor's normed embedding into the slot, and the rest adds
 *                nothing: every slot's logits peak at the anchor;
 *   DFLF_BADVOCAB DFLF_RANDOM whose token 5 has another text;
 *   DFLF_DSPARK  DFLF_RANDOM plus a DSpark Markov head (markov_w1.weight).
 * Written once per process into the test scratch folder. */
#ifndef HN_TEST_DFLASH_FIXTURE_H
#define HN_TEST_DFLASH_FIXTURE_H

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "quant/quant.h"
#include "test.h"

enum { DFLF_RANDOM, DFLF_ANCHOR, DFLF_CAUSAL, DFLF_PROBE, DFLF_COPY, DFLF_BADVOCAB, DFLF_DSPARK, DFLF_KINDS };
enum { DFLF_LAYERS = 2, DFLF_HD = 64, DFLF_BLOCK = 8 };

static float dflf_rand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*s >> 11) / (double)(1ull << 53)) * 2.0f - 1.0f;
}

typedef struct dflf_bufs {
    float *p[64];
    int n;
} dflf_bufs;

static float *dflf_buf(dflf_bufs *b, size_t n) {
    float *x = calloc(n ? n : 1, sizeof(float));
    b->p[b->n++] = x;
    return x;
}

/* Adds an f32 tensor of ne0 x ne1 (ne1 1: a vector). */
static void dflf_add(gguf_writer *w, const char *name, int64_t ne0, int64_t ne1, const float *data) {
    int64_t ne[4] = {ne0, ne1, 1, 1};
    gguf_writer_add_tensor(w, name, QT_F32, ne1 > 1 ? 2 : 1, ne, data, sizeof(float) * (size_t)(ne0 * ne1));
}

/* A random matrix of rows x k (row r: output feature r), scaled for its fan-in. */
static float *dflf_rmat(dflf_bufs *b, uint64_t *seed, int64_t k, int64_t rows, float gain) {
    float *m = dflf_buf(b, (size_t)(k * rows));
    for (int64_t i = 0; i < k * rows; i++) m[i] = dflf_rand(seed) * gain / sqrtf((float)k);
    return m;
}

/* A norm's weights: ones, or near-ones at random. */
static float *dflf_norm(dflf_bufs *b, uint64_t *seed, int64_t n, bool rnd) {
    float *v = dflf_buf(b, (size_t)n);
    for (int64_t i = 0; i < n; i++) v[i] = 1.0f + (rnd ? 0.2f * dflf_rand(seed) : 0.0f);
    return v;
}

/* Writes the fixture of kind `kind` for the target data/models/<src> into
 * path; false (with a note) when the source is missing or writing fails. */
static bool dflash_fixture(const char *src, int kind, char *path, size_t cap) {
    static const char *const kn[] = {"random", "anchor", "causal", "probe", "copy", "badvocab", "dspark"};
    char name[256], sp[512], key[160];
    snprintf(name, sizeof name, "dflash-%s-%s", kn[kind], src);
    test_tmp_path(path, cap, name);
    snprintf(name, sizeof name, "data/models/%s", src);
    test_data_path(sp, sizeof sp, name);
    gguf_ctx *g;
    hn_err e;
    if (gguf_open(sp, &g, &e)) {
        printf("skip %s (not found)\n", src);
        return false;
    }
    const char *arch = gguf_get_str(g, "general.architecture");
    uint32_t nl = 0, E = 0, nextn = 0;
    snprintf(key, sizeof key, "%s.block_count", arch);
    gguf_get_u32(g, key, &nl);
    snprintf(key, sizeof key, "%s.embedding_length", arch);
    gguf_get_u32(g, key, &E);
    snprintf(key, sizeof key, "%s.nextn_predict_layers", arch);
    gguf_get_u32(g, key, &nextn);
    const int32_t n_main = (int32_t)(nl - nextn);
    const gguf_tensor *te = gguf_find_tensor(g, "token_embd.weight");
    const int64_t V = te ? te->ne[1] : 0;
    const bool own = kind == DFLF_COPY;
    const int64_t H = 4, HKV = kind == DFLF_RANDOM || kind == DFLF_ANCHOR || kind == DFLF_CAUSAL ||
                                      kind == DFLF_BADVOCAB || kind == DFLF_DSPARK
                                  ? 2
                                  : 4;
    const int64_t HD = DFLF_HD, NQ = H * HD, NKV = HKV * HD, F = 2 * (int64_t)E;
    if (E != NQ || (own && V > 65536)) {
        printf("skip %s (fixture shape: width %u, %lld tokens)\n", src, E, (long long)V);
        gguf_close(g);
        return false;
    }
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_str(w, "general.architecture", "dflash");
    gguf_writer_set_str(w, "general.name", name);
    /* the target's tokenizer (a DFlash file borrows it), token 5 changed for BADVOCAB */
    char **toks = NULL;
    uint64_t n_toks = 0;
    for (int64_t i = 0; i < gguf_n_kv(g); i++) {
        const char *k = gguf_kv_key(g, i);
        if (strncmp(k, "tokenizer.", 10)) continue;
        const gguf_value *v = gguf_kv_value(g, i);
        if (kind == DFLF_BADVOCAB && !strcmp(k, "tokenizer.ggml.tokens")) {
            n_toks = v->v.arr.n;
            toks = malloc(sizeof(char *) * (size_t)n_toks);
            for (uint64_t t = 0; t < n_toks; t++) {
                uint64_t len = 0;
                const char *str = gguf_arr_str(v, t, &len);
                toks[t] = t == 5 ? strdup("not-the-target's") : strndup(str ? str : "", (size_t)len);
            }
            gguf_writer_set_arr_str(w, k, (const char *const *)toks, n_toks);
            continue;
        }
        gguf_writer_set_value(w, k, v);
    }
    gguf_writer_set_u32(w, "tokenizer.ggml.mask_token_id", (uint32_t)(V - 1));
    gguf_writer_set_u32(w, "dflash.context_length", 4096);
    gguf_writer_set_u32(w, "dflash.block_count", DFLF_LAYERS);
    gguf_writer_set_u32(w, "dflash.embedding_length", E);
    gguf_writer_set_u32(w, "dflash.feed_forward_length", (uint32_t)F);
    gguf_writer_set_u32(w, "dflash.attention.head_count", (uint32_t)H);
    gguf_writer_set_u32(w, "dflash.attention.head_count_kv", (uint32_t)HKV);
    gguf_writer_set_u32(w, "dflash.attention.key_length", (uint32_t)HD);
    gguf_writer_set_u32(w, "dflash.attention.value_length", (uint32_t)HD);
    gguf_writer_set_u32(w, "dflash.rope.dimension_count", (uint32_t)HD);
    gguf_writer_set_f32(w, "dflash.rope.freq_base", 1e6f);
    gguf_writer_set_f32(w, "dflash.attention.layer_norm_rms_epsilon", 1e-6f);
    gguf_writer_set_u32(w, "dflash.block_size", DFLF_BLOCK);
    gguf_writer_set_u32(w, "dflash.target_hidden_size", E);
    int32_t taps[2] = {n_main / 2 > 0 ? n_main / 2 : 1, n_main};
    const int T = kind == DFLF_PROBE ? 1 : 2;
    if (kind == DFLF_PROBE) taps[0] = n_main;
    gguf_writer_set_arr(w, "dflash.target_layers", GGUF_I32, taps, (uint64_t)T);
    if (kind == DFLF_ANCHOR) gguf_writer_set_bool(w, "dflash.sample_from_anchor", true);
    if (kind == DFLF_CAUSAL) gguf_writer_set_bool(w, "dflash.attention.causal", true);

    dflf_bufs b = {.n = 0};
    uint64_t seed = 0xdf1a5b + (uint64_t)kind;
#define NORM(n, r) dflf_norm(&b, &seed, n, r)
    const bool rnd = kind != DFLF_COPY;
    /* the fusion: fc (T E -> E) and its norm */
    float *fc = kind == DFLF_COPY ? dflf_buf(&b, (size_t)(T * E) * E) : dflf_rmat(&b, &seed, T * (int64_t)E, E, 1.7f);
    float *enc = NORM(E, rnd);
    if (kind == DFLF_PROBE) {
        memset(fc, 0, sizeof(float) * (size_t)E * E);
        for (uint32_t r = 0; r < E; r++) fc[(size_t)r * E + r] = 1.0f;
        const gguf_tensor *on = gguf_find_tensor(g, "output_norm.weight");
        memcpy(enc, on->data, sizeof(float) * E); /* the shared targets keep norms in f32 */
    }
    dflf_add(w, "fc.weight", T * (int64_t)E, E, fc);
    dflf_add(w, "enc.output_norm.weight", E, 1, enc);
    dflf_add(w, "output_norm.weight", E, 1, NORM(E, rnd));
    const int A = (int)E - 2, Bf = (int)E - 1; /* the oracle's flag dims */
    const int d0 = HD / 2 - 1;                 /* the slowest rope pair's first dim */
    if (own) { /* the oracle's embedding and head: a pattern per token, flags (embedding only) */
        float *emb = dflf_buf(&b, (size_t)(E * V)), *out = dflf_buf(&b, (size_t)(E * V));
        for (int64_t t = 0; t < V; t++) {
            for (int i = 0; i < A; i++) emb[t * E + i] = out[t * E + i] = dflf_rand(&seed) < 0 ? -0.1f : 0.1f;
            if (t == V - 1) {
                memset(emb + t * E, 0, sizeof(float) * E);
                emb[t * E + A] = 1.0f;
            } else {
                emb[t * E + Bf] = 1.0f;
            }
        }
        dflf_add(w, "token_embd.weight", E, V, emb);
        dflf_add(w, "output.weight", E, V, out);
    }
    for (int il = 0; il < DFLF_LAYERS; il++) {
        char nm[96];
#define ADDT(s, k, n, d) (snprintf(nm, sizeof nm, "blk.%d." s, il), dflf_add(w, nm, k, n, d))
        float *wq = dflf_rmat(&b, &seed, E, NQ, 1.7f), *wk = dflf_rmat(&b, &seed, E, NKV, 1.7f);
        float *wv = dflf_rmat(&b, &seed, E, NKV, 1.7f), *wo = dflf_rmat(&b, &seed, NQ, E, 1.0f);
        float *qn = NORM(HD, rnd), *kn2 = NORM(HD, rnd);
        float *down = dflf_rmat(&b, &seed, F, E, 1.0f);
        if (kind == DFLF_PROBE && il == 0) {
            memset(wv, 0, sizeof(float) * (size_t)(E * NKV));
            for (int64_t r = 0; r < NKV; r++) wv[r * E + r] = 1.0f;
        }
        if (kind == DFLF_COPY) {
            memset(wq, 0, sizeof(float) * (size_t)(E * NQ));
            memset(wk, 0, sizeof(float) * (size_t)(E * NKV));
            memset(wv, 0, sizeof(float) * (size_t)(E * NKV));
            memset(wo, 0, sizeof(float) * (size_t)(NQ * E));
            memset(down, 0, sizeof(float) * (size_t)(F * E));
            if (il == 0) {
                for (int64_t h = 0; h < H; h++) wq[(h * HD + d0) * E + A] = 1.0f;
                for (int64_t h = 0; h < HKV; h++) wk[(h * HD + d0) * E + Bf] = 1.0f;
                for (int64_t r = 0; r < NKV; r++) wv[r * E + r] = 1.0f;
                for (int64_t r = 0; r < E; r++) wo[r * NQ + r] = 1.0f;
                qn[d0] = kn2[d0] = 4.0f;
            }
        }
        ADDT("attn_norm.weight", E, 1, NORM(E, rnd));
        ADDT("attn_q.weight", E, NQ, wq);
        ADDT("attn_k.weight", E, NKV, wk);
        ADDT("attn_v.weight", E, NKV, wv);
        ADDT("attn_output.weight", NQ, E, wo);
        ADDT("attn_q_norm.weight", HD, 1, qn);
        ADDT("attn_k_norm.weight", HD, 1, kn2);
        ADDT("ffn_norm.weight", E, 1, NORM(E, rnd));
        ADDT("ffn_gate.weight", E, F, dflf_rmat(&b, &seed, E, F, 1.7f));
        ADDT("ffn_up.weight", E, F, dflf_rmat(&b, &seed, E, F, 1.7f));
        ADDT("ffn_down.weight", F, E, down);
#undef ADDT
    }
    if (kind == DFLF_DSPARK) dflf_add(w, "markov_w1.weight", 8, V, dflf_rmat(&b, &seed, 8, V, 1.0f));
#undef NORM
    hn_status st = gguf_writer_write(w, path, &e);
    gguf_writer_free(w);
    gguf_close(g);
    for (uint64_t t = 0; t < n_toks; t++) free(toks[t]);
    free(toks);
    for (int i = 0; i < b.n; i++) free(b.p[i]);
    if (st) printf("skip: writing %s: %s\n", path, e.msg);
    return st == HN_OK;
}

#endif
