/* cmd_quantize.c: `hone quantize IN.gguf OUT.gguf TYPE [-t N]`.
 *
 * Converts a model's weights to another tensor type the way llama-quantize
 * does (without an importance matrix), so the same input gives the same
 * tensors: the same per-tensor type choice for each mix (Q4_K_M gives some
 * attn_v/ffn_down layers Q6_K, output gets Q6_K, 1-D and norm tensors stay as
 * they are, rows that do not fit the block size fall back), the same reference
 * quantizers (quant/), the same tensor order (non-layer tensors by name, then
 * layer by layer, by name), and the metadata copied with
 * general.quantization_version and general.file_type set.
 *
 * Input tensors may be F32, F16, BF16 or any type hone can dequantize; a
 * tensor already in its target type is copied unchanged. Outputs are kept in
 * memory until the file is written (the writer borrows tensor data). */
#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../core/alloc.h"
#include "../gguf/gguf.h"
#include "../quant/quant.h"
#include "cli.h"

/* llama.cpp's file types (general.file_type values) that hone can produce */
enum {
    FT_ALL_F32 = 0, FT_F16 = 1, FT_Q4_0 = 2, FT_Q4_1 = 3, FT_Q8_0 = 7, FT_Q5_0 = 8, FT_Q5_1 = 9,
    FT_Q2_K = 10, FT_Q3_K_S = 11, FT_Q3_K_M = 12, FT_Q3_K_L = 13, FT_Q4_K_S = 14, FT_Q4_K_M = 15,
    FT_Q5_K_S = 16, FT_Q5_K_M = 17, FT_Q6_K = 18, FT_IQ4_NL = 25, FT_IQ4_XS = 30, FT_BF16 = 32,
};

static const struct {
    const char *name;
    int ftype;
    qt_type base; /* the type most tensors get */
} ftypes[] = {
    {"F32", FT_ALL_F32, QT_F32}, {"F16", FT_F16, QT_F16}, {"BF16", FT_BF16, QT_BF16},
    {"Q8_0", FT_Q8_0, QT_Q8_0}, {"Q4_0", FT_Q4_0, QT_Q4_0}, {"Q4_1", FT_Q4_1, QT_Q4_1},
    {"Q5_0", FT_Q5_0, QT_Q5_0}, {"Q5_1", FT_Q5_1, QT_Q5_1}, {"Q2_K", FT_Q2_K, QT_Q2_K},
    {"Q3_K_S", FT_Q3_K_S, QT_Q3_K}, {"Q3_K_M", FT_Q3_K_M, QT_Q3_K}, {"Q3_K", FT_Q3_K_M, QT_Q3_K},
    {"Q3_K_L", FT_Q3_K_L, QT_Q3_K}, {"Q4_K_S", FT_Q4_K_S, QT_Q4_K}, {"Q4_K_M", FT_Q4_K_M, QT_Q4_K},
    {"Q4_K", FT_Q4_K_M, QT_Q4_K}, {"Q5_K_S", FT_Q5_K_S, QT_Q5_K}, {"Q5_K_M", FT_Q5_K_M, QT_Q5_K},
    {"Q5_K", FT_Q5_K_M, QT_Q5_K}, {"Q6_K", FT_Q6_K, QT_Q6_K}, {"IQ4_NL", FT_IQ4_NL, QT_IQ4_NL},
    {"IQ4_XS", FT_IQ4_XS, QT_IQ4_XS},
};

static void usage(FILE *f) {
    fprintf(f,
            "usage: hone quantize IN.gguf OUT.gguf TYPE [-t THREADS]\n\n"
            "Converts a GGUF model's weights to TYPE, choosing per-tensor types the way\n"
            "llama-quantize does for that mix (no importance matrix). TYPE is one of:\n ");
    for (size_t i = 0; i < sizeof ftypes / sizeof ftypes[0]; i++) fprintf(f, " %s", ftypes[i].name);
    fprintf(f,
            "\n(Q3_K, Q4_K, Q5_K mean the _M mixes). The input may be F32, F16, BF16 or\n"
            "already quantized (it is dequantized first). THREADS defaults to the CPU count.\n");
}

/* ---- per-tensor type choice (llama.cpp's mixes) ---- */

typedef enum { CAT_TOKEN_EMBD, CAT_ATTN_Q, CAT_ATTN_V, CAT_ATTN_K, CAT_ATTN_QKV, CAT_ATTN_KV_B, CAT_ATTN_OUTPUT,
               CAT_FFN_UP, CAT_FFN_GATE, CAT_FFN_DOWN, CAT_OUTPUT, CAT_OTHER } category;

static category categorize(const char *name) {
    if (!strcmp(name, "output.weight")) return CAT_OUTPUT;
    if (!strcmp(name, "token_embd.weight") || !strcmp(name, "per_layer_token_embd.weight")) return CAT_TOKEN_EMBD;
    if (strstr(name, "attn_qkv.weight")) return CAT_ATTN_QKV;
    if (strstr(name, "attn_kv_b.weight")) return CAT_ATTN_KV_B;
    if (strstr(name, "attn_v.weight")) return CAT_ATTN_V;
    if (strstr(name, "attn_k.weight")) return CAT_ATTN_K;
    if (strstr(name, "attn_q.weight")) return CAT_ATTN_Q;
    if (strstr(name, "attn_output.weight")) return CAT_ATTN_OUTPUT;
    if (strstr(name, "ffn_up")) return CAT_FFN_UP;
    if (strstr(name, "ffn_gate")) return CAT_FFN_GATE;
    if (strstr(name, "ffn_down")) return CAT_FFN_DOWN;
    return CAT_OTHER;
}

static bool is_attn_v(category c) { return c == CAT_ATTN_V || c == CAT_ATTN_QKV || c == CAT_ATTN_KV_B; }

typedef struct {
    int ftype;
    qt_type base;
    bool falcon, is_70b, tied;
    int64_t n_gqa, n_expert, n_layer;
    int n_attn_wv, i_attn_wv, i_ffn_down, i_ffn_gate, i_ffn_up;
    int n_fallback;
} mix_state;

/* Dimensions as ggml counts them: trailing sizes of 1 do not count. */
static int real_dims(const gguf_tensor *t) {
    int n = GGUF_MAX_DIMS;
    while (n > 1 && t->ne[n - 1] == 1) n--;
    return n;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* Whether llama-quantize would touch this tensor at all (weights of 2+ dims,
 * minus norms, routers, positional tables and other small special tensors). */
static bool allows_quantization(const gguf_tensor *t) {
    if (real_dims(t) < 2 || !ends_with(t->name, "weight")) return false;
    static const char *never[] = {
        "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
        "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight",
        "indexer.q_proj.weight", "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight",
        "time_mix_w2.weight", "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight",
        "time_mix_a0.weight", "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight",
        "time_mix_g2.weight", "time_mix_decay_w1.weight", "time_mix_decay_w2.weight",
        "time_mix_lerp_fused.weight", "attn_rel_b.weight", ".position_embd", "sam.pos_embd", "sam.neck.",
        "sam.net_", ".rel_pos", ".patch_embd", ".patch_merger", "a.rvq.codebook", "mm.a.code_embd",
    };
    for (size_t i = 0; i < sizeof never / sizeof never[0]; i++)
        if (strstr(t->name, never[i])) return false;
    return strcmp(t->name, "position_embd.weight") && strcmp(t->name, "token_types.weight");
}

static bool more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

/* The layer of "blk.N.*", or -1. */
static int layer_of(const char *name) {
    if (strncmp(name, "blk.", 4) || !isdigit((unsigned char)name[4])) return -1;
    return atoi(name + 4);
}

/* The mix's choice for one tensor (before the shape fallback); advances the
 * per-category counters exactly as llama.cpp does, so call it in file order. */
static qt_type mix_type(mix_state *m, const gguf_tensor *t, category cat) {
    qt_type ty = m->base;
    const int ft = m->ftype;
    int i_layer = 0, n_layer = (int)m->n_layer;
    if (cat == CAT_OUTPUT || (m->tied && cat == CAT_TOKEN_EMBD)) {
        if (m->falcon || t->ne[0] % qt_traits(ty)->blck_size) ty = QT_Q8_0;
        else if (ty != QT_Q8_0) ty = QT_Q6_K;
    } else if (cat == CAT_TOKEN_EMBD) {
        /* the base type (the very-low-bit mixes hone does not offer change it) */
    } else if (is_attn_v(cat)) {
        if (ft == FT_Q2_K) ty = m->n_gqa >= 4 ? QT_Q4_K : QT_Q3_K;
        else if (ft == FT_Q3_K_M) ty = m->i_attn_wv < 2 ? QT_Q5_K : QT_Q4_K;
        else if (ft == FT_Q3_K_L) ty = QT_Q5_K;
        else if ((ft == FT_IQ4_NL || ft == FT_IQ4_XS) && m->n_gqa >= 4) ty = QT_Q5_K;
        else if ((ft == FT_Q4_K_M || ft == FT_Q5_K_M) && more_bits(m->i_attn_wv, m->n_attn_wv)) ty = QT_Q6_K;
        else if (ft == FT_Q4_K_S && m->i_attn_wv < 4) ty = QT_Q5_K;
        if (m->is_70b && (ty == QT_Q3_K || ty == QT_Q4_K)) ty = QT_Q5_K;
        if (m->n_expert == 8) ty = QT_Q8_0;
        m->i_attn_wv++;
    } else if (cat == CAT_ATTN_K) {
        if (m->n_expert == 8) ty = QT_Q8_0;
    } else if (cat == CAT_FFN_DOWN || cat == CAT_FFN_GATE || cat == CAT_FFN_UP) {
        int *counter = cat == CAT_FFN_DOWN ? &m->i_ffn_down : cat == CAT_FFN_GATE ? &m->i_ffn_gate : &m->i_ffn_up;
        i_layer = m->n_expert > 1 ? layer_of(t->name) : *counter;
        (*counter)++;
        if (cat != CAT_FFN_DOWN) return ty; /* gate/up only change in the IQ3 mixes */
        if (ft == FT_Q2_K) ty = QT_Q3_K;
        else if (ft == FT_Q3_K_M)
            ty = i_layer < n_layer / 16 ? QT_Q5_K : (!m->falcon || more_bits(i_layer, n_layer)) ? QT_Q4_K : QT_Q3_K;
        else if (ft == FT_Q3_K_L) ty = m->falcon ? QT_Q4_K : QT_Q5_K;
        else if (ft == FT_Q4_K_M) {
            if (m->falcon) ty = i_layer < n_layer / 16 ? QT_Q6_K : more_bits(i_layer, n_layer) ? QT_Q5_K : QT_Q4_K;
            else if (more_bits(i_layer, n_layer)) ty = QT_Q6_K;
        } else if (i_layer < n_layer / 8 && (ft == FT_IQ4_NL || ft == FT_IQ4_XS)) ty = QT_Q5_K;
        else if (ft == FT_Q5_K_M && more_bits(i_layer, n_layer)) ty = QT_Q6_K;
        else if (ft == FT_Q4_K_S && !m->falcon && i_layer < n_layer / 8) ty = QT_Q5_K;
    } else if (cat == CAT_ATTN_OUTPUT) {
        if (!m->falcon) {
            if (m->n_expert == 8) {
                if (ft == FT_Q2_K || ft == FT_Q3_K_S || ft == FT_Q3_K_M || ft == FT_IQ4_NL || ft == FT_Q4_K_S ||
                    ft == FT_Q4_K_M || ft == FT_IQ4_XS)
                    ty = QT_Q5_K;
            } else {
                if (ft == FT_Q2_K) ty = QT_Q3_K;
                else if (ft == FT_Q3_K_M) ty = QT_Q4_K;
                else if (ft == FT_Q3_K_L) ty = QT_Q5_K;
            }
        } else if (ft == FT_Q3_K_L) {
            ty = QT_Q4_K;
        }
    } else if (cat == CAT_ATTN_QKV) {
        if (ft == FT_Q3_K_M || ft == FT_Q3_K_L) ty = QT_Q4_K;
        else if (ft == FT_Q4_K_M) ty = QT_Q5_K;
        else if (ft == FT_Q5_K_M) ty = QT_Q6_K;
    }
    return ty;
}

/* A type whose block fits rows of ne0 elements, as llama.cpp falls back. */
static qt_type fallback(mix_state *m, const gguf_tensor *t, qt_type ty) {
    if (t->ne[0] % qt_traits(ty)->blck_size == 0) return ty;
    m->n_fallback++;
    qt_type fb;
    switch (ty) {
    case QT_IQ4_XS: fb = QT_IQ4_NL; break;
    case QT_Q2_K: case QT_Q3_K: fb = QT_Q4_0; break;
    case QT_Q4_K: fb = QT_Q5_0; break;
    case QT_Q5_K: fb = QT_Q5_1; break;
    case QT_Q6_K: fb = QT_Q8_0; break;
    default: fb = QT_F16; break;
    }
    if (t->ne[0] % qt_traits(fb)->blck_size) fb = QT_F16;
    fprintf(stderr, "hone quantize: %s: rows of %lld do not fit %s, using %s\n", t->name, (long long)t->ne[0],
            qt_name(ty), qt_name(fb));
    return fb;
}

/* ---- the conversion ---- */

typedef struct {
    const float *src;
    void *dst;
    qt_type type;
    int64_t row_len, row0, nrows;
} job;

static void *run_job(void *arg) {
    const job *j = arg;
    qt_traits(j->type)->from_float(j->src + j->row0 * j->row_len,
                                   (char *)j->dst + (size_t)j->row0 * qt_row_size(j->type, j->row_len),
                                   j->nrows * j->row_len);
    return NULL;
}

/* Quantizes nrows rows of src into dst with up to nthreads threads. */
static void quantize_rows(const float *src, void *dst, qt_type type, int64_t row_len, int64_t nrows, int nthreads) {
    enum { MAX_THREADS = 64 };
    int64_t per = (nrows + nthreads - 1) / nthreads;
    if (nrows * row_len < 65536 || nthreads <= 1) per = nrows; /* not worth a thread */
    pthread_t tid[MAX_THREADS];
    bool started[MAX_THREADS] = {false};
    job jobs[MAX_THREADS];
    int n = 0;
    for (int64_t r = 0; r < nrows && n < MAX_THREADS; r += per, n++) {
        jobs[n] = (job){src, dst, type, row_len, r, r + per <= nrows ? per : nrows - r};
        if (n > 0) {
            started[n] = pthread_create(&tid[n], NULL, run_job, &jobs[n]) == 0;
            if (!started[n]) run_job(&jobs[n]); /* no thread: do it here */
        }
    }
    run_job(&jobs[0]);
    for (int i = 1; i < n; i++)
        if (started[i]) pthread_join(tid[i], NULL);
}

typedef struct {
    const gguf_tensor *t;
    qt_type type;
    void *owned; /* new data, or NULL when copied from the input */
    size_t nbytes;
} out_tensor;

/* Sort order of llama.cpp's loader: layer number (-1 for non-layer tensors), then name. */
static int tensor_order(const void *a, const void *b) {
    const gguf_tensor *x = ((const out_tensor *)a)->t, *y = ((const out_tensor *)b)->t;
    int lx = layer_of(x->name), ly = layer_of(y->name);
    if (lx != ly) return lx < ly ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int64_t get_int(const gguf_ctx *g, const char *arch, const char *suffix, int64_t dflt) {
    char key[256];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    const gguf_value *v = gguf_get(g, key);
    if (!v) return dflt;
    if (v->type == GGUF_ARRAY) return v->v.arr.n && v->v.arr.elem != GGUF_STRING && v->v.arr.elem != GGUF_ARRAY
                                          ? gguf_arr_int(v, 0) : dflt;
    int64_t x;
    return gguf_get_i64(g, key, &x) ? x : dflt;
}

static int fail(const char *what, const hn_err *err) {
    fprintf(stderr, "hone quantize: %s: %s\n", what, err->msg[0] ? err->msg : hn_status_str(err->code));
    return 1;
}

int cmd_quantize(int argc, char **argv) {
    const char *pos[3] = {0};
    int npos = 0, nthreads = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "-t") || !strcmp(argv[i], "--threads")) {
            if (++i >= argc || (nthreads = atoi(argv[i])) <= 0) {
                usage(stderr);
                return 2;
            }
        } else if (npos < 3) {
            pos[npos++] = argv[i];
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (npos != 3) {
        usage(stderr);
        return 2;
    }
    int fi = -1;
    for (size_t i = 0; i < sizeof ftypes / sizeof ftypes[0]; i++) {
        const char *a = ftypes[i].name, *b = pos[2];
        while (*a && toupper((unsigned char)*b) == *a) a++, b++;
        if (!*a && !*b) fi = (int)i;
    }
    if (fi < 0) {
        fprintf(stderr, "hone quantize: unknown type '%s'\n", pos[2]);
        usage(stderr);
        return 2;
    }
    if (nthreads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        nthreads = n > 0 ? (int)(n > 64 ? 64 : n) : 1;
    }
    if (nthreads > 64) nthreads = 64;

    hn_err err = {0};
    gguf_ctx *in = NULL;
    if (gguf_open(pos[0], &in, &err) != HN_OK) return fail(pos[0], &err);

    const char *arch = gguf_get_str(in, "general.architecture");
    if (!arch) arch = "";
    mix_state m = {.ftype = ftypes[fi].ftype, .base = ftypes[fi].base, .tied = true};
    m.falcon = !strcmp(arch, "falcon");
    int64_t n_head = get_int(in, arch, "attention.head_count", 0);
    int64_t n_head_kv = get_int(in, arch, "attention.head_count_kv", n_head);
    m.n_gqa = n_head_kv ? n_head / n_head_kv : 0;
    m.n_expert = get_int(in, arch, "expert_count", 0);
    m.n_layer = get_int(in, arch, "block_count", 0);
    m.is_70b = !strcmp(arch, "llama") && m.n_layer == 80 && n_head != n_head_kv;

    int64_t nt = gguf_n_tensors(in);
    out_tensor *out = hn_calloc(nt ? (size_t)nt : 1, sizeof *out);
    gguf_writer *w = gguf_writer_new();
    float *f32 = NULL;
    size_t f32_cap = 0;
    int rc = 1;
    if (!out || !w) {
        fprintf(stderr, "hone quantize: out of memory\n");
        goto done;
    }
    for (int64_t i = 0; i < nt; i++) {
        out[i].t = gguf_tensor_at(in, i);
        category c = categorize(out[i].t->name);
        if (is_attn_v(c)) m.n_attn_wv++;
        if (c == CAT_OUTPUT) m.tied = false;
    }
    qsort(out, (size_t)nt, sizeof *out, tensor_order);

    /* choose every type first: the counters run over the whole model in order */
    bool base_quantized = qt_traits(m.base)->is_quantized;
    for (int64_t i = 0; i < nt; i++) {
        const gguf_tensor *t = out[i].t;
        qt_type ty = t->type;
        if (allows_quantization(t)) {
            ty = m.base;
            if (base_quantized) ty = fallback(&m, t, mix_type(&m, t, categorize(t->name)));
        }
        out[i].type = ty;
    }

    /* metadata: everything but split bookkeeping, then the two keys llama.cpp
     * sets, moved to the end as its gguf_set_* do (so the files match) */
    for (int64_t i = 0; i < gguf_n_kv(in); i++) {
        const char *key = gguf_kv_key(in, i);
        if (!strcmp(key, "split.no") || !strcmp(key, "split.count") || !strcmp(key, "split.tensors.count") ||
            !strcmp(key, "general.quantization_version") || !strcmp(key, "general.file_type"))
            continue;
        if (gguf_writer_set_value(w, key, gguf_kv_value(in, i)) != HN_OK) {
            fprintf(stderr, "hone quantize: cannot copy metadata key %s\n", key);
            goto done;
        }
    }
    if (gguf_writer_set_u32(w, "general.quantization_version", 2) != HN_OK ||
        gguf_writer_set_u32(w, "general.file_type", (uint32_t)m.ftype) != HN_OK) {
        fprintf(stderr, "hone quantize: out of memory\n");
        goto done;
    }

    size_t total_in = 0, total_out = 0;
    for (int64_t i = 0; i < nt; i++) {
        const gguf_tensor *t = out[i].t;
        const qt_type ty = out[i].type;
        const void *data = t->data;
        size_t nbytes = t->nbytes;
        printf("[%4lld/%4lld] %-36s %-7s -> %-7s", (long long)i + 1, (long long)nt, t->name, qt_name(t->type),
               qt_name(ty));
        if (ty != t->type) {
            const qt_type_traits *src = qt_traits(t->type), *dst = qt_traits(ty);
            if (!src || !src->to_float) {
                fprintf(stderr, "\nhone quantize: %s: cannot convert from type %s\n", t->name, qt_name(t->type));
                goto done;
            }
            if (!dst || !dst->from_float) {
                fprintf(stderr, "\nhone quantize: %s: cannot quantize to %s\n", t->name, qt_name(ty));
                goto done;
            }
            int64_t ne = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
            int64_t nrows = ne / t->ne[0];
            nbytes = qt_row_size(ty, t->ne[0]) * (size_t)nrows;
            if (t->type != QT_F32) {
                if ((size_t)ne > f32_cap) {
                    hn_free(f32);
                    f32_cap = (size_t)ne;
                    f32 = hn_malloc(f32_cap * sizeof(float));
                    if (!f32) {
                        fprintf(stderr, "\nhone quantize: out of memory\n");
                        goto done;
                    }
                }
                src->to_float(t->data, f32, ne);
            }
            out[i].owned = hn_malloc(nbytes ? nbytes : 1);
            if (!out[i].owned) {
                fprintf(stderr, "\nhone quantize: out of memory\n");
                goto done;
            }
            quantize_rows(t->type == QT_F32 ? t->data : f32, out[i].owned, ty, t->ne[0], nrows, nthreads);
            data = out[i].owned;
        }
        printf(" %10.3f MiB -> %10.3f MiB\n", t->nbytes / 1048576.0, nbytes / 1048576.0);
        total_in += t->nbytes;
        total_out += nbytes;
        if (gguf_writer_add_tensor(w, t->name, ty, t->n_dims, t->ne, data, nbytes) != HN_OK) {
            fprintf(stderr, "hone quantize: cannot add tensor %s\n", t->name);
            goto done;
        }
    }
    if (gguf_writer_write(w, pos[1], &err) != HN_OK) {
        fail(pos[1], &err);
        goto done;
    }
    printf("%s: %.2f MiB -> %.2f MiB (%s, file type %d)%s\n", pos[1], total_in / 1048576.0, total_out / 1048576.0,
           ftypes[fi].name, m.ftype, m.n_fallback ? ", some tensors fell back to another type" : "");
    rc = 0;
done:
    if (out)
        for (int64_t i = 0; i < nt; i++) hn_free(out[i].owned);
    hn_free(out);
    hn_free(f32);
    gguf_writer_free(w);
    gguf_close(in);
    return rc;
}
