/* rms_norm.cu (NVRTC; cuda_rtc.h): cuda_kern.cu's k_rms_norm with the row
 * length baked in. Defines: HCR_DIM, the row length; HCR_NT, the block's
 * threads, which must be hc_rms_threads(HCR_DIM) (the ahead-of-time
 * kernel's); HCR_W, 1 to scale by a weight, 0 without one.
 *
 * The same arithmetic in the same order as k_rms_norm, so the same bits:
 * thread t squares the values t, t + NT, t + 2 NT, ... of its row in that
 * order (float products, explicitly rounded) into a double sum, the block
 * sums those in hc_rms_scale (shared with k_rms_norm), and each value is
 * scaled as there. The difference is only that all of a thread's values
 * stay in registers (k_rms_norm keeps 4 and reads the rest of a row wider
 * than 4 NT again after the sum), and no bounds are tested where the shape
 * says none are needed. k_rms_norm adds a 0.0 for each of its first 4 slots
 * past the row's end; so does this kernel for its last slot: a no-op on a
 * sum of squares either way. */
#include "cuda_common.cuh"

#if !defined(HCR_DIM) || !defined(HCR_NT) || !defined(HCR_W)
#error "rms_norm.cu needs HCR_DIM, HCR_NT and HCR_W"
#endif
#if HCR_NT % 32 || HCR_NT < 32 || HCR_NT > 1024 || HCR_DIM < 1
#error "rms_norm.cu: bad HCR_NT or HCR_DIM"
#endif

#define VPT ((HCR_DIM + HCR_NT - 1) / HCR_NT)

extern "C" __global__ void __launch_bounds__(HCR_NT) hcr_rms_norm(const float *x, const float *w, float eps, float *y) {
    HC_PDL_ENTER();
    __shared__ double sh[32];
    const float *xr = x + (long long)blockIdx.x * HCR_DIM;
    float *yr = y + (long long)blockIdx.x * HCR_DIM;
    double ss = 0.0;
    float v[VPT];
#pragma unroll
    for (int j = 0; j < VPT; j++) {
        const int i = threadIdx.x + j * HCR_NT;
        v[j] = (HCR_DIM % HCR_NT == 0 || i < HCR_DIM) ? xr[i] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < VPT; j++) ss += (double)__fmul_rn(v[j], v[j]);
    const float scale = hc_rms_scale(ss, HCR_NT, HCR_DIM, eps, sh);
#pragma unroll
    for (int j = 0; j < VPT; j++) {
        const int i = threadIdx.x + j * HCR_NT;
        if (HCR_DIM % HCR_NT == 0 || i < HCR_DIM) {
            const float u = __fmul_rn(v[j], scale);
            yr[i] = HCR_W ? __fmul_rn(u, w[i]) : u;
        }
    }
}
