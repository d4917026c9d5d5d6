/* cuda_int.cuh: private to backend/cuda: the error macros shared by the .cu
 * files. A CUDA error becomes an hn_status and a message naming the call. */
#ifndef HN_CUDA_INT_CUH
#define HN_CUDA_INT_CUH

#include <cuda_runtime.h>

#include "cuda.h"

/* The hn_status of a CUDA error: memory errors are HN_ERR_NOMEM, a missing
 * driver or device HN_ERR_UNSUPPORTED, bad values HN_ERR_INVALID, the rest
 * HN_ERR_INTERNAL. */
hn_status hc_status_of(cudaError_t e);
/* Records e on err as "cuda: <what>: <CUDA's message>"; returns its status. */
hn_status hc_fail(hn_err *err, cudaError_t e, const char *what);

/* Evaluates a CUDA call; on error returns its status from the function. */
#define HC_TRY(call, err, what)                     \
    do {                                            \
        cudaError_t hc_e_ = (call);                 \
        if (hc_e_ != cudaSuccess) return hc_fail((err), hc_e_, (what)); \
    } while (0)

/* After a launch: the launch's own error (bad configuration, no kernel image
 * for this device), without waiting for the kernel. */
#define HC_LAUNCHED(err, what) HC_TRY(cudaGetLastError(), err, what)

#endif
