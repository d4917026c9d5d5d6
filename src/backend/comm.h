/* comm.h: collectives over the ranks of a tensor-parallel model (DESIGN.md,
 * "Several devices: tensor parallel").
 *
 * A communicator joins R backends, the ranks 0..R-1 (one per device), in one
 * process. A collective takes one tensor per rank and is blocking: every
 * rank's backend is synced first (the ops queued before are done, and an
 * error they had is the collective's), the collective runs, and when it
 * returns each rank's destination holds the result; ops queued on a rank
 * afterwards see it. Elements are 4 bytes (f32 sums; a gather copies bits).
 *
 * Transports:
 *  - host: through host memory, over any backends (fetch, then upload):
 *    the fake transport that tests sharding with R CPU backends in one
 *    process. Sums are taken in rank order (((r0 + r1) + r2) + ...), the same
 *    result written to every rank, so results are reproducible bit for bit
 *    and equal on every rank.
 *  - nccl: NCCL over CUDA backends, one device a rank (CUDA builds that
 *    found nccl.h; libnccl is loaded at run time, so a binary without it
 *    still runs the rest). NCCL_NVLS_ENABLE=0 is set before the
 *    communicator is made (NVLink multicast stays off). A one-rank NCCL
 *    communicator is valid (its collectives are copies).
 *
 * Nothing allocates in a collective except the host transport's sum buffer
 * on a new high-water mark. Not thread-safe: the model's thread owns it. */
#ifndef HN_COMM_H
#define HN_COMM_H

#include <stddef.h>

#include "backend.h"

/* most ranks of one communicator */
#define COMM_MAX_RANKS 8

typedef struct hn_comm hn_comm;

/* The host transport over n ranks (1..COMM_MAX_RANKS; the backends are
 * borrowed and must outlive it; distinct). */
hn_status comm_host_create(int n, be_backend *const *ranks, hn_comm **out, hn_err *err);
/* The NCCL transport over n CUDA backends on distinct devices.
 * HN_ERR_UNSUPPORTED (saying why) in a build without CUDA or nccl.h, when
 * libnccl cannot be loaded, or for a backend that is not CUDA's. */
hn_status comm_nccl_create(int n, be_backend *const *ranks, hn_comm **out, hn_err *err);
/* The transport for these ranks: nccl when every rank is a CUDA backend,
 * else host. */
hn_status comm_create(int n, be_backend *const *ranks, hn_comm **out, hn_err *err);
void comm_free(hn_comm *c);

int comm_size(const hn_comm *c);
/* "host" or "nccl" */
const char *comm_transport(const hn_comm *c);

/* t[r] is rank r's tensor (f32): its first n values become, on every rank,
 * their sum over the ranks. HN_ERR_INVALID if a tensor holds fewer than n
 * values; the backends' errors (their syncs). */
hn_status comm_all_reduce_sum(hn_comm *c, be_tensor *const *t, size_t n, hn_err *err);
/* src[r]'s first n values (4-byte elements) go to every rank's dst, at
 * element r * n: dst[q] then holds the ranks' parts in rank order (n R
 * values; dst[q] must not be any src). */
hn_status comm_all_gather(hn_comm *c, be_tensor *const *src, size_t n, be_tensor *const *dst, hn_err *err);

/* ---- for the transports (comm.c and backend/cuda's NCCL) ---- */
typedef struct comm_vt {
    const char *name;
    hn_status (*all_reduce_sum)(hn_comm *c, be_tensor *const *t, size_t n, hn_err *err);
    hn_status (*all_gather)(hn_comm *c, be_tensor *const *src, size_t n, be_tensor *const *dst, hn_err *err);
    void (*free)(hn_comm *c);
} comm_vt;

struct hn_comm {
    const comm_vt *vt;
    int n;
    be_backend *rank[COMM_MAX_RANKS];
    void *impl;
    float *acc; /* host: the sum buffer */
    size_t acc_cap;
};

#endif
