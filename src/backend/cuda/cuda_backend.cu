/* cuda_backend.cu: the cuda backend's be_ops (backend.h is the contract,
 * cuda_backend.h the entry points): device memory for tensors, the KV pool's
 * storage, the step's plan on the device, the copies, the single error point,
 * and the compute ops over the kernels of cuda_gemv.cu (decode matmuls, and
 * hc_mmq from HC_MMQ_MIN_ROWS rows: the same bits per row), cuda_mmf.cu
 * (prefill rows' matmuls on the f16 tensor cores), cuda_mm.cu (dequantizing matmuls, get_rows) and cuda_kern.cu (the rest).
 *
 * Everything is queued on one stream; sync waits for it. A CUDA error never
 * aborts: the first one since the last sync (or a call out of contract) is
 * recorded with a message naming the op, and sync returns it.
 *
 * Memory: activations are carved from one device arena (cudaMalloc at
 * reserve); weights are uploaded at weight_load, the nine hc_gemv types as an
 * hc_weight (its planes; expert stacks as one matrix of N x mats rows), the
 * others, and every weight that get_rows reads (BE_W_ROWS) or that no matmul
 * reads, as the file's bytes. fetch copies into one pinned host buffer of
 * arena_bytes (reset at the first fetch after a sync). The KV pool's range is
 * reserved with the driver's virtual memory API (cuMemAddressReserve, and
 * cuMemCreate + cuMemMap + cuMemSetAccess per granule as slabs are mapped),
 * resolved at run time from libcuda.so.1 so that the binary needs no driver
 * to link or start; without those symbols (or with HONE_CUDA_NO_VMM=1) the
 * whole range is one cudaMalloc at reserve and map/unmap do nothing.
 *
 * Allocations after load: the plan's device buffer and its pinned staging
 * grow at plan_set when a plan is larger than any before, and the mask buffer
 * at mask_logits likewise; both stop once the largest step has been seen. */
#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h> /* the driver API's types only: its functions are looked up at run time */

#include "cuda_backend.h"
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
    bool att_split;
    /* decode steps' records fused where a kernel does several (rec_run; HONE_CUDA_FUSE=0: off) */
    bool fuse;
    /* prefill rows' matmuls on hc_mmf (HONE_CUDA_MMF=0: off); per plan row and
     * per logits row whether it is a prefill row (pf_of), and of each set
     * whether none (0), all (1) or some (2) are */
    bool mmf;
    uint8_t *pf_row, *pf_out;
    int32_t *pf_cnt;
    int pf_rows_kind, pf_out_kind;
    long long mmf_calls;
    long long fused;
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
} cu_be;

static inline cu_be *cu_of(be_backend *b) { return (cu_be *)b->impl; }
static inline float *F(const be_tensor *t) { return (float *)t->data; }

/* ---- errors ---- */

static void cu_errf(cu_be *cb, hn_status st, const char *fmt, ...) {
    if (cb->err) return;
    cb->err = st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cb->err_msg, sizeof cb->err_msg, fmt, ap);
    va_end(ap);
}

/* records a CUDA error of op `what` (cudaSuccess: nothing) */
static void cu_cuda(cu_be *cb, cudaError_t e, const char *what) {
    if (e == cudaSuccess) return;
    (void)cudaGetLastError();
    if (e == cudaErrorNotSupported) {
        cu_errf(cb, HN_ERR_UNSUPPORTED, "cuda backend: %s: not supported", what);
        return;
    }
    cu_errf(cb, hc_status_of(e), "cuda backend: %s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

/* records an hc_* call's failure */
static void cu_hn(cu_be *cb, hn_status st, const hn_err *e, const char *what) {
    if (st) cu_errf(cb, st, "cuda backend: %s: %s", what, e->msg);
}

/* the plan for an op that reads it; without one the op does nothing and sync fails */
static bool need_plan(cu_be *cb, const char *op) {
    if (!cb->have_plan) cu_errf(cb, HN_ERR_INVALID, "cuda backend: %s before plan_set", op);
    return cb->have_plan;
}

static bool rows_ok(cu_be *cb, const char *op, int n) {
    if (n < 0 || n > cb->n_rows) {
        cu_errf(cb, HN_ERR_RANGE, "cuda backend: %s of %d rows, the plan has %d", op, n, (int)cb->n_rows);
        return false;
    }
    return true;
}

/* ---- the KV pool's storage ---- */

static const char *cu_str(cu_be *cb, CUresult r) {
    const char *s = NULL;
    if (cb->vmm.errstr) cb->vmm.errstr(r, &s);
    return s ? s : "unknown driver error";
}

static void vmm_load(cu_be *cb) {
    vmm_api *v = &cb->vmm;
    memset(v, 0, sizeof *v);
    const char *off = getenv("HONE_CUDA_NO_VMM");
    if (off && *off && strcmp(off, "0")) return;
    v->lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!v->lib) return;
    v->reserve = (pf_reserve)dlsym(v->lib, "cuMemAddressReserve");
    v->addr_free = (pf_free)dlsym(v->lib, "cuMemAddressFree");
    v->create = (pf_create)dlsym(v->lib, "cuMemCreate");
    v->release = (pf_release)dlsym(v->lib, "cuMemRelease");
    v->map = (pf_map)dlsym(v->lib, "cuMemMap");
    v->unmap = (pf_unmap)dlsym(v->lib, "cuMemUnmap");
    v->access = (pf_access)dlsym(v->lib, "cuMemSetAccess");
    v->gran = (pf_gran)dlsym(v->lib, "cuMemGetAllocationGranularity");
    v->errstr = (pf_errstr)dlsym(v->lib, "cuGetErrorString");
    if (!v->reserve || !v->addr_free || !v->create || !v->release || !v->map || !v->unmap || !v->access || !v->gran)
        return;
    memset(&cb->prop, 0, sizeof cb->prop);
    cb->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    cb->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    cb->prop.location.id = cb->device;
    size_t g = 0;
    if (v->gran(&g, &cb->prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS || !g || (g & (g - 1))) return;
    cb->storage.granule = g;
    cb->use_vmm = true;
}

static kv_range *range_of(cu_be *cb, void *base) {
    for (int i = 0; i < KV_RANGES; i++)
        if (cb->ranges[i].base == base && base) return &cb->ranges[i];
    return NULL;
}

static hn_status kvs_reserve(void *ctx, size_t bytes, void **base, hn_err *err) {
    cu_be *cb = (cu_be *)ctx;
    *base = NULL;
    const size_t G = cb->storage.granule;
    const size_t size = (bytes + G - 1) / G * G;
    kv_range *r = range_of(cb, NULL);
    for (int i = 0; i < KV_RANGES && !r; i++)
        if (!cb->ranges[i].base) r = &cb->ranges[i];
    if (!r) return hn_errf(err, HN_ERR_FULL, "cuda backend: more than %d KV ranges", KV_RANGES);
    if (!size) return hn_errf(err, HN_ERR_INVALID, "cuda backend: an empty KV range");
    if (cb->use_vmm) {
        r->h = (CUmemGenericAllocationHandle *)calloc(size / G, sizeof *r->h);
        if (!r->h) return hn_errf(err, HN_ERR_NOMEM, "cuda backend: out of host memory");
        CUdeviceptr p = 0;
        CUresult e = cb->vmm.reserve(&p, size, G, 0, 0);
        if (e != CUDA_SUCCESS) {
            free(r->h);
            r->h = NULL;
            return hn_errf(err, HN_ERR_NOMEM, "cuda backend: reserving %zu bytes of address space for the KV pool: %s",
                           size, cu_str(cb, e));
        }
        r->base = (void *)p;
    } else {
        void *p = NULL;
        hn_status st = hc_malloc(&p, size, err);
        if (st) return st;
        r->base = p;
    }
    r->bytes = size;
    *base = r->base;
    return HN_OK;
}

static void kvs_unmap(void *ctx, void *base, size_t off, size_t len) {
    cu_be *cb = (cu_be *)ctx;
    kv_range *r = range_of(cb, base);
    if (!r || !cb->use_vmm) return;
    /* kernels queued before may still read these blocks */
    cu_cuda(cb, cudaStreamSynchronize(cb->stream), "waiting before a KV unmap");
    const size_t G = cb->storage.granule;
    for (size_t g = off / G; g < (off + len) / G && g < r->bytes / G; g++) {
        if (!r->h[g]) continue;
        cb->vmm.unmap((CUdeviceptr)base + g * G, G);
        cb->vmm.release(r->h[g]);
        r->h[g] = 0;
    }
}

static hn_status kvs_map(void *ctx, void *base, size_t off, size_t len, hn_err *err) {
    cu_be *cb = (cu_be *)ctx;
    kv_range *r = range_of(cb, base);
    if (!r) return hn_errf(err, HN_ERR_INVALID, "cuda backend: map outside a reserved KV range");
    const size_t G = cb->storage.granule;
    if (off % G || len % G || off + len > r->bytes)
        return hn_errf(err, HN_ERR_INVALID, "cuda backend: KV map [%zu, +%zu) not granule-aligned in the range", off, len);
    if (!cb->use_vmm) return HN_OK;
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location = cb->prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    for (size_t g = off / G; g < (off + len) / G; g++) {
        if (r->h[g]) continue;
        CUmemGenericAllocationHandle h = 0;
        const CUdeviceptr at = (CUdeviceptr)base + g * G;
        const char *what = "cuMemCreate";
        CUresult e = cb->vmm.create(&h, G, &cb->prop, 0);
        if (e == CUDA_SUCCESS) {
            what = "cuMemMap";
            e = cb->vmm.map(at, G, 0, h, 0);
            if (e == CUDA_SUCCESS) {
                what = "cuMemSetAccess";
                e = cb->vmm.access(at, G, &acc, 1);
                if (e != CUDA_SUCCESS) cb->vmm.unmap(at, G);
            }
            if (e != CUDA_SUCCESS) cb->vmm.release(h);
        }
        if (e != CUDA_SUCCESS) {
            kvs_unmap(ctx, base, off, (g - off / G) * G);
            return hn_errf(err, e == CUDA_ERROR_OUT_OF_MEMORY ? HN_ERR_NOMEM : HN_ERR_INTERNAL,
                           "cuda backend: mapping %zu bytes of the KV pool: %s: %s", G, what, cu_str(cb, e));
        }
        r->h[g] = h;
    }
    return HN_OK;
}

static void kvs_release(void *ctx, void *base, size_t bytes) {
    (void)bytes;
    cu_be *cb = (cu_be *)ctx;
    kv_range *r = range_of(cb, base);
    if (!r) return;
    if (cb->use_vmm) {
        kvs_unmap(ctx, base, 0, r->bytes);
        cb->vmm.addr_free((CUdeviceptr)base, r->bytes);
        free(r->h);
    } else {
        cu_cuda(cb, cudaStreamSynchronize(cb->stream), "waiting before freeing the KV pool");
        hc_free(base);
    }
    memset(r, 0, sizeof *r);
}

static const kv_storage *op_kv_storage(be_backend *b) { return &cu_of(b)->storage; }

/* the cache's geometry for the kernels; false (error recorded) when it is not ours */
static bool kv_geo(cu_be *cb, const kv_cache *kv, const char *op, ck_kv *g) {
    if (!kv || kv->storage != &cb->storage || !range_of(cb, kv->base)) {
        cu_errf(cb, HN_ERR_INVALID, "cuda backend: %s: the KV cache's storage is not this backend's", op);
        return false;
    }
    if (!ck_kv_type_ok(kv->cfg.type, false) || !ck_kv_type_ok(kv->cfg.v_type, true)) {
        cu_errf(cb, HN_ERR_UNSUPPORTED, "cuda backend: %s: K %s / V %s cache", op, qt_name(kv->cfg.type),
                qt_name(kv->cfg.v_type));
        return false;
    }
    g->base = (unsigned char *)kv->base;
    g->block_bytes = kv->block_bytes;
    g->layer_bytes = kv->layer_bytes;
    g->k_row_bytes = kv->k_row_bytes;
    g->v_row_bytes = kv->v_row_bytes;
    g->k_head_bytes = kv->k_head_bytes;
    g->v_head_bytes = kv->v_head_bytes;
    g->block_size = kv->cfg.block_size;
    g->kt = kv->cfg.type;
    g->vt = kv->cfg.v_type;
    g->row_elems = (int64_t)kv->row_elems;
    return true;
}

/* ---- tensors ---- */

static hn_status track(cu_be *cb, cu_tensor *t, hn_err *err) {
    if (cb->n_tensors == cb->cap_tensors) {
        int cap = cb->cap_tensors ? 2 * cb->cap_tensors : 256;
        void *np = realloc(cb->tensors, sizeof *cb->tensors * (size_t)cap);
        if (!np) return hn_errf(err, HN_ERR_NOMEM, "cuda backend: out of host memory");
        cb->tensors = (cu_tensor **)np;
        cb->cap_tensors = cap;
    }
    cb->tensors[cb->n_tensors++] = t;
    return HN_OK;
}

static void tensor_free(cu_tensor *t) {
    if (!t) return;
    if (t->has_hw) hc_weight_free(&t->hw);
    hc_free(t->raw);
    free(t);
}

static hn_status op_tensor_new(be_backend *b, qt_type type, int64_t ne0, int64_t ne1, be_tensor **out, hn_err *err) {
    cu_be *cb = cu_of(b);
    *out = NULL;
    if ((type != QT_F32 && type != QT_I32) || ne0 < 1 || ne1 < 1)
        return hn_errf(err, HN_ERR_INVALID, "cuda backend: bad activation tensor (%s, %lld x %lld)", qt_name(type),
                       (long long)ne0, (long long)ne1);
    size_t bytes = be_tensor_bytes(type, ne0, ne1);
    if (bytes > cb->arena_cap - cb->arena_used)
        return hn_errf(err, HN_ERR_RANGE, "cuda backend: activation arena full (%zu of %zu bytes used, %zu more asked)",
                       cb->arena_used, cb->arena_cap, bytes);
    cu_tensor *t = (cu_tensor *)calloc(1, sizeof *t);
    if (!t) return hn_errf(err, HN_ERR_NOMEM, "cuda backend: out of host memory");
    t->t.type = type;
    t->t.ne[0] = ne0;
    t->t.ne[1] = ne1;
    t->t.ne[2] = 1;
    t->t.row_bytes = (size_t)ne0 * 4;
    t->t.mat_bytes = t->t.row_bytes * (size_t)ne1;
    t->t.data = cb->arena + cb->arena_used;
    hn_status st = track(cb, t, err);
    if (st) {
        free(t);
        return st;
    }
    cb->arena_used += bytes;
    *out = &t->t;
    return HN_OK;
}

static hn_status op_weight_load(be_backend *b, const be_weight_src *src, unsigned flags, be_tensor **out,
                                hn_err *err) {
    cu_be *cb = cu_of(b);
    *out = NULL;
    size_t rb;
    hn_status cst = be_weight_src_check(src, "cuda", &rb, err);
    if (cst) return cst;
    cu_tensor *t = (cu_tensor *)calloc(1, sizeof *t);
    if (!t) return hn_errf(err, HN_ERR_NOMEM, "cuda backend: out of host memory");
    const size_t bytes = rb * (size_t)src->ne[1] * (size_t)src->ne[2];
    const bool gemv = (flags & BE_W_MATMUL) && hc_gemv_supports(src->type);
    hn_status st = HN_OK;
    if (gemv) st = hc_weight_upload(&t->hw, src->type, src->ne[0], src->ne[1] * src->ne[2], src->data, err);
    if (!st && gemv) t->has_hw = true;
    if (!st && (!gemv || (flags & BE_W_ROWS))) {
        st = hc_malloc(&t->raw, bytes, err);
        if (!st) st = hc_upload(t->raw, src->data, bytes, err);
    }
    if (!st) st = track(cb, t, err);
    if (st) {
        tensor_free(t);
        return st;
    }
    t->t.type = src->type;
    memcpy(t->t.ne, src->ne, sizeof t->t.ne);
    t->t.row_bytes = rb;
    t->t.mat_bytes = rb * (size_t)src->ne[1];
    t->t.data = t->raw ? t->raw : t->hw.mem;
    t->t.packed = t->has_hw ? &t->hw : NULL;
    t->t.layout = t->has_hw ? 1 : 0;
    *out = &t->t;
    return HN_OK;
}

/* the dequantizing kernels' view of a weight (planes when it has them, unless rows wants the file's bytes) */
static cm_w cm_of(const be_tensor *w, bool rows) {
    const cu_tensor *t = (const cu_tensor *)w;
    cm_w c;
    memset(&c, 0, sizeof c);
    c.type = w->type;
    c.planes = t->has_hw && !(rows && t->raw);
    c.raw = (const uint8_t *)t->raw;
    c.row_bytes = w->row_bytes;
    if (t->has_hw)
        for (int i = 0; i < 4; i++) c.plane[i] = t->hw.plane[i];
    c.k = w->ne[0];
    c.n = w->ne[1];
    c.mats = w->ne[2];
    return c;
}

/* ---- the step ---- */

/* ---- CUDA graphs ----
 * A small step (at most GRAPH_MAX_ROWS plan rows: decode) is recorded, not
 * launched: between plan_set and sync each op appends its arguments to
 * cb->rec (the plan's copy itself goes out at plan_set, into device buffers
 * whose addresses the records name). At sync the records are compared with
 * those of the graphs captured before (every kernel argument is in them, the
 * plan's scalars and device addresses included in a header): on a match the
 * captured graph is launched, one launch for the whole step; otherwise the
 * records run once under stream capture, the graph is instantiated (or an
 * old executable updated in place) and launched. A step that does something
 * a graph cannot hold (an upload from pageable memory, a mask buffer that
 * must grow, reference mode) runs its records directly and goes on
 * directly. HONE_CUDA_GRAPHS=0 turns graphs off. */

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

static void rec_exec(cu_be *cb, const cu_rec *r);
static void rec_run(cu_be *cb, const cu_rec *r, int n);

/* a zeroed record of this kind (padding included, so that records compare
 * with memcmp), or NULL when the step has left recording (the op then runs directly) */
static cu_rec *rec_push(cu_be *cb, int kind) {
    if (!cb->recording) return NULL;
    if (cb->n_rec == cb->cap_rec) {
        const int cap = cb->cap_rec ? 2 * cb->cap_rec : 1024;
        cu_rec *nr = (cu_rec *)realloc(cb->rec, sizeof(cu_rec) * (size_t)cap);
        if (!nr) {
            cu_errf(cb, HN_ERR_NOMEM, "cuda backend: out of host memory recording a step");
            return NULL;
        }
        cb->rec = nr;
        cb->cap_rec = cap;
    }
    cu_rec *r = &cb->rec[cb->n_rec++];
    memset(r, 0, sizeof *r);
    r->kind = kind;
    return r;
}

/* leaves recording for this step: what was recorded runs now, the rest directly */
static void rec_flush_direct(cu_be *cb) {
    if (!cb->recording) return;
    cb->recording = false;
    rec_run(cb, cb->rec, cb->n_rec);
    cb->n_rec = 0;
}

/* the step's records as one graph launch (at sync) */
static void rec_launch(cu_be *cb) {
    cb->recording = false;
    const int n = cb->n_rec;
    cb->n_rec = 0;
    if (cb->err) return; /* an op already failed at its call: nothing runs, sync reports it */
    cu_graph *hit = NULL, *victim = &cb->gcache[0];
    for (int i = 0; i < GRAPH_CACHE; i++) {
        cu_graph *g = &cb->gcache[i];
        if (g->exec && g->n_rec == n && !memcmp(g->rec, cb->rec, sizeof(cu_rec) * (size_t)n)) {
            hit = g;
            break;
        }
        if (!g->exec || (victim->exec && g->used < victim->used)) victim = g;
    }
    if (hit) {
        hit->used = ++cb->gtick;
        cb->graph_hits++;
        cu_cuda(cb, cudaGraphLaunch(hit->exec, cb->stream), "graph launch");
        return;
    }
    /* capture: the records run once into a graph */
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamBeginCapture(cb->stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
        cu_cuda(cb, e, "graph capture");
        return;
    }
    rec_run(cb, cb->rec, n);
    e = cudaStreamEndCapture(cb->stream, &graph);
    if (e != cudaSuccess || cb->err) {
        if (graph) cudaGraphDestroy(graph);
        cu_cuda(cb, e, "graph capture");
        (void)cudaGetLastError();
        return;
    }
    /* into the least recently used entry: its executable updated in place when the shapes allow */
    cu_graph *g = victim;
    bool updated = false;
    if (g->exec) {
        cudaGraphExecUpdateResultInfo info;
        updated = cudaGraphExecUpdate(g->exec, graph, &info) == cudaSuccess;
        if (!updated) {
            (void)cudaGetLastError();
            cudaGraphExecDestroy(g->exec);
            g->exec = NULL;
        }
    }
    if (!updated) e = cudaGraphInstantiate(&g->exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
        g->exec = NULL;
        g->n_rec = 0;
        cu_cuda(cb, e, "graph instantiate");
        return;
    }
    if (n > g->cap_rec) {
        cu_rec *nr = (cu_rec *)realloc(g->rec, sizeof(cu_rec) * (size_t)cb->cap_rec);
        if (!nr) {
            cudaGraphExecDestroy(g->exec);
            g->exec = NULL;
            g->n_rec = 0;
            cu_errf(cb, HN_ERR_NOMEM, "cuda backend: out of host memory caching a graph");
            return;
        }
        g->rec = nr;
        g->cap_rec = cb->cap_rec;
    }
    memcpy(g->rec, cb->rec, sizeof(cu_rec) * (size_t)n);
    g->n_rec = n;
    g->used = ++cb->gtick;
    cb->graph_builds++;
    cu_cuda(cb, cudaGraphLaunch(g->exec, cb->stream), "graph launch");
}

/* Forgets every captured graph (they hold the scratch's device pointers:
 * after reserve reallocates scratch, a replay would read freed memory). */
static void graphs_drop(cu_be *cb) {
    if (!cb->gcache) return;
    for (int i = 0; i < GRAPH_CACHE; i++) {
        if (cb->gcache[i].exec) cudaGraphExecDestroy(cb->gcache[i].exec);
        cb->gcache[i].exec = NULL;
        cb->gcache[i].n_rec = 0;
    }
}

static void graphs_free(cu_be *cb) {
    if (cb->gcache)
        for (int i = 0; i < GRAPH_CACHE; i++) {
            if (cb->gcache[i].exec) cudaGraphExecDestroy(cb->gcache[i].exec);
            free(cb->gcache[i].rec);
        }
    free(cb->gcache);
    free(cb->rec);
    if (cb->h_mask) cudaFreeHost(cb->h_mask);
}

/* Which rows are prefill rows: a token of a sequence with two or more
 * tokens in the step that is not rowwise (DESIGN.md: the CPU's prefill
 * tiles, the same rule). Their matmuls may take hc_mmf; every other row (a
 * token alone in its sequence: decode; a verified draft row; padding) takes
 * the exact path, whose bits a one-token decode step has. */
static int pf_kind(const uint8_t *f, int n) {
    int k = 0;
    for (int i = 0; i < n; i++) k += f[i];
    return k == 0 ? 0 : k == n ? 1 : 2;
}

static void pf_of(cu_be *cb, const step_plan *p, int32_t rows) {
    for (int32_t s = 0; s < p->n_seqs; s++) cb->pf_cnt[s] = 0;
    for (int32_t t = 0; t < p->n_tokens; t++)
        if (p->seq[t] >= 0 && p->seq[t] < p->n_seqs) cb->pf_cnt[p->seq[t]]++;
    for (int32_t t = 0; t < rows; t++) {
        const int32_t s = t < p->n_tokens ? p->seq[t] : -1;
        cb->pf_row[t] = cb->mmf && !cb->ref && s >= 0 && s < p->n_seqs && cb->pf_cnt[s] >= 2 &&
                        !(p->rowwise && p->rowwise[s]);
    }
    for (int32_t i = 0; i < p->n_out; i++) {
        const int32_t t = p->out_rows[i];
        cb->pf_out[i] = t >= 0 && t < rows ? cb->pf_row[t] : 0;
    }
    cb->pf_rows_kind = pf_kind(cb->pf_row, rows);
    cb->pf_out_kind = pf_kind(cb->pf_out, p->n_out);
}

static void op_plan_set(be_backend *b, const step_plan *p) {
    cu_be *cb = cu_of(b);
    rec_flush_direct(cb); /* a plan before the last step's sync: that step runs now */
    cb->have_plan = false;
    if (!p) return;
    const int32_t rows = p->n_pad > p->n_tokens ? p->n_pad : p->n_tokens;
    if (p->n_tokens < 0 || rows > p->cap_tokens || p->n_seqs < 0 || p->n_seqs > p->cap_seqs || p->n_out < 0 ||
        p->n_out > rows || p->bt_stride < 0 || p->bt_stride > p->cap_blocks) {
        cu_errf(cb, HN_ERR_INVALID, "cuda backend: plan_set: a malformed plan");
        return;
    }
    const size_t need = 5 * (size_t)rows + (size_t)p->n_seqs * (2 + (size_t)p->bt_stride) + (size_t)p->n_out;
    /* the staging buffer may still be read by the previous plan's copy */
    if (cb->plan_ev_live) {
        cu_cuda(cb, cudaEventSynchronize(cb->plan_ev), "plan_set");
        cb->plan_ev_live = false;
    }
    if (need > cb->plan_cap) {
        cu_cuda(cb, cudaStreamSynchronize(cb->stream), "plan_set");
        cudaFree(cb->d_plan);
        cudaFreeHost(cb->h_plan);
        free(cb->h_state_slot);
        free(cb->h_state_snap);
        free(cb->pf_row);
        free(cb->pf_out);
        free(cb->pf_cnt);
        cb->d_plan = cb->h_plan = cb->h_state_slot = cb->h_state_snap = cb->pf_cnt = NULL;
        cb->pf_row = cb->pf_out = NULL;
        cb->plan_cap = 0;
        size_t cap = need < 4096 ? 4096 : need;
        cudaError_t e = cudaMalloc((void **)&cb->d_plan, cap * 4);
        if (e == cudaSuccess) e = cudaMallocHost((void **)&cb->h_plan, cap * 4);
        if (e == cudaSuccess && !(cb->h_state_slot = (int32_t *)malloc(cap * 4))) e = cudaErrorMemoryAllocation;
        if (e == cudaSuccess && !(cb->h_state_snap = (int32_t *)malloc(cap * 4))) e = cudaErrorMemoryAllocation;
        if (e == cudaSuccess && !(cb->pf_row = (uint8_t *)malloc(cap))) e = cudaErrorMemoryAllocation;
        if (e == cudaSuccess && !(cb->pf_out = (uint8_t *)malloc(cap))) e = cudaErrorMemoryAllocation;
        if (e == cudaSuccess && !(cb->pf_cnt = (int32_t *)malloc(cap * 4))) e = cudaErrorMemoryAllocation;
        if (e != cudaSuccess) {
            cudaFree(cb->d_plan);
            cb->d_plan = NULL;
            cb->h_plan = NULL;
            cu_cuda(cb, e, "plan_set: allocating the plan's buffers");
            return;
        }
        cb->plan_cap = cap;
    }
    int32_t *h = cb->h_plan, *d = cb->d_plan;
    size_t o = 0;
#define PUT(dst, src, n)                                        \
    do {                                                        \
        if ((n) > 0) memcpy(h + o, (src), sizeof(int32_t) * (size_t)(n)); \
        cb->dst = d + o;                                        \
        o += (size_t)(n);                                       \
    } while (0)
    PUT(d_token, p->token, rows);
    PUT(d_pos, p->pos, rows);
    PUT(d_seq, p->seq, rows);
    PUT(d_slot, p->slot, rows);
    PUT(d_seq_len, p->seq_len, p->n_seqs);
    PUT(d_bt, p->block_table, (size_t)p->n_seqs * (size_t)p->bt_stride);
    PUT(d_out_rows, p->out_rows, p->n_out);
    /* hybrids: each sequence's recurrent-state slot (-1 where the plan has none) */
    for (int32_t i = 0; i < p->n_seqs; i++) cb->h_state_slot[i] = p->state_slot ? p->state_slot[i] : -1;
    PUT(d_state_slot, cb->h_state_slot, p->n_seqs);
    /* and each row's snapshot slot (-1: none; padding rows have none) */
    for (int32_t i = 0; i < rows; i++) cb->h_state_snap[i] = p->state_snap && i < p->n_tokens ? p->state_snap[i] : -1;
    PUT(d_state_snap, cb->h_state_snap, rows);
#undef PUT
    cudaError_t e = cudaMemcpyAsync(d, h, o * 4, cudaMemcpyHostToDevice, cb->stream);
    if (e == cudaSuccess) e = cudaEventRecord(cb->plan_ev, cb->stream);
    if (e != cudaSuccess) {
        cu_cuda(cb, e, "plan_set: copying the plan");
        return;
    }
    cb->plan_ev_live = true;
    pf_of(cb, p, rows);
    cb->n_rows = rows;
    cb->n_tokens = p->n_tokens;
    cb->n_seqs = p->n_seqs;
    cb->n_out = p->n_out;
    cb->bt_stride = p->bt_stride;
    cb->have_plan = true;
    if (cb->graphs && !cb->ref && rows <= GRAPH_MAX_ROWS) {
        cb->recording = true;
        cb->n_rec = 0;
        if (cu_rec *r = rec_push(cb, R_HEADER)) {
            r->u.hdr.n_rows = cb->n_rows, r->u.hdr.n_tokens = cb->n_tokens, r->u.hdr.n_seqs = cb->n_seqs;
            r->u.hdr.n_out = cb->n_out, r->u.hdr.bt_stride = cb->bt_stride;
            const int32_t *d[9] = {cb->d_token, cb->d_pos, cb->d_seq, cb->d_slot, cb->d_seq_len, cb->d_bt, cb->d_out_rows,
                                   cb->d_state_slot, cb->d_state_snap};
            memcpy(r->u.hdr.d, d, sizeof d);
            for (int32_t i = 0; i < rows; i++) r->u.hdr.pf |= (uint32_t)cb->pf_row[i] << i;
            for (int32_t i = 0; i < cb->n_out && i < 8; i++) r->u.hdr.pf |= (uint32_t)cb->pf_out[i] << (8 + i);
        }
    }
}

static void op_fetch(be_backend *b, const be_tensor *t, int n_rows, const void **host) {
    cu_be *cb = cu_of(b);
    if (cb->fetch_fresh) {
        cb->fetch_used = 0;
        cb->fetch_fresh = false;
    }
    *host = cb->h_fetch;
    const size_t bytes = (size_t)(n_rows > 0 ? n_rows : 0) * t->row_bytes;
    if (n_rows < 0 || (int64_t)n_rows > t->ne[1] * t->ne[2]) {
        cu_errf(cb, HN_ERR_RANGE, "cuda backend: fetch of %d rows of a %lld-row tensor", n_rows, (long long)t->ne[1]);
        return;
    }
    if (bytes > cb->fetch_cap - cb->fetch_used) {
        cu_errf(cb, HN_ERR_RANGE, "cuda backend: fetch: %zu bytes over the %zu-byte host buffer (%zu used this step)",
                bytes, cb->fetch_cap, cb->fetch_used);
        return;
    }
    unsigned char *dst = cb->h_fetch + cb->fetch_used;
    *host = dst;
    if (cu_rec *r = rec_push(cb, R_FETCH)) {
        r->u.mem.dst = dst, r->u.mem.src = t->data, r->u.mem.bytes = bytes;
    } else if (bytes) {
        cu_cuda(cb, cudaMemcpyAsync(dst, t->data, bytes, cudaMemcpyDeviceToHost, cb->stream), "fetch");
    }
    cb->fetch_used += (bytes + 255) & ~(size_t)255;
}

static void op_upload(be_backend *b, be_tensor *t, size_t off, const void *host, size_t n) {
    cu_be *cb = cu_of(b);
    rec_flush_direct(cb); /* a copy from pageable memory: this step goes on without a graph */
    const size_t cap = t->mat_bytes * (size_t)(t->ne[2] > 0 ? t->ne[2] : 1);
    if (off > cap || n > cap - off) {
        cu_errf(cb, HN_ERR_RANGE, "cuda backend: upload of %zu bytes at %zu into a %zu-byte tensor", n, off, cap);
        return;
    }
    /* from pageable memory the copy has read `host` when it returns */
    if (n)
        cu_cuda(cb, cudaMemcpyAsync((unsigned char *)t->data + off, host, n, cudaMemcpyHostToDevice, cb->stream),
                "upload");
}

static hn_status op_sync(be_backend *b, hn_err *err) {
    cu_be *cb = cu_of(b);
    if (cb->recording) rec_launch(cb);
    cu_cuda(cb, cudaStreamSynchronize(cb->stream), "device work");
    cb->plan_ev_live = false;
    cb->fetch_fresh = true;
    cb->mask_used = 0;
    hn_status st = cb->err;
    if (st) hn_errf(err, st, "%s", cb->err_msg);
    cb->err = HN_OK;
    return st;
}


/* ---- compute ---- */

static void op_get_rows(be_backend *b, const be_tensor *w, int n, be_tensor *out) {
    cu_be *cb = cu_of(b);
    if (cu_rec *r = rec_push(cb, R_GET_ROWS)) {
        r->u.g.w = w, r->u.g.i0 = n, r->u.g.y = out;
        return;
    }
    if (!need_plan(cb, "get_rows") || !rows_ok(cb, "get_rows", n)) return;
    cm_w c = cm_of(w, true);
    if (!c.planes && !cm_raw_supports(c.type)) {
        cu_errf(cb, HN_ERR_UNSUPPORTED, "cuda backend: get_rows: no device decoder for %s", qt_name(c.type));
        return;
    }
    cu_cuda(cb, cm_get_rows(cb->stream, &c, n, cb->d_token, F(out)), "get_rows");
}

/* x for a dequantizing matmul over w: rounded as the CPU's integer dots
 * round it (the reference mode takes it as it is); NULL after an error */
static const float *act_rounded(cu_be *cb, const be_tensor *w, const be_tensor *x, int rows, const char *op) {
    if (cb->ref || !cm_act_rounds(w->type)) return F(x);
    const size_t need = (size_t)rows * (size_t)w->ne[0];
    if (need > cb->xr_cap) {
        cu_errf(cb, HN_ERR_RANGE, "cuda backend: %s: %d rows of %lld over the limits reserved", op, rows,
                (long long)w->ne[0]);
        return NULL;
    }
    cudaError_t e = cm_act_round(cb->stream, w->type, F(x), w->ne[0], rows, cb->xr);
    if (e != cudaSuccess) {
        cu_cuda(cb, e, op);
        return NULL;
    }
    return cb->xr;
}

/* whether the hc_gemv kernels take this call */
static bool gemv_path(const cu_be *cb, const be_tensor *w, int n) {
    const cu_tensor *t = (const cu_tensor *)w;
    if (!t->has_hw || w->ne[2] != 1 || n < 1) return false;
    if (cb->ref) return true; /* hc_gemv_ref, 8 rows at a time */
    /* more rows: hc_mmq (uses_mmq), or 8 at a time, so that a row's result
     * does not depend on the batch it came in (decode and prefill give the
     * same bits: hc_mmq's outputs are hc_gemv's) */
    return w->type == QT_F16 || w->type == QT_BF16 || w->ne[0] <= cb->gs.max_k;
}

/* whether a gemv-path matmul of n rows takes hc_mmq (all n rows in one call) */
static bool uses_mmq(const cu_be *cb, const be_tensor *w, int n) {
    return !cb->ref && n >= HC_MMQ_MIN_ROWS && n <= cb->gs.max_rows && hc_mmq_supports(w->type);
}

/* the prefill-row flags of a matmul of n rows: the plan's rows (n_rows) or
 * its logits rows (n_out); NULL when none of them is a prefill row or the
 * weight has no hc_mmf kernel (then every row takes the exact path) */
static const uint8_t *mm_prefill(const cu_be *cb, const be_tensor *w, int n, int *kind) {
    const cu_tensor *t = (const cu_tensor *)w;
    *kind = 0;
    if (!cb->mmf || cb->ref || !cb->have_plan || !t->has_hw || w->ne[2] != 1 || n > cb->gs.max_rows ||
        !hc_mmf_takes(&t->hw))
        return NULL;
    if (n == cb->n_rows && cb->pf_rows_kind) {
        *kind = cb->pf_rows_kind;
        return cb->pf_row;
    }
    if (n == cb->n_out && cb->pf_out_kind) {
        *kind = cb->pf_out_kind;
        return cb->pf_out;
    }
    return NULL;
}

static void matmul_exact(cu_be *cb, const be_tensor *w, const float *x, int n, float *y, int reuse_x);

/* rows of prefill rows take hc_mmf, the others the exact path, run by run
 * (a run's x is converted on its own: reuse_x only when one run is all) */
static void matmul_pf(cu_be *cb, const be_tensor *w, const float *x, int n, float *y, const uint8_t *pf, int reuse_x) {
    const cu_tensor *t = (const cu_tensor *)w;
    const int64_t K = w->ne[0], N = w->ne[1];
    for (int r = 0; r < n;) {
        int e = r + 1;
        while (e < n && pf[e] == pf[r]) e++;
        const int reuse = r == 0 && e == n ? reuse_x : 0;
        if (pf[r]) {
            hn_err err;
            hn_status st = hc_mmf(&t->hw, x + (size_t)r * (size_t)K, e - r, y + (size_t)r * (size_t)N, &cb->gs, reuse,
                                  cb->stream, &err);
            if (st) {
                cu_hn(cb, st, &err, "matmul");
                return;
            }
            cb->mmf_calls++;
        } else {
            matmul_exact(cb, w, x + (size_t)r * (size_t)K, e - r, y + (size_t)r * (size_t)N, reuse);
        }
        r = e;
    }
}

static void matmul1(cu_be *cb, const be_tensor *w, int mat, const be_tensor *x, int n, be_tensor *y, int reuse_x) {
    if (n <= 0) return;
    if (mat < 0 || mat >= w->ne[2]) {
        cu_errf(cb, HN_ERR_RANGE, "cuda backend: matmul of matrix %d of %lld", mat, (long long)w->ne[2]);
        return;
    }
    int kind;
    if (const uint8_t *pf = mm_prefill(cb, w, n, &kind)) {
        matmul_pf(cb, w, F(x), n, F(y), pf, reuse_x);
        return;
    }
    if (gemv_path(cb, w, n)) {
        matmul_exact(cb, w, F(x), n, F(y), reuse_x);
        return;
    }
    cm_w c = cm_of(w, false);
    if (!c.planes && !cm_raw_supports(c.type)) {
        cu_errf(cb, HN_ERR_UNSUPPORTED, "cuda backend: matmul: no device decoder for %s", qt_name(c.type));
        return;
    }
    const float *xin = act_rounded(cb, w, x, n, "matmul");
    if (xin) cu_cuda(cb, cm_matmul_tile(cb->stream, &c, mat, xin, n, F(y), cb->ref), "matmul");
}

/* the gemv path's rows, each with a one-token decode step's bits */
static void matmul_exact(cu_be *cb, const be_tensor *w, const float *X, int n, float *Y, int reuse_x) {
    const cu_tensor *t = (const cu_tensor *)w;
    hn_err e;
    if (cb->ref) {
        for (int r = 0; r < n; r += HC_GEMV_MAX_ROWS) {
            const int na = n - r < HC_GEMV_MAX_ROWS ? n - r : HC_GEMV_MAX_ROWS;
            hn_status st = hc_gemv_ref(&t->hw, X + (size_t)r * (size_t)w->ne[0], na,
                                       Y + (size_t)r * (size_t)w->ne[1], cb->stream, &e);
            if (st) {
                cu_hn(cb, st, &e, "matmul");
                return;
            }
        }
        return;
    }
    if (uses_mmq(cb, w, n)) {
        hc_gemv_params p = {0, reuse_x};
        hn_status st = hc_mmq(&t->hw, X, n, Y, &cb->gs, &p, cb->stream, &e);
        if (st) cu_hn(cb, st, &e, "matmul");
        return;
    }
    for (int r = 0; r < n; r += HC_GEMV_MAX_ROWS) {
        const int na = n - r < HC_GEMV_MAX_ROWS ? n - r : HC_GEMV_MAX_ROWS;
        hc_gemv_params p = {0, reuse_x && n <= HC_GEMV_MAX_ROWS};
        hn_status st = hc_gemv(&t->hw, X + (size_t)r * (size_t)w->ne[0], na, Y + (size_t)r * (size_t)w->ne[1],
                               &cb->gs, &p, cb->stream, &e);
        if (st) {
            cu_hn(cb, st, &e, "matmul");
            return;
        }
    }
}

static void op_matmul(be_backend *b, const be_tensor *w, int mat, const be_tensor *x, int n, be_tensor *y) {
    cu_be *cb = cu_of(b);
    if (cu_rec *r = rec_push(cb, R_MATMUL)) {
        r->u.g.w = w, r->u.g.i0 = mat, r->u.g.x = x, r->u.g.i1 = n, r->u.g.y = y;
        return;
    }
    matmul1(cb, w, mat, x, n, y, 0);
}

/* weights sharing x convert it once: the scratch holds all n rows of x
 * quantized for row length qk and activation type qa (qk 0: it does not;
 * a fused producer may have left it there: rec_run) */
static void matmul_multi_q(cu_be *cb, int n_w, const be_tensor *const *ws, const be_tensor *x, int n,
                           be_tensor *const *ys, int64_t qk, hc_act qa) {
    if (n_w < 0 || n_w > BE_MULTI_MAX) {
        cu_errf(cb, HN_ERR_RANGE, "cuda backend: matmul_multi of %d weights", n_w);
        return;
    }
    bool pf_any = false;
    for (int i = 0; i < n_w; i++) {
        int kind;
        pf_any |= mm_prefill(cb, ws[i], n, &kind) != NULL;
    }
    if (!cb->ref && n >= 1 && n <= HC_GEMV_MAX_ROWS && !pf_any) {
        /* decode: runs of weights of one integer type and row length in one launch each */
        for (int i = 0; i < n_w;) {
            const hc_weight *hw[BE_MULTI_MAX];
            float *yy[BE_MULTI_MAX];
            int j = i;
            for (; j < n_w && j - i < 3; j++) {
                if (!gemv_path(cb, ws[j], n) || ws[j]->ne[2] != 1) break;
                hw[j - i] = &((const cu_tensor *)ws[j])->hw;
                yy[j - i] = F(ys[j]);
                if (!hc_gemv_multi_ok(j - i + 1, hw, n)) break;
            }
            if (j - i < 2) { /* alone */
                const be_tensor *w = ws[i];
                const hc_act a = hc_gemv_act(w->type);
                const bool quantizes = gemv_path(cb, w, n) && (a == HC_ACT_Q8_0 || a == HC_ACT_Q8_K);
                matmul1(cb, w, 0, x, n, ys[i], quantizes && qk == w->ne[0] && qa == a);
                if (quantizes) {
                    qk = w->ne[0];
                    qa = a;
                }
                i++;
                continue;
            }
            const hc_act a = hc_gemv_act(ws[i]->type);
            hn_err e;
            hn_status st = hc_gemv_multi(j - i, hw, F(x), n, yy, &cb->gs, qk == ws[i]->ne[0] && qa == a, cb->stream, &e);
            if (st) {
                cu_hn(cb, st, &e, "matmul_multi");
                return;
            }
            qk = ws[i]->ne[0];
            qa = a;
            i = j;
        }
        return;
    }
    for (int i = 0; i < n_w; i++) {
        const be_tensor *w = ws[i];
        const hc_act a = hc_gemv_act(w->type);
        const bool quantizes = !cb->ref && gemv_path(cb, w, n) && (a == HC_ACT_Q8_0 || a == HC_ACT_Q8_K);
        /* hc_gemv 8 rows at a time leaves only the last 8 in the scratch, and
         * a step of prefill and other rows converts run by run; hc_mmq and
         * hc_mmf on all rows leave all of them */
        int kind;
        const bool pf = mm_prefill(cb, w, n, &kind) != NULL;
        const bool holds_all =
            quantizes && (pf ? kind == 1 : n <= HC_GEMV_MAX_ROWS || uses_mmq(cb, w, n));
        matmul1(cb, w, 0, x, n, ys[i], holds_all && qk == w->ne[0] && qa == a);
        if (quantizes) {
            qk = holds_all ? w->ne[0] : 0;
            qa = a;
        }
    }
}

static void op_matmul_multi(be_backend *b, int n_w, const be_tensor *const *ws, const be_tensor *x, int n,
                            be_tensor *const *ys) {
    cu_be *cb = cu_of(b);
    if (n_w >= 0 && n_w <= BE_MULTI_MAX)
        if (cu_rec *r = rec_push(cb, R_MULTI)) {
            r->u.multi.n_w = n_w, r->u.multi.n = n, r->u.multi.x = x;
            for (int i = 0; i < n_w; i++) r->u.multi.ws[i] = ws[i], r->u.multi.ys[i] = ys[i];
            return;
        }
    matmul_multi_q(cb, n_w, ws, x, n, ys, 0, HC_ACT_F32);
}

static void op_rms_norm(be_backend *b, const be_tensor *x, const be_tensor *w, int n, int dim, float eps,
                        be_tensor *y) {
    cu_be *cb = cu_of(b);
    if (cu_rec *r = rec_push(cb, R_RMS_NORM)) {
        r->u.g.x = x, r->u.g.w = w, r->u.g.i0 = n, r->u.g.i1 = dim, r->u.g.f0 = eps, r->u.g.y = y;
        return;
    }
    cu_cuda(cb, ck_rms_norm(cb->stream, F(x), w ? F(w) : NULL, n, dim, eps, F(y)), "rms_norm");
}

static void op_rope(be_backend *b, be_tensor *x, int n, int n_head, int head_dim, int n_rot, float freq_base,
                    be_rope_mode mode) {
    cu_be *cb = cu_of(b);
    if (cu_rec *r = rec_push(cb, R_ROPE)) {
        r->u.g.y = x, r->u.g.i0 = n, r->u.g.i1 = n_head, r->u.g.i2 = head_dim, r->u.g.i3 = n_rot;
        r->u.g.f0 = freq_base, r->u.g.i4 = (int)mode;
        return;
    }
    if (!need_plan(cb, "rope") || !rows_ok(cb, "rope", n)) return;
    if (n_rot < 0 || n_rot > head_dim) {
        cu_errf(cb, HN_ERR_INVALID, "cuda backend: rope of %d dims of %d", n_rot, head_dim);
        return;
    }
    /* as the CPU computes it, on the host's powf */
    const float theta_scale = powf(freq_base, -2.0f / (float)n_rot);
    cu_cuda(cb, ck_rope(cb->stream, F(x), n, n_head, head_dim, n_rot, theta_scale, mode == BE_ROPE_NEOX, cb->d_pos),
            "rope");
}

static void op_add(be_backend *b, const be_tensor *a, const be_tensor *bb, be_tensor *y, size_t n) {
    cu_be *cb = cu_of(b);
    if (cu_rec *r = rec_push(cb, R_ADD)) {
        r->u.g.x = a, r->u.g.w = bb, r->u.g.y = y, r->u.g.z0 = n;
        return;
    }
    cu_cuda(cb, ck_add(cb->stream, F(a), F(bb), F(y), n), "add");
}

static void op_add_bias(be_backend *b, be_tensor *x, const be_tensor *bias, int n, int dim) {
    cu_be *cb = cu_of(b);
    if (cu_rec *r = rec_push(cb, R_ADD_BIAS)) {
        r->u.g.y = x, r->u.g.w = bias, r->u.g.i0 = n, r->u.g.i1 = dim;
        return;
    }
    cu_cuda(cb, ck_add_bias(cb->stream, F(x), F(bias), n, dim), "add_bias");
}

static void op_swiglu(be_backend *b, const be_tensor *gate, const be_tensor *up, be_tensor *y, size_t n) {
    cu_be *cb = cu_of(b);
    if (cu_rec *r = rec_push(cb, R_SWIGLU)) {
        r->u.g.x = gate, r->u.g.w = up, r->u.g.y = y, r->u.g.z0 = n;
        return;
    }
    cu_cuda(cb, ck_swiglu(cb->stream, F(gate), F(up), F(y), n), "swiglu");
}

static void op_kv_store(be_backend *b, kv_cache *kv, int layer, const be_tensor *k, const be_tensor *v, int n) {
    cu_be *cb = cu_of(b);
    if (cu_rec *r = rec_push(cb, R_KV_STORE)) {
        r->u.g.kv = kv, r->u.g.i0 = layer, r->u.g.x = k, r->u.g.w = v, r->u.g.i1 = n;
        return;
    }
    ck_kv g;
    if (!need_plan(cb, "kv_store") || !rows_ok(cb, "kv_store", n) || !kv_geo(cb, kv, "kv_store", &g)) return;
    if (layer < 0 || layer >= kv->cfg.n_layer) {
        cu_errf(cb, HN_ERR_RANGE, "cuda backend: kv_store: layer %d of %d", layer, kv->cfg.n_layer);
        return;
    }
    cu_cuda(cb, ck_kv_store(cb->stream, &g, layer, F(k), F(v), n, cb->d_slot), "kv_store");
}

static void op_attention(be_backend *b, const be_attn_args *a) {
    cu_be *cb = cu_of(b);
    if (cu_rec *r = rec_push(cb, R_ATTENTION)) {
        /* field by field: the caller's padding bytes would defeat the records' comparison */
        be_attn_args *c = &r->u.attn;
        c->q = a->q, c->out = a->out, c->n_tokens = a->n_tokens, c->n_head = a->n_head, c->n_head_kv = a->n_head_kv;
        c->head_dim = a->head_dim, c->scale = a->scale, c->window = a->window, c->kv = a->kv, c->layer = a->layer;
        return;
    }
    ck_kv g;
    if (!need_plan(cb, "attention") || !rows_ok(cb, "attention", a->n_tokens) || !kv_geo(cb, a->kv, "attention", &g))
        return;
    if (a->layer < 0 || a->layer >= a->kv->cfg.n_layer || a->n_head_kv != a->kv->cfg.n_head_kv ||
        a->head_dim != a->kv->cfg.head_dim || a->n_head_kv < 1 || a->n_head % a->n_head_kv) {
        cu_errf(cb, HN_ERR_INVALID, "cuda backend: attention: heads or layer do not match the cache");
        return;
    }
    cu_cuda(cb,
            ck_attention(cb->stream, F(a->q), F(a->out), a->n_tokens, a->n_head, a->n_head_kv, a->head_dim, a->scale,
                         a->window, &g, a->layer, cb->d_pos, cb->d_seq, cb->d_bt, cb->bt_stride,
                         cb->att_split ? cb->att_part : NULL, cb->att_part_cap),
            "attention");
}

static void op_moe_route(be_backend *b, const be_tensor *logits, int n, int n_expert, int k, be_tensor *ids,
                         be_tensor *weights) {
    cu_be *cb = cu_of(b);
    if (cu_rec *r = rec_push(cb, R_MOE_ROUTE)) {
        r->u.g.x = logits, r->u.g.i0 = n, r->u.g.i1 = n_expert, r->u.g.i2 = k, r->u.g.y = ids, r->u.g.y2 = weights;
        return;
    }
    if (n_expert < 1 || k < 1 || k > n_expert || n_expert > 4096) {
        cu_errf(cb, HN_ERR_INVALID, "cuda backend: moe_route: top %d of %d experts", k, n_expert);
        return;
    }
    cu_cuda(cb, ck_moe_route(cb->stream, F(logits), n, n_expert, k, (int32_t *)ids->data, F(weights)), "moe_route");
}

static void op_moe_matmul(be_backend *b, const be_tensor *w, const be_tensor *x, bool x_shared, int n, int k,
                          const be_tensor *ids, be_tensor *y) {
    cu_be *cb = cu_of(b);
    if (cu_rec *r = rec_push(cb, R_MOE_MATMUL)) {
        r->u.g.w = w, r->u.g.x = x, r->u.g.i0 = x_shared, r->u.g.i1 = n, r->u.g.i2 = k, r->u.g.w2 = ids, r->u.g.y = y;
        return;
    }
    cm_w c = cm_of(w, false);
    if (!c.planes && !cm_raw_supports(c.type)) {
        cu_errf(cb, HN_ERR_UNSUPPORTED, "cuda backend: moe_matmul: no device decoder for %s", qt_name(c.type));
        return;
    }
    const float *xin = act_rounded(cb, w, x, x_shared ? n : n * k, "moe_matmul");
    if (xin)
        cu_cuda(cb, cm_matmul_slots(cb->stream, &c, xin, x_shared, n, k, (const int32_t *)ids->data, F(y), cb->ref),
                "moe_matmul");
}

static void op_moe_combine(be_backend *b, const be_tensor *y, const be_tensor *w, int n, int k, int dim,
                           be_tensor *out) {
    cu_be *cb = cu_of(b);
    if (cu_rec *r = rec_push(cb, R_MOE_COMBINE)) {
        r->u.g.x = y, r->u.g.w = w, r->u.g.i0 = n, r->u.g.i1 = k, r->u.g.i2 = dim, r->u.g.y = out;
        return;
    }
    cu_cuda(cb, ck_moe_combine(cb->stream, F(y), F(w), n, k, dim, F(out)), "moe_combine");
}

static void op_gather_out(be_backend *b, const be_tensor *x, int dim, be_tensor *out) {
    cu_be *cb = cu_of(b);
    if (cu_rec *r = rec_push(cb, R_GATHER_OUT)) {
        r->u.g.x = x, r->u.g.i0 = dim, r->u.g.y = out;
        return;
    }
    if (!need_plan(cb, "gather_out")) return;
    cu_cuda(cb, ck_gather_out(cb->stream, F(x), dim, cb->n_out, cb->d_out_rows, F(out)), "gather_out");
}

static void op_mask_logits(be_backend *b, be_tensor *logits, int row, const uint32_t *allowed, int64_t n_vocab) {
    cu_be *cb = cu_of(b);
    if (n_vocab <= 0) return;
    const size_t words = (size_t)((n_vocab + 31) / 32);
    if (words > cb->mask_cap - cb->mask_used) {
        rec_flush_direct(cb); /* the buffers must change: this step goes on without a graph */
        /* earlier masks of this step are still to be read: wait, then reuse or grow */
        cu_cuda(cb, cudaStreamSynchronize(cb->stream), "mask_logits");
        cb->mask_used = 0;
        if (words > cb->mask_cap) {
            cudaFree(cb->d_mask);
            if (cb->h_mask) cudaFreeHost(cb->h_mask);
            cb->d_mask = NULL;
            cb->h_mask = NULL;
            cb->mask_cap = 0;
            const size_t cap = 4 * words;
            cudaError_t e = cudaMalloc((void **)&cb->d_mask, cap * 4);
            if (e == cudaSuccess) e = cudaMallocHost((void **)&cb->h_mask, cap * 4);
            if (e != cudaSuccess) {
                cudaFree(cb->d_mask);
                cb->d_mask = NULL;
                cb->h_mask = NULL;
                cu_cuda(cb, e, "mask_logits: allocating the mask buffer");
                return;
            }
            cb->mask_cap = cap;
        }
    }
    uint32_t *m = cb->d_mask + cb->mask_used;
    if (cu_rec *r = rec_push(cb, R_MASK)) {
        /* the bits are staged in pinned memory now; the graph copies them from there */
        memcpy(cb->h_mask + cb->mask_used * 4, allowed, words * 4);
        r->u.mem.t = logits, r->u.mem.row = row, r->u.mem.n_vocab = n_vocab, r->u.mem.off = cb->mask_used;
        cb->mask_used += (words + 63) & ~(size_t)63;
        return;
    }
    cu_cuda(cb, cudaMemcpyAsync(m, allowed, words * 4, cudaMemcpyHostToDevice, cb->stream), "mask_logits");
    cu_cuda(cb, ck_mask_logits(cb->stream, F(logits) + (size_t)row * (size_t)n_vocab, m, n_vocab), "mask_logits");
    cb->mask_used += (words + 63) & ~(size_t)63;
}

/* ---- tuning: nothing to tune on the GPU yet ---- */

static bool op_set_mm_params(be_backend *b, qt_type t, int64_t k, int64_t n, int min_rows, const be_mm_params *p) {
    (void)b;
    (void)n;
    (void)p;
    /* accepted and ignored: the cuda matmuls have no parameters yet */
    return (unsigned)t < QT_TYPE_COUNT && (k == 0 || min_rows >= 1);
}

static void op_clear_mm_params(be_backend *b) { (void)b; }

static void op_set_reference(be_backend *b, bool on) {
    cu_be *cb = cu_of(b);
    rec_flush_direct(cb);
    cb->ref = on;
}

static bool op_mm_tunable(be_backend *b, qt_type t) {
    (void)b;
    (void)t;
    return false;
}

static hn_status op_mm_case_new(be_backend *b, const be_mm_case *a, struct tn_case *c, hn_err *err) {
    (void)b;
    (void)c;
    return hn_errf(err, HN_ERR_UNSUPPORTED, "cuda backend: nothing to tune for %s yet", qt_name(a->type));
}

static void op_mm_case_params(be_backend *b, const struct tn_case *c, const int *cfg, be_mm_params *out) {
    (void)b;
    (void)c;
    (void)cfg;
    memset(out, 0, sizeof *out);
}

static void op_mm_case_free(be_backend *b, struct tn_case *c) {
    (void)b;
    (void)c;
}

/* ---- lifecycle ---- */

/* ---- version 5: hybrid (recurrent) layers ---- */

static void op_copy_cols(be_backend *b, const be_tensor *x, int x_ld, int x_off, int n, int nc, be_tensor *y, int y_ld,
                         int y_off) {
    cu_be *cb = cu_of(b);
    if (cu_rec *r = rec_push(cb, R_COPY_COLS)) {
        r->u.g.x = x, r->u.g.i0 = x_ld, r->u.g.i1 = x_off, r->u.g.i2 = n, r->u.g.i3 = nc, r->u.g.y = y;
        r->u.g.i4 = y_ld, r->u.g.z0 = (size_t)y_off;
        return;
    }
    if (n < 0 || nc < 0 || x_off < 0 || y_off < 0 || x_off + nc > x_ld || y_off + nc > y_ld) {
        cu_errf(cb, HN_ERR_INVALID, "cuda backend: copy_cols: columns [%d, %d) of rows of %d / %d", x_off, x_off + nc,
                x_ld, y_ld);
        return;
    }
    cu_cuda(cb, ck_copy_cols(cb->stream, F(x), x_ld, x_off, n, nc, F(y), y_ld, y_off), "copy_cols");
}

static void op_sigmoid_mul(be_backend *b, const be_tensor *x, const be_tensor *g, int n, int dim, int g_dim,
                           be_tensor *y) {
    cu_be *cb = cu_of(b);
    if (cu_rec *r = rec_push(cb, R_SIGMOID_MUL)) {
        r->u.g.x = x, r->u.g.w = g, r->u.g.i0 = n, r->u.g.i1 = dim, r->u.g.i2 = g_dim, r->u.g.y = y;
        return;
    }
    cu_cuda(cb, ck_sigmoid_mul(cb->stream, F(x), F(g), n, dim, g_dim, F(y)), "sigmoid_mul");
}

static void op_l2_norm(be_backend *b, const be_tensor *x, int n, int dim, float eps, be_tensor *y) {
    cu_be *cb = cu_of(b);
    if (cu_rec *r = rec_push(cb, R_L2_NORM)) {
        r->u.g.x = x, r->u.g.i0 = n, r->u.g.i1 = dim, r->u.g.f0 = eps, r->u.g.y = y;
        return;
    }
    cu_cuda(cb, ck_l2_norm(cb->stream, F(x), n, dim, eps, F(y)), "l2_norm");
}

static void op_rope_multi(be_backend *b, be_tensor *x, int n, int n_head, int head_dim, int n_rot, float freq_base,
                          const int32_t sections[4]) {
    cu_be *cb = cu_of(b);
    if (cu_rec *r = rec_push(cb, R_ROPE_MULTI)) {
        r->u.rope_multi.x = x, r->u.rope_multi.n = n, r->u.rope_multi.n_head = n_head;
        r->u.rope_multi.head_dim = head_dim, r->u.rope_multi.n_rot = n_rot, r->u.rope_multi.freq_base = freq_base;
        memcpy(r->u.rope_multi.sections, sections, sizeof r->u.rope_multi.sections);
        return;
    }
    if (!need_plan(cb, "rope_multi") || !rows_ok(cb, "rope_multi", n)) return;
    if (n_rot < 0 || n_rot > head_dim) {
        cu_errf(cb, HN_ERR_INVALID, "cuda backend: rope_multi of %d dims of %d", n_rot, head_dim);
        return;
    }
    const float theta_scale = powf(freq_base, -2.0f / (float)n_rot);
    cu_cuda(cb, ck_rope_multi(cb->stream, F(x), n, n_head, head_dim, n_rot, theta_scale, sections, cb->d_pos),
            "rope_multi");
}

/* the layer's recurrent state in this backend's storage, every sequence of the plan holding a slot */
static bool state_geo(cu_be *cb, const kv_cache *kv, size_t off, size_t bytes, const char *op, ck_state *st) {
    if (!kv || kv->storage != &cb->storage || !kv->state_slot_bytes || !range_of(cb, kv->state_base) ||
        off + bytes > kv->cfg.state_bytes) {
        cu_errf(cb, HN_ERR_INVALID, "cuda backend: %s: bad arguments or no recurrent state in this backend's cache", op);
        return false;
    }
    for (int32_t s = 0; s < cb->n_seqs; s++)
        if (cb->h_state_slot[s] < 0 || cb->h_state_slot[s] >= kv->n_state_slots) {
            cu_errf(cb, HN_ERR_INVALID, "cuda backend: %s: a sequence has no recurrent-state slot", op);
            return false;
        }
    for (int32_t t = 0; t < cb->n_rows; t++)
        if (cb->h_state_snap[t] < -1 || cb->h_state_snap[t] >= kv->n_state_slots) {
            cu_errf(cb, HN_ERR_INVALID, "cuda backend: %s: a state snapshot slot out of range", op);
            return false;
        }
    st->base = (unsigned char *)kv->state_base;
    st->slot_bytes = kv->state_slot_bytes;
    st->off = off;
    return true;
}

static void op_ssm_conv(be_backend *b, const be_tensor *x, const be_tensor *w, int n, int channels, int kernel,
                        const kv_cache *kv, size_t state_off, be_tensor *y) {
    cu_be *cb = cu_of(b);
    if (cu_rec *r = rec_push(cb, R_SSM_CONV)) {
        r->u.g.x = x, r->u.g.w = w, r->u.g.i0 = n, r->u.g.i1 = channels, r->u.g.i2 = kernel, r->u.g.kv = kv;
        r->u.g.z0 = state_off, r->u.g.y = y;
        return;
    }
    if (!need_plan(cb, "ssm_conv") || !rows_ok(cb, "ssm_conv", n)) return;
    if (kernel < 1 || channels < 1 || w->type != QT_F32 || w->ne[0] != kernel || w->ne[1] != channels) {
        cu_errf(cb, HN_ERR_INVALID, "cuda backend: ssm_conv: bad arguments");
        return;
    }
    ck_state st;
    if (!state_geo(cb, kv, state_off, sizeof(float) * (size_t)(kernel - 1) * (size_t)channels, "ssm_conv", &st)) return;
    cu_cuda(cb, ck_ssm_conv(cb->stream, F(x), F(w), n, channels, kernel, &st, cb->d_pos, cb->d_seq, cb->d_slot,
                            cb->d_state_slot, cb->d_state_snap, F(y)),
            "ssm_conv");
}

static void op_delta_net(be_backend *b, const be_delta_args *a) {
    cu_be *cb = cu_of(b);
    if (cu_rec *r = rec_push(cb, R_DELTA_NET)) {
        be_delta_args *c = &r->u.delta;
        c->q = a->q, c->k = a->k, c->v = a->v, c->alpha = a->alpha, c->beta = a->beta, c->dt_bias = a->dt_bias;
        c->a = a->a, c->out = a->out, c->n_tokens = a->n_tokens, c->n_k_heads = a->n_k_heads;
        c->n_v_heads = a->n_v_heads, c->head_dim = a->head_dim, c->kv = a->kv, c->state_off = a->state_off;
        return;
    }
    if (!need_plan(cb, "delta_net") || !rows_ok(cb, "delta_net", a->n_tokens)) return;
    if (a->n_k_heads < 1 || a->n_v_heads < 1 || a->head_dim < 1) {
        cu_errf(cb, HN_ERR_INVALID, "cuda backend: delta_net: bad arguments");
        return;
    }
    if (a->head_dim > ck_delta_max_dim()) {
        cu_errf(cb, HN_ERR_UNSUPPORTED, "cuda backend: delta_net: head dim %d over the %d its kernel takes",
                a->head_dim, ck_delta_max_dim());
        return;
    }
    ck_state st;
    const size_t need = sizeof(float) * (size_t)a->n_v_heads * (size_t)a->head_dim * (size_t)a->head_dim;
    if (!state_geo(cb, a->kv, a->state_off, need, "delta_net", &st)) return;
    ck_delta d = {F(a->q), F(a->k), F(a->v), F(a->alpha), F(a->beta), F(a->dt_bias), F(a->a), F(a->out),
                  a->n_tokens, a->n_k_heads, a->n_v_heads, a->head_dim};
    cu_cuda(cb, ck_delta_net(cb->stream, &d, &st, cb->n_seqs, cb->d_pos, cb->d_seq, cb->d_slot, cb->d_state_slot,
                             cb->d_state_snap),
            "delta_net");
}

static void op_state_copy(be_backend *b, const kv_cache *kv, int n, const int32_t *src, const int32_t *dst) {
    cu_be *cb = cu_of(b);
    if (n > REC_IDS_MAX) rec_flush_direct(cb);
    if (n >= 0)
        if (cu_rec *r = rec_push(cb, R_STATE_COPY)) {
            r->u.copy.kv = kv, r->u.copy.n = n;
            memcpy(r->u.copy.src, src, sizeof(int32_t) * (size_t)n);
            memcpy(r->u.copy.dst, dst, sizeof(int32_t) * (size_t)n);
            return;
        }
    for (int i = 0; i < n; i++) {
        if (!kv || kv->storage != &cb->storage || !kv->state_slot_bytes || src[i] < 0 || dst[i] < 0 ||
            src[i] >= kv->n_state_slots || dst[i] >= kv->n_state_slots) {
            cu_errf(cb, HN_ERR_INVALID, "cuda backend: state_copy: bad slot");
            return;
        }
        if (src[i] == dst[i]) continue;
        cu_cuda(cb,
                cudaMemcpyAsync(kv_state_ptr(kv, dst[i]), kv_state_ptr(kv, src[i]), kv->cfg.state_bytes,
                                cudaMemcpyDeviceToDevice, cb->stream),
                "state_copy");
    }
}

static void op_free(be_backend *b) {
    cu_be *cb = cu_of(b);
    if (cb->stream) cudaStreamSynchronize(cb->stream);
    for (int i = 0; i < cb->n_tensors; i++) tensor_free(cb->tensors[i]);
    free(cb->tensors);
    hc_free(cb->arena);
    hc_gemv_scratch_free(&cb->gs);
    graphs_free(cb);
    hc_free(cb->xr);
    hc_free(cb->att_part);
    cudaFree(cb->d_plan);
    if (cb->h_plan) cudaFreeHost(cb->h_plan);
    free(cb->pf_row);
    free(cb->pf_out);
    free(cb->pf_cnt);
    free(cb->h_state_slot);
    free(cb->h_state_snap);
    if (cb->h_fetch) cudaFreeHost(cb->h_fetch);
    cudaFree(cb->d_mask);
    for (int i = 0; i < KV_RANGES; i++)
        if (cb->ranges[i].base) kvs_release(cb, cb->ranges[i].base, cb->ranges[i].bytes);
    if (cb->plan_ev) cudaEventDestroy(cb->plan_ev);
    if (cb->stream) cudaStreamDestroy(cb->stream);
    if (cb->vmm.lib) dlclose(cb->vmm.lib);
    (void)cudaGetLastError();
    free(cb);
}

/* Device scratch and the activation arena (held whole: the act rows of a
 * later reserve are not used here), plus the pinned fetch buffer. */
static size_t op_scratch_bytes(be_backend *b) {
    cu_be *cb = cu_of(b);
    const hc_gemv_scratch *g = &cb->gs;
    /* codes, block scales and sums, hc_mmf's f16 rows and their factors */
    size_t gs = g->xq ? (size_t)g->max_rows * ((size_t)g->max_k * (1 + 2 * sizeof(float) / 32 + 2) + sizeof(float)) : 0;
    return cb->arena_cap + gs + (cb->xr_cap + cb->att_part_cap) * sizeof(float) + cb->fetch_cap;
}

/* Called again with other limits (backend.h): buffers grow when the limits
 * do and are kept when they shrink; the arena and the act rows stay whole. */
static hn_status op_reserve(be_backend *b, const be_limits *lim, hn_err *err) {
    cu_be *cb = cu_of(b);
    if (lim->max_head_dim > 512 || lim->max_group > 1024 || lim->max_rows < 0 || lim->max_k < 0 ||
        lim->max_experts < 0 || lim->max_experts > 4096)
        return hn_errf(err, HN_ERR_RANGE, "cuda backend: limits out of range (head_dim <= 512, experts <= 4096)");
    cb->lim = *lim;
    const int64_t k32 = (lim->max_k + 31) / 32 * 32;
    /* x quantized for hc_gemv (8 rows) and hc_mmq (a matmul's rows) */
    const int grows = lim->max_rows < HC_GEMV_MAX_ROWS ? HC_GEMV_MAX_ROWS : lim->max_rows > 65535 ? 65535 : lim->max_rows;
    if ((k32 > cb->gs.max_k || grows > cb->gs.max_rows) && (k32 > 0 || cb->gs.max_k > 0)) {
        const int64_t kk = k32 > cb->gs.max_k ? k32 : cb->gs.max_k;
        const int rr = grows > cb->gs.max_rows ? grows : cb->gs.max_rows;
        graphs_drop(cb);
        hc_gemv_scratch_free(&cb->gs);
        hn_status st = hc_gemv_scratch_init_rows(&cb->gs, kk, rr, err);
        if (st) return st;
    }
    if (!cb->att_part && cb->att_split && lim->max_head_dim > 0) {
        /* 64 MiB of attention partials: a token at 128K positions with 32 heads of 128 takes 8 MiB */
        hn_status st = hc_malloc((void **)&cb->att_part, (size_t)64 << 20, err);
        if (st) return st;
        cb->att_part_cap = ((size_t)64 << 20) / sizeof(float);
    }
    const size_t xr_need = (size_t)(lim->max_rows > 0 ? lim->max_rows : 1) * (size_t)((lim->max_k + 255) / 256 * 256);
    if (xr_need > cb->xr_cap) {
        graphs_drop(cb);
        hc_free(cb->xr);
        cb->xr = NULL;
        cb->xr_cap = 0;
        hn_status st = hc_malloc((void **)&cb->xr, xr_need * sizeof(float), err);
        if (st) return st;
        cb->xr_cap = xr_need;
    }
    if (lim->arena_bytes > cb->arena_cap - cb->arena_used) {
        if (cb->arena_used)
            return hn_errf(err, HN_ERR_INVALID, "cuda backend: the arena grows only before its first tensor");
        hc_free(cb->arena);
        cb->arena = NULL;
        cb->arena_cap = 0;
        hn_status st = hc_malloc((void **)&cb->arena, lim->arena_bytes, err);
        if (st) return st;
        cb->arena_cap = lim->arena_bytes;
    }
    /* a step fetches at most its activations */
    const size_t fc = cb->arena_cap > ((size_t)1 << 20) ? cb->arena_cap : (size_t)1 << 20;
    if (fc > cb->fetch_cap) {
        if (cb->h_fetch) cudaFreeHost(cb->h_fetch);
        cb->h_fetch = NULL;
        cb->fetch_cap = 0;
        cudaError_t e = cudaMallocHost((void **)&cb->h_fetch, fc);
        if (e != cudaSuccess) {
            cb->h_fetch = NULL;
            return hc_fail(err, e, "cudaMallocHost (the fetch buffer)");
        }
        cb->fetch_cap = fc;
    }
    return HN_OK;
}

/* runs one record directly (its op's own code, which queues the kernels) */
static void rec_exec(cu_be *cb, const cu_rec *r) {
    be_backend *b = &cb->base;
    const auto &g = r->u.g;
    be_tensor *y = (be_tensor *)g.y;
    switch (r->kind) {
    case R_HEADER: break;
    case R_GET_ROWS: op_get_rows(b, g.w, g.i0, y); break;
    case R_MATMUL: matmul1(cb, g.w, g.i0, g.x, g.i1, y, 0); break;
    case R_MULTI: matmul_multi_q(cb, r->u.multi.n_w, r->u.multi.ws, r->u.multi.x, r->u.multi.n,
                                 (be_tensor *const *)r->u.multi.ys, 0, HC_ACT_F32); break;
    case R_RMS_NORM: op_rms_norm(b, g.x, g.w, g.i0, g.i1, g.f0, y); break;
    case R_ROPE: op_rope(b, y, g.i0, g.i1, g.i2, g.i3, g.f0, (be_rope_mode)g.i4); break;
    case R_ADD: op_add(b, g.x, g.w, y, g.z0); break;
    case R_ADD_BIAS: op_add_bias(b, y, g.w, g.i0, g.i1); break;
    case R_SWIGLU: op_swiglu(b, g.x, g.w, y, g.z0); break;
    case R_KV_STORE: op_kv_store(b, (kv_cache *)g.kv, g.i0, g.x, g.w, g.i1); break;
    case R_ATTENTION: op_attention(b, &r->u.attn); break;
    case R_MOE_ROUTE: op_moe_route(b, g.x, g.i0, g.i1, g.i2, y, (be_tensor *)g.y2); break;
    case R_MOE_MATMUL: op_moe_matmul(b, g.w, g.x, g.i0 != 0, g.i1, g.i2, g.w2, y); break;
    case R_MOE_COMBINE: op_moe_combine(b, g.x, g.w, g.i0, g.i1, g.i2, y); break;
    case R_GATHER_OUT: op_gather_out(b, g.x, g.i0, y); break;
    case R_MASK: {
        const size_t words = (size_t)((r->u.mem.n_vocab + 31) / 32);
        uint32_t *m = cb->d_mask + r->u.mem.off;
        cu_cuda(cb, cudaMemcpyAsync(m, cb->h_mask + r->u.mem.off * 4, words * 4, cudaMemcpyHostToDevice, cb->stream),
                "mask_logits");
        cu_cuda(cb, ck_mask_logits(cb->stream, F(r->u.mem.t) + (size_t)r->u.mem.row * (size_t)r->u.mem.n_vocab, m,
                                   r->u.mem.n_vocab),
                "mask_logits");
        break;
    }
    case R_FETCH:
        if (r->u.mem.bytes)
            cu_cuda(cb, cudaMemcpyAsync(r->u.mem.dst, r->u.mem.src, r->u.mem.bytes, cudaMemcpyDeviceToHost, cb->stream),
                    "fetch");
        break;
    case R_COPY_COLS: op_copy_cols(b, g.x, g.i0, g.i1, g.i2, g.i3, y, g.i4, (int)g.z0); break;
    case R_SIGMOID_MUL: op_sigmoid_mul(b, g.x, g.w, g.i0, g.i1, g.i2, y); break;
    case R_L2_NORM: op_l2_norm(b, g.x, g.i0, g.i1, g.f0, y); break;
    case R_ROPE_MULTI:
        op_rope_multi(b, r->u.rope_multi.x, r->u.rope_multi.n, r->u.rope_multi.n_head, r->u.rope_multi.head_dim,
                      r->u.rope_multi.n_rot, r->u.rope_multi.freq_base, r->u.rope_multi.sections);
        break;
    case R_SSM_CONV: op_ssm_conv(b, g.x, g.w, g.i0, g.i1, g.i2, g.kv, g.z0, y); break;
    case R_DELTA_NET: op_delta_net(b, &r->u.delta); break;
    case R_STATE_COPY: op_state_copy(b, r->u.copy.kv, r->u.copy.n, r->u.copy.src, r->u.copy.dst); break;
    default: cu_errf(cb, HN_ERR_INVALID, "cuda backend: a record of unknown kind %d", r->kind);
    }
}

/* ---- fusion: a decode step's records, run with a look ahead ----
 * Where records that follow each other can be one kernel, rec_run runs that
 * kernel instead (the records, and so the graphs' keys, are unchanged):
 *  - [add x += r,] rms_norm of x, then matmul(s) of the normed x that
 *    quantize it (Q8_0 / Q8_K): hc_norm_quant, and the matmuls reuse the x
 *    it quantized;
 *  - swiglu, then the matmul of its output: hc_swiglu_quant, likewise.
 * Each fused kernel gives the bits of the records it replaces (tested:
 * tests/test_model.c runs decode steps with HONE_CUDA_FUSE=0 and without and
 * compares the logits bit for bit). */

/* the activation type a matmul record quantizes its x for on the gemv path (HC_ACT_F32: it does not) */
static hc_act rec_quantizes(const cu_be *cb, const be_tensor *w, int n) {
    int kind;
    if (cb->ref || n < 1 || n > HC_GEMV_MAX_ROWS || !gemv_path(cb, w, n) || w->ne[2] != 1 ||
        mm_prefill(cb, w, n, &kind))
        return HC_ACT_F32; /* prefill rows: not fused (hc_mmf converts x itself) */
    const hc_act a = hc_gemv_act(w->type);
    return a == HC_ACT_Q8_0 || a == HC_ACT_Q8_K ? a : HC_ACT_F32;
}

/* the weight whose quantization of x a consumer record does first, and its row count; false if not a matmul of x */
static bool rec_consumer(const cu_rec *r, const be_tensor *x, const be_tensor **w, int *n) {
    if (r->kind == R_MATMUL && r->u.g.x == x && r->u.g.i0 == 0) {
        *w = r->u.g.w;
        *n = r->u.g.i1;
        return true;
    }
    if (r->kind == R_MULTI && r->u.multi.x == x && r->u.multi.n_w >= 1) {
        *w = r->u.multi.ws[0];
        *n = r->u.multi.n;
        return true;
    }
    return false;
}

/* runs the consumer record with x already quantized for (k, a) */
static void rec_consume(cu_be *cb, const cu_rec *r, int64_t k, hc_act a) {
    if (r->kind == R_MATMUL) {
        matmul1(cb, r->u.g.w, 0, r->u.g.x, r->u.g.i1, (be_tensor *)r->u.g.y, 1);
        return;
    }
    matmul_multi_q(cb, r->u.multi.n_w, r->u.multi.ws, r->u.multi.x, r->u.multi.n, (be_tensor *const *)r->u.multi.ys,
                   k, a);
}

/* how many records from r[0] one fused kernel ran (0: none) */
static int rec_fuse(cu_be *cb, const cu_rec *r, int left) {
    hn_err e;
    const be_tensor *w;
    int n;
    /* [add,] rms_norm, matmul */
    int at = 0;
    const cu_rec *add = NULL;
    if (r[0].kind == R_ADD && left >= 3 && r[0].u.g.y == r[0].u.g.x && r[1].kind == R_RMS_NORM &&
        r[1].u.g.x == r[0].u.g.y && r[0].u.g.z0 == (size_t)r[1].u.g.i0 * (size_t)r[1].u.g.i1 && r[1].u.g.y != r[1].u.g.x) {
        add = &r[0];
        at = 1;
    }
    if (left >= at + 2 && r[at].kind == R_RMS_NORM && r[at].u.g.y != r[at].u.g.x &&
        rec_consumer(&r[at + 1], r[at].u.g.y, &w, &n)) {
        const auto &g = r[at].u.g;
        const hc_act a = rec_quantizes(cb, w, n);
        if (a != HC_ACT_F32 && n == g.i0 && w->ne[0] == g.i1 && hc_quant_fusable(a, g.i1, n, &cb->gs)) {
            hn_status st = hc_norm_quant(F(g.x), add ? F(add->u.g.w) : NULL, g.w ? F(g.w) : NULL, n, g.i1, g.f0,
                                         F(g.y), a, &cb->gs, cb->stream, &e);
            if (st) {
                cu_hn(cb, st, &e, "rms_norm");
                return at + 2;
            }
            rec_consume(cb, &r[at + 1], g.i1, a);
            cb->fused++;
            return at + 2;
        }
    }
    /* [rms_norm q, rms_norm k,] rope q, rope k, kv_store */
    {
        const cu_rec *nq = NULL, *nk = NULL;
        int j = 0;
        if (left >= 5 && r[0].kind == R_RMS_NORM && r[1].kind == R_RMS_NORM && r[2].kind == R_ROPE) {
            nq = &r[0];
            nk = &r[1];
            j = 2;
        }
        if (left >= j + 3 && r[j].kind == R_ROPE && r[j + 1].kind == R_ROPE && r[j + 2].kind == R_KV_STORE) {
            const auto &rq = r[j].u.g, &rk = r[j + 1].u.g, &st = r[j + 2].u.g;
            const int nt = rq.i0, H = rq.i1, HKV = rk.i1, HD = rq.i2;
            bool ok = rk.i0 == nt && rk.i2 == HD && rk.i3 == rq.i3 && rk.f0 == rq.f0 && rk.i4 == rq.i4 &&
                      st.x == rk.y && st.i1 == nt && st.kv && st.i0 >= 0 && st.i0 < st.kv->cfg.n_layer &&
                      st.kv->cfg.n_head_kv == HKV && st.kv->cfg.head_dim == HD && cb->have_plan && nt >= 1 &&
                      nt <= cb->n_rows && st.w != st.x;
            if (ok && nq)
                ok = nq->u.g.x == rq.y && nq->u.g.y == rq.y && nq->u.g.i0 == nt * H && nq->u.g.i1 == HD &&
                     nk->u.g.x == rk.y && nk->u.g.y == rk.y && nk->u.g.i0 == nt * HKV && nk->u.g.i1 == HD &&
                     nq->u.g.w && nk->u.g.w;
            ck_kv g;
            if (ok && kv_geo(cb, st.kv, "kv_store", &g) && ck_qk_rope_store_ok(HD, rq.i3, &g)) {
                const float theta_scale = powf(rq.f0, -2.0f / (float)rq.i3);
                cu_cuda(cb,
                        ck_qk_rope_store(cb->stream, F(rq.y), F(rk.y), F(st.w), nq ? F(nq->u.g.w) : NULL,
                                         nk ? F(nk->u.g.w) : NULL, nt, H, HKV, HD, nq ? nq->u.g.f0 : 0.0f,
                                         nk ? nk->u.g.f0 : 0.0f, rq.i3, theta_scale, rq.i4 == (int)BE_ROPE_NEOX,
                                         cb->d_pos, &g, st.i0, cb->d_slot),
                        "kv_store");
                cb->fused++;
                return j + 3;
            }
        }
    }
    /* swiglu, matmul */
    if (left >= 2 && r[0].kind == R_SWIGLU && rec_consumer(&r[1], r[0].u.g.y, &w, &n)) {
        const auto &g = r[0].u.g;
        const hc_act a = rec_quantizes(cb, w, n);
        if (a != HC_ACT_F32 && g.z0 == (size_t)n * (size_t)w->ne[0] && hc_quant_fusable(a, w->ne[0], n, &cb->gs)) {
            hn_status st = hc_swiglu_quant(F(g.x), F(g.w), n, w->ne[0], F(g.y), a, &cb->gs, cb->stream, &e);
            if (st) {
                cu_hn(cb, st, &e, "swiglu");
                return 2;
            }
            rec_consume(cb, &r[1], w->ne[0], a);
            cb->fused++;
            return 2;
        }
    }
    return 0;
}

static void rec_run(cu_be *cb, const cu_rec *r, int n) {
    for (int i = 0; i < n;) {
        const int k = cb->fuse && !cb->ref ? rec_fuse(cb, r + i, n - i) : 0;
        if (k) {
            i += k;
            continue;
        }
        rec_exec(cb, &r[i]);
        i++;
    }
}

/* version 5: every op, the hybrid family's included */
static bool op_mem_info(be_backend *b, size_t *free_b, size_t *total_b) {
    (void)b;
    size_t f = 0, t = 0;
    if (cudaMemGetInfo(&f, &t) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    *free_b = f;
    *total_b = t;
    return true;
}

static const be_ops cuda_ops = {
    .version = BE_OPS_VERSION,
    .name = "cuda",
    .free = op_free,
    .reserve = op_reserve,
    .tensor_new = op_tensor_new,
    .weight_load = op_weight_load,
    .kv_storage = op_kv_storage,
    .plan_set = op_plan_set,
    .fetch = op_fetch,
    .upload = op_upload,
    .sync = op_sync,
    .get_rows = op_get_rows,
    .matmul = op_matmul,
    .matmul_multi = op_matmul_multi,
    .rms_norm = op_rms_norm,
    .rope = op_rope,
    .add = op_add,
    .add_bias = op_add_bias,
    .swiglu = op_swiglu,
    .kv_store = op_kv_store,
    .attention = op_attention,
    .moe_route = op_moe_route,
    .moe_matmul = op_moe_matmul,
    .moe_combine = op_moe_combine,
    .gather_out = op_gather_out,
    .mask_logits = op_mask_logits,
    .set_mm_params = op_set_mm_params,
    .clear_mm_params = op_clear_mm_params,
    .set_reference = op_set_reference,
    .mm_tunable = op_mm_tunable,
    .mm_case_new = op_mm_case_new,
    .mm_case_params = op_mm_case_params,
    .mm_case_free = op_mm_case_free,
    .copy_cols = op_copy_cols,
    .sigmoid_mul = op_sigmoid_mul,
    .l2_norm = op_l2_norm,
    .rope_multi = op_rope_multi,
    .ssm_conv = op_ssm_conv,
    .delta_net = op_delta_net,
    .state_copy = op_state_copy,
    .mem_info = op_mem_info,
    .scratch_bytes = op_scratch_bytes,
};

extern "C" {

long long be_cuda_mmf_calls(const be_backend *b) { return ((const cu_be *)b->impl)->mmf_calls; }

void be_cuda_counters(const be_backend *b, long long *fused, long long *graph_hits, long long *graph_builds) {
    const cu_be *cb = (const cu_be *)b->impl;
    if (fused) *fused = cb->fused;
    if (graph_hits) *graph_hits = cb->graph_hits;
    if (graph_builds) *graph_builds = cb->graph_builds;
}

bool be_cuda_available(const char **why) {
    if (hc_device_count() <= 0) {
        if (why) *why = "no CUDA device or driver";
        return false;
    }
    if (why) *why = NULL;
    return true;
}

hn_status be_cuda_create(int device, be_backend **out, hn_err *err) {
    *out = NULL;
    hn_status st = hc_init(device, err);
    if (st) return st;
    cu_be *cb = (cu_be *)calloc(1, sizeof *cb);
    if (!cb) return hn_errf(err, HN_ERR_NOMEM, "cuda backend: out of host memory");
    cb->device = device;
    cb->base.ops = &cuda_ops;
    cb->base.impl = cb;
    cb->base.pads = false; /* graphs are keyed by the step's shape: ops run n_tokens rows */
    cb->fetch_fresh = true;
    const char *gv = getenv("HONE_CUDA_GRAPHS"), *av = getenv("HONE_CUDA_ATTN_SPLIT");
    cb->graphs = !(gv && !strcmp(gv, "0"));
    /* the split (flash-decoding) attention unless HONE_CUDA_ATTN_SPLIT=0 (the one-block-per-head form) */
    cb->att_split = !(av && !strcmp(av, "0"));
    const char *mv = getenv("HONE_CUDA_MMF");
    cb->mmf = !(mv && !strcmp(mv, "0"));
    const char *fv = getenv("HONE_CUDA_FUSE");
    cb->fuse = !(fv && !strcmp(fv, "0"));
    cb->gcache = (cu_graph *)calloc(GRAPH_CACHE, sizeof(cu_graph));
    if (!cb->gcache) {
        free(cb);
        return hn_errf(err, HN_ERR_NOMEM, "cuda backend: out of host memory");
    }
    cudaError_t e = cudaStreamCreateWithFlags(&cb->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&cb->plan_ev, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        st = hc_fail(err, e, "creating the backend's stream");
        op_free(&cb->base);
        return st;
    }
    cb->storage.ctx = cb;
    cb->storage.granule = (size_t)2 << 20;
    cb->storage.reserve = kvs_reserve;
    cb->storage.map = kvs_map;
    cb->storage.unmap = kvs_unmap;
    cb->storage.release = kvs_release;
    vmm_load(cb);
    /* kernel attributes are set once here, never during a graph capture */
    e = ck_init();
    if (e != cudaSuccess) {
        st = hc_fail(err, e, "setting the kernels' attributes");
        op_free(&cb->base);
        return st;
    }
    *out = &cb->base;
    return HN_OK;
}

} /* extern "C" */
