/* dflash.h: the DFlash drafter of speculative decoding: a block-diffusion
 * draft model in its own GGUF (model.h, "DFlash"; loaded with the target
 * through model_params.dflash) drafts a whole block of tokens in one
 * forward, conditioned on the target's hidden states; the target verifies
 * them (sched/engine.c, as it verifies the other drafters' proposals).
 *
 * The drafter reads the target's tapped hidden states, so it runs right
 * after each target step, on the rows that step computed and kept. Its KV
 * cache is its own (kv/, one drafter layer per KV layer, its own prefix
 * cache), with one drafter sequence per request (dfl_seq) whose position p
 * holds every drafter layer's K/V of the target's hidden state at p (the
 * injected context). After a target step that kept positions [from, from +
 * n) of a request, those n rows are injected (one drafter step for all
 * requests); a request that decodes next then drafts: a block of the
 * trained block_size tokens, the request's last token x_N (the anchor, at
 * position N, not yet computed by the target) then the mask token, runs at
 * positions N .. N + bs - 1 over the context (all sessions' blocks in one
 * forward, or a few when they do not fit one step), and its slots give up
 * to bs - 1 drafted tokens x_{N+1} .. (bs with dflash.sample_from_anchor).
 * The block's positions are cut off again by truncation, so the sequence
 * always ends where the target's does and holds only injected context.
 *
 * Prefix cache: position p's K/V depend on the target's hidden state at p,
 * so on tokens x_0 .. x_p, as the target's own K/V do: a block is published
 * under the request's token hash chain, in the request's namespace.
 *
 * A sequence that cannot follow its request (the target resumed further
 * from its prefix cache than the drafter's holds, its pool was full) is
 * left out (dfl_seq_len says where it is; the caller stops using it). One
 * thread (the engine's) uses a drafter; nothing in dfl_step allocates. */
#ifndef HN_SPEC_DFLASH_H
#define HN_SPEC_DFLASH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../core/status.h"
#include "../quant/blocks.h"
#include "ctl.h"

struct model;
struct kv_seq;
struct kv_cache;
typedef struct dfl_drafter dfl_drafter;
typedef struct dfl_seq dfl_seq;

typedef struct dfl_params {
    int32_t n_ctx;            /* most positions of a target request */
    int32_t max_seqs;         /* most sessions in one call */
    int32_t n_blocks;         /* the drafter's KV pool cap in blocks */
    int block_size;           /* KV positions per block; 0: default */
    qt_type k_type, v_type;   /* KV element types */
    bool prefix_cache;        /* reuse the drafter's cached blocks across requests */
} dfl_params;

/* A drafter on the target model m (borrowed; model_has_dflash(m)), with its
 * own KV cache. HN_ERR_UNSUPPORTED when m has no DFlash drafter, or when its
 * block does not fit one of m's steps. */
hn_status dfl_new(struct model *m, const dfl_params *p, dfl_drafter **out, hn_err *err);
void dfl_free(dfl_drafter *d);
/* The most tokens one block drafts (block_size - 1, or block_size with
 * sample_from_anchor). */
int32_t dfl_block_drafts(const dfl_drafter *d);

/* An empty drafter sequence for a request in prefix-cache namespace ns;
 * NULL on no memory. Any thread. */
dfl_seq *dfl_seq_new(dfl_drafter *d, uint64_t ns);
/* Publishes what it holds (toks: the request's tokens from position 0),
 * gives its blocks back and frees it. */
void dfl_seq_free(dfl_drafter *d, dfl_seq *s, const int32_t *toks);
/* Publishes what it holds and empties it (preempted, or left out). */
void dfl_seq_reset(dfl_drafter *d, dfl_seq *s, const int32_t *toks);
/* Positions it holds. */
int32_t dfl_seq_len(const dfl_seq *s);
/* Its KV sequence (for kv_check). */
const struct kv_seq *dfl_seq_kv(const dfl_seq *s);
/* After the target took cached blocks: extends an empty or block-aligned
 * sequence from the drafter's prefix cache up to n positions of the
 * request's tokens toks, and cuts it back to n when it got more; returns
 * its length (n: in step). */
int32_t dfl_seq_match(dfl_drafter *d, dfl_seq *s, const int32_t *toks, int32_t n);

typedef struct dfl_job {
    dfl_seq *seq;
    const int32_t *toks;      /* the request's tokens (prompt, reply so far) */
    int32_t from, n;          /* injection: positions [from, from + n) (from: the sequence's length), whose */
    int32_t row0;             /* taps are rows row0 .. row0 + n of the target's last step */
    int32_t k;                /* most tokens to draft (0: inject only; from + n must then be the */
                              /* request's last position: its last token is the anchor) */
    int32_t *out;             /* [k] drafted tokens */
    float *p;                 /* [k] the drafter's probability of each */
    int32_t n_out;            /* set: how many were drafted */
    bool failed;              /* set: the sequence could not follow (left out; see dfl_seq_len) */
} dfl_job;

/* Injects every job's kept rows of the target's last step (one drafter
 * step for all of them), then drafts a block for each job with k > 0 (all
 * blocks in one forward when they fit a step). jobs must be in ascending
 * row0 and their rows must not overlap. Errors: the backend's (every job
 * then failed). */
hn_status dfl_step(dfl_drafter *d, dfl_job *jobs, int32_t n_jobs, hn_err *err);

/* Drops the drafter's cached prefix blocks and unmaps its empty slabs. */
void dfl_trim(dfl_drafter *d);
/* The cost of one drafted token for each of n sessions at context ctx in
 * the units of the target's table tc: a block forward of full blocks for
 * all n (the drafter's own table of block forwards, by the tokens they
 * drafted) over its tokens; measured when both tables know ctx, else ratio
 * (a block forward's weight bytes over the target's) times a target
 * one-row step, spread over a block's drafts. */
double dfl_token_cost(const dfl_drafter *d, const spc_cost *tc, int32_t ctx, int32_t n_sessions, double ratio);
/* kv_check of the drafter's cache with its live sequences. */
hn_status dfl_check(const dfl_drafter *d, const struct kv_seq *const *seqs, int n, hn_err *err);

/* Its KV cache (tests read what was injected). */
const struct kv_cache *dfl_cache(const dfl_drafter *d);

typedef struct dfl_stats {
    size_t kv_bytes, kv_peak_bytes; /* the drafter's KV slabs and their block metadata */
    uint64_t steps;           /* drafter steps run (injection and block forwards) */
    uint64_t tokens;          /* rows computed (injected positions and block rows) */
    uint64_t blocks;          /* blocks drafted */
    uint64_t drafted;         /* tokens proposed */
    uint64_t left_out;        /* sequences that could not follow their request */
    double ms;                /* time in dfl_step */
} dfl_stats;
void dfl_get_stats(const dfl_drafter *d, dfl_stats *out);

#endif
