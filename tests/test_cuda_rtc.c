/* test_cuda_rtc: NVRTC specialisation and its disk cache (backend/cuda/
 * cuda_rtc.h), without a GPU. Always: the embedded sources, NVRTC's options,
 * the cache key (the same for the same job, different when any part of it
 * changes), and that a process whose HONE_NVRTC_LIB names a missing file
 * reports NVRTC unavailable and hcr_cubin fails cleanly. With libnvrtc
 * (skipped, with the reason, without it): rms_norm.cu compiled to a cubin
 * (an ELF for the CUDA machine), its defines reaching the program (missing
 * or bad ones hit its #error, another row length gives another cubin), and
 * the cache in a temporary directory: miss, hit, a corrupt, a truncated and
 * another key's file taken as misses and rewritten, no cache (""), the
 * default directory (HONE_CACHE_DIR), and a directory that cannot be
 * written (a path through a regular file; a read-only one too when not
 * root) still giving the cubin, said once a process. */
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/cuda/cuda_rtc.h"
#include "core/alloc.h"
#include "test.h"

/* removes the test's temporary directory and what it holds */
static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    chmod(path, 0755);
    return remove(path);
}
static void rm_tree(const char *dir) { nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

static const char *const defs_a[] = {"HCR_DIM=4096", "HCR_NT=1024", "HCR_W=1"};

static hcr_job job_of(const char *const *defs, int n) {
    hcr_job j = {"rms_norm.cu", defs, n, {"NVIDIA H200", 9, 0, 13000}};
    return j;
}

static bool key_of(const hcr_job *j, int nvrtc, const char *src, char *text, size_t cap, char *file) {
    return hcr_key(j, nvrtc, src, text, cap, file);
}

/* the key changes when any part of the job changes, and only then */
static void test_key(void) {
    char t0[3072], f0[32], t1[3072], f1[32];
    const hcr_job base = job_of(defs_a, 3);
    CHECK(key_of(&base, 13000, "0123456789abcdef", t0, sizeof t0, f0));
    CHECK(key_of(&base, 13000, "0123456789abcdef", t1, sizeof t1, f1));
    CHECK(!strcmp(t0, t1) && !strcmp(f0, f1));
    CHECKF(!strncmp(f0, "rtc-", 4) && strlen(f0) == 4 + 16 + 6 && !strcmp(f0 + 20, ".cubin"), "file %s", f0);
    CHECKF(strstr(t0, "-DHCR_DIM=4096") && strstr(t0, "sm_90") && strstr(t0, "NVIDIA H200") && !strchr(t0, '\n'),
           "key %s", t0);

    static const char *const defs_b[] = {"HCR_DIM=4097", "HCR_NT=1024", "HCR_W=1"};
    static const char *const defs_c[] = {"HCR_NT=1024", "HCR_DIM=4096", "HCR_W=1"};
    static const char *const defs_d[] = {"HCR_DIM=4096", "HCR_NT=1024", "HCR_W=1", "X"};
    hcr_job v[10];
    int nv_[10], n = 0;
    const char *src[10];
    for (int i = 0; i < 10; i++) v[i] = base, nv_[i] = 13000, src[i] = "0123456789abcdef";
    snprintf(v[n++].target.device, sizeof v[0].target.device, "NVIDIA H100");   /* device name */
    v[n++].target.cc_major = 10;                                                /* compute capability */
    v[n++].target.cc_minor = 1;
    v[n++].target.driver_version = 13010;                                       /* driver */
    nv_[n++] = 12080;                                                           /* NVRTC */
    src[n++] = "0123456789abcdee";                                              /* sources */
    v[n++].program = "other.cu";                                                /* program */
    v[n].defines = defs_b, n++;                                                 /* a define's value */
    v[n].defines = defs_c, n++;                                                 /* their order */
    v[n].defines = defs_d, v[n].n_defines = 4, n++;                             /* one more */
    for (int i = 0; i < n; i++) {
        const bool ok = key_of(&v[i], nv_[i], src[i], t1, sizeof t1, f1);
        CHECKF(ok && strcmp(t0, t1) && strcmp(f0, f1), "variant %d: same key (%s)", i, f1);
    }
    /* what the key cannot hold unambiguously is refused */
    static const char *const bad[] = {"HCR_DIM=1 -DX=2"}, *const bad2[] = {"1X=2"}, *const bad3[] = {"A=|b"};
    hcr_job j = job_of(bad, 1);
    CHECK(!key_of(&j, 13000, "x", t1, sizeof t1, f1));
    j.defines = bad2;
    CHECK(!key_of(&j, 13000, "x", t1, sizeof t1, f1));
    j.defines = bad3;
    CHECK(!key_of(&j, 13000, "x", t1, sizeof t1, f1));
    j = base;
    j.n_defines = HCR_MAX_DEFINES + 1;
    CHECK(!key_of(&j, 13000, "x", t1, sizeof t1, f1));
    CHECK(!key_of(&base, 13000, "x", t1, 40, f1)); /* too small a buffer */

    const char *opts[8];
    char buf[256];
    CHECK(hcr_options(&base, opts, 8, buf, sizeof buf) == 5);
    CHECK(!strcmp(opts[0], "--gpu-architecture=sm_90") && !strcmp(opts[1], "--std=c++17"));
    CHECK(!strcmp(opts[2], "-DHCR_DIM=4096") && !strcmp(opts[4], "-DHCR_W=1"));
    CHECK(hcr_options(&base, opts, 4, buf, sizeof buf) == -1);
    CHECK(hcr_options(&base, opts, 8, buf, 30) == -1);
}

static void test_sources(void) {
    const char *k = hcr_source("rms_norm.cu"), *h = hcr_source("cuda_common.cuh");
    CHECK(k && strstr(k, "hcr_rms_norm") && strstr(k, "#include \"cuda_common.cuh\""));
    CHECK(h && strstr(h, "hc_rms_scale") && strstr(h, "HC_PDL_ENTER"));
    CHECK(!hcr_source("nothing.cu"));
    const char *d = hcr_source_digest();
    CHECK(d && strlen(d) == 16 && !strcmp(d, hcr_source_digest()));
    /* the embedded text is the tree's file, byte for byte (when the tree is here) */
    size_t len = 0;
    char *f = test_slurp("src/backend/cuda/rtc/rms_norm.cu", &len);
    if (f && k) CHECKF(len == strlen(k) && !memcmp(f, k, len), "embedded rms_norm.cu differs from the tree's");
    else printf("note: src/backend/cuda/rtc/rms_norm.cu not readable from here: embedded text not compared\n");
    free(f);
}

/* a process that names a missing libnvrtc has none, and says why */
static void test_absent(void) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("HONE_NVRTC_LIB", "/nonexistent/libnvrtc.so.13", 1);
        const char *why = NULL;
        int bad = 0;
        if (hcr_nvrtc_available(&why) || !why || !strstr(why, "libnvrtc")) bad |= 1;
        if (hcr_nvrtc_version() != 0) bad |= 2;
        hcr_job j = job_of(defs_a, 3);
        uint8_t *c = (uint8_t *)1;
        size_t n = 1;
        hn_err e;
        if (hcr_cubin(&j, "", &c, &n, &e) != HN_ERR_UNSUPPORTED || c || n || !strstr(e.msg, "libnvrtc")) bad |= 4;
        _exit(bad);
    }
    int ws = 0;
    CHECK(pid > 0 && waitpid(pid, &ws, 0) == pid);
    CHECKF(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "absent libnvrtc: child status %d", ws);
}

static bool is_cuda_elf(const uint8_t *b, size_t n) {
    return n > 64 && !memcmp(b, "\x7f" "ELF", 4) && b[18] == 190 && b[19] == 0; /* e_machine EM_CUDA */
}

static bool has_bytes(const uint8_t *b, size_t n, const char *s) {
    const size_t l = strlen(s);
    for (size_t i = 0; i + l <= n; i++)
        if (!memcmp(b + i, s, l)) return true;
    return false;
}

static void test_compile(void) {
    uint8_t *c = NULL, *c2 = NULL;
    size_t n = 0, n2 = 0;
    hn_err e;
    hcr_job j = job_of(defs_a, 3);
    hn_status st = hcr_compile(&j, &c, &n, &e);
    CHECKF(st == HN_OK, "compile: %s", e.msg);
    CHECKF(c && is_cuda_elf(c, n) && has_bytes(c, n, "hcr_rms_norm"), "not a CUDA ELF with the kernel (%zu bytes)", n);
    /* the row length is baked in: another one, another cubin; so is the target */
    static const char *const defs_b[] = {"HCR_DIM=2048", "HCR_NT=512", "HCR_W=1"};
    j.defines = defs_b;
    CHECK(hcr_compile(&j, &c2, &n2, &e) == HN_OK && is_cuda_elf(c2, n2));
    CHECK(c && c2 && (n != n2 || memcmp(c, c2, n)));
    hn_free(c2);
    c2 = NULL;
    j = job_of(defs_a, 3);
    j.target.cc_major = 8;
    CHECK(hcr_compile(&j, &c2, &n2, &e) == HN_OK && is_cuda_elf(c2, n2) && (n != n2 || memcmp(c, c2, n)));
    hn_free(c2);
    c2 = NULL;
    hn_free(c);
    /* the defines reach the program: without them, or with a bad one, its #error */
    j = job_of(defs_a, 2);
    st = hcr_compile(&j, &c, &n, &e);
    CHECKF(st == HN_ERR_INVALID && !c && strstr(e.msg, "needs HCR_DIM"), "no HCR_W: %d %s", st, e.msg);
    static const char *const defs_c[] = {"HCR_DIM=4096", "HCR_NT=1000", "HCR_W=1"};
    j = job_of(defs_c, 3);
    st = hcr_compile(&j, &c, &n, &e);
    CHECKF(st == HN_ERR_INVALID && !c && strstr(e.msg, "bad HCR_NT"), "HCR_NT=1000: %d %s", st, e.msg);
    j = job_of(defs_a, 3);
    j.program = "nothing.cu";
    CHECK(hcr_compile(&j, &c, &n, &e) == HN_ERR_NOT_FOUND && !c);
}

static void delta(const hcr_stats *a, const hcr_stats *b, hcr_stats *d) {
    d->hits = b->hits - a->hits, d->misses = b->misses - a->misses, d->corrupt = b->corrupt - a->corrupt;
    d->compiles = b->compiles - a->compiles, d->unwritable = b->unwritable - a->unwritable;
    d->warnings = b->warnings - a->warnings;
}

/* one hcr_cubin call; what it counted into d; the cubin compared with want (if given) */
static bool get(const hcr_job *j, const char *dir, hcr_stats *d, const uint8_t *want, size_t want_n) {
    hcr_stats s0, s1;
    hcr_stats_get(&s0);
    uint8_t *c = NULL;
    size_t n = 0;
    hn_err e;
    const hn_status st = hcr_cubin(j, dir, &c, &n, &e);
    hcr_stats_get(&s1);
    delta(&s0, &s1, d);
    bool ok = st == HN_OK && c && is_cuda_elf(c, n);
    if (st != HN_OK) fprintf(stderr, "hcr_cubin: %s\n", e.msg);
    if (ok && want) ok = n == want_n && !memcmp(c, want, n);
    hn_free(c);
    return ok;
}

static bool write_bytes(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    const bool ok = fwrite(b, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

static void test_cache(void) {
    char dir[512], path[700], key[3072], file[32];
    test_tmp_path(dir, sizeof dir, "rtc-cache-XXXXXX");
    CHECK(mkdtemp(dir) != NULL);
    const hcr_job j = job_of(defs_a, 3);
    CHECK(hcr_key(&j, hcr_nvrtc_version(), hcr_source_digest(), key, sizeof key, file));
    snprintf(path, sizeof path, "%s/%s", dir, file);
    hcr_stats d;

    /* miss, then hit with the same bytes */
    CHECK(get(&j, dir, &d, NULL, 0));
    CHECKF(d.misses == 1 && d.compiles == 1 && d.hits == 0 && d.corrupt == 0 && d.unwritable == 0, "first call");
    size_t n = 0;
    uint8_t *good = (uint8_t *)test_slurp(path, &n);
    CHECKF(good && n > 100, "no cache file %s", path);
    if (!good) return;
    uint8_t *cub = NULL;
    size_t cub_n = 0;
    hn_err e;
    CHECK(hcr_compile(&j, &cub, &cub_n, &e) == HN_OK);
    CHECK(get(&j, dir, &d, cub, cub_n));
    CHECKF(d.hits == 1 && d.misses == 0 && d.compiles == 0, "second call: hits %ld misses %ld", d.hits, d.misses);

    /* a flipped byte in the cubin, a truncated file, an empty one, another key's file: misses, rewritten */
    for (int k = 0; k < 4; k++) {
        uint8_t *bad = malloc(n + 1);
        memcpy(bad, good, n + 1); /* test_slurp's NUL too */
        size_t bn = n;
        if (k == 0) bad[n - 7] ^= 0x40;
        if (k == 1) bn = n / 2;
        if (k == 2) bn = 0;
        if (k == 3) memcpy(strstr((char *)bad, "HCR_DIM=4096"), "HCR_DIM=4095", 12); /* another key, same size */
        CHECK(write_bytes(path, bad, bn));
        free(bad);
        CHECK(get(&j, dir, &d, cub, cub_n));
        CHECKF(d.corrupt == 1 && d.misses == 1 && d.compiles == 1 && d.hits == 0, "damage %d not a miss", k);
        size_t rn = 0;
        char *re = test_slurp(path, &rn);
        CHECKF(re && rn == n && !memcmp(re, good, n), "damage %d: file not rewritten", k);
        free(re);
        CHECK(get(&j, dir, &d, cub, cub_n) && d.hits == 1);
    }
    /* no temporary files left behind */
    char tmp[800];
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
    CHECK(access(tmp, F_OK) != 0);

    /* "" is no cache: compiled, nothing counted as unwritable */
    CHECK(get(&j, "", &d, cub, cub_n));
    CHECK(d.misses == 1 && d.hits == 0 && d.unwritable == 0 && d.corrupt == 0);

    /* NULL: the tuner's directory (HONE_CACHE_DIR) */
    char def[600], dpath[700];
    snprintf(def, sizeof def, "%s/default", dir);
    setenv("HONE_CACHE_DIR", def, 1);
    CHECK(get(&j, NULL, &d, cub, cub_n) && d.misses == 1);
    snprintf(dpath, sizeof dpath, "%s/%s", def, file);
    CHECKF(access(dpath, R_OK) == 0, "no cache file in HONE_CACHE_DIR (%s)", dpath);
    CHECK(get(&j, NULL, &d, cub, cub_n) && d.hits == 1);

    /* a directory that cannot be written: the cubin all the same, said once a process */
    char notdir[600], under[700];
    snprintf(notdir, sizeof notdir, "%s/plain-file", dir);
    CHECK(write_bytes(notdir, "x", 1));
    hcr_stats s0, s1;
    hcr_stats_get(&s0);
    CHECK(get(&j, notdir, &d, cub, cub_n));
    CHECK(d.misses == 1 && d.compiles == 1 && d.unwritable == 1);
    CHECK(get(&j, notdir, &d, cub, cub_n) && d.unwritable == 1 && d.warnings == 0);
    hcr_stats_get(&s1);
    CHECKF(s1.warnings == 1, "warnings %ld (once a process)", s1.warnings);
    /* HONE_CACHE_DIR that cannot be made */
    snprintf(under, sizeof under, "%s/sub", notdir);
    setenv("HONE_CACHE_DIR", under, 1);
    CHECK(get(&j, NULL, &d, cub, cub_n) && d.unwritable == 1 && d.warnings == 0);
    unsetenv("HONE_CACHE_DIR");
    if (geteuid() != 0) {
        char ro[600], rpath[700];
        snprintf(ro, sizeof ro, "%s/read-only", dir);
        CHECK(mkdir(ro, 0555) == 0);
        CHECK(get(&j, ro, &d, cub, cub_n) && d.unwritable == 1 && d.misses == 1);
        snprintf(rpath, sizeof rpath, "%s/%s", ro, file);
        CHECK(access(rpath, F_OK) != 0);
        chmod(ro, 0755);
    } else {
        printf("note: running as root: the read-only directory case is not tried (a path through a file is)\n");
    }
    hn_free(cub);
    free(good);
    rm_tree(dir);
}

int main(void) {
    test_absent(); /* first: the child must not inherit a loaded libnvrtc */
    test_key();
    test_sources();
    const char *why = NULL;
    if (!hcr_nvrtc_available(&why)) {
        printf("SKIP: NVRTC not found (%s): compilation and the cache not tested\n", why);
        TEST_DONE();
    }
    printf("NVRTC %d.%d\n", hcr_nvrtc_version() / 1000, hcr_nvrtc_version() % 1000 / 10);
    test_compile();
    test_cache();
    TEST_DONE();
}
