/* cuda_state.cuh: private to backend/cuda: the cuda backend's state (one
 * cu_be per backend), its recorded steps (cu_rec, cu_graph), and the
 * functions its two halves share: cuda_backend.cu (memory, the KV pool's
 * storage, the plan, copies, CUDA graphs, lifecycle) and cuda_ops.cu (the
 * compute ops, the records' execution and their fusion). */
#ifndef HN_CUDA_STATE_CUH
#define HN_CUDA_STATE_CUH

#include <cuda.h> /* the driver API's types only: its functions are looked up at run time */

#include "cuda_be_int.cuh"

/* ---- state ---- */

/* a handle and what backs it (t first: a be_tensor * is a cu_tensor *) */
typedef struct cu_tensor {
    be_tensor t;
    hc_weight hw;  /* the hc_gemv form (has_hw) */
    bool has_hw;
    void *raw;     /* the file's bytes on the device, or NULL */
} cu_tensor;

/* the driver's virtual memory functions */
typedef CUresult (*pf_reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*pf_free)(CUdeviceptr, size_t);
typedef CUresult (*pf_create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
typedef CUresult (*pf_release)(CUmemGenericAllocationHandle);
typedef CUresult (*pf_map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
typedef CUresult (*pf_unmap)(CUdeviceptr, size_t);
typedef CUresult (*pf_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
typedef CUresult (*pf_gran)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);
typedef CUresult (*pf_errstr)(CUresult, const char **);

typedef struct vmm_api {
    void *lib;
    pf_reserve reserve;
    pf_free addr_free;
    pf_create create;
    pf_release release;
    pf_map map;
    pf_unmap unmap;
    pf_access access;
    pf_gran gran;
    pf_errstr errstr;
} vmm_api;

#define KV_RANGES 16

/* tuned decode-gemv parameters of one weight shape from min_rows rows on (set_mm_params) */
#define CU_MM_SHAPES 256
typedef struct cu_mm_shape {
    qt_type type;
    int64_t k, n;
    int min_rows;
    hc_gemv_params p; /* 0 fields: the built-in choice */
} cu_mm_shape;

/* one reserved KV range: its granules' handles (0: not mapped) */
typedef struct kv_range {
    void *base;
    size_t bytes;
    CUmemGenericAllocationHandle *h;
} kv_range;

typedef struct cu_be {
    be_backend base;
    int device;
    cudaStream_t stream;
    bool ref;
    be_limits lim;
    hc_gemv_scratch gs;
    /* x as the CPU's integer dots see it, for the dequantizing matmuls (cm_act_round) */
    float *xr;
    size_t xr_cap; /* floats */
    /* the split attention's partials (ck_attention; NULL: the one-block-per-head form) */
    float *att_part;
    size_t att_part_cap; /* floats */
    /* hc_mmf_slots' workspace (the expert sort) for max_rows slots of max_experts */
    void *slot_work;
    size_t slot_work_cap; /* bytes */
    bool att_split;
    bool combine2; /* the split attention's chunks combined by k_attn_combine2 (HONE_CUDA_COMBINE=1) */
    bool mmreg;    /* an f32 matrix's prefill rows on k_mm_reg (HONE_CUDA_MMREG=1) */
    bool prompt_rows; /* the plan's prompt rows in the prefill form however few (HONE_CUDA_PROMPT=1) */
    /* decode steps' records fused where a kernel does several (rec_run; HONE_CUDA_FUSE=0: off) */
    bool fuse;
    /* prefill rows' matmuls on hc_mmf (HONE_CUDA_MMF=0: off); per plan row and
     * per logits row whether it is a prefill row (pf_of), and of each set
     * whether none (0), all (1) or some (2) are */
    bool mmf;
    bool slots; /* expert stacks' products on hc_gemv_slots (HONE_CUDA_SLOTS=0: the f32 tile kernels) */
    bool slots2; /* a MoE's gate and up (and their swiglu) in one hc_gemv_slots2 launch (HONE_CUDA_SLOTS2=1) */
    bool pdl; /* programmatic dependent launch (hc_launch), HONE_CUDA_PDL */
    bool rtc; /* rms_norm by its NVRTC specialisation (HONE_CUDA_RTC=1; not yet run on a GPU) */
    uint8_t *pf_row, *pf_out;
    int32_t *pf_cnt;
    int pf_rows_kind, pf_out_kind;
    long long mmf_calls;
    long long fused;
    /* prefill attention on the tensor cores (ck_fattn; HONE_CUDA_FATTN=0: off):
     * the plan's runs of prefill rows (one sequence, consecutive positions,
     * at least FA_MIN_RUN rows) as tiles (first token, tokens), and the
     * rows outside them, which take ck_attention (fa_of) */
    bool fattn;
    const int32_t *d_fa_tiles, *d_fa_rest;
    int32_t *h_fa; /* host staging of both (plan_cap words) */
    int32_t n_fa_tiles, n_fa_rest;
    long long fattn_calls;
    long long fdec_calls; /* attention calls whose other rows could take ck_fattn_dec */
    /* the activation arena and every handle made */
    unsigned char *arena;
    size_t arena_cap, arena_used;
    cu_tensor **tensors;
    int n_tensors, cap_tensors;
    /* the plan on the device: host scalars, device arrays (one buffer), pinned staging */
    bool have_plan;
    int32_t n_rows, n_tokens, n_seqs, n_out, bt_stride;
    int32_t *d_plan, *h_plan;
    size_t plan_cap; /* int32 words */
    const int32_t *d_token, *d_pos, *d_seq, *d_slot, *d_seq_len, *d_bt, *d_out_rows, *d_state_slot, *d_state_snap;
    int32_t *h_state_slot; /* [n_seqs] the plan's state slots on the host, to check them (plan_cap words) */
    int32_t *h_state_snap; /* [n_rows] the plan's snapshot slots on the host, to check them (plan_cap words) */
    cudaEvent_t plan_ev; /* the last staging copy */
    bool plan_ev_live;
    /* fetch: pinned host memory */
    unsigned char *h_fetch;
    size_t fetch_cap, fetch_used;
    bool fetch_fresh;
    /* mask_logits' bitmasks on the device */
    uint32_t *d_mask;
    size_t mask_cap, mask_used; /* words */
    /* the first error since the last sync */
    hn_status err;
    char err_msg[256];
    /* the KV pool's storage */
    kv_storage storage;
    vmm_api vmm;
    bool use_vmm;
    CUmemAllocationProp prop;
    kv_range ranges[KV_RANGES];
    /* CUDA graphs for small steps (cu_graph below) */
    bool graphs, recording, graph_direct;
    struct cu_rec *rec;
    int n_rec, cap_rec;
    struct cu_graph *gcache; /* GRAPH_CACHE entries */
    unsigned long long gtick;
    unsigned char *h_mask; /* pinned staging of the masks recorded this step (mask_cap words) */
    long long graph_hits, graph_builds;
    /* the tuner's parameters for hc_gemv: per weight type (every shape) and per shape and call size */
    hc_gemv_params mm_type[QT_TYPE_COUNT];
    cu_mm_shape mm_shape[CU_MM_SHAPES];
    int n_mm_shape;
} cu_be;

/* every op starts here: hc_launch's programmatic-launch switch is this backend's */
static inline cu_be *cu_of(be_backend *b) {
    cu_be *cb = (cu_be *)b->impl;
    hc_pdl = cb->pdl;
    return cb;
}
static inline float *F(const be_tensor *t) { return (float *)t->data; }


#define GRAPH_MAX_ROWS 8
#define GRAPH_CACHE 8
#define REC_IDS_MAX 16

enum {
    R_HEADER, R_GET_ROWS, R_MATMUL, R_MULTI, R_RMS_NORM, R_ROPE, R_ADD, R_ADD_BIAS, R_SWIGLU, R_KV_STORE,
    R_ATTENTION, R_MOE_ROUTE, R_MOE_MATMUL, R_MOE_COMBINE, R_GATHER_OUT, R_MASK, R_FETCH, R_COPY_COLS,
    R_SIGMOID_MUL, R_L2_NORM, R_ROPE_MULTI, R_SSM_CONV, R_DELTA_NET, R_STATE_COPY
};

typedef struct cu_rec {
    int kind;
    union {
        struct {
            int32_t n_rows, n_tokens, n_seqs, n_out, bt_stride;
            const int32_t *d[9];
            uint32_t pf; /* the prefill rows (bits 0..7) and logits rows (8..15): they choose kernels */
        } hdr;
        struct {
            const be_tensor *w, *x, *y, *w2, *y2;
            int i0, i1, i2, i3, i4;
            float f0;
            size_t z0;
            const kv_cache *kv;
        } g; /* the generic form: most ops */
        struct {
            int n_w, n;
            const be_tensor *ws[BE_MULTI_MAX], *x, *ys[BE_MULTI_MAX];
        } multi;
        be_attn_args attn;
        be_delta_args delta;
        struct {
            be_tensor *x;
            int n, n_head, head_dim, n_rot;
            float freq_base;
            int32_t sections[4];
        } rope_multi;
        struct {
            const kv_cache *kv;
            int n;
            int32_t src[REC_IDS_MAX], dst[REC_IDS_MAX];
        } copy;
        struct {
            void *dst;
            const void *src;
            size_t bytes, off;
            int64_t n_vocab;
            int row;
            const be_tensor *t;
        } mem; /* fetch, mask */
    } u;
} cu_rec;

typedef struct cu_graph {
    cu_rec *rec;
    int n_rec, cap_rec;
    cudaGraphExec_t exec;
    unsigned long long used;
} cu_graph;


/* ---- shared between cuda_backend.cu and cuda_ops.cu ---- */

/* errors: the first one since the last sync is kept (cuda_backend.cu) */
void cu_errf(cu_be *cb, hn_status st, const char *fmt, ...);
void cu_cuda(cu_be *cb, cudaError_t e, const char *what);
void cu_hn(cu_be *cb, hn_status st, const hn_err *e, const char *what);
/* the plan for an op that reads it; rows within it */
bool need_plan(cu_be *cb, const char *op);
bool rows_ok(cu_be *cb, const char *op, int n);
/* a KV cache's geometry on the device; a weight as the dequantizing kernels see it */
bool kv_geo(cu_be *cb, const kv_cache *kv, const char *op, ck_kv *g);
/* the reserved KV range that starts at base, or NULL */
kv_range *range_of(cu_be *cb, void *base);
cm_w cm_of(const be_tensor *w, bool rows);
/* recording a step: a zeroed record (NULL when not recording); leaving recording */
cu_rec *rec_push(cu_be *cb, int kind);
void rec_flush_direct(cu_be *cb);
/* runs n records with fusion (cuda_ops.cu) */
void rec_run(cu_be *cb, const cu_rec *r, int n);
/* sets the compute ops of the backend's table (cuda_ops.cu) */
void cu_compute_ops(be_ops *o);
/* the hc_gemv parameters for weight w at na rows (the tuner's, else zeros:
 * the built-in choice), with reuse_x (cuda_tune.cu) */
hc_gemv_params cu_mm_params(const cu_be *cb, const be_tensor *w, int na, int reuse_x);
/* sets the tuning ops of the backend's table (cuda_tune.cu); drop_graphs is
 * what a change of parameters calls (captured graphs hold the old kernels) */
void cu_tune_ops(be_ops *o, void (*drop_graphs)(cu_be *cb));

#endif
