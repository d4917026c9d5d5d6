/* plan.h: one step's plan, the structure the scheduler fills and the backend
 * reads (DESIGN.md, "The step").
 *
 * A step is a ragged batch of tokens from several sequences. plan_build
 * checks the batch, reserves the KV blocks it needs and fills the plan:
 * per token its id, position, sequence (an index into the plan's sequences)
 * and KV slot (block * block_size + pos % block_size: where its K/V row is
 * stored); per sequence its block-table row (dense, padded with -1) and the
 * positions it holds once the step's K/V are stored; and the tokens whose
 * logits are wanted. The backend receives the plan once per step (plan_set);
 * the forward is pure compute over it. plan_finish advances the sequences'
 * lengths afterwards. For hybrid models each sequence also carries its
 * recurrent-state slot: the recurrent ops read and update the state of a
 * sequence in token order, from zero at a token at position 0; a token may
 * also name a snapshot slot, into which they write the state right after it
 * (the live slot still ends with the state after the sequence's last token).
 *
 * Decode-only plans (every sequence contributes one token) are padded to a
 * graph size (1, 2, 4, 8, ... max_tokens): rows [n_tokens, n_pad) are token 0
 * at position 0 of sequence 0 with slot -1 (they store nothing; what they
 * compute is never read). A backend that replays captured graphs runs n_pad
 * rows; the CPU backend runs n_tokens. */
#ifndef HN_PLAN_H
#define HN_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "../core/status.h"
#include "../kv/kv.h"

/* The input of plan_build: token i is token[i] at position pos[i] of
 * sequence seqs[seq_id[i]]. Within a batch a sequence's positions must not
 * skip ahead: pos[i] <= that sequence's n_tokens plus its earlier tokens in
 * this batch (re-writing an earlier position is allowed). want_logits[i] asks
 * for token i's logits (want_logits NULL: the last token only). */
typedef struct step_batch {
    int32_t n_tokens;
    const int32_t *token;
    const int32_t *pos;
    const int32_t *seq_id;
    const bool *want_logits;
    /* rowwise[s] (NULL: none): sequence s's tokens are the verification rows of a
     * drafted block, each to be computed exactly (bit for bit) as a one-token
     * decode step at its position would compute it */
    const bool *rowwise;
    /* prompt[s] (NULL: none): sequence s's tokens are prompt rows, computed in
     * the prefill form however many of them the step holds (one included),
     * so that a prompt row's bits do not depend on where the prompt was cut
     * into chunks; without it a token alone in its sequence is a decode row */
    const bool *prompt;
    /* state_snap[i] (NULL: none; hybrid models): a state slot that receives the
     * recurrent state of token i's sequence right after token i, or -1
     * (speculation keeps the state after each verified row, to roll back to) */
    const int32_t *state_snap;
    kv_seq *const *seqs;   /* block tables, indexed by seq_id */
    int32_t n_seqs;
} step_batch;

typedef struct step_plan {
    int32_t n_tokens;      /* real tokens */
    int32_t n_pad;         /* rows a graph-replaying backend runs (>= n_tokens) */
    int32_t n_seqs;
    int32_t n_out;         /* rows of logits wanted */
    int32_t bt_stride;     /* block-table row length (>= every sequence's blocks) */
    int32_t block_size;
    int32_t *token;        /* [n_pad] */
    int32_t *pos;          /* [n_pad] */
    int32_t *seq;          /* [n_pad] index into the plan's sequences */
    int32_t *slot;         /* [n_pad] KV slot; -1: padding */
    int32_t *seq_len;      /* [n_seqs] positions held once the step's K/V are stored */
    int32_t *block_table;  /* [n_seqs][bt_stride] block ids, -1 past a sequence's blocks */
    int32_t *out_rows;     /* [n_out] token indices, ascending */
    int32_t *state_slot;   /* [n_seqs] recurrent-state slot of each sequence (kv_seq.state; -1: none) */
    uint8_t *rowwise;      /* [n_seqs] 1: its tokens are independent decode rows (step_batch.rowwise) */
    uint8_t *prompt;       /* [n_seqs] 1: its tokens are prompt rows (step_batch.prompt) */
    int32_t *state_snap;   /* [n_pad] state slot that also receives the sequence's recurrent state after
                            * this token (step_batch.state_snap), -1: none (padding rows: -1) */
    kv_seq **seqs;         /* [n_seqs] the sequences (for plan_finish; backends do not read them) */
    /* capacity, fixed at plan_init */
    int32_t cap_tokens, cap_seqs, cap_blocks;
} step_plan;

/* Allocates a plan for at most max_tokens tokens of max_seqs sequences of
 * at most max_blocks blocks each. */
hn_status plan_init(step_plan *p, int32_t max_tokens, int32_t max_seqs, int32_t max_blocks, hn_err *err);
void plan_free(step_plan *p);

/* Checks the batch (token ids below n_vocab, sequence ids, positions, at
 * most max_out logits rows), reserves the KV blocks every sequence needs
 * (kv_seq_reserve) and fills the plan. Errors: HN_ERR_INVALID (bad batch;
 * nothing reserved), HN_ERR_RANGE (over the plan's capacity or a block table
 * full), HN_ERR_FULL (pool exhausted; blocks taken so far stay with their
 * sequences). */
hn_status plan_build(step_plan *p, kv_cache *kv, const step_batch *b, int32_t n_vocab, int32_t max_out, hn_err *err);
/* After the step: each sequence's n_tokens covers its highest position. */
void plan_finish(const step_plan *p);

/* The graph size a decode step of n tokens is padded to (cap: the plan's capacity). */
int32_t plan_pad_size(int32_t n, int32_t cap);

#endif
