/* cuda_ops.cu: the cuda backend's compute ops (backend.h is the contract;
 * cuda_state.cuh the state): each op records its arguments when the step
 * is being recorded (a decode step: cuda_backend.cu replays it as a graph)
 * or queues its kernels; rec_exec runs one record, rec_run a step's records
 * with fusion (one kernel where consecutive records can be one). Matmuls
 * choose per row between the prefill kernels (hc_mmf) and the decode ones
 * (hc_gemv, hc_mmq): DESIGN.md, "backend/ cuda". */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend.h"
#include "cuda_state.cuh"

/* ---- compute ---- */

static void op_get_rows(be_backend *b, const be_tensor *w, int n, be_tensor *out) {
    cu_be *cb = cu_of(b);
    if (cu_rec *r = rec_push(cb, R_GET_ROWS)) {
        r->u.g.w = w, r->u.g.i0 = n, r->u.g.y = out;
        return;
    }
    if (!need_plan(cb, "get_rows") || !rows_ok(cb, "get_rows", n)) return;
    cm_w c = cm_of(w, true);
    if (!c.planes && !cm_raw_supports(c.type)) {
        cu_errf(cb, HN_ERR_UNSUPPORTED, "cuda backend: get_rows: no device decoder for %s", qt_name(c.type));
        return;
    }
    cu_cuda(cb, cm_get_rows(cb->stream, &c, n, cb->d_token, F(out)), "get_rows");
}

/* x for a dequantizing matmul over w: rounded as the CPU's integer dots
 * round it (the reference mode takes it as it is); NULL after an error */
static const float *act_rounded(cu_be *cb, const be_tensor *w, const be_tensor *x, int rows, const char *op) {
    if (cb->ref || !cm_act_rounds(w->type)) return F(x);
    const size_t need = (size_t)rows * (size_t)w->ne[0];
    if (need > cb->xr_cap) {
        cu_errf(cb, HN_ERR_RANGE, "cuda backend: %s: %d rows of %lld over the limits reserved", op, rows,
                (long long)w->ne[0]);
        return NULL;
    }
    cudaError_t e = cm_act_round(cb->stream, w->type, F(x), w->ne[0], rows, cb->xr);
    if (e != cudaSuccess) {
        cu_cuda(cb, e, op);
        return NULL;
    }
    return cb->xr;
}

/* whether the hc_gemv kernels take this call */
static bool gemv_path(const cu_be *cb, const be_tensor *w, int n) {
    const cu_tensor *t = (const cu_tensor *)w;
    if (!t->has_hw || w->ne[2] != 1 || n < 1) return false;
    if (cb->ref) return true; /* hc_gemv_ref, 8 rows at a time */
    /* more rows: hc_mmq (uses_mmq), or 8 at a time, so that a row's result
     * does not depend on the batch it came in (decode and prefill give the
     * same bits: hc_mmq's outputs are hc_gemv's) */
    return w->type == QT_F16 || w->type == QT_BF16 || w->ne[0] <= cb->gs.max_k;
}

/* whether an expert stack's products take hc_gemv_slots (every slot, and
 * every row of a matmul of one of its matrices, a one-row gemv's bits) */
static bool slots_path(const cu_be *cb, const be_tensor *w) {
    const cu_tensor *t = (const cu_tensor *)w;
    return !cb->ref && cb->slots && t->has_hw && w->ne[2] > 1 && hc_gemv_slots_supports(w->type) &&
           w->ne[0] <= cb->gs.max_k;
}

/* an expert stack's slots on hc_gemv_slots (its contract: cuda.h) */
static void gemv_slots(cu_be *cb, const be_tensor *w, const float *x, int slots, int ks, const int32_t *ids, int mat,
                       float *y, int reuse_x, const char *op) {
    const cu_tensor *t = (const cu_tensor *)w;
    hn_err e;
    hn_status st =
        hc_gemv_slots(&t->hw, w->ne[1], (int)w->ne[2], x, slots, ks, ids, mat, y, &cb->gs, reuse_x, cb->stream, &e);
    if (st) cu_hn(cb, st, &e, op);
}

/* whether a gemv-path matmul of n rows takes hc_mmq (all n rows in one call) */
static bool uses_mmq(const cu_be *cb, const be_tensor *w, int n) {
    return !cb->ref && n >= HC_MMQ_MIN_ROWS && n <= cb->gs.max_rows && hc_mmq_supports(w->type);
}

/* the prefill-row flags of a matmul of n rows: the plan's rows (n_rows) or
 * its logits rows (n_out); NULL when none of them is a prefill row or the
 * weight has no hc_mmf kernel (then every row takes the exact path) */
static const uint8_t *mm_prefill(const cu_be *cb, const be_tensor *w, int n, int *kind) {
    const cu_tensor *t = (const cu_tensor *)w;
    *kind = 0;
    if (!cb->mmf || cb->ref || !cb->have_plan || !t->has_hw || w->ne[2] != 1 || n > cb->gs.max_rows ||
        !hc_mmf_takes(&t->hw))
        return NULL;
    if (n == cb->n_rows && cb->pf_rows_kind) {
        *kind = cb->pf_rows_kind;
        return cb->pf_row;
    }
    if (n == cb->n_out && cb->pf_out_kind) {
        *kind = cb->pf_out_kind;
        return cb->pf_out;
    }
    return NULL;
}

static void matmul_exact(cu_be *cb, const be_tensor *w, const float *x, int n, float *y, int reuse_x);

/* rows of prefill rows take hc_mmf, the others the exact path, run by run
 * (a run's x is converted on its own: reuse_x only when one run is all) */
static void matmul_pf(cu_be *cb, const be_tensor *w, const float *x, int n, float *y, const uint8_t *pf, int reuse_x) {
    const cu_tensor *t = (const cu_tensor *)w;
    const int64_t K = w->ne[0], N = w->ne[1];
    for (int r = 0; r < n;) {
        int e = r + 1;
        while (e < n && pf[e] == pf[r]) e++;
        const int reuse = r == 0 && e == n ? reuse_x : 0;
        if (pf[r]) {
            hn_err err;
            hn_status st = hc_mmf(&t->hw, x + (size_t)r * (size_t)K, e - r, y + (size_t)r * (size_t)N, &cb->gs, reuse,
                                  cb->stream, &err);
            if (st) {
                cu_hn(cb, st, &err, "matmul");
                return;
            }
            cb->mmf_calls++;
        } else {
            matmul_exact(cb, w, x + (size_t)r * (size_t)K, e - r, y + (size_t)r * (size_t)N, reuse);
        }
        r = e;
    }
}

static void matmul1(cu_be *cb, const be_tensor *w, int mat, const be_tensor *x, int n, be_tensor *y, int reuse_x) {
    if (n <= 0) return;
    if (mat < 0 || mat >= w->ne[2]) {
        cu_errf(cb, HN_ERR_RANGE, "cuda backend: matmul of matrix %d of %lld", mat, (long long)w->ne[2]);
        return;
    }
    int kind;
    if (const uint8_t *pf = mm_prefill(cb, w, n, &kind)) {
        matmul_pf(cb, w, F(x), n, F(y), pf, reuse_x);
        return;
    }
    if (slots_path(cb, w)) { /* a matrix of an expert stack: each row a slot of moe_matmul's kernel */
        gemv_slots(cb, w, F(x), n, 0, NULL, mat, F(y), 0, "matmul");
        return;
    }
    if (gemv_path(cb, w, n)) {
        matmul_exact(cb, w, F(x), n, F(y), reuse_x);
        return;
    }
    cm_w c = cm_of(w, false);
    if (!c.planes && !cm_raw_supports(c.type)) {
        cu_errf(cb, HN_ERR_UNSUPPORTED, "cuda backend: matmul: no device decoder for %s", qt_name(c.type));
        return;
    }
    const float *xin = act_rounded(cb, w, x, n, "matmul");
    if (xin) cu_cuda(cb, cm_matmul_tile(cb->stream, &c, mat, xin, n, F(y), cb->ref, cb->mmreg), "matmul");
}

/* the gemv path's rows, each with a one-token decode step's bits */
static void matmul_exact(cu_be *cb, const be_tensor *w, const float *X, int n, float *Y, int reuse_x) {
    const cu_tensor *t = (const cu_tensor *)w;
    hn_err e;
    if (cb->ref) {
        for (int r = 0; r < n; r += HC_GEMV_MAX_ROWS) {
            const int na = n - r < HC_GEMV_MAX_ROWS ? n - r : HC_GEMV_MAX_ROWS;
            hn_status st = hc_gemv_ref(&t->hw, X + (size_t)r * (size_t)w->ne[0], na,
                                       Y + (size_t)r * (size_t)w->ne[1], cb->stream, &e);
            if (st) {
                cu_hn(cb, st, &e, "matmul");
                return;
            }
        }
        return;
    }
    if (uses_mmq(cb, w, n)) {
        hc_gemv_params p = {0, reuse_x, 0, 0};
        hn_status st = hc_mmq(&t->hw, X, n, Y, &cb->gs, &p, cb->stream, &e);
        if (st) cu_hn(cb, st, &e, "matmul");
        return;
    }
    for (int r = 0; r < n; r += HC_GEMV_MAX_ROWS) {
        const int na = n - r < HC_GEMV_MAX_ROWS ? n - r : HC_GEMV_MAX_ROWS;
        const hc_gemv_params p = cu_mm_params(cb, w, na, reuse_x && n <= HC_GEMV_MAX_ROWS);
        hn_status st = hc_gemv(&t->hw, X + (size_t)r * (size_t)w->ne[0], na, Y + (size_t)r * (size_t)w->ne[1],
                               &cb->gs, &p, cb->stream, &e);
        if (st) {
            cu_hn(cb, st, &e, "matmul");
            return;
        }
    }
}

static void op_matmul(be_backend *b, const be_tensor *w, int mat, const be_tensor *x, int n, be_tensor *y) {
    cu_be *cb = cu_of(b);
    if (cu_rec *r = rec_push(cb, R_MATMUL)) {
        r->u.g.w = w, r->u.g.i0 = mat, r->u.g.x = x, r->u.g.i1 = n, r->u.g.y = y;
        return;
    }
    matmul1(cb, w, mat, x, n, y, 0);
}

/* weights sharing x convert it once: the scratch holds all n rows of x
 * quantized for row length qk and activation type qa (qk 0: it does not;
 * a fused producer may have left it there: rec_run) */
static void matmul_multi_q(cu_be *cb, int n_w, const be_tensor *const *ws, const be_tensor *x, int n,
                           be_tensor *const *ys, int64_t qk, hc_act qa) {
    if (n_w < 0 || n_w > BE_MULTI_MAX) {
        cu_errf(cb, HN_ERR_RANGE, "cuda backend: matmul_multi of %d weights", n_w);
        return;
    }
    bool pf_any = false;
    for (int i = 0; i < n_w; i++) {
        int kind;
        pf_any |= mm_prefill(cb, ws[i], n, &kind) != NULL;
    }
    if (!cb->ref && n >= 1 && n <= HC_GEMV_MAX_ROWS && !pf_any) {
        /* decode: runs of weights of one integer type and row length in one
         * launch each, with the first weight's parameters (untuned: the
         * built-in ones, which must then agree) */
        for (int i = 0; i < n_w;) {
            const hc_weight *hw[BE_MULTI_MAX];
            float *yy[BE_MULTI_MAX];
            const hc_gemv_params p0 = cu_mm_params(cb, ws[i], n, 0);
            int j = i;
            for (; j < n_w && j - i < 3; j++) {
                if (!gemv_path(cb, ws[j], n) || ws[j]->ne[2] != 1) break;
                hw[j - i] = &((const cu_tensor *)ws[j])->hw;
                yy[j - i] = F(ys[j]);
                if (!hc_gemv_multi_ok(j - i + 1, hw, n, &p0)) break;
            }
            if (j - i < 2) { /* alone */
                const be_tensor *w = ws[i];
                const hc_act a = hc_gemv_act(w->type);
                const bool quantizes = gemv_path(cb, w, n) && (a == HC_ACT_Q8_0 || a == HC_ACT_Q8_K);
                matmul1(cb, w, 0, x, n, ys[i], quantizes && qk == w->ne[0] && qa == a);
                if (quantizes) {
                    qk = w->ne[0];
                    qa = a;
                }
                i++;
                continue;
            }
            const hc_act a = hc_gemv_act(ws[i]->type);
            hn_err e;
            hc_gemv_params p = p0;
            p.reuse_x = qk == ws[i]->ne[0] && qa == a;
            hn_status st = hc_gemv_multi(j - i, hw, F(x), n, yy, &cb->gs, &p, cb->stream, &e);
            if (st) {
                cu_hn(cb, st, &e, "matmul_multi");
                return;
            }
            qk = ws[i]->ne[0];
            qa = a;
            i = j;
        }
        return;
    }
    for (int i = 0; i < n_w; i++) {
        const be_tensor *w = ws[i];
        const hc_act a = hc_gemv_act(w->type);
        const bool quantizes = !cb->ref && gemv_path(cb, w, n) && (a == HC_ACT_Q8_0 || a == HC_ACT_Q8_K);
        /* hc_gemv 8 rows at a time leaves only the last 8 in the scratch, and
         * a step of prefill and other rows converts run by run; hc_mmq and
         * hc_mmf on all rows leave all of them */
        int kind;
        const bool pf = mm_prefill(cb, w, n, &kind) != NULL;
        const bool holds_all =
            quantizes && (pf ? kind == 1 : n <= HC_GEMV_MAX_ROWS || uses_mmq(cb, w, n));
        matmul1(cb, w, 0, x, n, ys[i], holds_all && qk == w->ne[0] && qa == a);
        if (quantizes) {
            qk = holds_all ? w->ne[0] : 0;
            qa = a;
        }
    }
}

static void op_matmul_multi(be_backend *b, int n_w, const be_tensor *const *ws, const be_tensor *x, int n,
                            be_tensor *const *ys) {
    cu_be *cb = cu_of(b);
    if (n_w >= 0 && n_w <= BE_MULTI_MAX)
        if (cu_rec *r = rec_push(cb, R_MULTI)) {
            r->u.multi.n_w = n_w, r->u.multi.n = n, r->u.multi.x = x;
            for (int i = 0; i < n_w; i++) r->u.multi.ws[i] = ws[i], r->u.multi.ys[i] = ys[i];
            return;
        }
    matmul_multi_q(cb, n_w, ws, x, n, ys, 0, HC_ACT_F32);
}

static void op_rms_norm(be_backend *b, const be_tensor *x, const be_tensor *w, int n, int dim, float eps,
                        be_tensor *y) {
    cu_be *cb = cu_of(b);
    if (cu_rec *r = rec_push(cb, R_RMS_NORM)) {
        r->u.g.x = x, r->u.g.w = w, r->u.g.i0 = n, r->u.g.i1 = dim, r->u.g.f0 = eps, r->u.g.y = y;
        return;
    }
    cu_cuda(cb, ck_rms_norm(cb->stream, F(x), w ? F(w) : NULL, n, dim, eps, F(y), cb->rtc), "rms_norm");
}

static void op_rope(be_backend *b, be_tensor *x, int n, int n_head, int head_dim, int n_rot, float freq_base,
                    be_rope_mode mode) {
    cu_be *cb = cu_of(b);
    if (cu_rec *r = rec_push(cb, R_ROPE)) {
        r->u.g.y = x, r->u.g.i0 = n, r->u.g.i1 = n_head, r->u.g.i2 = head_dim, r->u.g.i3 = n_rot;
        r->u.g.f0 = freq_base, r->u.g.i4 = (int)mode;
        return;
    }
    if (!need_plan(cb, "rope") || !rows_ok(cb, "rope", n)) return;
    if (n_rot < 0 || n_rot > head_dim) {
        cu_errf(cb, HN_ERR_INVALID, "cuda backend: rope of %d dims of %d", n_rot, head_dim);
        return;
    }
    /* as the CPU computes it, on the host's powf */
    const float theta_scale = powf(freq_base, -2.0f / (float)n_rot);
    cu_cuda(cb, ck_rope(cb->stream, F(x), n, n_head, head_dim, n_rot, theta_scale, mode == BE_ROPE_NEOX, cb->d_pos),
            "rope");
}

static void op_add(be_backend *b, const be_tensor *a, const be_tensor *bb, be_tensor *y, size_t n) {
    cu_be *cb = cu_of(b);
    if (cu_rec *r = rec_push(cb, R_ADD)) {
        r->u.g.x = a, r->u.g.w = bb, r->u.g.y = y, r->u.g.z0 = n;
        return;
    }
    cu_cuda(cb, ck_add(cb->stream, F(a), F(bb), F(y), n), "add");
}

static void op_add_bias(be_backend *b, be_tensor *x, const be_tensor *bias, int n, int dim) {
    cu_be *cb = cu_of(b);
    if (cu_rec *r = rec_push(cb, R_ADD_BIAS)) {
        r->u.g.y = x, r->u.g.w = bias, r->u.g.i0 = n, r->u.g.i1 = dim;
        return;
    }
    cu_cuda(cb, ck_add_bias(cb->stream, F(x), F(bias), n, dim), "add_bias");
}

static void op_swiglu(be_backend *b, const be_tensor *gate, const be_tensor *up, be_tensor *y, size_t n) {
    cu_be *cb = cu_of(b);
    if (cu_rec *r = rec_push(cb, R_SWIGLU)) {
        r->u.g.x = gate, r->u.g.w = up, r->u.g.y = y, r->u.g.z0 = n;
        return;
    }
    cu_cuda(cb, ck_swiglu(cb->stream, F(gate), F(up), F(y), n), "swiglu");
}

static void op_kv_store(be_backend *b, kv_cache *kv, int layer, const be_tensor *k, const be_tensor *v, int n) {
    cu_be *cb = cu_of(b);
    if (cu_rec *r = rec_push(cb, R_KV_STORE)) {
        r->u.g.kv = kv, r->u.g.i0 = layer, r->u.g.x = k, r->u.g.w = v, r->u.g.i1 = n;
        return;
    }
    ck_kv g;
    if (!need_plan(cb, "kv_store") || !rows_ok(cb, "kv_store", n) || !kv_geo(cb, kv, "kv_store", &g)) return;
    if (layer < 0 || layer >= kv->cfg.n_layer) {
        cu_errf(cb, HN_ERR_RANGE, "cuda backend: kv_store: layer %d of %d", layer, kv->cfg.n_layer);
        return;
    }
    cu_cuda(cb, ck_kv_store(cb->stream, &g, layer, F(k), F(v), n, cb->d_slot), "kv_store");
}

static void op_attention(be_backend *b, const be_attn_args *a) {
    cu_be *cb = cu_of(b);
    if (cu_rec *r = rec_push(cb, R_ATTENTION)) {
        /* field by field: the caller's padding bytes would defeat the records' comparison */
        be_attn_args *c = &r->u.attn;
        c->q = a->q, c->out = a->out, c->n_tokens = a->n_tokens, c->n_head = a->n_head, c->n_head_kv = a->n_head_kv;
        c->head_dim = a->head_dim, c->scale = a->scale, c->window = a->window, c->kv = a->kv, c->layer = a->layer;
        return;
    }
    ck_kv g;
    if (!need_plan(cb, "attention") || !rows_ok(cb, "attention", a->n_tokens) || !kv_geo(cb, a->kv, "attention", &g))
        return;
    if (a->layer < 0 || a->layer >= a->kv->cfg.n_layer || a->n_head_kv != a->kv->cfg.n_head_kv ||
        a->head_dim != a->kv->cfg.head_dim || a->n_head_kv < 1 || a->n_head % a->n_head_kv) {
        cu_errf(cb, HN_ERR_INVALID, "cuda backend: attention: heads or layer do not match the cache");
        return;
    }
    /* the plan's prefill tiles on the tensor cores where the layer allows, the other rows as before */
    const bool fa = cb->n_fa_tiles > 0 && a->n_tokens == cb->n_tokens &&
                    ck_fattn_ok(a->n_head, a->n_head_kv, a->head_dim, &g);
    if (fa) {
        cb->fattn_calls++;
        cu_cuda(cb,
                ck_fattn(cb->stream, F(a->q), F(a->out), cb->d_fa_tiles, cb->n_fa_tiles, a->n_head, a->n_head_kv,
                         a->head_dim, a->scale, a->window, &g, a->layer, cb->d_pos, cb->d_seq, cb->d_bt,
                         cb->bt_stride),
                "attention (flash)");
    }
    /* the other rows: on the tensor cores too (ck_fattn_dec) where the split form takes them, but not
     * in the reference mode */
    const int n_rest = fa ? cb->n_fa_rest : a->n_tokens;
    if (n_rest > 0 && cb->att_split && !cb->ref && ck_fattn_dec_ok(a->n_head, a->n_head_kv, a->head_dim, &g))
        cb->fdec_calls++;
    cu_cuda(cb,
            ck_attention(cb->stream, F(a->q), F(a->out), n_rest, a->n_head, a->n_head_kv, a->head_dim, a->scale,
                         a->window, &g, a->layer, cb->d_pos, cb->d_seq, cb->d_bt, cb->bt_stride,
                         fa ? cb->d_fa_rest : NULL, cb->att_split ? cb->att_part : NULL, cb->att_part_cap, !cb->ref,
                         cb->combine2),
            "attention");
}

static void op_moe_route(be_backend *b, const be_tensor *logits, int n, int n_expert, int k, be_tensor *ids,
                         be_tensor *weights) {
    cu_be *cb = cu_of(b);
    if (cu_rec *r = rec_push(cb, R_MOE_ROUTE)) {
        r->u.g.x = logits, r->u.g.i0 = n, r->u.g.i1 = n_expert, r->u.g.i2 = k, r->u.g.y = ids, r->u.g.y2 = weights;
        return;
    }
    if (n_expert < 1 || k < 1 || k > n_expert || n_expert > 4096) {
        cu_errf(cb, HN_ERR_INVALID, "cuda backend: moe_route: top %d of %d experts", k, n_expert);
        return;
    }
    cu_cuda(cb, ck_moe_route(cb->stream, F(logits), n, n_expert, k, (int32_t *)ids->data, F(weights)), "moe_route");
}

/* the prefill-row flags of a moe_matmul of n tokens (the plan's rows), as
 * mm_prefill: NULL when no token is a prefill row or the stack has no
 * hc_mmf_slots kernel */
static const uint8_t *moe_prefill(const cu_be *cb, const be_tensor *w, int n, int k) {
    const cu_tensor *t = (const cu_tensor *)w;
    if (!cb->mmf || cb->ref || !cb->have_plan || !cb->slot_work || n != cb->n_rows || !cb->pf_rows_kind ||
        (int64_t)n * k > cb->gs.max_rows || w->ne[2] > cb->lim.max_experts ||
        hc_mmf_slots_work(n * k, (int)w->ne[2]) > cb->slot_work_cap || !hc_mmf_slots_takes(&t->hw, w->ne[1], (int)w->ne[2]))
        return NULL;
    return cb->pf_row;
}

/* moe_matmul on hc_gemv_slots, its tokens of prefill rows on hc_mmf_slots
 * run by run (moe_prefill); reuse_x: the records' look-ahead found the call
 * before quantizing the same x (rec_fuse; kept only when one gemv run is all) */
static void moe_slots(cu_be *cb, const be_tensor *w, const be_tensor *x, bool x_shared, int n, int k,
                      const be_tensor *ids, be_tensor *y, int reuse_x) {
    const int32_t *id = (const int32_t *)ids->data;
    const uint8_t *pf = moe_prefill(cb, w, n, k);
    if (!pf) {
        gemv_slots(cb, w, F(x), n * k, x_shared ? k : 0, id, 0, F(y), reuse_x, "moe_matmul");
        return;
    }
    const cu_tensor *t = (const cu_tensor *)w;
    const int64_t K = w->ne[0], NR = w->ne[1];
    for (int r = 0; r < n;) {
        int e = r + 1;
        while (e < n && pf[e] == pf[r]) e++;
        const float *xs = F(x) + (size_t)(x_shared ? r : r * k) * (size_t)K;
        float *ys = F(y) + (size_t)r * (size_t)k * (size_t)NR;
        if (pf[r]) {
            hn_err err;
            hn_status st = hc_mmf_slots(&t->hw, NR, (int)w->ne[2], xs, (e - r) * k, x_shared ? k : 0, id + (size_t)r * k, ys,
                                        &cb->gs, cb->slot_work, cb->slot_work_cap, cb->stream, &err);
            if (st) {
                cu_hn(cb, st, &err, "moe_matmul");
                return;
            }
            cb->mmf_calls++;
        } else {
            gemv_slots(cb, w, xs, (e - r) * k, x_shared ? k : 0, id + (size_t)r * k, 0, ys, 0, "moe_matmul");
        }
        r = e;
    }
}

static void op_moe_matmul(be_backend *b, const be_tensor *w, const be_tensor *x, bool x_shared, int n, int k,
                          const be_tensor *ids, be_tensor *y) {
    cu_be *cb = cu_of(b);
    if (cu_rec *r = rec_push(cb, R_MOE_MATMUL)) {
        r->u.g.w = w, r->u.g.x = x, r->u.g.i0 = x_shared, r->u.g.i1 = n, r->u.g.i2 = k, r->u.g.w2 = ids, r->u.g.y = y;
        return;
    }
    if (slots_path(cb, w)) {
        moe_slots(cb, w, x, x_shared, n, k, ids, y, 0);
        return;
    }
    cm_w c = cm_of(w, false);
    if (!c.planes && !cm_raw_supports(c.type)) {
        cu_errf(cb, HN_ERR_UNSUPPORTED, "cuda backend: moe_matmul: no device decoder for %s", qt_name(c.type));
        return;
    }
    const float *xin = act_rounded(cb, w, x, x_shared ? n : n * k, "moe_matmul");
    if (xin)
        cu_cuda(cb, cm_matmul_slots(cb->stream, &c, xin, x_shared, n, k, (const int32_t *)ids->data, F(y), cb->ref),
                "moe_matmul");
}

static void op_moe_combine(be_backend *b, const be_tensor *y, const be_tensor *w, int n, int k, int dim,
                           be_tensor *out) {
    cu_be *cb = cu_of(b);
    if (cu_rec *r = rec_push(cb, R_MOE_COMBINE)) {
        r->u.g.x = y, r->u.g.w = w, r->u.g.i0 = n, r->u.g.i1 = k, r->u.g.i2 = dim, r->u.g.y = out;
        return;
    }
    cu_cuda(cb, ck_moe_combine(cb->stream, F(y), F(w), n, k, dim, F(out)), "moe_combine");
}

static void op_gather_out(be_backend *b, const be_tensor *x, int dim, be_tensor *out) {
    cu_be *cb = cu_of(b);
    if (cu_rec *r = rec_push(cb, R_GATHER_OUT)) {
        r->u.g.x = x, r->u.g.i0 = dim, r->u.g.y = out;
        return;
    }
    if (!need_plan(cb, "gather_out")) return;
    cu_cuda(cb, ck_gather_out(cb->stream, F(x), dim, cb->n_out, cb->d_out_rows, F(out)), "gather_out");
}

static void op_mask_logits(be_backend *b, be_tensor *logits, int row, const uint32_t *allowed, int64_t n_vocab) {
    cu_be *cb = cu_of(b);
    if (n_vocab <= 0) return;
    const size_t words = (size_t)((n_vocab + 31) / 32);
    if (words > cb->mask_cap - cb->mask_used) {
        rec_flush_direct(cb); /* the buffers must change: this step goes on without a graph */
        /* earlier masks of this step are still to be read: wait, then reuse or grow */
        cu_cuda(cb, cudaStreamSynchronize(cb->stream), "mask_logits");
        cb->mask_used = 0;
        if (words > cb->mask_cap) {
            cudaFree(cb->d_mask);
            if (cb->h_mask) cudaFreeHost(cb->h_mask);
            cb->d_mask = NULL;
            cb->h_mask = NULL;
            cb->mask_cap = 0;
            const size_t cap = 4 * words;
            cudaError_t e = cudaMalloc((void **)&cb->d_mask, cap * 4);
            if (e == cudaSuccess) e = cudaMallocHost((void **)&cb->h_mask, cap * 4);
            if (e != cudaSuccess) {
                cudaFree(cb->d_mask);
                cb->d_mask = NULL;
                cb->h_mask = NULL;
                cu_cuda(cb, e, "mask_logits: allocating the mask buffer");
                return;
            }
            cb->mask_cap = cap;
        }
    }
    uint32_t *m = cb->d_mask + cb->mask_used;
    if (cu_rec *r = rec_push(cb, R_MASK)) {
        /* the bits are staged in pinned memory now; the graph copies them from there */
        memcpy(cb->h_mask + cb->mask_used * 4, allowed, words * 4);
        r->u.mem.t = logits, r->u.mem.row = row, r->u.mem.n_vocab = n_vocab, r->u.mem.off = cb->mask_used;
        cb->mask_used += (words + 63) & ~(size_t)63;
        return;
    }
    cu_cuda(cb, cudaMemcpyAsync(m, allowed, words * 4, cudaMemcpyHostToDevice, cb->stream), "mask_logits");
    cu_cuda(cb, ck_mask_logits(cb->stream, F(logits) + (size_t)row * (size_t)n_vocab, m, n_vocab), "mask_logits");
    cb->mask_used += (words + 63) & ~(size_t)63;
}

/* ---- version 5: hybrid (recurrent) layers ---- */

static void op_copy_cols(be_backend *b, const be_tensor *x, int x_ld, int x_off, int n, int nc, be_tensor *y, int y_ld,
                         int y_off) {
    cu_be *cb = cu_of(b);
    if (cu_rec *r = rec_push(cb, R_COPY_COLS)) {
        r->u.g.x = x, r->u.g.i0 = x_ld, r->u.g.i1 = x_off, r->u.g.i2 = n, r->u.g.i3 = nc, r->u.g.y = y;
        r->u.g.i4 = y_ld, r->u.g.z0 = (size_t)y_off;
        return;
    }
    if (n < 0 || nc < 0 || x_off < 0 || y_off < 0 || x_off + nc > x_ld || y_off + nc > y_ld) {
        cu_errf(cb, HN_ERR_INVALID, "cuda backend: copy_cols: columns [%d, %d) of rows of %d / %d", x_off, x_off + nc,
                x_ld, y_ld);
        return;
    }
    cu_cuda(cb, ck_copy_cols(cb->stream, F(x), x_ld, x_off, n, nc, F(y), y_ld, y_off), "copy_cols");
}

static void op_sigmoid_mul(be_backend *b, const be_tensor *x, const be_tensor *g, int n, int dim, int g_dim,
                           be_tensor *y) {
    cu_be *cb = cu_of(b);
    if (cu_rec *r = rec_push(cb, R_SIGMOID_MUL)) {
        r->u.g.x = x, r->u.g.w = g, r->u.g.i0 = n, r->u.g.i1 = dim, r->u.g.i2 = g_dim, r->u.g.y = y;
        return;
    }
    cu_cuda(cb, ck_sigmoid_mul(cb->stream, F(x), F(g), n, dim, g_dim, F(y)), "sigmoid_mul");
}

static void op_l2_norm(be_backend *b, const be_tensor *x, int n, int dim, float eps, be_tensor *y) {
    cu_be *cb = cu_of(b);
    if (cu_rec *r = rec_push(cb, R_L2_NORM)) {
        r->u.g.x = x, r->u.g.i0 = n, r->u.g.i1 = dim, r->u.g.f0 = eps, r->u.g.y = y;
        return;
    }
    cu_cuda(cb, ck_l2_norm(cb->stream, F(x), n, dim, eps, F(y)), "l2_norm");
}

static void op_rope_multi(be_backend *b, be_tensor *x, int n, int n_head, int head_dim, int n_rot, float freq_base,
                          const int32_t sections[4]) {
    cu_be *cb = cu_of(b);
    if (cu_rec *r = rec_push(cb, R_ROPE_MULTI)) {
        r->u.rope_multi.x = x, r->u.rope_multi.n = n, r->u.rope_multi.n_head = n_head;
        r->u.rope_multi.head_dim = head_dim, r->u.rope_multi.n_rot = n_rot, r->u.rope_multi.freq_base = freq_base;
        memcpy(r->u.rope_multi.sections, sections, sizeof r->u.rope_multi.sections);
        return;
    }
    if (!need_plan(cb, "rope_multi") || !rows_ok(cb, "rope_multi", n)) return;
    if (n_rot < 0 || n_rot > head_dim) {
        cu_errf(cb, HN_ERR_INVALID, "cuda backend: rope_multi of %d dims of %d", n_rot, head_dim);
        return;
    }
    const float theta_scale = powf(freq_base, -2.0f / (float)n_rot);
    cu_cuda(cb, ck_rope_multi(cb->stream, F(x), n, n_head, head_dim, n_rot, theta_scale, sections, cb->d_pos),
            "rope_multi");
}

/* the layer's recurrent state in this backend's storage, every sequence of the plan holding a slot */
static bool state_geo(cu_be *cb, const kv_cache *kv, size_t off, size_t bytes, const char *op, ck_state *st) {
    if (!kv || kv->storage != &cb->storage || !kv->state_slot_bytes || !range_of(cb, kv->state_base) ||
        off + bytes > kv->cfg.state_bytes) {
        cu_errf(cb, HN_ERR_INVALID, "cuda backend: %s: bad arguments or no recurrent state in this backend's cache", op);
        return false;
    }
    for (int32_t s = 0; s < cb->n_seqs; s++)
        if (cb->h_state_slot[s] < 0 || cb->h_state_slot[s] >= kv->n_state_slots) {
            cu_errf(cb, HN_ERR_INVALID, "cuda backend: %s: a sequence has no recurrent-state slot", op);
            return false;
        }
    for (int32_t t = 0; t < cb->n_rows; t++)
        if (cb->h_state_snap[t] < -1 || cb->h_state_snap[t] >= kv->n_state_slots) {
            cu_errf(cb, HN_ERR_INVALID, "cuda backend: %s: a state snapshot slot out of range", op);
            return false;
        }
    st->base = (unsigned char *)kv->state_base;
    st->slot_bytes = kv->state_slot_bytes;
    st->off = off;
    return true;
}

static void op_ssm_conv(be_backend *b, const be_tensor *x, const be_tensor *w, int n, int channels, int kernel,
                        const kv_cache *kv, size_t state_off, be_tensor *y) {
    cu_be *cb = cu_of(b);
    if (cu_rec *r = rec_push(cb, R_SSM_CONV)) {
        r->u.g.x = x, r->u.g.w = w, r->u.g.i0 = n, r->u.g.i1 = channels, r->u.g.i2 = kernel, r->u.g.kv = kv;
        r->u.g.z0 = state_off, r->u.g.y = y;
        return;
    }
    if (!need_plan(cb, "ssm_conv") || !rows_ok(cb, "ssm_conv", n)) return;
    if (kernel < 1 || channels < 1 || w->type != QT_F32 || w->ne[0] != kernel || w->ne[1] != channels) {
        cu_errf(cb, HN_ERR_INVALID, "cuda backend: ssm_conv: bad arguments");
        return;
    }
    ck_state st;
    if (!state_geo(cb, kv, state_off, sizeof(float) * (size_t)(kernel - 1) * (size_t)channels, "ssm_conv", &st)) return;
    cu_cuda(cb, ck_ssm_conv(cb->stream, F(x), F(w), n, channels, kernel, &st, cb->d_pos, cb->d_seq, cb->d_slot,
                            cb->d_state_slot, cb->d_state_snap, F(y)),
            "ssm_conv");
}

static void op_delta_net(be_backend *b, const be_delta_args *a) {
    cu_be *cb = cu_of(b);
    if (cu_rec *r = rec_push(cb, R_DELTA_NET)) {
        be_delta_args *c = &r->u.delta;
        c->q = a->q, c->k = a->k, c->v = a->v, c->alpha = a->alpha, c->beta = a->beta, c->dt_bias = a->dt_bias;
        c->a = a->a, c->out = a->out, c->n_tokens = a->n_tokens, c->n_k_heads = a->n_k_heads;
        c->n_v_heads = a->n_v_heads, c->head_dim = a->head_dim, c->kv = a->kv, c->state_off = a->state_off;
        return;
    }
    if (!need_plan(cb, "delta_net") || !rows_ok(cb, "delta_net", a->n_tokens)) return;
    if (a->n_k_heads < 1 || a->n_v_heads < 1 || a->head_dim < 1) {
        cu_errf(cb, HN_ERR_INVALID, "cuda backend: delta_net: bad arguments");
        return;
    }
    if (a->head_dim > ck_delta_max_dim()) {
        cu_errf(cb, HN_ERR_UNSUPPORTED, "cuda backend: delta_net: head dim %d over the %d its kernel takes",
                a->head_dim, ck_delta_max_dim());
        return;
    }
    ck_state st;
    const size_t need = sizeof(float) * (size_t)a->n_v_heads * (size_t)a->head_dim * (size_t)a->head_dim;
    if (!state_geo(cb, a->kv, a->state_off, need, "delta_net", &st)) return;
    ck_delta d = {F(a->q), F(a->k), F(a->v), F(a->alpha), F(a->beta), F(a->dt_bias), F(a->a), F(a->out),
                  a->n_tokens, a->n_k_heads, a->n_v_heads, a->head_dim};
    cu_cuda(cb, ck_delta_net(cb->stream, &d, &st, cb->n_seqs, cb->d_pos, cb->d_seq, cb->d_slot, cb->d_state_slot,
                             cb->d_state_snap),
            "delta_net");
}

static void op_state_copy(be_backend *b, const kv_cache *kv, int n, const int32_t *src, const int32_t *dst) {
    cu_be *cb = cu_of(b);
    if (n > REC_IDS_MAX) rec_flush_direct(cb);
    if (n >= 0)
        if (cu_rec *r = rec_push(cb, R_STATE_COPY)) {
            r->u.copy.kv = kv, r->u.copy.n = n;
            memcpy(r->u.copy.src, src, sizeof(int32_t) * (size_t)n);
            memcpy(r->u.copy.dst, dst, sizeof(int32_t) * (size_t)n);
            return;
        }
    for (int i = 0; i < n; i++) {
        if (!kv || kv->storage != &cb->storage || !kv->state_slot_bytes || src[i] < 0 || dst[i] < 0 ||
            src[i] >= kv->n_state_slots || dst[i] >= kv->n_state_slots) {
            cu_errf(cb, HN_ERR_INVALID, "cuda backend: state_copy: bad slot");
            return;
        }
        if (src[i] == dst[i]) continue;
        cu_cuda(cb,
                cudaMemcpyAsync(kv_state_ptr(kv, dst[i]), kv_state_ptr(kv, src[i]), kv->cfg.state_bytes,
                                cudaMemcpyDeviceToDevice, cb->stream),
                "state_copy");
    }
}

/* runs one record directly (its op's own code, which queues the kernels) */
static void rec_exec(cu_be *cb, const cu_rec *r) {
    be_backend *b = &cb->base;
    const auto &g = r->u.g;
    be_tensor *y = (be_tensor *)g.y;
    switch (r->kind) {
    case R_HEADER: break;
    case R_GET_ROWS: op_get_rows(b, g.w, g.i0, y); break;
    case R_MATMUL: matmul1(cb, g.w, g.i0, g.x, g.i1, y, 0); break;
    case R_MULTI: matmul_multi_q(cb, r->u.multi.n_w, r->u.multi.ws, r->u.multi.x, r->u.multi.n,
                                 (be_tensor *const *)r->u.multi.ys, 0, HC_ACT_F32); break;
    case R_RMS_NORM: op_rms_norm(b, g.x, g.w, g.i0, g.i1, g.f0, y); break;
    case R_ROPE: op_rope(b, y, g.i0, g.i1, g.i2, g.i3, g.f0, (be_rope_mode)g.i4); break;
    case R_ADD: op_add(b, g.x, g.w, y, g.z0); break;
    case R_ADD_BIAS: op_add_bias(b, y, g.w, g.i0, g.i1); break;
    case R_SWIGLU: op_swiglu(b, g.x, g.w, y, g.z0); break;
    case R_KV_STORE: op_kv_store(b, (kv_cache *)g.kv, g.i0, g.x, g.w, g.i1); break;
    case R_ATTENTION: op_attention(b, &r->u.attn); break;
    case R_MOE_ROUTE: op_moe_route(b, g.x, g.i0, g.i1, g.i2, y, (be_tensor *)g.y2); break;
    case R_MOE_MATMUL: op_moe_matmul(b, g.w, g.x, g.i0 != 0, g.i1, g.i2, g.w2, y); break;
    case R_MOE_COMBINE: op_moe_combine(b, g.x, g.w, g.i0, g.i1, g.i2, y); break;
    case R_GATHER_OUT: op_gather_out(b, g.x, g.i0, y); break;
    case R_MASK: {
        const size_t words = (size_t)((r->u.mem.n_vocab + 31) / 32);
        uint32_t *m = cb->d_mask + r->u.mem.off;
        cu_cuda(cb, cudaMemcpyAsync(m, cb->h_mask + r->u.mem.off * 4, words * 4, cudaMemcpyHostToDevice, cb->stream),
                "mask_logits");
        cu_cuda(cb, ck_mask_logits(cb->stream, F(r->u.mem.t) + (size_t)r->u.mem.row * (size_t)r->u.mem.n_vocab, m,
                                   r->u.mem.n_vocab),
                "mask_logits");
        break;
    }
    case R_FETCH:
        if (r->u.mem.bytes)
            cu_cuda(cb, cudaMemcpyAsync(r->u.mem.dst, r->u.mem.src, r->u.mem.bytes, cudaMemcpyDeviceToHost, cb->stream),
                    "fetch");
        break;
    case R_COPY_COLS: op_copy_cols(b, g.x, g.i0, g.i1, g.i2, g.i3, y, g.i4, (int)g.z0); break;
    case R_SIGMOID_MUL: op_sigmoid_mul(b, g.x, g.w, g.i0, g.i1, g.i2, y); break;
    case R_L2_NORM: op_l2_norm(b, g.x, g.i0, g.i1, g.f0, y); break;
    case R_ROPE_MULTI:
        op_rope_multi(b, r->u.rope_multi.x, r->u.rope_multi.n, r->u.rope_multi.n_head, r->u.rope_multi.head_dim,
                      r->u.rope_multi.n_rot, r->u.rope_multi.freq_base, r->u.rope_multi.sections);
        break;
    case R_SSM_CONV: op_ssm_conv(b, g.x, g.w, g.i0, g.i1, g.i2, g.kv, g.z0, y); break;
    case R_DELTA_NET: op_delta_net(b, &r->u.delta); break;
    case R_STATE_COPY: op_state_copy(b, r->u.copy.kv, r->u.copy.n, r->u.copy.src, r->u.copy.dst); break;
    default: cu_errf(cb, HN_ERR_INVALID, "cuda backend: a record of unknown kind %d", r->kind);
    }
}

/* ---- fusion: a decode step's records, run with a look ahead ----
 * Where records that follow each other can be one kernel, rec_run runs that
 * kernel instead (the records, and so the graphs' keys, are unchanged):
 *  - [add x += r,] rms_norm of x, then matmul(s) of the normed x that
 *    quantize it (Q8_0 / Q8_K): hc_norm_quant, and the matmuls reuse the x
 *    it quantized;
 *  - swiglu, then the matmul of its output: hc_swiglu_quant, likewise.
 * Each fused kernel gives the bits of the records it replaces (tested:
 * tests/test_model.c runs decode steps with HONE_CUDA_FUSE=0 and without and
 * compares the logits bit for bit). */

/* the activation type a matmul record quantizes its x for on the gemv path (HC_ACT_F32: it does not) */
static hc_act rec_quantizes(const cu_be *cb, const be_tensor *w, int n) {
    int kind;
    if (cb->ref || n < 1 || n > HC_GEMV_MAX_ROWS || !gemv_path(cb, w, n) || w->ne[2] != 1 ||
        mm_prefill(cb, w, n, &kind))
        return HC_ACT_F32; /* prefill rows: not fused (hc_mmf converts x itself) */
    const hc_act a = hc_gemv_act(w->type);
    return a == HC_ACT_Q8_0 || a == HC_ACT_Q8_K ? a : HC_ACT_F32;
}

/* the weight whose quantization of x a consumer record does first, and its row count; false if not a matmul of x */
static bool rec_consumer(const cu_rec *r, const be_tensor *x, const be_tensor **w, int *n) {
    if (r->kind == R_MATMUL && r->u.g.x == x && r->u.g.i0 == 0) {
        *w = r->u.g.w;
        *n = r->u.g.i1;
        return true;
    }
    if (r->kind == R_MULTI && r->u.multi.x == x && r->u.multi.n_w >= 1) {
        *w = r->u.multi.ws[0];
        *n = r->u.multi.n;
        return true;
    }
    return false;
}

/* runs the consumer record with x already quantized for (k, a) */
static void rec_consume(cu_be *cb, const cu_rec *r, int64_t k, hc_act a) {
    if (r->kind == R_MATMUL) {
        matmul1(cb, r->u.g.w, 0, r->u.g.x, r->u.g.i1, (be_tensor *)r->u.g.y, 1);
        return;
    }
    matmul_multi_q(cb, r->u.multi.n_w, r->u.multi.ws, r->u.multi.x, r->u.multi.n, (be_tensor *const *)r->u.multi.ys,
                   k, a);
}

/* how many records from r[0] one fused kernel ran (0: none) */
static int rec_fuse(cu_be *cb, const cu_rec *r, int left) {
    hn_err e;
    const be_tensor *w;
    int n;
    /* [add,] rms_norm, matmul */
    int at = 0;
    const cu_rec *add = NULL;
    if (r[0].kind == R_ADD && left >= 3 && r[0].u.g.y == r[0].u.g.x && r[1].kind == R_RMS_NORM &&
        r[1].u.g.x == r[0].u.g.y && r[0].u.g.z0 == (size_t)r[1].u.g.i0 * (size_t)r[1].u.g.i1 && r[1].u.g.y != r[1].u.g.x) {
        add = &r[0];
        at = 1;
    }
    if (left >= at + 2 && r[at].kind == R_RMS_NORM && r[at].u.g.y != r[at].u.g.x &&
        rec_consumer(&r[at + 1], r[at].u.g.y, &w, &n)) {
        const auto &g = r[at].u.g;
        const hc_act a = rec_quantizes(cb, w, n);
        if (a != HC_ACT_F32 && n == g.i0 && w->ne[0] == g.i1 && g.i1 <= HC_NORM_QUANT_MAX &&
            hc_quant_fusable(a, g.i1, n, &cb->gs)) {
            hn_status st = hc_norm_quant(F(g.x), add ? F(add->u.g.w) : NULL, g.w ? F(g.w) : NULL, n, g.i1, g.f0,
                                         F(g.y), a, &cb->gs, cb->stream, &e);
            if (st) {
                cu_hn(cb, st, &e, "rms_norm");
                return at + 2;
            }
            rec_consume(cb, &r[at + 1], g.i1, a);
            cb->fused++;
            return at + 2;
        }
    }
    /* [rms_norm q, rms_norm k,] rope q, rope k, kv_store */
    {
        const cu_rec *nq = NULL, *nk = NULL;
        int j = 0;
        if (left >= 5 && r[0].kind == R_RMS_NORM && r[1].kind == R_RMS_NORM && r[2].kind == R_ROPE) {
            nq = &r[0];
            nk = &r[1];
            j = 2;
        }
        if (left >= j + 3 && r[j].kind == R_ROPE && r[j + 1].kind == R_ROPE && r[j + 2].kind == R_KV_STORE) {
            const auto &rq = r[j].u.g, &rk = r[j + 1].u.g, &st = r[j + 2].u.g;
            const int nt = rq.i0, H = rq.i1, HKV = rk.i1, HD = rq.i2;
            bool ok = rk.i0 == nt && rk.i2 == HD && rk.i3 == rq.i3 && rk.f0 == rq.f0 && rk.i4 == rq.i4 &&
                      st.x == rk.y && st.i1 == nt && st.kv && st.i0 >= 0 && st.i0 < st.kv->cfg.n_layer &&
                      st.kv->cfg.n_head_kv == HKV && st.kv->cfg.head_dim == HD && cb->have_plan && nt >= 1 &&
                      nt <= cb->n_rows && st.w != st.x;
            if (ok && nq)
                ok = nq->u.g.x == rq.y && nq->u.g.y == rq.y && nq->u.g.i0 == nt * H && nq->u.g.i1 == HD &&
                     nk->u.g.x == rk.y && nk->u.g.y == rk.y && nk->u.g.i0 == nt * HKV && nk->u.g.i1 == HD &&
                     nq->u.g.w && nk->u.g.w;
            ck_kv g;
            if (ok && kv_geo(cb, st.kv, "kv_store", &g) && ck_qk_rope_store_ok(HD, rq.i3, &g)) {
                const float theta_scale = powf(rq.f0, -2.0f / (float)rq.i3);
                cu_cuda(cb,
                        ck_qk_rope_store(cb->stream, F(rq.y), F(rk.y), F(st.w), nq ? F(nq->u.g.w) : NULL,
                                         nk ? F(nk->u.g.w) : NULL, nt, H, HKV, HD, nq ? nq->u.g.f0 : 0.0f,
                                         nk ? nk->u.g.f0 : 0.0f, rq.i3, theta_scale, rq.i4 == (int)BE_ROPE_NEOX,
                                         cb->d_pos, &g, st.i0, cb->d_slot),
                        "kv_store");
                cb->fused++;
                return j + 3;
            }
        }
    }
    /* moe_matmul, moe_matmul of the same x (a MoE's gate and up): x quantized once; with
     * HONE_CUDA_SLOTS2=1, where both stacks are of one type and shape and on the gemv, one launch of
     * hc_gemv_slots2 for both [and the swiglu of the two] */
    if (left >= 2 && r[0].kind == R_MOE_MATMUL && r[1].kind == R_MOE_MATMUL) {
        const auto &a = r[0].u.g, &b2 = r[1].u.g;
        const int rows = a.i0 ? a.i1 : a.i1 * a.i2, nslots = a.i1 * a.i2;
        const bool pf_a = moe_prefill(cb, a.w, a.i1, a.i2) != NULL;
        if (b2.x == a.x && b2.i0 == a.i0 && b2.i1 == a.i1 && b2.i2 == a.i2 && b2.w2 == a.w2 && b2.x != a.y &&
            slots_path(cb, a.w) && slots_path(cb, b2.w) && a.w->ne[0] == b2.w->ne[0] &&
            hc_gemv_act(a.w->type) == hc_gemv_act(b2.w->type) && rows >= 1 && rows <= cb->gs.max_rows &&
            (a.i0 ? a.i2 : 1) * rows <= 65535 &&
            /* both on the gemv (the scratch then holds all of x) or both with prefill runs (reuse unused there) */
            pf_a == (moe_prefill(cb, b2.w, a.i1, a.i2) != NULL)) {
            if (cb->slots2 && !pf_a && a.w->type == b2.w->type && a.w->ne[1] == b2.w->ne[1] &&
                a.w->ne[2] == b2.w->ne[2]) {
                const int64_t nr = a.w->ne[1];
                float *h = NULL;
                int used = 2;
                if (left >= 3 && r[2].kind == R_SWIGLU) {
                    const auto &sw = r[2].u.g;
                    if (sw.x == a.y && sw.w == b2.y && sw.z0 == (size_t)nslots * (size_t)nr && sw.y != a.y &&
                        sw.y != b2.y)
                        h = F(sw.y), used = 3;
                }
                const cu_tensor *tg = (const cu_tensor *)a.w, *tu = (const cu_tensor *)b2.w;
                hn_status st = hc_gemv_slots2(&tg->hw, &tu->hw, nr, (int)a.w->ne[2], F(a.x), nslots, a.i0 ? a.i2 : 0,
                                              (const int32_t *)a.w2->data, F(a.y), F(b2.y), h, &cb->gs, 0, cb->stream,
                                              &e);
                if (st) cu_hn(cb, st, &e, "moe_matmul");
                cb->fused++;
                return used;
            }
            moe_slots(cb, a.w, a.x, a.i0 != 0, a.i1, a.i2, a.w2, (be_tensor *)a.y, 0);
            moe_slots(cb, b2.w, b2.x, b2.i0 != 0, b2.i1, b2.i2, b2.w2, (be_tensor *)b2.y, 1);
            cb->fused++;
            return 2;
        }
    }
    /* swiglu, matmul */
    if (left >= 2 && r[0].kind == R_SWIGLU && rec_consumer(&r[1], r[0].u.g.y, &w, &n)) {
        const auto &g = r[0].u.g;
        const hc_act a = rec_quantizes(cb, w, n);
        if (a != HC_ACT_F32 && g.z0 == (size_t)n * (size_t)w->ne[0] && hc_quant_fusable(a, w->ne[0], n, &cb->gs)) {
            hn_status st = hc_swiglu_quant(F(g.x), F(g.w), n, w->ne[0], F(g.y), a, &cb->gs, cb->stream, &e);
            if (st) {
                cu_hn(cb, st, &e, "swiglu");
                return 2;
            }
            rec_consume(cb, &r[1], w->ne[0], a);
            cb->fused++;
            return 2;
        }
    }
    return 0;
}

void rec_run(cu_be *cb, const cu_rec *r, int n) {
    for (int i = 0; i < n;) {
        const int k = cb->fuse && !cb->ref ? rec_fuse(cb, r + i, n - i) : 0;
        if (k) {
            i += k;
            continue;
        }
        rec_exec(cb, &r[i]);
        i++;
    }
}

/* version 5: every op, the hybrid family's included */

void cu_compute_ops(be_ops *o) {
    o->get_rows = op_get_rows;
    o->matmul = op_matmul;
    o->matmul_multi = op_matmul_multi;
    o->rms_norm = op_rms_norm;
    o->rope = op_rope;
    o->add = op_add;
    o->add_bias = op_add_bias;
    o->swiglu = op_swiglu;
    o->kv_store = op_kv_store;
    o->attention = op_attention;
    o->moe_route = op_moe_route;
    o->moe_matmul = op_moe_matmul;
    o->moe_combine = op_moe_combine;
    o->gather_out = op_gather_out;
    o->mask_logits = op_mask_logits;
    o->copy_cols = op_copy_cols;
    o->sigmoid_mul = op_sigmoid_mul;
    o->l2_norm = op_l2_norm;
    o->rope_multi = op_rope_multi;
    o->ssm_conv = op_ssm_conv;
    o->delta_net = op_delta_net;
    o->state_copy = op_state_copy;
}
