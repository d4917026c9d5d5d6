/* bench_pack_kq.c: single-thread micro-benchmark of the packed K-quant
 * kernels (pack_kq*.c) against the unpacked gemm kernels they replace.
 * Decode: 1 activation row over a weight larger than the L3 (read from DRAM),
 * in weight GB/s (GGUF bytes, so packed and unpacked compare directly).
 * Prefill: 8 activation rows over a weight that fits in L2, in GMAC/s.
 * HUGE=1 asks for transparent huge pages on both weight copies.
 * Times are thread CPU time, best of a few repeats. Not a test: run via
 * bench/run_pack_kq.sh.
 * usage: bench_pack_kq [type-name ...] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <stddef.h>
#include <sys/mman.h>

#include "backend/cpu/dot.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/pack.h"
#include "core/alloc.h"
#include "quant/quant.h"

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int isa_ok(unsigned isa) {
    const cpu_features *f = cpu_dot_features();
    unsigned have = 0;
    if (f->avx2 && f->fma && f->f16c) {
        have |= CPU_ISA_AVX2;
        if (f->avx512f && f->avx512bw) have |= CPU_ISA_AVX512 | (f->avx512vnni ? CPU_ISA_VNNI512 : 0);
    }
    return (isa & ~have) == 0;
}

/* rows x k weights of type t (about `bytes` of them), na activation rows, reps repeats */
static void bench(qt_type t, int64_t k, int64_t rows, int na, int reps, const char *label) {
    const cpu_dot_kernel *dk = cpu_dot_best(t);
    const cpu_gemm_kernel *gk = cpu_gemm_pick_k(t, na, k);
    size_t rb = qt_row_size(t, k), ab = qt_row_size(QT_Q8_K, k);
    rows -= rows % 8;
    unsigned char *w = hn_pages_alloc(rb * (size_t)rows);
    unsigned char *acts = hn_malloc(ab * 8), *prep = hn_malloc((size_t)k * 4 * 8);
    float *xf = hn_malloc(sizeof(float) * (size_t)k), *s = hn_malloc(sizeof(float) * 64);
    /* distinct rows everywhere (repeated pages could be merged and cached by the host):
     * the quantizer's output for a few, random block bytes with sane f16 scales for the rest */
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < rb * (size_t)rows; i += 8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        memcpy(w + i, &x, rb * (size_t)rows - i < 8 ? rb * (size_t)rows - i : 8);
    }
    size_t bs = qt_traits(t)->type_size, doff = t == QT_Q6_K ? offsetof(block_q6_K, d) : 0;
    for (size_t b = 0; b < rb * (size_t)rows / bs; b++) {
        uint16_t h = qt_f32_to_f16(0.001f * (float)(1 + b % 97));
        memcpy(w + b * bs + doff, &h, 2);
        if (t != QT_Q6_K) memcpy(w + b * bs + 2, &h, 2);
    }
    for (int64_t r = 0; r < 64 && r < rows; r++) {
        for (int64_t i = 0; i < k; i++) xf[i] = (float)(((i + 1) * (r + 3) * 7919) % 201 - 100) / 50.0f;
        qt_traits(t)->from_float(xf, w + (size_t)r * rb, k);
    }
    if (getenv("HUGE")) madvise(w, rb * (size_t)rows, MADV_HUGEPAGE);
    const void *ap[8];
    for (int r = 0; r < 8; r++) {
        for (int64_t i = 0; i < k; i++) xf[i] = (float)(((i + r) * 104729) % 255 - 127) / 64.0f;
        dk->act(xf, acts + (size_t)r * ab, k);
        ap[r] = acts + (size_t)r * ab;
    }
    volatile float sink = 0;
    double gbytes = (double)rb * rows / 1e9, gmac = (double)rows * k * na / 1e9;
    if (gk) {
        const void *vp[8];
        for (int r = 0; r < 8; r++) {
            vp[r] = ap[r];
            if (gk->prep) {
                gk->prep(k, ap[r], prep + (size_t)r * (size_t)k * 4);
                vp[r] = prep + (size_t)r * (size_t)k * 4;
            }
        }
        double best = 1e9;
        for (int rep = 0; rep < reps; rep++) {
            double t0 = cpu_now();
            for (int64_t j = 0; j < rows; j++) gk->fn(k, w + (size_t)j * rb, na, vp, s);
            double dt = cpu_now() - t0;
            if (dt < best) best = dt;
            sink += s[0];
        }
        printf("%-5s %-6s k=%-5lld rows=%-7lld na=%d gemm-%-14s %7.2f GB/s %7.2f GMAC/s\n", qt_traits(t)->name, label,
               (long long)k, (long long)rows, na, gk->isa, gbytes / best, gmac / best);
    }
    const cpu_pack_table *tabs[2] = {&cpu_pack_table_k, NULL};
#if defined(__x86_64__)
    tabs[1] = &cpu_pack_table_k_x86;
#endif
    for (int ti = 1; ti < 2; ti++) {
        if (!tabs[ti]) continue;
        for (int e = 0; e < tabs[ti]->n; e++) {
            const cpu_pack_kernel *p = &tabs[ti]->k[e];
            if (p->wtype != t || !isa_ok(p->isa)) continue;
            size_t gb = p->group_bytes(k);
            int64_t ng = rows / p->rows;
            unsigned char *pw = hn_pages_alloc(gb * (size_t)ng);
            if (getenv("HUGE")) madvise(pw, gb * (size_t)ng, MADV_HUGEPAGE);
            for (int64_t g = 0; g < ng; g++) p->pack(k, w + (size_t)g * p->rows * rb, rb, pw + (size_t)g * gb);
            const void *vp[8];
            for (int r = 0; r < 8; r++) {
                vp[r] = ap[r];
                if (p->prep) {
                    p->prep(k, ap[r], prep + (size_t)r * (size_t)k * 4);
                    vp[r] = prep + (size_t)r * (size_t)k * 4;
                }
            }
            double best = 1e9;
            for (int rep = 0; rep < reps; rep++) {
                double t0 = cpu_now();
                for (int64_t g = 0; g < ng; g++) p->fn(k, pw + (size_t)g * gb, na, vp, s);
                double dt = cpu_now() - t0;
                if (dt < best) best = dt;
                sink += s[0];
            }
            printf("%-5s %-6s k=%-5lld rows=%-7lld na=%d %-19s %7.2f GB/s %7.2f GMAC/s\n", qt_traits(t)->name, label,
                   (long long)k, (long long)rows, na, p->name, gbytes / best, gmac / best);
            hn_pages_free(pw, gb * (size_t)ng);
        }
    }
    (void)sink;
    hn_pages_free(w, rb * (size_t)rows);
    hn_free(acts);
    hn_free(prep);
    hn_free(xf);
    hn_free(s);
}

int main(int argc, char **argv) {
    static const qt_type all[] = {QT_Q4_K, QT_Q6_K, QT_Q5_K};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        qt_type t = all[i];
        int want = argc < 2;
        for (int a = 1; a < argc; a++) want |= !strcmp(argv[a], qt_traits(t)->name);
        if (!want) continue;
        size_t rb4096 = qt_row_size(t, 4096), rb1024 = qt_row_size(t, 1024);
        /* decode from DRAM: ~96 MiB of weights (> L3); Q6_K also at the tied output shape */
        bench(t, 4096, (int64_t)((96u << 20) / rb4096), 1, 3, "dram");
        if (t == QT_Q6_K) bench(t, 1024, 151936, 1, 3, "dram");
        /* prefill tiles in cache: 256 KiB of weights */
        bench(t, 1024, (int64_t)((256u << 10) / rb1024), 8, 20, "cache");
        bench(t, 1024, (int64_t)((256u << 10) / rb1024), 4, 20, "cache");
        bench(t, 1024, (int64_t)((256u << 10) / rb1024), 1, 50, "cache");
    }
    return 0;
}
