/* probe.h: what machine are we on? The hardware probe behind the tuner.
 *
 * tn_probe_detect reads what the OS and CPU say: the CPU model, logical and
 * physical cores (performance/efficiency cores where the OS tells them apart:
 * /sys/devices/cpu_core and cpu_atom), the maximum clock (cpufreq), cache
 * sizes per level (sysfs), memory size, and the instruction-set extensions
 * that matter for kernels (core/isa.h's probe, the one the kernels use). From
 * these it makes the device fingerprint: a 64-bit hash (16 hex digits) of
 * model, ISA flags, core counts and cache sizes. Everything the tuner stores
 * on disk is keyed by it, so a different machine (or the same disk image on a
 * new VM size) never reuses another machine's measurements.
 *
 * tn_probe_measure measures memory bandwidth, the number that bounds decode
 * speed: a read-only sweep and a copy over buffers of at least 4x the last
 * level cache (on huge pages, as weights are kept), with 1, 2, 4 ... threads
 * up to the logical core count, the fastest of several repetitions, a few
 * hundred milliseconds in total.
 *
 * tn_probe_get does both, reusing the bandwidth measured by an earlier run when
 * the cache directory holds one for this fingerprint (so a second start is
 * instant). The cache directory is $HONE_CACHE_DIR if set, else
 * $XDG_CACHE_HOME/hone, else ~/.cache/hone. */
#ifndef HN_TN_PROBE_H
#define HN_TN_PROBE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../core/isa.h"
#include "../core/status.h"

#define TN_BW_MAX 8 /* thread counts measured: 1, 2, 4, ... and the logical core count */

typedef struct tn_probe {
    char model[128];      /* "AMD EPYC 9654 96-Core Processor", or "unknown" */
    char arch[16];        /* "x86_64", "aarch64" */
    int logical;          /* online logical CPUs */
    int usable;           /* CPUs this process may run on (affinity) */
    int physical;         /* distinct cores (package, core id); = logical when unknown */
    int p_cores, e_cores; /* logical CPUs of each kind on hybrid CPUs; 0 when the OS does not say */
    int max_mhz;          /* cpufreq maximum of cpu0; 0 when unknown */
    size_t l1d, l2, l3;   /* bytes per cache instance; 0 when unknown */
    uint64_t mem_bytes;   /* physical memory */
    uint32_t isa;         /* HN_ISA_* bits (core/isa.h), only those the OS also enabled */
    char fingerprint[17]; /* 16 lowercase hex digits */

    /* measured (tn_probe_measure / tn_probe_get) */
    int bw_n;                  /* entries below; 0 before measuring */
    int bw_threads[TN_BW_MAX]; /* thread count of each entry, increasing */
    double bw_read[TN_BW_MAX]; /* read-only GB/s (1e9 bytes/s) */
    double bw_copy[TN_BW_MAX]; /* copy GB/s, counting bytes read plus bytes written */
    size_t bw_buffer;          /* bytes per buffer the measurement used */
    bool bw_cached;            /* true when bandwidth came from the disk cache */
} tn_probe;

/* Fills everything but the bandwidth fields from the OS and CPU; never fails
 * on a strange machine (unknown values read 0 or "unknown"). */
void tn_probe_detect(tn_probe *p);

/* Measures bandwidth into p's bw_* fields (p must be detected); HN_ERR_NOMEM
 * if the buffers cannot be allocated. max_threads <= 0 means p->usable. */
hn_status tn_probe_measure(tn_probe *p, int max_threads, hn_err *err);

/* Detects, then loads this fingerprint's bandwidth from the cache directory or
 * (when absent, unreadable, corrupt, or force) measures it and writes it
 * there. Failing to write the cache is not an error. */
hn_status tn_probe_get(tn_probe *p, bool force, hn_err *err);

/* Writes the ISA flag names, space separated ("avx2 fma f16c ..."), into buf;
 * returns buf. */
const char *tn_probe_isa_str(uint32_t isa, char *buf, size_t cap);

/* The read-only bandwidth measured with the largest thread count <= threads,
 * in bytes per second; 0 when not measured. */
double tn_probe_read_bw(const tn_probe *p, int threads);

/* Writes the cache directory path into buf and creates it (and its parents)
 * if needed; HN_ERR_IO when it cannot be made or the path is too long. */
hn_status tn_cache_dir(char *buf, size_t cap, hn_err *err);

/* Replaces path with text atomically (temporary file + rename). */
hn_status tn_write_file(const char *path, const char *text, size_t len, hn_err *err);

#endif
