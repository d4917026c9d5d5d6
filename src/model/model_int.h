/* model_int.h: the model's private state, shared by model.c (loading) and
 * model_forward.c (the forward pass). */
#ifndef HN_MODEL_INT_H
#define HN_MODEL_INT_H

#include "../core/pool.h"
#include "model.h"

typedef struct model_layer {
    const float *attn_norm;   /* (n_embd) */
    be_weight wq;             /* (n_embd -> n_head * head_dim) */
    be_weight wk;             /* (n_embd -> n_head_kv * head_dim) */
    be_weight wv;             /* (n_embd -> n_head_kv * head_dim) */
    const float *bq, *bk, *bv;/* optional biases (qwen2) */
    const float *q_norm;      /* (head_dim), qwen3 */
    const float *k_norm;      /* (head_dim), qwen3 */
    be_weight wo;             /* (n_head * head_dim -> n_embd) */
    const float *ffn_norm;    /* (n_embd) */
    be_weight w_gate;         /* (n_embd -> n_ff), dense */
    be_weight w_up;           /* (n_embd -> n_ff) */
    be_weight w_down;         /* (n_ff -> n_embd) */
    be_weight gate_inp;       /* (n_embd -> n_expert), router */
    be_weight gate_exps;      /* (n_expert, n_embd -> n_ff_exp) */
    be_weight up_exps;        /* (n_expert, n_embd -> n_ff_exp) */
    be_weight down_exps;      /* (n_expert, n_ff_exp -> n_embd) */
} model_layer;

/* Activation scratch, all sized for max_batch tokens at load. */
typedef struct model_scratch {
    float *x;        /* (B, n_embd) residual stream */
    float *xb;       /* (B, n_embd) normed input of a sub-block */
    float *xb2;      /* (B, n_embd) sub-block output */
    float *q;        /* (B, n_head * head_dim) */
    float *k;        /* (B, n_head_kv * head_dim) */
    float *v;        /* (B, n_head_kv * head_dim) */
    float *att;      /* (B, n_head * head_dim) attention output */
    float *hb;       /* (B, n_ff) or (B * k, n_ff_exp) */
    float *hb2;      /* same */
    float *router;   /* (B, n_expert) */
    int32_t *exp_ids;/* (B * k) */
    float *exp_w;    /* (B * k) */
    float *moe_out;  /* (B * k, n_embd) */
    const kv_seq **tok_seq; /* (B) each token's block table */
    int32_t *out_rows;      /* (B) rows that want logits */
    int32_t *seq_fill;      /* (max_seqs) validation: positions filled per sequence */
} model_scratch;

struct model {
    model_hparams hp;
    gguf_ctx *owned;        /* set when model_load opened the file */
    const gguf_ctx *g;
    pool *pool;
    be_backend *be;
    model_params params;
    be_weight tok_embd;     /* (n_vocab, n_embd) */
    const float *output_norm;
    be_weight output;       /* (n_embd -> n_vocab); token_embd when tied */
    model_layer *layers;
    model_scratch s;
    void *scratch_mem;
};

#endif
