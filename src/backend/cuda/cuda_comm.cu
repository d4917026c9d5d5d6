/* cuda_comm.cu: the NCCL transport of backend/comm.h.
 *
 * One process, one thread: ncclCommInitAll makes a communicator per rank's
 * device; a collective syncs every rank's backend (its recorded or queued
 * ops run first), issues the ranks' calls inside ncclGroupStart/End on a
 * stream per rank, and waits for those streams, so the collective is done
 * when it returns and the backends' later ops see its result. libnccl is
 * loaded at run time (dlopen, as the driver's VMM calls are): the CUDA
 * runtime is linked statically so that a binary runs on machines without
 * a GPU, and a link-time -lnccl would make every binary need libnccl.so.2
 * to start. NCCL_NVLS_ENABLE=0 is set before the communicators are made
 * (NVLink multicast off). Only nccl.h's types are used at build time. */
#if defined(HN_HAVE_NCCL)

#include <dlfcn.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend.h"
#include "cuda_comm.h"
#include "cuda_int.cuh"

typedef ncclResult_t (*pf_init_all)(ncclComm_t *, int, const int *);
typedef ncclResult_t (*pf_destroy)(ncclComm_t);
typedef ncclResult_t (*pf_group)(void);
typedef ncclResult_t (*pf_all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
typedef ncclResult_t (*pf_all_gather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
typedef const char *(*pf_errstr)(ncclResult_t);

typedef struct nccl_lib {
    void *h;
    pf_init_all init_all;
    pf_destroy destroy;
    pf_group group_start, group_end;
    pf_all_reduce all_reduce;
    pf_all_gather all_gather;
    pf_errstr errstr;
} nccl_lib;

typedef struct nccl_comm {
    nccl_lib lib;
    int dev[COMM_MAX_RANKS];
    ncclComm_t comm[COMM_MAX_RANKS];
    cudaStream_t stream[COMM_MAX_RANKS];
} nccl_comm;

/* libnccl.so.2 from the loader's path, else HONE_NCCL_LIB, else where the build found it */
static hn_status lib_load(nccl_lib *l, hn_err *err) {
    const char *env = getenv("HONE_NCCL_LIB");
    l->h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!l->h && env && *env) l->h = dlopen(env, RTLD_NOW | RTLD_LOCAL);
#ifdef HN_NCCL_LIB
    if (!l->h) l->h = dlopen(HN_NCCL_LIB, RTLD_NOW | RTLD_LOCAL);
#endif
    if (!l->h)
        return hn_errf(err, HN_ERR_UNSUPPORTED, "comm: libnccl.so.2 cannot be loaded (%s); HONE_NCCL_LIB names the file",
                       dlerror());
    l->init_all = (pf_init_all)dlsym(l->h, "ncclCommInitAll");
    l->destroy = (pf_destroy)dlsym(l->h, "ncclCommDestroy");
    l->group_start = (pf_group)dlsym(l->h, "ncclGroupStart");
    l->group_end = (pf_group)dlsym(l->h, "ncclGroupEnd");
    l->all_reduce = (pf_all_reduce)dlsym(l->h, "ncclAllReduce");
    l->all_gather = (pf_all_gather)dlsym(l->h, "ncclAllGather");
    l->errstr = (pf_errstr)dlsym(l->h, "ncclGetErrorString");
    if (!l->init_all || !l->destroy || !l->group_start || !l->group_end || !l->all_reduce || !l->all_gather || !l->errstr) {
        dlclose(l->h);
        l->h = NULL;
        return hn_errf(err, HN_ERR_UNSUPPORTED, "comm: libnccl lacks the calls hone uses (an NCCL older than 2.x?)");
    }
    return HN_OK;
}

static hn_status nccl_fail(const nccl_comm *nc, hn_err *err, ncclResult_t r, const char *what) {
    return hn_errf(err, r == ncclSystemError ? HN_ERR_IO : HN_ERR_INTERNAL, "comm: nccl %s: %s", what, nc->lib.errstr(r));
}

static hn_status sync_ranks(hn_comm *c, hn_err *err) {
    for (int r = 0; r < c->n; r++) {
        hn_err e;
        hn_status st = c->rank[r]->ops->sync(c->rank[r], &e);
        if (st) return hn_errf(err, st, "comm: rank %d: %s", r, e.msg);
    }
    return HN_OK;
}

/* Waits for the ranks' streams (restoring the calling thread's device). */
static hn_status wait_ranks(nccl_comm *nc, int n, int cur, hn_err *err) {
    hn_status first = HN_OK;
    for (int r = 0; r < n; r++) {
        cudaSetDevice(nc->dev[r]);
        cudaError_t e = cudaStreamSynchronize(nc->stream[r]);
        if (e != cudaSuccess && !first) first = hc_fail(err, e, "an NCCL collective");
    }
    cudaSetDevice(cur);
    return first;
}

static hn_status nccl_reduce(hn_comm *c, be_tensor *const *t, size_t n, hn_err *err) {
    nccl_comm *nc = (nccl_comm *)c->impl;
    hn_status st = sync_ranks(c, err);
    if (st) return st;
    int cur = 0;
    cudaGetDevice(&cur);
    ncclResult_t r = nc->lib.group_start();
    for (int q = 0; q < c->n && r == ncclSuccess; q++)
        r = nc->lib.all_reduce(t[q]->data, t[q]->data, n, ncclFloat32, ncclSum, nc->comm[q], nc->stream[q]);
    ncclResult_t r2 = nc->lib.group_end();
    if (r == ncclSuccess) r = r2;
    if (r != ncclSuccess) {
        cudaSetDevice(cur);
        return nccl_fail(nc, err, r, "all_reduce");
    }
    return wait_ranks(nc, c->n, cur, err);
}

static hn_status nccl_gather(hn_comm *c, be_tensor *const *src, size_t n, be_tensor *const *dst, hn_err *err) {
    nccl_comm *nc = (nccl_comm *)c->impl;
    hn_status st = sync_ranks(c, err);
    if (st) return st;
    int cur = 0;
    cudaGetDevice(&cur);
    ncclResult_t r = nc->lib.group_start();
    for (int q = 0; q < c->n && r == ncclSuccess; q++)
        r = nc->lib.all_gather(src[q]->data, dst[q]->data, n, ncclFloat32, nc->comm[q], nc->stream[q]);
    ncclResult_t r2 = nc->lib.group_end();
    if (r == ncclSuccess) r = r2;
    if (r != ncclSuccess) {
        cudaSetDevice(cur);
        return nccl_fail(nc, err, r, "all_gather");
    }
    return wait_ranks(nc, c->n, cur, err);
}

static void nccl_free(hn_comm *c) {
    nccl_comm *nc = (nccl_comm *)c->impl;
    if (!nc) return;
    int cur = 0;
    cudaGetDevice(&cur);
    for (int r = 0; r < c->n; r++) {
        if (nc->comm[r]) nc->lib.destroy(nc->comm[r]);
        if (nc->stream[r]) {
            cudaSetDevice(nc->dev[r]);
            cudaStreamDestroy(nc->stream[r]);
        }
    }
    cudaSetDevice(cur);
    if (nc->lib.h) dlclose(nc->lib.h);
    free(nc);
    c->impl = NULL;
}

static const comm_vt nccl_vt = {"nccl", nccl_reduce, nccl_gather, nccl_free};

extern "C" hn_status cuda_comm_nccl_init(hn_comm *c, hn_err *err) {
    nccl_comm *nc = (nccl_comm *)calloc(1, sizeof *nc);
    if (!nc) return hn_errf(err, HN_ERR_NOMEM, "comm: out of host memory");
    for (int r = 0; r < c->n; r++) {
        nc->dev[r] = be_cuda_device(c->rank[r]);
        for (int q = 0; q < r; q++)
            if (nc->dev[q] == nc->dev[r]) {
                const int d = nc->dev[r];
                free(nc);
                return hn_errf(err, HN_ERR_INVALID, "comm: ranks %d and %d are both on GPU %d (one device a rank)", q, r, d);
            }
    }
    hn_status st = lib_load(&nc->lib, err);
    if (st) {
        free(nc);
        return st;
    }
    /* NVLink multicast (NVLS) stays off: set before any communicator exists */
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    c->impl = nc;
    c->vt = &nccl_vt;
    int cur = 0;
    cudaGetDevice(&cur);
    for (int r = 0; r < c->n; r++) {
        cudaSetDevice(nc->dev[r]);
        cudaError_t e = cudaStreamCreateWithFlags(&nc->stream[r], cudaStreamNonBlocking);
        if (e != cudaSuccess) {
            st = hc_fail(err, e, "creating an NCCL stream");
            cudaSetDevice(cur);
            nccl_free(c);
            return st;
        }
    }
    cudaSetDevice(cur);
    ncclResult_t r = nc->lib.init_all(nc->comm, c->n, nc->dev);
    if (r != ncclSuccess) {
        memset(nc->comm, 0, sizeof nc->comm);
        st = nccl_fail(nc, err, r, "ncclCommInitAll");
        nccl_free(c);
        return st;
    }
    return HN_OK;
}

#endif
