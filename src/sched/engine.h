/* engine.h: the inference engine as other threads see it.
 *
 * One engine owns a model, its KV pool (paged, with the prefix cache) and one
 * engine thread that runs steps: each step batches the decode token of every
 * running sequence with chunks of pending prefills, under a per-step token
 * budget, runs one forward, samples, and delivers tokens. Any thread may
 * submit and cancel requests; results come back through the request's event
 * callback, which runs ON THE ENGINE THREAD and must be quick and must not
 * call back into the engine except eng_cancel (typically it pushes the event
 * onto the caller's own queue and signals a condition variable).
 *
 * A request is tokens in, tokens out: chat templates, stop strings, tool-call
 * parsing and detokenizing belong to the caller (server/). The engine stops a
 * request at an end-of-generation token (unless ignore_eog), at max_tokens, on
 * cancel, or when its context would exceed the model's. Every request ends
 * with exactly one ENG_EV_DONE event (after which the engine never touches
 * its callback or ctx again). */
#ifndef HN_ENGINE_H
#define HN_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../core/status.h"
#include "../sample/sample.h"

typedef struct eng_engine eng_engine;
struct model;
typedef uint64_t eng_req_id;

typedef struct eng_params {
    const char *model_path;
    const char *device;       /* backend (backend/registry.h): "auto" (NULL), "cpu", "cuda" */
    int n_threads;            /* 0: all CPUs */
    int32_t n_ctx;            /* most positions per sequence; 0: the model's trained context */
    size_t kv_max_bytes;      /* cap on KV memory; 0: a default fraction of RAM */
    int block_size;           /* KV positions per block; 0: default (16) */
    int32_t step_tokens;      /* token budget per step (decode + prefill chunks); 0: default (64 on the CPU
                                 backend, 512 on a GPU) */
    int32_t max_running;      /* most sequences in one step; 0: default (16) */
    bool prefix_cache;        /* reuse cached prompt blocks across requests (default on: set by eng_default_params) */
    int kv_type;              /* eng_kv_type: 0 f32, 1 f16 (default), 2 q8_0, 3 q8_0 K + q4_1 V */
    int32_t cache_idle_ms;    /* drop cached prefixes (and their memory) after this long idle; 0: 5 min, <0: never */
    bool debug_check;         /* verify every KV cache invariant after each step (slow; for tests) */
    int spec;                 /* eng_spec: speculative decoding (default off here; the CLI defaults to auto) */
    int32_t spec_max_draft;   /* most drafted tokens per request and step; 0: default (16) */
    const char *draft_path;   /* a draft model (spec/draft.h) with the target's vocabulary: used by
                                 ENG_SPEC_DRAFT (required) and ENG_SPEC_AUTO; or a DFlash drafter
                                 (spec/dflash.h: general.architecture dflash), used by
                                 ENG_SPEC_DFLASH (required) and ENG_SPEC_AUTO; NULL: none (not
                                 loaded with ENG_SPEC_MTP) */
    /* called once with the loaded model before the engine thread starts (e.g. to
     * apply tuned kernel parameters); an error fails eng_create. NULL: none */
    hn_status (*on_load)(void *ctx, struct model *m, hn_err *err);
    void *on_load_ctx;
    bool scratch_fixed;       /* model_params.scratch_fixed: scratch for the largest step from load (comparisons) */
    int cpu_moe;              /* model_params.cpu_moe: the routed experts of the last N layers (-1: all,
                                 MODEL_CPU_MOE_AUTO: as many as the memory needs) on the CPU */
    size_t mem_budget;        /* model_params.mem_budget (--vram): the most of a GPU's memory for the model and,
                                 with what the model leaves of it, the cap on the KV pool; 0: none */
    int n_ranks;              /* model_params.n_ranks: tensor-parallel ranks (0 or 1: one backend) */
} eng_params;

typedef enum eng_kv_type { ENG_KV_F32 = 0, ENG_KV_F16, ENG_KV_Q8_0, ENG_KV_K8V4 } eng_kv_type;

/* Parses "f32", "f16", "q8_0", "k8v4" into *out; false if unknown. */
bool eng_kv_type_from_name(const char *name, int *out);
const char *eng_kv_type_name(int kv_type);

/* Speculative decoding (DESIGN.md, "speculative decoding"): drafted tokens
 * are verified as extra rows of the same step; output at temperature 0 is
 * plain decoding's, token for token, and with sampling it keeps the
 * sampler's distribution. OFF: none. AUTO: the best drafter available
 * under the cost controller, which switches drafting off per request while
 * its expected gain is below 1: the suffix drafter, and where it proposes
 * nothing worth verifying, the draft model when one is given (draft_path).
 * SUFFIX: the suffix drafter, verifying whatever it proposes (lengths still
 * adapted). DRAFT: the draft model alone, always drafting (lengths adapted;
 * its cost, k drafter steps for k tokens, is part of the controller's
 * gain). MTP: the model's own MTP (nextn) layer (spec/mtp.h) alone, always
 * drafting (lengths adapted, its steps' cost counted like a draft model's);
 * refused for a model without one. AUTO uses the MTP layer in the draft
 * model's place when the model has one and no draft model is given.
 * DFLASH: a DFlash drafter (spec/dflash.h), the draft file given as
 * draft_path (general.architecture dflash; anything else is refused, as
 * is a DFlash file with DRAFT), alone, always drafting (a block forward
 * per step; lengths adapted); AUTO uses it in the draft model's place when
 * the draft file is one, and never otherwise. Hybrid (recurrent) targets
 * speculate too, their state rolled back (DESIGN.md); a hybrid draft
 * model is refused. */
typedef enum eng_spec {
    ENG_SPEC_OFF = 0,
    ENG_SPEC_AUTO,
    ENG_SPEC_SUFFIX,
    ENG_SPEC_DRAFT,
    ENG_SPEC_MTP,
    ENG_SPEC_DFLASH
} eng_spec;
/* Parses "off", "auto", "suffix", "draft", "mtp", "dflash": returns 0 and
 * sets *out; 1 for an unknown name. */
int eng_spec_from_name(const char *name, int *out);
const char *eng_spec_name(int spec);

/* Defaults for every field (model_path NULL). */
eng_params eng_default_params(void);

typedef enum eng_finish {
    ENG_FINISH_NONE = 0,
    ENG_FINISH_EOG,        /* the model emitted an end-of-generation token (not delivered as text) */
    ENG_FINISH_LENGTH,     /* max_tokens reached */
    ENG_FINISH_CONTEXT,    /* the sequence filled the context */
    ENG_FINISH_CANCELLED,
    ENG_FINISH_ERROR,
} eng_finish;

typedef struct eng_req_stats {
    int32_t n_prompt;      /* prompt tokens submitted */
    int32_t n_cached;      /* of which served from the prefix cache */
    int32_t n_generated;
    double t_queued_ms;    /* submit -> first step that worked on it */
    double t_first_ms;     /* submit -> first generated token (TTFT) */
    double t_total_ms;     /* submit -> done */
    int32_t n_drafted;     /* speculative: tokens drafted and verified */
    int32_t n_accepted;    /* of which accepted (each one a decode step saved) */
} eng_req_stats;

typedef enum eng_event_type { ENG_EV_TOKEN, ENG_EV_DONE } eng_event_type;

typedef struct eng_event {
    eng_event_type type;
    eng_req_id id;
    int32_t token;         /* ENG_EV_TOKEN: the sampled token */
    eng_finish finish;     /* ENG_EV_DONE: why it ended */
    hn_status status;      /* ENG_EV_DONE: HN_OK unless finish == ENG_FINISH_ERROR */
    const char *error;     /* ENG_EV_DONE with an error: a message (valid during the callback) */
    eng_req_stats stats;   /* counters so far (final at ENG_EV_DONE) */
} eng_event;

typedef void (*eng_event_fn)(void *ctx, const eng_event *ev);

enum { ENG_RESUME_MAX = 4 };

typedef struct eng_request {
    const int32_t *prompt;     /* copied by eng_submit */
    int32_t n_prompt;
    smp_params sampling;
    int32_t max_tokens;        /* <= 0: until the context is full */
    bool ignore_eog;
    bool penalize_prompt;      /* the prompt's tokens start the penalty history (as hone run has always done) */
    /* Optional constraint (grammar), both on the engine thread, with mask_ctx.
     * allowed runs before each sample and returns the allowed-token bitmask
     * (sample.h's format, covering the model's n_vocab; NULL: every token),
     * which the step applies to the request's logits row on the backend
     * (mask_logits) before smp_sample; the pointer must stay valid until the
     * step's sampling (the next accept). accept runs after each sampled token.
     * eng_submit refuses allowed (HN_ERR_UNSUPPORTED) when the model has more
     * logits rows than its tokenizer has tokens, since a mask built over the
     * tokenizer's vocabulary would not cover them. */
    const uint32_t *(*allowed)(void *mask_ctx);
    void (*accept)(void *mask_ctx, int32_t token);
    void *mask_ctx;
    eng_event_fn on_event;     /* required */
    void *ctx;
    uint64_t cache_ns;         /* prefix-cache namespace (kv_seq.ns): 0 shares cached prefixes with every
                                  request of namespace 0; requests of different namespaces never reuse
                                  each other's blocks (the server gives each API key its own) */
    /* Hybrids: prompt positions where the conversation's next turn may stop
     * repeating this prompt (the server finds them by rendering the likely
     * next turns: template/chat.h chat_resume_points), each in [0, n_prompt]
     * (others are ignored). The prompt's tip checkpoints go at the last block
     * boundary at or before each, instead of at its last full block; one in
     * the cached prefix is kept as a tip. When none is n_prompt (no likely
     * next turn repeats all of the prompt), the reply gets no checkpoints.
     * n_resume 0: a tip at the prompt's last full block, and the reply's. */
    int32_t resume[ENG_RESUME_MAX];
    int32_t n_resume;
} eng_request;

/* Loads the model, creates the KV pool and starts the engine thread. */
hn_status eng_create(const eng_params *p, eng_engine **out, hn_err *err);
/* Cancels everything, stops the thread (each pending request gets its DONE event), frees all. */
void eng_free(eng_engine *e);

/* Queues a request; returns its id in *id. Fails (without any event) with
 * HN_ERR_INVALID for an empty prompt or bad tokens and HN_ERR_RANGE for a
 * prompt that cannot fit the context. Thread-safe. */
hn_status eng_submit(eng_engine *e, const eng_request *r, eng_req_id *id, hn_err *err);
/* Cancels a request: its blocks go back to the pool before the next step and
 * it receives DONE with ENG_FINISH_CANCELLED (unless already done). Thread-safe. */
void eng_cancel(eng_engine *e, eng_req_id id);

enum { ENG_HIST_N = 12 };
/* Upper bounds (ms) of the histogram buckets; the last is +Inf. */
extern const double eng_ttft_bounds_ms[ENG_HIST_N], eng_itl_bounds_ms[ENG_HIST_N];

typedef struct eng_stats {
    int32_t blocks_total;      /* blocks currently backed by memory */
    int32_t blocks_used;       /* referenced by running sequences */
    int32_t blocks_cached;     /* unreferenced but holding reusable prefixes */
    int32_t blocks_free;
    size_t kv_bytes;           /* memory of the pool now: its mapped slabs and the block metadata sized with them */
    size_t kv_peak_bytes;      /* the most kv_bytes has been */
    uint64_t prompt_tokens;    /* submitted, all requests */
    uint64_t cached_tokens;    /* served from the prefix cache */
    uint64_t generated_tokens;
    int32_t n_running, n_waiting;
    int32_t blocks_max;        /* the pool's cap (kv_max_bytes / block bytes) */
    int32_t block_size;
    size_t block_bytes;
    uint64_t computed_tokens;  /* tokens run through the model (prompt, recomputation, decode) */
    uint64_t evictions;        /* cached blocks reclaimed for other use */
    uint64_t preemptions;      /* sequences pushed out for memory (resumed later by recomputation) */
    uint64_t steps;
    uint64_t check_failures;   /* debug_check: steps whose invariant check failed */
    char check_error[160];     /* the first failure's message */
    /* fixed cost, exact from the allocation hook (core/alloc.h): everything
     * eng_create allocated except the KV pool (kv_bytes), and of it what model_load
     * (and on_load) allocated: repacked weights, activations, scratch.
     * Weights read in place from the file mapping are model_file_bytes. */
    size_t engine_bytes, model_bytes, model_file_bytes;
    /* experts apart (eng_params.cpu_moe): the layers whose routed experts
     * the expert backend holds, and of model_file_bytes those weights' (not
     * on the main backend) */
    int32_t moe_apart_layers;
    size_t moe_apart_bytes;
    /* the backend's scratch and activations now, and their peak: they
     * follow the steps run (sized for the largest step since the engine
     * last went idle, given back to one token's worth when idle);
     * model_bytes holds them as they were after load */
    size_t scratch_bytes, scratch_peak_bytes;
    int32_t kv_type;                           /* eng_kv_type */
    uint64_t requests;                         /* submitted */
    uint64_t finished[ENG_FINISH_ERROR + 1];   /* ended, by eng_finish */
    /* latency histograms (cumulative counts as Prometheus keeps them:
     * ttft_hist[i] counts values <= eng_ttft_bounds_ms[i], the last bucket
     * is +Inf), with the sum of the values in ms */
    uint64_t ttft_hist[ENG_HIST_N], itl_hist[ENG_HIST_N];
    double ttft_sum_ms, itl_sum_ms;
    /* hybrid models: recurrent-state memory (live slots + checkpoints, beside kv_bytes) */
    size_t state_bytes, state_peak_bytes;
    size_t state_slot_bytes;   /* one sequence's state (a slot); 0: the model has no recurrent layers */
    int32_t ckpts, ckpt_max;   /* state checkpoints held, and their budget */
    uint64_t ckpt_hits;        /* prefixes resumed from a checkpoint */
    /* speculative decoding: tokens drafted, accepted (= decode steps saved),
     * and steps that verified a draft */
    int32_t spec;              /* eng_spec in effect */
    uint64_t spec_drafted, spec_accepted, spec_verify_steps;
    /* the draft model (when loaded): its heap (repacked weights, activations:
     * also inside engine_bytes), weights in the file mapping, its own KV
     * slabs (not in kv_bytes), steps and rows it ran, and of spec_drafted
     * the tokens it proposed */
    bool draft_loaded;
    size_t draft_model_bytes, draft_file_bytes, draft_kv_bytes, draft_kv_peak_bytes;
    uint64_t draft_steps, draft_tokens, draft_drafted;
    /* the MTP drafter (when the model's MTP layer is in use): its own KV
     * slabs (not in kv_bytes), steps and rows it ran (catch-up and
     * drafting), of spec_drafted the tokens it proposed, and requests whose
     * MTP sequence could not follow them (they stopped drafting with it) */
    bool mtp_loaded;
    size_t mtp_kv_bytes, mtp_kv_peak_bytes;
    uint64_t mtp_steps, mtp_tokens, mtp_drafted, mtp_left_out;
    /* the DFlash drafter (when loaded): its own KV slabs (not in kv_bytes),
     * steps and rows it ran (injection and block forwards), blocks drafted,
     * of spec_drafted the tokens it proposed, and requests whose drafter
     * sequence could not follow them */
    bool dflash_loaded;
    size_t dflash_kv_bytes, dflash_kv_peak_bytes;
    uint64_t dflash_steps, dflash_tokens, dflash_blocks, dflash_drafted, dflash_left_out;
} eng_stats;

/* Per request, as eng_get_sessions reports it. A request is a session's turn:
 * the engine has no notion of a conversation, so between turns a session
 * shows only as the pool's cached blocks. */
typedef enum eng_sess_state { ENG_SESS_QUEUED, ENG_SESS_PREFILL, ENG_SESS_DECODE } eng_sess_state;
const char *eng_sess_state_name(int state);

typedef struct eng_session {
    eng_req_id id;
    eng_sess_state state;
    int32_t n_ctx;             /* positions whose K/V it holds now */
    int32_t n_tokens;          /* prompt + generated so far */
    int32_t n_prompt, n_cached, n_generated;
    int64_t n_computed;        /* tokens it ran through the model (prefill, recomputation, decode) */
    int32_t blocks_own;        /* KV blocks only it references */
    int32_t blocks_shared;     /* blocks it shares with other requests (refcount > 1) */
    size_t bytes_own;          /* blocks_own * block_bytes */
    double bytes_shared;       /* its share of the shared blocks: block_bytes / refcount each */
    size_t state_bytes;        /* hybrid models: its live recurrent state (one slot while it holds one);
                                * checkpoints belong to the prefix cache, not to a session */
    double tok_per_s;          /* generated tokens per second since its first token (0 before) */
    double age_ms;             /* since submit */
} eng_session;

/* Copies at most cap sessions (every live request, newest first) into out and
 * returns how many there are (may exceed cap). The figures are those of the
 * end of the engine's last step. Thread-safe. Summed over every session,
 * bytes_own + bytes_shared equals blocks_used * block_bytes of eng_get_stats
 * (up to float rounding). */
int eng_get_sessions(eng_engine *e, eng_session *out, int cap);

/* A consistent snapshot of engine-wide counters. Thread-safe. */
void eng_get_stats(eng_engine *e, eng_stats *out);
/* Drops every cached (unreferenced) prefix block and unmaps the empty slabs
 * now, as the idle timer would; returns once done. Thread-safe; not from an
 * event callback. */
void eng_trim(eng_engine *e);

/* The tokenizer and model facts a server needs (valid for the engine's life). */
struct tok_vocab;
struct gguf_ctx;
const struct tok_vocab *eng_vocab(const eng_engine *e);
const struct gguf_ctx *eng_gguf(const eng_engine *e);
int32_t eng_n_ctx(const eng_engine *e);
/* The name of the backend the engine computes on ("cpu", "cuda"). */
const char *eng_device(const eng_engine *e);

#endif
