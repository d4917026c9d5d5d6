/* cuda_wdec.cuh: private to backend/cuda: a weight as the kernels see it
 * (its planes, cuda_gemv.cu's layout) and the scalar decoder of one element
 * of it, shared by the reference gemv (cuda_gemv.cu) and the backend's
 * dequantizing matmul and row kernels (cuda_mm.cu). */
#ifndef HN_CUDA_WDEC_CUH
#define HN_CUDA_WDEC_CUH

#include <stdint.h>

#include <cuda_fp16.h>

#include "cuda.h"

/* what a kernel sees of a weight */
struct wview {
    const uint8_t *p[4];
    int64_t k, n;
};

static __device__ __forceinline__ float h2f(unsigned short h) { return __half2float(__ushort_as_half(h)); }

/* 2^(e-128): the mxfp4 scale (c_fp4 and the kernels' table hold doubled values) */
static __device__ __forceinline__ float e8m0_half(unsigned e) {
    const unsigned bits = e < 2 ? 0x00200000u << e : (e - 1) << 23;
    return __uint_as_float(bits);
}

/* ---- the scalar reference: element e of row `row`, decoded on its own ---- */

static __constant__ int8_t c_iq4[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
static __constant__ int8_t c_fp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static __device__ float kscale_ref(const uint8_t *s, int j, float *m) {
    if (j < 4) {
        *m = (float)(s[j + 4] & 63);
        return (float)(s[j] & 63);
    }
    *m = (float)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    return (float)((s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4));
}

template <int T>
static __device__ float wref(const wview &w, int64_t row, int64_t e) {
    if (T == QT_F16) return h2f(((const unsigned short *)w.p[0])[row * w.k + e]);
    if (T == QT_BF16) return __uint_as_float((unsigned)((const unsigned short *)w.p[0])[row * w.k + e] << 16);
    if (T == QT_Q4_0 || T == QT_Q8_0 || T == QT_MXFP4) {
        const int64_t b = row * (w.k / 32) + e / 32;
        const int j = (int)(e % 32);
        if (T == QT_Q8_0) return h2f(((const unsigned short *)w.p[1])[b]) * (float)((const int8_t *)w.p[0])[b * 32 + j];
        const uint8_t q = w.p[0][b * 16 + j % 16];
        const int nib = j < 16 ? q & 15 : q >> 4;
        if (T == QT_Q4_0) return h2f(((const unsigned short *)w.p[1])[b]) * (float)(nib - 8);
        return e8m0_half(w.p[1][b]) * (float)c_fp4[nib];
    }
    const int64_t b = row * (w.k / 256) + e / 256;
    const int j = (int)(e % 256);
    if (T == QT_Q4_K || T == QT_Q5_K) {
        const int bs = T == QT_Q4_K ? 144 : 176;
        const uint8_t *blk = w.p[0] + b * bs, *qs = blk + (T == QT_Q4_K ? 16 : 48), *qh = blk + 16;
        const float d = h2f(*(const unsigned short *)blk), dmin = h2f(*(const unsigned short *)(blk + 2));
        const int pair = j / 64, within = j % 64, sub = 2 * pair + (within >= 32), l = within % 32;
        const uint8_t q = qs[32 * pair + l];
        int v = within < 32 ? q & 15 : q >> 4;
        if (T == QT_Q5_K) v += ((qh[l] >> sub) & 1) * 16;
        float m;
        const float sc = kscale_ref(blk + 4, sub, &m);
        return d * sc * (float)v - dmin * m;
    }
    if (T == QT_Q6_K) {
        const int hf = j / 128, jj = j % 128, quarter = jj / 32, l = jj % 32;
        const uint8_t ql = w.p[0][b * 128 + 64 * hf + l + 32 * (quarter & 1)];
        const uint8_t qh = w.p[1][b * 64 + 32 * hf + l];
        const int q = ((quarter >= 2 ? ql >> 4 : ql & 15) | (((qh >> (2 * quarter)) & 3) << 4)) - 32;
        const int8_t sc = ((const int8_t *)w.p[2])[b * 16 + 8 * hf + l / 16 + 2 * quarter];
        return h2f(((const unsigned short *)w.p[3])[b]) * (float)sc * (float)q;
    }
    /* iq4_xs */
    const uint8_t *h = w.p[1] + b * 8;
    const int ib = j / 32, jj = j % 32;
    const uint8_t q = w.p[0][b * 128 + 16 * ib + jj % 16];
    const int ls = ((h[4 + ib / 2] >> (4 * (ib % 2))) & 0xf) | (((*(const unsigned short *)(h + 2) >> (2 * ib)) & 3) << 4);
    return h2f(*(const unsigned short *)h) * (float)(ls - 32) * (float)c_iq4[jj < 16 ? q & 15 : q >> 4];
}

/* ---- the CPU's activation rounding, shared by cuda_gemv.cu's quant_x* and
 * cuda_mm.cu's k_round* (dot.c's converters' arithmetic) ---- */

/* an 8-bit code: round half to even, clamped to +-127 */
static __device__ __forceinline__ int act_q8(float v) {
    const int r = __float2int_rn(v);
    return r > 127 ? 127 : r < -127 ? -127 : r;
}

/* x rounded to bf16, to nearest even (quant.c's qt_f32_to_bf16; NaN stays NaN) */
static __device__ __forceinline__ float act_bf16(float v) {
    const unsigned u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) return v;
    return __uint_as_float((u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u);
}

/* the largest |v| of a warp's 32 values, in every lane */
static __device__ __forceinline__ float act_warp_amax(float v) {
    float a = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    return a;
}

/* Q8_K's scale value: of a 256-thread block's values, the one of largest
 * magnitude, in every thread (which of equal magnitudes is taken does not
 * matter: the opposite sign negates codes and scale alike); s_max: 8 floats of
 * shared memory */
static __device__ __forceinline__ float act_block256_max(float v, float *s_max) {
    float m = v;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float u = __shfl_xor_sync(0xffffffffu, m, o);
        if (fabsf(u) > fabsf(m) || (fabsf(u) == fabsf(m) && u > m)) m = u;
    }
    if ((threadIdx.x & 31) == 0) s_max[threadIdx.x >> 5] = m;
    __syncthreads();
    m = s_max[0];
#pragma unroll
    for (int i = 1; i < 8; i++) {
        const float u = s_max[i];
        if (fabsf(u) > fabsf(m) || (fabsf(u) == fabsf(m) && u > m)) m = u;
    }
    return m;
}

#endif
