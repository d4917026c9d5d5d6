/* bench_pack.c: single-thread micro-benchmark of the packed kernels (pack.h)
 * against the unpacked gemm kernels, out of cache (weights rotate over 64 MiB)
 * and in cache. Times are thread CPU time. Prints weight GB/s for 1
 * activation row (decode) and activation-row GMAC/s for 8 rows (prefill
 * tiles). Not a test: run via bench/run_pack.sh.
 * usage: bench_pack [type-name ...]
 *        bench_pack model type-name ...   (decode/8-row matmuls through the backend, 2 threads) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/dot.h"
#include "core/pool.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/pack.h"
#include "core/alloc.h"
#include "quant/quant.h"

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void report(qt_type t, const char *label, const char *name, int na, double bytes, double macs, double dt) {
    printf("%-5s %-6s %-22s na=%d %7.2f GB/s weights %7.2f GMAC/s\n", qt_traits(t)->name, label, name, na,
           bytes / dt / 1e9, macs / dt / 1e9);
}

static void bench(qt_type t, size_t total, const char *label) {
    const int64_t k = 1024;
    const cpu_dot_kernel *dk = cpu_dot_best(t);
    const cpu_pack_kernel *pv[16];
    int np = cpu_pack_variants(t, pv, 16);
    if (!dk || np == 0) return;
    size_t rb = qt_row_size(t, k), ab = qt_row_size(dk->act_type, k);
    int64_t rows = (int64_t)(total / rb) / 16 * 16;
    unsigned char *w = hn_pages_alloc(rb * (size_t)rows), *acts = hn_malloc(ab * 8);
    unsigned char *pw = hn_pages_alloc(rb * (size_t)rows * 2), *prep = hn_malloc((size_t)k * 4 * 8);
    float *xf = hn_malloc(sizeof(float) * (size_t)k), s[8 * CPU_PACK_MAX_ROWS];
    for (int64_t i = 0; i < k; i++) xf[i] = (float)((i * 7919) % 201 - 100) / 50.0f;
    qt_traits(t)->from_float(xf, w, k);
    for (int64_t r = 1; r < rows; r++) memcpy(w + (size_t)r * rb, w, rb);
    const void *ap[8], *vp[8];
    for (int r = 0; r < 8; r++) {
        dk->act(xf, acts + (size_t)r * ab, k);
        ap[r] = acts + (size_t)r * ab;
    }
    volatile float sink = 0;
    const cpu_gemm_kernel *gk = cpu_gemm_pick_k(t, 8, k);
    for (int na = 1; na <= 8; na *= 8) {
        double macs = (double)rows * (double)k * na, bytes = (double)rb * (double)rows;
        if (gk) {
            const cpu_gemm_kernel *g = cpu_gemm_pick_k(t, na, k);
            for (int r = 0; r < 8; r++) {
                vp[r] = ap[r];
                if (g->prep) {
                    g->prep(k, ap[r], prep + (size_t)r * (size_t)k * 4);
                    vp[r] = prep + (size_t)r * (size_t)k * 4;
                }
            }
            double best = 1e9;
            for (int rep = 0; rep < 3; rep++) {
                double t0 = cpu_now();
                for (int64_t j = 0; j < rows; j++) g->fn(k, w + (size_t)j * rb, na, vp, s);
                double dt = cpu_now() - t0;
                if (dt < best) best = dt;
                sink += s[0];
            }
            char nm[64];
            snprintf(nm, sizeof nm, "gemm-%s", g->isa);
            report(t, label, nm, na, bytes, macs, best);
        }
        for (int v = 0; v < np && v < 16; v++) {
            const cpu_pack_kernel *p = pv[v];
            if (strstr(p->name, "-ref")) continue;
            size_t gb = p->group_bytes(k);
            int64_t ng = rows / p->rows;
            for (int64_t gi = 0; gi < ng; gi++) p->pack(k, w + (size_t)(gi * p->rows) * rb, rb, pw + (size_t)gi * gb);
            for (int r = 0; r < 8; r++) {
                vp[r] = ap[r];
                if (p->prep) {
                    p->prep(k, ap[r], prep + (size_t)r * (size_t)k * 4);
                    vp[r] = prep + (size_t)r * (size_t)k * 4;
                }
            }
            double best = 1e9;
            for (int rep = 0; rep < 3; rep++) {
                double t0 = cpu_now();
                for (int64_t gi = 0; gi < ng; gi++) p->fn(k, pw + (size_t)gi * gb, na, vp, s);
                double dt = cpu_now() - t0;
                if (dt < best) best = dt;
                sink += s[0];
            }
            report(t, label, p->name, na, bytes, macs, best);
        }
    }
    (void)sink;
    hn_pages_free(w, rb * (size_t)rows);
    hn_pages_free(pw, rb * (size_t)rows * 2);
    hn_free(acts);
    hn_free(prep);
    hn_free(xf);
}

/* Decode through the backend on 2 threads: one "token" = an n-row matmul over
 * model-sized weights (q/k/v/o/gate/up/down of 28 layers at 1024 wide plus a
 * 151936-row output), packed and unpacked alternately; prints the best of reps
 * (the minimum filters out time lost to other processes). */
static double wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void bench_model(qt_type t, int n) {
    static const int64_t shapes[][2] = {{1024, 2048}, {1024, 1024}, {1024, 1024}, {2048, 1024},
                                        {1024, 3072}, {1024, 3072}, {3072, 1024}};
    enum { NL = 28, NS = 7 };
    be_tensor ws[NL * NS + 1];
    size_t total = 0;
    for (int i = 0; i <= NL * NS; i++) {
        int64_t K = i == NL * NS ? 1024 : shapes[i % NS][0], N = i == NL * NS ? 151936 : shapes[i % NS][1];
        size_t rb = qt_row_size(t, K);
        ws[i] = (be_tensor){.type = t, .ne = {K, N, 1}, .row_bytes = rb, .mat_bytes = rb * (size_t)N};
        total += rb * (size_t)N;
    }
    unsigned char *mem = hn_pages_alloc(total);
    float *xf = hn_malloc(sizeof(float) * 3072 * (size_t)n), *y = hn_malloc(sizeof(float) * 151936 * (size_t)n);
    for (int64_t i = 0; i < 3072 * n; i++) xf[i] = (float)((i * 7919) % 201 - 100) / 50.0f;
    size_t off = 0;
    for (int i = 0; i <= NL * NS; i++) {
        ws[i].data = mem + off;
        for (int64_t j = 0; j < ws[i].ne[1]; j++) qt_traits(t)->from_float(xf, mem + off + (size_t)j * ws[i].row_bytes, ws[i].ne[0]);
        off += ws[i].mat_bytes;
    }
    pool *p;
    be_backend *b[2];
    hn_err e;
    if (pool_create(2, &p, &e)) return;
    for (int v = 0; v < 2; v++) {
        if (v) setenv("HONE_NO_PACK", "1", 1);
        be_cpu_create(p, &b[v], &e);
        unsetenv("HONE_NO_PACK");
        be_limits lim = {.max_rows = n, .max_k = 3072, .max_head_dim = 128, .max_group = 2};
        b[v]->ops->reserve(b[v], &lim, &e);
    }
    be_tensor pw[NL * NS + 1];
    memcpy(pw, ws, sizeof ws);
    for (int i = 0; i <= NL * NS; i++) be_cpu_prepare_weight(b[0], &pw[i], 0, &e);
    be_tensor X = be_cpu_host(QT_F32, xf), Y = be_cpu_host(QT_F32, y);
    double best[2] = {1e9, 1e9};
    for (int rep = 0; rep < 10; rep++)
        for (int v = 0; v < 2; v++) {
            double t0 = wall_now();
            for (int i = 0; i <= NL * NS; i++) b[v]->ops->matmul(b[v], v ? &ws[i] : &pw[i], 0, &X, n, &Y);
            b[v]->ops->sync(b[v], &e);
            double dt = wall_now() - t0;
            if (dt < best[v]) best[v] = dt;
        }
    printf("%-5s model-sized matmuls, n=%d, 2 threads: packed %.2f ms (%.1f GB/s), unpacked %.2f ms (%.1f GB/s)\n",
           qt_traits(t)->name, n, best[0] * 1e3, total / best[0] / 1e9, best[1] * 1e3, total / best[1] / 1e9);
    be_free(b[0]);
    be_free(b[1]);
    pool_free(p);
    hn_pages_free(mem, total);
    hn_free(xf);
    hn_free(y);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "model")) {
        for (int a = 2; a < argc; a++)
            for (int t = 0; t < QT_TYPE_COUNT; t++)
                if (qt_traits((qt_type)t) && qt_traits((qt_type)t)->name && !strcmp(argv[a], qt_traits((qt_type)t)->name)) {
                    bench_model((qt_type)t, 1);
                    bench_model((qt_type)t, 8);
                }
        return 0;
    }
    static const qt_type all[] = {QT_Q4_0, QT_Q8_0, QT_Q4_K, QT_Q5_K, QT_Q6_K, QT_IQ4_XS};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        bool want = argc < 2;
        for (int a = 1; a < argc; a++) want |= !strcmp(argv[a], qt_traits(all[i])->name);
        if (!want) continue;
        bench(all[i], (size_t)64 << 20, "dram");
        bench(all[i], (size_t)512 << 10, "cache");
    }
    return 0;
}
