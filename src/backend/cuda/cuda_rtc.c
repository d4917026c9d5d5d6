/* cuda_rtc.c: NVRTC loaded at run time, compilation of the embedded kernel
 * sources to cubins, and their disk cache (cuda_rtc.h). No CUDA headers:
 * NVRTC's few types are declared here, so this builds (and its test runs
 * wherever libnvrtc is found) without the toolkit. */
#include "cuda_rtc.h"

#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "../../core/alloc.h"
#include "../../tune/probe.h"

/* the Makefile's generated table: name, text, name, text, ..., NULL */
extern const char *const hcr_embedded[];

/* ---- NVRTC, by dlopen (nvrtc.h's declarations: an int result, an opaque program) ---- */

typedef int nvrtc_result; /* NVRTC_SUCCESS = 0 */
typedef struct nvrtc_prog_ *nvrtc_prog;

typedef nvrtc_result (*pf_version)(int *, int *);
typedef const char *(*pf_errstr)(nvrtc_result);
typedef nvrtc_result (*pf_create)(nvrtc_prog *, const char *, const char *, int, const char *const *, const char *const *);
typedef nvrtc_result (*pf_destroy)(nvrtc_prog *);
typedef nvrtc_result (*pf_compile)(nvrtc_prog, int, const char *const *);
typedef nvrtc_result (*pf_size)(nvrtc_prog, size_t *);
typedef nvrtc_result (*pf_get)(nvrtc_prog, char *);

typedef struct nvrtc_lib {
    void *h;
    const char *why; /* why it is not loaded */
    int version;
    pf_version version_of;
    pf_errstr errstr;
    pf_create create;
    pf_destroy destroy;
    pf_compile compile;
    pf_size cubin_size, log_size;
    pf_get cubin, log;
} nvrtc_lib;

static nvrtc_lib nv;
static pthread_once_t nv_once = PTHREAD_ONCE_INIT;

static void nv_load(void) {
    const char *env = getenv("HONE_NVRTC_LIB");
    if (env && *env) {
        nv.h = dlopen(env, RTLD_NOW | RTLD_LOCAL); /* the file named, and only it */
    } else {
        static const char *const names[] = {"libnvrtc.so.13", "libnvrtc.so.12"};
        for (size_t i = 0; i < sizeof names / sizeof *names && !nv.h; i++) nv.h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
#ifdef HN_NVRTC_LIB
        if (!nv.h) nv.h = dlopen(HN_NVRTC_LIB, RTLD_NOW | RTLD_LOCAL);
#endif
    }
    if (!nv.h) {
        nv.why = "libnvrtc cannot be loaded (HONE_NVRTC_LIB names the file)";
        return;
    }
    nv.version_of = (pf_version)dlsym(nv.h, "nvrtcVersion");
    nv.errstr = (pf_errstr)dlsym(nv.h, "nvrtcGetErrorString");
    nv.create = (pf_create)dlsym(nv.h, "nvrtcCreateProgram");
    nv.destroy = (pf_destroy)dlsym(nv.h, "nvrtcDestroyProgram");
    nv.compile = (pf_compile)dlsym(nv.h, "nvrtcCompileProgram");
    nv.cubin_size = (pf_size)dlsym(nv.h, "nvrtcGetCUBINSize");
    nv.cubin = (pf_get)dlsym(nv.h, "nvrtcGetCUBIN");
    nv.log_size = (pf_size)dlsym(nv.h, "nvrtcGetProgramLogSize");
    nv.log = (pf_get)dlsym(nv.h, "nvrtcGetProgramLog");
    int major = 0, minor = 0;
    if (!nv.version_of || !nv.errstr || !nv.create || !nv.destroy || !nv.compile || !nv.cubin_size || !nv.cubin ||
        !nv.log_size || !nv.log || nv.version_of(&major, &minor) != 0) {
        dlclose(nv.h);
        nv.h = NULL;
        nv.why = "libnvrtc lacks the calls hone uses (an NVRTC older than 11.1?)";
        return;
    }
    nv.version = major * 1000 + minor * 10;
}

bool hcr_nvrtc_available(const char **why) {
    pthread_once(&nv_once, nv_load);
    if (why) *why = nv.h ? NULL : nv.why;
    return nv.h != NULL;
}

int hcr_nvrtc_version(void) { return hcr_nvrtc_available(NULL) ? nv.version : 0; }

/* ---- the embedded sources ---- */

const char *hcr_source(const char *name) {
    for (int i = 0; hcr_embedded[i]; i += 2)
        if (!strcmp(hcr_embedded[i], name)) return hcr_embedded[i + 1];
    return NULL;
}

static char src_digest[17];
static pthread_once_t digest_once = PTHREAD_ONCE_INIT;

static void digest_make(void) {
    XXH64_state_t *s = XXH64_createState();
    if (!s) return;
    XXH64_reset(s, 0);
    for (int i = 0; hcr_embedded[i]; i += 2) {
        XXH64_update(s, hcr_embedded[i], strlen(hcr_embedded[i]) + 1);
        XXH64_update(s, hcr_embedded[i + 1], strlen(hcr_embedded[i + 1]) + 1);
    }
    snprintf(src_digest, sizeof src_digest, "%016" PRIx64, (uint64_t)XXH64_digest(s));
    XXH64_freeState(s);
}

const char *hcr_source_digest(void) {
    pthread_once(&digest_once, digest_make);
    return src_digest;
}

/* ---- options and the key ---- */

/* a define the key can hold unambiguously: NAME or NAME=VALUE, no blanks or separators */
static bool define_ok(const char *d) {
    if (!d || !(*d == '_' || (*d >= 'A' && *d <= 'Z') || (*d >= 'a' && *d <= 'z'))) return false;
    for (const char *p = d; *p; p++)
        if (*p <= ' ' || *p == '|' || *p == '"' || *p == '\\' || *p == 0x7f) return false;
    return true;
}

int hcr_options(const hcr_job *job, const char **opts, int max_opts, char *buf, size_t cap) {
    if (!job || job->n_defines < 0 || job->n_defines > HCR_MAX_DEFINES || max_opts < job->n_defines + 2) return -1;
    if (job->target.cc_major <= 0 || job->target.cc_minor < 0 || job->target.cc_minor > 9) return -1;
    size_t at = 0;
    int n = 0;
    for (int i = -2; i < job->n_defines; i++) {
        int len;
        if (i == -2) len = snprintf(buf + at, cap - at, "--gpu-architecture=sm_%d%d", job->target.cc_major,
                                    job->target.cc_minor);
        else if (i == -1) len = snprintf(buf + at, cap - at, "--std=c++17");
        else if (!define_ok(job->defines[i])) return -1;
        else len = snprintf(buf + at, cap - at, "-D%s", job->defines[i]);
        if (len < 0 || (size_t)len >= cap - at) return -1;
        opts[n++] = buf + at;
        at += (size_t)len + 1;
    }
    return n;
}

bool hcr_key(const hcr_job *job, int nvrtc_version, const char *src_digest_, char *text, size_t cap, char *file) {
    const char *opts[HCR_MAX_DEFINES + 2];
    char obuf[2048];
    const int n = hcr_options(job, opts, HCR_MAX_DEFINES + 2, obuf, sizeof obuf);
    if (n < 0 || !job->program || !define_ok(job->program)) return false;
    char dev[sizeof job->target.device];
    snprintf(dev, sizeof dev, "%s", job->target.device);
    for (char *p = dev; *p; p++)
        if (*p == '\n' || *p == '\r' || *p == '|') *p = ' ';
    int at = snprintf(text, cap, "hone-rtc 1|program=%s|device=%s|sm_%d%d|driver=%d|nvrtc=%d|src=%s|opts=", job->program,
                      dev, job->target.cc_major, job->target.cc_minor, job->target.driver_version, nvrtc_version,
                      src_digest_ ? src_digest_ : "");
    for (int i = 0; i < n && at >= 0 && (size_t)at < cap; i++)
        at += snprintf(text + at, cap - (size_t)at, "%s%s", i ? " " : "", opts[i]);
    if (at < 0 || (size_t)at >= cap) return false;
    snprintf(file, 32, "rtc-%016" PRIx64 ".cubin", (uint64_t)XXH64(text, (size_t)at, 0));
    return true;
}

/* ---- compilation ---- */

static hn_status nv_fail(hn_err *err, nvrtc_prog *p, nvrtc_result r, const char *prog, const char *what) {
    char log[384] = "";
    size_t ls = 0;
    if (p && *p && nv.log_size(*p, &ls) == 0 && ls > 1) {
        char *full = hn_malloc(ls);
        if (full && nv.log(*p, full) == 0) {
            snprintf(log, sizeof log, "%s", full);
            for (char *c = log; *c; c++)
                if (*c == '\n') *c = ' ';
        }
        hn_free(full);
    }
    if (p && *p) nv.destroy(p);
    return hn_errf(err, HN_ERR_INVALID, "nvrtc: %s %s: %s%s%s", what, prog, nv.errstr(r), *log ? ": " : "", log);
}

hn_status hcr_compile(const hcr_job *job, uint8_t **cubin, size_t *size, hn_err *err) {
    *cubin = NULL;
    *size = 0;
    const char *why;
    if (!hcr_nvrtc_available(&why)) return hn_errf(err, HN_ERR_UNSUPPORTED, "nvrtc: %s", why);
    const char *src = job && job->program ? hcr_source(job->program) : NULL;
    if (!src) return hn_errf(err, HN_ERR_NOT_FOUND, "nvrtc: no embedded program %s", job && job->program ? job->program : "");
    const char *opts[HCR_MAX_DEFINES + 2];
    char obuf[2048];
    const int n_opts = hcr_options(job, opts, HCR_MAX_DEFINES + 2, obuf, sizeof obuf);
    if (n_opts < 0) return hn_errf(err, HN_ERR_INVALID, "nvrtc: bad defines or target for %s", job->program);
    /* every embedded header, by its name */
    const char *hdr[32], *hname[32];
    int n_hdr = 0;
    for (int i = 0; hcr_embedded[i] && n_hdr < 32; i += 2) {
        const size_t l = strlen(hcr_embedded[i]);
        if (l > 4 && !strcmp(hcr_embedded[i] + l - 4, ".cuh")) {
            hname[n_hdr] = hcr_embedded[i];
            hdr[n_hdr++] = hcr_embedded[i + 1];
        }
    }
    nvrtc_prog p = NULL;
    nvrtc_result r = nv.create(&p, src, job->program, n_hdr, hdr, hname);
    if (r) return nv_fail(err, NULL, r, job->program, "creating");
    r = nv.compile(p, n_opts, opts);
    if (r) return nv_fail(err, &p, r, job->program, "compiling");
    size_t sz = 0;
    r = nv.cubin_size(p, &sz);
    if (r || sz < 4) return nv_fail(err, &p, r, job->program, "no cubin from");
    uint8_t *b = hn_malloc(sz);
    if (!b) {
        nv.destroy(&p);
        return hn_errf(err, HN_ERR_NOMEM, "nvrtc: out of memory for a cubin of %zu bytes", sz);
    }
    r = nv.cubin(p, (char *)b);
    if (r) {
        hn_free(b);
        return nv_fail(err, &p, r, job->program, "reading the cubin of");
    }
    nv.destroy(&p);
    *cubin = b;
    *size = sz;
    return HN_OK;
}

/* ---- the cache ---- */

#define CACHE_MAGIC "hone-rtc 1\n"
#define CACHE_MAX ((size_t)64 << 20)

static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static hcr_stats stats;

void hcr_stats_get(hcr_stats *out) {
    pthread_mutex_lock(&cache_mu);
    *out = stats;
    pthread_mutex_unlock(&cache_mu);
}

static bool is_elf(const uint8_t *b, size_t n) { return n >= 4 && !memcmp(b, "\x7f" "ELF", 4); }

/* The cubin of file path if it is a whole, valid file of key; -1 no file,
 * 0 a file that is not (corrupt, truncated, another key), 1 a hit. */
static int cache_read(const char *path, const char *key, uint8_t **cubin, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    struct stat st;
    int res = 0;
    uint8_t *buf = NULL;
    if (fstat(fileno(f), &st) != 0 || st.st_size <= 0 || (size_t)st.st_size > CACHE_MAX) goto done;
    const size_t n = (size_t)st.st_size;
    buf = hn_malloc(n + 1);
    if (!buf || fread(buf, 1, n, f) != n) goto done;
    buf[n] = 0; /* the header is text: strchr stops here at worst */
    const size_t lm = strlen(CACHE_MAGIC), lk = strlen(key);
    if (n < lm + lk + 1 || memcmp(buf, CACHE_MAGIC, lm) || memcmp(buf + lm, key, lk) || buf[lm + lk] != '\n') goto done;
    const char *line = (const char *)buf + lm + lk + 1, *nl = memchr(line, '\n', n - (lm + lk + 1));
    if (!nl) goto done;
    unsigned long long want = 0, sum = 0;
    int used = 0;
    if (sscanf(line, "%llu %16llx%n", &want, &sum, &used) != 2 || line + used != nl) goto done;
    const uint8_t *body = (const uint8_t *)nl + 1;
    const size_t have = n - (size_t)(body - buf);
    if (want != have || XXH64(body, have, 0) != sum || !is_elf(body, have)) goto done;
    *cubin = hn_malloc(have);
    if (!*cubin) goto done;
    memcpy(*cubin, body, have);
    *size = have;
    res = 1;
done:
    hn_free(buf);
    fclose(f);
    return res;
}

static bool cache_write(const char *path, const char *key, const uint8_t *cubin, size_t size) {
    char head[64];
    const size_t lm = strlen(CACHE_MAGIC), lk = strlen(key);
    const int lh = snprintf(head, sizeof head, "%zu %016llx\n", size, (unsigned long long)XXH64(cubin, size, 0));
    const size_t n = lm + lk + 1 + (size_t)lh + size;
    char *buf = hn_malloc(n);
    if (!buf) return false;
    memcpy(buf, CACHE_MAGIC, lm);
    memcpy(buf + lm, key, lk);
    buf[lm + lk] = '\n';
    memcpy(buf + lm + lk + 1, head, (size_t)lh);
    memcpy(buf + lm + lk + 1 + lh, cubin, size);
    const bool ok = tn_write_file(path, buf, n, NULL) == HN_OK;
    hn_free(buf);
    return ok;
}

/* counted, and said once a process (cache_mu held) */
static void no_cache(const char *dir, const char *what) {
    stats.unwritable++;
    if (stats.warnings) return;
    stats.warnings++;
    fprintf(stderr, "hone: the NVRTC kernel cache %s%s%s: the kernels are compiled again at each start\n", what,
            *dir ? " in " : "", dir);
}

hn_status hcr_cubin(const hcr_job *job, const char *cache_dir, uint8_t **cubin, size_t *size, hn_err *err) {
    *cubin = NULL;
    *size = 0;
    const char *why;
    if (!hcr_nvrtc_available(&why)) return hn_errf(err, HN_ERR_UNSUPPORTED, "nvrtc: %s", why);
    char key[3072], file[32];
    if (!hcr_key(job, nv.version, hcr_source_digest(), key, sizeof key, file))
        return hn_errf(err, HN_ERR_INVALID, "nvrtc: bad job (program, defines or target)");
    pthread_mutex_lock(&cache_mu);
    char dir[4096] = "", path[4200] = "";
    bool cache = !(cache_dir && !*cache_dir);
    if (cache && !cache_dir) {
        if (tn_cache_dir(dir, sizeof dir, NULL) != HN_OK) {
            no_cache("", "has no directory");
            cache = false;
        }
    } else if (cache) {
        snprintf(dir, sizeof dir, "%s", cache_dir);
    }
    if (cache && snprintf(path, sizeof path, "%s/%s", dir, file) >= (int)sizeof path) cache = false;
    if (cache) {
        const int got = cache_read(path, key, cubin, size);
        if (got == 1) {
            stats.hits++;
            pthread_mutex_unlock(&cache_mu);
            return HN_OK;
        }
        if (got == 0) stats.corrupt++;
    }
    stats.misses++;
    hn_status st = hcr_compile(job, cubin, size, err);
    if (st == HN_OK) {
        stats.compiles++;
        if (cache && !cache_write(path, key, *cubin, *size)) no_cache(dir, "cannot be written");
    }
    pthread_mutex_unlock(&cache_mu);
    return st;
}
