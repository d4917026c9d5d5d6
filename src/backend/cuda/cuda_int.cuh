/* cuda_int.cuh: private to backend/cuda: the error macros shared by the .cu
 * files. A CUDA error becomes an hn_status and a message naming the call. */
#ifndef HN_CUDA_INT_CUH
#define HN_CUDA_INT_CUH

#include <cuda_runtime.h>

#include "cuda.h"
#include "cuda_common.cuh"

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

/* x [na][k] quantized for w's type into the scratch (unless reuse_x: it
 * already holds it), as hc_gemv and hc_mmq do (cuda_gemv.cu) */
extern "C" hn_status hc_quant_rows(const hc_weight *w, const float *x, int na, hc_gemv_scratch *s, int reuse_x,
                                   void *stream, hn_err *err);

/* rms_norm's scale (hc_rms_scale) is in cuda_common.cuh, shared with NVRTC's programs */
/* values a thread of a row-norm kernel keeps in registers, and its threads for a row of dim */
#define HC_RN_VPT 4
static inline int hc_rms_threads(int dim) {
    const int nt = ((dim + HC_RN_VPT - 1) / HC_RN_VPT + 31) / 32 * 32;
    return nt < 32 ? 32 : nt > 1024 ? 1024 : nt;
}

/* ---- programmatic dependent launch (sm_90) ----
 * Every kernel of a step is launched by hc_launch and starts with
 * HC_PDL_ENTER: with hc_pdl on, a kernel may be scheduled while the one
 * before it on the stream still runs (its blocks start as the other's
 * finish, and its launch is off the critical path); griddepcontrol.wait
 * holds each thread until the previous grid has completed and its writes
 * are visible, so nothing a kernel reads or writes is touched before then,
 * and the order of the step is that of the stream (a kernel's results do
 * not change: tests/test_model.c compares the bits with HONE_CUDA_PDL=0).
 * launch_dependents right after the wait lets the next kernel be launched
 * as soon as this one runs. Without the attribute (hc_pdl off, or a kernel
 * launched with <<< >>>) both are no-ops. A kernel must never be launched
 * through hc_launch without HC_PDL_ENTER at its top. */
#ifdef __CUDACC__
/* HC_PDL_ENTER itself is in cuda_common.cuh (NVRTC's programs use it too) */

/* whether hc_launch asks for programmatic serialization (cuda_dev.cu: set
 * when a backend is made, from HONE_CUDA_PDL; on by default on sm_90+) */
extern int hc_pdl;

template <typename... P, typename... A>
static inline void hc_launch(void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, A... a) {
    if (!hc_pdl) {
        k<<<grid, block, smem, s>>>(a...);
        return;
    }
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t c = {};
    c.gridDim = grid;
    c.blockDim = block;
    c.dynamicSmemBytes = smem;
    c.stream = s;
    c.attrs = at;
    c.numAttrs = 1;
    (void)cudaLaunchKernelEx(&c, k, a...); /* its error is the last error, read by HC_LAUNCHED */
}
#endif


#endif
