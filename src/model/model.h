/* model.h: a transformer loaded from GGUF, and its forward pass.
 *
 * model_load reads the hyper-parameters from `<arch>.*` metadata, binds every
 * weight tensor with a shape check against them (a file whose tensors do not
 * match its metadata fails with HN_ERR_FORMAT naming the tensor), starts a
 * thread pool and a CPU backend, and sizes all scratch for `max_batch` tokens.
 * Weights stay in their GGUF type, in the file mapping.
 *
 * Architectures: llama (normal RoPE, optional QKV biases), qwen2 (QKV biases,
 * neox RoPE), qwen3 (per-head QK RMS-norm, neox RoPE), qwen3moe (qwen3
 * attention, top-k of softmax expert routing with normalised weights), with
 * tied (no output.weight) or untied output.
 *
 * The forward takes a ragged batch of tokens from several sequences (each
 * token names its sequence and position), writes each token's K/V into its
 * sequence's KV blocks, attends causally over that sequence's cache, and
 * writes logits for the tokens that want them. Single-sequence generation is
 * a batch of one token. Nothing allocates during a forward. */
#ifndef HN_MODEL_H
#define HN_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "../backend/backend.h"
#include "../core/status.h"
#include "../gguf/gguf.h"
#include "../kv/kv.h"

typedef enum { MODEL_LLAMA, MODEL_QWEN2, MODEL_QWEN3, MODEL_QWEN3MOE } model_arch;

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
} model_hparams;

typedef struct model_params {
    int n_threads;   /* 0: all CPUs */
    int max_batch;   /* most tokens per forward step; 0: 512. Longer batches run in steps */
    int max_seqs;    /* most distinct sequences in one batch; 0: 64 */
} model_params;

/* A ragged batch. Token i is token[i] at position pos[i] of sequence
 * seqs[seq_id[i]]. Within a batch a sequence's positions must not skip ahead:
 * pos[i] <= that sequence's n_tokens plus its earlier tokens in this batch
 * (re-writing an earlier position is allowed). want_logits[i] asks for token
 * i's logits (want_logits NULL: the last token only). */
typedef struct model_batch {
    int32_t n_tokens;
    const int32_t *token;
    const int32_t *pos;
    const int32_t *seq_id;
    const bool *want_logits;
    kv_seq *const *seqs;   /* block tables, indexed by seq_id */
    int32_t n_seqs;
} model_batch;

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
/* A KV cache configuration for this model with n_blocks blocks of block_size (0: default) positions. */
kv_config model_kv_config(const model *m, int32_t n_blocks, int block_size);

/* Runs the batch. Takes KV blocks from kv as sequences grow; writes the logits
 * of the tokens that want them, in batch order, as rows of n_vocab floats into
 * logits (room for logits_cap rows). On success each sequence's n_tokens
 * covers its highest position. Errors: HN_ERR_INVALID (bad token, position,
 * sequence id; too many logits rows), HN_ERR_FULL (KV pool exhausted),
 * HN_ERR_RANGE (a sequence's block table is full). */
hn_status model_forward(model *m, kv_cache *kv, const model_batch *b, float *logits, int32_t logits_cap,
                        hn_err *err);

#endif
