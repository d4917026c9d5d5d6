/* model_forward.c: the forward pass, one loop over layers for every supported
 * architecture (the differences are a few optional steps, and for the
 * hybrids the mixer: attention or delta-net, chosen per layer), over a step's
 * plan: a ragged batch of tokens from several sequences. This is the hot
 * path: a readable sequence of backend ops on backend tensors, nothing else. */
#include <math.h>
#include <string.h>

#include "../backend/comm.h"
#include "model_int.h"

/* Each mixer and FFN reads the normed input s->xb and leaves its output in s->xb2.
 *
 * Tensor parallel (model_params.n_ranks): every rank holds the whole
 * residual stream and runs the same sequence of ops on its share of each
 * layer: attention over its kv-head groups (q/k/v column-parallel, o
 * row-parallel), the FFN over its slice of the width (gate/up
 * column-parallel, down row-parallel), so each rank's xb2 is a partial sum
 * of the sub-block's output; `reduce` sums them over the ranks (an
 * all-reduce) before the residual add, and the logits are each rank's
 * vocabulary slice, gathered. With one rank, rank 0 is the model and
 * nothing is reduced. */

/* Causal attention (llama, qwen2, qwen3) on rank k, over its heads: q/k/v,
 * biases, QK-norm, rope, the KV store (kv: the rank's shard), attention,
 * its part of the output projection. */
static void attention(model *m, const model_rank *k, kv_cache *kv, const model_layer *L, int layer, int n) {
    const model_hparams *hp = &m->hp;
    const be_ops *ops = k->be->ops;
    be_backend *be = k->be;
    model_scratch *s = k->s;
    const int H = m->rk_head, HKV = m->rk_head_kv, HD = hp->head_dim, NQ = H * HD, NKV = HKV * HD;
    // q, k, v projections (+ biases: qwen2)
    ops->matmul_multi(be, 3, (const be_tensor *[]){L->wq, L->wk, L->wv}, s->xb, n, (be_tensor *[]){s->q, s->k, s->v});
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
    ops->kv_store(be, kv, layer, s->k, s->v, n);
    // causal attention of each token over its own sequence's cache
    be_attn_args aa = {
        .q = s->q, .out = s->att, .n_tokens = n, .n_head = H, .n_head_kv = HKV, .head_dim = HD,
        .scale = 1.0f / sqrtf((float)HD), .window = hp->sliding_window, .kv = kv, .layer = layer,
    };
    ops->attention(be, &aa);
    // output projection
    ops->matmul(be, L->wo, 0, s->att, n, s->xb2);
}

/* Gated full attention (qwen35): q with a per-head output gate, QK-norm, multi-section rope. */
static void gated_attention(model *m, kv_cache *kv, const model_layer *L, int n) {
    const model_hparams *hp = &m->hp;
    const be_ops *ops = m->be->ops;
    be_backend *be = m->be;
    model_scratch *s = &m->s;
    const int H = hp->n_head, HKV = hp->n_head_kv, HD = hp->head_dim;
    // projections; per head, the q projection holds D queries then D gates
    ops->matmul_multi(be, 3, (const be_tensor *[]){L->wq, L->wk, L->wv}, s->xb, n, (be_tensor *[]){s->qg, s->k, s->v});
    ops->copy_cols(be, s->qg, 2 * HD, 0, n * H, HD, s->q, HD, 0);
    ops->copy_cols(be, s->qg, 2 * HD, HD, n * H, HD, s->gate, HD, 0);
    // per-head rms-norm of q and k, rope over the sections
    ops->rms_norm(be, s->q, L->q_norm, n * H, HD, hp->rms_eps, s->q);
    ops->rms_norm(be, s->k, L->k_norm, n * HKV, HD, hp->rms_eps, s->k);
    ops->rope_multi(be, s->q, n, H, HD, hp->n_rot, hp->rope_base, hp->rope_sections);
    ops->rope_multi(be, s->k, n, HKV, HD, hp->n_rot, hp->rope_base, hp->rope_sections);
    // the KV store and causal attention, as for the other archs
    ops->kv_store(be, kv, L->kv_layer, s->k, s->v, n);
    be_attn_args aa = {
        .q = s->q, .out = s->att, .n_tokens = n, .n_head = H, .n_head_kv = HKV, .head_dim = HD,
        .scale = 1.0f / sqrtf((float)HD), .window = 0, .kv = kv, .layer = L->kv_layer,
    };
    ops->attention(be, &aa);
    // the output gate, then the output projection
    ops->sigmoid_mul(be, s->att, s->gate, n, H * HD, H * HD, s->att);
    ops->matmul(be, L->wo, 0, s->att, n, s->xb2);
}

/* Gated DeltaNet (qwen35): a short causal conv and the gated delta rule over
 * each sequence's recurrent state, a gated rms-norm, the output projection. */
static void delta_net(model *m, kv_cache *kv, const model_layer *L, int n) {
    const model_hparams *hp = &m->hp;
    const be_ops *ops = m->be->ops;
    be_backend *be = m->be;
    model_scratch *s = &m->s;
    const int S = hp->ssm_state, NK = hp->ssm_k_heads * S, NV = hp->ssm_v_heads * S, C = 2 * NK + NV;
    // projections: q/k/v channels, the output gate z, the decay (alpha) and write strength (beta) logits
    ops->matmul_multi(be, 4, (const be_tensor *[]){L->wqkv, L->wz, L->w_alpha, L->w_beta}, s->xb, n,
                      (be_tensor *[]){s->u, s->z, s->ab, s->bb});
    // causal depthwise conv over the sequence's conv window, then silu
    ops->ssm_conv(be, s->u, L->conv1d, n, C, hp->ssm_conv, kv, L->conv_off, s->u);
    // split into q, k (Nk heads) and v (Nv heads); L2-normalise q and k per head
    ops->copy_cols(be, s->u, C, 0, n, NK, s->dq, NK, 0);
    ops->copy_cols(be, s->u, C, NK, n, NK, s->dk, NK, 0);
    ops->copy_cols(be, s->u, C, 2 * NK, n, NV, s->dv, NV, 0);
    ops->l2_norm(be, s->dq, n * hp->ssm_k_heads, S, hp->rms_eps, s->dq);
    ops->l2_norm(be, s->dk, n * hp->ssm_k_heads, S, hp->rms_eps, s->dk);
    // the gated delta rule over the sequence's delta state
    be_delta_args da = {
        .q = s->dq, .k = s->dk, .v = s->dv, .alpha = s->ab, .beta = s->bb, .dt_bias = L->dt_bias, .a = L->ssm_a,
        .out = s->dout, .n_tokens = n, .n_k_heads = hp->ssm_k_heads, .n_v_heads = hp->ssm_v_heads, .head_dim = S,
        .kv = kv, .state_off = L->delta_off,
    };
    ops->delta_net(be, &da);
    // per-head rms-norm (one weight vector for all heads), times silu(z)
    ops->rms_norm(be, s->dout, L->ssm_norm, n * hp->ssm_v_heads, S, hp->rms_eps, s->dout);
    ops->swiglu(be, s->z, s->dout, s->dout, (size_t)n * (size_t)NV);
    // output projection
    ops->matmul(be, L->ssm_out, 0, s->dout, n, s->xb2);
}

/* The routed experts on backend be, over its tensors t: each routed
 * expert's swiglu ffn of its rows, then their weighted sum into t->out. */
static void routed_experts(const model *m, be_backend *be, const model_layer *L, const model_moe_io *t, int n) {
    const be_ops *ops = be->ops;
    const int K = m->hp.n_expert_used, FE = m->hp.n_ff_exp, E = m->hp.n_embd;
    ops->moe_matmul(be, L->gate_exps, t->x, true, n, K, t->ids, t->hb);
    ops->moe_matmul(be, L->up_exps, t->x, true, n, K, t->ids, t->hb2);
    ops->swiglu(be, t->hb, t->hb2, t->hb, (size_t)n * (size_t)K * (size_t)FE);
    ops->moe_matmul(be, L->down_exps, t->hb, false, n, K, t->ids, t->y);
    ops->moe_combine(be, t->y, t->w, n, K, E, t->out);
}

/* Experts apart (cpu_moe), to the expert backend: the normed rows, the ids
 * and the weights side by side in moe_in (n E, n k, n k values), fetched in
 * one copy; the main backend's sync makes it readable (on a GPU it runs
 * what the step queued so far, and the ops queued after it run while the
 * expert backend computes). */
static hn_status experts_send(model *m, int n, hn_err *err) {
    const be_ops *ops = m->be->ops;
    be_backend *be = m->be;
    model_scratch *s = &m->s;
    const int E = m->hp.n_embd, K = m->hp.n_expert_used, W = n * (E + 2 * K);
    ops->copy_cols(be, s->xb, n * E, 0, 1, n * E, s->moe_in, W, 0);
    ops->copy_cols(be, s->exp_ids, n * K, 0, 1, n * K, s->moe_in, W, n * E);
    ops->copy_cols(be, s->exp_w, n * K, 0, 1, n * K, s->moe_in, W, n * (E + K));
    ops->fetch(be, s->moe_in, n, &m->moe_host);
    return ops->sync(be, err);
}

/* ... and back: the expert backend takes the fetched rows and routing,
 * computes the routed experts and their sum, which comes back (one copy)
 * into the main backend's xb2. */
static hn_status experts_receive(model *m, const model_layer *L, int n, hn_err *err) {
    be_backend *xb = m->xbe;
    const be_ops *xo = xb->ops;
    const int E = m->hp.n_embd, K = m->hp.n_expert_used;
    const float *h = m->moe_host;
    xo->upload(xb, m->xio.x, 0, h, sizeof(float) * (size_t)n * (size_t)E);
    xo->upload(xb, m->xio.ids, 0, h + (size_t)n * (size_t)E, sizeof(int32_t) * (size_t)n * (size_t)K);
    xo->upload(xb, m->xio.w, 0, h + (size_t)n * (size_t)(E + K), sizeof(float) * (size_t)n * (size_t)K);
    routed_experts(m, xb, L, &m->xio, n);
    const void *sum;
    xo->fetch(xb, m->xio.out, n, &sum);
    hn_status st = xo->sync(xb, err);
    if (!st) m->be->ops->upload(m->be, m->s.xb2, 0, sum, sizeof(float) * (size_t)n * (size_t)E);
    return st;
}

/* The FFN: swiglu, or routed experts plus an optional sigmoid-gated shared
 * expert. The routed experts run here, or (the layer's experts apart) on the
 * expert backend while the shared expert runs here. */
static hn_status ffn(model *m, const model_rank *k, const model_layer *L, int n, hn_err *err) {
    const model_hparams *hp = &m->hp;
    const be_ops *ops = k->be->ops;
    be_backend *be = k->be;
    model_scratch *s = k->s;
    const int E = hp->n_embd;
    hn_status st = HN_OK;
    if (hp->n_expert > 0) {
        // router: softmax over experts, top-k, weights renormalised
        ops->matmul(be, L->gate_inp, 0, s->xb, n, s->router);
        ops->moe_route(be, s->router, n, hp->n_expert, hp->n_expert_used, s->exp_ids, s->exp_w);
        // the routed experts' weighted sum into xb2, or their input and routing to the expert backend
        if (!L->moe_remote) routed_experts(m, be, L, &m->mio, n);
        else if ((st = experts_send(m, n, err))) return st;
        if (L->gate_sh) {
            // the shared expert, scaled by a per-token sigmoid gate
            ops->matmul_multi(be, 3, (const be_tensor *[]){L->gate_sh, L->up_sh, L->gate_inp_sh}, s->xb, n,
                              (be_tensor *[]){s->sh, s->sh2, s->shg});
            ops->swiglu(be, s->sh, s->sh2, s->sh, (size_t)n * (size_t)hp->n_ff_shexp);
            ops->matmul(be, L->down_sh, 0, s->sh, n, s->shout);
            ops->sigmoid_mul(be, s->shout, s->shg, n, E, 1, s->shout);
        }
        // experts apart: their weighted sum back into xb2
        if (L->moe_remote && (st = experts_receive(m, L, n, err))) return st;
        if (L->gate_sh) ops->add(be, s->xb2, s->shout, s->xb2, (size_t)n * (size_t)E);
    } else {
        // swiglu ffn: down(silu(gate(x)) * up(x)), over the rank's slice of the width
        ops->matmul_multi(be, 2, (const be_tensor *[]){L->w_gate, L->w_up}, s->xb, n, (be_tensor *[]){s->hb, s->hb2});
        ops->swiglu(be, s->hb, s->hb2, s->hb, (size_t)n * (size_t)m->rk_ff);
        ops->matmul(be, L->w_down, 0, s->hb, n, s->xb2);
    }
    return st;
}

/* DFlash: the residual stream entering layer il, for each tap of that layer, into its columns of the taps. */
static void keep_taps(model *m, int il, int n) {
    const model_dflash_info *d = &m->dfl->info;
    const int E = m->hp.n_embd;
    for (int k = 0; k < d->n_taps; k++)
        if (d->taps[k] == il) m->be->ops->copy_cols(m->be, m->s.x, E, 0, n, E, m->s.taps, d->n_taps * E, k * E);
}

/* Tensor parallel: the ranks' partial sub-block outputs (xb2, n rows)
 * summed over the ranks, on every rank. One rank: nothing to do. */
static hn_status reduce(model *m, int n, hn_err *err) {
    if (m->n_ranks == 1) return HN_OK;
    be_tensor *t[COMM_MAX_RANKS];
    for (int r = 0; r < m->n_ranks; r++) t[r] = m->rk[r].s->xb2;
    return comm_all_reduce_sum(m->comm, t, (size_t)n * (size_t)m->hp.n_embd, err);
}

/* Tensor parallel: the ranks' vocabulary slices of the logits (lgl, n_out
 * rows of V / R) gathered (lgg: rank-major), then laid side by side into
 * rank 0's logits rows (rank q's slice at columns q V / R ..). */
static hn_status gather_logits(model *m, int n_out, hn_err *err) {
    const int R = m->n_ranks, VR = m->rk_vocab;
    be_tensor *src[COMM_MAX_RANKS], *dst[COMM_MAX_RANKS];
    for (int r = 0; r < R; r++) src[r] = m->rk[r].s->lgl, dst[r] = m->rk[r].s->lgg;
    hn_status st = comm_all_gather(m->comm, src, (size_t)n_out * (size_t)VR, dst, err);
    if (st) return st;
    model_scratch *s = &m->s;
    for (int q = 0; q < R; q++) m->be->ops->copy_cols(m->be, s->lgg, VR, q * n_out * VR, n_out, VR, s->logits, R * VR, q * VR);
    return HN_OK;
}

/* The forward of one planned step (n rows: the plan's tokens, or its padded
 * rows on a backend that replays graphs), on every rank. Errors: the
 * mid-step syncs' of experts apart and of the ranks' collectives (the
 * step's own is the caller's). */
static hn_status forward(model *m, kv_cache *kv, const step_plan *p, const uint32_t *const *masks, hn_err *err) {
    const model_hparams *hp = &m->hp;
    const be_ops *ops = m->be->ops;
    be_backend *be = m->be;
    model_scratch *s = &m->s;
    const int n = be->pads ? p->n_pad : p->n_tokens;
    const int E = hp->n_embd, R = m->n_ranks;
    hn_status st;

    // token embeddings into the residual stream (whole on every rank)
    for (int r = 0; r < R; r++) m->rk[r].be->ops->get_rows(m->rk[r].be, m->rk[r].tok_embd, n, m->rk[r].s->x);

    // the MTP layers (the last n_nextn) are not part of the main forward
    for (int il = 0; il < hp->n_layer - hp->n_nextn; il++) {
        if (m->dfl) keep_taps(m, il, n); /* the DFlash drafter's taps: this layer's input */

        // mixer: attention, or (hybrids) gated attention / delta-net, on the rms-normed stream; each rank its heads
        for (int r = 0; r < R; r++) {
            const model_rank *k = &m->rk[r];
            const model_layer *L = &k->layers[il];
            k->be->ops->rms_norm(k->be, k->s->x, L->attn_norm, n, E, hp->rms_eps, k->s->xb);
            if (!hp->hybrid) attention(m, k, kv_shard(kv, r), L, il, n);
            else if (L->recurrent) delta_net(m, kv, L, n);
            else gated_attention(m, kv, L, n);
        }
        // the ranks' shares summed; residual
        if ((st = reduce(m, n, err))) return st;
        for (int r = 0; r < R; r++) m->rk[r].be->ops->add(m->rk[r].be, m->rk[r].s->x, m->rk[r].s->xb2, m->rk[r].s->x, (size_t)n * (size_t)E);

        // ffn on the rms-normed stream (the post-attention norm of the hybrids); each rank its slice
        for (int r = 0; r < R; r++) {
            const model_rank *k = &m->rk[r];
            const model_layer *L = &k->layers[il];
            k->be->ops->rms_norm(k->be, k->s->x, L->ffn_norm, n, E, hp->rms_eps, k->s->xb);
            if ((st = ffn(m, k, L, n, err))) return st;
        }
        // the ranks' shares summed; residual
        if ((st = reduce(m, n, err))) return st;
        for (int r = 0; r < R; r++) m->rk[r].be->ops->add(m->rk[r].be, m->rk[r].s->x, m->rk[r].s->xb2, m->rk[r].s->x, (size_t)n * (size_t)E);
    }

    if (m->dfl) keep_taps(m, hp->n_layer - hp->n_nextn, n); /* and the final residual */

    // MTP: every row's final hidden state, kept for the MTP layer (model_mtp_step)
    if (m->mtp) ops->rms_norm(be, s->x, m->output_norm, n, E, hp->rms_eps, s->hid);

    if (p->n_out == 0) return HN_OK;
    // the rows that want logits, the final rms-norm and the output projection: each rank its vocabulary slice
    for (int r = 0; r < R; r++) {
        const model_rank *k = &m->rk[r];
        const be_ops *o = k->be->ops;
        o->gather_out(k->be, k->s->x, E, k->s->xb2);
        o->rms_norm(k->be, k->s->xb2, k->output_norm, p->n_out, E, hp->rms_eps, k->s->xb);
        o->matmul(k->be, k->output, 0, k->s->xb, p->n_out, R > 1 ? k->s->lgl : k->s->logits);
    }
    if (R > 1 && (st = gather_logits(m, p->n_out, err))) return st;
    // constraints: each masked row's disallowed tokens to -inf
    for (int i = 0; masks && i < p->n_out; i++)
        if (masks[i]) ops->mask_logits(be, s->logits, i, masks[i], hp->n_vocab);
    ops->fetch(be, s->logits, p->n_out, (const void **)&m->logits_host);
    return HN_OK;
}

/* The MTP layer over a planned step of its own cache: its input is the
 * embedding of each row's token and the hidden row of the same index (a
 * main step's, or the previous MTP step's output states), its output the
 * wanted rows' logits, their states left in the hidden rows for a chained
 * step. */
static hn_status mtp_forward(model *m, kv_cache *mkv, const step_plan *p, hn_err *err) {
    const model_hparams *hp = &m->hp;
    const be_ops *ops = m->be->ops;
    be_backend *be = m->be;
    model_scratch *s = &m->s;
    const model_layer *L = m->mtp;
    const int n = be->pads ? p->n_pad : p->n_tokens;
    const int E = hp->n_embd;

    // [enorm(embed(token)) | hnorm(hidden)], projected back to the width: the block's residual stream
    ops->get_rows(be, L->nextn_embd ? L->nextn_embd : m->tok_embd, n, s->x);
    ops->rms_norm(be, s->x, L->nextn_enorm, n, E, hp->rms_eps, s->xb);
    ops->rms_norm(be, s->hid, L->nextn_hnorm, n, E, hp->rms_eps, s->xb2);
    ops->copy_cols(be, s->xb, E, 0, n, E, s->cat, 2 * E, 0);
    ops->copy_cols(be, s->xb2, E, 0, n, E, s->cat, 2 * E, E);
    ops->matmul(be, L->nextn_eh_proj, 0, s->cat, n, s->x);

    // one decoder block, as a main attention layer, over the MTP's own cache
    ops->rms_norm(be, s->x, L->attn_norm, n, E, hp->rms_eps, s->xb);
    gated_attention(m, mkv, L, n);
    ops->add(be, s->x, s->xb2, s->x, (size_t)n * (size_t)E);
    ops->rms_norm(be, s->x, L->ffn_norm, n, E, hp->rms_eps, s->xb);
    hn_status st = ffn(m, &m->rk[0], L, n, err);
    if (st) return st;
    ops->add(be, s->x, s->xb2, s->x, (size_t)n * (size_t)E);

    if (p->n_out == 0) return HN_OK;
    // the wanted rows through the shared head norm: their states (kept for a chained step), then the head
    ops->gather_out(be, s->x, E, s->xb2);
    ops->rms_norm(be, s->xb2, L->nextn_head_norm ? L->nextn_head_norm : m->output_norm, p->n_out, E, hp->rms_eps, s->xb);
    ops->copy_cols(be, s->xb, E, 0, p->n_out, E, s->hid, E, 0);
    ops->matmul(be, L->nextn_head ? L->nextn_head : m->output, 0, s->xb, p->n_out, s->logits);
    ops->fetch(be, s->logits, p->n_out, (const void **)&m->logits_host);
    return HN_OK;
}

/* Hybrids: every sequence has a state slot of this model's size, and its
 * tokens continue its state in order (or restart it at position 0). */
static hn_status check_recurrent(model *m, const kv_cache *kv, const step_plan *p, hn_err *err) {
    if (kv->state_slot_bytes < m->hp.state_bytes || kv->cfg.state_bytes != m->hp.state_bytes)
        return hn_errf(err, HN_ERR_INVALID, "forward: the KV cache holds no recurrent state for this model");
    if (p->n_seqs > m->params.max_seqs)
        return hn_errf(err, HN_ERR_INVALID, "forward: %d sequences in a step (at most %d)", (int)p->n_seqs,
                       m->params.max_seqs);
    for (int32_t si = 0; si < p->n_seqs; si++) {
        const kv_seq *q = p->seqs[si];
        if (p->state_slot[si] < 0 || p->state_slot[si] >= kv->n_state_slots)
            return hn_errf(err, HN_ERR_INVALID, "forward: sequence %d has no recurrent-state slot", (int)si);
        m->seq_next[si] = q ? q->state_len : 0;
    }
    for (int32_t i = 0; i < p->n_tokens; i++) {
        int32_t si = p->seq[i], pos = p->pos[i];
        if (pos != 0 && pos != m->seq_next[si])
            return hn_errf(err, HN_ERR_INVALID,
                           "forward: a recurrent sequence continues at position %d, not %d (its state is there)",
                           (int)m->seq_next[si], (int)pos);
        m->seq_next[si] = pos + 1;
        /* a snapshot goes to a slot of the cache that no sequence of the step lives in */
        int32_t snap = p->state_snap ? p->state_snap[i] : -1;
        if (snap < -1 || snap >= kv->n_state_slots)
            return hn_errf(err, HN_ERR_INVALID, "forward: token %d's state snapshot slot %d is not a slot", (int)i, (int)snap);
        for (int32_t sj = 0; snap >= 0 && sj < p->n_seqs; sj++)
            if (p->state_slot[sj] == snap)
                return hn_errf(err, HN_ERR_INVALID, "forward: token %d's state snapshot slot %d is sequence %d's state",
                               (int)i, (int)snap, (int)sj);
    }
    return HN_OK;
}

/* The step's plan to every rank's backend and, with experts apart, to the expert backend. */
static void set_plan(model *m, const step_plan *p) {
    for (int r = 0; r < m->n_ranks; r++) m->rk[r].be->ops->plan_set(m->rk[r].be, p);
    if (m->xbe) m->xbe->ops->plan_set(m->xbe, p);
}

/* The step's sync (every rank's; the first error). After a failed mid-step
 * sync (st) the rest of the forward was not queued: what was is waited
 * for, and st is the error. */
static hn_status finish(model *m, hn_status st, hn_err *err) {
    for (int r = 0; r < m->n_ranks; r++) {
        hn_err e;
        hn_status sr = m->rk[r].be->ops->sync(m->rk[r].be, &e);
        if (sr && !st) st = m->n_ranks > 1 ? hn_errf(err, sr, "rank %d: %s", r, e.msg) : hn_errf(err, sr, "%s", e.msg);
    }
    return st;
}

hn_status model_step(model *m, kv_cache *kv, const step_plan *p, const uint32_t *const *masks, hn_err *err) {
    const model_hparams *hp = &m->hp;
    if (kv->cfg.n_layer != (hp->hybrid ? hp->n_layer_attn : hp->n_layer) || kv->cfg.n_head_kv != hp->n_head_kv || kv->cfg.head_dim != hp->head_dim)
        return hn_errf(err, HN_ERR_INVALID, "forward: the KV cache was made for another model shape");
    if ((kv->cfg.n_shards > 1 ? kv->cfg.n_shards : 1) != m->n_ranks)
        return hn_errf(err, HN_ERR_INVALID, "forward: the KV cache has %d shards, the model %d tensor-parallel ranks (model_kv_config)",
                       kv->cfg.n_shards > 1 ? kv->cfg.n_shards : 1, m->n_ranks);
    if (p->n_tokens > m->params.max_batch || p->n_pad > m->params.max_batch || p->n_out > m->params.max_logits)
        return hn_errf(err, HN_ERR_INVALID, "forward: a step of %d tokens (%d padded) and %d logits rows; the model takes %d and %d",
                       (int)p->n_tokens, (int)p->n_pad, (int)p->n_out, m->params.max_batch, m->params.max_logits);
    m->logits_host = NULL;
    if (p->n_tokens == 0) return HN_OK;
    hn_status st;
    if (hp->hybrid && (st = check_recurrent(m, kv, p, err))) return st;
    /* scratch for this step's rows: grows only on a new high-water mark */
    int32_t rows = m->be->pads && p->n_pad > p->n_tokens ? p->n_pad : p->n_tokens;
    if ((st = model_scratch_need(m, rows, p->n_out, err))) return st;
    set_plan(m, p);
    st = forward(m, kv, p, masks, err);
    return finish(m, st, err);
}

hn_status model_mtp_step(model *m, kv_cache *mkv, const step_plan *p, const int32_t *hsel, int32_t n_hsel, hn_err *err) {
    const model_hparams *hp = &m->hp;
    if (!m->mtp) return hn_errf(err, HN_ERR_INVALID, "mtp: the model has no runnable MTP layer");
    if (mkv->cfg.n_layer != 1 || mkv->cfg.n_head_kv != hp->n_head_kv || mkv->cfg.head_dim != hp->head_dim)
        return hn_errf(err, HN_ERR_INVALID, "mtp: the KV cache was made for another shape");
    if (p->n_tokens > m->params.max_batch || p->n_pad > m->params.max_batch || p->n_out > m->params.max_logits)
        return hn_errf(err, HN_ERR_INVALID, "mtp: a step of %d tokens (%d padded) and %d logits rows; the model takes %d and %d",
                       (int)p->n_tokens, (int)p->n_pad, (int)p->n_out, m->params.max_batch, m->params.max_logits);
    if (hsel && n_hsel != p->n_tokens)
        return hn_errf(err, HN_ERR_INVALID, "mtp: %d hidden rows selected for %d tokens", (int)n_hsel, (int)p->n_tokens);
    for (int32_t i = 0; hsel && i < n_hsel; i++)
        if (hsel[i] < i || hsel[i] >= m->sc_rows || (i > 0 && hsel[i] <= hsel[i - 1]))
            return hn_errf(err, HN_ERR_INVALID, "mtp: hidden row selection %d is %d (ascending, below %d)", (int)i,
                           (int)hsel[i], (int)m->sc_rows);
    m->logits_host = NULL;
    if (p->n_tokens == 0) return HN_OK;
    int32_t rows = m->be->pads && p->n_pad > p->n_tokens ? p->n_pad : p->n_tokens;
    hn_status st;
    if ((st = model_scratch_need(m, rows, p->n_out, err))) return st;
    if (hsel && n_hsel > 0 && hsel[n_hsel - 1] != n_hsel - 1) {
        /* the selection: a plan of no sequences whose wanted rows are the
         * selected ones, gathered in place (ascending: a row's source is
         * never an earlier destination) */
        step_plan *g = &m->hplan;
        g->n_tokens = g->n_pad = hsel[n_hsel - 1] + 1;
        g->n_seqs = 0;
        g->bt_stride = 0;
        g->block_size = p->block_size;
        g->n_out = n_hsel;
        memcpy(g->out_rows, hsel, sizeof(int32_t) * (size_t)n_hsel);
        m->be->ops->plan_set(m->be, g);
        m->be->ops->gather_out(m->be, m->s.hid, hp->n_embd, m->s.hid);
    }
    set_plan(m, p);
    st = mtp_forward(m, mkv, p, err);
    return finish(m, st, err);
}

const float *model_logits(const model *m) { return m->logits_host; }
int32_t model_max_batch(const model *m) { return m->params.max_batch; }
int32_t model_max_logits(const model *m) { return m->params.max_logits; }

