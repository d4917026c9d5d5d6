/* model_int.h: the model's private state, shared by model.c (loading) and
 * model_forward.c (the forward pass). */
#ifndef HN_MODEL_INT_H
#define HN_MODEL_INT_H

#include "model.h"

/* Every tensor is a backend handle (be_tensor *), made at load: the model
 * never touches their memory. */
typedef struct model_layer {
    be_tensor *attn_norm;     /* (n_embd) */
    be_tensor *wq;            /* (n_embd -> n_head * head_dim) */
    be_tensor *wk;            /* (n_embd -> n_head_kv * head_dim) */
    be_tensor *wv;            /* (n_embd -> n_head_kv * head_dim) */
    be_tensor *bq, *bk, *bv;  /* optional biases (qwen2) */
    be_tensor *q_norm;        /* (head_dim), qwen3 */
    be_tensor *k_norm;        /* (head_dim), qwen3 */
    be_tensor *wo;            /* (n_head * head_dim -> n_embd) */
    be_tensor *ffn_norm;      /* (n_embd) */
    be_tensor *w_gate;        /* (n_embd -> n_ff), dense */
    be_tensor *w_up;          /* (n_embd -> n_ff) */
    be_tensor *w_down;        /* (n_ff -> n_embd) */
    be_tensor *gate_inp;      /* (n_embd -> n_expert), router */
    be_tensor *gate_exps;     /* (n_expert, n_embd -> n_ff_exp) */
    be_tensor *up_exps;       /* (n_expert, n_embd -> n_ff_exp) */
    be_tensor *down_exps;     /* (n_expert, n_ff_exp -> n_embd) */
    /* hybrids */
    bool recurrent;           /* a delta-net layer (else attention) */
    int kv_layer;             /* attention: its layer in the KV cache */
    size_t conv_off, delta_off; /* recurrent: its conv and delta state in a state slot */
    be_tensor *wqkv;          /* (n_embd -> C = 2 Nk S + Nv S) */
    be_tensor *wz;            /* attn_gate (n_embd -> Nv S) */
    be_tensor *conv1d;        /* f32 (C rows of K taps) */
    be_tensor *dt_bias, *ssm_a; /* (Nv) */
    be_tensor *w_beta, *w_alpha; /* (n_embd -> Nv) */
    be_tensor *ssm_norm;      /* (S) */
    be_tensor *ssm_out;       /* (Nv S -> n_embd) */
    be_tensor *gate_inp_sh;   /* (n_embd -> 1) */
    be_tensor *gate_sh, *up_sh, *down_sh; /* shared expert */
    /* MTP (nextn) layer extras, loaded when present (embed and head: NULL
     * means the model's token_embd / output) */
    be_tensor *nextn_eh_proj, *nextn_enorm, *nextn_hnorm, *nextn_head_norm;
    be_tensor *nextn_embd, *nextn_head;
} model_layer;

/* Activations, backend tensors sized for max_batch tokens (logits for
 * max_logits rows) at load; memory backs only the rows of the largest step
 * since the last trim (model_scratch_fit). */
typedef struct model_scratch {
    be_tensor *x;       /* (B, n_embd) residual stream */
    be_tensor *xb;      /* (B, n_embd) normed input of a sub-block */
    be_tensor *xb2;     /* (B, n_embd) sub-block output; the gathered rows that want logits */
    be_tensor *q;       /* (B, n_head * head_dim) */
    be_tensor *k;       /* (B, n_head_kv * head_dim) */
    be_tensor *v;       /* (B, n_head_kv * head_dim) */
    be_tensor *att;     /* (B, n_head * head_dim) attention output */
    be_tensor *hb;      /* (B, n_ff) or (B * k, n_ff_exp) */
    be_tensor *hb2;     /* same */
    be_tensor *router;  /* (B, n_expert) */
    be_tensor *exp_ids; /* (B * k) i32 */
    be_tensor *exp_w;   /* (B * k) */
    be_tensor *moe_out; /* (B * k, n_embd) */
    be_tensor *logits;  /* (max_logits, n_vocab) */
    /* hybrids */
    be_tensor *qg;      /* (B, 2 n_head head_dim) gated q as projected: per head D queries then D gates */
    be_tensor *gate;    /* (B, n_head head_dim) */
    be_tensor *u;       /* (B, C) conv input, then output */
    be_tensor *z;       /* (B, Nv S) */
    be_tensor *ab, *bb; /* (B, Nv) alpha, beta projections */
    be_tensor *dq, *dk; /* (B, Nk S) */
    be_tensor *dv, *dout; /* (B, Nv S) */
    be_tensor *sh, *sh2; /* (B, n_ff_shexp) */
    be_tensor *shg;     /* (B, 1) shared-expert gate */
    be_tensor *shout;   /* (B, n_embd) */
    /* MTP (model_params.mtp with nextn layers) */
    be_tensor *hid;     /* (B, n_embd) each row's final hidden state (main step), or an MTP step's output states */
    be_tensor *cat;     /* (B, 2 n_embd) the MTP's [enorm(embed) | hnorm(hidden)] */
} model_scratch;

struct model {
    model_hparams hp;
    gguf_ctx *owned;        /* set when model_load opened the file */
    const gguf_ctx *g;
    be_backend *be;
    bool own_be;            /* made by model_load (freed with the model) */
    unsigned drop;          /* BE_W_DROP_SOURCE when the weights lie in a file mapping */
    model_params params;
    be_tensor *tok_embd;    /* (n_vocab, n_embd), read by get_rows */
    be_tensor *output_norm;
    be_tensor *output;      /* (n_embd -> n_vocab); a second handle on token_embd when tied */
    model_layer *layers;
    model_scratch s;
    const float *logits_host; /* the last step's logits rows, fetched */
    step_plan plan;         /* model_forward's own plans (grown on demand) */
    int32_t *seq_next;      /* hybrids: [max_seqs] model_step's continuity check */
    /* scratch that follows the load: the limits of load time, each activation
     * tensor with what its rows count (SC_*), and the row classes backed now */
    be_limits lim;
    be_act_rows sc_act[40];
    uint8_t sc_scale[40];
    int n_sc;
    int32_t sc_rows, sc_out; /* tokens and logits rows the backed scratch holds */
    /* MTP: the runnable layer (NULL: none), and the plan of model_mtp_step's row selection */
    model_layer *mtp;
    step_plan hplan;
};

#endif
