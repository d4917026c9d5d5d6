/* cuda_common.cuh: device code shared by the ahead-of-time kernels (nvcc)
 * and NVRTC's programs (the files of rtc/, which get this file embedded under its
 * name: cuda_rtc.h). It includes nothing and uses only what both compilers
 * know, so that a kernel specialised at run time computes what the
 * ahead-of-time kernel it replaces computes, bit for bit. */
#ifndef HN_CUDA_COMMON_CUH
#define HN_CUDA_COMMON_CUH

#ifdef __CUDACC__ /* nvcc and NVRTC both define it */

/* the start of every kernel launched with programmatic serialization
 * (cuda_int.cuh, hc_launch: why, and what it guarantees) */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define HC_PDL_ENTER() asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory")
#else
#define HC_PDL_ENTER() ((void)0)
#endif

/* rms_norm's scale 1 / sqrt(mean + eps) of a row from each thread's partial
 * sum of float squares in double (llama.cpp's arithmetic): warp sums, then
 * warp 0 sums those by shuffles (no serial loop over 32 entries); nt threads
 * (a multiple of 32; nt == 32: the warp alone, sh unused); every thread gets
 * it. Shared by every kernel that norms a row (k_rms_norm, the fused
 * norm+quantize and q/k norm+rope kernels, rtc/rms_norm.cu), so their bits
 * stay the same. */
static __device__ __forceinline__ float hc_rms_scale(double ss, int nt, int dim, float eps, double *sh) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (nt > 32) {
        const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
        if (lane == 0) sh[warp] = ss;
        __syncthreads();
        if (warp == 0) {
            ss = lane < nt / 32 ? sh[lane] : 0.0;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
            if (lane == 0) sh[0] = ss;
        }
        __syncthreads();
        ss = sh[0];
    }
    const float mean = (float)(ss / dim);
    return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
}

#endif

#endif
