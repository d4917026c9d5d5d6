/* mtp_fixture.h: qwen35 / qwen35moe files with an MTP (nextn) layer, made
 * from the shared tiny random models (no file with MTP weights exists):
 * block_count + 1, nextn_predict_layers 1, and blk.N (N: the old block
 * count) = the last attention layer's tensors plus the nextn.* ones.
 *
 *   MTPF_RANDOM  the attention layer as it is, a random eh_proj, unit norms,
 *                the model's own embedding and output (a layer as untrained
 *                as the rest: its drafts mostly miss);
 *   MTPF_COPY    an oracle for "the next token repeats the last": eh_proj
 *                passes enorm(embed(x)) through ([I | 0]), the block adds
 *                nothing (attn_output and ffn_down zero), and its own
 *                embedding and head are one ±1 pattern per token, so its
 *                logits peak at the token it was fed;
 *   MTPF_HIDDEN  eh_proj passes hnorm(h) through ([0 | I]), the block adds
 *                nothing, the model's output as head: its logits are the
 *                target's at the same position, scaled (it drafts the token
 *                the target's hidden state there predicts).
 * Written once per process into the test scratch folder. */
#ifndef HN_TEST_MTP_FIXTURE_H
#define HN_TEST_MTP_FIXTURE_H

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "test.h"

enum { MTPF_RANDOM, MTPF_COPY, MTPF_HIDDEN };

static float mtpf_rand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*s >> 11) / (double)(1ull << 53)) * 2.0f - 1.0f;
}

/* Writes the fixture of kind `kind` made from data/models/<src> into path;
 * false (with a note) when the source is missing or writing fails. */
static bool mtp_fixture(const char *src, int kind, char *path, size_t cap) {
    static const char *const kn[] = {"random", "copy", "hidden"};
    char name[256], sp[512];
    snprintf(name, sizeof name, "mtp-%s-%s", kn[kind], src);
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
    char key[128];
    uint32_t nl = 0, E = 0, interval = 4;
    snprintf(key, sizeof key, "%s.block_count", arch);
    gguf_get_u32(g, key, &nl);
    snprintf(key, sizeof key, "%s.embedding_length", arch);
    gguf_get_u32(g, key, &E);
    snprintf(key, sizeof key, "%s.full_attention_interval", arch);
    gguf_get_u32(g, key, &interval);
    const gguf_tensor *te = gguf_find_tensor(g, "token_embd.weight");
    int64_t V = te ? te->ne[1] : 0;
    int src_layer = -1; /* the last attention layer */
    for (uint32_t il = 0; il < nl; il++)
        if ((il + 1) % interval == 0) src_layer = (int)il;
    gguf_writer *w = gguf_writer_new();
    for (int64_t i = 0; i < gguf_n_kv(g); i++) gguf_writer_set_value(w, gguf_kv_key(g, i), gguf_kv_value(g, i));
    snprintf(key, sizeof key, "%s.block_count", arch);
    gguf_writer_set_u32(w, key, nl + 1);
    snprintf(key, sizeof key, "%s.nextn_predict_layers", arch);
    gguf_writer_set_u32(w, key, 1);
    /* buffers the writer borrows until it writes */
    float *bufs[16];
    int nb = 0;
    char pre[32];
    snprintf(pre, sizeof pre, "blk.%d.", src_layer);
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        int64_t ne[4] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
        gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, ne, t->data, t->nbytes);
        if (strncmp(t->name, pre, strlen(pre))) continue;
        char nm[128];
        snprintf(nm, sizeof nm, "blk.%u.%s", nl, t->name + strlen(pre));
        const char *base = t->name + strlen(pre);
        bool zero = kind != MTPF_RANDOM && (!strcmp(base, "attn_output.weight") || !strncmp(base, "ffn_down", 8));
        if (zero) { /* the block adds nothing to its residual stream */
            size_t n = (size_t)ne[0] * (size_t)ne[1] * (size_t)ne[2];
            float *z = bufs[nb++] = calloc(n, sizeof(float));
            gguf_writer_add_tensor(w, nm, QT_F32, t->n_dims, ne, z, n * sizeof(float));
        } else {
            gguf_writer_add_tensor(w, nm, t->type, t->n_dims, ne, t->data, t->nbytes);
        }
    }
    float *eh = bufs[nb++] = calloc((size_t)2 * E * E, sizeof(float));
    float *ones = bufs[nb++] = calloc(E, sizeof(float));
    uint64_t seed = 0x5eed;
    for (uint32_t i = 0; i < E; i++) ones[i] = 1.0f;
    for (uint32_t r = 0; r < E; r++) /* row r of eh_proj: output feature r over [e | h] */
        for (uint32_t c = 0; c < 2 * E; c++)
            eh[(size_t)r * 2 * E + c] = kind == MTPF_RANDOM   ? mtpf_rand(&seed) * 1.7f / sqrtf((float)(2 * E))
                                        : kind == MTPF_COPY   ? (c == r ? 1.0f : 0.0f)
                                                              : (c == E + r ? 1.0f : 0.0f);
    int64_t ne_eh[4] = {2 * (int64_t)E, E, 1, 1}, ne_v[4] = {E, 1, 1, 1}, ne_tab[4] = {E, V, 1, 1};
    char nm[128];
#define ADD(s, ty, nd, ne, data, bytes) \
    (snprintf(nm, sizeof nm, "blk.%u.nextn." s, nl), gguf_writer_add_tensor(w, nm, ty, nd, ne, data, bytes))
    ADD("eh_proj.weight", QT_F32, 2, ne_eh, eh, sizeof(float) * 2 * E * E);
    ADD("enorm.weight", QT_F32, 1, ne_v, ones, sizeof(float) * E);
    ADD("hnorm.weight", QT_F32, 1, ne_v, ones, sizeof(float) * E);
    ADD("shared_head_norm.weight", QT_F32, 1, ne_v, ones, sizeof(float) * E);
    if (kind == MTPF_COPY) {
        float *tab = bufs[nb++] = malloc(sizeof(float) * (size_t)E * (size_t)V);
        for (size_t i = 0; i < (size_t)E * (size_t)V; i++) tab[i] = mtpf_rand(&seed) < 0 ? -0.1f : 0.1f;
        ADD("embed_tokens.weight", QT_F32, 2, ne_tab, tab, sizeof(float) * (size_t)E * (size_t)V);
        ADD("shared_head_head.weight", QT_F32, 2, ne_tab, tab, sizeof(float) * (size_t)E * (size_t)V);
    }
#undef ADD
    hn_status st = gguf_writer_write(w, path, &e);
    gguf_writer_free(w);
    gguf_close(g);
    for (int i = 0; i < nb; i++) free(bufs[i]);
    if (st) printf("skip: writing %s: %s\n", path, e.msg);
    return st == HN_OK && src_layer >= 0;
}

#endif
