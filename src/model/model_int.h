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
    bool moe_remote;          /* cpu_moe: the routed experts (gate/up/down_exps) are the expert backend's */
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
    /* cpu_moe: a step's routed-expert input for the expert backend, one copy:
     * n rows of xb, then the n k routed ids (i32 bits), then their n k weights */
    be_tensor *moe_in;  /* (B, n_embd + 2 k) */
    be_tensor *logits;  /* (max_logits, n_vocab) */
    /* tensor parallel (rank 0's logits stay whole): this rank's vocabulary
     * slice of the logits, and every rank's slices gathered (rank-major) */
    be_tensor *lgl;     /* (max_logits, n_vocab / R) */
    be_tensor *lgg;     /* (R max_logits, n_vocab / R) */
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
    /* DFlash (model_params.dflash): the taps of each row, and the drafter's
     * own projections (its x, xb, xb2 and logits are the model's: the
     * drafter runs between target steps, at the target's width) */
    be_tensor *taps;    /* (B, T n_embd) each row's tapped residual streams, side by side */
    be_tensor *fq, *fatt; /* (B, drafter n_head * head_dim) */
    be_tensor *fk, *fv; /* (B, drafter n_head_kv * head_dim) */
    be_tensor *fhb, *fhb2; /* (B, drafter n_ff) */
} model_scratch;

/* The routed experts' tensors on one backend: their input rows, the routing,
 * the experts' scratch and the weighted sum. The main backend's are views of
 * model_scratch (xb, exp_ids, exp_w, hb, hb2, moe_out, xb2); the expert
 * backend's (cpu_moe) are its own. */
typedef struct model_moe_io {
    be_tensor *x;        /* (B, n_embd) the normed input rows */
    be_tensor *ids, *w;  /* (B, k) routed experts (i32) and their weights */
    be_tensor *hb, *hb2; /* (B * k, n_ff_exp) */
    be_tensor *y;        /* (B * k, n_embd) each routed expert's output */
    be_tensor *out;      /* (B, n_embd) the weighted sum */
} model_moe_io;

/* A tensor-parallel rank: its backend, its share of every layer, its
 * activations. Rank 0's fields point at the model's own (be, layers, s,
 * tok_embd, ...), so that without tensor parallel rank 0 is the model;
 * the others own theirs. The shapes of a rank's share are the model's
 * (m->rk_*). */
typedef struct model_rank {
    be_backend *be;
    bool own_be;
    model_layer *layers;
    model_scratch *s;
    be_tensor *tok_embd, *output_norm, *output;
    /* ranks 1..: their scratch and what it backs (rank 0's are the model's) */
    model_scratch own_s;
    be_limits lim;
    be_act_rows sc_act[16];
    uint8_t sc_scale[16];
    int n_sc;
} model_rank;

/* A DFlash drafter loaded with the model (model_dflash.c; model.h says what it computes). */
typedef struct model_dfl {
    model_dflash_info info;
    float rope_base, rms_eps;
    const gguf_ctx *g;
    be_tensor *fc;          /* (T n_embd -> n_embd) */
    be_tensor *enc_norm;    /* (n_embd) after fc */
    be_tensor *out_norm;    /* (n_embd) before the output matrix */
    be_tensor *tok_embd;    /* its own embedding table, or NULL: the target's */
    be_tensor *output;      /* its own output matrix, or NULL: the target's */
    model_layer *layers;    /* attn_norm, wq/wk/wv/wo, q_norm/k_norm, ffn_norm, w_gate/w_up/w_down */
    step_plan aplan;        /* a block's attention view of its plan: the plan's arrays but positions apos */
    int32_t *apos;          /* [max_batch] every row at its sequence's last position */
    step_plan gplan;        /* the taps' row selection: no sequences, the selected rows wanted */
} model_dfl;

struct model {
    model_hparams hp;
    gguf_ctx *owned;        /* set when model_load opened the file */
    const gguf_ctx *g;
    be_backend *be;
    bool own_be;            /* made by model_load (freed with the model) */
    /* cpu_moe: the expert backend, holding the routed experts of the last
     * n_moe_remote layers (NULL and 0: none) */
    be_backend *xbe;
    bool own_xbe;
    int n_moe_remote;
    model_moe_io mio, xio;  /* the routed experts' tensors on the main and the expert backend */
    const void *moe_host;   /* a step's fetched moe_in, valid after the main backend's sync */
    size_t wbytes[2];       /* weight bytes loaded onto the main and the expert backend */
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
    be_limits lim, xlim;    /* the main backend's and the expert backend's */
    be_act_rows sc_act[48];
    uint8_t sc_scale[48];
    int n_sc;
    be_act_rows xsc_act[8]; /* the expert backend's activation tensors */
    uint8_t xsc_scale[8];
    int n_xsc;
    int32_t sc_rows, sc_out; /* tokens and logits rows the backed scratch holds */
    /* MTP: the runnable layer (NULL: none), and the plan of model_mtp_step's row selection */
    model_layer *mtp;
    step_plan hplan;
    /* DFlash: the drafter (NULL: none) */
    model_dfl *dfl;
    /* tensor parallel: n_ranks ranks (1 without; rk[0] is the model's own
     * fields), their communicator (NULL with one rank), and what each rank
     * holds of the heads, kv heads, FFN width and vocabulary */
    int n_ranks;
    model_rank rk[8];
    struct hn_comm *comm;
    int32_t rk_head, rk_head_kv, rk_ff, rk_vocab;
    /* host copies of the column slices of row-parallel weights (the ranks'
     * backends may reference them: freed after the backends) */
    void **slices;
    int n_slices, cap_slices;
};

/* model.c's weight binding, for the drafter's file too: a matrix read by
 * matmuls (or, flags BE_W_ROWS, an embedding table), and an f32 vector.
 * Missing and not required: *w NULL. */
hn_status model_bind_from(model *m, const gguf_ctx *g, const char *name, int n_dims, int64_t ne0, int64_t ne1,
                          int64_t ne2, bool required, unsigned flags, be_tensor **w, hn_err *err);
hn_status model_bind_vec_from(model *m, const gguf_ctx *g, const char *name, int64_t n, bool required,
                              be_tensor **out, hn_err *err);

/* model_dflash.c, for model.c's load: reads and checks the drafter's
 * metadata against the model (m->dfl made), its activation tensors (added
 * to parts, each with its rows class), its matmuls' widest input, then its
 * weights and plans, and the free. */
hn_status model_dflash_read(model *m, const gguf_ctx *g, hn_err *err);
int64_t model_dflash_max_k(const model *m);
hn_status model_dflash_bind(model *m, hn_err *err);
void model_dflash_free(model *m);

#endif
