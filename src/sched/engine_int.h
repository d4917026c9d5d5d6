/* engine_int.h: private to sched/: the engine's state (eng_engine, its
 * requests ereq) and the functions its files share: engine.c (the thread,
 * steps, admission, planning, sampling and events, the API) and
 * engine_spec.c (speculation: drafting into the step's plan and verifying
 * the drafted rows). */
#ifndef HN_ENGINE_INT_H
#define HN_ENGINE_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include "engine.h"
#include "../kv/kv.h"
#include "../model/model.h"
#include "../spec/ctl.h"
#include "../spec/dflash.h"
#include "../spec/draft.h"
#include "../spec/mtp.h"
#include "../spec/suffix.h"
#include "../tokenizer/tokenizer.h"

#define ENG_DEFAULT_STEP 64
/* on a GPU: a step's weights read costs the same for 64 rows as for 512, and the
 * grouped expert products need rows per expert to fill their tiles (llama.cpp's
 * default micro-batch is 512 too) */
#define ENG_DEFAULT_STEP_GPU 512
#define ENG_DEFAULT_RUNNING 16
#define ENG_DEFAULT_IDLE_MS (5 * 60 * 1000)
#define ENG_SPEC_MAX 64        /* most drafted tokens per request and step */
#define ENG_SPEC_DEFAULT 16
#define DRAFT_PROBE_LEN 2      /* a switched-off draft model's probe (each token a drafter step) */

typedef struct ereq {
    eng_req_id id;
    struct ereq *next, *prev;    /* in the all-requests list (mutex) */
    struct ereq *qnext;          /* in incoming / waiting (FIFO) */
    eng_request r;               /* prompt pointer not kept */
    int32_t *toks;
    int32_t n_toks, cap_toks, n_prompt;
    int32_t n_gen, max_gen;      /* max_gen <= 0: no limit but the context */
    kv_seq seq;
    smp_sampler *smp;
    eng_req_stats st;
    double t_submit;
    bool started, resumed, sampled;
    _Atomic bool cancel;
    uint64_t admit_order;
    int32_t logit_row;           /* this step: row of its logits, or -1 */
    int32_t chunk;               /* this step: tokens planned */
    int64_t n_computed;
    double t_last;               /* when its last token was sampled */
    eng_session snap;            /* as eng_get_sessions reports it (mutex) */
    int32_t ck_roll;             /* hybrids: block of its rolling reply checkpoint, or -1 */
    int32_t ck_from;             /* hybrids: block of the checkpoint its state was restored from, or -1 */
    int32_t ck_at;               /* hybrids: also checkpoint at this position (the end of a chunk others wait for) */
    int32_t tip_at[ENG_RESUME_MAX]; /* hybrids: the prompt's tips (block boundaries of r.resume), n_tip_at of them */
    int32_t n_tip_at;            /* 0: the tip is the prompt's last full block */
    bool ck_from_tip;            /* ck_from is one of tip_at (it stays a tip) */
    uint64_t conv;               /* hybrids: its conversation, the tag of its tips (kv_ckpt_tag): that of the
                                    tip it first resumed from, else its id; 0 until its first match */
    bool reply_tips;             /* a likely next turn repeats all of the prompt, so maybe the reply: it gets
                                    rolling tips (no resume points given, or one at n_prompt) */
    int32_t plan_end;            /* this step: the position its chunk ends at */
    /* speculative decoding: the drafter over toks (NULL: not speculating),
     * this step's draft (n_draft tokens after the decode token, their
     * drafted probabilities, the match-length bucket) and the controller */
    sfx_drafter *sfx;
    int32_t n_draft, draft_bucket;
    int32_t draft[ENG_SPEC_MAX];
    float draft_p[ENG_SPEC_MAX];
    spc_req ctl;
    /* the draft model: its sequence of this request (NULL: none), and this
     * step's proposal (n_mprop tokens in draft/draft_p; draft_model: this
     * step's draft is the model's, draft_force: verify at least a probe) */
    drf_seq *dseq;
    int32_t n_mprop;
    bool draft_model, draft_force, draft_noted;
    bool dprobe;          /* this step's model draft is a probe of a switched-off request */
    int32_t dprobe_fails; /* probes in a row that had no token accepted (each doubles the interval, to 16x) */
    spc_req dctl;
    /* the drafter that reads the target's hidden states, the MTP layer or
     * DFlash: its sequence of this request (mseq / fseq; NULL: none; hd_ok:
     * it follows the request), and this step's rows: the first (-1: none)
     * and the sequence's length before the step */
    mtp_seq *mseq;
    dfl_seq *fseq;
    bool hd_ok;
    int32_t row0, L0;
    /* hybrids, this step: its verified rows' state snapshots are spare[snap0 ..
     * snap0 + n_draft) (-1: none); after verify, v_pos is the position of
     * its decode row */
    int32_t snap0, v_pos;
} ereq;

struct eng_engine {
    eng_params p;
    model *m;
    tok_vocab *vocab;
    kv_cache *kv;
    int32_t n_ctx, n_vocab;
    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;       /* wakes the engine thread */
    pthread_cond_t trim_cv;  /* eng_trim waits on it */
    bool stop;
    uint64_t trim_req, trim_done;
    ereq *all;               /* every live request (mutex) */
    ereq *in_head, *in_tail; /* submitted, not yet seen by the engine (mutex) */
    int32_t n_incoming;
    eng_req_id next_id;
    eng_stats stats;         /* snapshot (mutex) */
    uint64_t prompt_tokens;  /* mutex */
    /* engine thread only */
    ereq *wait_head, *wait_tail;
    int32_t n_waiting;
    ereq **running;
    int32_t n_running;
    uint64_t admit_counter;
    uint64_t cached_tokens, generated_tokens, computed_tokens, preemptions, steps, check_failures;
    uint64_t finished[ENG_FINISH_ERROR + 1], ttft_hist[ENG_HIST_N], itl_hist[ENG_HIST_N];
    double ttft_sum_ms, itl_sum_ms;
    size_t engine_bytes, model_bytes, model_file_bytes, moe_apart_bytes;
    char check_error[160];
    int32_t cap_batch;
    int32_t *b_tok, *b_pos, *b_sid;
    bool *b_want;
    bool *b_rowwise;         /* per batch sequence: a drafted block (its rows computed as decode rows) */
    bool *b_prompt;          /* per batch sequence: prompt rows (the prefill form, even one alone: step_batch.prompt) */
    kv_seq **b_seqs;
    ereq **b_req;            /* request of each batch sequence slot */
    const uint32_t **masks;  /* this step's allowed-token bitmask of each logits row (NULL: none) */
    uint64_t *b_hash;        /* next-block hashes of this step's prefill chunks */
    ereq **b_hash_req;       /* the request computing each of them */
    step_plan splan;         /* this step's plan (the backend reads it) */
    const kv_seq **chk;      /* debug_check */
    /* hybrid models: each running sequence holds a recurrent-state slot;
     * checkpoints of it are taken at chosen block boundaries (ck_src/ck_dst:
     * one step's copies) */
    bool hybrid;
    int32_t *ck_src, *ck_dst;
    int32_t n_ck;
    /* hybrids speculating: the spare state slots that a verify step writes
     * each verified row's state into (spare[0, n_spare) mapped, at most
     * spare_cap; spare_used this step), and the step's snapshot slot per row */
    int32_t *spare, n_spare, spare_cap, spare_used;
    int32_t *b_snap;
    /* speculative decoding (spec: in effect) */
    int spec;
    int32_t spec_max, spec_rows; /* per request; drafted rows per step (logits rows beyond max_running) */
    spc_cost cost;
    uint64_t spec_drafted, spec_accepted, spec_verify_steps;
    /* the draft model (NULL: none): its jobs of a step, its tokens' calibration
     * (by confidence bucket) and its weight bytes over the target's (the cost prior) */
    drf_drafter *drf;
    drf_job *djobs;
    spc_cost dcal;
    double draft_ratio;
    /* the MTP drafter (NULL: none; used in the draft model's place, with its
     * calibration dcal and its cost prior draft_ratio): a step's jobs, their
     * requests, and requests stopped following */
    mtp_drafter *mtp;
    mtp_job *mjobs;
    ereq **mreq;
    uint64_t hd_off;
    /* the DFlash drafter (NULL: none; in the draft model's place, like the
     * MTP layer, sharing its calibration, cost prior, request list and
     * counter of requests stopped following): its file (opened here, read
     * by the model) and a step's jobs */
    gguf_ctx *dfl_g;
    dfl_drafter *dfl;
    dfl_job *fjobs;
};

/* The request's sequence of the hidden-state drafter (MTP or DFlash): held at all, and its length. */
static inline bool hd_has(const ereq *q) { return q->mseq || q->fseq; }
static inline int32_t hd_len(const ereq *q) { return q->mseq ? mtp_seq_len(q->mseq) : dfl_seq_len(q->fseq); }

/* engine.c: a hidden-state drafter stops for the request; a sampled token delivered (false: the request ends) */
void eng_hd_leave(eng_engine *e, ereq *q);
bool eng_deliver(eng_engine *e, ereq *q, int32_t tok, eng_finish *fin, hn_status *st, const char **msg);

/* engine_spec.c: hybrids' spare state slots given back; the step's drafts
 * (how many rows a decoding request drafts into the plan; the draft model's
 * and the hidden-state drafters' proposals); the verification of a drafted
 * block (its accepted tokens delivered) */
void eng_spares_release(eng_engine *e);
int32_t eng_choose_draft(eng_engine *e, ereq *q, int32_t *rows_left, int32_t *rows, double *toks, int32_t ctx);
void eng_model_drafts(eng_engine *e);
void eng_hd_drafts(eng_engine *e);
bool eng_verify(eng_engine *e, ereq *q, float *rows, eng_finish *fin, hn_status *st, const char **msg);

#endif
