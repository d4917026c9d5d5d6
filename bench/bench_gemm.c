/* bench_gemm.c: single-thread micro-benchmark of the gemm kernels against the
 * dot kernels, out of cache (weights rotate over 64 MiB) and in cache.
 * Times are thread CPU time, so a loaded machine disturbs them less than wall
 * time. Prints weight GB/s for 1 activation row (decode) and activation-row
 * GMAC/s for 8 rows (prefill tiles). Not a test: run via bench/run_gemm.sh.
 * usage: bench_gemm [type-name ...] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>

#include "backend/cpu/dot.h"
#include "backend/cpu/gemm.h"
#include "core/alloc.h"
#include "quant/quant.h"

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void bench(qt_type t, size_t total, const char *label) {
    const int64_t k = 1024;
    const cpu_dot_kernel *dk = cpu_dot_best(t);
    const cpu_gemm_kernel *vars[8];
    int nv = cpu_gemm_variants(t, vars, 8);
    if (!dk || nv == 0) return;
    size_t rb = qt_row_size(t, k), ab = qt_row_size(dk->act_type, k);
    int64_t rows = (int64_t)(total / rb);
    unsigned char *w = hn_malloc(rb * (size_t)rows + 4096), *acts = hn_malloc(ab * CPU_GEMM_MAX_NA);
    float *xf = hn_malloc(sizeof(float) * (size_t)k);
    unsigned char *prep = hn_malloc((size_t)k * 4 * CPU_GEMM_MAX_NA);
    if (getenv("NOHUGE")) madvise((void *)(((uintptr_t)w + 4095) & ~(uintptr_t)4095), rb * (size_t)rows - 4096, MADV_NOHUGEPAGE);
    for (int64_t i = 0; i < k; i++) xf[i] = (float)((i * 7919) % 201 - 100) / 50.0f;
    qt_traits(t)->from_float(xf, w, k);
    for (int64_t r = 1; r < rows; r++) memcpy(w + (size_t)r * rb, w, rb);
    const void *ap[CPU_GEMM_MAX_NA];
    for (int r = 0; r < CPU_GEMM_MAX_NA; r++) {
        dk->act(xf, acts + (size_t)r * ab, k);
        ap[r] = acts + (size_t)r * ab;
    }
    float s[CPU_GEMM_MAX_NA];
    volatile float sink = 0;
    for (int na = 1; na <= 8; na *= 8) {
        /* dot kernel baseline */
        double best = 1e9;
        for (int rep = 0; rep < 3; rep++) {
            double t0 = cpu_now();
            for (int64_t j = 0; j < rows; j++)
                for (int r = 0; r < na; r++) dk->dot(k, &s[r], w + (size_t)j * rb, ap[r]);
            double dt = cpu_now() - t0;
            if (dt < best) best = dt;
            sink += s[0];
        }
        printf("%-5s %-6s dot-%-6s na=%d  %7.2f GB/s weights  %7.2f GMAC/s\n", qt_traits(t)->name, label, dk->isa, na,
               (double)rb * rows / best / 1e9, (double)rows * k * na / best / 1e9);
        for (int v = 1; v < nv; v++) {
            const void *vp[CPU_GEMM_MAX_NA];
            for (int r = 0; r < CPU_GEMM_MAX_NA; r++) {
                vp[r] = ap[r];
                if (vars[v]->prep) {
                    vars[v]->prep(k, ap[r], prep + (size_t)r * (size_t)k * 4);
                    vp[r] = prep + (size_t)r * (size_t)k * 4;
                }
            }
            best = 1e9;
            for (int rep = 0; rep < 3; rep++) {
                double t0 = cpu_now();
                for (int64_t j = 0; j < rows; j++) vars[v]->fn(k, w + (size_t)j * rb, na, vp, s);
                double dt = cpu_now() - t0;
                if (dt < best) best = dt;
                sink += s[0];
            }
            printf("%-5s %-6s gemm-%-6s na=%d %7.2f GB/s weights  %7.2f GMAC/s\n", qt_traits(t)->name, label, vars[v]->isa,
                   na, (double)rb * rows / best / 1e9, (double)rows * k * na / best / 1e9);
        }
    }
    (void)sink;
    hn_free(w);
    hn_free(acts);
    hn_free(prep);
    hn_free(xf);
}

int main(int argc, char **argv) {
    static const qt_type all[] = {QT_Q4_0, QT_Q8_0, QT_Q4_K, QT_Q6_K, QT_Q5_K, QT_IQ4_XS, QT_F16, QT_BF16};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        bool want = argc < 2;
        for (int a = 1; a < argc; a++) want |= !strcmp(argv[a], qt_traits(all[i])->name);
        if (!want) continue;
        bench(all[i], (size_t)64 << 20, "dram");
        bench(all[i], (size_t)512 << 10, "cache");
    }
    return 0;
}
