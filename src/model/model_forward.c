/* model_forward.c: the forward pass, one loop over layers for every supported
 * architecture (the differences are a few optional steps), over a ragged batch
 * of tokens from several sequences. This is the hot path: it only calls
 * backend ops on preallocated scratch. */
#include <math.h>
#include <string.h>

#include "model_int.h"

/* Checks the batch and takes the KV blocks it needs. A sequence's positions
 * may not skip ahead of what is filled (its n_tokens, plus the tokens before
 * in this batch). */
static hn_status check_batch(model *m, kv_cache *kv, const model_batch *b, int32_t logits_cap, hn_err *err) {
    const model_hparams *hp = &m->hp;
    if (b->n_tokens < 0 || (b->n_tokens > 0 && (!b->token || !b->pos || !b->seq_id || !b->seqs)))
        return hn_errf(err, HN_ERR_INVALID, "forward: incomplete batch");
    if (b->n_seqs < 1 || b->n_seqs > m->params.max_seqs)
        return hn_errf(err, HN_ERR_INVALID, "forward: %d sequences in a batch (at most %d)", (int)b->n_seqs,
                       m->params.max_seqs);
    if (kv->cfg.n_layer != hp->n_layer || kv->cfg.n_head_kv != hp->n_head_kv || kv->cfg.head_dim != hp->head_dim)
        return hn_errf(err, HN_ERR_INVALID, "forward: the KV cache was made for another model shape");
    int32_t *fill = m->s.seq_fill;
    for (int32_t s = 0; s < b->n_seqs; s++) fill[s] = b->seqs[s] ? b->seqs[s]->n_tokens : 0;
    int32_t n_out = 0;
    for (int32_t i = 0; i < b->n_tokens; i++) {
        int32_t sid = b->seq_id[i], tok = b->token[i], pos = b->pos[i];
        if (sid < 0 || sid >= b->n_seqs || !b->seqs[sid])
            return hn_errf(err, HN_ERR_INVALID, "forward: token %d names sequence %d of %d", (int)i, (int)sid,
                           (int)b->n_seqs);
        if (tok < 0 || tok >= hp->n_vocab)
            return hn_errf(err, HN_ERR_INVALID, "forward: token id %d out of range (vocabulary %d)", (int)tok,
                           (int)hp->n_vocab);
        if (pos < 0 || pos > fill[sid])
            return hn_errf(err, HN_ERR_INVALID, "forward: token %d at position %d, but sequence %d holds %d positions",
                           (int)i, (int)pos, (int)sid, (int)fill[sid]);
        if (pos == fill[sid]) fill[sid]++;
        if (!b->want_logits ? i == b->n_tokens - 1 : b->want_logits[i]) n_out++;
    }
    if (n_out > logits_cap)
        return hn_errf(err, HN_ERR_INVALID, "forward: %d logits rows wanted, room for %d", (int)n_out, (int)logits_cap);
    for (int32_t s = 0; s < b->n_seqs; s++) {
        if (!b->seqs[s]) continue;
        hn_status st = kv_seq_reserve(kv, b->seqs[s], fill[s], err);
        if (st) return st;
    }
    return HN_OK;
}

/* out[r] = sum_s w[r*k+s] * y[r*k+s]: the routed experts' outputs, weighted */
static void moe_combine(const float *y, const float *w, int n, int k, int dim, float *out) {
    for (int r = 0; r < n; r++) {
        float *o = out + (size_t)r * (size_t)dim;
        memset(o, 0, sizeof(float) * (size_t)dim);
        for (int s = 0; s < k; s++) {
            const float *ys = y + ((size_t)r * (size_t)k + (size_t)s) * (size_t)dim;
            float ws = w[r * k + s];
            for (int i = 0; i < dim; i++) o[i] += ws * ys[i];
        }
    }
}

/* One step of at most max_batch tokens: tokens [t0, t0+n) of the batch. */
static void forward_step(model *m, kv_cache *kv, const model_batch *b, int32_t t0, int n, float *logits,
                         int32_t *n_logits) {
    const model_hparams *hp = &m->hp;
    const be_ops *ops = m->be->ops;
    be_backend *be = m->be;
    model_scratch *s = &m->s;
    const int E = hp->n_embd, H = hp->n_head, HKV = hp->n_head_kv, HD = hp->head_dim;
    const int NQ = H * HD, NKV = HKV * HD;
    const int32_t *tok = b->token + t0, *pos = b->pos + t0;
    for (int i = 0; i < n; i++) s->tok_seq[i] = b->seqs[b->seq_id[t0 + i]];

    // token embeddings into the residual stream
    ops->get_rows(be, &m->tok_embd, tok, n, s->x);

    for (int il = 0; il < hp->n_layer; il++) {
        const model_layer *L = &m->layers[il];

        // attention rms-norm
        ops->rms_norm(be, s->x, L->attn_norm, n, E, hp->rms_eps, s->xb);
        // q, k, v projections (+ biases: qwen2)
        ops->matmul_multi(be, 3, (const be_weight *[]){&L->wq, &L->wk, &L->wv}, s->xb, n,
                          (float *[]){s->q, s->k, s->v});
        if (L->bq) ops->add_bias(be, s->q, L->bq, n, NQ);
        if (L->bk) ops->add_bias(be, s->k, L->bk, n, NKV);
        if (L->bv) ops->add_bias(be, s->v, L->bv, n, NKV);
        // per-head rms-norm of q and k (qwen3)
        if (L->q_norm) ops->rms_norm(be, s->q, L->q_norm, n * H, HD, hp->rms_eps, s->q);
        if (L->k_norm) ops->rms_norm(be, s->k, L->k_norm, n * HKV, HD, hp->rms_eps, s->k);
        // rotary position embedding of q and k
        ops->rope(be, s->q, n, H, HD, hp->n_rot, pos, hp->rope_base, hp->rope_mode);
        ops->rope(be, s->k, n, HKV, HD, hp->n_rot, pos, hp->rope_base, hp->rope_mode);
        // k and v into each token's sequence blocks
        ops->kv_store(be, kv, il, n, s->k, s->v, pos, s->tok_seq);
        // causal attention of each token over its own sequence's cache
        be_attn_args aa = {
            .q = s->q, .out = s->att, .n_tokens = n, .n_head = H, .n_head_kv = HKV, .head_dim = HD,
            .scale = 1.0f / sqrtf((float)HD), .window = hp->sliding_window, .kv = kv, .layer = il,
            .pos = pos, .seqs = s->tok_seq,
        };
        ops->attention(be, &aa);
        // output projection, residual
        ops->matmul(be, &L->wo, 0, s->att, n, s->xb2);
        ops->add(be, s->x, s->xb2, s->x, (size_t)n * (size_t)E);

        // ffn rms-norm
        ops->rms_norm(be, s->x, L->ffn_norm, n, E, hp->rms_eps, s->xb);
        if (hp->n_expert > 0) {
            const int K = hp->n_expert_used, FE = hp->n_ff_exp;
            // router: softmax over experts, top-k, weights renormalised
            ops->matmul(be, &L->gate_inp, 0, s->xb, n, s->router);
            ops->moe_route(be, s->router, n, hp->n_expert, K, s->exp_ids, s->exp_w);
            // each routed expert's swiglu ffn
            ops->moe_matmul(be, &L->gate_exps, s->xb, true, n, K, s->exp_ids, s->hb);
            ops->moe_matmul(be, &L->up_exps, s->xb, true, n, K, s->exp_ids, s->hb2);
            ops->swiglu(be, s->hb, s->hb2, s->hb, (size_t)n * (size_t)K * (size_t)FE);
            ops->moe_matmul(be, &L->down_exps, s->hb, false, n, K, s->exp_ids, s->moe_out);
            // weighted sum of the experts' outputs
            moe_combine(s->moe_out, s->exp_w, n, K, E, s->xb2);
        } else {
            // swiglu ffn: down(silu(gate(x)) * up(x))
            ops->matmul_multi(be, 2, (const be_weight *[]){&L->w_gate, &L->w_up}, s->xb, n, (float *[]){s->hb, s->hb2});
            ops->swiglu(be, s->hb, s->hb2, s->hb, (size_t)n * (size_t)hp->n_ff);
            ops->matmul(be, &L->w_down, 0, s->hb, n, s->xb2);
        }
        // residual
        ops->add(be, s->x, s->xb2, s->x, (size_t)n * (size_t)E);
    }

    // gather the rows that want logits
    int n_out = 0;
    for (int i = 0; i < n; i++) {
        int32_t gi = t0 + i;
        bool want = b->want_logits ? b->want_logits[gi] : gi == b->n_tokens - 1;
        if (!want) continue;
        if (n_out != i) memcpy(s->x + (size_t)n_out * (size_t)E, s->x + (size_t)i * (size_t)E, sizeof(float) * (size_t)E);
        n_out++;
    }
    if (n_out == 0) return;
    // final rms-norm and the output projection into the caller's logits
    ops->rms_norm(be, s->x, m->output_norm, n_out, E, hp->rms_eps, s->xb);
    ops->matmul(be, &m->output, 0, s->xb, n_out, logits + (size_t)*n_logits * (size_t)hp->n_vocab);
    *n_logits += n_out;
}

hn_status model_forward(model *m, kv_cache *kv, const model_batch *b, float *logits, int32_t logits_cap,
                        hn_err *err) {
    hn_status st = check_batch(m, kv, b, logits_cap, err);
    if (st) return st;
    int32_t n_logits = 0;
    for (int32_t t0 = 0; t0 < b->n_tokens; t0 += m->params.max_batch) {
        int n = b->n_tokens - t0 < m->params.max_batch ? b->n_tokens - t0 : m->params.max_batch;
        forward_step(m, kv, b, t0, n, logits, &n_logits);
    }
    for (int32_t i = 0; i < b->n_tokens; i++) {
        kv_seq *sq = b->seqs[b->seq_id[i]];
        if (b->pos[i] + 1 > sq->n_tokens) sq->n_tokens = b->pos[i] + 1;
    }
    return HN_OK;
}
