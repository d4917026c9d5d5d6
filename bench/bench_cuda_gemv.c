/* bench_cuda_gemv: achieved bandwidth of the CUDA decode matrix-vector
 * kernels (backend/cuda/cuda.h) on model-sized shapes, against the device's
 * measured copy bandwidth.
 *
 * GB/s = the weight's GGUF bytes / time per product (1e9 bytes). Each timed
 * sample enqueues CALLS products back to back (quantizing x and the gemv
 * kernel: what a decode step pays per matmul, launch gaps included, no
 * graph) over copies of the weight that together exceed the L2 several
 * times, so the bytes come from HBM; the median of SAMPLES samples.
 * Weights are random f32 rows quantized with the type's reference quantizer
 * (a band of rows, repeated to fill the matrix), x random.
 * usage: bench_cuda_gemv [type ...]   (default: every supported type;
 * BENCH_GEMV_SHAPE=TEXT runs only the shapes whose name holds TEXT)
 *
 * bench_cuda_gemv mmq [type ...] times the prefill kernel hc_mmq instead
 * (default types q4_0 q8_0 q4_K q5_K q6_K) at 16 to 2048 rows on the
 * three layer shapes: us per product with x quantized in the call and with
 * x already quantized (reuse_x), TOPS = 2 N K rows / time (1e12), GB/s of
 * weight bytes, and (up to 512 rows) hc_gemv 8 rows at a time, what prefill
 * ran before: where mmq starts to pay is HC_MMQ_MIN_ROWS.
 *
 * bench_cuda_gemv mmf [type ...] times prefill's tensor-core kernel hc_mmf
 * the same way (default types q4_0 q8_0 q4_K q5_K q6_K f16), with hc_mmq's
 * time beside it for the integer types. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda.h"
#include "quant/quant.h"

#define CALLS 20
#define SAMPLES 15
#define MAXCOPIES 64

typedef struct shape {
    int64_t k, n;
    const char *what;
} shape;

static const shape shapes[] = {
    {4096, 4096, "attn q/o 4096x4096"},
    {4096, 12288, "ffn gate/up 4096->12288"},
    {12288, 4096, "ffn down 12288->4096"},
    {4096, 151936, "output 4096->151936"},
};
static const int nas[] = {1, 2, 4, 8};
#define NSH (int)(sizeof shapes / sizeof *shapes)
#define NNA (int)(sizeof nas / sizeof *nas)

static uint64_t rng = 0x2545f4914f6cdd1dull;
static float gauss(void) {
    float s = 0;
    for (int i = 0; i < 4; i++) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        s += (float)(rng >> 40) / 16777216.0f;
    }
    return (s - 2.0f) * 1.7320508f;
}

static int cmpf(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static void die(const hn_err *e) {
    fprintf(stderr, "bench_cuda_gemv: %s\n", e->msg);
    exit(1);
}

/* median ms of SAMPLES timed runs of `calls` calls of f (after 2 warm-ups) */
typedef void (*bench_fn)(void *ctx);
static double time_ms(hc_timer *tm, int calls, bench_fn f, void *ctx) {
    hn_err err;
    float ms[SAMPLES];
    for (int it = -2; it < SAMPLES; it++) {
        hc_timer_start(tm, NULL);
        for (int c = 0; c < calls; c++) f(ctx);
        hc_timer_stop(tm, NULL);
        float m;
        if (hc_timer_ms(tm, &m, &err)) die(&err);
        if (it >= 0) ms[it] = m / calls;
    }
    qsort(ms, SAMPLES, sizeof *ms, cmpf);
    return ms[SAMPLES / 2];
}

typedef struct mmq_ctx {
    hc_weight *w;
    float *dx, *dy;
    int na, reuse;
    hc_gemv_scratch *s;
    bool mmf;
} mmq_ctx;

static void run_mmq(void *p) {
    mmq_ctx *c = p;
    hn_err err;
    hc_gemv_params prm = {0, c->reuse, 0, 0};
    if (c->mmf ? hc_mmf(c->w, c->dx, c->na, c->dy, c->s, c->reuse, NULL, &err)
               : hc_mmq(c->w, c->dx, c->na, c->dy, c->s, &prm, NULL, &err))
        die(&err);
}

static void run_gemv8(void *p) {
    mmq_ctx *c = p;
    hn_err err;
    for (int r = 0; r < c->na; r += 8) {
        const int na = c->na - r < 8 ? c->na - r : 8;
        if (hc_gemv(c->w, c->dx + (size_t)r * (size_t)c->w->k, na, c->dy + (size_t)r * (size_t)c->w->n, c->s, NULL, NULL,
                    &err))
            die(&err);
    }
}

static int bench_mmq(int argc, char **argv, bool mmf) {
    hn_err err;
    qt_type types[16];
    int nt = 0;
    for (int i = 0; i < argc && nt < 16; i++)
        if (!qt_from_name(argv[i], &types[nt]) || !(mmf ? hc_mmf_supports(types[nt]) : hc_mmq_supports(types[nt]))) {
            fprintf(stderr, "bench_cuda_gemv: no %s kernel for type '%s'\n", mmf ? "mmf" : "mmq", argv[i]);
            return 2;
        } else nt++;
    if (!nt) {
        static const qt_type def[] = {QT_Q4_0, QT_Q8_0, QT_Q4_K, QT_Q5_K, QT_Q6_K, QT_F16};
        nt = (int)(sizeof def / sizeof *def) - (mmf ? 0 : 1);
        memcpy(types, def, sizeof(qt_type) * (size_t)nt);
    }
    static const int rows[] = {16, 32, 64, 512, 2048};
    const int maxr = 2048;
    hc_timer tm;
    if (hc_timer_init(&tm, &err)) die(&err);
    printf("%s: us per product (x quantized in the call | reuse_x), TOPS = 2 N K rows / time, GB/s of weights\n",
           mmf ? "hc_mmf" : "hc_mmq");
    printf("%-7s %-24s %5s %10s %10s %7s %7s %10s %7s\n", "type", "shape", "rows", "us", "us reuse", "TOPS", "GB/s",
           mmf ? "mmq us" : "gemv8 us", "speedup");
    for (int ti = 0; ti < nt; ti++) {
        const qt_type t = types[ti];
        const qt_type_traits *tr = qt_traits(t);
        for (int si = 0; si < 3; si++) {
            const int64_t k = shapes[si].k, n = shapes[si].n, band = 64;
            const size_t rb = qt_row_size(t, k), bytes = rb * (size_t)n;
            float *wf = malloc(sizeof(float) * (size_t)(band * k)), *hx = malloc(sizeof(float) * (size_t)(maxr * k));
            uint8_t *wq = malloc(bytes);
            if (!wf || !wq || !hx) {
                fprintf(stderr, "bench_cuda_gemv: out of host memory\n");
                return 1;
            }
            for (int64_t i = 0; i < band * k; i++) wf[i] = 0.05f * gauss();
            tr->from_float(wf, wq, band * k);
            for (int64_t j = band; j < n; j += band)
                memcpy(wq + (size_t)j * rb, wq, rb * (size_t)(n - j < band ? n - j : band));
            for (int64_t i = 0; i < maxr * k; i++) hx[i] = gauss();
            hc_weight w;
            float *dx, *dy;
            hc_gemv_scratch s;
            if (hc_weight_upload(&w, t, k, n, wq, &err)) die(&err);
            if (hc_malloc((void **)&dx, sizeof(float) * (size_t)(maxr * k), &err)) die(&err);
            if (hc_malloc((void **)&dy, sizeof(float) * (size_t)(maxr * n), &err)) die(&err);
            if (hc_upload(dx, hx, sizeof(float) * (size_t)(maxr * k), &err)) die(&err);
            if (hc_gemv_scratch_init_rows(&s, k, maxr, &err)) die(&err);
            free(wf);
            free(wq);
            free(hx);
            for (int ri = 0; ri < (int)(sizeof rows / sizeof *rows); ri++) {
                mmq_ctx c = {&w, dx, dy, rows[ri], 0, &s, mmf};
                const double ms = time_ms(&tm, 5, run_mmq, &c);
                c.reuse = 1;
                const double msr = time_ms(&tm, 5, run_mmq, &c);
                c.reuse = 0;
                c.mmf = false;
                const double ms8 = mmf ? (hc_mmq_supports(t) ? time_ms(&tm, 5, run_mmq, &c) : 0)
                                       : rows[ri] <= 512 ? time_ms(&tm, 2, run_gemv8, &c) : 0;
                const double tops = 2.0 * (double)n * (double)k * rows[ri] / (msr * 1e-3) / 1e12;
                printf("%-7s %-24s %5d %10.1f %10.1f %7.1f %7.0f", tr->name, shapes[si].what, rows[ri], ms * 1e3,
                       msr * 1e3, tops, (double)bytes / (msr * 1e-3) / 1e9);
                if (ms8 > 0) printf(" %10.1f %6.1fx", ms8 * 1e3, ms8 / ms);
                printf("\n");
            }
            if (hc_sync(&err)) die(&err);
            hc_gemv_scratch_free(&s);
            hc_free(dx);
            hc_free(dy);
            hc_weight_free(&w);
        }
    }
    hc_timer_free(&tm);
    return 0;
}

int main(int argc, char **argv) {
    hn_err err;
    if (hc_init(0, &err)) die(&err);
    if (argc > 1 && (!strcmp(argv[1], "mmq") || !strcmp(argv[1], "mmf"))) {
        hc_device dev;
        if (hc_probe(&dev, &err)) die(&err);
        printf("device: %s, sm_%d%d, %d SMs, clock %d MHz\n", dev.name, dev.cc_major, dev.cc_minor, dev.sm_count,
               dev.clock_khz / 1000);
        return bench_mmq(argc - 2, argv + 2, !strcmp(argv[1], "mmf"));
    }
    hc_device dev;
    if (hc_probe(&dev, &err)) die(&err);
    double copy = 0, rd = 0;
    if (hc_copy_bandwidth((size_t)2 << 30, 20, &copy, &err)) die(&err);
    if (hc_read_bandwidth((size_t)2 << 30, 20, &rd, &err)) die(&err);
    printf("device: %s, sm_%d%d, %d SMs, %.1f GiB, L2 %d MiB, driver %d\n", dev.name, dev.cc_major, dev.cc_minor,
           dev.sm_count, dev.mem_total / 1073741824.0, dev.l2_bytes >> 20, dev.driver_version);
    printf("copy kernel (2 GiB, read + write): %.0f GB/s; read-only kernel (2 GiB): %.0f GB/s\n\n", copy, rd);

    qt_type types[16];
    int nt = 0;
    if (argc > 1) {
        for (int i = 1; i < argc && nt < 16; i++)
            if (!qt_from_name(argv[i], &types[nt]) || !hc_gemv_supports(types[nt])) {
                fprintf(stderr, "bench_cuda_gemv: no kernel for type '%s'\n", argv[i]);
                return 2;
            } else nt++;
    } else {
        static const qt_type all[] = {QT_Q4_0, QT_Q8_0, QT_Q4_K, QT_Q5_K, QT_Q6_K, QT_IQ4_XS, QT_MXFP4, QT_F16, QT_BF16};
        nt = (int)(sizeof all / sizeof *all);
        memcpy(types, all, sizeof all);
    }

    /* best[type][shape][na] GB/s over rows-per-warp choices, and the choice */
    static double best[16][NSH][NNA];
    static int best_rpw[16][NSH][NNA];
    static double reuse[16][NSH][NNA];
    hc_timer tm;
    if (hc_timer_init(&tm, &err)) die(&err);
    printf("rpw: rows per warp; 'x': x already quantized (reuse_x)\n");
    printf("%-7s %-24s %2s %4s %9s %8s %6s\n", "type", "shape", "na", "rpw", "us/call", "GB/s", "copy%");
    for (int ti = 0; ti < nt; ti++) {
        const qt_type t = types[ti];
        const qt_type_traits *tr = qt_traits(t);
        for (int si = 0; si < NSH; si++) {
            /* BENCH_GEMV_SHAPE=TEXT: only the shapes whose name holds TEXT (for a profiler) */
            const char *only = getenv("BENCH_GEMV_SHAPE");
            if (only && *only && !strstr(shapes[si].what, only)) continue;
            const int64_t k = shapes[si].k, n = shapes[si].n, band = 64;
            const size_t rb = qt_row_size(t, k), bytes = rb * (size_t)n;
            /* a band of quantized random rows, repeated */
            float *wf = malloc(sizeof(float) * (size_t)(band * k));
            uint8_t *wq = malloc(bytes);
            if (!wf || !wq) {
                fprintf(stderr, "bench_cuda_gemv: out of host memory\n");
                return 1;
            }
            for (int64_t i = 0; i < band * k; i++) wf[i] = 0.05f * gauss();
            tr->from_float(wf, wq, band * k);
            for (int64_t j = band; j < n; j += band)
                memcpy(wq + (size_t)j * rb, wq, rb * (size_t)(n - j < band ? n - j : band));
            int copies = (int)(((size_t)dev.l2_bytes * 8 + bytes - 1) / bytes);
            if (copies < 2) copies = 2;
            if (copies > MAXCOPIES) copies = MAXCOPIES;
            hc_weight w[MAXCOPIES];
            for (int c = 0; c < copies; c++)
                if (hc_weight_upload(&w[c], t, k, n, wq, &err)) die(&err);
            free(wf);
            free(wq);
            float *hx = malloc(sizeof(float) * (size_t)(8 * k)), *dx, *dy;
            for (int64_t i = 0; i < 8 * k; i++) hx[i] = gauss();
            if (hc_malloc((void **)&dx, sizeof(float) * (size_t)(8 * k), &err)) die(&err);
            if (hc_malloc((void **)&dy, sizeof(float) * (size_t)(8 * n), &err)) die(&err);
            if (hc_upload(dx, hx, sizeof(float) * (size_t)(8 * k), &err)) die(&err);
            free(hx);
            hc_gemv_scratch s;
            if (hc_gemv_scratch_init(&s, k, &err)) die(&err);
            for (int ni = 0; ni < NNA; ni++) {
                /* rpw 1, 2, 4 with x quantized per call; then (v == 3, integer
                 * types) the best rpw with x quantized once, as weights
                 * sharing an input would */
                for (int v = 0; v < 4; v++) {
                    if (v == 3 && (t == QT_F16 || t == QT_BF16)) break;
                    const int rpw = v < 3 ? 1 << v : best_rpw[ti][si][ni];
                    hc_gemv_params p = {rpw, 0, 0, 0};
                    if (v == 3 && hc_gemv(&w[0], dx, nas[ni], dy, &s, &p, NULL, &err)) die(&err);
                    p.reuse_x = v == 3;
                    float ms[SAMPLES];
                    for (int it = -2; it < SAMPLES; it++) {
                        hc_timer_start(&tm, NULL);
                        for (int c = 0; c < CALLS; c++)
                            if (hc_gemv(&w[c % copies], dx, nas[ni], dy, &s, &p, NULL, &err)) die(&err);
                        hc_timer_stop(&tm, NULL);
                        float m;
                        if (hc_timer_ms(&tm, &m, &err)) die(&err);
                        if (it >= 0) ms[it] = m / CALLS;
                    }
                    qsort(ms, SAMPLES, sizeof *ms, cmpf);
                    const double us = ms[SAMPLES / 2] * 1e3, gbs = (double)bytes / (us * 1e-6) / 1e9;
                    printf("%-7s %-24s %2d %3d%s %9.2f %8.0f %5.0f%%\n", tr->name, shapes[si].what, nas[ni], rpw,
                           v == 3 ? "x" : " ", us, gbs, 100 * gbs / copy);
                    if (v == 3) reuse[ti][si][ni] = gbs;
                    else if (gbs > best[ti][si][ni]) {
                        best[ti][si][ni] = gbs;
                        best_rpw[ti][si][ni] = rpw;
                    }
                }
            }
            if (hc_sync(&err)) die(&err);
            hc_gemv_scratch_free(&s);
            hc_free(dx);
            hc_free(dy);
            for (int c = 0; c < copies; c++) hc_weight_free(&w[c]);
        }
    }
    hc_timer_free(&tm);

    printf("\nbest GB/s over rows per warp [rpw] (%% of the %.0f GB/s copy); 'x=': the same with x quantized once\n", copy);
    printf("%-7s %-13s", "type", "K x N");
    for (int ni = 0; ni < NNA; ni++) printf(" | na=%d %21s", nas[ni], "");
    printf("\n");
    for (int ti = 0; ti < nt; ti++)
        for (int si = 0; si < NSH; si++) {
            printf("%-7s %6lldx%-6lld", qt_name(types[ti]), (long long)shapes[si].k, (long long)shapes[si].n);
            for (int ni = 0; ni < NNA; ni++) {
                printf(" | %5.0f[%d] %3.0f%%", best[ti][si][ni], best_rpw[ti][si][ni], 100 * best[ti][si][ni] / copy);
                if (reuse[ti][si][ni] > 0) printf(" x=%5.0f", reuse[ti][si][ni]);
                else printf("        ");
            }
            printf("\n");
        }
    return 0;
}
