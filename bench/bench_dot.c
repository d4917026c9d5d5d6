/* bench_dot.c: single-thread GEMV micro-benchmark of every CPU dot kernel.
 *
 * For each weight type and each variant this CPU can run, times y = W x for
 * W of 1024x1024 and 4096x1024 (rows x columns) and prints the weight bytes
 * streamed per second (GB/s), the number that bounds decode speed. Rows are
 * made by the reference quantizer (a few distinct rows tiled over the
 * matrix). Not a test: run it via bench/run_dot.sh.
 * usage: bench_dot [type-name ...]   (default: every type with a kernel) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/dot.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "quant/quant.h"

static const qt_type k_types[] = {QT_F32,  QT_F16,  QT_BF16, QT_Q4_0, QT_Q4_1,   QT_Q5_0,   QT_Q5_1, QT_Q8_0,
                                  QT_Q2_K, QT_Q3_K, QT_Q4_K, QT_Q5_K, QT_Q6_K, QT_IQ4_NL, QT_IQ4_XS, QT_MXFP4};

static void bench_type(qt_type t) {
    enum { COLS = 1024, DISTINCT = 16 };
    static const int64_t rows_list[] = {1024, 4096};
    const qt_type_traits *tr = qt_traits(t);
    size_t rsz = qt_row_size(t, COLS);
    uint64_t rng = 88172645463325252ull;
    float *x = malloc(COLS * sizeof(float)), *row = malloc(COLS * sizeof(float)), *y = malloc(4096 * sizeof(float));
    uint8_t *w = malloc(rsz * 4096), *act = malloc(COLS * 4 + 1024);
    for (int i = 0; i < COLS; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        x[i] = (float)(rng >> 40) / (float)(1 << 24) - 0.5f;
    }
    for (int r = 0; r < DISTINCT; r++) {
        for (int i = 0; i < COLS; i++) {
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            row[i] = (float)(rng >> 40) / (float)(1 << 24) - 0.5f;
        }
        tr->from_float(row, w + r * rsz, COLS);
    }
    for (int r = DISTINCT; r < 4096; r++) memcpy(w + r * rsz, w + (r % DISTINCT) * rsz, rsz);

    const cpu_dot_kernel *v[8];
    int nv = cpu_dot_variants(t, v, 8);
    for (int k = 0; k < nv && k < 8; k++) {
        printf("%-7s %-5s", tr->name, v[k]->isa);
        for (size_t ri = 0; ri < sizeof(rows_list) / sizeof(rows_list[0]); ri++) {
            int64_t rows = rows_list[ri];
            double best = 1e30, t_end = hn_now_s() + 0.25;
            do {
                double t0 = hn_now_s();
                v[k]->act(x, act, COLS);
                for (int64_t r = 0; r < rows; r++) v[k]->dot(COLS, &y[r], w + r * rsz, act);
                double dt = hn_now_s() - t0;
                if (dt < best) best = dt;
            } while (hn_now_s() < t_end);
            printf("  %4lldx%d: %7.2f GB/s %8.1f us", (long long)rows, COLS, rows * rsz / best * 1e-9, best * 1e6);
        }
        printf("\n");
    }
    free(x), free(row), free(y), free(w), free(act);
}

int main(int argc, char **argv) {
    const cpu_features *f = cpu_dot_features();
    printf("cpu: avx2=%d fma=%d f16c=%d avx512f=%d avx512bw=%d avx512vnni=%d avx_vnni=%d neon=%d\n", f->avx2, f->fma,
           f->f16c, f->avx512f, f->avx512bw, f->avx512vnni, f->avx_vnni, f->neon);
    if (argc > 1) {
        for (int i = 1; i < argc; i++) {
            qt_type t;
            if (!qt_from_name(argv[i], &t) || !cpu_dot_ref(t)) {
                fprintf(stderr, "bench_dot: no kernel for type '%s'\n", argv[i]);
                return 1;
            }
            bench_type(t);
        }
        return 0;
    }
    for (size_t i = 0; i < sizeof(k_types) / sizeof(k_types[0]); i++) bench_type(k_types[i]);
    return 0;
}
