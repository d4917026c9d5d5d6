/* engine.c: the engine thread: requests, continuous batching with chunked
 * prefill under a per-step token budget, the prefix cache in use, preemption
 * when the KV pool is full, and the thread-safe API of engine.h.
 *
 * Threads. Submitters put requests on `incoming` and flag cancels under the
 * engine mutex; the engine thread alone touches the model, the KV cache and
 * the waiting/running sets, and never holds the mutex while it runs a step
 * or calls an event callback (so a callback may call eng_cancel).
 *
 * A request is its token list toks[0..n_toks) (the prompt, then every token
 * sampled so far) and a KV sequence holding toks[0..seq.n_tokens). Each step
 * it needs toks[seq.n_tokens..n_toks) computed: one token for a decoding
 * request, the rest of the prompt (or of a recomputation after preemption)
 * for a prefilling one. Computing the last of them yields logits and the
 * next token. A step is:
 *   1. cancels: cancelled requests finish and release their blocks;
 *   2. admission: waiting requests (FIFO; preempted ones first) join while
 *      fewer than max_running run and the pool has room for their first
 *      chunk; each first takes every cached block of its prefix (at most
 *      n_toks - 1 positions, so the last token is always computed);
 *   3. plan: one token for every decoding request, then prefill chunks in
 *      admission order under what is left of step_tokens (chunks end on a
 *      block boundary unless they finish the prompt, so their blocks can be
 *      published); a prefilling request first re-extends its prefix from the
 *      cache (blocks another request published last step) and waits a step
 *      if another request in this batch is about to compute the very same
 *      next block, so a prefix shared by sessions that start together is
 *      computed once; blocks are reserved as tokens are planned, and when
 *      the pool (after evicting cached blocks) cannot give one, the most
 *      recently admitted request is preempted: its blocks are published and
 *      released, and it goes back to the head of the queue to be resumed by
 *      recomputation, which mostly hits the cache again;
 *   4. one model forward over the ragged batch;
 *   5. sampling and events; finished requests publish their blocks (prompt
 *      and reply stay cached for the next turn) and release them.
 * Nothing in a step allocates: batch arrays, logits and per-request buffers
 * are sized at eng_create / eng_submit; only KV slabs are mapped on demand.
 * Speculation (drafting into the plan, verifying drafted rows) is in
 * engine_spec.c; the state both files share in engine_int.h. */
#include "engine_int.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../backend/registry.h"
#include "../core/alloc.h"
#include "../core/clock.h"
#include "../kv/kv.h"
#include "../model/model.h"
#include "../spec/ctl.h"
#include "../spec/dflash.h"
#include "../spec/draft.h"
#include "../spec/mtp.h"
#include "../spec/suffix.h"
#include "../tokenizer/tokenizer.h"

eng_params eng_default_params(void) {
    eng_params p;
    memset(&p, 0, sizeof p);
    p.prefix_cache = true;
    p.kv_type = ENG_KV_F16; /* half of f32, ~1e-6 KL from it (DESIGN.md) */
    return p;
}

static const char *const kv_names[] = {"f32", "f16", "q8_0", "k8v4"};

bool eng_kv_type_from_name(const char *name, int *out) {
    for (int i = 0; i < 4; i++)
        if (!strcmp(name, kv_names[i])) {
            *out = i;
            return true;
        }
    return false;
}

const char *eng_kv_type_name(int t) { return t >= 0 && t < 4 ? kv_names[t] : "unknown"; }

static const char *const spec_names[] = {"off", "auto", "suffix", "draft", "mtp", "dflash"};

int eng_spec_from_name(const char *name, int *out) {
    for (int i = 0; i < 6; i++)
        if (!strcmp(name, spec_names[i])) {
            *out = i;
            return 0;
        }
    return 1;
}

const char *eng_spec_name(int s) { return s >= 0 && s < 6 ? spec_names[s] : "unknown"; }

const double eng_ttft_bounds_ms[ENG_HIST_N] = {10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, INFINITY};
const double eng_itl_bounds_ms[ENG_HIST_N] = {1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, INFINITY};

static void hist_add(uint64_t *h, const double *bounds, double *sum, double v) {
    for (int i = 0; i < ENG_HIST_N; i++)
        if (v <= bounds[i]) h[i]++;
    *sum += v;
}

const char *eng_sess_state_name(int st) {
    static const char *const n[] = {"queued", "prefill", "decode"};
    return st >= 0 && st < 3 ? n[st] : "unknown";
}

/* ---- events ---- */

static void fill_times(eng_engine *e, ereq *q) {
    (void)e;
    q->st.n_generated = q->n_gen;
    q->st.t_total_ms = hn_now_ms() - q->t_submit;
}

static void emit_token(ereq *q, int32_t tok) {
    eng_event ev = {.type = ENG_EV_TOKEN, .id = q->id, .token = tok, .stats = q->st};
    ev.stats.t_total_ms = hn_now_ms() - q->t_submit;
    q->r.on_event(q->r.ctx, &ev);
}

/* Removes a request from the all-list, delivers DONE and frees it. Its KV
 * sequence must already be released. */
static void finish_free(eng_engine *e, ereq *q, eng_finish fin, hn_status st, const char *msg) {
    pthread_mutex_lock(&e->mu);
    if (q->prev) q->prev->next = q->next;
    else e->all = q->next;
    if (q->next) q->next->prev = q->prev;
    pthread_mutex_unlock(&e->mu);
    fill_times(e, q);
    e->finished[fin]++;
    eng_event ev = {.type = ENG_EV_DONE, .id = q->id, .finish = fin, .status = st, .error = msg, .stats = q->st};
    q->r.on_event(q->r.ctx, &ev);
    kv_seq_free(&q->seq, NULL);
    if (q->dseq) drf_seq_free(e->drf, q->dseq);
    if (q->mseq) mtp_seq_free(e->mtp, q->mseq, q->toks);
    if (q->fseq) dfl_seq_free(e->dfl, q->fseq, q->toks);
    sfx_free(q->sfx);
    smp_free(q->smp);
    hn_free(q->toks);
    hn_free(q);
}

/* Publishes what the request computed (prompt and reply stay cached) and
 * gives its blocks back, tail first. */
/* Runs the step's pending checkpoint copies (before any slot can change hands). */
static void flush_ckpts(eng_engine *e) {
    if (!e->n_ck) return;
    hn_err err;
    if (model_state_copy(e->m, e->kv, e->n_ck, e->ck_src, e->ck_dst, &err))
        kv_trim(e->kv, 0); /* cannot happen on the CPU; drop every checkpoint rather than keep bad ones */
    e->n_ck = 0;
}

/* Hybrids: the deepest block boundary at which the sequence's state is at
 * hand, and the slot holding it: its length when that is a boundary (the
 * live slot), or, after this step's verify crossed a boundary before its
 * last kept row, that row's snapshot (a spare slot). 0: none. */
static int32_t ckpt_src(const eng_engine *e, const ereq *q, int32_t *src) {
    int bs = e->kv->cfg.block_size;
    const kv_seq *s = &q->seq;
    int32_t n = s->n_tokens, at = n / bs * bs;
    *src = s->state;
    if (s->state < 0 || s->state_len != n || n <= 0) return 0;
    if (at == n) return n;
    if (q->snap0 < 0 || at <= q->v_pos) return 0;
    *src = e->spare[q->snap0 + (at - 1 - q->v_pos)];
    return at;
}

/* The request's sequence of the hidden-state drafter (MTP or DFlash, hd_has in engine_int.h): empties it (publishing what it held). */
static void hd_reset(eng_engine *e, ereq *q) {
    if (q->mseq) mtp_seq_reset(e->mtp, q->mseq, q->toks);
    if (q->fseq) dfl_seq_reset(e->dfl, q->fseq, q->toks);
}

/* It starts again with its request's (emptied) KV sequence. */
static void hd_restart(eng_engine *e, ereq *q) {
    if (!hd_has(q)) return;
    hd_reset(e, q);
    q->hd_ok = true;
}

/* It stops following its request (this request drafts no more with it). */
void eng_hd_leave(eng_engine *e, ereq *q) {
    if (!hd_has(q) || !q->hd_ok) return;
    hd_reset(e, q);
    q->hd_ok = false;
    e->hd_off++;
}

/* Hybrids: the request kept a tip checkpoint at block b, deeper than the
 * one it resumed from (which its conversation has moved past now) and than
 * its previous reply checkpoint (which this one replaces, when b is in the
 * reply). */
static void kept_tip(eng_engine *e, ereq *q, int32_t b) {
    if (q->ck_from >= 0 && !q->ck_from_tip) kv_ckpt_pass(e->kv, q->ck_from);
    q->ck_from = -1;
    if (q->seq.n_hashed * e->kv->cfg.block_size > q->n_prompt) {
        if (q->ck_roll >= 0 && q->ck_roll != b) kv_ckpt_drop(e->kv, q->ck_roll);
        q->ck_roll = b;
    }
}

static void release_seq(eng_engine *e, ereq *q, bool done) {
    if (e->p.prefix_cache) kv_seq_commit(e->kv, &q->seq, q->toks, q->n_toks);
    if (e->hybrid) {
        flush_ckpts(e);
        /* a sequence leaving at a block boundary (preempted, or a finished
         * reply that ends on one or crossed one in its last verify, if a next
         * turn may repeat it) keeps its state there as a checkpoint */
        int bs = e->kv->cfg.block_size;
        kv_seq *s = &q->seq;
        int32_t src, at = ckpt_src(e, q, &src);
        if (e->p.prefix_cache && at > 0 && s->n_hashed * bs == at && (!done || q->reply_tips || at <= q->n_prompt)) {
            int32_t b = s->blocks[s->n_hashed - 1];
            int32_t slot = kv_ckpt_take(e->kv, b, KV_CK_TIP);
            kv_ckpt_tag(e->kv, b, q->conv, at);
            hn_err err;
            if (slot >= 0 && model_state_copy(e->m, e->kv, 1, &src, &slot, &err)) kv_ckpt_drop(e->kv, b);
            else if (slot >= 0) kept_tip(e, q, b);
        }
        kv_seq_state_release(e->kv, s);
        q->ck_roll = q->ck_from = q->ck_at = -1;
    }
    kv_seq_truncate(e->kv, &q->seq, 0);
    hd_restart(e, q);
}

/* Hybrids: whether position p (a block boundary) is one of the prompt's
 * tips: the last block boundary at or before a point where the next turn's
 * prompt may stop repeating this one (eng_request.resume), or, when none is
 * given, the prompt's last full block. */
static bool tip_point(const eng_engine *e, const ereq *q, int32_t p) {
    int bs = e->kv->cfg.block_size;
    if (!q->n_tip_at) return p > 0 && p == q->n_prompt / bs * bs;
    for (int32_t i = 0; i < q->n_tip_at; i++)
        if (q->tip_at[i] == p) return true;
    return false;
}

/* Hybrids: whether the state after position p (a block boundary) of a
 * request's prompt is worth a checkpoint: the prompt's tips (tip_point) and
 * a geometric ladder back from its last full block (1, 2, 4, ... blocks
 * before, the last full block itself included), so that an edit anywhere
 * recomputes from a checkpoint not far before it. */
static bool ckpt_point(const eng_engine *e, const ereq *q, int32_t p) {
    int bs = e->kv->cfg.block_size;
    int32_t last = q->n_prompt / bs * bs;
    if (p <= 0 || p > last || p % bs) return false;
    if (tip_point(e, q, p)) return true;
    int32_t d = (last - p) / bs;
    return d == 0 || (d & (d - 1)) == 0;
}

/* The checkpoint point in (from, to) closest after from, or to (hybrid prefill chunks end there). */
static int32_t ckpt_cut(const eng_engine *e, const ereq *q, int32_t from, int32_t to) {
    int bs = e->kv->cfg.block_size;
    for (int32_t p = (from / bs + 1) * bs; p < to; p += bs)
        if (ckpt_point(e, q, p)) return p;
    return to;
}

static void running_remove(eng_engine *e, int32_t i) {
    memmove(e->running + i, e->running + i + 1, sizeof(ereq *) * (size_t)(e->n_running - i - 1));
    e->n_running--;
}

static void finish_running(eng_engine *e, int32_t i, eng_finish fin, hn_status st, const char *msg) {
    ereq *q = e->running[i];
    running_remove(e, i);
    release_seq(e, q, true);
    finish_free(e, q, fin, st, msg);
}

static void wait_push_head(eng_engine *e, ereq *q) {
    q->qnext = e->wait_head;
    e->wait_head = q;
    if (!e->wait_tail) e->wait_tail = q;
    e->n_waiting++;
}

static void wait_push_tail(eng_engine *e, ereq *q) {
    q->qnext = NULL;
    if (e->wait_tail) e->wait_tail->qnext = q;
    else e->wait_head = q;
    e->wait_tail = q;
    e->n_waiting++;
}

static ereq *wait_pop(eng_engine *e) {
    ereq *q = e->wait_head;
    if (!q) return NULL;
    e->wait_head = q->qnext;
    if (!e->wait_head) e->wait_tail = NULL;
    q->qnext = NULL;
    e->n_waiting--;
    return q;
}

/* ---- one step ---- */

static void handle_cancels(eng_engine *e) {
    for (int32_t i = e->n_running - 1; i >= 0; i--)
        if (atomic_load(&e->running[i]->cancel)) finish_running(e, i, ENG_FINISH_CANCELLED, HN_OK, NULL);
    ereq *keep_h = NULL, *keep_t = NULL;
    int32_t kept = 0;
    for (ereq *q = e->wait_head, *nx; q; q = nx) {
        nx = q->qnext;
        if (atomic_load(&q->cancel)) {
            kv_seq_truncate(e->kv, &q->seq, 0);
            finish_free(e, q, ENG_FINISH_CANCELLED, HN_OK, NULL);
            continue;
        }
        q->qnext = NULL;
        if (keep_t) keep_t->qnext = q;
        else keep_h = q;
        keep_t = q;
        kept++;
    }
    e->wait_head = keep_h;
    e->wait_tail = keep_t;
    e->n_waiting = kept;
}

static int32_t blocks_for(const eng_engine *e, int32_t n_tokens) {
    int bs = e->kv->cfg.block_size;
    return (n_tokens + bs - 1) / bs;
}

/* Takes cached blocks for the request's next positions; counts prompt
 * positions served from the cache on its first pass. */
static void match_prefix(eng_engine *e, ereq *q) {
    if (!e->p.prefix_cache) return;
    int32_t before = q->seq.n_tokens;
    int32_t got;
    if (e->hybrid) {
        /* the recurrent state is resumed only from a checkpoint, restored into the sequence's slot */
        int32_t slot = -1;
        if (q->seq.state < 0 || q->seq.state_len != q->seq.n_tokens) return;
        got = kv_seq_match_ckpt(e->kv, &q->seq, q->toks, q->n_toks - 1, &slot);
        hn_err err;
        if (got > 0 && model_state_copy(e->m, e->kv, 1, &slot, &q->seq.state, &err)) {
            kv_seq_truncate(e->kv, &q->seq, before);
            got = 0;
        }
        if (!q->conv) {
            /* resuming at a tip of a conversation continues it; its tips past
             * here belong to a branch its client left (a reply it re-rendered) */
            uint64_t c = got > 0 && before == 0 ? kv_ckpt_conv(e->kv, q->seq.blocks[q->seq.n_blocks - 1]) : 0;
            q->conv = c ? c : q->id;
            if (c) kv_ckpt_pass_past(e->kv, c, q->seq.n_tokens);
        }
        if (got > 0) {
            q->seq.state_len = q->seq.n_tokens;
            if (q->ck_from >= 0 && !q->ck_from_tip) kv_ckpt_pass(e->kv, q->ck_from); /* resumed deeper than before */
            q->ck_from = q->seq.blocks[q->seq.n_blocks - 1];
            q->ck_from_tip = false;
            /* a tip of this prompt that an earlier turn computed (where a user
             * message after a run of tool calls will diverge) stays kept, as
             * recently used as this request's own tips (the match passed it) */
            int bs = e->kv->cfg.block_size;
            for (int32_t i = 0; i < q->n_tip_at; i++) {
                int32_t p = q->tip_at[i];
                if (p <= before || p > q->seq.n_tokens) continue;
                kv_ckpt_touch(e->kv, q->seq.blocks[p / bs - 1], KV_CK_TIP);
                if (p == q->seq.n_tokens) q->ck_from_tip = true;
            }
        }
    } else {
        got = kv_seq_match(e->kv, &q->seq, q->toks, q->n_toks - 1);
    }
    if (got > 0 && hd_has(q) && q->hd_ok) {
        /* the hidden-state drafter's sequence takes the same prefix from its
         * own cache; one that cannot (evicted there) has no hidden states to
         * catch up with */
        int32_t n = q->seq.n_tokens;
        int32_t m = hd_len(q) != before ? -1
                    : q->mseq         ? mtp_seq_match(e->mtp, q->mseq, q->toks, n)
                                      : dfl_seq_match(e->dfl, q->fseq, q->toks, n);
        if (m != n) eng_hd_leave(e, q);
    }
    if (got > 0 && !q->resumed) {
        int32_t end = before + got < q->n_prompt ? before + got : q->n_prompt;
        int32_t cached = end > before ? end - before : 0;
        q->st.n_cached += cached;
        e->cached_tokens += (uint64_t)cached;
    }
}

static void admit(eng_engine *e) {
    while (e->wait_head && e->n_running < e->p.max_running) {
        ereq *q = e->wait_head;
        hn_err serr;
        if (e->hybrid && kv_seq_state_acquire(e->kv, &q->seq, &serr)) break; /* no state slot: wait */
        match_prefix(e, q);
        int32_t rem = q->n_toks - q->seq.n_tokens;
        int32_t chunk = rem < e->p.step_tokens ? rem : e->p.step_tokens;
        int32_t need = blocks_for(e, q->seq.n_tokens + chunk) - q->seq.n_blocks + e->n_running;
        if (e->n_running > 0 && kv_n_free(e->kv) < need) {
            kv_seq_truncate(e->kv, &q->seq, 0); /* keep nothing pinned while it waits */
            if (e->hybrid) kv_seq_state_release(e->kv, &q->seq);
            hd_restart(e, q);
            q->ck_from = -1;
            if (!q->resumed) {
                e->cached_tokens -= (uint64_t)q->st.n_cached;
                q->st.n_cached = 0;
            }
            break;
        }
        wait_pop(e);
        q->admit_order = ++e->admit_counter;
        e->running[e->n_running++] = q;
    }
}

/* Pushes the most recently admitted running request back to the queue. */
static void preempt_one(eng_engine *e) {
    int32_t v = 0;
    for (int32_t i = 1; i < e->n_running; i++)
        if (e->running[i]->admit_order > e->running[v]->admit_order) v = i;
    ereq *q = e->running[v];
    running_remove(e, v);
    release_seq(e, q, false);
    q->resumed = true;
    wait_push_head(e, q);
    e->preemptions++;
}

/* Plans the batch; returns its token count (0: nothing to run). Preempts
 * (and restarts planning) when the pool cannot hold a planned chunk. */
static int32_t plan(eng_engine *e, int32_t *n_seqs_out) {
    hn_err err;
restart:;
    int32_t n = 0, n_seqs = 0, n_hash = 0, n_rows = 0;
    int32_t budget = e->p.step_tokens;
    /* speculation: the step's decode rows and context, for the controller */
    int32_t spec_left = e->spec_rows, spec_rows = 0, spec_ctx = 0;
    double spec_toks = 0;
    e->spare_used = 0;
    for (int32_t i = 0; i < e->n_running; i++) {
        ereq *q = e->running[i];
        q->logit_row = -1;
        q->n_draft = 0;
        q->snap0 = -1;
        q->row0 = -1;
        if (q->n_toks - q->seq.n_tokens == 1) {
            spec_rows++;
            if (q->n_toks > spec_ctx) spec_ctx = q->n_toks;
        }
    }
    spec_toks = spec_rows;
    for (int pass = 0; pass < 2; pass++) {
        for (int32_t i = 0; i < e->n_running; i++) {
            ereq *q = e->running[i];
            /* pass 0: decoding requests (one token each); pass 1: prefill chunks */
            if ((pass == 0) != (q->n_toks - q->seq.n_tokens == 1)) continue;
            if (pass == 1) match_prefix(e, q);
            int32_t rem = q->n_toks - q->seq.n_tokens;
            int32_t chunk = 1;
            if (pass == 0 && e->spec)
                chunk += eng_choose_draft(e, q, &spec_left, &spec_rows, &spec_toks, spec_ctx);
            if (pass == 1) {
                if (budget <= 0) break;
                uint64_t h = e->p.prefix_cache ? kv_seq_next_hash(e->kv, &q->seq, q->toks, q->n_toks - 1) : 0;
                bool dup = false;
                for (int32_t j = 0; j < n_hash && h; j++)
                    if (e->b_hash[j] == h) {
                        dup = true;
                        /* hybrids: the shared chunk's end gets a checkpoint, so this request can resume there */
                        e->b_hash_req[j]->ck_at = e->b_hash_req[j]->plan_end;
                    }
                if (dup) continue; /* another request computes this block now; take it from the cache next step */
                if (h) {
                    e->b_hash_req[n_hash] = q;
                    e->b_hash[n_hash++] = h;
                }
                chunk = rem < budget ? rem : budget;
                if (chunk < rem) { /* end on a block boundary so the chunk's blocks can be published */
                    int bs = e->kv->cfg.block_size;
                    int32_t end = (q->seq.n_tokens + chunk) / bs * bs;
                    if (end > q->seq.n_tokens) chunk = end - q->seq.n_tokens;
                }
                if (e->hybrid && e->p.prefix_cache) /* end exactly where a checkpoint is wanted */
                    chunk = ckpt_cut(e, q, q->seq.n_tokens, q->seq.n_tokens + chunk) - q->seq.n_tokens;
            }
            hn_status rst = kv_seq_reserve(e->kv, &q->seq, q->seq.n_tokens + chunk, &err);
            if (rst != HN_OK && q->n_draft > 0) { /* no room for the draft: plain decoding, no preemption for it */
                kv_seq_truncate(e->kv, &q->seq, q->seq.n_tokens);
                if (q->snap0 >= 0) { /* its snapshot slots were the last taken */
                    e->spare_used = q->snap0;
                    q->snap0 = -1;
                }
                spec_left += q->n_draft;
                q->n_draft = 0;
                chunk = 1;
                rst = kv_seq_reserve(e->kv, &q->seq, q->seq.n_tokens + chunk, &err);
            }
            if (rst == HN_ERR_RANGE) { /* cannot happen within n_ctx; end it rather than preempt others */
                finish_running(e, i, ENG_FINISH_ERROR, rst, err.msg);
                goto restart;
            }
            if (rst != HN_OK) {
                if (e->n_running == 1) {
                    /* alone and still no room: this sequence cannot fit the pool */
                    finish_running(e, i, ENG_FINISH_ERROR, HN_ERR_FULL, "the KV cache is too small for this request");
                    return 0;
                }
                preempt_one(e);
                goto restart;
            }
            q->plan_end = q->seq.n_tokens + chunk;
            q->row0 = n;
            q->L0 = q->seq.n_tokens;
            for (int32_t t = 0; t < chunk; t++) {
                /* a drafted block: the decode token, then the draft, every row's logits wanted */
                e->b_tok[n + t] = q->n_draft && t > 0 ? q->draft[t - 1] : q->toks[q->seq.n_tokens + t];
                e->b_pos[n + t] = q->seq.n_tokens + t;
                e->b_sid[n + t] = n_seqs;
                e->b_want[n + t] = q->n_draft > 0;
                /* hybrids: the state after each verified row but the last (the live slot's) kept */
                e->b_snap[n + t] = q->snap0 >= 0 && t < chunk - 1 ? e->spare[q->snap0 + t] : -1;
            }
            if (q->n_draft > 0) {
                q->logit_row = n_rows;
                n_rows += chunk;
            } else if (q->seq.n_tokens + chunk == q->n_toks) {
                e->b_want[n + chunk - 1] = true;
                q->logit_row = n_rows++;
            }
            e->b_seqs[n_seqs] = &q->seq;
            e->b_rowwise[n_seqs] = q->n_draft > 0;
            /* prompt rows are computed alike however the prompt is cut (its cuts follow the others' load) */
            e->b_prompt[n_seqs] = q->n_draft == 0 && q->seq.n_tokens < q->n_prompt;
            q->chunk = chunk;
            e->b_req[n_seqs++] = q;
            n += chunk;
            budget -= chunk - q->n_draft;
        }
    }
    *n_seqs_out = n_seqs;
    return n;
}

/* Samples the next token of a request from its logits row; returns false if
 * the request finished (the caller removes it). */
/* Delivers a sampled token (the constraint's accept, the penalty history,
 * the drafter, events, stop checks); returns false if the request finished. */
bool eng_deliver(eng_engine *e, ereq *q, int32_t tok, eng_finish *fin, hn_status *st, const char **msg) {
    if (tok < 0) {
        *fin = ENG_FINISH_ERROR;
        *st = HN_ERR_INVALID;
        *msg = "no token is allowed by the constraint";
        return false;
    }
    if (q->r.accept) q->r.accept(q->r.mask_ctx, tok);
    smp_accept(q->smp, tok);
    double now = hn_now_ms();
    if (!q->sampled) {
        q->sampled = true;
        q->st.t_first_ms = now - q->t_submit;
        hist_add(e->ttft_hist, eng_ttft_bounds_ms, &e->ttft_sum_ms, q->st.t_first_ms);
    } else {
        hist_add(e->itl_hist, eng_itl_bounds_ms, &e->itl_sum_ms, now - q->t_last);
    }
    q->t_last = now;
    if (!q->r.ignore_eog && tok_is_eog(e->vocab, tok)) {
        *fin = ENG_FINISH_EOG;
        return false;
    }
    q->toks[q->n_toks++] = tok;
    if (q->sfx) {
        hn_err err;
        if (sfx_append(q->sfx, tok, &err)) { /* out of memory: this request stops drafting */
            sfx_free(q->sfx);
            q->sfx = NULL;
        }
    }
    q->n_gen++;
    q->st.n_generated = q->n_gen;
    e->generated_tokens++;
    emit_token(q, tok);
    if (q->max_gen > 0 && q->n_gen >= q->max_gen) {
        *fin = ENG_FINISH_LENGTH;
        return false;
    }
    if (q->n_toks > e->n_ctx) {
        *fin = ENG_FINISH_CONTEXT;
        return false;
    }
    return true;
}

static bool take_token(eng_engine *e, ereq *q, float *row, eng_finish *fin, hn_status *st, const char **msg) {
    /* a constraint's bitmask was applied to this row in the step (model_step's masks) */
    return eng_deliver(e, q, smp_sample(q->smp, row), fin, st, msg);
}

/* Hybrids, after a step: a request at a published block boundary takes a
 * checkpoint there, of the kind that says how long the budget keeps it
 * (kv_ck_kind): in the prompt, a tip at its last full block (where the next
 * turn diverges), ladder ones at the other checkpoint points and at the end
 * of a chunk others wait for (they resume from it at once), and a branch
 * point at the end of a chunk that is shared (another sequence holds the
 * block) where the cached prefix stops (the end of a common prefix so far);
 * during the reply a rolling tip (each replaces the previous), so that a
 * finished reply leaves the state of its last full block. The copies run
 * together after the step's sampling. */
static void want_ckpt(eng_engine *e, ereq *q) {
    int bs = e->kv->cfg.block_size;
    kv_seq *s = &q->seq;
    int32_t src, n = ckpt_src(e, q, &src); /* a verify step may have crossed the boundary (a snapshot's state) */
    if (n <= 0 || s->n_hashed * bs != n) return;
    int32_t b = s->blocks[s->n_hashed - 1];
    int kind = KV_CK_TIP;
    if (n <= q->n_prompt) {
        kind = -1;
        if (ckpt_point(e, q, n) || n == q->ck_at) kind = tip_point(e, q, n) ? KV_CK_TIP : KV_CK_LADDER;
        if (kv_block_refs(e->kv, b) >= 2 && !kv_seq_next_cached(e->kv, s, q->toks, q->n_prompt)) kind = KV_CK_BRANCH;
        if (kind < 0) return;
    } else if (!q->reply_tips) {
        return; /* no likely next turn repeats the reply */
    }
    int32_t slot = kv_ckpt_take(e->kv, b, (kv_ck_kind)kind);
    if (kind == KV_CK_TIP) kv_ckpt_tag(e->kv, b, q->conv, n); /* also when it only raised one there */
    if (slot < 0) return;
    if (kind == KV_CK_TIP) kept_tip(e, q, b);
    e->ck_src[e->n_ck] = src;
    e->ck_dst[e->n_ck++] = slot;
}

static void debug_check(eng_engine *e) {
    int n = 0;
    for (int32_t i = 0; i < e->n_running; i++) e->chk[n++] = &e->running[i]->seq;
    hn_err err;
    hn_status st = kv_check(e->kv, e->chk, n, &err);
    if (!st && (e->mtp || e->dfl)) { /* the drafter's cache, and each following sequence's length is its request's */
        n = 0;
        for (int32_t i = 0; i < e->n_running; i++) {
            const ereq *q = e->running[i];
            if (q->mseq) e->chk[n++] = mtp_seq_kv(q->mseq);
            if (q->fseq) e->chk[n++] = dfl_seq_kv(q->fseq);
        }
        st = e->mtp ? mtp_check(e->mtp, e->chk, n, &err) : dfl_check(e->dfl, e->chk, n, &err);
        for (ereq *q = e->wait_head; q && !st; q = q->qnext) { /* waiting requests hold no blocks there either */
            int32_t nb = q->mseq ? mtp_seq_kv(q->mseq)->n_blocks : q->fseq ? dfl_seq_kv(q->fseq)->n_blocks : 0;
            if (nb) st = hn_errf(&err, HN_ERR_INTERNAL, "waiting request %llu holds %d drafter blocks", (unsigned long long)q->id, (int)nb);
        }
        for (int32_t i = 0; i < e->n_running && !st; i++) {
            ereq *q = e->running[i];
            if (hd_has(q) && q->hd_ok && hd_len(q) != q->seq.n_tokens)
                st = hn_errf(&err, HN_ERR_INTERNAL, "request %llu: its drafter sequence holds %d positions, it %d",
                             (unsigned long long)q->id, (int)hd_len(q), (int)q->seq.n_tokens);
        }
    }
    /* waiting requests hold no blocks */
    for (ereq *q = e->wait_head; q && !st; q = q->qnext)
        if (q->seq.n_blocks) st = hn_errf(&err, HN_ERR_INTERNAL, "waiting request %llu holds %d blocks",
                                          (unsigned long long)q->id, (int)q->seq.n_blocks);
    if (st) {
        if (!e->check_failures) snprintf(e->check_error, sizeof e->check_error, "%.150s", err.msg);
        e->check_failures++;
    }
}

static void step(eng_engine *e) {
    handle_cancels(e);
    admit(e);
    if (e->drf) eng_model_drafts(e);
    int32_t n_seqs = 0;
    int32_t n = plan(e, &n_seqs);
    if (n > 0) {
        double t = hn_now_ms();
        for (int32_t s = 0; s < n_seqs; s++)
            if (!e->b_req[s]->started) {
                e->b_req[s]->started = true;
                e->b_req[s]->st.t_queued_ms = t - e->b_req[s]->t_submit;
            }
        step_batch b = {.n_tokens = n, .token = e->b_tok, .pos = e->b_pos, .seq_id = e->b_sid,
                        .want_logits = e->b_want, .rowwise = e->b_rowwise, .prompt = e->b_prompt, .state_snap = e->hybrid ? e->b_snap : NULL,
                        .seqs = e->b_seqs, .n_seqs = n_seqs};
        hn_err err;
        /* constraints: each wanted row's allowed-token bitmask, applied on the backend */
        bool any_mask = false;
        bool any_draft = false;
        for (int32_t i = 0; i < e->n_running; i++) {
            ereq *q = e->running[i];
            if (q->logit_row < 0) continue;
            e->masks[q->logit_row] = q->r.allowed ? q->r.allowed(q->r.mask_ctx) : NULL;
            any_mask |= e->masks[q->logit_row] != NULL;
            /* drafted rows: their masks depend on the tokens before them (applied on the host in verify) */
            for (int32_t j = 1; j <= q->n_draft; j++) e->masks[q->logit_row + j] = NULL;
            any_draft |= q->n_draft > 0;
        }
        double t0 = hn_now_ms();
        hn_status st = plan_build(&e->splan, e->kv, &b, e->n_vocab, model_max_logits(e->m), &err);
        if (st == HN_OK) st = model_step(e->m, e->kv, &e->splan, any_mask ? e->masks : NULL, &err);
        if (st == HN_OK) plan_finish(&e->splan);
        int32_t spec_ctx = 0; /* the controller's cost table: this step's rows and context */
        for (int32_t s = 0; e->spec && st == HN_OK && s < e->splan.n_seqs; s++)
            if (e->splan.seq_len[s] > spec_ctx) spec_ctx = e->splan.seq_len[s];
        const float *logits = model_logits(e->m);
        e->steps++;
        if (st != HN_OK) {
            /* should not happen (blocks were reserved): fail the batch, keep the engine alive */
            for (int32_t s = 0; s < n_seqs; s++) {
                for (int32_t i = 0; i < e->n_running; i++)
                    if (e->running[i] == e->b_req[s]) {
                        finish_running(e, i, ENG_FINISH_ERROR, st, err.msg);
                        break;
                    }
            }
        } else {
            e->computed_tokens += (uint64_t)n;
            for (int32_t s = 0; s < n_seqs; s++) e->b_req[s]->n_computed += e->b_req[s]->chunk;
            for (int32_t i = 0; i < e->n_running;) {
                ereq *q = e->running[i];
                eng_finish fin = ENG_FINISH_NONE;
                hn_status fst = HN_OK;
                const char *msg = NULL;
                bool go = true;
                if (q->logit_row >= 0) {
                    float *row = (float *)logits + (size_t)q->logit_row * (size_t)e->n_vocab;
                    go = q->n_draft > 0 ? eng_verify(e, q, row, &fin, &fst, &msg) : take_token(e, q, row, &fin, &fst, &msg);
                    q->logit_row = -1;
                }
                if (!go) {
                    finish_running(e, i, fin, fst, msg);
                    continue;
                }
                if (e->p.prefix_cache) kv_seq_commit(e->kv, &q->seq, q->toks, q->seq.n_tokens);
                if (e->hybrid && e->p.prefix_cache) want_ckpt(e, q);
                q->snap0 = -1; /* the spare slots are the next step's */
                i++;
            }
            flush_ckpts(e);
            if (e->spec) { /* the step's wall time, sampling and verification included */
                spc_cost_record(&e->cost, spec_ctx, n, hn_now_ms() - t0);
                e->spec_verify_steps += any_draft;
            }
            if (e->mtp || e->dfl) eng_hd_drafts(e); /* the MTP layer or DFlash reads this step's hidden states: now */
        }
    }
    if (e->p.debug_check) debug_check(e);
}

/* ---- the engine thread ---- */

/* The request's row of eng_get_sessions (mutex held, engine thread). */
static void snap_request(eng_engine *e, ereq *q, bool running, double now) {
    eng_session *v = &q->snap;
    v->state = !running ? ENG_SESS_QUEUED : q->n_toks - q->seq.n_tokens == 1 ? ENG_SESS_DECODE : ENG_SESS_PREFILL;
    v->n_ctx = q->seq.n_tokens;
    v->n_tokens = q->n_toks;
    v->n_cached = q->st.n_cached;
    v->n_generated = q->n_gen;
    v->n_computed = q->n_computed;
    v->blocks_own = v->blocks_shared = 0;
    v->bytes_shared = 0;
    const size_t bb = e->kv->block_bytes;
    for (int32_t i = 0; i < q->seq.n_blocks; i++) {
        int32_t r = kv_block_refs(e->kv, q->seq.blocks[i]);
        if (r <= 1) v->blocks_own++;
        else {
            v->blocks_shared++;
            v->bytes_shared += (double)bb / (double)r;
        }
    }
    v->bytes_own = (size_t)v->blocks_own * bb;
    v->state_bytes = q->seq.state >= 0 ? e->kv->state_slot_bytes : 0;
    double since = q->sampled ? now - q->st.t_first_ms - q->t_submit : 0;
    v->tok_per_s = since > 0 && q->n_gen > 1 ? (q->n_gen - 1) * 1000.0 / since : 0;
    v->age_ms = now - q->t_submit;
}

static void publish_stats(eng_engine *e) {
    kv_stats ks;
    kv_get_stats(e->kv, &ks);
    double now = hn_now_ms();
    pthread_mutex_lock(&e->mu);
    for (int32_t i = 0; i < e->n_running; i++) snap_request(e, e->running[i], true, now);
    for (ereq *q = e->wait_head; q; q = q->qnext) snap_request(e, q, false, now);
    eng_stats *s = &e->stats;
    s->scratch_bytes = model_scratch_bytes(e->m);
    if (s->scratch_bytes > s->scratch_peak_bytes) s->scratch_peak_bytes = s->scratch_bytes;
    s->blocks_total = ks.blocks_backed;
    s->blocks_used = ks.blocks_used;
    s->blocks_cached = ks.blocks_cached;
    s->blocks_free = ks.blocks_free;
    s->kv_bytes = ks.bytes + ks.meta_bytes;
    s->kv_peak_bytes = ks.total_peak_bytes;
    s->prompt_tokens = e->prompt_tokens;
    s->cached_tokens = e->cached_tokens;
    s->generated_tokens = e->generated_tokens;
    s->n_running = e->n_running;
    s->n_waiting = e->n_waiting + e->n_incoming;
    s->blocks_max = ks.blocks_max;
    s->block_size = e->kv->cfg.block_size;
    s->block_bytes = e->kv->block_bytes;
    s->computed_tokens = e->computed_tokens;
    s->evictions = ks.evictions;
    s->preemptions = e->preemptions;
    s->steps = e->steps;
    s->check_failures = e->check_failures;
    s->engine_bytes = e->engine_bytes;
    s->model_bytes = e->model_bytes;
    s->model_file_bytes = e->model_file_bytes;
    s->moe_apart_layers = model_moe_remote_layers(e->m);
    s->moe_apart_bytes = e->moe_apart_bytes;
    s->kv_type = e->p.kv_type;
    memcpy(s->finished, e->finished, sizeof s->finished);
    memcpy(s->ttft_hist, e->ttft_hist, sizeof s->ttft_hist);
    memcpy(s->itl_hist, e->itl_hist, sizeof s->itl_hist);
    s->ttft_sum_ms = e->ttft_sum_ms;
    s->itl_sum_ms = e->itl_sum_ms;
    memcpy(s->check_error, e->check_error, sizeof s->check_error);
    s->state_bytes = ks.state_bytes;
    s->state_peak_bytes = ks.state_peak_bytes;
    s->state_slot_bytes = e->kv->state_slot_bytes;
    s->ckpts = ks.ckpts;
    s->ckpt_max = ks.ckpt_max;
    s->ckpt_hits = ks.ckpt_hits;
    s->spec = e->spec;
    s->spec_drafted = e->spec_drafted;
    s->spec_accepted = e->spec_accepted;
    s->spec_verify_steps = e->spec_verify_steps;
    if (e->drf) {
        drf_stats ds;
        drf_get_stats(e->drf, &ds);
        s->draft_loaded = true;
        s->draft_model_bytes = ds.model_bytes;
        s->draft_file_bytes = ds.file_bytes;
        s->draft_kv_bytes = ds.kv_bytes;
        s->draft_kv_peak_bytes = ds.kv_peak_bytes;
        s->draft_steps = ds.steps;
        s->draft_tokens = ds.tokens;
        s->draft_drafted = ds.drafted;
    }
    if (e->mtp) {
        mtp_stats ms;
        mtp_get_stats(e->mtp, &ms);
        s->mtp_loaded = true;
        s->mtp_kv_bytes = ms.kv_bytes;
        s->mtp_kv_peak_bytes = ms.kv_peak_bytes;
        s->mtp_steps = ms.steps;
        s->mtp_tokens = ms.tokens;
        s->mtp_drafted = ms.drafted;
        s->mtp_left_out = e->hd_off;
    }
    if (e->dfl) {
        dfl_stats fs;
        dfl_get_stats(e->dfl, &fs);
        s->dflash_loaded = true;
        s->dflash_kv_bytes = fs.kv_bytes;
        s->dflash_kv_peak_bytes = fs.kv_peak_bytes;
        s->dflash_steps = fs.steps;
        s->dflash_tokens = fs.tokens;
        s->dflash_blocks = fs.blocks;
        s->dflash_drafted = fs.drafted;
        s->dflash_left_out = e->hd_off;
    }
    pthread_mutex_unlock(&e->mu);
}

/* Gives the model's scratch back down to one token (idle: nothing runs; the
 * next step grows it again). A failure only leaves it to the next step. */
static void scratch_trim(eng_engine *e) {
    hn_err err = {0};
    (void)model_scratch_trim(e->m, &err);
}

static void *engine_main(void *arg) {
    eng_engine *e = arg;
    double idle_since = hn_now_ms();
    bool trimmed = true;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (e->in_head) {
            ereq *q = e->in_head;
            e->in_head = q->qnext;
            e->n_incoming--;
            wait_push_tail(e, q);
        }
        e->in_tail = NULL;
        bool stop = e->stop;
        uint64_t trim = e->trim_req;
        bool busy = e->n_running > 0 || e->n_waiting > 0;
        if (!stop && !busy && trim == e->trim_done) {
            /* idle: sleep until work, or until the idle timer drops the cache */
            if (!trimmed && e->p.cache_idle_ms > 0 && hn_now_ms() - idle_since >= e->p.cache_idle_ms) {
                pthread_mutex_unlock(&e->mu);
                kv_trim(e->kv, 0);
                if (e->drf) drf_trim(e->drf);
                if (e->mtp) mtp_trim(e->mtp);
                if (e->dfl) dfl_trim(e->dfl);
                scratch_trim(e);
                trimmed = true;
                publish_stats(e);
                continue;
            }
            struct timespec ts;
            hn_deadline_ms(&ts, trimmed || e->p.cache_idle_ms <= 0 ? 1000 : 200);
            pthread_cond_timedwait(&e->cv, &e->mu, &ts);
            pthread_mutex_unlock(&e->mu);
            continue;
        }
        pthread_mutex_unlock(&e->mu);
        if (stop) break;
        if (trim != e->trim_done) {
            kv_trim(e->kv, 0);
            if (e->drf) drf_trim(e->drf);
            if (e->mtp) mtp_trim(e->mtp);
            if (e->dfl) dfl_trim(e->dfl);
            scratch_trim(e);
            publish_stats(e);
            pthread_mutex_lock(&e->mu);
            e->trim_done = trim;
            pthread_cond_broadcast(&e->trim_cv);
            pthread_mutex_unlock(&e->mu);
            continue;
        }
        step(e);
        if (e->n_running == 0 && e->n_spare > 0) eng_spares_release(e);
        publish_stats(e);
        if (e->n_running == 0 && e->n_waiting == 0) {
            idle_since = hn_now_ms();
            trimmed = false;
        }
    }
    /* stopping: every request still here ends as cancelled */
    while (e->n_running > 0) finish_running(e, e->n_running - 1, ENG_FINISH_CANCELLED, HN_OK, NULL);
    for (ereq *q; (q = wait_pop(e));) {
        kv_seq_truncate(e->kv, &q->seq, 0);
        finish_free(e, q, ENG_FINISH_CANCELLED, HN_OK, NULL);
    }
    pthread_mutex_lock(&e->mu);
    ereq *q = e->in_head;
    e->in_head = e->in_tail = NULL;
    e->n_incoming = 0;
    e->trim_done = e->trim_req;
    pthread_cond_broadcast(&e->trim_cv);
    pthread_mutex_unlock(&e->mu);
    while (q) {
        ereq *nx = q->qnext;
        finish_free(e, q, ENG_FINISH_CANCELLED, HN_OK, NULL);
        q = nx;
    }
    publish_stats(e);
    return NULL;
}

/* ---- create / free ---- */

static size_t default_kv_bytes(void) {
    long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || psize <= 0) return (size_t)4 << 30;
    return (size_t)pages * (size_t)psize / 4;
}

/* The draft file, when it is a DFlash drafter (general.architecture
 * dflash): kept open in e->dfl_g for the model to load with the target.
 * --spec dflash takes nothing else, --spec draft refuses one; in auto mode
 * it takes the draft model's place. */
static hn_status open_dflash(eng_engine *e, const eng_params *p, hn_err *err) {
    gguf_ctx *g = NULL;
    hn_status st = gguf_open(p->draft_path, &g, err);
    if (st) {
        if (p->spec != ENG_SPEC_DFLASH) return HN_OK; /* the draft model's own load says why */
        char msg[sizeof err->msg];
        snprintf(msg, sizeof msg, "%s", err ? err->msg : "");
        return hn_errf(err, st, "engine: DFlash drafter %s: %s", p->draft_path, msg);
    }
    const char *arch = gguf_get_str(g, "general.architecture");
    bool dflash = arch && !strcmp(arch, "dflash");
    if (p->spec == ENG_SPEC_DFLASH && !dflash) {
        st = hn_errf(err, HN_ERR_UNSUPPORTED,
                     "engine: --spec dflash needs a DFlash drafter; %s is a '%s' model, not general.architecture "
                     "dflash (a draft model goes with --spec draft)",
                     p->draft_path, arch ? arch : "(none)");
    } else if (p->spec == ENG_SPEC_DRAFT && dflash) {
        st = hn_errf(err, HN_ERR_UNSUPPORTED,
                     "engine: %s is a DFlash drafter (general.architecture dflash), not a draft model: use --spec "
                     "dflash (or auto)",
                     p->draft_path);
    }
    if (st || !dflash) {
        gguf_close(g);
        return st;
    }
    e->dfl_g = g;
    return HN_OK;
}

/* The DFlash drafter, once the model loaded it: its vocabulary must be the
 * target's; its own KV pool has as many blocks as the target's, one
 * sequence per request. */
static hn_status dflash_setup(eng_engine *e, const eng_params *p, const kv_config *kc, size_t nb, hn_err *err) {
    tok_vocab *dv = NULL;
    hn_status st = tok_load(e->dfl_g, &dv, err);
    if (!st) st = drf_same_vocab(e->vocab, dv, "DFlash drafter", p->draft_path, err);
    tok_free(dv);
    if (st) {
        if (st != HN_ERR_UNSUPPORTED) {
            char msg[sizeof err->msg];
            snprintf(msg, sizeof msg, "%s", err ? err->msg : "");
            st = hn_errf(err, HN_ERR_UNSUPPORTED, "engine: DFlash drafter %s: its tokenizer: %s", p->draft_path, msg);
        }
        return st;
    }
    dfl_params fp = {.n_ctx = e->n_ctx, .max_seqs = p->max_running, .n_blocks = (int32_t)nb,
                     .block_size = p->block_size, .k_type = kc->type, .v_type = kc->v_type,
                     .prefix_cache = p->prefix_cache};
    if ((st = dfl_new(e->m, &fp, &e->dfl, err))) return st;
    if ((st = spc_cost_init(&e->dcal, 1, err))) return st;
    e->fjobs = hn_calloc((size_t)p->max_running, sizeof *e->fjobs);
    e->mreq = hn_calloc((size_t)p->max_running, sizeof *e->mreq);
    if (!e->fjobs || !e->mreq) return hn_errf(err, HN_ERR_NOMEM, "engine: out of memory");
    /* the cost prior: a block forward's weight bytes over the target's */
    e->draft_ratio = e->model_file_bytes ? (double)model_dflash(e->m)->weight_bytes / (double)e->model_file_bytes : 1;
    return HN_OK;
}

hn_status eng_create(const eng_params *pin, eng_engine **out, hn_err *err) {
    *out = NULL;
    if (!pin || !pin->model_path) return hn_errf(err, HN_ERR_INVALID, "engine: no model path");
    eng_params p = *pin;
    const size_t bytes0 = hn_alloc_bytes();
    if (p.step_tokens <= 0) {
        const char *dev = be_resolve(p.device);
        p.step_tokens = dev && strcmp(dev, "cpu") ? ENG_DEFAULT_STEP_GPU : ENG_DEFAULT_STEP;
    }
    if (p.max_running <= 0) p.max_running = ENG_DEFAULT_RUNNING;
    if (p.cache_idle_ms == 0) p.cache_idle_ms = ENG_DEFAULT_IDLE_MS;
    if (p.kv_max_bytes == 0) p.kv_max_bytes = default_kv_bytes();
    if (p.step_tokens > 1 << 16 || p.max_running > 1024 || p.block_size < 0 || p.block_size > 4096 ||
        p.kv_type < 0 || p.kv_type > ENG_KV_K8V4 || p.n_ctx < 0)
        return hn_errf(err, HN_ERR_INVALID, "engine: bad parameters");
    eng_engine *e = hn_calloc(1, sizeof *e);
    if (!e) return hn_errf(err, HN_ERR_NOMEM, "engine: out of memory");
    e->p = p;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    pthread_cond_init(&e->trim_cv, NULL);
    if (p.spec < ENG_SPEC_OFF || p.spec > ENG_SPEC_DFLASH || p.spec_max_draft < 0) {
        eng_free(e);
        return hn_errf(err, HN_ERR_INVALID, "engine: bad speculation parameters");
    }
    if (p.spec == ENG_SPEC_DRAFT && !p.draft_path) {
        eng_free(e);
        return hn_errf(err, HN_ERR_INVALID, "engine: --spec draft needs a draft model (--draft FILE)");
    }
    if (p.spec == ENG_SPEC_DFLASH && !p.draft_path) {
        eng_free(e);
        return hn_errf(err, HN_ERR_INVALID, "engine: --spec dflash needs a DFlash drafter (--draft FILE, a GGUF of "
                                            "general.architecture dflash)");
    }
    hn_status st;
    if (p.draft_path && (p.spec == ENG_SPEC_DRAFT || p.spec == ENG_SPEC_AUTO || p.spec == ENG_SPEC_DFLASH) &&
        (st = open_dflash(e, &p, err))) {
        eng_free(e);
        return st;
    }
    e->spec = p.spec;
    e->spec_max = p.spec_max_draft > 0 ? p.spec_max_draft : ENG_SPEC_DEFAULT;
    if (e->spec_max > ENG_SPEC_MAX) e->spec_max = ENG_SPEC_MAX;
    /* drafted rows per step beyond one per running request: logits rows too */
    e->spec_rows = !e->spec ? 0 : 64;
    e->cap_batch = p.step_tokens + p.max_running + e->spec_rows;
    model_params mp = {.n_threads = p.n_threads, .max_batch = e->cap_batch, .max_seqs = p.max_running,
                       .max_logits = p.max_running + e->spec_rows, .device = p.device,
                       .scratch_fixed = p.scratch_fixed, .cpu_moe = p.cpu_moe, .mem_budget = p.mem_budget,
                       .n_ranks = p.n_ranks,
                       /* the MTP layer's hidden states, when the model has one and may draft with it */
                       .mtp = p.spec == ENG_SPEC_MTP || (p.spec == ENG_SPEC_AUTO && !p.draft_path),
                       /* a DFlash drafter given as the draft file: loaded with the model, which taps its layers */
                       .dflash = e->dfl_g};
    const size_t bytes_m = hn_alloc_bytes();
    st = model_load(p.model_path, &mp, &e->m, err);
    if (st && e->dfl_g) {
        char msg[sizeof err->msg];
        snprintf(msg, sizeof msg, "%s", err ? err->msg : "");
        hn_errf(err, st, "engine: DFlash drafter %s with the target %s: %s", p.draft_path, p.model_path, msg);
    }
    if (st) goto fail;
    if (p.on_load && (st = p.on_load(p.on_load_ctx, e->m, err))) goto fail;
    e->model_bytes = hn_alloc_bytes() - bytes_m;
    for (int64_t i = 0; i < gguf_n_tensors(model_gguf(e->m)); i++)
        e->model_file_bytes += gguf_tensor_at(model_gguf(e->m), i)->nbytes;
    {
        size_t on_main;
        model_weight_bytes(e->m, &on_main, &e->moe_apart_bytes);
    }
    st = tok_load(model_gguf(e->m), &e->vocab, err);
    if (st) goto fail;
    const model_hparams *hp = model_hp(e->m);
    e->n_vocab = hp->n_vocab;
    e->n_ctx = p.n_ctx > 0 ? p.n_ctx : hp->n_ctx_train > 0 ? hp->n_ctx_train : 4096;
    kv_config kc = model_kv_config(e->m, 1, p.block_size);
    static const qt_type kt[4] = {QT_F32, QT_F16, QT_Q8_0, QT_Q8_0}, vt[4] = {QT_F32, QT_F16, QT_Q8_0, QT_Q4_1};
    kc.type = kt[p.kv_type];
    kc.v_type = vt[p.kv_type];
    size_t bb = kv_block_bytes(&kc);
    if (!bb) {
        st = hn_errf(err, HN_ERR_UNSUPPORTED, "engine: KV type %s does not fit head dim %d", eng_kv_type_name(p.kv_type),
                     (int)hp->head_dim);
        goto fail;
    }
    /* --vram: the KV pool gets what the model leaves of the budget on its device */
    const size_t main_b = p.mem_budget ? model_main_bytes(e->m) : 0;
    if (main_b) {
        const size_t left = p.mem_budget > main_b ? p.mem_budget - main_b : 0;
        if (left < p.kv_max_bytes) p.kv_max_bytes = left;
    }
    size_t nb = p.kv_max_bytes / bb;
    if (nb < 2) nb = 2;
    if (nb > (1u << 26)) nb = 1u << 26;
    kc.n_blocks = (int32_t)nb;
    e->hybrid = hp->hybrid;
    if (e->spec == ENG_SPEC_MTP && !model_has_mtp(e->m)) {
        st = hn_errf(err, HN_ERR_UNSUPPORTED,
                     "engine: --spec mtp needs a model with an MTP (nextn) layer; %s (%s) has none%s", p.model_path,
                     hp->arch_name, hp->n_nextn > 0 ? " that hone can run" : "");
        goto fail;
    }
    if (e->spec && (st = spc_cost_init(&e->cost, e->cap_batch, err))) goto fail;
    if (model_has_mtp(e->m)) {
        /* the MTP layer: its own KV pool with as many blocks as the target's
         * (a block of one layer), one sequence per request */
        mtp_params mq = {.n_ctx = e->n_ctx, .max_seqs = p.max_running, .max_draft = e->spec_max, .n_blocks = (int32_t)nb,
                         .block_size = p.block_size, .k_type = kc.type, .v_type = kc.v_type,
                         .prefix_cache = p.prefix_cache};
        if ((st = mtp_new(e->m, &mq, &e->mtp, err))) goto fail;
        if ((st = spc_cost_init(&e->dcal, 1, err))) goto fail;
        e->mjobs = hn_calloc((size_t)p.max_running, sizeof *e->mjobs);
        e->mreq = hn_calloc((size_t)p.max_running, sizeof *e->mreq);
        if (!e->mjobs || !e->mreq) {
            st = hn_errf(err, HN_ERR_NOMEM, "engine: out of memory");
            goto fail;
        }
        size_t mb, tb;
        model_mtp_bytes(e->m, &mb, &tb);
        e->draft_ratio = tb ? (double)mb / (double)tb : 1;
    }
    if (e->dfl_g && (st = dflash_setup(e, &p, &kc, nb, err))) goto fail;
    if (e->spec && (e->spec == ENG_SPEC_DRAFT || e->spec == ENG_SPEC_AUTO) && p.draft_path && !e->dfl_g) {
        /* the draft model: on a backend of the target's kind, its own KV pool
         * with as many blocks as the target's (one drafter block per target block) */
        drf_params dp = {.path = p.draft_path, .device = model_backend(e->m)->ops->name, .target = model_backend(e->m),
                         .n_threads = p.n_threads,
                         .n_ctx = e->n_ctx, .max_seqs = p.max_running, .max_draft = e->spec_max,
                         .n_blocks = (int32_t)nb, .block_size = p.block_size, .k_type = kc.type, .v_type = kc.v_type,
                         .prefix_cache = p.prefix_cache, .vocab = e->vocab};
        if ((st = drf_new(&dp, &e->drf, err))) goto fail;
        if ((st = spc_cost_init(&e->dcal, 1, err))) goto fail;
        e->djobs = hn_calloc((size_t)p.max_running, sizeof *e->djobs);
        if (!e->djobs) {
            st = hn_errf(err, HN_ERR_NOMEM, "engine: out of memory");
            goto fail;
        }
        drf_stats ds;
        drf_get_stats(e->drf, &ds);
        e->draft_ratio = e->model_file_bytes ? (double)ds.file_bytes / (double)e->model_file_bytes : 1;
    }
    if (e->hybrid) {
        /* live states (one per running sequence) plus checkpoints capped at
         * a tenth of the KV budget (at least 2), on top of the KV blocks */
        size_t ck = p.kv_max_bytes / 10 / (kc.state_bytes ? kc.state_bytes : 1);
        kc.n_ckpt = !p.prefix_cache ? 0 : ck < 2 ? 2 : ck > 4096 ? 4096 : (int32_t)ck;
        kc.n_state_slots = p.max_running + kc.n_ckpt;
        if (e->spec) {
            /* speculation: a spare slot per drafted row of a step (the state
             * after each verified row, to roll back to), as many as a tenth of
             * the KV budget holds, at least the per-request draft cap, at most
             * the step's drafted rows; mapped as drafts first need them */
            size_t sp = p.kv_max_bytes / 10 / (kc.state_bytes ? kc.state_bytes : 1);
            e->spare_cap = sp < (size_t)e->spec_max ? e->spec_max : sp > (size_t)e->spec_rows ? e->spec_rows : (int32_t)sp;
            e->spec_rows = e->spare_cap;
            kc.n_state_slots += e->spare_cap;
        }
    }
    st = kv_create(&kc, &e->kv, err);
    if (st) goto fail;
    int32_t R = p.max_running, B = e->cap_batch;
    e->running = hn_calloc((size_t)R, sizeof *e->running);
    e->b_tok = hn_malloc(sizeof(int32_t) * (size_t)B);
    e->b_pos = hn_malloc(sizeof(int32_t) * (size_t)B);
    e->b_sid = hn_malloc(sizeof(int32_t) * (size_t)B);
    e->b_want = hn_malloc(sizeof(bool) * (size_t)B);
    e->b_seqs = hn_malloc(sizeof(kv_seq *) * (size_t)R);
    e->b_rowwise = hn_calloc((size_t)R, sizeof(bool));
    e->b_prompt = hn_calloc((size_t)R, sizeof(bool));
    e->b_req = hn_malloc(sizeof(ereq *) * (size_t)R);
    e->b_hash = hn_malloc(sizeof(uint64_t) * (size_t)R);
    e->b_hash_req = hn_malloc(sizeof(ereq *) * (size_t)R);
    e->masks = hn_calloc((size_t)model_max_logits(e->m), sizeof *e->masks);
    e->chk = hn_malloc(sizeof(kv_seq *) * (size_t)R);
    e->ck_src = hn_malloc(sizeof(int32_t) * (size_t)R);
    e->ck_dst = hn_malloc(sizeof(int32_t) * (size_t)R);
    e->spare = hn_malloc(sizeof(int32_t) * (size_t)(e->spare_cap > 0 ? e->spare_cap : 1));
    e->b_snap = hn_malloc(sizeof(int32_t) * (size_t)B);
    if (!e->spare || !e->b_snap || !e->b_rowwise || !e->b_prompt || !e->ck_src || !e->ck_dst || !e->b_hash_req || !e->running || !e->b_tok || !e->b_pos || !e->b_sid || !e->b_want || !e->b_seqs || !e->b_req || !e->b_hash ||
        !e->chk || !e->masks) {
        st = hn_errf(err, HN_ERR_NOMEM, "engine: out of memory");
        goto fail;
    }
    const int32_t bs = e->kv->cfg.block_size;
    if ((st = plan_init(&e->splan, B, R, (e->n_ctx + bs - 1) / bs + 1, err))) goto fail;
    e->next_id = 1;
    kv_stats ks0;
    kv_get_stats(e->kv, &ks0);
    /* the engine thread has not started: nothing else ran */
    e->engine_bytes = hn_alloc_bytes() - bytes0 - ks0.bytes - ks0.meta_bytes;
    if (e->drf) {
        drf_stats ds;
        drf_get_stats(e->drf, &ds);
        e->engine_bytes -= ds.kv_bytes;
    }
    if (e->mtp) {
        mtp_stats ms;
        mtp_get_stats(e->mtp, &ms);
        e->engine_bytes -= ms.kv_bytes;
    }
    if (e->dfl) {
        dfl_stats fs;
        dfl_get_stats(e->dfl, &fs);
        e->engine_bytes -= fs.kv_bytes;
    }
    publish_stats(e);
    if (pthread_create(&e->thread, NULL, engine_main, e)) {
        st = hn_errf(err, HN_ERR_NOMEM, "engine: cannot start its thread");
        goto fail;
    }
    e->thread_started = true;
    *out = e;
    return HN_OK;
fail:
    eng_free(e);
    return st;
}

void eng_free(eng_engine *e) {
    if (!e) return;
    if (e->thread_started) {
        pthread_mutex_lock(&e->mu);
        e->stop = true;
        pthread_cond_signal(&e->cv);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
    }
    drf_free(e->drf);
    hn_free(e->djobs);
    mtp_free(e->mtp);
    hn_free(e->mjobs);
    hn_free(e->mreq);
    dfl_free(e->dfl);
    hn_free(e->fjobs);
    spc_cost_free(&e->dcal);
    kv_free(e->kv);
    tok_free(e->vocab);
    model_free(e->m);
    if (e->dfl_g) gguf_close(e->dfl_g); /* after the model, which read it */
    hn_free(e->running);
    hn_free(e->b_tok);
    hn_free(e->b_pos);
    hn_free(e->b_sid);
    hn_free(e->b_want);
    hn_free(e->b_seqs);
    hn_free(e->b_rowwise);
    hn_free(e->b_prompt);
    hn_free(e->b_req);
    hn_free(e->b_hash);
    hn_free(e->b_hash_req);
    hn_free(e->masks);
    hn_free(e->chk);
    hn_free(e->ck_src);
    hn_free(e->ck_dst);
    hn_free(e->spare);
    hn_free(e->b_snap);
    plan_free(&e->splan);
    spc_cost_free(&e->cost);
    pthread_cond_destroy(&e->trim_cv);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    hn_free(e);
}

/* ---- the thread-safe API ---- */

hn_status eng_submit(eng_engine *e, const eng_request *r, eng_req_id *id, hn_err *err) {
    if (id) *id = 0;
    if (!r || !r->on_event) return hn_errf(err, HN_ERR_INVALID, "engine: a request needs an event callback");
    if (r->n_prompt <= 0 || !r->prompt) return hn_errf(err, HN_ERR_INVALID, "engine: empty prompt");
    for (int32_t i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= e->n_vocab)
            return hn_errf(err, HN_ERR_INVALID, "engine: prompt token %d is %d, outside the vocabulary of %d", (int)i,
                           (int)r->prompt[i], (int)e->n_vocab);
    if (r->n_prompt > e->n_ctx)
        return hn_errf(err, HN_ERR_RANGE, "engine: the prompt has %d tokens, the context holds %d", (int)r->n_prompt,
                       (int)e->n_ctx);
    if (r->allowed && tok_n_vocab(e->vocab) < e->n_vocab)
        return hn_errf(err, HN_ERR_UNSUPPORTED, "engine: constrained decoding needs a token for each of the model's %d "
                       "logits, the tokenizer has %d", (int)e->n_vocab, (int)tok_n_vocab(e->vocab));
    ereq *q = hn_calloc(1, sizeof *q);
    if (!q) return hn_errf(err, HN_ERR_NOMEM, "engine: out of memory");
    q->r = *r;
    q->r.prompt = NULL;
    q->n_prompt = r->n_prompt;
    bool any = false, all = false; /* resume points given; one repeats the whole prompt */
    for (int32_t i = 0; i < r->n_resume && i < ENG_RESUME_MAX; i++) { /* the tips: block boundaries, distinct */
        int32_t p = r->resume[i];
        if (p < 0 || p > r->n_prompt) continue;
        any = true;
        all |= p == r->n_prompt;
        p = p / e->kv->cfg.block_size * e->kv->cfg.block_size;
        bool dup = false;
        for (int32_t j = 0; j < q->n_tip_at; j++) dup |= q->tip_at[j] == p;
        if (!dup) q->tip_at[q->n_tip_at++] = p;
    }
    q->reply_tips = !any || all;
    q->max_gen = r->max_tokens > 0 ? r->max_tokens : 0;
    int64_t cap = (int64_t)e->n_ctx + 1;
    if (q->max_gen > 0 && (int64_t)r->n_prompt + q->max_gen < cap) cap = (int64_t)r->n_prompt + q->max_gen;
    q->cap_toks = (int32_t)cap;
    q->toks = hn_malloc(sizeof(int32_t) * (size_t)cap);
    q->smp = smp_new(&r->sampling, e->n_vocab);
    hn_status st = HN_OK;
    if (!q->toks) st = hn_errf(err, HN_ERR_NOMEM, "engine: out of memory");
    else if (!q->smp) st = hn_errf(err, HN_ERR_INVALID, "engine: bad sampling parameters");
    else st = kv_seq_init(&q->seq, e->kv, e->n_ctx, err);
    if (st) {
        hn_free(q->toks);
        smp_free(q->smp);
        hn_free(q->seq.blocks);
        hn_free(q);
        return st;
    }
    q->seq.ns = r->cache_ns; /* prefix-cache namespace (kv.h) */
    if (e->drf) {
        q->dseq = drf_seq_new(e->drf, r->cache_ns); /* without memory the request just does not use the draft model */
        spc_req_init(&q->dctl);
    }
    if (e->mtp) {
        q->mseq = mtp_seq_new(e->mtp, r->cache_ns); /* without memory the request just does not use the MTP layer */
        q->hd_ok = q->mseq != NULL;
        spc_req_init(&q->dctl);
    }
    if (e->dfl) {
        q->fseq = dfl_seq_new(e->dfl, r->cache_ns); /* without memory the request just does not use DFlash */
        q->hd_ok = q->fseq != NULL;
        spc_req_init(&q->dctl);
    }
    if (e->spec && e->spec != ENG_SPEC_DRAFT && e->spec != ENG_SPEC_MTP && e->spec != ENG_SPEC_DFLASH) {
        /* the drafter over the prompt (built here, off the engine thread); sized for the
         * prompt and a first part of the reply; without memory the request just does not draft */
        int32_t gen = q->max_gen > 0 && q->max_gen < 4096 ? q->max_gen : 4096;
        q->sfx = sfx_new(r->n_prompt + gen + 1, 0);
        hn_err serr;
        if (q->sfx && sfx_append_n(q->sfx, r->prompt, r->n_prompt, &serr)) {
            sfx_free(q->sfx);
            q->sfx = NULL;
        }
        spc_req_init(&q->ctl);
    }
    for (int32_t i = 0; r->penalize_prompt && i < r->n_prompt; i++) smp_accept(q->smp, r->prompt[i]);
    memcpy(q->toks, r->prompt, sizeof(int32_t) * (size_t)r->n_prompt);
    q->n_toks = r->n_prompt;
    q->ck_roll = q->ck_from = -1;
    q->snap0 = -1;
    q->row0 = -1;
    q->st.n_prompt = r->n_prompt;
    q->logit_row = -1;
    q->t_submit = hn_now_ms();
    pthread_mutex_lock(&e->mu);
    q->id = e->next_id++;
    q->next = e->all;
    if (e->all) e->all->prev = q;
    e->all = q;
    if (e->in_tail) e->in_tail->qnext = q;
    else e->in_head = q;
    e->in_tail = q;
    e->n_incoming++;
    e->prompt_tokens += (uint64_t)r->n_prompt;
    e->stats.prompt_tokens = e->prompt_tokens;
    e->stats.requests++;
    q->snap = (eng_session){.id = q->id, .state = ENG_SESS_QUEUED, .n_tokens = q->n_toks, .n_prompt = q->n_prompt};
    e->stats.n_waiting++;
    if (id) *id = q->id;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return HN_OK;
}

void eng_cancel(eng_engine *e, eng_req_id id) {
    pthread_mutex_lock(&e->mu);
    for (ereq *q = e->all; q; q = q->next)
        if (q->id == id) {
            atomic_store(&q->cancel, true);
            pthread_cond_signal(&e->cv);
            break;
        }
    pthread_mutex_unlock(&e->mu);
}

void eng_get_stats(eng_engine *e, eng_stats *out) {
    pthread_mutex_lock(&e->mu);
    *out = e->stats;
    pthread_mutex_unlock(&e->mu);
}

int eng_get_sessions(eng_engine *e, eng_session *out, int cap) {
    int n = 0;
    double now = hn_now_ms();
    pthread_mutex_lock(&e->mu);
    for (ereq *q = e->all; q; q = q->next, n++)
        if (n < cap) {
            out[n] = q->snap;
            out[n].id = q->id;
            out[n].n_prompt = q->n_prompt;
            out[n].age_ms = now - q->t_submit;
        }
    pthread_mutex_unlock(&e->mu);
    return n;
}

void eng_trim(eng_engine *e) {
    pthread_mutex_lock(&e->mu);
    uint64_t want = ++e->trim_req;
    pthread_cond_signal(&e->cv);
    while (e->trim_done < want && !e->stop) pthread_cond_wait(&e->trim_cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
}

const struct tok_vocab *eng_vocab(const eng_engine *e) { return e->vocab; }
const struct gguf_ctx *eng_gguf(const eng_engine *e) { return model_gguf(e->m); }
int32_t eng_n_ctx(const eng_engine *e) { return e->n_ctx; }
const char *eng_device(const eng_engine *e) { return model_backend(e->m)->ops->name; }
