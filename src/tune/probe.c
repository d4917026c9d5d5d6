/* probe.c: hardware probe (see probe.h). Linux only for the detailed parts
 * (sysfs, /proc); elsewhere the counts fall back to sysconf and the rest reads
 * as unknown. The bandwidth threads are plain pthreads: the probe runs before
 * any engine pool exists and wants 1..N threads in turn. */
#include "probe.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "../core/alloc.h"
#include "../core/clock.h"
#include "../core/isa.h"

#define PROBE_CACHE_MAGIC "hone-probe 1"

/* ---- small file helpers ---- */

/* Reads up to cap-1 bytes of a small file as a string; false if unreadable. */
static bool read_small(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = 0;
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == ' ')) buf[--n] = 0;
    return n > 0;
}

static long read_long(const char *path, long dflt) {
    char buf[64];
    if (!read_small(path, buf, sizeof buf)) return dflt;
    char *end;
    long v = strtol(buf, &end, 10);
    return end == buf ? dflt : v;
}

/* Counts the CPUs of a sysfs cpulist ("0-7,16-23"); 0 if malformed. */
static int count_cpulist(const char *s) {
    int n = 0;
    while (*s) {
        char *end;
        long a = strtol(s, &end, 10);
        if (end == s || a < 0) return 0;
        long b = a;
        s = end;
        if (*s == '-') {
            b = strtol(s + 1, &end, 10);
            if (end == s + 1 || b < a) return 0;
            s = end;
        }
        n += (int)(b - a + 1);
        if (*s == ',') s++;
        else if (*s && *s != '\n') return 0;
        else break;
    }
    return n;
}

/* "32K" / "1024K" / "32M" -> bytes */
static size_t parse_size(const char *s) {
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s) return 0;
    if (*end == 'K' || *end == 'k') v <<= 10;
    else if (*end == 'M' || *end == 'm') v <<= 20;
    else if (*end == 'G' || *end == 'g') v <<= 30;
    return (size_t)v;
}

/* ---- detection ---- */

static void detect_model(tn_probe *p) {
    snprintf(p->model, sizeof p->model, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512], part[32] = "", impl[32] = "";
    while (fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (!colon) continue;
        char *v = colon + 1;
        while (*v == ' ' || *v == '\t') v++;
        v[strcspn(v, "\n")] = 0;
        if (!strncmp(line, "model name", 10) || !strncmp(line, "Hardware", 8)) {
            snprintf(p->model, sizeof p->model, "%s", v);
            break;
        }
        if (!strncmp(line, "CPU implementer", 15) && !impl[0]) snprintf(impl, sizeof impl, "%s", v);
        if (!strncmp(line, "CPU part", 8) && !part[0]) snprintf(part, sizeof part, "%s", v);
    }
    fclose(f);
    if (!strcmp(p->model, "unknown") && impl[0]) snprintf(p->model, sizeof p->model, "arm %.40s/%.40s", impl, part);
}

static void detect_cores(tn_probe *p) {
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    p->logical = online > 0 ? (int)online : 1;
    p->usable = p->logical;
#ifdef __linux__
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) p->usable = CPU_COUNT(&set);
    /* physical cores: distinct (package, core) pairs among online CPUs */
    enum { MAXC = 1024 };
    static long seen[MAXC];
    int n_seen = 0;
    for (int c = 0; c < MAXC && c < 4 * p->logical + 64; c++) {
        char path[128];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/core_id", c);
        long core = read_long(path, -1);
        if (core < 0) continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/physical_package_id", c);
        long pkg = read_long(path, 0);
        long key = pkg * 1000003L + core;
        bool dup = false;
        for (int i = 0; i < n_seen; i++) dup |= seen[i] == key;
        if (!dup && n_seen < MAXC) seen[n_seen++] = key;
    }
    p->physical = n_seen > 0 ? n_seen : p->logical;
    char buf[256];
    if (read_small("/sys/devices/cpu_core/cpus", buf, sizeof buf)) p->p_cores = count_cpulist(buf);
    if (read_small("/sys/devices/cpu_atom/cpus", buf, sizeof buf)) p->e_cores = count_cpulist(buf);
    long khz = read_long("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq", 0);
    p->max_mhz = khz > 0 ? (int)(khz / 1000) : 0;
#else
    p->physical = p->logical;
#endif
}

static void detect_caches(tn_probe *p) {
    for (int i = 0; i < 16; i++) {
        char path[128], type[32], size[32];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
        long level = read_long(path, -1);
        if (level < 0) break;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", i);
        if (!read_small(path, type, sizeof type)) continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        if (!read_small(path, size, sizeof size)) continue;
        size_t bytes = parse_size(size);
        if (level == 1 && !strcmp(type, "Data")) p->l1d = bytes;
        else if (level == 2 && strcmp(type, "Instruction")) p->l2 = bytes;
        else if (level == 3 && strcmp(type, "Instruction")) p->l3 = bytes;
    }
}

void tn_probe_detect(tn_probe *p) {
    memset(p, 0, sizeof *p);
#if defined(__x86_64__)
    snprintf(p->arch, sizeof p->arch, "x86_64");
#elif defined(__aarch64__)
    snprintf(p->arch, sizeof p->arch, "aarch64");
#else
    snprintf(p->arch, sizeof p->arch, "other");
#endif
    detect_model(p);
    detect_cores(p);
    detect_caches(p);
    p->isa = hn_isa();
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    if (pages > 0 && psz > 0) p->mem_bytes = (uint64_t)pages * (uint64_t)psz;

    char key[512];
    int n = snprintf(key, sizeof key, "%s|%s|isa=%" PRIx32 "|%d/%d/%d/%d/%d|%zu/%zu/%zu", p->model, p->arch, p->isa,
                     p->logical, p->usable, p->physical, p->p_cores, p->e_cores, p->l1d, p->l2, p->l3);
    if (n < 0) n = 0;
    if ((size_t)n >= sizeof key) n = (int)sizeof key - 1;
    snprintf(p->fingerprint, sizeof p->fingerprint, "%016" PRIx64, (uint64_t)XXH64(key, (size_t)n, 0));
}

const char *tn_probe_isa_str(uint32_t isa, char *buf, size_t cap) {
    size_t at = 0;
    if (cap) buf[0] = 0;
    for (int i = 0; i < HN_ISA_COUNT; i++) {
        if (!(isa & (1u << i))) continue;
        size_t n = strlen(hn_isa_name(i)) + (at ? 1 : 0);
        if (at + n >= cap) break;
        snprintf(buf + at, cap - at, "%s%s", at ? " " : "", hn_isa_name(i));
        at += n;
    }
    return buf;
}

double tn_probe_read_bw(const tn_probe *p, int threads) {
    double bw = 0;
    for (int i = 0; i < p->bw_n; i++)
        if (p->bw_threads[i] <= threads) bw = p->bw_read[i];
    return bw * 1e9;
}

/* ---- bandwidth ---- */

typedef struct bw_job {
    unsigned char *src, *dst;
    size_t bytes;
    int nth;
    int mode; /* 0 read, 1 copy */
    volatile uint64_t sink[256];
} bw_job;

typedef struct bw_arg {
    bw_job *job;
    int ith;
} bw_arg;

/* Sums the slice as 64-bit words with four accumulators (no early exit). */
/* 16-byte vectors (SSE2 on x86-64, NEON on arm64): wide loads, four streams */
typedef uint64_t bw_vec __attribute__((vector_size(16)));

static uint64_t read_sweep(const unsigned char *p, size_t n) {
    const bw_vec *w = (const bw_vec *)p;
    size_t nw = n / sizeof(bw_vec);
    bw_vec s0 = {0, 0}, s1 = {0, 0}, s2 = {0, 0}, s3 = {0, 0};
    size_t i = 0;
    for (; i + 8 <= nw; i += 8) {
        s0 += w[i] ^ w[i + 4];
        s1 += w[i + 1] ^ w[i + 5];
        s2 += w[i + 2] ^ w[i + 6];
        s3 += w[i + 3] ^ w[i + 7];
    }
    for (; i < nw; i++) s0 += w[i];
    bw_vec s = s0 + s1 + s2 + s3;
    return s[0] + s[1];
}

static void bw_work(bw_job *j, int ith) {
    size_t per = (j->bytes / (size_t)j->nth) & ~(size_t)4095;
    size_t off = per * (size_t)ith;
    size_t len = ith == j->nth - 1 ? j->bytes - off : per;
    if (j->mode == 0) j->sink[ith] = read_sweep(j->src + off, len);
    else memcpy(j->dst + off, j->src + off, len);
}

static void *bw_thread(void *arg) {
    bw_arg *a = arg;
    bw_work(a->job, a->ith);
    return NULL;
}

/* One sweep of j->mode split over nth threads (started per sweep: their start
 * costs tens of microseconds against a sweep of milliseconds); seconds, or a
 * negative value if a thread could not be started. */
static double bw_sweep(bw_job *j) {
    enum { MAXT = 256 };
    pthread_t th[MAXT];
    bw_arg args[MAXT];
    double t0 = hn_now_s();
    int started = 1;
    for (int i = 1; i < j->nth; i++) {
        args[i].job = j;
        args[i].ith = i;
        if (pthread_create(&th[i], NULL, bw_thread, &args[i]) != 0) break;
        started++;
    }
    if (started == j->nth) bw_work(j, 0);
    for (int i = 1; i < started; i++) pthread_join(th[i], NULL);
    double t = hn_now_s() - t0;
    return started == j->nth ? t : -1.0;
}

/* Fastest of `reps` sweeps after one warm-up sweep, in seconds; negative on
 * failure. The fastest, not the median: on a shared machine the median measures
 * the neighbours, and the roofline is what the memory can deliver. */
static double bw_run(bw_job *j, int nth, int mode, int reps) {
    j->nth = nth > 256 ? 256 : nth;
    j->mode = mode;
    if (bw_sweep(j) < 0) return -1.0;
    double best = -1.0;
    for (int r = 0; r < reps; r++) {
        double t = bw_sweep(j);
        if (t < 0) return -1.0;
        if (best < 0 || t < best) best = t;
    }
    return best;
}

hn_status tn_probe_measure(tn_probe *p, int max_threads, hn_err *err) {
    if (max_threads <= 0) max_threads = p->usable > 0 ? p->usable : 1;
    /* well beyond the last level cache so every sweep streams from memory */
    size_t llc = p->l3 ? p->l3 : p->l2 ? p->l2 : ((size_t)8 << 20);
    size_t bytes = 4 * llc;
    if (bytes < ((size_t)64 << 20)) bytes = (size_t)64 << 20;
    if (bytes > ((size_t)512 << 20)) bytes = (size_t)512 << 20;
    if (p->mem_bytes && bytes > p->mem_bytes / 16) bytes = (size_t)(p->mem_bytes / 16) & ~(size_t)4095;
    size_t half = bytes / 2 & ~(size_t)4095;
    bw_job *j = hn_calloc(1, sizeof *j);
    unsigned char *buf = hn_pages_alloc_huge(bytes);
    if (!j || !buf) {
        hn_free(j);
        if (buf) hn_pages_free(buf, bytes);
        return hn_errf(err, HN_ERR_NOMEM, "probe: cannot allocate %zu bytes for the bandwidth test", bytes);
    }
    /* touch every page with data (an untouched page reads as the shared zero page) */
    for (size_t i = 0; i < bytes; i += 64) buf[i] = (unsigned char)(i >> 6);
    p->bw_n = 0;
    p->bw_buffer = bytes;
    p->bw_cached = false;
    int counts[TN_BW_MAX], nc = 0;
    for (int t = 1; t < max_threads && nc < TN_BW_MAX - 1; t *= 2) counts[nc++] = t;
    counts[nc++] = max_threads;
    for (int i = 0; i < nc; i++) {
        int nth = counts[i];
        j->src = buf;
        j->bytes = bytes;
        double tr = bw_run(j, nth, 0, 7);
        j->src = buf;
        j->dst = buf + half;
        j->bytes = half;
        double tc = bw_run(j, nth, 1, 7);
        if (tr <= 0 || tc <= 0) break; /* could not start threads: keep what we have */
        p->bw_threads[p->bw_n] = nth;
        p->bw_read[p->bw_n] = (double)bytes / tr * 1e-9;
        p->bw_copy[p->bw_n] = 2.0 * (double)half / tc * 1e-9;
        p->bw_n++;
    }
    hn_pages_free(buf, bytes);
    hn_free(j);
    if (p->bw_n == 0) return hn_errf(err, HN_ERR_INTERNAL, "probe: cannot start bandwidth threads");
    return HN_OK;
}

/* ---- cache directory and files ---- */

static hn_status mkdirs(char *path, hn_err *err) {
    for (char *s = path + 1; *s; s++) {
        if (*s != '/') continue;
        *s = 0;
        int rc = mkdir(path, 0755);
        *s = '/';
        if (rc != 0 && errno != EEXIST) return hn_errf(err, HN_ERR_IO, "cannot create %s: %s", path, strerror(errno));
    }
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
        return hn_errf(err, HN_ERR_IO, "cannot create %s: %s", path, strerror(errno));
    return HN_OK;
}

hn_status tn_cache_dir(char *buf, size_t cap, hn_err *err) {
    const char *o = getenv("HONE_CACHE_DIR"), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    int n;
    if (o && *o) n = snprintf(buf, cap, "%s", o);
    else if (x && *x == '/') n = snprintf(buf, cap, "%s/hone", x);
    else if (h && *h) n = snprintf(buf, cap, "%s/.cache/hone", h);
    else return hn_errf(err, HN_ERR_NOT_FOUND, "no cache directory: set HONE_CACHE_DIR or HOME");
    if (n < 0 || (size_t)n >= cap) return hn_errf(err, HN_ERR_RANGE, "cache directory path too long");
    return mkdirs(buf, err);
}

hn_status tn_write_file(const char *path, const char *text, size_t len, hn_err *err) {
    char tmp[4200];
    int n = snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
    if (n < 0 || (size_t)n >= sizeof tmp) return hn_errf(err, HN_ERR_RANGE, "path too long: %s", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return hn_errf(err, HN_ERR_IO, "cannot write %s: %s", tmp, strerror(errno));
    bool ok = fwrite(text, 1, len, f) == len;
    ok &= fflush(f) == 0;
    ok &= fclose(f) == 0;
    if (!ok || rename(tmp, path) != 0) {
        remove(tmp);
        return hn_errf(err, HN_ERR_IO, "cannot write %s", path);
    }
    return HN_OK;
}

/* Parses a probe cache file; false (p untouched) unless the whole file is well formed. */
static bool probe_parse(tn_probe *p, const char *text) {
    char fp[32];
    int at = 0;
    if (sscanf(text, PROBE_CACHE_MAGIC " %20s%n", fp, &at) != 1 || strcmp(fp, p->fingerprint)) return false;
    const char *s = text + at;
    tn_probe q = *p;
    q.bw_n = 0;
    unsigned long long buf_bytes;
    int k = 0;
    if (sscanf(s, " buffer %llu%n", &buf_bytes, &k) != 1) return false;
    s += k;
    q.bw_buffer = (size_t)buf_bytes;
    for (;;) {
        while (*s == ' ' || *s == '\n') s++;
        if (!*s) break;
        int th;
        double r, c;
        if (q.bw_n >= TN_BW_MAX || sscanf(s, "bw %d %lf %lf%n", &th, &r, &c, &k) != 3) return false;
        if (th < 1 || th > 65536 || !(r > 0 && r < 1e6) || !(c > 0 && c < 1e6)) return false;
        if (q.bw_n && th <= q.bw_threads[q.bw_n - 1]) return false;
        s += k;
        if (*s && *s != '\n') return false;
        q.bw_threads[q.bw_n] = th;
        q.bw_read[q.bw_n] = r;
        q.bw_copy[q.bw_n] = c;
        q.bw_n++;
    }
    if (q.bw_n == 0) return false;
    q.bw_cached = true;
    *p = q;
    return true;
}

hn_status tn_probe_get(tn_probe *p, bool force, hn_err *err) {
    tn_probe_detect(p);
    char dir[4096], path[4200];
    bool have_dir = tn_cache_dir(dir, sizeof dir, NULL) == HN_OK;
    if (have_dir) snprintf(path, sizeof path, "%s/probe-%s.txt", dir, p->fingerprint);
    if (have_dir && !force) {
        char text[2048];
        if (read_small(path, text, sizeof text) && probe_parse(p, text)) return HN_OK;
    }
    hn_status st = tn_probe_measure(p, 0, err);
    if (st != HN_OK) return st;
    if (have_dir) {
        char text[2048];
        size_t n = (size_t)snprintf(text, sizeof text, PROBE_CACHE_MAGIC " %s\nbuffer %zu\n", p->fingerprint,
                                    p->bw_buffer);
        for (int i = 0; i < p->bw_n && n < sizeof text; i++)
            n += (size_t)snprintf(text + n, sizeof text - n, "bw %d %.3f %.3f\n", p->bw_threads[i], p->bw_read[i],
                                  p->bw_copy[i]);
        if (n < sizeof text) tn_write_file(path, text, n, NULL); /* a cache we cannot write is only slower */
    }
    return HN_OK;
}
