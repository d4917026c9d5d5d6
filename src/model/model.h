/* model.h: a transformer loaded from GGUF, and its forward pass.
 *
 * model_load reads the hyper-parameters from `<arch>.*` metadata, creates the
 * backend chosen by name (backend/registry.h; or uses one it is given), binds
 * every weight tensor with a shape check against the metadata (a file whose
 * tensors do not match fails with HN_ERR_FORMAT naming the tensor) as a
 * backend weight, and makes every activation tensor, sized for `max_batch`
 * tokens, in the backend's arena. Weights stay in their GGUF type.
 *
 * Architectures: llama (normal RoPE, optional QKV biases), qwen2 (QKV biases,
 * neox RoPE), qwen3 (per-head QK RMS-norm, neox RoPE), qwen3moe (qwen3
 * attention, top-k of softmax expert routing with normalised weights), with
 * tied (no output.weight) or untied output; and the hybrids qwen35 /
 * qwen35moe (Gated DeltaNet layers plus a gated, QK-normed, IMROPE attention
 * layer every few layers; a shared expert gated by a sigmoid): their
 * sequences need a recurrent-state slot (kv_seq_state_acquire) in a cache
 * made by model_kv_config, and a step must continue each sequence where its
 * state is (position state_len) or restart it at 0.
 *
 * model_step computes one step over a finished plan (sched/plan.h): it stores
 * each token's K/V at its plan slot, attends causally over its sequence's
 * cache and leaves the logits of the wanted rows in the backend, fetched to
 * the host at the step's one sync (model_logits). It touches no host data and
 * reserves nothing. model_forward is the one-call form for tools and tests: it
 * plans (reserving KV blocks), steps and finishes in steps of at most
 * max_batch tokens and max_logits wanted rows, and copies the logits out.
 * Single-sequence generation is a batch of one token. Nothing allocates
 * during a forward. */
#ifndef HN_MODEL_H
#define HN_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "../backend/backend.h"
#include "../core/status.h"
#include "../gguf/gguf.h"
#include "../kv/kv.h"
#include "../sched/plan.h"

typedef enum { MODEL_LLAMA, MODEL_QWEN2, MODEL_QWEN3, MODEL_QWEN3MOE, MODEL_QWEN35, MODEL_QWEN35MOE } model_arch;

typedef struct model_hparams {
    model_arch arch;
    char arch_name[32];
    int32_t n_vocab;
    int32_t n_embd;
    int32_t n_layer;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t head_dim;      /* attention.key_length (default n_embd / n_head) */
    int32_t n_ff;          /* dense FFN width (0 for MoE models) */
    int32_t n_rot;         /* rope.dimension_count (default head_dim) */
    int32_t n_expert;      /* 0 for dense models */
    int32_t n_expert_used;
    int32_t n_ff_exp;
    int32_t n_ctx_train;   /* context_length */
    int32_t sliding_window;/* 0: none */
    float rope_base;
    float rms_eps;
    be_rope_mode rope_mode;
    bool qk_norm;
    bool tied_output;
    /* hybrid models (qwen35, qwen35moe): Gated DeltaNet layers with a gated
     * full-attention layer every full_attn_interval layers */
    bool hybrid;
    int32_t n_layer_attn;      /* attention layers (the KV cache's n_layer) */
    int32_t n_layer_rec;       /* recurrent (delta-net) layers */
    int32_t full_attn_interval;
    int32_t rope_sections[4];  /* IMROPE sections */
    int32_t ssm_conv;          /* conv kernel K */
    int32_t ssm_state;         /* S: head dim of the delta-net k, q and v */
    int32_t ssm_k_heads;       /* Nk (ssm.group_count) */
    int32_t ssm_v_heads;       /* Nv (ssm.time_step_rank) */
    int32_t n_ff_shexp;        /* shared-expert FFN width (0: none) */
    int32_t n_nextn;           /* MTP layers at the end of the stack (not run by the main forward; the
                                  first of them is run by model_mtp_step) */
    size_t state_bytes;        /* one sequence's recurrent state */
} model_hparams;

typedef struct model_params {
    int n_threads;   /* 0: all CPUs */
    int max_batch;   /* most tokens per forward step; 0: 512. Longer batches run in steps */
    int max_seqs;    /* most distinct sequences in one batch; 0: 64 */
    int max_logits;  /* most logits rows per step; 0: 64 (at most max_batch) */
    const char *device;  /* backend name (registry.h): "auto" (NULL), "cpu", "cuda" */
    be_backend *backend; /* a backend to use instead (borrowed: outlives the model) */
    /* back the scratch for max_batch tokens whole from load, as before it
     * followed the load (comparisons, tests) */
    bool scratch_fixed;
    /* make the MTP (nextn) layer runnable, when the model has one: every
     * step also keeps its rows' final hidden state (after output_norm) in
     * the backend for model_mtp_step (no effect on the logits) */
    bool mtp;
    /* a DFlash drafter's GGUF (general.architecture "dflash"; borrowed: it
     * must outlive the model), loaded with the model onto its backend (the
     * model_dflash_* calls below); every step then also keeps its rows'
     * residual stream at the drafter's target layers. NULL: none */
    const gguf_ctx *dflash;
    /* experts apart ("MoE experts on the CPU, the rest on the GPU"): the
     * routed experts (ffn_{gate,up,down}_exps) of the last cpu_moe layers of
     * the file (MTP layers, which come last, first; -1: every layer; 0:
     * none) are loaded onto a second backend, the expert backend, and only
     * there; it computes their weighted sum for those layers from the rows
     * and routing the main backend hands it (one copy each way per layer).
     * Attention, the router, the shared expert, the KV cache and every other
     * weight stay on the main backend. A MoE model only; HN_ERR_INVALID for
     * a dense model or a count below -1 or above the layers.
     * MODEL_CPU_MOE_AUTO: the fewest last layers that make the rest fit the
     * main backend's memory (what it reports free, or mem_budget when that is
     * less), with the fit check's margin: 0 when all fits, when the backend
     * reports no memory or for a dense model (model_moe_remote_layers says
     * what was chosen) */
    int cpu_moe;
    /* the most memory of the main backend's own (a GPU's) that the model may
     * take for its weights and scratch, checked as the memory it reports
     * free is (--vram); 0: what it reports free */
    size_t mem_budget;
    /* the expert backend to use when cpu_moe is not 0 (borrowed: outlives
     * the model; a fresh backend, as for `backend`); NULL: a CPU backend
     * made by model_load (on the main backend's thread pool when that is a
     * CPU backend, else of n_threads) */
    be_backend *moe_backend;
    /* tensor parallel (DESIGN.md, "Several devices: tensor parallel"): the
     * attention heads (by kv-head group), the FFN and the output matrix's
     * vocabulary split over n_ranks backends, joined by a communicator
     * (backend/comm.h); 0 or 1: one backend, as before. Each rank holds its
     * share of every layer, the whole embedding table and residual stream,
     * and its kv heads of the KV pool (model_kv_config shards it). Dense
     * llama, qwen2 and qwen3 only, CPU ranks only for now; HN_ERR_INVALID
     * when the heads, kv heads, FFN width or vocabulary do not divide by
     * n_ranks or a rank's share of a quantized row is not whole blocks,
     * HN_ERR_UNSUPPORTED for other architectures, cpu_moe, MTP, DFlash or
     * ranks that are not CPU backends */
    int n_ranks;
    /* the ranks' backends (borrowed, fresh; rank 0's takes the place of
     * `backend`), NULL: model_load makes them (`device`, which must be cpu
     * or auto: CPU ranks share rank 0's thread pool, they run in turn) */
    be_backend *const *rank_backends;
} model_params;

/* A ragged batch (see step_batch in sched/plan.h). */
typedef step_batch model_batch;

typedef struct model model;

/* Opens path (mmap) and loads the model; the model owns the file. */
hn_status model_load(const char *path, const model_params *p, model **out, hn_err *err);
/* Loads from an open GGUF, which is borrowed and must outlive the model. */
hn_status model_load_gguf(const gguf_ctx *g, const model_params *p, model **out, hn_err *err);
void model_free(model *m);

const model_hparams *model_hp(const model *m);
/* The GGUF the model was loaded from (for the tokenizer and metadata). */
const gguf_ctx *model_gguf(const model *m);
int model_n_threads(const model *m);
/* The backend the model runs on (e.g. to apply tuned kernel parameters between forwards). */
be_backend *model_backend(const model *m);
/* Tensor parallel: how many ranks (1 without), and rank r's backend (rank 0: model_backend). */
int model_n_ranks(const model *m);
be_backend *model_rank_backend(const model *m, int r);
#define MODEL_CPU_MOE_AUTO (-2)

/* The bytes the model holds on its main backend when that backend has memory
 * of its own (weights there, and the backend's scratch and activations); 0
 * when it reports none (a CPU backend reads most weights in place). */
size_t model_main_bytes(const model *m);

/* The expert backend (model_params.cpu_moe), NULL without one. */
be_backend *model_moe_backend(const model *m);
/* How many layers' routed experts are on the expert backend (the last ones). */
int model_moe_remote_layers(const model *m);
/* Weight bytes (as in the file; a tied embedding counts twice: rows and
 * matmul weight) loaded onto the main backend and onto the expert backend. */
void model_weight_bytes(const model *m, size_t *main_b, size_t *moe_b);
/* A KV cache configuration for this model with n_blocks blocks of block_size
 * (0: default) positions; for a hybrid, n_layer counts the attention layers
 * and state_bytes is one sequence's recurrent state (n_state_slots 64). */
kv_config model_kv_config(const model *m, int32_t n_blocks, int block_size);
/* Copies recurrent-state slots (dst[i] = src[i]) between steps, through the
 * backend, and waits: checkpoints and their restore. */
hn_status model_state_copy(model *m, const kv_cache *kv, int n, const int32_t *src, const int32_t *dst, hn_err *err);

/* Computes one step over plan p (built by plan_build for this model's
 * vocabulary, at most max_batch tokens and max_logits wanted rows, against
 * kv): enqueues the forward on the backend and syncs (with experts apart,
 * also once per layer apart on each backend, mid-step). masks (NULL: none) has
 * one allowed-token bitmask per wanted row (NULL: that row unmasked; see
 * mask_logits in backend.h), applied to the logits before they are fetched.
 * On success the wanted
 * rows' logits are at model_logits() until the next step. Errors: the
 * backend's (reported at sync), HN_ERR_INVALID for a plan over the limits or
 * a KV cache made for another shape. */
hn_status model_step(model *m, kv_cache *kv, const step_plan *p, const uint32_t *const *masks, hn_err *err);
/* The last step's logits: n_out rows of n_vocab floats, in plan order (host memory). */
const float *model_logits(const model *m);
/* Scratch that follows the load. The activation tensors and the backend's
 * scratch are made at load for max_batch tokens and max_logits rows, but
 * memory backs only what the steps need: after load one token's worth; a
 * step of more tokens or logits rows than backed grows it (to the next power
 * of two, at most the limits: growth on a new high-water mark only, so a
 * steady token loop allocates nothing), and model_scratch_trim gives it back
 * down to one token (the engine does when idle). Not with scratch_fixed. */
/* Backs scratch for steps of at most rows tokens and outs logits rows
 * exactly (between steps; model_step calls model_scratch_need itself). */
hn_status model_scratch_fit(model *m, int32_t rows, int32_t outs, hn_err *err);
/* Grows the scratch, if needed, for a step of rows tokens and outs logits rows. */
hn_status model_scratch_need(model *m, int32_t rows, int32_t outs, hn_err *err);
/* Gives the scratch back down to one token's worth (between steps). */
hn_status model_scratch_trim(model *m, hn_err *err);
/* Bytes the backend's scratch and activations hold now (be_ops.scratch_bytes; 0 if it does not say). */
size_t model_scratch_bytes(const model *m);
/* Limits a plan for this model must keep (max_batch tokens, max_logits wanted rows). */
int32_t model_max_batch(const model *m);
int32_t model_max_logits(const model *m);

/* ---- MTP (multi-token prediction, "nextn") ----
 * A qwen35 / qwen35moe file may end its stack with MTP layers: a gated
 * attention block plus its FFN, fed with the concatenation of
 * enorm(embed(x_{p+1})) and hnorm(h_p) projected by eh_proj (2E -> E), where
 * h_p is the main model's final hidden state at position p (after
 * output_norm), and read out through shared_head_norm (else output_norm) and
 * shared_head_head (else the model's output matrix): logits for x_{p+2}.
 * The layer has its own KV cache (model_mtp_kv_config: one layer), whose
 * position p holds the pair (h_p, x_{p+1}). Only the first MTP layer is run. */

/* Whether the MTP layer is runnable (nextn layers present and model_params.mtp). */
bool model_has_mtp(const model *m);
/* Weight bytes an MTP step reads (the layer, eh_proj, its head) and the
 * main stack's (every other tensor): the drafter's cost prior. */
void model_mtp_bytes(const model *m, size_t *mtp, size_t *main);
/* A KV cache configuration for the MTP layer: one attention layer of the
 * model's head shape, no recurrent state. */
kv_config model_mtp_kv_config(const model *m, int32_t n_blocks, int block_size);
/* One MTP step over plan p (built by plan_build against mkv, a cache of
 * model_mtp_kv_config): row i's token is x_{p+1}, its position p, and its
 * hidden input is row i of the model's hidden rows, which the last
 * model_step filled (row r: that step's row r) and each model_mtp_step
 * replaces by its wanted rows' own output states (after the head norm, row
 * j: the step's j-th wanted row) to chain drafts. hsel (NULL: none) first
 * moves hidden rows hsel[0..n_hsel) (ascending, n_hsel == p->n_tokens) to
 * rows 0..n_hsel. The wanted rows' logits are at model_logits() after it.
 * Errors: HN_ERR_INVALID without an MTP layer, for a plan over the limits or
 * a cache of another shape; the backend's. */
hn_status model_mtp_step(model *m, kv_cache *mkv, const step_plan *p, const int32_t *hsel, int32_t n_hsel, hn_err *err);

/* ---- DFlash (a block-diffusion drafter, spec/dflash.h) ----
 * A DFlash file, in the form llama.cpp reads (general.architecture
 * "dflash"), holds a few qwen3-style layers that draft a block of tokens in
 * one forward, conditioned on the target's hidden states. Its keys are the
 * usual `dflash.*` shape keys plus dflash.block_size (the trained block,
 * default 16), dflash.target_layers (T indices: the residual stream at the
 * input of target layer L is tapped; L = the target's layer count is the
 * final residual, before output_norm) and tokenizer.ggml.mask_token_id, and
 * optionally dflash.sample_from_anchor and dflash.attention.causal (both
 * false by default). Its tensors: fc.weight (T E -> E), enc.output_norm
 * (E), output_norm (E), per layer attn_norm, attn_q/k/v/output,
 * attn_q_norm/attn_k_norm, ffn_norm, ffn_gate/up/down, and optionally its
 * own token_embd / output (else the target's are used). Its width E must
 * be the target's.
 *
 * Each target step keeps, per row, the tapped residual streams side by
 * side (T E floats). Injection (model_dflash_inject): a position p's taps
 * are fused into g_p = enc.output_norm(rms(fc . taps_p)), and every drafter
 * layer stores K = rope(k_norm(wk g_p)), V = wv g_p at p in the drafter's
 * own KV cache (model_dflash_kv_config). A block (model_dflash_block):
 * tokens [x_n, mask, ..., mask] at positions n .. n + bs - 1 through the
 * layers (attn_norm; q/k/v, q/k norms, rope; attention over the context's
 * K/V and the whole block, not causal unless dflash.attention.causal;
 * output; ffn_norm; SwiGLU FFN), output_norm and the output matrix: slot i
 * (i >= 1) drafts the token at position n + i (with sample_from_anchor,
 * slot i >= 0 drafts position n + i + 1). Refused: rope scaling, sliding
 * windows, attention sinks, a reduced draft vocabulary (d2t), DSpark's
 * Markov head and DFlash2's selector (messages say which). */

typedef struct model_dflash_info {
    int32_t n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_rot;
    int32_t block_size;        /* the trained block (tokens per block forward) */
    int32_t mask_token;
    int32_t n_taps;
    int32_t taps[16];          /* target layers whose input is tapped, in fc's input order */
    bool sample_from_anchor;   /* slot i drafts position n + i + 1 (else n + i, slot 0 the anchor) */
    bool causal;               /* block attention causal (else every block row sees the whole block) */
    size_t weight_bytes;       /* what a block forward reads: the drafter's tensors, plus the target's
                                  embedding rows and output matrix when it uses them (the output's bytes) */
} model_dflash_info;

/* Whether a DFlash drafter was loaded with the model (model_params.dflash). */
bool model_has_dflash(const model *m);
/* Its shape and options (NULL without one). */
const model_dflash_info *model_dflash(const model *m);
/* A KV cache configuration for the drafter: its layers and head shape. */
kv_config model_dflash_kv_config(const model *m, int32_t n_blocks, int block_size);
/* Injection over plan p (built against dkv, a cache of
 * model_dflash_kv_config; no logits): row i is the tapped row sel[i] of
 * the last model_step (sel NULL: row i; ascending, n_sel == p->n_tokens),
 * stored at its plan position. The taps are consumed (a selection moves
 * them in place). Errors: HN_ERR_INVALID without a drafter, for a plan over
 * the limits or a cache of another shape; the backend's. */
hn_status model_dflash_inject(model *m, kv_cache *dkv, const step_plan *p, const int32_t *sel, int32_t n_sel,
                              hn_err *err);
/* A block forward over plan p (against dkv, each sequence's rows a block at
 * its positions, after its injected context): the wanted rows' logits are at
 * model_logits() after it. The block rows' K/V are stored at their slots
 * (the caller truncates them away). Errors: as model_dflash_inject. */
hn_status model_dflash_block(model *m, kv_cache *dkv, const step_plan *p, hn_err *err);

/* Runs the batch. Takes KV blocks from kv as sequences grow; writes the logits
 * of the tokens that want them, in batch order, as rows of n_vocab floats into
 * logits (room for logits_cap rows; logits NULL: they are not copied out, and
 * the last step's rows stay at model_logits()). On success each sequence's n_tokens
 * covers its highest position. Errors: HN_ERR_INVALID (bad token, position,
 * sequence id; too many logits rows), HN_ERR_FULL (KV pool exhausted),
 * HN_ERR_RANGE (a sequence's block table is full). */
hn_status model_forward(model *m, kv_cache *kv, const model_batch *b, float *logits, int32_t logits_cap,
                        hn_err *err);

#endif
