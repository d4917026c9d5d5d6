/* mtp.h: the MTP drafter of speculative decoding: the target's own
 * multi-token-prediction layer (model.h, "MTP") proposes the next tokens,
 * the target verifies them (sched/engine.c, as it verifies the other
 * drafters' proposals).
 *
 * The layer reads the target's final hidden state, so it runs right after
 * each target step, on the rows that step computed and kept. Its KV cache is
 * its own (kv/, one layer, its own prefix cache), with one MTP sequence per
 * request (mtp_seq) whose position p holds the pair (h_p, x_{p+1}): the
 * target's hidden state at p and the token after it. After a target step
 * that kept positions [from, from + n) of a request, its catch-up rows are
 * those n positions (token x_{p+1}, hidden row: the target step's row of
 * p), and the last of them, (h_{N-2}, x_{N-1}) where x_{N-1} is the token
 * just sampled, gives the first drafted token x_N. Further tokens chain:
 * the next row is the drafted token at the next position with the MTP's own
 * output state in place of the target's (as llama.cpp and DeepSeek-V3's MTP
 * modules do), one MTP step per drafted token, every step batching all
 * sessions' rows. Drafted positions are cut off again by truncation (the
 * sequence ends where the target's does), so the sequence only ever holds
 * pairs of accepted tokens and the target's states.
 *
 * Convention: position p of the MTP cache holds (h_p, x_{p+1}) at rope
 * position p, as the training objective pairs them (DeepSeek-V3 section
 * 2.2; vLLM's MTP). llama.cpp stores the same pair at position p + 1 and
 * one extra pair (0, x_0) at position 0; rope makes the two the same but for
 * that first pair, which only changes what the layer's attention sees at the
 * start of a sequence.
 *
 * Prefix cache: block b of a sequence holds pairs of positions
 * [b*bs, (b+1)*bs), which depend on tokens x_0 .. x_{(b+1)*bs}; it is
 * published under the hash chain of x_{p+1} (the tokens the sequence was fed)
 * in a namespace salted with the request's and x_0, so a block is found
 * exactly by the text it was computed from.
 *
 * A sequence that cannot follow its request (the target resumed further
 * from its prefix cache than the MTP cache holds, its pool was full) is
 * left out (mtp_seq_len says where it is; the caller stops using it). One
 * thread (the engine's) uses a drafter; nothing in mtp_step allocates. */
#ifndef HN_SPEC_MTP_H
#define HN_SPEC_MTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../core/status.h"
#include "../quant/blocks.h"
#include "ctl.h"

struct model;
struct kv_seq;
typedef struct mtp_drafter mtp_drafter;
typedef struct mtp_seq mtp_seq;

typedef struct mtp_params {
    int32_t n_ctx;            /* most positions of a target request */
    int32_t max_seqs;         /* most sessions in one call */
    int32_t max_draft;        /* most tokens drafted per session and call */
    int32_t n_blocks;         /* the MTP's KV pool cap in blocks */
    int block_size;           /* 0: default */
    qt_type k_type, v_type;   /* KV element types */
    bool prefix_cache;        /* reuse the MTP's cached blocks across requests */
} mtp_params;

/* A drafter on the target model m (borrowed; model_has_mtp(m)), with its own
 * KV cache. HN_ERR_UNSUPPORTED when m has no runnable MTP layer. */
hn_status mtp_new(struct model *m, const mtp_params *p, mtp_drafter **out, hn_err *err);
void mtp_free(mtp_drafter *d);

/* An empty MTP sequence for a request in prefix-cache namespace ns; NULL on
 * no memory. Any thread. */
mtp_seq *mtp_seq_new(mtp_drafter *d, uint64_t ns);
/* Publishes what it holds (tokens: the request's, from position 0), gives
 * its blocks back and frees it. */
void mtp_seq_free(mtp_drafter *d, mtp_seq *s, const int32_t *toks);
/* Publishes what it holds and empties it (the request was preempted, or
 * left out). */
void mtp_seq_reset(mtp_drafter *d, mtp_seq *s, const int32_t *toks);
/* Positions it holds. */
int32_t mtp_seq_len(const mtp_seq *s);
/* Its KV sequence (for kv_check). */
const struct kv_seq *mtp_seq_kv(const mtp_seq *s);
/* After the target took cached blocks: extends an empty or block-aligned
 * sequence from the MTP's prefix cache up to n positions of the request's
 * tokens toks (which must hold n + 1 of them), and cuts it back to n when it
 * got more; returns its length (n: in step). */
int32_t mtp_seq_match(mtp_drafter *d, mtp_seq *s, const int32_t *toks, int32_t n);

typedef struct mtp_job {
    mtp_seq *seq;
    const int32_t *toks;      /* the request's tokens (prompt, reply so far) */
    int32_t from, n;          /* catch-up: positions [from, from + n) (from: the sequence's length), whose */
    int32_t row0;             /* hidden states are rows row0 .. row0 + n of the target's last step */
    int32_t k;                /* most tokens to draft (0: catch up only; from + n must then be ...) */
    int32_t min_k;            /* ... the request's last position, n_toks - 1) */
    float min_run;            /* stop once the running acceptance probability is below this: */
    double cal[SPC_LEN_B];    /* the product of min(0.99, cal[spc_conf_bucket(p)] * p) over the drafted tokens */
    int32_t *out;             /* [k] drafted tokens */
    float *p;                 /* [k] the MTP's probability of each */
    int32_t n_out;            /* set: how many were drafted */
    bool failed;              /* set: the sequence could not follow (left out; see mtp_seq_len) */
} mtp_job;

/* Catches every job's sequence up on the target's last step (one MTP step
 * for all of them) and drafts (one more step per further token). jobs must
 * be in ascending row0 and their rows must not overlap. Errors: the
 * backend's (every job then failed). */
hn_status mtp_step(mtp_drafter *d, mtp_job *jobs, int32_t n_jobs, hn_err *err);

/* Drops the MTP's cached prefix blocks and unmaps its empty slabs. */
void mtp_trim(mtp_drafter *d);
/* The MTP's step-time table of drafting steps (rows: sessions), and the
 * cost of drafting one token for each of n sessions at context ctx in the
 * units of the target's table tc: measured when both tables know ctx, else
 * ratio (MTP / target weight bytes) times a target one-row step. */
double mtp_token_cost(const mtp_drafter *d, const spc_cost *tc, int32_t ctx, int32_t n_sessions, double ratio);
/* kv_check of the MTP's cache with its live sequences. */
hn_status mtp_check(const mtp_drafter *d, const struct kv_seq *const *seqs, int n, hn_err *err);

typedef struct mtp_stats {
    size_t kv_bytes, kv_peak_bytes; /* the MTP's KV slabs and their block metadata */
    uint64_t steps;           /* MTP steps run (catch-up and drafting) */
    uint64_t tokens;          /* rows computed */
    uint64_t drafted;         /* tokens proposed */
    uint64_t left_out;        /* sequences that could not follow their request */
    double ms;                /* time in mtp_step */
} mtp_stats;
void mtp_get_stats(const mtp_drafter *d, mtp_stats *out);

#endif
