/* cuda_backend.cu: the cuda backend's be_ops (backend.h is the contract,
 * cuda_backend.h the entry points): device memory for tensors, the KV pool's
 * storage, the step's plan on the device, the copies, the single error point,
 * CUDA graphs of recorded steps and the lifecycle; the compute ops are in
 * cuda_ops.cu (over the kernels of cuda_gemv.cu, cuda_mmf.cu, cuda_mm.cu and
 * cuda_kern.cu), the state both share in cuda_state.cuh.
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

#include "cuda_backend.h"
#include "cuda_state.cuh"

/* ---- errors ---- */

void cu_errf(cu_be *cb, hn_status st, const char *fmt, ...) {
    if (cb->err) return;
    cb->err = st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cb->err_msg, sizeof cb->err_msg, fmt, ap);
    va_end(ap);
}

/* records a CUDA error of op `what` (cudaSuccess: nothing) */
void cu_cuda(cu_be *cb, cudaError_t e, const char *what) {
    if (e == cudaSuccess) return;
    (void)cudaGetLastError();
    if (e == cudaErrorNotSupported) {
        cu_errf(cb, HN_ERR_UNSUPPORTED, "cuda backend: %s: not supported", what);
        return;
    }
    cu_errf(cb, hc_status_of(e), "cuda backend: %s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

/* records an hc_* call's failure */
void cu_hn(cu_be *cb, hn_status st, const hn_err *e, const char *what) {
    if (st) cu_errf(cb, st, "cuda backend: %s: %s", what, e->msg);
}

/* the plan for an op that reads it; without one the op does nothing and sync fails */
bool need_plan(cu_be *cb, const char *op) {
    if (!cb->have_plan) cu_errf(cb, HN_ERR_INVALID, "cuda backend: %s before plan_set", op);
    return cb->have_plan;
}

bool rows_ok(cu_be *cb, const char *op, int n) {
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

kv_range *range_of(cu_be *cb, void *base) {
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

static void graphs_drop(cu_be *cb);

static void kvs_release(void *ctx, void *base, size_t bytes) {
    (void)bytes;
    cu_be *cb = (cu_be *)ctx;
    kv_range *r = range_of(cb, base);
    if (!r) return;
    /* captured graphs hold this range's addresses, and a cache made later at
     * the same host address would match their records: forget them */
    graphs_drop(cb);
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
bool kv_geo(cu_be *cb, const kv_cache *kv, const char *op, ck_kv *g) {
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
cm_w cm_of(const be_tensor *w, bool rows) {
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


/* a zeroed record of this kind (padding included, so that records compare
 * with memcmp), or NULL when the step has left recording (the op then runs directly) */
cu_rec *rec_push(cu_be *cb, int kind) {
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
void rec_flush_direct(cu_be *cb) {
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
    cb->gcache = NULL;
    free(cb->rec);
    cb->rec = NULL;
    if (cb->h_mask) cudaFreeHost(cb->h_mask);
}

/* Which rows are prefill rows: a token of a sequence with two or more
 * tokens in the step, or of a sequence the plan marks as prompt rows
 * (step_plan.prompt: one alone included; cu_be.prompt_rows), that is not rowwise (DESIGN.md: the
 * CPU's prefill tiles, the same rule). Their matmuls may take hc_mmf and their
 * attention the flash tiles (fa_of: a prompt run of any length), so a prompt
 * row's bits do not depend on where the prompt was cut; every other row (a
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
        cb->pf_row[t] = cb->mmf && !cb->ref && s >= 0 && s < p->n_seqs &&
                        (cb->pf_cnt[s] >= 2 || (cb->prompt_rows && p->prompt && p->prompt[s])) && !(p->rowwise && p->rowwise[s]);
    }
    for (int32_t i = 0; i < p->n_out; i++) {
        const int32_t t = p->out_rows[i];
        cb->pf_out[i] = t >= 0 && t < rows ? cb->pf_row[t] : 0;
    }
    cb->pf_rows_kind = pf_kind(cb->pf_row, rows);
    cb->pf_out_kind = pf_kind(cb->pf_out, p->n_out);
}

/* The prefill rows' flash-attention tiles (cu_be.fattn): each run of
 * consecutive prefill rows of one sequence at consecutive positions, at
 * least FA_MIN_RUN of them, cut into tiles of ck_fattn_tile_tokens(); every
 * other row of the plan's tokens goes to the rest list, in order. Small
 * steps (recorded as graphs) and the reference mode have none. Into h_fa:
 * the tiles' pairs, then the rest rows. */
#define FA_MIN_RUN 16
static bool prompt_row(const cu_be *cb, const step_plan *p, int32_t t) {
    return cb->prompt_rows && p->prompt && p->seq[t] >= 0 && p->seq[t] < p->n_seqs && p->prompt[p->seq[t]];
}

static void fa_of(cu_be *cb, const step_plan *p, int32_t rows) {
    cb->n_fa_tiles = cb->n_fa_rest = 0;
    const int32_t n = p->n_tokens;
    bool any_prompt = false;
    for (int32_t t = 0; t < n && !any_prompt; t++) any_prompt = cb->pf_row[t] && prompt_row(cb, p, t);
    if (!cb->fattn || cb->ref || (!any_prompt && (rows <= GRAPH_MAX_ROWS || n < FA_MIN_RUN))) return;
    const int tq = ck_fattn_tile_tokens();
    int32_t *tiles = cb->h_fa, n_tiles = 0;
    /* tiles first (at most one a row: prompt rows make tiles of any length), the rest rows after:
     * counted once, then placed */
    int32_t *rest = cb->h_fa + 2 * (size_t)n, n_rest = 0;
    for (int32_t t = 0; t < n;) {
        int32_t e = t + 1;
        if (cb->pf_row[t])
            while (e < n && cb->pf_row[e] && p->seq[e] == p->seq[t] && p->pos[e] == p->pos[e - 1] + 1) e++;
        if (cb->pf_row[t] && (e - t >= FA_MIN_RUN || prompt_row(cb, p, t))) {
            for (int32_t a = t; a < e; a += tq) {
                tiles[2 * n_tiles] = a;
                tiles[2 * n_tiles + 1] = e - a < tq ? e - a : tq;
                n_tiles++;
            }
        } else {
            for (int32_t a = t; a < e; a++) rest[n_rest++] = a;
        }
        t = e;
    }
    if (!n_tiles) return;
    memmove(cb->h_fa + 2 * n_tiles, rest, sizeof(int32_t) * (size_t)n_rest);
    cb->n_fa_tiles = n_tiles;
    cb->n_fa_rest = n_rest;
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
    /* + the flash attention's tiles (two words each, at most one a row) and rest rows */
    const size_t need = 8 * (size_t)rows + (size_t)p->n_seqs * (2 + (size_t)p->bt_stride) + (size_t)p->n_out;
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
        free(cb->h_fa);
        cb->d_plan = cb->h_plan = cb->h_state_slot = cb->h_state_snap = cb->pf_cnt = cb->h_fa = NULL;
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
        if (e == cudaSuccess && !(cb->h_fa = (int32_t *)malloc(cap * 4))) e = cudaErrorMemoryAllocation;
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
    pf_of(cb, p, rows);
    fa_of(cb, p, rows);
    PUT(d_fa_tiles, cb->h_fa, 2 * (size_t)cb->n_fa_tiles);
    PUT(d_fa_rest, cb->h_fa + 2 * (size_t)cb->n_fa_tiles, cb->n_fa_rest);
#undef PUT
    cudaError_t e = cudaMemcpyAsync(d, h, o * 4, cudaMemcpyHostToDevice, cb->stream);
    if (e == cudaSuccess) e = cudaEventRecord(cb->plan_ev, cb->stream);
    if (e != cudaSuccess) {
        cu_cuda(cb, e, "plan_set: copying the plan");
        return;
    }
    cb->plan_ev_live = true;
    cb->n_rows = rows;
    cb->n_tokens = p->n_tokens;
    cb->n_seqs = p->n_seqs;
    cb->n_out = p->n_out;
    cb->bt_stride = p->bt_stride;
    cb->have_plan = true;
    /* a step with flash-attention tiles (prompt rows of a small piece) runs directly: a graph's key
     * does not hold the tiles */
    if (cb->graphs && !cb->ref && rows <= GRAPH_MAX_ROWS && cb->n_fa_tiles == 0) {
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


/* ---- reference mode (the tuning ops are cuda_tune.cu's) ---- */

static void op_set_reference(be_backend *b, bool on) {
    cu_be *cb = cu_of(b);
    rec_flush_direct(cb);
    cb->ref = on;
}

/* ---- lifecycle ---- */

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
    hc_free(cb->slot_work);
    cudaFree(cb->d_plan);
    if (cb->h_plan) cudaFreeHost(cb->h_plan);
    free(cb->pf_row);
    free(cb->pf_out);
    free(cb->pf_cnt);
    free(cb->h_state_slot);
    free(cb->h_state_snap);
    free(cb->h_fa);
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
    return cb->arena_cap + gs + (cb->xr_cap + cb->att_part_cap) * sizeof(float) + cb->slot_work_cap + cb->fetch_cap;
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
    const size_t sw_need = lim->max_experts > 1 ? hc_mmf_slots_work(grows, lim->max_experts) : 0;
    if (sw_need > cb->slot_work_cap) {
        graphs_drop(cb);
        hc_free(cb->slot_work);
        cb->slot_work = NULL;
        cb->slot_work_cap = 0;
        hn_status st = hc_malloc(&cb->slot_work, sw_need, err);
        if (st) return st;
        cb->slot_work_cap = sw_need;
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

/* the backend's table: memory, plan, copies and lifecycle here, the compute ops from cuda_ops.cu */
static be_ops cuda_ops;

static void cuda_ops_init(void) {
    if (cuda_ops.name) return;
    be_ops o;
    memset(&o, 0, sizeof o);
    o.version = BE_OPS_VERSION;
    o.name = "cuda";
    o.free = op_free;
    o.reserve = op_reserve;
    o.tensor_new = op_tensor_new;
    o.weight_load = op_weight_load;
    o.kv_storage = op_kv_storage;
    o.plan_set = op_plan_set;
    o.fetch = op_fetch;
    o.upload = op_upload;
    o.sync = op_sync;
    o.set_reference = op_set_reference;
    o.mem_info = op_mem_info;
    o.scratch_bytes = op_scratch_bytes;
    cu_compute_ops(&o);
    cu_tune_ops(&o, graphs_drop);
    cuda_ops = o;
}

extern "C" {

int be_cuda_device(const be_backend *b) { return ((const cu_be *)b->impl)->device; }

long long be_cuda_mmf_calls(const be_backend *b) { return ((const cu_be *)b->impl)->mmf_calls; }

long long be_cuda_fattn_calls(const be_backend *b) { return ((const cu_be *)b->impl)->fattn_calls; }
long long be_cuda_fdec_calls(const be_backend *b) { return ((const cu_be *)b->impl)->fdec_calls; }

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
    cuda_ops_init();
    cb->base.ops = &cuda_ops;
    cb->base.impl = cb;
    cb->base.pads = false; /* graphs are keyed by the step's shape: ops run n_tokens rows */
    cb->fetch_fresh = true;
    const char *gv = getenv("HONE_CUDA_GRAPHS"), *av = getenv("HONE_CUDA_ATTN_SPLIT");
    cb->graphs = !(gv && !strcmp(gv, "0"));
    /* the split (flash-decoding) attention unless HONE_CUDA_ATTN_SPLIT=0 (the one-block-per-head form) */
    cb->att_split = !(av && !strcmp(av, "0"));
    /* the block-wide combine of the split attention's chunks: HONE_CUDA_COMBINE=1 (not yet the default:
     * it has not run on a GPU) */
    const char *cv = getenv("HONE_CUDA_COMBINE");
    cb->combine2 = cv && !strcmp(cv, "1");
    /* the plan's prompt flag (prompt rows in the prefill form however few): HONE_CUDA_PROMPT=1, likewise
     * not yet run on a GPU */
    const char *pr = getenv("HONE_CUDA_PROMPT");
    cb->prompt_rows = pr && !strcmp(pr, "1");
    const char *rv = getenv("HONE_CUDA_MMREG"); /* k_mm_reg for f32 prefill products: likewise not yet run */
    cb->mmreg = rv && !strcmp(rv, "1");
    const char *mv = getenv("HONE_CUDA_MMF");
    cb->mmf = !(mv && !strcmp(mv, "0"));
    const char *sv = getenv("HONE_CUDA_SLOTS");
    cb->slots = !(sv && !strcmp(sv, "0"));
    /* the fused gate/up/swiglu slots kernel: HONE_CUDA_SLOTS2=1 (not yet run on a GPU, so not the default) */
    const char *s2 = getenv("HONE_CUDA_SLOTS2");
    cb->slots2 = cb->slots && s2 && !strcmp(s2, "1");
    const char *tv = getenv("HONE_CUDA_FATTN");
    cb->fattn = !(tv && !strcmp(tv, "0"));
    const char *fv = getenv("HONE_CUDA_FUSE");
    cb->fuse = !(fv && !strcmp(fv, "0"));
    /* programmatic dependent launch between a step's kernels (sm_90+) unless HONE_CUDA_PDL=0 */
    const char *pv = getenv("HONE_CUDA_PDL");
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
        (void)cudaGetLastError();
        major = 0;
    }
    cb->pdl = major >= 9 && !(pv && !strcmp(pv, "0"));
    /* kernels specialised at run time by NVRTC (cuda_rtc.h; today rms_norm): HONE_CUDA_RTC=1. Written and
     * compiled (tests/test_cuda_rtc.c), NOT yet run on a GPU, so not the default */
    const char *rt = getenv("HONE_CUDA_RTC");
    cb->rtc = rt && !strcmp(rt, "1");
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
    if (e == cudaSuccess) e = ck_fattn_init();
    if (e != cudaSuccess) {
        st = hc_fail(err, e, "setting the kernels' attributes");
        op_free(&cb->base);
        return st;
    }
    *out = &cb->base;
    return HN_OK;
}

} /* extern "C" */
