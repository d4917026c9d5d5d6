/* model_forward.c: the forward pass, one loop over layers for every supported
 * architecture (the differences are a few optional steps), over a step's
 * plan: a ragged batch of tokens from several sequences. This is the hot
 * path: a readable sequence of backend ops on backend tensors, nothing else. */
#include <math.h>
#include <string.h>

#include "model_int.h"

/* The forward of one planned step (n rows: the plan's tokens, or its padded
 * rows on a backend that replays graphs). */
static void forward(model *m, kv_cache *kv, const step_plan *p, const uint32_t *const *masks) {
    const model_hparams *hp = &m->hp;
    const be_ops *ops = m->be->ops;
    be_backend *be = m->be;
    model_scratch *s = &m->s;
    const int n = be->pads ? p->n_pad : p->n_tokens;
    const int E = hp->n_embd, H = hp->n_head, HKV = hp->n_head_kv, HD = hp->head_dim;
    const int NQ = H * HD, NKV = HKV * HD;

    // token embeddings into the residual stream
    ops->get_rows(be, m->tok_embd, n, s->x);

    for (int il = 0; il < hp->n_layer; il++) {
        const model_layer *L = &m->layers[il];

        // attention rms-norm
        ops->rms_norm(be, s->x, L->attn_norm, n, E, hp->rms_eps, s->xb);
        // q, k, v projections (+ biases: qwen2)
        ops->matmul_multi(be, 3, (const be_tensor *[]){L->wq, L->wk, L->wv}, s->xb, n,
                          (be_tensor *[]){s->q, s->k, s->v});
        if (L->bq) ops->add_bias(be, s->q, L->bq, n, NQ);
        if (L->bk) ops->add_bias(be, s->k, L->bk, n, NKV);
        if (L->bv) ops->add_bias(be, s->v, L->bv, n, NKV);
        // per-head rms-norm of q and k (qwen3)
        if (L->q_norm) ops->rms_norm(be, s->q, L->q_norm, n * H, HD, hp->rms_eps, s->q);
        if (L->k_norm) ops->rms_norm(be, s->k, L->k_norm, n * HKV, HD, hp->rms_eps, s->k);
        // rotary position embedding of q and k
        ops->rope(be, s->q, n, H, HD, hp->n_rot, hp->rope_base, hp->rope_mode);
        ops->rope(be, s->k, n, HKV, HD, hp->n_rot, hp->rope_base, hp->rope_mode);
        // k and v into the KV pool at each token's slot
        ops->kv_store(be, kv, il, s->k, s->v, n);
        // causal attention of each token over its own sequence's cache
        be_attn_args aa = {
            .q = s->q, .out = s->att, .n_tokens = n, .n_head = H, .n_head_kv = HKV, .head_dim = HD,
            .scale = 1.0f / sqrtf((float)HD), .window = hp->sliding_window, .kv = kv, .layer = il,
        };
        ops->attention(be, &aa);
        // output projection, residual
        ops->matmul(be, L->wo, 0, s->att, n, s->xb2);
        ops->add(be, s->x, s->xb2, s->x, (size_t)n * (size_t)E);

        // ffn rms-norm
        ops->rms_norm(be, s->x, L->ffn_norm, n, E, hp->rms_eps, s->xb);
        if (hp->n_expert > 0) {
            const int K = hp->n_expert_used, FE = hp->n_ff_exp;
            // router: softmax over experts, top-k, weights renormalised
            ops->matmul(be, L->gate_inp, 0, s->xb, n, s->router);
            ops->moe_route(be, s->router, n, hp->n_expert, K, s->exp_ids, s->exp_w);
            // each routed expert's swiglu ffn
            ops->moe_matmul(be, L->gate_exps, s->xb, true, n, K, s->exp_ids, s->hb);
            ops->moe_matmul(be, L->up_exps, s->xb, true, n, K, s->exp_ids, s->hb2);
            ops->swiglu(be, s->hb, s->hb2, s->hb, (size_t)n * (size_t)K * (size_t)FE);
            ops->moe_matmul(be, L->down_exps, s->hb, false, n, K, s->exp_ids, s->moe_out);
            // weighted sum of the experts' outputs
            ops->moe_combine(be, s->moe_out, s->exp_w, n, K, E, s->xb2);
        } else {
            // swiglu ffn: down(silu(gate(x)) * up(x))
            ops->matmul_multi(be, 2, (const be_tensor *[]){L->w_gate, L->w_up}, s->xb, n, (be_tensor *[]){s->hb, s->hb2});
            ops->swiglu(be, s->hb, s->hb2, s->hb, (size_t)n * (size_t)hp->n_ff);
            ops->matmul(be, L->w_down, 0, s->hb, n, s->xb2);
        }
        // residual
        ops->add(be, s->x, s->xb2, s->x, (size_t)n * (size_t)E);
    }

    if (p->n_out == 0) return;
    // the rows that want logits, the final rms-norm and the output projection
    ops->gather_out(be, s->x, E, s->xb2);
    ops->rms_norm(be, s->xb2, m->output_norm, p->n_out, E, hp->rms_eps, s->xb);
    ops->matmul(be, m->output, 0, s->xb, p->n_out, s->logits);
    // constraints: each masked row's disallowed tokens to -inf
    for (int i = 0; masks && i < p->n_out; i++)
        if (masks[i]) ops->mask_logits(be, s->logits, i, masks[i], hp->n_vocab);
    ops->fetch(be, s->logits, p->n_out, (const void **)&m->logits_host);
}

hn_status model_step(model *m, kv_cache *kv, const step_plan *p, const uint32_t *const *masks, hn_err *err) {
    const model_hparams *hp = &m->hp;
    if (kv->cfg.n_layer != hp->n_layer || kv->cfg.n_head_kv != hp->n_head_kv || kv->cfg.head_dim != hp->head_dim)
        return hn_errf(err, HN_ERR_INVALID, "forward: the KV cache was made for another model shape");
    if (p->n_tokens > m->params.max_batch || p->n_pad > m->params.max_batch || p->n_out > m->params.max_logits)
        return hn_errf(err, HN_ERR_INVALID, "forward: a step of %d tokens (%d padded) and %d logits rows; the model takes %d and %d",
                       (int)p->n_tokens, (int)p->n_pad, (int)p->n_out, m->params.max_batch, m->params.max_logits);
    m->logits_host = NULL;
    if (p->n_tokens == 0) return HN_OK;
    m->be->ops->plan_set(m->be, p);
    forward(m, kv, p, masks);
    return m->be->ops->sync(m->be, err);
}

const float *model_logits(const model *m) { return m->logits_host; }
int32_t model_max_batch(const model *m) { return m->params.max_batch; }
int32_t model_max_logits(const model *m) { return m->params.max_logits; }

