/* cuda_rtc_k.cu: the device side of cuda_rtc.h, and the one kernel that is
 * specialised so far: rms_norm with its row length baked in (rtc/rms_norm.cu,
 * used instead of k_rms_norm when HONE_CUDA_RTC=1; written and compiled, NOT
 * yet run on a GPU, hence off by default).
 *
 * A cubin (from hcr_cubin: the disk cache or NVRTC) is loaded with the
 * runtime's library API (cudaLibraryLoadData, cudaLibraryGetKernel: the
 * CUDA 12 context-independent loading, so no driver entry point and no
 * context of our own are needed) and its kernel launched by
 * cudaLaunchKernelExC with hc_launch's attribute, so PDL holds for it too.
 * A specialisation is made at its first use on a device, never while the
 * stream is being captured into a graph (that call takes the ahead-of-time
 * kernel; a later one outside capture makes it): loading a library is not a
 * stream operation. Any failure (no libnvrtc, a compile error, a load or
 * attribute error) marks it failed and the ahead-of-time kernel is used from
 * then on, silently but for one line a process when libnvrtc is missing.
 * Libraries live until the process ends (a few per model). */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "cuda_be_int.cuh"
#include "cuda_rtc.h"
extern "C" {
#include "../../core/alloc.h"
}

/* the widest row specialised: 16 values a thread at 1024 threads */
#define RTC_MAX_DIM 16384
#define RTC_FNS 64
#define RTC_DEVS 16

typedef struct rtc_fn {
    int device, dim, w; /* what it is for */
    bool ok;            /* false: failed, the ahead-of-time kernel for good */
    cudaKernel_t k;
    cudaLibrary_t lib;
    uint8_t *cubin; /* kept while the library lives */
} rtc_fn;

static pthread_mutex_t fn_mu = PTHREAD_MUTEX_INITIALIZER;
static rtc_fn fns[RTC_FNS];
static int n_fns;
static hcr_target targets[RTC_DEVS];
static bool have_target[RTC_DEVS];
static bool said_no_nvrtc;

/* the device's target (fn_mu held) */
static bool target_of(int dev, hcr_target *t) {
    if (dev < 0 || dev >= RTC_DEVS) return false;
    if (!have_target[dev]) {
        cudaDeviceProp p;
        int drv = 0;
        if (cudaGetDeviceProperties(&p, dev) != cudaSuccess || cudaDriverGetVersion(&drv) != cudaSuccess) {
            (void)cudaGetLastError();
            return false;
        }
        memset(&targets[dev], 0, sizeof targets[dev]);
        snprintf(targets[dev].device, sizeof targets[dev].device, "%s", p.name);
        targets[dev].cc_major = p.major;
        targets[dev].cc_minor = p.minor;
        targets[dev].driver_version = drv;
        have_target[dev] = true;
    }
    *t = targets[dev];
    return true;
}

/* compiles (or takes from the cache) and loads rms_norm for (dim, w) on dev; fn_mu held */
static void rms_make(rtc_fn *f, int dev, int dim, int w, char *why, size_t cap) {
    memset(f, 0, sizeof *f);
    f->device = dev, f->dim = dim, f->w = w;
    const char *nw = NULL;
    if (!hcr_nvrtc_available(&nw)) {
        if (!said_no_nvrtc) fprintf(stderr, "hone: HONE_CUDA_RTC=1, but %s: the built-in kernels are used\n", nw);
        said_no_nvrtc = true;
        snprintf(why, cap, "%s", nw);
        return;
    }
    char d0[32], d1[32], d2[32];
    const int nt = hc_rms_threads(dim);
    snprintf(d0, sizeof d0, "HCR_DIM=%d", dim);
    snprintf(d1, sizeof d1, "HCR_NT=%d", nt);
    snprintf(d2, sizeof d2, "HCR_W=%d", w);
    const char *defs[3] = {d0, d1, d2};
    hcr_job job = {"rms_norm.cu", defs, 3, {}};
    if (!target_of(dev, &job.target)) {
        snprintf(why, cap, "cannot read device %d's properties", dev);
        return;
    }
    size_t size = 0;
    hn_err e;
    if (hcr_cubin(&job, NULL, &f->cubin, &size, &e) != HN_OK) {
        snprintf(why, cap, "%s", e.msg);
        return;
    }
    cudaError_t ce = cudaLibraryLoadData(&f->lib, f->cubin, NULL, NULL, 0, NULL, NULL, 0);
    if (ce == cudaSuccess) ce = cudaLibraryGetKernel(&f->k, f->lib, "hcr_rms_norm");
    cudaFuncAttributes a;
    if (ce == cudaSuccess) ce = cudaFuncGetAttributes(&a, (const void *)f->k); /* loads it on this device */
    if (ce == cudaSuccess && a.maxThreadsPerBlock < nt) ce = cudaErrorInvalidConfiguration;
    if (ce != cudaSuccess) {
        (void)cudaGetLastError(); /* the backend reads the last error after this op: not ours to leave */
        snprintf(why, cap, "loading the cubin: %s", cudaGetErrorString(ce));
        if (f->lib) (void)cudaLibraryUnload(f->lib);
        (void)cudaGetLastError();
        hn_free(f->cubin);
        f->cubin = NULL;
        f->lib = NULL;
        return;
    }
    f->ok = true;
}

/* rms_norm's specialised kernel for (dim, w) on the current device, NULL (why) when there is none */
static cudaKernel_t rms_kernel(cudaStream_t s, int dim, int w, char *why, size_t cap) {
    *why = 0;
    if (dim < 1 || dim > RTC_MAX_DIM) {
        snprintf(why, cap, "rows of %d are not specialised (1..%d)", dim, RTC_MAX_DIM);
        return NULL;
    }
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(why, cap, "no current device");
        return NULL;
    }
    cudaKernel_t k = NULL;
    pthread_mutex_lock(&fn_mu);
    int i = 0;
    while (i < n_fns && !(fns[i].device == dev && fns[i].dim == dim && fns[i].w == w)) i++;
    if (i < n_fns) {
        if (fns[i].ok) k = fns[i].k;
        else snprintf(why, cap, "its specialisation failed before");
    } else if (n_fns == RTC_FNS) {
        snprintf(why, cap, "more than %d specialisations", RTC_FNS);
    } else {
        cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        if (cudaStreamIsCapturing(s, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) {
            (void)cudaGetLastError();
            snprintf(why, cap, "the stream is being captured");
        } else {
            rms_make(&fns[n_fns], dev, dim, w, why, cap);
            if (fns[n_fns].ok) k = fns[n_fns].k;
            n_fns++;
        }
    }
    pthread_mutex_unlock(&fn_mu);
    return k;
}

static void rms_launch(cudaKernel_t k, cudaStream_t s, const float *x, const float *w, int n, int dim, float eps,
                       float *y) {
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t c = {};
    c.gridDim = dim3((unsigned)n);
    c.blockDim = dim3((unsigned)hc_rms_threads(dim));
    c.stream = s;
    c.attrs = hc_pdl ? at : NULL;
    c.numAttrs = hc_pdl ? 1 : 0;
    void *args[] = {&x, &w, &eps, &y};
    (void)cudaLaunchKernelExC(&c, (const void *)k, args); /* its error is the last error */
}

bool ck_rms_norm_rtc(cudaStream_t s, const float *x, const float *w, int n, int dim, float eps, float *y) {
    char why[512];
    cudaKernel_t k = rms_kernel(s, dim, w ? 1 : 0, why, sizeof why);
    if (!k) return false;
    rms_launch(k, s, x, w, n, dim, eps, y);
    return true;
}

extern "C" hn_status hcr_rms_norm_run(int rtc, const float *x, const float *w, int n, int dim, float eps, float *y,
                                      void *stream, hn_err *err) {
    cudaStream_t s = (cudaStream_t)stream;
    if (!rtc) {
        HC_TRY(ck_rms_norm(s, x, w, n, dim, eps, y, false), err, "rms_norm (ahead of time)");
        return HN_OK;
    }
    char why[512];
    cudaKernel_t k = rms_kernel(s, dim, w ? 1 : 0, why, sizeof why);
    if (!k) return hn_errf(err, HN_ERR_UNSUPPORTED, "rms_norm (nvrtc): %s", why);
    if (n > 0) rms_launch(k, s, x, w, n, dim, eps, y);
    HC_LAUNCHED(err, "rms_norm (nvrtc)");
    return HN_OK;
}
