/* test_cuda_rtc_gpu: the NVRTC-specialised rms_norm (backend/cuda/
 * rtc/rms_norm.cu, cuda_rtc.h) on the device: for row lengths from 1 to
 * 16384 (one warp, several, the 1024-thread rows that k_rms_norm reads
 * twice, lengths that are not a multiple of the block), with and without a
 * weight, on random rows of several magnitudes, its output equals the
 * ahead-of-time k_rms_norm's bit for bit. Each run is its own process
 * (fork before any CUDA call) over a fresh cache directory: the first
 * compiles every specialisation (misses, no hits), the second finds them
 * all in the cache (hits, no misses) and gives the same bits again. Skips
 * (passing) without a CUDA build, a device or libnvrtc. */
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/cuda/cuda.h"
#include "backend/cuda/cuda_rtc.h"
#include "test.h"

#ifndef HN_HAVE_CUDA
int main(void) {
    printf("SKIP: built without CUDA\n");
    TEST_DONE();
}
#else

/* removes the test's temporary directory and what it holds */
static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    chmod(path, 0755);
    return remove(path);
}
static void rm_tree(const char *dir) { nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

static const int dims[] = {1, 31, 32, 100, 128, 896, 2048, 4096, 4100, 5120, 8192, 12288, 16384};
#define N_DIMS ((int)(sizeof dims / sizeof *dims))
#define ROWS 5
#define SKIP_NO_GPU 77
#define SKIP_NO_NVRTC 78

/* one process's run: every (dim, weight) pair, RTC against AOT; the
 * counts go to the parent through `out` */
static int child(FILE *out) {
    if (hc_device_count() <= 0) return SKIP_NO_GPU;
    hn_err e;
    if (hc_init(0, &e) != HN_OK) return SKIP_NO_GPU;
    if (!hcr_nvrtc_available(NULL)) return SKIP_NO_NVRTC;
    const int max_dim = dims[N_DIMS - 1];
    const size_t n = (size_t)ROWS * (size_t)max_dim;
    float *hx = malloc(n * sizeof *hx), *hw = malloc((size_t)max_dim * sizeof *hw);
    float *ya = malloc(n * sizeof *ya), *yr = malloc(n * sizeof *yr);
    float *dx = NULL, *dw = NULL, *dya = NULL, *dyr = NULL;
    if (!hx || !hw || !ya || !yr || hc_malloc((void **)&dx, n * 4, &e) || hc_malloc((void **)&dw, (size_t)max_dim * 4, &e) ||
        hc_malloc((void **)&dya, n * 4, &e) || hc_malloc((void **)&dyr, n * 4, &e)) {
        fprintf(stderr, "setup: %s\n", e.msg);
        return 2;
    }
    *test_rng_state() = 0x5eed1234abcdull;
    for (int di = 0; di < N_DIMS; di++) {
        const int dim = dims[di];
        /* rows of magnitudes 1, 1e-3, 1e3, 1e-19 (squares near the float range's bottom) and mixed */
        static const float mag[ROWS] = {1.0f, 1e-3f, 1e3f, 1e-19f, 0.0f};
        for (int r = 0; r < ROWS; r++)
            for (int i = 0; i < dim; i++) {
                const float m = mag[r] != 0.0f ? mag[r] : (i % 7 == 0 ? 50.0f : 0.02f);
                hx[(size_t)r * dim + i] = test_gauss() * m;
            }
        for (int i = 0; i < dim; i++) hw[i] = 1.0f + 0.25f * test_gauss();
        CHECK(hc_upload(dx, hx, (size_t)ROWS * dim * 4, &e) == HN_OK);
        CHECK(hc_upload(dw, hw, (size_t)dim * 4, &e) == HN_OK);
        for (int wi = 0; wi < 2; wi++) {
            const float *w = wi ? dw : NULL;
            const float eps = wi ? 1e-6f : 1e-5f;
            CHECK(hc_fill_f32(dya, n, 7.0f, &e) == HN_OK && hc_fill_f32(dyr, n, -7.0f, &e) == HN_OK);
            hn_status sa = hcr_rms_norm_run(0, dx, w, ROWS, dim, eps, dya, NULL, &e);
            CHECKF(sa == HN_OK, "aot dim %d: %s", dim, e.msg);
            hn_status sr = hcr_rms_norm_run(1, dx, w, ROWS, dim, eps, dyr, NULL, &e);
            CHECKF(sr == HN_OK, "rtc dim %d w %d: %s", dim, wi, e.msg);
            CHECK(hc_sync(&e) == HN_OK);
            CHECK(hc_download(ya, dya, (size_t)ROWS * dim * 4, &e) == HN_OK);
            CHECK(hc_download(yr, dyr, (size_t)ROWS * dim * 4, &e) == HN_OK);
            int bad = -1;
            for (size_t i = 0; i < (size_t)ROWS * dim && bad < 0; i++)
                if (memcmp(&ya[i], &yr[i], 4)) bad = (int)i;
            CHECKF(bad < 0, "dim %d w %d: value %d: aot %.9g rtc %.9g", dim, wi, bad, bad < 0 ? 0 : ya[bad],
                   bad < 0 ? 0 : yr[bad]);
            /* the output is not the fill: the kernels ran */
            CHECKF(ya[0] != 7.0f && yr[(size_t)ROWS * dim - 1] != -7.0f, "dim %d: a kernel did not run", dim);
        }
    }
    hc_free(dx), hc_free(dw), hc_free(dya), hc_free(dyr);
    free(hx), free(hw), free(ya), free(yr);
    hcr_stats s;
    hcr_stats_get(&s);
    fprintf(out, "%d %d %ld %ld %ld\n", test_passed_, test_failed_, s.hits, s.misses, s.corrupt);
    return 0;
}

/* runs child() in a new process; its status, and its counts in r[5] */
static int run_child(const char *result, long r[5]) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        FILE *f = fopen(result, "w");
        int st = f ? child(f) : 3;
        if (f) fclose(f);
        _exit(st);
    }
    int ws = 0;
    if (pid < 0 || waitpid(pid, &ws, 0) != pid || !WIFEXITED(ws)) return -1;
    memset(r, 0, 5 * sizeof *r);
    FILE *f = fopen(result, "r");
    if (f) {
        if (fscanf(f, "%ld %ld %ld %ld %ld", &r[0], &r[1], &r[2], &r[3], &r[4]) != 5) r[1] = 1;
        fclose(f);
    }
    return WEXITSTATUS(ws);
}

int main(void) {
    char dir[512], result[600];
    test_tmp_path(dir, sizeof dir, "rtc-gpu-XXXXXX");
    if (!mkdtemp(dir)) {
        printf("cannot make a temporary directory\n");
        return 1;
    }
    setenv("HONE_CACHE_DIR", dir, 1);
    snprintf(result, sizeof result, "%s/result", dir);
    long r[5];
    for (int run = 0; run < 2; run++) {
        const int st = run_child(result, r);
        if (run == 0 && (st == SKIP_NO_GPU || st == SKIP_NO_NVRTC)) {
            printf(st == SKIP_NO_GPU ? "SKIP: no CUDA device\n"
                                     : "SKIP: NVRTC not found: the specialised kernels cannot be made\n");
            rm_tree(dir);
            TEST_DONE();
        }
        CHECKF(st == 0, "run %d: child status %d", run, st);
        test_passed_ += (int)r[0];
        test_failed_ += (int)r[1];
        /* 2 specialisations a row length: with and without a weight */
        if (run == 0) CHECKF(r[3] == 2 * N_DIMS && r[2] == 0, "first run: %ld misses, %ld hits", r[3], r[2]);
        else CHECKF(r[2] == 2 * N_DIMS && r[3] == 0 && r[4] == 0, "second run: %ld hits, %ld misses", r[2], r[3]);
    }
    rm_tree(dir);
    TEST_DONE();
}
#endif
