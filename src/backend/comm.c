/* comm.c: the communicator and its host transport (comm.h); the NCCL
 * transport is backend/cuda/cuda_comm.cu. */
#include "comm.h"

#include <string.h>

#include "../core/alloc.h"

#if defined(HN_HAVE_CUDA) && defined(HN_HAVE_NCCL)
#include "cuda/cuda_comm.h"
#endif

/* ---- checks shared by the transports ---- */

static bool holds(const be_tensor *t, size_t n) {
    return t && (t->type == QT_F32 || t->type == QT_I32) && n <= (size_t)t->ne[0] * (size_t)t->ne[1];
}

static hn_status sync_all(hn_comm *c, hn_err *err) {
    hn_status first = HN_OK;
    for (int r = 0; r < c->n; r++) {
        hn_err e;
        hn_status st = c->rank[r]->ops->sync(c->rank[r], &e);
        if (st && !first) first = hn_errf(err, st, "comm: rank %d: %s", r, e.msg);
    }
    return first;
}

hn_status comm_all_reduce_sum(hn_comm *c, be_tensor *const *t, size_t n, hn_err *err) {
    for (int r = 0; r < c->n; r++)
        if (!holds(t[r], n) || t[r]->type != QT_F32)
            return hn_errf(err, HN_ERR_INVALID, "comm: all_reduce of %zu f32 values: rank %d's tensor is smaller", n, r);
    if (n == 0) return HN_OK;
    return c->vt->all_reduce_sum(c, t, n, err);
}

hn_status comm_all_gather(hn_comm *c, be_tensor *const *src, size_t n, be_tensor *const *dst, hn_err *err) {
    for (int r = 0; r < c->n; r++) {
        if (!holds(src[r], n) || !holds(dst[r], n * (size_t)c->n))
            return hn_errf(err, HN_ERR_INVALID, "comm: all_gather of %zu values from %d ranks: rank %d's tensors are smaller",
                           n, c->n, r);
        for (int q = 0; q < c->n; q++)
            if (dst[r] == src[q]) return hn_errf(err, HN_ERR_INVALID, "comm: all_gather: rank %d gathers into a source", r);
    }
    if (n == 0) return HN_OK;
    return c->vt->all_gather(c, src, n, dst, err);
}

/* ---- the host transport ---- */

/* Rank r's first n values, on the host (valid until the rank's next step). */
static const float *host_view(hn_comm *c, int r, const be_tensor *t, size_t n, hn_err *err, hn_status *st) {
    be_backend *b = c->rank[r];
    const void *h = NULL;
    size_t w = (size_t)t->ne[0];
    b->ops->fetch(b, t, (int)((n + w - 1) / w), &h);
    hn_err e;
    if ((*st = b->ops->sync(b, &e))) {
        hn_errf(err, *st, "comm: rank %d: %s", r, e.msg);
        return NULL;
    }
    return h;
}

static hn_status host_reduce(hn_comm *c, be_tensor *const *t, size_t n, hn_err *err) {
    hn_status st = sync_all(c, err);
    if (st) return st;
    if (n > c->acc_cap) {
        float *a = hn_realloc(c->acc, n * sizeof(float));
        if (!a) return hn_errf(err, HN_ERR_NOMEM, "comm: out of memory for %zu values", n);
        c->acc = a;
        c->acc_cap = n;
    }
    /* rank order: acc = r0, then acc += r1, += r2, ... */
    for (int r = 0; r < c->n; r++) {
        const float *h = host_view(c, r, t[r], n, err, &st);
        if (!h) return st;
        if (r == 0) memcpy(c->acc, h, n * sizeof(float));
        else
            for (size_t i = 0; i < n; i++) c->acc[i] += h[i];
    }
    for (int r = 0; r < c->n; r++) c->rank[r]->ops->upload(c->rank[r], t[r], 0, c->acc, n * sizeof(float));
    return HN_OK;
}

static hn_status host_gather(hn_comm *c, be_tensor *const *src, size_t n, be_tensor *const *dst, hn_err *err) {
    hn_status st = sync_all(c, err);
    if (st) return st;
    const float *h[COMM_MAX_RANKS];
    for (int r = 0; r < c->n; r++)
        if (!(h[r] = host_view(c, r, src[r], n, err, &st))) return st;
    for (int q = 0; q < c->n; q++)
        for (int r = 0; r < c->n; r++)
            c->rank[q]->ops->upload(c->rank[q], dst[q], (size_t)r * n * sizeof(float), h[r], n * sizeof(float));
    return HN_OK;
}

static const comm_vt host_vt = {.name = "host", .all_reduce_sum = host_reduce, .all_gather = host_gather};

static hn_status comm_new(int n, be_backend *const *ranks, hn_comm **out, hn_err *err) {
    *out = NULL;
    if (n < 1 || n > COMM_MAX_RANKS) return hn_errf(err, HN_ERR_INVALID, "comm: %d ranks (1..%d)", n, COMM_MAX_RANKS);
    for (int r = 0; r < n; r++) {
        if (!ranks[r]) return hn_errf(err, HN_ERR_INVALID, "comm: rank %d has no backend", r);
        for (int q = 0; q < r; q++)
            if (ranks[q] == ranks[r]) return hn_errf(err, HN_ERR_INVALID, "comm: ranks %d and %d are one backend", q, r);
    }
    hn_comm *c = hn_calloc(1, sizeof *c);
    if (!c) return hn_errf(err, HN_ERR_NOMEM, "comm: out of memory");
    c->n = n;
    for (int r = 0; r < n; r++) c->rank[r] = ranks[r];
    *out = c;
    return HN_OK;
}

hn_status comm_host_create(int n, be_backend *const *ranks, hn_comm **out, hn_err *err) {
    hn_status st = comm_new(n, ranks, out, err);
    if (!st) (*out)->vt = &host_vt;
    return st;
}

hn_status comm_nccl_create(int n, be_backend *const *ranks, hn_comm **out, hn_err *err) {
    *out = NULL;
#if !defined(HN_HAVE_CUDA)
    (void)n, (void)ranks;
    return hn_errf(err, HN_ERR_UNSUPPORTED, "comm: NCCL needs a CUDA build (this hone was built without CUDA)");
#elif !defined(HN_HAVE_NCCL)
    (void)n, (void)ranks;
    return hn_errf(err, HN_ERR_UNSUPPORTED, "comm: this hone was built without NCCL (nccl.h was not found at build time)");
#else
    for (int r = 0; r < n && r < COMM_MAX_RANKS; r++)
        if (ranks[r] && strcmp(ranks[r]->ops->name, "cuda"))
            return hn_errf(err, HN_ERR_UNSUPPORTED, "comm: NCCL joins CUDA backends; rank %d is %s", r, ranks[r]->ops->name);
    hn_status st = comm_new(n, ranks, out, err);
    if (st) return st;
    if ((st = cuda_comm_nccl_init(*out, err))) {
        hn_free(*out);
        *out = NULL;
    }
    return st;
#endif
}

hn_status comm_create(int n, be_backend *const *ranks, hn_comm **out, hn_err *err) {
    bool all_cuda = n > 0;
    for (int r = 0; r < n && r < COMM_MAX_RANKS; r++) all_cuda = all_cuda && ranks[r] && !strcmp(ranks[r]->ops->name, "cuda");
    return all_cuda ? comm_nccl_create(n, ranks, out, err) : comm_host_create(n, ranks, out, err);
}

void comm_free(hn_comm *c) {
    if (!c) return;
    if (c->vt && c->vt->free) c->vt->free(c);
    hn_free(c->acc);
    hn_free(c);
}

int comm_size(const hn_comm *c) { return c->n; }
const char *comm_transport(const hn_comm *c) { return c->vt->name; }
