/* cuda_rtc.h: kernels compiled at run time by NVRTC, with a model's shapes
 * baked in as -D defines, and a disk cache of the compiled cubins (DESIGN.md,
 * "backend/cuda", NVRTC).
 *
 * The sources are files of the tree (the .cu files of backend/cuda/rtc/ and the device
 * header they share with the ahead-of-time kernels, cuda_common.cuh), held in
 * the binary as text (the Makefile writes them into a generated C file), so
 * nothing is read from the tree or downloaded at run time.
 *
 * libnvrtc is loaded at run time (dlopen, as libcuda's VMM calls and libnccl
 * are): from HONE_NVRTC_LIB when that is set (then only from there), else
 * from the loader's path (libnvrtc.so.13, .12), else the file the build
 * found. Nothing links against it, so a binary without it runs and the
 * ahead-of-time kernels are used.
 *
 * A compiled cubin is cached in the tuner's cache directory (tn_cache_dir:
 * $HONE_CACHE_DIR, $XDG_CACHE_HOME/hone or ~/.cache/hone) as
 * rtc-<16 hex>.cubin, the hex an XXH64 of the key text: the program's name,
 * the GPU's name and compute capability, the driver's and NVRTC's versions,
 * a digest of every embedded source and NVRTC's options (the defines and the
 * target). The file is "hone-rtc 1\n", the key text, a line "<bytes> <xxh64
 * of the bytes>", then the cubin. A file that is truncated, corrupt or holds
 * another key (a hash collision) is a miss: the kernel is compiled again and
 * the file replaced (a temporary file, then rename). A directory that cannot
 * be made or written is no cache: kernels are compiled at each start, and
 * the process says so once on stderr.
 *
 * This part needs no GPU (cuda_rtc.c, C: built into every binary, tested by
 * tests/test_cuda_rtc.c wherever libnvrtc is found); the device side, which
 * loads a cubin and launches its kernel, is cuda_rtc_k.cu (CUDA builds). */
#ifndef HN_CUDA_RTC_H
#define HN_CUDA_RTC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "../../core/status.h"

#define HCR_MAX_DEFINES 16

/* The GPU a cubin is for. */
typedef struct hcr_target {
    char device[256];        /* the GPU's name */
    int cc_major, cc_minor;  /* compute capability: the cubin is for sm_<major><minor> */
    int driver_version;      /* cudaDriverGetVersion's (13000 = 13.0) */
} hcr_target;

/* One specialisation: an embedded program and its defines ("NAME=VALUE",
 * each passed as -DNAME=VALUE; at most HCR_MAX_DEFINES) for a target. */
typedef struct hcr_job {
    const char *program; /* an embedded source's name, e.g. "rms_norm.cu" */
    const char *const *defines;
    int n_defines;
    hcr_target target;
} hcr_job;

/* Counters of this process's hcr_cubin calls (all of them, every thread). */
typedef struct hcr_stats {
    long hits;       /* a valid cache file was used */
    long misses;     /* no valid cache file: compiled (corrupt ones included) */
    long corrupt;    /* a cache file was there but truncated, corrupt or of another key */
    long compiles;   /* NVRTC compilations that gave a cubin */
    long unwritable; /* a cubin could not be written (or no cache directory) */
    long warnings;   /* lines printed about the cache (at most one a process) */
} hcr_stats;

/* Whether libnvrtc is loaded (it is loaded on the first call, once a
 * process); false with *why (static text) when it cannot be. */
bool hcr_nvrtc_available(const char **why);
/* NVRTC's version as major * 1000 + minor * 10 (13000 = 13.0); 0 without it. */
int hcr_nvrtc_version(void);

/* The embedded source named name ("rms_norm.cu", "cuda_common.cuh"), NULL if
 * there is none. */
const char *hcr_source(const char *name);
/* 16 hex digits of XXH64 over every embedded source's name and text. */
const char *hcr_source_digest(void);

/* NVRTC's options for job into opts (pointers into buf, cap bytes): the
 * target, the language and the defines, in that order; the count, or -1 if
 * job has too many defines or buf is too small. */
int hcr_options(const hcr_job *job, const char **opts, int max_opts, char *buf, size_t cap);

/* The cache key of job compiled by NVRTC nvrtc_version from sources of
 * src_digest: its text into text (cap bytes; one line) and the cache file's
 * name ("rtc-<16 hex>.cubin") into file (at least 32 bytes). false if text
 * is too small or the job is invalid. */
bool hcr_key(const hcr_job *job, int nvrtc_version, const char *src_digest, char *text, size_t cap, char *file);

/* Compiles job with NVRTC into a cubin for its target: *cubin (hn_malloc'd,
 * the caller frees it with hn_free) and *size. HN_ERR_UNSUPPORTED without
 * libnvrtc, HN_ERR_NOT_FOUND for an unknown program, HN_ERR_INVALID when
 * NVRTC fails (its log's start in err). No cache. */
hn_status hcr_compile(const hcr_job *job, uint8_t **cubin, size_t *size, hn_err *err);

/* job's cubin from the cache in cache_dir (NULL: tn_cache_dir(); "": no
 * cache) when a valid file is there, else compiled and written there (a
 * write that fails is not an error: the cubin is still returned). Owner and
 * errors as hcr_compile. Thread-safe (one call at a time in a process). */
hn_status hcr_cubin(const hcr_job *job, const char *cache_dir, uint8_t **cubin, size_t *size, hn_err *err);

/* This process's counters so far. */
void hcr_stats_get(hcr_stats *out);

#ifdef HN_HAVE_CUDA
/* ---- on the device (cuda_rtc_k.cu) ---- */

/* y = rms_norm(x) (* w if w) for n rows of dim (device memory, f32): rtc 0
 * ck_rms_norm's ahead-of-time kernel, rtc 1 the NVRTC kernel with dim baked
 * in (rtc/rms_norm.cu: the same arithmetic, so the same bits), compiled or
 * taken from the cache at its first use on this device. HN_ERR_UNSUPPORTED
 * (why in err) when rtc and that kernel cannot be had; launch errors as
 * hc_fail's. stream: a cudaStream_t (NULL: the default stream). For tests. */
hn_status hcr_rms_norm_run(int rtc, const float *x, const float *w, int n, int dim, float eps, float *y,
                           void *stream, hn_err *err);
#endif

#ifdef __cplusplus
}
#endif

#endif
