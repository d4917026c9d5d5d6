/* cuda_dev.cu: device selection and probe, CUDA errors as hn_status,
 * device memory helpers, and the copy kernel that measures bandwidth. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_int.cuh"

hn_status hc_status_of(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return HN_OK;
    case cudaErrorMemoryAllocation: return HN_ERR_NOMEM;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorDevicesUnavailable: return HN_ERR_UNSUPPORTED;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration:
    case cudaErrorInvalidDevicePointer: return HN_ERR_INVALID;
    default: return HN_ERR_INTERNAL;
    }
}

hn_status hc_fail(hn_err *err, cudaError_t e, const char *what) {
    hn_status s = hc_status_of(e);
    if (s == HN_OK) return HN_OK;
    /* clears a sticky launch error so the next call starts clean (a device
     * fault stays: the context is lost, and every later call says so) */
    (void)cudaGetLastError();
    return hn_errf(err, s, "cuda: %s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

/* programmatic dependent launch for hc_launch (cuda_int.cuh): off until a backend turns it on */
int hc_pdl = 0;

extern "C" {

int hc_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

hn_status hc_init(int index, hn_err *err) {
    int n = 0;
    HC_TRY(cudaGetDeviceCount(&n), err, "no usable CUDA driver or device");
    if (index < 0 || index >= n)
        return hn_errf(err, HN_ERR_UNSUPPORTED, "cuda: no device %d (%d present)", index, n);
    HC_TRY(cudaSetDevice(index), err, "cudaSetDevice");
    HC_TRY(cudaFree(0), err, "creating the device context");
    return HN_OK;
}

hn_status hc_probe(hc_device *out, hn_err *err) {
    memset(out, 0, sizeof *out);
    int dev = 0;
    HC_TRY(cudaGetDevice(&dev), err, "cudaGetDevice");
    cudaDeviceProp p;
    HC_TRY(cudaGetDeviceProperties(&p, dev), err, "cudaGetDeviceProperties");
    out->index = dev;
    snprintf(out->name, sizeof out->name, "%s", p.name);
    out->cc_major = p.major;
    out->cc_minor = p.minor;
    out->sm_count = p.multiProcessorCount;
    out->l2_bytes = p.l2CacheSize;
    out->smem_per_block_optin = (int)p.sharedMemPerBlockOptin;
    /* clock rates left cudaDeviceProp in CUDA 13: attributes instead */
    cudaDeviceGetAttribute(&out->clock_khz, cudaDevAttrClockRate, dev);
    cudaDeviceGetAttribute(&out->mem_clock_khz, cudaDevAttrMemoryClockRate, dev);
    cudaDeviceGetAttribute(&out->mem_bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev);
    (void)cudaGetLastError();
    HC_TRY(cudaMemGetInfo(&out->mem_free, &out->mem_total), err, "cudaMemGetInfo");
    HC_TRY(cudaDriverGetVersion(&out->driver_version), err, "cudaDriverGetVersion");
    HC_TRY(cudaRuntimeGetVersion(&out->runtime_version), err, "cudaRuntimeGetVersion");
    return HN_OK;
}

hn_status hc_malloc(void **p, size_t bytes, hn_err *err) {
    *p = NULL;
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        *p = NULL;
        char what[64];
        snprintf(what, sizeof what, "cudaMalloc(%zu bytes)", bytes);
        return hc_fail(err, e, what);
    }
    return HN_OK;
}

void hc_free(void *p) {
    if (p) cudaFree(p);
}

hn_status hc_upload(void *dst, const void *src, size_t bytes, hn_err *err) {
    HC_TRY(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), err, "copy to the device");
    return HN_OK;
}

hn_status hc_download(void *dst, const void *src, size_t bytes, hn_err *err) {
    HC_TRY(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), err, "copy from the device");
    return HN_OK;
}

hn_status hc_sync(hn_err *err) {
    HC_TRY(cudaDeviceSynchronize(), err, "device work");
    HC_TRY(cudaGetLastError(), err, "device work");
    return HN_OK;
}

} /* extern "C" */

static __global__ void fill_f32(float *p, size_t n, float f) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = f;
}

/* The ceilings the gemv kernels are measured against: 16 bytes per thread
 * per load, 4 independent loads in flight per thread, one resident wave of
 * blocks striding over the buffer (n a multiple of 4 words). */
static __global__ void copy16(const int4 *__restrict__ src, int4 *__restrict__ dst, size_t n) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += 4 * stride) {
        int4 v[4];
#pragma unroll
        for (int j = 0; j < 4; j++)
            if (i + j * stride < n) v[j] = __ldcs(src + i + j * stride);
#pragma unroll
        for (int j = 0; j < 4; j++)
            if (i + j * stride < n) __stcs(dst + i + j * stride, v[j]);
    }
}

/* reads n 16-byte words; one word per thread written, so nothing is dead */
static __global__ void read16(const int4 *__restrict__ src, size_t n, unsigned *__restrict__ out) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    unsigned acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += 4 * stride) {
        int4 v[4];
#pragma unroll
        for (int j = 0; j < 4; j++) v[j] = i + j * stride < n ? __ldcs(src + i + j * stride) : make_int4(0, 0, 0, 0);
#pragma unroll
        for (int j = 0; j < 4; j++) acc ^= (unsigned)(v[j].x ^ v[j].y ^ v[j].z ^ v[j].w);
    }
    out[blockIdx.x * (size_t)blockDim.x + threadIdx.x] = acc;
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

extern "C" {

hn_status hc_fill_f32(float *p, size_t n, float f, hn_err *err) {
    if (!n) return HN_OK;
    size_t blocks = (n + 255) / 256;
    fill_f32<<<(unsigned)(blocks < 4096 ? blocks : 4096), 256>>>(p, n, f);
    HC_LAUNCHED(err, "fill kernel");
    return HN_OK;
}

/* times reps runs of copy16 (read_only false) or read16 over `bytes`; GB/s of bytes moved */
static hn_status bandwidth(size_t bytes, int reps, bool read_only, double *gbps, hn_err *err) {
    *gbps = 0;
    bytes &= ~(size_t)15;
    if (!bytes || reps < 1 || reps > 1000) return hn_errf(err, HN_ERR_INVALID, "cuda: bandwidth: bad size or reps");
    int dev = 0, sms = 0;
    HC_TRY(cudaGetDevice(&dev), err, "cudaGetDevice");
    HC_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), err, "multiprocessor count");
    const unsigned grid = (unsigned)sms * 4, block = 512; /* 2048 threads an SM: one wave */
    void *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    float *ms = (float *)malloc(sizeof(float) * (size_t)reps);
    hn_status st = ms ? HN_OK : hn_errf(err, HN_ERR_NOMEM, "cuda: bandwidth: out of host memory");
    if (!st) st = hc_malloc(&a, bytes, err);
    if (!st) st = hc_malloc(&b, read_only ? (size_t)grid * block * 4 : bytes, err);
    if (!st) {
        cudaError_t e = cudaEventCreate(&e0);
        if (e == cudaSuccess) e = cudaEventCreate(&e1);
        if (e == cudaSuccess) e = cudaMemset(a, 0x5a, bytes);
        const size_t n = bytes / 16;
        for (int i = -2; i < reps && e == cudaSuccess; i++) {
            cudaEventRecord(e0);
            if (read_only) read16<<<grid, block>>>((const int4 *)a, n, (unsigned *)b);
            else copy16<<<grid, block>>>((const int4 *)a, (int4 *)b, n);
            cudaEventRecord(e1);
            e = cudaEventSynchronize(e1);
            if (e == cudaSuccess) e = cudaGetLastError();
            if (e == cudaSuccess && i >= 0) e = cudaEventElapsedTime(&ms[i], e0, e1);
        }
        if (e != cudaSuccess) st = hc_fail(err, e, "bandwidth kernel");
    }
    if (!st) {
        qsort(ms, (size_t)reps, sizeof *ms, cmp_float);
        const float med = ms[reps / 2];
        *gbps = med > 0 ? (read_only ? 1.0 : 2.0) * (double)bytes / (med * 1e-3) / 1e9 : 0;
    }
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    hc_free(a);
    hc_free(b);
    free(ms);
    return st;
}

hn_status hc_copy_bandwidth(size_t bytes, int reps, double *gbps, hn_err *err) {
    return bandwidth(bytes, reps, false, gbps, err);
}

hn_status hc_read_bandwidth(size_t bytes, int reps, double *gbps, hn_err *err) {
    return bandwidth(bytes, reps, true, gbps, err);
}

hn_status hc_timer_init(hc_timer *t, hn_err *err) {
    t->start = t->stop = NULL;
    cudaEvent_t a = NULL, b = NULL;
    HC_TRY(cudaEventCreate(&a), err, "cudaEventCreate");
    cudaError_t e = cudaEventCreate(&b);
    if (e != cudaSuccess) {
        cudaEventDestroy(a);
        return hc_fail(err, e, "cudaEventCreate");
    }
    t->start = a;
    t->stop = b;
    return HN_OK;
}

void hc_timer_free(hc_timer *t) {
    if (t->start) cudaEventDestroy((cudaEvent_t)t->start);
    if (t->stop) cudaEventDestroy((cudaEvent_t)t->stop);
    t->start = t->stop = NULL;
}

void hc_timer_start(hc_timer *t, void *stream) { cudaEventRecord((cudaEvent_t)t->start, (cudaStream_t)stream); }
void hc_timer_stop(hc_timer *t, void *stream) { cudaEventRecord((cudaEvent_t)t->stop, (cudaStream_t)stream); }

hn_status hc_timer_ms(hc_timer *t, float *ms, hn_err *err) {
    *ms = 0;
    HC_TRY(cudaEventSynchronize((cudaEvent_t)t->stop), err, "timed device work");
    HC_TRY(cudaEventElapsedTime(ms, (cudaEvent_t)t->start, (cudaEvent_t)t->stop), err, "cudaEventElapsedTime");
    return HN_OK;
}

} /* extern "C" */
