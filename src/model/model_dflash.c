/* model_dflash.c: a DFlash drafter loaded with the target model (model.h,
 * "DFlash"): its metadata checked against the target, its weights bound on
 * the target's backend, and its two forwards, the injection of a step's
 * tapped hidden states into its KV cache and the block forward that drafts.
 *
 * The block's attention is not causal: every block row attends to the
 * context and to the whole block. The attention op attends causally by the
 * plan's positions, so the block forward hands the backend two plans per
 * layer (as model_mtp_step hands it two per step): the block's own plan for
 * rope and the K/V store, and a view of it whose positions are each
 * sequence's last one (aplan) for the attention. No op is added to the
 * backend contract. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../core/alloc.h"
#include "model_int.h"

#define DFL_MAX_DIM (1 << 20)

/* `dflash.<key>` as a positive int (def when missing; def < 0: required). */
static hn_status dint(const gguf_ctx *g, const char *key, int32_t def, int32_t *out, hn_err *err) {
    char full[128];
    snprintf(full, sizeof full, "dflash.%s", key);
    if (!gguf_get(g, full)) {
        if (def < 0) return hn_errf(err, HN_ERR_FORMAT, "dflash: missing metadata %s", full);
        *out = def;
        return HN_OK;
    }
    uint32_t v;
    if (!gguf_get_u32(g, full, &v) || v > DFL_MAX_DIM)
        return hn_errf(err, HN_ERR_FORMAT, "dflash: metadata %s is not an integer in range", full);
    *out = (int32_t)v;
    return HN_OK;
}

static hn_status dbool(const gguf_ctx *g, const char *key, bool *out, hn_err *err) {
    *out = false;
    if (!gguf_get(g, key)) return HN_OK;
    if (!gguf_get_bool(g, key, out)) return hn_errf(err, HN_ERR_FORMAT, "dflash: metadata %s is not a bool", key);
    return HN_OK;
}

/* The forms of the dflash architecture hone does not compute (llama.cpp
 * folds DSpark and DFlash2 into it, detected by their tensors and keys). */
static hn_status refuse_variants(const gguf_ctx *g, const model_dflash_info *d, hn_err *err) {
    static const struct {
        const char *tensor, *what;
    } variants[] = {
        {"markov_w1.weight", "a DSpark drafter (its Markov head, markov_w1)"},
        {"selector_hidden.weight", "a DFlash2 drafter (its candidate selector)"},
        {"d2t", "a reduced draft vocabulary (d2t)"},
    };
    for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++)
        if (gguf_find_tensor(g, variants[i].tensor))
            return hn_errf(err, HN_ERR_UNSUPPORTED, "dflash: %s is not supported (plain DFlash only)", variants[i].what);
    int32_t v = 0;
    hn_status st;
    if ((st = dint(g, "hyper_connection.count", 0, &v, err))) return st;
    if (v > 0) return hn_errf(err, HN_ERR_UNSUPPORTED, "dflash: a DeepSeek-V4 DSpark backbone is not supported");
    if ((st = dint(g, "attention.sliding_window", 0, &v, err))) return st;
    if (v > 0) return hn_errf(err, HN_ERR_UNSUPPORTED, "dflash: sliding-window draft layers are not supported");
    const char *sc = gguf_get_str(g, "dflash.rope.scaling.type");
    float f = 1.0f;
    if ((sc && strcmp(sc, "none")) || (gguf_get_f32(g, "dflash.rope.scaling.factor", &f) && f != 1.0f))
        return hn_errf(err, HN_ERR_UNSUPPORTED, "dflash: scaled rope (%s) is not supported", sc ? sc : "factor");
    /* drafts for M-RoPE targets carry degenerate sections (every pair on the text position): plain rope */
    const gguf_value *sec = gguf_get(g, "dflash.rope.dimension_sections");
    if (sec && sec->type == GGUF_ARRAY && sec->v.arr.elem != GGUF_STRING && sec->v.arr.elem != GGUF_ARRAY)
        for (uint64_t i = 1; i < sec->v.arr.n; i++)
            if (gguf_arr_int(sec, i) != 0)
                return hn_errf(err, HN_ERR_UNSUPPORTED, "dflash: multi-section rope (sections beyond the first) is not supported");
    char nm[64];
    for (int32_t il = 0; il < d->n_layer; il++) {
        snprintf(nm, sizeof nm, "blk.%d.attn_sinks.weight", (int)il);
        if (gguf_find_tensor(g, nm)) return hn_errf(err, HN_ERR_UNSUPPORTED, "dflash: attention sinks are not supported");
    }
    return HN_OK;
}

hn_status model_dflash_read(model *m, const gguf_ctx *g, hn_err *err) {
    const model_hparams *hp = &m->hp;
    const char *arch = gguf_get_str(g, "general.architecture");
    if (!arch || strcmp(arch, "dflash"))
        return hn_errf(err, HN_ERR_UNSUPPORTED, "dflash: the file's architecture is '%s', not dflash", arch ? arch : "(none)");
    model_dfl *D = hn_calloc(1, sizeof *D);
    if (!D) return hn_errf(err, HN_ERR_NOMEM, "dflash: out of memory");
    m->dfl = D;
    D->g = g;
    model_dflash_info *d = &D->info;
    hn_status st;
    int32_t vdim, thid = 0;
    if ((st = dint(g, "block_count", -1, &d->n_layer, err)) || (st = dint(g, "embedding_length", -1, &d->n_embd, err)) ||
        (st = dint(g, "feed_forward_length", -1, &d->n_ff, err)) ||
        (st = dint(g, "attention.head_count", -1, &d->n_head, err)) ||
        (st = dint(g, "attention.head_count_kv", d->n_head, &d->n_head_kv, err)) ||
        (st = dint(g, "block_size", 16, &d->block_size, err)) || (st = dint(g, "target_hidden_size", 0, &thid, err)))
        return st;
    if (d->n_layer < 1 || d->n_layer > 64 || d->n_embd < 1 || d->n_ff < 1 || d->n_head < 1 || d->n_head_kv < 1 ||
        d->n_head % d->n_head_kv)
        return hn_errf(err, HN_ERR_FORMAT, "dflash: bad shape: %d layers, width %d, ffn %d, %d heads, %d kv heads",
                       d->n_layer, d->n_embd, d->n_ff, d->n_head, d->n_head_kv);
    if (d->n_embd != hp->n_embd || (thid && thid != hp->n_embd))
        return hn_errf(err, HN_ERR_UNSUPPORTED, "dflash: drafter width %d (target hidden size %d) is not the target's %d",
                       d->n_embd, thid ? thid : d->n_embd, hp->n_embd);
    if ((st = dint(g, "attention.key_length", d->n_embd % d->n_head ? -1 : d->n_embd / d->n_head, &d->head_dim, err)) ||
        (st = dint(g, "attention.value_length", d->head_dim, &vdim, err)) ||
        (st = dint(g, "rope.dimension_count", d->head_dim, &d->n_rot, err)))
        return st;
    if (vdim != d->head_dim || d->head_dim < 2 || d->head_dim > 1024 || d->n_rot < 2 || d->n_rot > d->head_dim ||
        d->n_rot % 2)
        return hn_errf(err, HN_ERR_UNSUPPORTED, "dflash: head dims %d/%d with %d rotated are not supported", d->head_dim,
                       vdim, d->n_rot);
    if (d->block_size < 2 || d->block_size > 64)
        return hn_errf(err, HN_ERR_UNSUPPORTED, "dflash: block_size %d (2 .. 64 supported)", d->block_size);
    D->rope_base = 10000.0f;
    if (gguf_get(g, "dflash.rope.freq_base") && (!gguf_get_f32(g, "dflash.rope.freq_base", &D->rope_base) || !(D->rope_base > 0)))
        return hn_errf(err, HN_ERR_FORMAT, "dflash: bad rope.freq_base");
    if (!gguf_get_f32(g, "dflash.attention.layer_norm_rms_epsilon", &D->rms_eps) || !(D->rms_eps > 0))
        return hn_errf(err, HN_ERR_FORMAT, "dflash: missing or bad attention.layer_norm_rms_epsilon");
    /* the taps: the input of each named target layer (the main stack's count: its final residual) */
    const int32_t n_main = hp->n_layer - hp->n_nextn;
    const gguf_value *tl = gguf_get(g, "dflash.target_layers");
    if (!tl) return hn_errf(err, HN_ERR_FORMAT, "dflash: the drafter requires dflash.target_layers in its metadata");
    if (tl->type != GGUF_ARRAY || tl->v.arr.n < 1 || tl->v.arr.n > 16 || tl->v.arr.elem == GGUF_STRING ||
        tl->v.arr.elem == GGUF_ARRAY)
        return hn_errf(err, HN_ERR_FORMAT, "dflash: dflash.target_layers is not an array of 1 to 16 integers");
    d->n_taps = (int32_t)tl->v.arr.n;
    for (int32_t i = 0; i < d->n_taps; i++) {
        int64_t L = gguf_arr_int(tl, (uint64_t)i);
        if (L < 0 || L > n_main)
            return hn_errf(err, HN_ERR_UNSUPPORTED, "dflash: target layer %lld is not a layer of the %d-layer target",
                           (long long)L, (int)n_main);
        d->taps[i] = (int32_t)L;
    }
    uint32_t mask;
    if (!gguf_get_u32(g, "tokenizer.ggml.mask_token_id", &mask))
        return hn_errf(err, HN_ERR_FORMAT, "dflash: the drafter has no tokenizer.ggml.mask_token_id");
    if (mask >= (uint32_t)hp->n_vocab)
        return hn_errf(err, HN_ERR_UNSUPPORTED, "dflash: mask token %u is outside the target's %d tokens", mask,
                       hp->n_vocab);
    d->mask_token = (int32_t)mask;
    if ((st = dbool(g, "dflash.sample_from_anchor", &d->sample_from_anchor, err)) ||
        (st = dbool(g, "dflash.attention.causal", &d->causal, err)))
        return st;
    return refuse_variants(g, d, err);
}

int64_t model_dflash_max_k(const model *m) {
    if (!m->dfl) return 0;
    const model_dflash_info *d = &m->dfl->info;
    int64_t k = (int64_t)d->n_taps * d->n_embd;
    if ((int64_t)d->n_head * d->head_dim > k) k = (int64_t)d->n_head * d->head_dim;
    if (d->n_ff > k) k = d->n_ff;
    return k;
}

hn_status model_dflash_bind(model *m, hn_err *err) {
    model_dfl *D = m->dfl;
    const model_dflash_info *d = &D->info;
    const gguf_ctx *g = D->g;
    const int64_t E = d->n_embd, V = m->hp.n_vocab, HD = d->head_dim, NQ = (int64_t)d->n_head * HD,
                  NKV = (int64_t)d->n_head_kv * HD, F = d->n_ff;
    hn_status st;
    if ((st = model_bind_from(m, g, "fc.weight", 2, (int64_t)d->n_taps * E, E, 1, true, BE_W_MATMUL, &D->fc, err)) ||
        (st = model_bind_vec_from(m, g, "enc.output_norm.weight", E, true, &D->enc_norm, err)) ||
        (st = model_bind_vec_from(m, g, "output_norm.weight", E, true, &D->out_norm, err)) ||
        (st = model_bind_from(m, g, "token_embd.weight", 2, E, V, 1, false, BE_W_ROWS, &D->tok_embd, err)) ||
        (st = model_bind_from(m, g, "output.weight", 2, E, V, 1, false, BE_W_MATMUL, &D->output, err)))
        return st;
    D->layers = hn_calloc((size_t)d->n_layer, sizeof *D->layers);
    if (!D->layers) return hn_errf(err, HN_ERR_NOMEM, "dflash: out of memory");
    char nm[96];
    for (int il = 0; il < d->n_layer; il++) {
        model_layer *L = &D->layers[il];
#define N(s) (snprintf(nm, sizeof nm, "blk.%d." s, il), nm)
#define MAT(s, k, n, w) model_bind_from(m, g, N(s), 2, k, n, 1, true, BE_W_MATMUL, w, err)
        if ((st = model_bind_vec_from(m, g, N("attn_norm.weight"), E, true, &L->attn_norm, err)) ||
            (st = MAT("attn_q.weight", E, NQ, &L->wq)) || (st = MAT("attn_k.weight", E, NKV, &L->wk)) ||
            (st = MAT("attn_v.weight", E, NKV, &L->wv)) || (st = MAT("attn_output.weight", NQ, E, &L->wo)) ||
            (st = model_bind_vec_from(m, g, N("attn_q_norm.weight"), HD, true, &L->q_norm, err)) ||
            (st = model_bind_vec_from(m, g, N("attn_k_norm.weight"), HD, true, &L->k_norm, err)) ||
            (st = model_bind_vec_from(m, g, N("ffn_norm.weight"), E, true, &L->ffn_norm, err)) ||
            (st = MAT("ffn_gate.weight", E, F, &L->w_gate)) || (st = MAT("ffn_up.weight", E, F, &L->w_up)) ||
            (st = MAT("ffn_down.weight", F, E, &L->w_down)))
            return st;
#undef MAT
#undef N
    }
    /* what a block forward reads: every drafter tensor, and the target's output matrix when it borrows it */
    model_dflash_info *di = &D->info;
    di->weight_bytes = 0;
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) di->weight_bytes += gguf_tensor_at(g, i)->nbytes;
    if (!D->output) {
        const gguf_tensor *o = gguf_find_tensor(m->g, "output.weight");
        if (!o) o = gguf_find_tensor(m->g, "token_embd.weight");
        if (o) di->weight_bytes += o->nbytes;
    }
    /* the taps' row selection: a plan of no sequences (its rows store nothing) */
    const int32_t B = m->params.max_batch;
    if ((st = plan_init(&D->gplan, B, 1, 1, err))) return st;
    for (int32_t i = 0; i < B; i++) {
        D->gplan.token[i] = D->gplan.pos[i] = D->gplan.seq[i] = 0;
        D->gplan.slot[i] = D->gplan.state_snap[i] = -1;
    }
    /* the attention view's positions */
    D->apos = hn_malloc(sizeof(int32_t) * (size_t)B);
    if (!D->apos) return hn_errf(err, HN_ERR_NOMEM, "dflash: out of memory");
    if (m->be->pads) {
        /* a backend that runs padding rows reads tapped rows past the step's: zeros, not what the arena held */
        size_t bytes = sizeof(float) * (size_t)d->n_taps * (size_t)E, rows = (size_t)B;
        float *z = hn_calloc(rows, bytes);
        if (!z) return hn_errf(err, HN_ERR_NOMEM, "dflash: out of memory");
        if (m->params.scratch_fixed || (st = model_scratch_fit(m, B, 1, err)) == HN_OK) {
            m->be->ops->upload(m->be, m->s.taps, 0, z, rows * bytes);
            st = m->be->ops->sync(m->be, err);
        }
        hn_free(z);
        if (st || (!m->params.scratch_fixed && (st = model_scratch_fit(m, 1, 1, err)))) return st;
    }
    return HN_OK;
}

void model_dflash_free(model *m) {
    if (!m->dfl) return;
    plan_free(&m->dfl->gplan);
    hn_free(m->dfl->apos);
    hn_free(m->dfl->layers);
    hn_free(m->dfl);
    m->dfl = NULL;
}

bool model_has_dflash(const model *m) { return m->dfl != NULL; }
const model_dflash_info *model_dflash(const model *m) { return m->dfl ? &m->dfl->info : NULL; }

kv_config model_dflash_kv_config(const model *m, int32_t n_blocks, int block_size) {
    kv_config c = model_kv_config(m, n_blocks, block_size);
    if (m->dfl) {
        c.n_layer = m->dfl->info.n_layer;
        c.n_head_kv = m->dfl->info.n_head_kv;
        c.head_dim = m->dfl->info.head_dim;
    }
    c.state_bytes = 0;
    return c;
}

/* ---- the forwards ---- */

/* The drafter's checks of a plan against its cache and the model's limits. */
static hn_status check_plan(model *m, const kv_cache *dkv, const step_plan *p, const char *what, hn_err *err) {
    if (!m->dfl) return hn_errf(err, HN_ERR_INVALID, "dflash: the model has no DFlash drafter");
    const model_dflash_info *d = &m->dfl->info;
    if (dkv->cfg.n_layer != d->n_layer || dkv->cfg.n_head_kv != d->n_head_kv || dkv->cfg.head_dim != d->head_dim)
        return hn_errf(err, HN_ERR_INVALID, "dflash %s: the KV cache was made for another shape", what);
    if (p->n_tokens > m->params.max_batch || p->n_pad > m->params.max_batch || p->n_out > m->params.max_logits)
        return hn_errf(err, HN_ERR_INVALID, "dflash %s: a step of %d tokens (%d padded) and %d logits rows; the model takes %d and %d",
                       what, (int)p->n_tokens, (int)p->n_pad, (int)p->n_out, m->params.max_batch, m->params.max_logits);
    int32_t rows = m->be->pads && p->n_pad > p->n_tokens ? p->n_pad : p->n_tokens;
    return model_scratch_need(m, rows, p->n_out, err);
}

hn_status model_dflash_inject(model *m, kv_cache *dkv, const step_plan *p, const int32_t *sel, int32_t n_sel,
                              hn_err *err) {
    hn_status st = check_plan(m, dkv, p, "injection", err);
    if (st) return st;
    if (sel && n_sel != p->n_tokens)
        return hn_errf(err, HN_ERR_INVALID, "dflash: %d tapped rows selected for %d tokens", (int)n_sel, (int)p->n_tokens);
    for (int32_t i = 0; sel && i < n_sel; i++)
        if (sel[i] < i || sel[i] >= m->sc_rows || (i > 0 && sel[i] <= sel[i - 1]))
            return hn_errf(err, HN_ERR_INVALID, "dflash: tapped row selection %d is %d (ascending, below %d)", (int)i,
                           (int)sel[i], (int)m->sc_rows);
    m->logits_host = NULL;
    if (p->n_tokens == 0) return HN_OK;
    model_dfl *D = m->dfl;
    const model_dflash_info *d = &D->info;
    const be_ops *ops = m->be->ops;
    be_backend *be = m->be;
    model_scratch *s = &m->s;
    const int E = d->n_embd, TE = d->n_taps * E, HKV = d->n_head_kv, HD = d->head_dim;
    if (sel && n_sel > 0 && sel[n_sel - 1] != n_sel - 1) {
        /* the selected rows to the front, in place (ascending: a row's source is never an earlier destination) */
        step_plan *gp = &D->gplan;
        gp->n_tokens = gp->n_pad = sel[n_sel - 1] + 1;
        gp->n_seqs = 0;
        gp->bt_stride = 0;
        gp->block_size = p->block_size;
        gp->n_out = n_sel;
        memcpy(gp->out_rows, sel, sizeof(int32_t) * (size_t)n_sel);
        ops->plan_set(be, gp);
        ops->gather_out(be, s->taps, TE, s->taps);
    }
    ops->plan_set(be, p);
    const int n = be->pads ? p->n_pad : p->n_tokens;
    // the taps fused into one row per position: g = enc_norm(rms(fc . taps))
    ops->matmul(be, D->fc, 0, s->taps, n, s->x);
    ops->rms_norm(be, s->x, D->enc_norm, n, E, D->rms_eps, s->xb);
    // every layer's K and V of the context, stored at the positions' slots
    for (int il = 0; il < d->n_layer; il++) {
        const model_layer *L = &D->layers[il];
        ops->matmul_multi(be, 2, (const be_tensor *[]){L->wk, L->wv}, s->xb, n, (be_tensor *[]){s->fk, s->fv});
        ops->rms_norm(be, s->fk, L->k_norm, n * HKV, HD, D->rms_eps, s->fk);
        ops->rope(be, s->fk, n, HKV, HD, d->n_rot, D->rope_base, BE_ROPE_NEOX);
        ops->kv_store(be, dkv, il, s->fk, s->fv, n);
    }
    return ops->sync(be, err);
}

hn_status model_dflash_block(model *m, kv_cache *dkv, const step_plan *p, hn_err *err) {
    hn_status st = check_plan(m, dkv, p, "block", err);
    if (st) return st;
    m->logits_host = NULL;
    if (p->n_tokens == 0) return HN_OK;
    model_dfl *D = m->dfl;
    const model_dflash_info *d = &D->info;
    const be_ops *ops = m->be->ops;
    be_backend *be = m->be;
    model_scratch *s = &m->s;
    const int n = be->pads ? p->n_pad : p->n_tokens;
    const int E = d->n_embd, H = d->n_head, HKV = d->n_head_kv, HD = d->head_dim;
    /* the attention's view of the plan: every row at its sequence's last position, so that it sees
     * the context and the whole block (the plan itself when the drafter's attention is causal) */
    const step_plan *ap = p;
    if (!d->causal) {
        D->aplan = *p;
        D->aplan.pos = D->apos;
        for (int32_t i = 0; i < p->n_pad; i++)
            D->apos[i] = i < p->n_tokens ? p->seq_len[p->seq[i]] - 1 : p->pos[i];
        ap = &D->aplan;
    }
    ops->plan_set(be, p);
    // the block's tokens: the anchor, then the mask token
    ops->get_rows(be, D->tok_embd ? D->tok_embd : m->tok_embd, n, s->x);
    for (int il = 0; il < d->n_layer; il++) {
        const model_layer *L = &D->layers[il];
        // attention over the context's and the block's K/V, on the rms-normed stream; residual
        ops->rms_norm(be, s->x, L->attn_norm, n, E, D->rms_eps, s->xb);
        ops->matmul_multi(be, 3, (const be_tensor *[]){L->wq, L->wk, L->wv}, s->xb, n,
                          (be_tensor *[]){s->fq, s->fk, s->fv});
        ops->rms_norm(be, s->fq, L->q_norm, n * H, HD, D->rms_eps, s->fq);
        ops->rms_norm(be, s->fk, L->k_norm, n * HKV, HD, D->rms_eps, s->fk);
        ops->rope(be, s->fq, n, H, HD, d->n_rot, D->rope_base, BE_ROPE_NEOX);
        ops->rope(be, s->fk, n, HKV, HD, d->n_rot, D->rope_base, BE_ROPE_NEOX);
        ops->kv_store(be, dkv, il, s->fk, s->fv, n);
        be_attn_args aa = {
            .q = s->fq, .out = s->fatt, .n_tokens = n, .n_head = H, .n_head_kv = HKV, .head_dim = HD,
            .scale = 1.0f / sqrtf((float)HD), .window = 0, .kv = dkv, .layer = il,
        };
        if (ap != p) ops->plan_set(be, ap);
        ops->attention(be, &aa);
        if (ap != p) ops->plan_set(be, p);
        ops->matmul(be, L->wo, 0, s->fatt, n, s->xb2);
        ops->add(be, s->x, s->xb2, s->x, (size_t)n * (size_t)E);
        // swiglu ffn on the rms-normed stream; residual
        ops->rms_norm(be, s->x, L->ffn_norm, n, E, D->rms_eps, s->xb);
        ops->matmul_multi(be, 2, (const be_tensor *[]){L->w_gate, L->w_up}, s->xb, n, (be_tensor *[]){s->fhb, s->fhb2});
        ops->swiglu(be, s->fhb, s->fhb2, s->fhb, (size_t)n * (size_t)d->n_ff);
        ops->matmul(be, L->w_down, 0, s->fhb, n, s->xb2);
        ops->add(be, s->x, s->xb2, s->x, (size_t)n * (size_t)E);
    }
    if (p->n_out > 0) {
        // the wanted slots through the final norm and the output matrix (its own, else the target's)
        ops->gather_out(be, s->x, E, s->xb2);
        ops->rms_norm(be, s->xb2, D->out_norm, p->n_out, E, D->rms_eps, s->xb);
        ops->matmul(be, D->output ? D->output : m->output, 0, s->xb, p->n_out, s->logits);
        ops->fetch(be, s->logits, p->n_out, (const void **)&m->logits_host);
    }
    return ops->sync(be, err);
}
