/* model.c: loading a model: hyper-parameters from `<arch>.*` metadata, the
 * backend, weight binding with shape checks, the activation tensors; and
 * model_forward, the one-call plan + step + finish. The forward pass itself
 * is in model_forward.c. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../backend/comm.h"
#include "../backend/cpu/cpu.h"
#include "../backend/registry.h"
#include "../core/alloc.h"
#include "../quant/quant.h"
#include "model_int.h"

#define MAX_DIM (1 << 20)

static const struct {
    const char *name;
    model_arch arch;
    be_rope_mode rope;
    bool qk_norm;
    bool moe;
    bool hybrid;
} arch_table[] = {
    {"llama", MODEL_LLAMA, BE_ROPE_NORM, false, false, false},
    {"qwen2", MODEL_QWEN2, BE_ROPE_NEOX, false, false, false},
    {"qwen3", MODEL_QWEN3, BE_ROPE_NEOX, true, false, false},
    {"qwen3moe", MODEL_QWEN3MOE, BE_ROPE_NEOX, true, true, false},
    {"qwen35", MODEL_QWEN35, BE_ROPE_NEOX, true, false, true},
    {"qwen35moe", MODEL_QWEN35MOE, BE_ROPE_NEOX, true, true, true},
};

/* ---- hyper-parameters ---- */

/* Reads `<arch>.<key>` as a positive int; missing keys give def (or an error when def < 0). */
static hn_status get_int(const gguf_ctx *g, const char *arch, const char *key, int32_t def, int32_t *out,
                         hn_err *err) {
    char full[128];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    if (!gguf_get(g, full)) {
        if (def < 0) return hn_errf(err, HN_ERR_FORMAT, "model: missing metadata %s", full);
        *out = def;
        return HN_OK;
    }
    uint32_t v;
    if (!gguf_get_u32(g, full, &v))
        return hn_errf(err, HN_ERR_UNSUPPORTED, "model: metadata %s is not a single unsigned integer", full);
    if (v > MAX_DIM) return hn_errf(err, HN_ERR_FORMAT, "model: metadata %s = %u is out of range", full, v);
    *out = (int32_t)v;
    return HN_OK;
}

static hn_status get_float(const gguf_ctx *g, const char *arch, const char *key, float def, bool required,
                           float *out, hn_err *err) {
    char full[128];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    if (!gguf_get(g, full)) {
        if (required) return hn_errf(err, HN_ERR_FORMAT, "model: missing metadata %s", full);
        *out = def;
        return HN_OK;
    }
    if (!gguf_get_f32(g, full, out) || !isfinite(*out))
        return hn_errf(err, HN_ERR_FORMAT, "model: metadata %s is not a finite number", full);
    return HN_OK;
}

/* The hybrid keys (qwen35, qwen35moe; ../shared/reference/qwen35.md 2.1). */
static hn_status read_hybrid(const gguf_ctx *g, const char *arch, model_hparams *hp, bool moe, hn_err *err) {
    hn_status st;
    int32_t inner;
    if ((st = get_int(g, arch, "full_attention_interval", 4, &hp->full_attn_interval, err)) ||
        (st = get_int(g, arch, "ssm.conv_kernel", -1, &hp->ssm_conv, err)) ||
        (st = get_int(g, arch, "ssm.state_size", -1, &hp->ssm_state, err)) ||
        (st = get_int(g, arch, "ssm.group_count", -1, &hp->ssm_k_heads, err)) ||
        (st = get_int(g, arch, "ssm.time_step_rank", -1, &hp->ssm_v_heads, err)) ||
        (st = get_int(g, arch, "ssm.inner_size", -1, &inner, err)) ||
        (st = get_int(g, arch, "nextn_predict_layers", 0, &hp->n_nextn, err)))
        return st;
    if (moe && (st = get_int(g, arch, "expert_shared_feed_forward_length", 0, &hp->n_ff_shexp, err))) return st;
    if (hp->full_attn_interval < 1 || hp->ssm_conv < 1 || hp->ssm_conv > 64 || hp->ssm_state < 1 ||
        hp->ssm_state > 1024 || hp->ssm_k_heads < 1 || hp->ssm_v_heads < 1 || hp->ssm_v_heads > 4096 ||
        inner != hp->ssm_state * hp->ssm_v_heads || hp->n_nextn >= hp->n_layer)
        return hn_errf(err, HN_ERR_FORMAT,
                       "model: bad delta-net shape: conv %d, state %d, %d key heads, %d value heads, inner %d, %d MTP "
                       "layers of %d",
                       hp->ssm_conv, hp->ssm_state, hp->ssm_k_heads, hp->ssm_v_heads, inner, hp->n_nextn, hp->n_layer);
    char full[128];
    snprintf(full, sizeof full, "%s.rope.dimension_sections", arch);
    const gguf_value *sec = gguf_get(g, full);
    if (!sec) return hn_errf(err, HN_ERR_FORMAT, "model: missing metadata %s", full);
    if (sec->type != GGUF_ARRAY || sec->v.arr.n < 3 || sec->v.arr.n > 4 || sec->v.arr.elem == GGUF_STRING ||
        sec->v.arr.elem == GGUF_ARRAY)
        return hn_errf(err, HN_ERR_FORMAT, "model: %s is not an array of 3 or 4 integers", full);
    for (uint64_t i = 0; i < sec->v.arr.n; i++) {
        int64_t v = gguf_arr_int(sec, i);
        if (v < 0 || v > MAX_DIM) return hn_errf(err, HN_ERR_FORMAT, "model: %s[%d] = %lld", full, (int)i, (long long)v);
        hp->rope_sections[i] = (int32_t)v;
    }
    /* layer i is full attention iff (i + 1) % interval == 0; MTP layers (the last n_nextn) are attention layers */
    int32_t n_main = hp->n_layer - hp->n_nextn;
    size_t C = 2 * (size_t)hp->ssm_k_heads * (size_t)hp->ssm_state + (size_t)hp->ssm_v_heads * (size_t)hp->ssm_state;
    size_t conv = sizeof(float) * (size_t)(hp->ssm_conv - 1) * C;
    size_t delta = sizeof(float) * (size_t)hp->ssm_v_heads * (size_t)hp->ssm_state * (size_t)hp->ssm_state;
    for (int32_t il = 0; il < n_main; il++) {
        if ((il + 1) % hp->full_attn_interval == 0) hp->n_layer_attn++;
        else hp->n_layer_rec++;
    }
    if (hp->n_layer_attn < 1)
        return hn_errf(err, HN_ERR_UNSUPPORTED, "model: a hybrid without attention layers (%d layers, interval %d)",
                       n_main, hp->full_attn_interval);
    hp->state_bytes = (size_t)hp->n_layer_rec * (conv + delta);
    return HN_OK;
}

static hn_status read_hparams(const gguf_ctx *g, model_hparams *hp, bool *moe, hn_err *err) {
    memset(hp, 0, sizeof *hp);
    const char *arch = gguf_get_str(g, "general.architecture");
    if (!arch) return hn_errf(err, HN_ERR_FORMAT, "model: missing general.architecture");
    size_t ai = 0;
    while (ai < sizeof arch_table / sizeof arch_table[0] && strcmp(arch_table[ai].name, arch)) ai++;
    if (ai == sizeof arch_table / sizeof arch_table[0])
        return hn_errf(err, HN_ERR_UNSUPPORTED,
                       "model: architecture '%s' is not supported (llama, qwen2, qwen3, qwen3moe, qwen35, qwen35moe)", arch);
    hp->arch = arch_table[ai].arch;
    snprintf(hp->arch_name, sizeof hp->arch_name, "%s", arch);
    hp->rope_mode = arch_table[ai].rope;
    hp->qk_norm = arch_table[ai].qk_norm;
    hp->hybrid = arch_table[ai].hybrid;
    *moe = arch_table[ai].moe;
    hn_status st;
    if ((st = get_int(g, arch, "block_count", -1, &hp->n_layer, err)) ||
        (st = get_int(g, arch, "embedding_length", -1, &hp->n_embd, err)) ||
        (st = get_int(g, arch, "attention.head_count", -1, &hp->n_head, err)) ||
        (st = get_int(g, arch, "attention.head_count_kv", hp->n_head, &hp->n_head_kv, err)) ||
        (st = get_int(g, arch, "context_length", 4096, &hp->n_ctx_train, err)) ||
        (st = get_int(g, arch, "attention.sliding_window", 0, &hp->sliding_window, err)) ||
        (st = get_float(g, arch, "rope.freq_base", 10000.0f, false, &hp->rope_base, err)) ||
        (st = get_float(g, arch, "attention.layer_norm_rms_epsilon", 0, true, &hp->rms_eps, err)))
        return st;
    if (hp->n_layer < 1 || hp->n_embd < 1 || hp->n_head < 1 || hp->n_head_kv < 1 || hp->n_head % hp->n_head_kv)
        return hn_errf(err, HN_ERR_FORMAT, "model: bad shape: %d layers, width %d, %d heads, %d kv heads", hp->n_layer,
                       hp->n_embd, hp->n_head, hp->n_head_kv);
    int32_t def_hd = hp->n_embd % hp->n_head == 0 ? hp->n_embd / hp->n_head : -1;
    int32_t vdim;
    if ((st = get_int(g, arch, "attention.key_length", def_hd, &hp->head_dim, err)) ||
        (st = get_int(g, arch, "attention.value_length", hp->head_dim, &vdim, err)) ||
        (st = get_int(g, arch, "rope.dimension_count", hp->head_dim, &hp->n_rot, err)))
        return st;
    if (vdim != hp->head_dim)
        return hn_errf(err, HN_ERR_UNSUPPORTED, "model: value_length %d differs from key_length %d", vdim, hp->head_dim);
    if (hp->head_dim < 2 || hp->head_dim > 1024 || hp->n_rot > hp->head_dim || hp->n_rot % 2 || hp->n_rot < 2)
        return hn_errf(err, HN_ERR_FORMAT, "model: head dim %d with %d rotated dims is not supported", hp->head_dim,
                       hp->n_rot);
    if (*moe) {
        if ((st = get_int(g, arch, "expert_count", -1, &hp->n_expert, err)) ||
            (st = get_int(g, arch, "expert_used_count", -1, &hp->n_expert_used, err)) ||
            (st = get_int(g, arch, "expert_feed_forward_length", -1, &hp->n_ff_exp, err)))
            return st;
        if (hp->n_expert < 1 || hp->n_expert > 1024 || hp->n_expert_used < 1 || hp->n_expert_used > hp->n_expert ||
            hp->n_ff_exp < 1)
            return hn_errf(err, HN_ERR_FORMAT, "model: bad experts: %d of %d used, width %d", hp->n_expert_used,
                           hp->n_expert, hp->n_ff_exp);
    } else {
        if ((st = get_int(g, arch, "feed_forward_length", -1, &hp->n_ff, err))) return st;
        if (hp->n_ff < 1) return hn_errf(err, HN_ERR_FORMAT, "model: feed_forward_length is 0");
    }
    if (!(hp->rms_eps > 0.0f) || !(hp->rope_base > 0.0f))
        return hn_errf(err, HN_ERR_FORMAT, "model: rms epsilon %g and rope base %g must be positive", hp->rms_eps,
                       hp->rope_base);
    if (hp->hybrid) return read_hybrid(g, arch, hp, *moe, err);
    return HN_OK;
}

/* ---- weight binding ---- */

/* Finds tensor `name` checking its dims against ne[0..n_dims) and describes
 * it in *src. Missing and not required: src->data stays NULL. */
static hn_status find(const gguf_ctx *g, const char *name, int n_dims, int64_t ne0, int64_t ne1, int64_t ne2,
                      bool required, be_weight_src *src, hn_err *err) {
    memset(src, 0, sizeof *src);
    src->name = name;
    const gguf_tensor *t = gguf_find_tensor(g, name);
    if (!t) {
        if (required) return hn_errf(err, HN_ERR_FORMAT, "model: missing tensor %s", name);
        return HN_OK;
    }
    int64_t want[3] = {ne0, ne1, ne2};
    bool ok = t->n_dims <= n_dims || (t->n_dims == n_dims + 1 && t->ne[n_dims] == 1);
    for (int i = 0; i < 3 && ok; i++) ok = t->ne[i] == (i < n_dims ? want[i] : 1);
    if (!ok)
        return hn_errf(err, HN_ERR_FORMAT,
                       "model: tensor %s has shape [%lld, %lld, %lld], the metadata says [%lld, %lld, %lld]", name,
                       (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)want[0],
                       (long long)(n_dims > 1 ? want[1] : 1), (long long)(n_dims > 2 ? want[2] : 1));
    const qt_type_traits *tr = qt_traits(t->type);
    if (!tr || !tr->to_float)
        return hn_errf(err, HN_ERR_UNSUPPORTED, "model: tensor %s has type %s, which hone cannot compute with", name,
                       qt_name(t->type));
    size_t row_bytes = qt_row_size(t->type, t->ne[0]);
    if (row_bytes == 0 || row_bytes * (size_t)t->ne[1] * (size_t)t->ne[2] > t->nbytes)
        return hn_errf(err, HN_ERR_FORMAT, "model: tensor %s: rows of %lld do not fit type %s", name,
                       (long long)t->ne[0], qt_name(t->type));
    src->type = t->type;
    src->ne[0] = t->ne[0];
    src->ne[1] = t->ne[1];
    src->ne[2] = t->ne[2];
    src->data = t->data;
    src->bytes = t->nbytes;
    return HN_OK;
}

/* Every weight is made here: on the main backend, or (apart) on the expert
 * backend; the bytes each holds are counted (model_weight_bytes). */
static hn_status load_weight(model *m, bool apart, const be_weight_src *src, unsigned flags, be_tensor **out,
                             hn_err *err) {
    be_backend *b = apart ? m->xbe : m->be;
    hn_status st = b->ops->weight_load(b, src, flags, out, err);
    if (!st) m->wbytes[apart] += src->bytes;
    return st;
}

/* Tensor parallel: how a rank takes its share of a weight. Column-parallel
 * weights (q, k, v, gate, up, the output) give each rank a range of their
 * rows (output features): rows of the GGUF tensor, contiguous in the file.
 * Row-parallel ones (o, down) give each rank a range of every row's
 * columns (input features, ne0, the contiguous dimension): whole blocks of
 * each row, copied out of the file once at load. */
typedef enum { SP_WHOLE, SP_ROWS, SP_COLS } split;

/* Rank r's share of src (a matrix or, for SP_ROWS, an f32 vector: a range of
 * its elements); with one rank or SP_WHOLE src is left whole. A column copy
 * is the model's (m->slices) and is not file-backed (*flags loses
 * BE_W_DROP_SOURCE). */
static hn_status slice_src(model *m, int r, split sp, be_weight_src *src, unsigned *flags, hn_err *err) {
    const int R = m->n_ranks;
    if (R <= 1 || sp == SP_WHOLE) return HN_OK;
    const bool vec = src->ne[1] == 1 && sp == SP_ROWS && src->type == QT_F32;
    const int64_t n = vec ? src->ne[0] : sp == SP_ROWS ? src->ne[1] : src->ne[0];
    if (n % R)
        return hn_errf(err, HN_ERR_INVALID, "model: tensor %s: %lld %s do not split into %d ranks", src->name,
                       (long long)n, sp == SP_COLS ? "columns" : "rows", R);
    const size_t rb = qt_row_size(src->type, src->ne[0]);
    const unsigned char *d = src->data;
    if (vec) {
        src->data = d + (size_t)(r * (n / R)) * sizeof(float);
        src->ne[0] = n / R;
        src->bytes = (size_t)(n / R) * sizeof(float);
        return HN_OK;
    }
    if (sp == SP_ROWS) {
        src->data = d + (size_t)(r * (n / R)) * rb;
        src->ne[1] = n / R;
        src->bytes = (size_t)(n / R) * rb;
        return HN_OK;
    }
    const int64_t kc = n / R, rows = src->ne[1];
    const size_t nrb = qt_row_size(src->type, kc), off = qt_row_size(src->type, kc * r);
    if (!nrb)
        return hn_errf(err, HN_ERR_INVALID,
                       "model: tensor %s (%s) cannot be split into %d ranks of %lld columns: a rank's share of a row "
                       "must be whole %s blocks",
                       src->name, qt_name(src->type), R, (long long)kc, qt_name(src->type));
    if (m->n_slices == m->cap_slices) {
        int cap = m->cap_slices ? 2 * m->cap_slices : 16;
        void **np = hn_realloc(m->slices, sizeof *np * (size_t)cap);
        if (!np) return hn_errf(err, HN_ERR_NOMEM, "model: out of memory");
        m->slices = np;
        m->cap_slices = cap;
    }
    unsigned char *buf = hn_malloc(nrb * (size_t)rows);
    if (!buf) return hn_errf(err, HN_ERR_NOMEM, "model: out of memory for a slice of %s", src->name);
    m->slices[m->n_slices++] = buf;
    for (int64_t j = 0; j < rows; j++) memcpy(buf + (size_t)j * nrb, d + (size_t)j * rb + off, nrb);
    src->data = buf;
    src->ne[0] = kc;
    src->bytes = nrb * (size_t)rows;
    *flags &= ~(unsigned)BE_W_DROP_SOURCE;
    return HN_OK;
}

/* Rank r's share (sp) of matrix `name` [ne0, ne1] onto its backend, for matmuls. */
static hn_status bind_sp(model *m, int r, const char *name, int64_t ne0, int64_t ne1, split sp, bool required,
                         be_tensor **w, hn_err *err) {
    be_weight_src src;
    *w = NULL;
    unsigned flags = BE_W_MATMUL | m->drop;
    hn_status st = find(m->g, name, 2, ne0, ne1, 1, required, &src, err);
    if (st || !src.data || (st = slice_src(m, r, sp, &src, &flags, err))) return st;
    be_backend *b = m->rk[r].be;
    if (!(st = b->ops->weight_load(b, &src, flags, w, err))) m->wbytes[0] += src.bytes;
    return st;
}

/* Rank r's share (SP_WHOLE or SP_ROWS: a range of elements) of f32 vector `name` [n]. */
static hn_status bind_vec_sp(model *m, int r, const char *name, int64_t n, split sp, bool required, be_tensor **out,
                             hn_err *err) {
    be_weight_src src;
    *out = NULL;
    unsigned flags = 0;
    hn_status st = find(m->g, name, 1, n, 1, 1, required, &src, err);
    if (st || !src.data) return st;
    if (src.type != QT_F32)
        return hn_errf(err, HN_ERR_UNSUPPORTED, "model: tensor %s is %s; hone expects f32 norms and biases", name,
                       qt_name(src.type));
    if ((st = slice_src(m, r, sp, &src, &flags, err))) return st;
    be_backend *b = m->rk[r].be;
    if (!(st = b->ops->weight_load(b, &src, flags, out, err))) m->wbytes[0] += src.bytes;
    return st;
}

hn_status model_bind_from(model *m, const gguf_ctx *g, const char *name, int n_dims, int64_t ne0, int64_t ne1,
                          int64_t ne2, bool required, unsigned flags, be_tensor **w, hn_err *err) {
    be_weight_src src;
    *w = NULL;
    hn_status st = find(g, name, n_dims, ne0, ne1, ne2, required, &src, err);
    if (st || !src.data) return st;
    return load_weight(m, false, &src, flags, w, err);
}

hn_status model_bind_vec_from(model *m, const gguf_ctx *g, const char *name, int64_t n, bool required,
                              be_tensor **out, hn_err *err) {
    be_weight_src src;
    *out = NULL;
    hn_status st = find(g, name, 1, n, 1, 1, required, &src, err);
    if (st || !src.data) return st;
    if (src.type != QT_F32)
        return hn_errf(err, HN_ERR_UNSUPPORTED, "model: tensor %s is %s; hone expects f32 norms and biases", name,
                       qt_name(src.type));
    return load_weight(m, false, &src, 0, out, err);
}

/* Binds a matrix (or expert stack) of the model's file as a backend weight that matmuls read. */
static hn_status bind(model *m, const char *name, int n_dims, int64_t ne0, int64_t ne1, int64_t ne2, bool required,
                      be_tensor **w, hn_err *err) {
    return model_bind_from(m, m->g, name, n_dims, ne0, ne1, ne2, required, BE_W_MATMUL | m->drop, w, err);
}

/* Binds an expert stack of the model's file onto the expert backend (cpu_moe). */
static hn_status bind_apart(model *m, const char *name, int64_t ne0, int64_t ne1, int64_t ne2, be_tensor **w,
                            hn_err *err) {
    be_weight_src src;
    *w = NULL;
    hn_status st = find(m->g, name, 3, ne0, ne1, ne2, true, &src, err);
    if (st) return st;
    return load_weight(m, true, &src, BE_W_MATMUL | m->drop, w, err);
}

/* Binds an f32 vector of n elements (norm weights, biases). */
static hn_status bind_vec(model *m, const char *name, int64_t n, bool required, be_tensor **out, hn_err *err) {
    return model_bind_vec_from(m, m->g, name, n, required, out, err);
}

/* The FFN of a layer: dense swiglu or routed experts (+ a shared expert). */
static hn_status bind_ffn(model *m, int r, int il, model_layer *L, hn_err *err) {
    const model_hparams *hp = &m->hp;
    char nm[96];
    const int64_t E = hp->n_embd;
    hn_status st;
#define N(s) (snprintf(nm, sizeof nm, "blk.%d." s, il), nm)
    if (hp->n_expert > 0) {
        const int64_t X = hp->n_expert, F = hp->n_ff_exp;
        /* the routed experts: on the expert backend for the last n_moe_remote layers */
        L->moe_remote = il >= hp->n_layer - m->n_moe_remote;
        if ((st = bind(m, N("ffn_gate_inp.weight"), 2, E, X, 1, true, &L->gate_inp, err))) return st;
        if (L->moe_remote) {
            if ((st = bind_apart(m, N("ffn_gate_exps.weight"), E, F, X, &L->gate_exps, err)) ||
                (st = bind_apart(m, N("ffn_up_exps.weight"), E, F, X, &L->up_exps, err)) ||
                (st = bind_apart(m, N("ffn_down_exps.weight"), F, E, X, &L->down_exps, err)))
                return st;
        } else if ((st = bind(m, N("ffn_gate_exps.weight"), 3, E, F, X, true, &L->gate_exps, err)) ||
                   (st = bind(m, N("ffn_up_exps.weight"), 3, E, F, X, true, &L->up_exps, err)) ||
                   (st = bind(m, N("ffn_down_exps.weight"), 3, F, E, X, true, &L->down_exps, err))) {
            return st;
        }
        if (hp->n_ff_shexp > 0) {
            const int64_t SF = hp->n_ff_shexp;
            /* the gate is a 1-D [n_embd] vector: a matrix of one row */
            if ((st = bind(m, N("ffn_gate_inp_shexp.weight"), 2, E, 1, 1, true, &L->gate_inp_sh, err)) ||
                (st = bind(m, N("ffn_gate_shexp.weight"), 2, E, SF, 1, true, &L->gate_sh, err)) ||
                (st = bind(m, N("ffn_up_shexp.weight"), 2, E, SF, 1, true, &L->up_sh, err)) ||
                (st = bind(m, N("ffn_down_shexp.weight"), 2, SF, E, 1, true, &L->down_sh, err)))
                return st;
        }
    } else {
        /* gate and up column-parallel, down row-parallel (tensor parallel; whole with one rank) */
        const int64_t F = hp->n_ff;
        if ((st = bind_sp(m, r, N("ffn_gate.weight"), E, F, SP_ROWS, true, &L->w_gate, err)) ||
            (st = bind_sp(m, r, N("ffn_up.weight"), E, F, SP_ROWS, true, &L->w_up, err)) ||
            (st = bind_sp(m, r, N("ffn_down.weight"), F, E, SP_COLS, true, &L->w_down, err)))
            return st;
    }
#undef N
    return HN_OK;
}

/* A hybrid's layer: gated attention or a delta-net mixer, the post-attention norm, the FFN. */
static hn_status bind_hybrid_layer(model *m, int il, model_layer *L, int *n_attn, int *n_rec, hn_err *err) {
    const model_hparams *hp = &m->hp;
    char nm[96];
    const int64_t E = hp->n_embd, HD = hp->head_dim, NQ = (int64_t)hp->n_head * HD, NKV = (int64_t)hp->n_head_kv * HD;
    const int64_t S = hp->ssm_state, NK = (int64_t)hp->ssm_k_heads * S, NV = (int64_t)hp->ssm_v_heads * S;
    const int64_t C = 2 * NK + NV, K = hp->ssm_conv;
    const bool mtp = il >= hp->n_layer - hp->n_nextn;
    hn_status st;
#define N(s) (snprintf(nm, sizeof nm, "blk.%d." s, il), nm)
    L->recurrent = !mtp && (il + 1) % hp->full_attn_interval != 0;
    if ((st = bind_vec(m, N("attn_norm.weight"), E, true, &L->attn_norm, err)) ||
        (st = bind_vec(m, N("post_attention_norm.weight"), E, true, &L->ffn_norm, err)))
        return st;
    if (L->recurrent) {
        size_t conv = sizeof(float) * (size_t)(K - 1) * (size_t)C, delta = sizeof(float) * (size_t)NV * (size_t)S;
        L->conv_off = (size_t)*n_rec * (conv + delta);
        L->delta_off = L->conv_off + conv;
        (*n_rec)++;
        be_weight_src src;
        if ((st = bind(m, N("attn_qkv.weight"), 2, E, C, 1, true, &L->wqkv, err)) ||
            (st = bind(m, N("attn_gate.weight"), 2, E, NV, 1, true, &L->wz, err)) ||
            (st = bind(m, N("ssm_beta.weight"), 2, E, hp->ssm_v_heads, 1, true, &L->w_beta, err)) ||
            (st = bind(m, N("ssm_alpha.weight"), 2, E, hp->ssm_v_heads, 1, true, &L->w_alpha, err)) ||
            (st = bind(m, N("ssm_out.weight"), 2, NV, E, 1, true, &L->ssm_out, err)) ||
            (st = bind_vec(m, N("ssm_dt.bias"), hp->ssm_v_heads, true, &L->dt_bias, err)) ||
            (st = bind_vec(m, N("ssm_a"), hp->ssm_v_heads, true, &L->ssm_a, err)) ||
            (st = bind_vec(m, N("ssm_norm.weight"), S, true, &L->ssm_norm, err)) ||
            (st = find(m->g, N("ssm_conv1d.weight"), 2, K, C, 1, true, &src, err)))
            return st;
        if (src.type != QT_F32)
            return hn_errf(err, HN_ERR_UNSUPPORTED, "model: tensor %s is %s; hone expects an f32 conv", nm,
                           qt_name(src.type));
        if ((st = load_weight(m, false, &src, 0, &L->conv1d, err))) return st;
    } else {
        L->kv_layer = mtp ? 0 : (*n_attn)++; /* an MTP layer: the one layer of its own cache */
        if ((st = bind(m, N("attn_q.weight"), 2, E, 2 * NQ, 1, true, &L->wq, err)) ||
            (st = bind(m, N("attn_k.weight"), 2, E, NKV, 1, true, &L->wk, err)) ||
            (st = bind(m, N("attn_v.weight"), 2, E, NKV, 1, true, &L->wv, err)) ||
            (st = bind(m, N("attn_output.weight"), 2, NQ, E, 1, true, &L->wo, err)) ||
            (st = bind_vec(m, N("attn_q_norm.weight"), HD, true, &L->q_norm, err)) ||
            (st = bind_vec(m, N("attn_k_norm.weight"), HD, true, &L->k_norm, err)))
            return st;
    }
    if (mtp && ((st = bind(m, N("nextn.eh_proj.weight"), 2, 2 * E, E, 1, true, &L->nextn_eh_proj, err)) ||
                (st = bind_vec(m, N("nextn.enorm.weight"), E, true, &L->nextn_enorm, err)) ||
                (st = bind_vec(m, N("nextn.hnorm.weight"), E, true, &L->nextn_hnorm, err)) ||
                (st = bind_vec(m, N("nextn.shared_head_norm.weight"), E, false, &L->nextn_head_norm, err)) ||
                (st = bind(m, N("nextn.shared_head_head.weight"), 2, E, hp->n_vocab, 1, false, &L->nextn_head, err))))
        return st;
    if (mtp) {
        be_weight_src src;
        if ((st = find(m->g, N("nextn.embed_tokens.weight"), 2, E, hp->n_vocab, 1, false, &src, err))) return st;
        if (src.data && (st = load_weight(m, false, &src, BE_W_ROWS, &L->nextn_embd, err))) return st;
    }
#undef N
    return bind_ffn(m, 0, il, L, err);
}

/* A layer of llama, qwen2, qwen3, qwen3moe: rank r's share of it (tensor
 * parallel: its kv-head group's q/k/v rows and o columns, its FFN slice;
 * norms whole), or the whole layer with one rank. */
static hn_status bind_layer(model *m, int r, int il, model_layer *L, hn_err *err) {
    const model_hparams *hp = &m->hp;
    char nm[96];
    const int64_t E = hp->n_embd, HD = hp->head_dim, NQ = (int64_t)hp->n_head * HD, NKV = (int64_t)hp->n_head_kv * HD;
    hn_status st;
#define N(s) (snprintf(nm, sizeof nm, "blk.%d." s, il), nm)
    const bool bias = hp->arch == MODEL_QWEN2;
    if ((st = bind_vec_sp(m, r, N("attn_norm.weight"), E, SP_WHOLE, true, &L->attn_norm, err)) ||
        (st = bind_sp(m, r, N("attn_q.weight"), E, NQ, SP_ROWS, true, &L->wq, err)) ||
        (st = bind_sp(m, r, N("attn_k.weight"), E, NKV, SP_ROWS, true, &L->wk, err)) ||
        (st = bind_sp(m, r, N("attn_v.weight"), E, NKV, SP_ROWS, true, &L->wv, err)) ||
        (st = bind_sp(m, r, N("attn_output.weight"), NQ, E, SP_COLS, true, &L->wo, err)) ||
        (st = bind_vec_sp(m, r, N("attn_q.bias"), NQ, SP_ROWS, bias, &L->bq, err)) ||
        (st = bind_vec_sp(m, r, N("attn_k.bias"), NKV, SP_ROWS, bias, &L->bk, err)) ||
        (st = bind_vec_sp(m, r, N("attn_v.bias"), NKV, SP_ROWS, bias, &L->bv, err)) ||
        (st = bind_vec_sp(m, r, N("ffn_norm.weight"), E, SP_WHOLE, true, &L->ffn_norm, err)))
        return st;
    if (hp->qk_norm && ((st = bind_vec_sp(m, r, N("attn_q_norm.weight"), HD, SP_WHOLE, true, &L->q_norm, err)) ||
                        (st = bind_vec_sp(m, r, N("attn_k_norm.weight"), HD, SP_WHOLE, true, &L->k_norm, err))))
        return st;
#undef N
    return bind_ffn(m, r, il, L, err);
}

/* ---- scratch ---- */

/* The activation tensors: sized, then reserved in the backend's arena with
 * the other limits, then made. */
/* what a tensor's rows count: the step's tokens, its tokens x experts used, its logits rows */
enum { SC_TOKENS, SC_TOKENS_K, SC_OUT };

typedef struct scratch_part {
    be_tensor **t;
    qt_type type;
    int64_t ne0, ne1;
    int scale;
    bool apart; /* the expert backend's (cpu_moe) */
} scratch_part;

/* Rank r's activation tensors (rank 0: every one the model uses; the
 * others: a dense layer's and their logits slice). Heads, kv heads and the
 * FFN width are the rank's share (the whole with one rank). */
static int scratch_parts(model *m, int r, scratch_part *parts) {
    const model_hparams *hp = &m->hp;
    model_scratch *s = m->rk[r].s;
    int64_t B = m->params.max_batch, K = hp->n_expert > 0 ? hp->n_expert_used : 1;
    int64_t E = hp->n_embd, NQ = (int64_t)m->rk_head * hp->head_dim, NKV = (int64_t)m->rk_head_kv * hp->head_dim;
    int64_t FF = hp->n_expert > 0 ? K * hp->n_ff_exp : m->rk_ff;
    int n = 0;
#define P(field, ty, a, b) parts[n++] = (scratch_part){&s->field, ty, a, b, SC_TOKENS, false}
    if (m->n_ranks > 1) {
        /* this rank's vocabulary slice of the logits, and all ranks' gathered */
        P(lgl, QT_F32, m->rk_vocab, m->params.max_logits);
        parts[n - 1].scale = SC_OUT;
        P(lgg, QT_F32, hp->n_vocab, m->params.max_logits);
        parts[n - 1].scale = SC_OUT;
    }
    P(x, QT_F32, E, B);
    P(xb, QT_F32, E, B);
    P(xb2, QT_F32, E, B);
    P(q, QT_F32, NQ, B);
    P(k, QT_F32, NKV, B);
    P(v, QT_F32, NKV, B);
    P(att, QT_F32, NQ, B);
    if (r > 0) { /* a rank past 0: its slice of a dense layer, nothing else */
        P(hb, QT_F32, FF, B);
        P(hb2, QT_F32, FF, B);
        return n;
    }
    /* the routed experts' scratch: where some layer computes them here */
    const bool local_ffn = hp->n_expert == 0 || m->n_moe_remote < hp->n_layer;
    if (local_ffn) {
        P(hb, QT_F32, FF, B);
        P(hb2, QT_F32, FF, B);
    }
    P(logits, QT_F32, hp->n_vocab, m->params.max_logits);
    parts[n - 1].scale = SC_OUT;
    if (hp->n_expert > 0) {
        P(router, QT_F32, hp->n_expert, B);
        P(exp_ids, QT_I32, K, B);
        P(exp_w, QT_F32, K, B);
        if (local_ffn) {
            P(moe_out, QT_F32, E, B * K);
            parts[n - 1].scale = SC_TOKENS_K;
        }
    }
    if (m->xbe) {
        /* cpu_moe: the packed input here, the routed experts' tensors on the expert backend */
        P(moe_in, QT_F32, E + 2 * K, B);
#define X(field, ty, a, b, sc) parts[n++] = (scratch_part){&m->xio.field, ty, a, b, sc, true}
        X(x, QT_F32, E, B, SC_TOKENS);
        X(ids, QT_I32, K, B, SC_TOKENS);
        X(w, QT_F32, K, B, SC_TOKENS);
        X(hb, QT_F32, FF, B, SC_TOKENS);
        X(hb2, QT_F32, FF, B, SC_TOKENS);
        X(y, QT_F32, E, B * K, SC_TOKENS_K);
        X(out, QT_F32, E, B, SC_TOKENS);
#undef X
    }
    if (hp->hybrid) {
        int64_t S = hp->ssm_state, NK = (int64_t)hp->ssm_k_heads * S, NV = (int64_t)hp->ssm_v_heads * S;
        P(qg, QT_F32, 2 * NQ, B);
        P(gate, QT_F32, NQ, B);
        P(u, QT_F32, 2 * NK + NV, B);
        P(z, QT_F32, NV, B);
        P(ab, QT_F32, hp->ssm_v_heads, B);
        P(bb, QT_F32, hp->ssm_v_heads, B);
        P(dq, QT_F32, NK, B);
        P(dk, QT_F32, NK, B);
        P(dv, QT_F32, NV, B);
        P(dout, QT_F32, NV, B);
        if (hp->n_ff_shexp > 0) {
            P(sh, QT_F32, hp->n_ff_shexp, B);
            P(sh2, QT_F32, hp->n_ff_shexp, B);
            P(shg, QT_F32, 1, B);
            P(shout, QT_F32, E, B);
        }
        if (m->params.mtp && hp->n_nextn > 0) {
            P(hid, QT_F32, E, B);
            P(cat, QT_F32, 2 * E, B);
        }
    }
    if (m->dfl) {
        const model_dflash_info *d = &m->dfl->info;
        int64_t DQ = (int64_t)d->n_head * d->head_dim, DKV = (int64_t)d->n_head_kv * d->head_dim;
        P(taps, QT_F32, (int64_t)d->n_taps * E, B);
        P(fq, QT_F32, DQ, B);
        P(fatt, QT_F32, DQ, B);
        P(fk, QT_F32, DKV, B);
        P(fv, QT_F32, DKV, B);
        P(fhb, QT_F32, d->n_ff, B);
        P(fhb2, QT_F32, d->n_ff, B);
    }
#undef P
    return n;
}

/* ---- load / free ---- */

/* the routed experts' bytes of layer il */
static size_t layer_expert_bytes(const model *m, int il) {
    static const char *const stacks[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
    size_t b = 0;
    char nm[96];
    for (int j = 0; j < 3; j++) {
        snprintf(nm, sizeof nm, "blk.%d.%s.weight", il, stacks[j]);
        const gguf_tensor *t = gguf_find_tensor(m->g, nm);
        if (t) b += t->nbytes;
    }
    return b;
}

/* cpu_moe: the bytes of the routed experts that go to the expert backend. */
static size_t apart_bytes(const model *m) {
    size_t b = 0;
    for (int il = m->hp.n_layer - m->n_moe_remote; il < m->hp.n_layer; il++) b += layer_expert_bytes(m, il);
    return b;
}

/* A backend with memory of its own (a GPU) must hold every weight it gets:
 * refuse the model before uploading anything when those tensors' bytes and
 * a margin for the KV cache's first blocks and the kernels' scratch do not
 * fit in what is free after reserve (the activations are allocated by then).
 * The main backend gets every tensor but the routed experts of the
 * cpu_moe layers, the expert backend those. */
#define FIT_MARGIN ((size_t)256 << 20)
/* what the main backend's memory holds for the model: what it reports free,
 * or mem_budget less what the backend holds already when that is less; false
 * when it reports nothing */
static bool main_free(const model *m, be_backend *b, size_t *free_b, size_t *total_b) {
    if (b->ops->version < 7 || !b->ops->mem_info || !b->ops->mem_info(b, free_b, total_b)) return false;
    if (b == m->be && m->params.mem_budget) {
        const size_t held = b->ops->scratch_bytes ? b->ops->scratch_bytes(b) : 0;
        const size_t left = m->params.mem_budget > held ? m->params.mem_budget - held : 0;
        if (left < *free_b) *free_b = left;
    }
    return true;
}

static hn_status check_fit_on(const model *m, be_backend *b, size_t weights, hn_err *err) {
    size_t free_b = 0, total_b = 0;
    if (!main_free(m, b, &free_b, &total_b)) return HN_OK;
    if (weights + FIT_MARGIN <= free_b) return HN_OK;
    const double gib = 1024.0 * 1024.0 * 1024.0;
    char apart[160] = "";
    if (b == m->be && m->n_moe_remote)
        snprintf(apart, sizeof apart, "; the routed experts of %d layers (%.2f GiB) are on the %s backend",
                 m->n_moe_remote, (double)apart_bytes(m) / gib, m->xbe->ops->name);
    else if (b == m->be && m->hp.n_expert > 0)
        snprintf(apart, sizeof apart, "; --cpu-moe N keeps the routed experts of the last N layers on the CPU");
    return hn_errf(err, HN_ERR_NOMEM,
                   "model: does not fit in %s memory: it needs %.2f GiB (weights %.2f GiB + %.2f GiB for the KV "
                   "cache and scratch), %.2f GiB of %.2f GiB are free (--device cpu runs it on the CPU%s)",
                   b->ops->name, (double)(weights + FIT_MARGIN) / gib, (double)weights / gib,
                   (double)FIT_MARGIN / gib, (double)free_b / gib, (double)total_b / gib, apart);
}

/* every tensor's bytes as the backends hold them (a tied embedding twice) */
static size_t all_weight_bytes(const model *m) {
    size_t weights = 0;
    for (int64_t i = 0; i < gguf_n_tensors(m->g); i++) weights += gguf_tensor_at(m->g, i)->nbytes;
    const gguf_tensor *te = gguf_find_tensor(m->g, "token_embd.weight");
    if (te && !gguf_find_tensor(m->g, "output.weight")) weights += te->nbytes;
    return weights;
}


static hn_status check_fit(const model *m, hn_err *err) {
    const size_t weights = all_weight_bytes(m);
    const size_t apart = apart_bytes(m);
    hn_status st = check_fit_on(m, m->be, weights - apart, err);
    if (!st && m->xbe) st = check_fit_on(m, m->xbe, apart, err);
    return st;
}

/* cpu_moe: how many layers' routed experts go to the expert backend (the
 * last ones), and that backend: the one given, else a CPU backend (on the
 * main backend's pool when that is a CPU backend: they never run at once). */
static hn_status setup_apart(model *m, hn_err *err) {
    const model_hparams *hp = &m->hp;
    const int n = m->params.cpu_moe;
    if (n == MODEL_CPU_MOE_AUTO) return HN_OK; /* resolve_auto_apart, once the scratch can be counted */
    be_backend *given = m->params.moe_backend;
    m->params.moe_backend = NULL;
    if (n == 0) return HN_OK;
    if (hp->n_expert == 0)
        return hn_errf(err, HN_ERR_INVALID, "model: cpu_moe %d (--cpu-moe): %s is not a MoE model, it has no experts", n,
                       hp->arch_name);
    if (n < -1 || n > hp->n_layer)
        return hn_errf(err, HN_ERR_INVALID,
                       "model: cpu_moe %d (--cpu-moe): the layers whose experts go to the CPU are counted 0..%d (the "
                       "model's layers), or -1 for all",
                       n, hp->n_layer);
    const int64_t row = (int64_t)hp->n_embd + 2 * (int64_t)hp->n_expert_used;
    if ((int64_t)m->params.max_batch * row > INT_MAX)
        return hn_errf(err, HN_ERR_INVALID, "model: cpu_moe: a step of %d tokens is too large to hand the experts",
                       m->params.max_batch);
    if (given == m->be) return hn_errf(err, HN_ERR_INVALID, "model: cpu_moe: the expert backend is the main backend");
    m->n_moe_remote = n < 0 ? hp->n_layer : n;
    if (given) {
        m->xbe = given;
        return HN_OK;
    }
    hn_status st;
    if (!strcmp(m->be->ops->name, "cpu")) {
        st = be_cpu_create(be_cpu_pool(m->be), &m->xbe, err);
    } else {
        be_config bc = {.n_threads = m->params.n_threads};
        st = be_create("cpu", &bc, &m->xbe, err);
    }
    m->own_xbe = st == HN_OK;
    return st;
}

/* cpu_moe auto: the fewest last layers whose routed experts must leave the
 * main backend for its weights and the fit check's margin to fit what it has
 * beside its reserved scratch (main_free, as check_fit will see it); then
 * setup_apart for them.
 * No layer when all fits, the backend reports no memory, or the model has
 * no experts; every layer when even that does not fit (check_fit then
 * refuses with the figures). */
static hn_status resolve_auto_apart(model *m, hn_err *err);

/* Tensor parallel: the ranks (model_params.n_ranks), what each holds of the
 * heads, FFN and vocabulary, their backends and communicator. With one
 * rank, rank 0 is the model's backend and holds everything. */
static hn_status setup_ranks(model *m, hn_err *err) {
    const model_hparams *hp = &m->hp;
    const int R = m->params.n_ranks > 1 ? m->params.n_ranks : 1;
    be_backend *const *given = m->params.rank_backends;
    m->params.rank_backends = NULL;
    if (R > COMM_MAX_RANKS)
        return hn_errf(err, HN_ERR_INVALID, "model: tensor parallel over %d ranks (at most %d)", R, COMM_MAX_RANKS);
    m->n_ranks = R;
    m->rk[0].be = m->be;
    m->rk[0].s = &m->s;
    m->rk_head = hp->n_head;
    m->rk_head_kv = hp->n_head_kv;
    m->rk_ff = hp->n_ff;
    m->rk_vocab = hp->n_vocab;
    if (R == 1) return HN_OK;
    if (hp->hybrid || hp->n_expert > 0)
        return hn_errf(err, HN_ERR_UNSUPPORTED,
                       "model: tensor parallel is built for dense llama, qwen2 and qwen3 only; %s is %s (not sharded yet)",
                       hp->arch_name, hp->hybrid ? "a hybrid (its recurrent state)" : "a MoE model (its experts)");
    if (m->params.dflash || m->params.cpu_moe)
        return hn_errf(err, HN_ERR_UNSUPPORTED, "model: tensor parallel does not run with %s yet",
                       m->params.dflash ? "a DFlash drafter" : "cpu_moe");
    const char *what = NULL;
    int32_t have = 0;
    if (hp->n_head_kv % R) what = "kv heads (each rank takes whole kv-head groups)", have = hp->n_head_kv;
    else if (hp->n_ff % R) what = "FFN columns", have = hp->n_ff;
    else if (hp->n_vocab % R) what = "vocabulary rows (the output matrix is split by vocabulary)", have = hp->n_vocab;
    if (what)
        return hn_errf(err, HN_ERR_INVALID, "model: tensor parallel over %d ranks: %d %s do not split into %d", R, (int)have,
                       what, R);
    m->rk_head = hp->n_head / R;
    m->rk_head_kv = hp->n_head_kv / R;
    m->rk_ff = hp->n_ff / R;
    m->rk_vocab = hp->n_vocab / R;
    hn_status st;
    for (int r = 1; r < R; r++) {
        model_rank *k = &m->rk[r];
        k->s = &k->own_s;
        if (given) {
            k->be = given[r];
        } else {
            if (strcmp(m->be->ops->name, "cpu"))
                return hn_errf(err, HN_ERR_UNSUPPORTED, "model: tensor parallel ranks are CPU backends for now (rank 0 is %s)",
                               m->be->ops->name);
            if ((st = be_cpu_create(be_cpu_pool(m->be), &k->be, err))) return st;
            k->own_be = true;
        }
    }
    be_backend *bes[COMM_MAX_RANKS];
    for (int r = 0; r < R; r++) {
        bes[r] = m->rk[r].be;
        if (!bes[r] || strcmp(bes[r]->ops->name, "cpu"))
            return hn_errf(err, HN_ERR_UNSUPPORTED,
                           "model: tensor parallel ranks are CPU backends for now (rank %d is %s; CUDA ranks need the "
                           "CUDA backend's per-device dispatch, not built)",
                           r, bes[r] ? bes[r]->ops->name : "missing");
    }
    return comm_create(R, bes, &m->comm, err);
}

static hn_status resolve_auto_apart(model *m, hn_err *err) {
    const model_hparams *hp = &m->hp;
    m->params.cpu_moe = 0;
    size_t free_b = 0, total_b = 0;
    /* main_free: what is free now (the scratch reserved already), or the budget less that scratch */
    if (hp->n_expert == 0 || !main_free(m, m->be, &free_b, &total_b)) return HN_OK;
    size_t need = all_weight_bytes(m) + FIT_MARGIN;
    int n = 0;
    while (need > free_b && n < hp->n_layer) {
        const size_t e = layer_expert_bytes(m, hp->n_layer - 1 - n);
        need = need > e ? need - e : 0;
        n++;
    }
    if (n == 0) return HN_OK;
    m->params.cpu_moe = n;
    return setup_apart(m, err);
}

/* Ranks 1..: their activation tensors in their arenas, sized and backed as rank 0's. */
static hn_status rank_scratch(model *m, int r, const be_limits *lim0, hn_err *err) {
    model_rank *k = &m->rk[r];
    scratch_part parts[16];
    int n = scratch_parts(m, r, parts);
    be_limits lim = *lim0;
    lim.arena_bytes = 0;
    for (int i = 0; i < n; i++) lim.arena_bytes += be_tensor_bytes(parts[i].type, parts[i].ne0, parts[i].ne1);
    hn_status st = k->be->ops->reserve(k->be, &lim, err);
    for (int i = 0; !st && i < n; i++) {
        st = k->be->ops->tensor_new(k->be, parts[i].type, parts[i].ne0, parts[i].ne1, parts[i].t, err);
        if (st) break;
        k->sc_act[k->n_sc] = (be_act_rows){*parts[i].t, parts[i].ne1};
        k->sc_scale[k->n_sc++] = (uint8_t)parts[i].scale;
    }
    k->lim = lim;
    k->lim.arena_bytes = 0;
    return st;
}

static hn_status load_common(const gguf_ctx *g, const model_params *p, bool file_backed, model **out, hn_err *err) {
    *out = NULL;
    model *m = hn_calloc(1, sizeof *m);
    if (!m) return hn_errf(err, HN_ERR_NOMEM, "model: out of memory");
    m->g = g;
    if (p) m->params = *p;
    if (m->params.max_batch <= 0) m->params.max_batch = 512;
    if (m->params.max_seqs <= 0) m->params.max_seqs = 64;
    if (m->params.max_logits <= 0) m->params.max_logits = 64;
    if (m->params.max_logits > m->params.max_batch) m->params.max_logits = m->params.max_batch;
    /* tensor parallel: rank 0's backend is the model's; made ranks are CPU backends */
    if (m->params.n_ranks > 1 && m->params.rank_backends) m->params.backend = m->params.rank_backends[0];
    if (m->params.n_ranks > 1 && (!m->params.device || !strcmp(m->params.device, "auto"))) m->params.device = "cpu";
    m->drop = file_backed ? BE_W_DROP_SOURCE : 0;
    bool moe;
    model_hparams *hp = &m->hp;
    hn_status st = read_hparams(g, hp, &moe, err);
    if (st) goto fail;
    /* the embedding table fixes the vocabulary */
    const gguf_tensor *te = gguf_find_tensor(g, "token_embd.weight");
    if (!te) {
        st = hn_errf(err, HN_ERR_FORMAT, "model: missing tensor token_embd.weight");
        goto fail;
    }
    if (te->ne[1] < 1 || te->ne[1] > INT32_MAX / 2) {
        st = hn_errf(err, HN_ERR_FORMAT, "model: token_embd.weight has %lld rows", (long long)te->ne[1]);
        goto fail;
    }
    hp->n_vocab = (int32_t)te->ne[1];
    if (m->params.backend) {
        m->be = m->params.backend;
    } else {
        be_config bc = {.n_threads = m->params.n_threads};
        if ((st = be_create(m->params.device, &bc, &m->be, err))) goto fail;
        m->own_be = true;
    }
    m->params.backend = NULL;
    if ((st = setup_apart(m, err))) goto fail;
    if ((st = setup_ranks(m, err))) goto fail;
    int64_t max_k = hp->n_embd;
    if (!hp->hybrid || hp->n_nextn == 0) m->params.mtp = false;
    if (m->params.dflash && (st = model_dflash_read(m, m->params.dflash, err))) goto fail;
    int64_t widths[] = {(int64_t)hp->n_head * hp->head_dim, hp->n_ff, hp->n_ff_exp, hp->n_ff_shexp,
                        (int64_t)hp->ssm_v_heads * hp->ssm_state, m->params.mtp ? 2 * (int64_t)hp->n_embd : 0,
                        model_dflash_max_k(m)};
    for (int i = 0; i < 7; i++)
        if (widths[i] > max_k) max_k = widths[i];
    int max_hd = hp->head_dim, max_group = hp->n_head / hp->n_head_kv;
    if (m->dfl) {
        const model_dflash_info *d = &m->dfl->info;
        if (d->head_dim > max_hd) max_hd = d->head_dim;
        if (d->n_head / d->n_head_kv > max_group) max_group = d->n_head / d->n_head_kv;
    }
    scratch_part parts[64];
    int n_parts = scratch_parts(m, 0, parts);
    size_t arena[2] = {0, 0};
    for (int i = 0; i < n_parts; i++) arena[parts[i].apart] += be_tensor_bytes(parts[i].type, parts[i].ne0, parts[i].ne1);
    be_limits lim = {
        .max_rows = m->params.max_batch * (hp->n_expert > 0 ? hp->n_expert_used : 1),
        .max_k = max_k,
        .max_head_dim = max_hd,
        .max_group = max_group,
        .max_experts = hp->n_expert,
        .arena_bytes = arena[0],
    };
    /* the expert backend runs moe_matmul, swiglu and moe_combine only */
    be_limits xlim = {
        .max_rows = lim.max_rows,
        .max_k = hp->n_ff_exp > hp->n_embd ? hp->n_ff_exp : hp->n_embd,
        .max_head_dim = hp->head_dim,
        .max_group = 1,
        .max_experts = hp->n_expert,
        .arena_bytes = arena[1],
    };
    if ((st = m->be->ops->reserve(m->be, &lim, err))) goto fail;
    /* cpu_moe auto: chosen now that the main backend holds this step size's scratch (reserved for every
     * layer's experts at home: at least what it needs with some apart); then the expert backend's part */
    if (m->params.cpu_moe == MODEL_CPU_MOE_AUTO) {
        if ((st = resolve_auto_apart(m, err))) goto fail;
        n_parts = scratch_parts(m, 0, parts);
        arena[0] = arena[1] = 0;
        for (int i = 0; i < n_parts; i++)
            arena[parts[i].apart] += be_tensor_bytes(parts[i].type, parts[i].ne0, parts[i].ne1);
        lim.arena_bytes = arena[0];
        xlim.arena_bytes = arena[1];
        /* the rows handed to the expert backend are the main backend's too: its arena may grow */
        if (m->n_moe_remote && (st = m->be->ops->reserve(m->be, &lim, err))) goto fail;
    }
    if (m->xbe && (st = m->xbe->ops->reserve(m->xbe, &xlim, err))) goto fail;
    if ((st = check_fit(m, err))) goto fail;
    for (int i = 0; i < n_parts; i++) {
        be_backend *b = parts[i].apart ? m->xbe : m->be;
        if ((st = b->ops->tensor_new(b, parts[i].type, parts[i].ne0, parts[i].ne1, parts[i].t, err))) goto fail;
        be_act_rows *a = parts[i].apart ? &m->xsc_act[m->n_xsc] : &m->sc_act[m->n_sc];
        *a = (be_act_rows){*parts[i].t, parts[i].ne1};
        if (parts[i].apart) m->xsc_scale[m->n_xsc++] = (uint8_t)parts[i].scale;
        else m->sc_scale[m->n_sc++] = (uint8_t)parts[i].scale;
    }
    m->lim = lim;
    m->lim.arena_bytes = 0; /* every tensor is made */
    m->xlim = xlim;
    m->xlim.arena_bytes = 0;
    for (int r = 1; r < m->n_ranks; r++)
        if ((st = rank_scratch(m, r, &lim, err))) goto fail;
    model_scratch *s = &m->s;
    m->mio = (model_moe_io){.x = s->xb, .ids = s->exp_ids, .w = s->exp_w, .hb = s->hb, .hb2 = s->hb2, .y = s->moe_out,
                            .out = s->xb2};
    m->sc_rows = m->params.max_batch;
    m->sc_out = m->params.max_logits;
    /* backed for one token until a step needs more */
    if (!m->params.scratch_fixed && (st = model_scratch_fit(m, 1, 1, err))) goto fail;
    /* weights: the embedding table for get_rows, and the output matrix (a
     * second handle on the same bytes when tied: matmuls may repack it while
     * get_rows keeps reading the file's rows) */
    /* every rank: the whole embedding table and final norm, its vocabulary rows of the output */
    be_weight_src src;
    be_tensor *out_w[COMM_MAX_RANKS] = {NULL};
    for (int r = 0; r < m->n_ranks; r++) {
        model_rank *k = &m->rk[r];
        if ((st = find(g, "token_embd.weight", 2, hp->n_embd, hp->n_vocab, 1, true, &src, err)) ||
            (st = k->be->ops->weight_load(k->be, &src, BE_W_ROWS, &k->tok_embd, err)) ||
            (st = bind_vec_sp(m, r, "output_norm.weight", hp->n_embd, SP_WHOLE, true, &k->output_norm, err)) ||
            (st = bind_sp(m, r, "output.weight", hp->n_embd, hp->n_vocab, SP_ROWS, false, &out_w[r], err)))
            goto fail;
        m->wbytes[0] += src.bytes;
        if (!(k->layers = hn_calloc((size_t)hp->n_layer, sizeof *k->layers))) {
            st = hn_errf(err, HN_ERR_NOMEM, "model: out of memory");
            goto fail;
        }
        if (r == 0) m->layers = k->layers;
    }
    m->tok_embd = m->rk[0].tok_embd;
    m->output_norm = m->rk[0].output_norm;
    m->layers = m->rk[0].layers;
    int n_attn = 0, n_rec = 0;
    for (int il = 0; il < hp->n_layer; il++)
        for (int r = 0; r < m->n_ranks; r++)
            if ((st = hp->hybrid ? bind_hybrid_layer(m, il, &m->layers[il], &n_attn, &n_rec, err)
                                 : bind_layer(m, r, il, &m->rk[r].layers[il], err)))
                goto fail;
    if (hp->hybrid) {
        m->seq_next = hn_malloc(sizeof(int32_t) * (size_t)m->params.max_seqs);
        if (!m->seq_next) {
            st = hn_errf(err, HN_ERR_NOMEM, "model: out of memory");
            goto fail;
        }
    }
    hp->tied_output = out_w[0] == NULL;
    /* the tied output last, as before: its file pages may go once packed (get_rows faults the rows it reads back
     * in); each rank's vocabulary rows of it */
    for (int r = 0; r < m->n_ranks; r++) {
        model_rank *k = &m->rk[r];
        if (hp->tied_output) {
            be_weight_src part = src;
            unsigned flags = BE_W_MATMUL | m->drop;
            if ((st = slice_src(m, r, SP_ROWS, &part, &flags, err)) ||
                (st = k->be->ops->weight_load(k->be, &part, flags, &out_w[r], err)))
                goto fail;
            m->wbytes[0] += part.bytes;
        }
        k->output = out_w[r];
    }
    m->output = out_w[0];
    if (m->dfl && (st = model_dflash_bind(m, err))) goto fail;
    if (m->params.mtp) {
        /* the first MTP layer runs (model_mtp_step); its row-selection plan
         * has no sequences and rows that store nothing */
        m->mtp = &m->layers[hp->n_layer - hp->n_nextn];
        if ((st = plan_init(&m->hplan, m->params.max_batch, 1, 1, err))) goto fail;
        for (int32_t i = 0; i < m->params.max_batch; i++) {
            m->hplan.token[i] = m->hplan.pos[i] = m->hplan.seq[i] = 0;
            m->hplan.slot[i] = m->hplan.state_snap[i] = -1;
        }
        if (m->be->pads) {
            /* a backend that runs padding rows reads hidden rows past the
             * step's: they must hold finite values (zeros), not what the
             * arena held */
            size_t bytes = (size_t)hp->n_embd * sizeof(float), rows = (size_t)m->params.max_batch;
            float *z = hn_calloc(rows, bytes);
            if (!z) {
                st = hn_errf(err, HN_ERR_NOMEM, "model: out of memory");
                goto fail;
            }
            if (m->params.scratch_fixed || (st = model_scratch_fit(m, m->params.max_batch, 1, err)) == HN_OK) {
                m->be->ops->upload(m->be, m->s.hid, 0, z, rows * bytes);
                st = m->be->ops->sync(m->be, err);
            }
            hn_free(z);
            if (st || (!m->params.scratch_fixed && (st = model_scratch_fit(m, 1, 1, err)))) goto fail;
        }
    }
    *out = m;
    return HN_OK;
fail:
    model_free(m);
    return st;
}

hn_status model_load_gguf(const gguf_ctx *g, const model_params *p, model **out, hn_err *err) {
    return load_common(g, p, false, out, err);
}

hn_status model_load(const char *path, const model_params *p, model **out, hn_err *err) {
    *out = NULL;
    gguf_ctx *g;
    hn_status st = gguf_open(path, &g, err);
    if (st) return st;
    st = load_common(g, p, true, out, err);
    if (st) {
        gguf_close(g);
        return st;
    }
    (*out)->owned = g;
    return HN_OK;
}

void model_free(model *m) {
    if (!m) return;
    if (m->own_xbe) be_free(m->xbe); /* first: it may run on the main backend's pool */
    comm_free(m->comm);
    for (int r = 1; r < m->n_ranks; r++) { /* they run on rank 0's pool */
        if (m->rk[r].own_be) be_free(m->rk[r].be);
        hn_free(m->rk[r].layers);
    }
    if (m->own_be) be_free(m->be);
    for (int i = 0; i < m->n_slices; i++) hn_free(m->slices[i]);
    hn_free(m->slices);
    plan_free(&m->plan);
    plan_free(&m->hplan);
    model_dflash_free(m);
    hn_free(m->layers);
    hn_free(m->seq_next);
    if (m->owned) gguf_close(m->owned);
    hn_free(m);
}

/* ---- scratch that follows the load ---- */

/* Reserves backend b for steps of rows tokens and outs logits rows: its
 * limits lim0, its activation tensors act (rows classes scale) backed for
 * those rows. */
static hn_status fit_on(be_backend *b, const be_limits *lim0, be_act_rows *act, const uint8_t *scale, int n_act,
                        int64_t rows, int64_t outs, int64_t K, hn_err *err) {
    for (int i = 0; i < n_act; i++) {
        int64_t r = scale[i] == SC_OUT ? outs : scale[i] == SC_TOKENS_K ? rows * K : rows;
        int64_t ne1 = act[i].t->ne[1];
        act[i].rows = r < ne1 ? r : ne1;
    }
    be_limits lim = *lim0;
    lim.max_rows = (int)(rows * K);
    lim.act = act;
    lim.n_act = n_act;
    return b->ops->reserve(b, &lim, err);
}

hn_status model_scratch_fit(model *m, int32_t rows, int32_t outs, hn_err *err) {
    if (rows < 1) rows = 1;
    if (outs < 1) outs = 1;
    if (rows > m->params.max_batch) rows = m->params.max_batch;
    if (outs > m->params.max_logits) outs = m->params.max_logits;
    if (outs > rows) outs = rows; /* a step's logits rows are some of its tokens */
    const int64_t K = m->hp.n_expert > 0 ? m->hp.n_expert_used : 1;
    hn_status st = fit_on(m->be, &m->lim, m->sc_act, m->sc_scale, m->n_sc, rows, outs, K, err);
    for (int r = 1; !st && r < m->n_ranks; r++) {
        model_rank *k = &m->rk[r];
        st = fit_on(k->be, &k->lim, k->sc_act, k->sc_scale, k->n_sc, rows, outs, K, err);
    }
    if (!st && m->xbe) st = fit_on(m->xbe, &m->xlim, m->xsc_act, m->xsc_scale, m->n_xsc, rows, outs, K, err);
    if (st) {
        m->sc_rows = m->sc_out = 0; /* unknown: the next step reserves again */
        return st;
    }
    m->sc_rows = rows;
    m->sc_out = outs;
    return HN_OK;
}

/* The smallest power of two >= n (n >= 1), at most cap. */
static int32_t sc_class(int32_t n, int32_t cap) {
    int32_t c = 1;
    while (c < n && c < cap) c *= 2;
    return c < cap ? c : cap;
}

hn_status model_scratch_need(model *m, int32_t rows, int32_t outs, hn_err *err) {
    if (m->params.scratch_fixed || (rows <= m->sc_rows && outs <= m->sc_out)) return HN_OK;
    int32_t r = rows > m->sc_rows ? sc_class(rows, m->params.max_batch) : m->sc_rows;
    int32_t o = outs > m->sc_out ? sc_class(outs, m->params.max_logits) : m->sc_out;
    return model_scratch_fit(m, r, o > r ? r : o, err);
}

hn_status model_scratch_trim(model *m, hn_err *err) {
    if (m->params.scratch_fixed || (m->sc_rows == 1 && m->sc_out == 1)) return HN_OK;
    return model_scratch_fit(m, 1, 1, err);
}

static size_t scratch_bytes_of(be_backend *b) { return b && b->ops->scratch_bytes ? b->ops->scratch_bytes(b) : 0; }

size_t model_scratch_bytes(const model *m) {
    size_t b = scratch_bytes_of(m->be) + scratch_bytes_of(m->xbe);
    for (int r = 1; r < m->n_ranks; r++) b += scratch_bytes_of(m->rk[r].be);
    return b;
}

const model_hparams *model_hp(const model *m) { return &m->hp; }
const gguf_ctx *model_gguf(const model *m) { return m->g; }
int model_n_threads(const model *m) { return be_n_threads(m->be); }
be_backend *model_backend(const model *m) { return m->be; }
be_backend *model_moe_backend(const model *m) { return m->xbe; }
int model_moe_remote_layers(const model *m) { return m->n_moe_remote; }

size_t model_main_bytes(const model *m) {
    size_t free_b = 0, total_b = 0;
    be_backend *b = m->be;
    if (b->ops->version < 7 || !b->ops->mem_info || !b->ops->mem_info(b, &free_b, &total_b) || !strcmp(b->ops->name, "cpu"))
        return 0;
    return all_weight_bytes(m) - apart_bytes(m) + (b->ops->scratch_bytes ? b->ops->scratch_bytes(b) : 0);
}
int model_n_ranks(const model *m) { return m->n_ranks; }
be_backend *model_rank_backend(const model *m, int r) { return r >= 0 && r < m->n_ranks ? m->rk[r].be : NULL; }

void model_weight_bytes(const model *m, size_t *main_b, size_t *moe_b) {
    *main_b = m->wbytes[0];
    *moe_b = m->wbytes[1];
}

/* ---- model_forward: plan, step and finish in one call ---- */

/* The wrapper's plan, grown when a sequence outgrows its block table (the
 * first forwards of a longer sequence; not in a steady token loop). */
static hn_status ensure_plan(model *m, const kv_cache *kv, const model_batch *b, hn_err *err) {
    int32_t need = 1, bs = kv->cfg.block_size;
    for (int32_t s = 0; s < b->n_seqs; s++) {
        if (!b->seqs || !b->seqs[s]) continue;
        int32_t top = b->seqs[s]->n_tokens;
        for (int32_t i = 0; i < b->n_tokens; i++)
            if (b->seq_id[i] == s && b->pos[i] + 1 > top) top = b->pos[i] + 1;
        int32_t nb = (top + bs - 1) / bs;
        if (b->seqs[s]->n_blocks > nb) nb = b->seqs[s]->n_blocks;
        if (nb > need) need = nb;
    }
    if (m->plan.token && m->plan.cap_blocks >= need) return HN_OK;
    int32_t cap = m->plan.cap_blocks * 2 > need ? m->plan.cap_blocks * 2 : need;
    plan_free(&m->plan);
    return plan_init(&m->plan, m->params.max_batch, m->params.max_seqs, cap, err);
}

hn_status model_forward(model *m, kv_cache *kv, const model_batch *b, float *logits, int32_t logits_cap,
                        hn_err *err) {
    if (b->n_tokens < 0 || (b->n_tokens > 0 && (!b->token || !b->pos || !b->seq_id || !b->seqs)))
        return hn_errf(err, HN_ERR_INVALID, "forward: incomplete batch");
    if (b->n_seqs < 1 || b->n_seqs > m->params.max_seqs)
        return hn_errf(err, HN_ERR_INVALID, "forward: %d sequences in a batch (at most %d)", (int)b->n_seqs,
                       m->params.max_seqs);
    int32_t n_want = 0;
    for (int32_t i = 0; i < b->n_tokens; i++) n_want += !b->want_logits ? i == b->n_tokens - 1 : b->want_logits[i];
    if (n_want > logits_cap)
        return hn_errf(err, HN_ERR_INVALID, "forward: %d logits rows wanted, room for %d", (int)n_want, (int)logits_cap);
    hn_status st = ensure_plan(m, kv, b, err);
    if (st) return st;
    /* the whole batch first, so that a bad token anywhere fails before anything is computed */
    const int V = m->hp.n_vocab;
    for (int32_t i = 0; i < b->n_tokens; i++)
        if (b->token[i] < 0 || b->token[i] >= V)
            return hn_errf(err, HN_ERR_INVALID, "forward: token id %d out of range (vocabulary %d)", (int)b->token[i], V);
    int32_t n_logits = 0;
    for (int32_t t0 = 0; t0 < b->n_tokens;) {
        /* a step: at most max_batch tokens and max_logits wanted rows */
        int32_t n = 0, outs = 0;
        while (t0 + n < b->n_tokens && n < m->params.max_batch) {
            int32_t gi = t0 + n;
            bool want = b->want_logits ? b->want_logits[gi] : gi == b->n_tokens - 1;
            if (want && outs == m->params.max_logits) break;
            outs += want;
            n++;
        }
        model_batch sb = *b;
        sb.n_tokens = n;
        sb.token = b->token + t0;
        sb.pos = b->pos + t0;
        sb.seq_id = b->seq_id + t0;
        /* without want_logits only the batch's last token wants logits: a step
         * that does not hold it wants none */
        sb.want_logits = b->want_logits ? b->want_logits + t0 : NULL;
        if ((st = plan_build(&m->plan, kv, &sb, V, m->params.max_logits, err))) return st;
        if (!b->want_logits && t0 + n != b->n_tokens) m->plan.n_out = 0;
        if ((st = model_step(m, kv, &m->plan, NULL, err))) return st;
        plan_finish(&m->plan);
        if (logits && m->plan.n_out)
            memcpy(logits + (size_t)n_logits * (size_t)V, m->logits_host, sizeof(float) * (size_t)m->plan.n_out * (size_t)V);
        n_logits += m->plan.n_out;
        t0 += n;
    }
    return HN_OK;
}

hn_status model_state_copy(model *m, const kv_cache *kv, int n, const int32_t *src, const int32_t *dst, hn_err *err) {
    if (n <= 0) return HN_OK;
    m->be->ops->state_copy(m->be, kv, n, src, dst);
    return m->be->ops->sync(m->be, err);
}

kv_config model_kv_config(const model *m, int32_t n_blocks, int block_size) {
    kv_config c = {
        .n_layer = m->hp.hybrid ? m->hp.n_layer_attn : m->hp.n_layer,
        .state_bytes = m->hp.state_bytes,
        .n_head_kv = m->hp.n_head_kv,
        .head_dim = m->hp.head_dim,
        .block_size = block_size,
        .n_blocks = n_blocks,
        .type = QT_F32,
        .storage = m->be->ops->kv_storage(m->be),
    };
    /* tensor parallel: each rank's pool holds its kv heads */
    if (m->n_ranks > 1) {
        c.n_shards = m->n_ranks;
        for (int r = 0; r < m->n_ranks; r++) c.shard_storage[r] = m->rk[r].be->ops->kv_storage(m->rk[r].be);
    }
    return c;
}

/* ---- MTP ---- */

bool model_has_mtp(const model *m) { return m->mtp != NULL; }

void model_mtp_bytes(const model *m, size_t *mtp, size_t *main) {
    *mtp = *main = 0;
    char pre[32];
    snprintf(pre, sizeof pre, "blk.%d.", (int)(m->hp.n_layer - m->hp.n_nextn));
    size_t pl = strlen(pre);
    bool own_head = false;
    for (int64_t i = 0; i < gguf_n_tensors(m->g); i++) {
        const gguf_tensor *t = gguf_tensor_at(m->g, i);
        int32_t il = -1;
        if (!strncmp(t->name, "blk.", 4)) il = (int32_t)strtol(t->name + 4, NULL, 10);
        if (!strncmp(t->name, pre, pl)) {
            *mtp += t->nbytes;
            own_head |= strstr(t->name, "shared_head_head") != NULL;
        } else if (il < 0 || il < m->hp.n_layer - m->hp.n_nextn) {
            *main += t->nbytes;
        }
    }
    if (!own_head) { /* it reads the model's output matrix */
        const gguf_tensor *o = gguf_find_tensor(m->g, "output.weight");
        if (!o) o = gguf_find_tensor(m->g, "token_embd.weight");
        if (o) *mtp += o->nbytes;
    }
}

kv_config model_mtp_kv_config(const model *m, int32_t n_blocks, int block_size) {
    kv_config c = model_kv_config(m, n_blocks, block_size);
    c.n_layer = 1;
    c.state_bytes = 0;
    return c;
}
