/* draft.h: the draft-model drafter of speculative decoding: a smaller GGUF
 * with the target's vocabulary proposes the next tokens greedily, the
 * target verifies them (sched/engine.c, as it verifies the suffix
 * drafter's proposals).
 *
 * The drafter owns its model (on a backend of the target's kind, or the
 * CPU), its own paged KV cache (kv/, with its own prefix cache: a session's
 * next turn finds its prompt's blocks there too) and one drafter sequence
 * per target request (drf_seq), which holds K/V for a prefix of the
 * request's tokens plus the tokens it drafted itself. drf_draft brings each
 * sequence in sync with its request and drafts: the drafter sequence is
 * cut back to the longest prefix it shares with the request's tokens
 * (attention K/V rollback is truncation; rejected drafts go), the tokens it
 * has not seen (the accepted drafts' successor, the correction, new prompt
 * tokens) are computed as one step, whose last row gives the first drafted
 * token, and each further drafted token is one more step; every step
 * batches all sessions' rows (catch-up and drafting), so n sessions drafting
 * k tokens cost about k drafter steps, not n k. Each drafted token carries
 * the drafter's softmax probability of it, which the controller (ctl.h)
 * calibrates into an acceptance probability.
 *
 * Refused: a draft model whose tokenizer differs from the target's (token
 * count or any token's text; a drafter with fewer or more logits rows than
 * the target is fine, its drafts stay inside the shared tokens) and hybrid
 * (recurrent) draft models, whose state would need rolling back too (not
 * built). Nothing in drf_draft allocates (arrays sized at drf_new and
 * drf_seq_new); the drafter's KV slabs are mapped on demand. One thread
 * (the engine's) uses a drafter. */
#ifndef HN_SPEC_DRAFT_H
#define HN_SPEC_DRAFT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../core/status.h"
#include "../quant/blocks.h"
#include "ctl.h"

struct tok_vocab;
typedef struct drf_drafter drf_drafter;
typedef struct drf_seq drf_seq;

typedef struct drf_params {
    const char *path;         /* the draft model's GGUF */
    const char *device;       /* backend name (registry.h): the target's ("cpu", "cuda"; NULL: auto) */
    struct be_backend *target; /* the target's backend (NULL: none): a CPU one lends its thread pool,
                                  so the two models' workers never spin against each other */
    int n_threads;            /* 0: all CPUs */
    int32_t n_ctx;            /* most positions of a target request */
    int32_t max_seqs;         /* most sessions drafting in one call */
    int32_t max_draft;        /* most tokens drafted per session and call */
    int32_t step_tokens;      /* catch-up rows per drafter step beside the drafting rows (0: 256) */
    int32_t n_blocks;         /* the drafter's KV pool cap in blocks */
    int block_size;           /* 0: default */
    qt_type k_type, v_type;   /* KV element types */
    bool prefix_cache;        /* reuse the drafter's cached prompt blocks across requests */
    const struct tok_vocab *vocab; /* the target's tokenizer: the drafter's must equal it */
} drf_params;

/* Whether the drafter's tokenizer b (of the file path, a `what`) has the
 * target's tokens a: the same count and every token's text; else
 * HN_ERR_UNSUPPORTED with a message naming the first difference. */
hn_status drf_same_vocab(const struct tok_vocab *a, const struct tok_vocab *b, const char *what, const char *path,
                         hn_err *err);

/* Loads the draft model and its cache. HN_ERR_UNSUPPORTED for a vocabulary
 * that differs from p->vocab or a hybrid draft model (messages say which). */
hn_status drf_new(const drf_params *p, drf_drafter **out, hn_err *err);
void drf_free(drf_drafter *d);

/* A drafter sequence for one request (no K/V yet) in prefix-cache
 * namespace ns (kv_seq.ns: the request's); NULL on no memory. Any thread. */
drf_seq *drf_seq_new(drf_drafter *d, uint64_t ns);
/* Publishes what the sequence computed to the drafter's prefix cache (when
 * on), gives its blocks back and frees it. The drafter's thread. */
void drf_seq_free(drf_drafter *d, drf_seq *s);

/* Drops the drafter's cached (unreferenced) prefix blocks and unmaps its
 * empty slabs (with the target's cache: eng_trim, the idle timer). */
void drf_trim(drf_drafter *d);

typedef struct drf_job {
    drf_seq *seq;
    const int32_t *toks;      /* the request's tokens (prompt, reply so far); the draft continues them */
    int32_t n_toks;
    int32_t k;                /* most tokens to draft (<= max_draft) */
    int32_t min_k;            /* draft at least this many (unless the drafter cannot) ... */
    float min_run;            /* ... then stop once the running acceptance probability is below this: */
    double cal[SPC_LEN_B];    /* the product of min(0.99, cal[spc_conf_bucket(p)] * p) over the drafted tokens */
    int32_t *out;             /* [k] drafted tokens */
    float *p;                 /* [k] the drafter's probability of each */
    int32_t n_out;            /* set: how many were drafted */
} drf_job;

/* Syncs every job's sequence with its tokens and drafts, all sessions'
 * rows batched per drafter step. A session the drafter's pool cannot hold
 * drafts nothing (its sequence emptied). Errors: the backend's. */
hn_status drf_draft(drf_drafter *d, drf_job *jobs, int32_t n_jobs, hn_err *err);

/* The drafter's step-time table (rows of a drafter step, context), recorded
 * by drf_draft, and the cost of drafting one token for each of n sessions at
 * context ctx in the units of the target's table tc: measured when both
 * tables know ctx, else weight_ratio (drafter / target weight bytes) times
 * a target one-row step. */
const spc_cost *drf_cost(const drf_drafter *d);
double drf_token_cost(const drf_drafter *d, const spc_cost *tc, int32_t ctx, int32_t n_sessions, double weight_ratio);

typedef struct drf_stats {
    size_t model_bytes;       /* heap the draft model took (repacked weights, activations) */
    size_t file_bytes;        /* its weights in the file mapping */
    size_t kv_bytes, kv_peak_bytes; /* the drafter's KV slabs and their block metadata */
    uint64_t steps;           /* drafter steps run */
    uint64_t tokens;          /* rows computed (catch-up and drafting) */
    uint64_t drafted;         /* tokens proposed */
    double ms;                /* time in drf_draft */
} drf_stats;
void drf_get_stats(const drf_drafter *d, drf_stats *out);

#endif
