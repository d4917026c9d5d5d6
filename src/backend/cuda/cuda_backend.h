/* cuda_backend.h: the cuda backend (be_ops over backend/cuda's kernels;
 * DESIGN.md, "backend/ cuda"). C API; built only with nvcc (HN_HAVE_CUDA).
 *
 * be_cuda_available() is true when the CUDA runtime finds a device. */
#ifndef HN_CUDA_BACKEND_H
#define HN_CUDA_BACKEND_H

#ifdef __cplusplus
extern "C" {
#endif

#include "../backend.h"

/* Creates the backend on GPU `device` (its context, a stream, the KV
 * storage). HN_ERR_UNSUPPORTED with the reason when there is no driver or
 * device. Call ops->reserve before the first op. */
hn_status be_cuda_create(int device, be_backend **out, hn_err *err);
/* Whether the backend may be used here; *why (static text) when not. */
bool be_cuda_available(const char **why);
/* How many times a decode step's records ran as one fused kernel (cuda_backend.cu, "fusion"), and CUDA graph
 * replays and captures, since the backend was made: what tests check actually ran. */
void be_cuda_counters(const be_backend *b, long long *fused, long long *graph_hits, long long *graph_builds);
/* The GPU ordinal the backend runs on (the NCCL transport, backend/comm.h). */
int be_cuda_device(const be_backend *b);
/* How many matmul calls took hc_mmf (prefill rows on the tensor cores; HONE_CUDA_MMF=0: none). */
long long be_cuda_mmf_calls(const be_backend *b);
/* How many attention calls took ck_fattn (prefill tiles on the tensor cores; HONE_CUDA_FATTN=0: none). */
long long be_cuda_fattn_calls(const be_backend *b);
/* attention calls whose decode rows could take the tensor cores (ck_fattn_dec: f16 cache, head_dim 64/128) */
long long be_cuda_fdec_calls(const be_backend *b);

#ifdef __cplusplus
}
#endif

#endif
