/* plan.c: building a step's plan from a ragged batch (see plan.h). */
#include "plan.h"

#include <string.h>

#include "../core/alloc.h"

int32_t plan_pad_size(int32_t n, int32_t cap) {
    int32_t p = 1;
    while (p < n) p *= 2;
    return p > cap ? (n > cap ? n : cap) : p;
}

hn_status plan_init(step_plan *p, int32_t max_tokens, int32_t max_seqs, int32_t max_blocks, hn_err *err) {
    memset(p, 0, sizeof *p);
    if (max_tokens < 1 || max_seqs < 1 || max_blocks < 1 || max_tokens > (1 << 24) || max_seqs > (1 << 20) ||
        (int64_t)max_seqs * max_blocks > (1 << 28))
        return hn_errf(err, HN_ERR_INVALID, "plan: bad capacity (%d tokens, %d sequences, %d blocks)", (int)max_tokens,
                       (int)max_seqs, (int)max_blocks);
    size_t T = (size_t)max_tokens, S = (size_t)max_seqs;
    p->token = hn_malloc(sizeof(int32_t) * T);
    p->pos = hn_malloc(sizeof(int32_t) * T);
    p->seq = hn_malloc(sizeof(int32_t) * T);
    p->slot = hn_malloc(sizeof(int32_t) * T);
    p->out_rows = hn_malloc(sizeof(int32_t) * T);
    p->seq_len = hn_malloc(sizeof(int32_t) * S);
    p->block_table = hn_malloc(sizeof(int32_t) * S * (size_t)max_blocks);
    p->seqs = hn_malloc(sizeof(kv_seq *) * S);
    p->state_slot = hn_malloc(sizeof(int32_t) * S);
    p->rowwise = hn_malloc(S);
    p->prompt = hn_malloc(S);
    p->state_snap = hn_malloc(sizeof(int32_t) * T);
    if (!p->state_snap || !p->rowwise || !p->prompt || !p->state_slot || !p->token || !p->pos || !p->seq || !p->slot || !p->out_rows || !p->seq_len || !p->block_table || !p->seqs) {
        plan_free(p);
        return hn_errf(err, HN_ERR_NOMEM, "plan: out of memory");
    }
    p->cap_tokens = max_tokens;
    p->cap_seqs = max_seqs;
    p->cap_blocks = max_blocks;
    return HN_OK;
}

void plan_free(step_plan *p) {
    hn_free(p->token);
    hn_free(p->pos);
    hn_free(p->seq);
    hn_free(p->slot);
    hn_free(p->out_rows);
    hn_free(p->seq_len);
    hn_free(p->block_table);
    hn_free(p->seqs);
    hn_free(p->state_slot);
    hn_free(p->rowwise);
    hn_free(p->prompt);
    hn_free(p->state_snap);
    memset(p, 0, sizeof *p);
}

hn_status plan_build(step_plan *p, kv_cache *kv, const step_batch *b, int32_t n_vocab, int32_t max_out, hn_err *err) {
    p->n_tokens = p->n_pad = p->n_seqs = p->n_out = 0;
    if (b->n_tokens < 0 || (b->n_tokens > 0 && (!b->token || !b->pos || !b->seq_id || !b->seqs)))
        return hn_errf(err, HN_ERR_INVALID, "forward: incomplete batch");
    if (b->n_seqs < 1 || b->n_seqs > p->cap_seqs)
        return hn_errf(err, HN_ERR_INVALID, "forward: %d sequences in a batch (at most %d)", (int)b->n_seqs,
                       (int)p->cap_seqs);
    if (b->n_tokens > p->cap_tokens)
        return hn_errf(err, HN_ERR_RANGE, "forward: %d tokens in a step (at most %d)", (int)b->n_tokens,
                       (int)p->cap_tokens);
    /* seq_len doubles as each sequence's fill while checking */
    int32_t *fill = p->seq_len;
    for (int32_t s = 0; s < b->n_seqs; s++) fill[s] = b->seqs[s] ? b->seqs[s]->n_tokens : 0;
    int32_t n_out = 0;
    bool decode = true; /* every sequence contributes at most one token */
    for (int32_t i = 0; i < b->n_tokens; i++) {
        int32_t sid = b->seq_id[i], tok = b->token[i], pos = b->pos[i];
        if (sid < 0 || sid >= b->n_seqs || !b->seqs[sid])
            return hn_errf(err, HN_ERR_INVALID, "forward: token %d names sequence %d of %d", (int)i, (int)sid,
                           (int)b->n_seqs);
        if (tok < 0 || tok >= n_vocab)
            return hn_errf(err, HN_ERR_INVALID, "forward: token id %d out of range (vocabulary %d)", (int)tok,
                           (int)n_vocab);
        if (pos < 0 || pos > fill[sid])
            return hn_errf(err, HN_ERR_INVALID, "forward: token %d at position %d, but sequence %d holds %d positions",
                           (int)i, (int)pos, (int)sid, (int)fill[sid]);
        if (pos == fill[sid]) fill[sid]++;
        if (i > 0 && decode)
            for (int32_t j = 0; j < i && decode; j++) decode = b->seq_id[j] != sid;
        if (!b->want_logits ? i == b->n_tokens - 1 : b->want_logits[i]) n_out++;
    }
    if (n_out > max_out)
        return hn_errf(err, HN_ERR_INVALID, "forward: %d logits rows wanted, room for %d", (int)n_out, (int)max_out);
    const int bs = kv->cfg.block_size;
    int32_t stride = 1;
    for (int32_t s = 0; s < b->n_seqs; s++) {
        if (!b->seqs[s]) continue;
        int32_t need = (fill[s] + bs - 1) / bs;
        if (need > p->cap_blocks)
            return hn_errf(err, HN_ERR_RANGE, "forward: sequence %d needs %d blocks, a plan holds %d", (int)s, (int)need,
                           (int)p->cap_blocks);
        hn_status st = kv_seq_reserve(kv, b->seqs[s], fill[s], err);
        if (st) return st;
        if (b->seqs[s]->n_blocks > stride) stride = b->seqs[s]->n_blocks;
    }
    if (stride > p->cap_blocks) stride = p->cap_blocks;
    p->n_tokens = b->n_tokens;
    p->n_seqs = b->n_seqs;
    p->bt_stride = stride;
    p->block_size = bs;
    for (int32_t s = 0; s < b->n_seqs; s++) {
        int32_t *row = p->block_table + (size_t)s * (size_t)stride;
        const kv_seq *q = b->seqs[s];
        int32_t nb = q ? (q->n_blocks < stride ? q->n_blocks : stride) : 0;
        if (nb) memcpy(row, q->blocks, sizeof(int32_t) * (size_t)nb);
        for (int32_t j = nb; j < stride; j++) row[j] = -1;
        p->seqs[s] = b->seqs[s];
        p->state_slot[s] = q ? q->state : -1;
        p->rowwise[s] = b->rowwise && b->rowwise[s];
        p->prompt[s] = b->prompt && b->prompt[s] && !p->rowwise[s];
    }
    n_out = 0;
    for (int32_t i = 0; i < b->n_tokens; i++) {
        int32_t sid = b->seq_id[i], pos = b->pos[i];
        p->token[i] = b->token[i];
        p->pos[i] = pos;
        p->seq[i] = sid;
        p->slot[i] = b->seqs[sid]->blocks[pos / bs] * bs + pos % bs;
        p->state_snap[i] = b->state_snap ? b->state_snap[i] : -1;
        if (!b->want_logits ? i == b->n_tokens - 1 : b->want_logits[i]) p->out_rows[n_out++] = i;
    }
    p->n_out = n_out;
    p->n_pad = decode && b->n_tokens > 0 ? plan_pad_size(b->n_tokens, p->cap_tokens) : b->n_tokens;
    for (int32_t i = b->n_tokens; i < p->n_pad; i++) {
        p->token[i] = 0;
        p->pos[i] = 0;
        p->seq[i] = 0;
        p->slot[i] = -1;
        p->state_snap[i] = -1;
    }
    return HN_OK;
}

void plan_finish(const step_plan *p) {
    for (int32_t s = 0; s < p->n_seqs; s++) {
        kv_seq *q = p->seqs[s];
        if (q && p->seq_len[s] > q->n_tokens) q->n_tokens = p->seq_len[s];
        if (q && q->state >= 0) q->state_len = q->n_tokens; /* the recurrent ops consumed every position */
    }
}
