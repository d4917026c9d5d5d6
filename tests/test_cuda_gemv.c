/* test_cuda_gemv: the CUDA decode matrix-vector kernels (backend/cuda/cuda.h)
 * against the CPU's scalar dequantizer, for every supported type, 1..8
 * activation rows, each rows-per-warp choice and shapes with K not a multiple
 * of 256 (where the type allows) and N not a multiple of the rows a block
 * computes; every configuration the tuner may choose (rows per warp x units
 * in flight x warps a block, 18) gives the built-in choice's bits, so does
 * a cloned weight, and hc_gemv_multi with tuned parameters gives each
 * weight's hc_gemv bits (test_multi); then the prefill kernel hc_mmq against
 * hc_gemv, bit for bit (test_mmq). Skips (passing) without a CUDA build or
 * device.
 *
 * Bounds. The reference kernel (f32 x, f64 sum) must match the CPU's f64
 * product of the dequantized rows to 1e-6 of sum |w x| (float rounding of
 * the decoded weight only). The fast kernels round x as the CPU backend does
 * for the weight type (its own converters: Q8_0 blocks of 32 or Q8_K blocks
 * of 256, bf16 for bf16): they must match the CPU's f64 product with those
 * same rounded activations to 2e-5 of sum |w x^| (float scales and partial
 * sums), and the exact product to within the rounding's worst case (half a
 * code of the block's scale, plus the f16 rounding of a Q8_0 scale). f16
 * uses x as it is: 2e-5 of sum |w x|. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/dot_int.h"
#include "backend/cuda/cuda.h"
#include "quant/quant.h"
#include "test.h"

#ifndef HN_HAVE_CUDA
int main(void) {
    printf("SKIP: built without CUDA\n");
    TEST_DONE();
}
#else

#define MAXR HC_GEMV_MAX_ROWS

typedef struct shape {
    int64_t k, n;
} shape;

static const shape shapes_k[] = {{256, 1}, {1280, 37}, {3072, 45}, {4096, 130}, {11008, 9}};
static const shape shapes_32[] = {{32, 5}, {96, 37}, {1120, 130}, {3072, 45}, {4096, 67}, {4160, 9}};
static const shape shapes_f[] = {{8, 3}, {100, 37}, {1032, 130}, {4096, 67}};

/* the fast kernels' activation rounding, on the host: the CPU backend's own
 * converters (Q8_0 or Q8_K by weight type, bf16 for bf16), dequantized;
 * amaxb[b] is the largest |x| of the scale group of 32-block b */
static void quant_x(qt_type t, const float *x, int64_t k, float *xq, float *amaxb) {
    const hc_act a = hc_gemv_act(t);
    if (a == HC_ACT_BF16) {
        for (int64_t i = 0; i < k; i++) xq[i] = qt_bf16_to_f32(qt_f32_to_bf16(x[i]));
        return;
    }
    if (a == HC_ACT_Q8_0) {
        block_q8_0 *q = malloc(sizeof(block_q8_0) * (size_t)(k / 32));
        cpu_act_q8_0_ref(x, q, k);
        for (int64_t b = 0; b < k / 32; b++) {
            float amax = 0;
            for (int j = 0; j < 32; j++) {
                amax = fmaxf(amax, fabsf(x[b * 32 + j]));
                xq[b * 32 + j] = qt_f16_to_f32(q[b].d) * (float)q[b].qs[j];
            }
            amaxb[b] = amax;
        }
        free(q);
        return;
    }
    block_q8_K *q = malloc(sizeof(block_q8_K) * (size_t)(k / 256));
    cpu_act_q8_K_ref(x, q, k);
    for (int64_t b = 0; b < k / 256; b++) {
        float amax = 0;
        for (int j = 0; j < 256; j++) {
            amax = fmaxf(amax, fabsf(x[b * 256 + j]));
            xq[b * 256 + j] = q[b].d * (float)q[b].qs[j];
        }
        for (int j = 0; j < 8; j++) amaxb[b * 8 + j] = amax;
    }
    free(q);
}

static int n_fail_print;
static int compare_bits(const char *what, const float *y, const float *want, int na, int64_t n);
static const int tune_rpw[] = {1, 2, 4}, tune_units[] = {4, 8}, tune_warps[] = {2, 4, 8};

/* y (na x n) against want with per-output bounds tol; counts bad outputs */
static int compare(const float *y, const double *want, const double *tol, int na, int64_t n) {
    int bad = 0;
    for (int r = 0; r < na; r++)
        for (int64_t j = 0; j < n; j++) {
            const double v = y[r * n + j], d = fabs(v - want[r * n + j]);
            if (!(d <= tol[r * n + j])) { /* NaN (unwritten) fails too */
                if (n_fail_print++ < 12)
                    fprintf(stderr, "  row %d col %lld: got %.9g want %.9g (diff %.3g, bound %.3g)\n", r, (long long)j, v,
                            want[r * n + j], d, tol[r * n + j]);
                bad++;
            }
        }
    return bad;
}

static void test_type(qt_type t, const shape *sh) {
    const qt_type_traits *tr = qt_traits(t);
    const int64_t k = sh->k, n = sh->n;
    const bool is_f = t == QT_F16 || t == QT_BF16;
    const size_t wbytes = (size_t)n * qt_row_size(t, k);
    float *wf = malloc(sizeof(float) * (size_t)(n * k)), *wd = malloc(sizeof(float) * (size_t)(n * k));
    void *wq = malloc(wbytes);
    float *x = malloc(sizeof(float) * (size_t)(MAXR * k)), *xq = malloc(sizeof(float) * (size_t)(MAXR * k));
    float *amax = malloc(sizeof(float) * (size_t)(MAXR * k / 32 + 1)), *y = malloc(sizeof(float) * (size_t)(MAXR * n));
    double *want = malloc(sizeof(double) * (size_t)(MAXR * n)), *want_q = malloc(sizeof(double) * (size_t)(MAXR * n));
    double *tol_ref = malloc(sizeof(double) * (size_t)(MAXR * n)), *tol_q = malloc(sizeof(double) * (size_t)(MAXR * n));
    double *tol_x = malloc(sizeof(double) * (size_t)(MAXR * n));
    float *y0 = malloc(sizeof(float) * (size_t)(MAXR * n));
    if (!wf || !wd || !wq || !x || !xq || !amax || !y || !want || !want_q || !tol_ref || !tol_q || !tol_x || !y0) {
        CHECK(!"out of host memory");
        goto done;
    }
    for (int64_t i = 0; i < n * k; i++) wf[i] = 0.05f * test_gauss();
    tr->from_float(wf, wq, n * k);
    tr->to_float(wq, wd, n * k);
    for (int r = 0; r < MAXR; r++)
        for (int64_t i = 0; i < k; i++) x[r * k + i] = (1.0f + (float)r) * test_gauss();
    for (int64_t i = 0; i < k && i < 32; i++) x[1 * k + i] = 0.0f; /* an all-zero block: scale 0 */
    x[2 * k + k / 2] = 40.0f;                                         /* an outlier */
    /* rounded x: all but f16 (bf16: to bf16, the integer types: 8 bits) */
    const bool rounds = t != QT_F16;
    for (int r = 0; r < MAXR; r++) {
        if (rounds) quant_x(t, x + r * k, k, xq + r * k, amax);
        for (int64_t j = 0; j < n; j++) {
            const float *w = wd + j * k;
            double s = 0, sq = 0, sabs = 0, sabsq = 0, qerr = 0;
            for (int64_t i = 0; i < k; i++) {
                s += (double)w[i] * x[r * k + i];
                sabs += fabs((double)w[i] * x[r * k + i]);
                if (rounds) {
                    sq += (double)w[i] * xq[r * k + i];
                    sabsq += fabs((double)w[i] * xq[r * k + i]);
                    /* half a code, plus (Q8_0) the f16 rounding of the scale: 127 codes of 2^-11 */
                    qerr += is_f ? fabs((double)w[i] * x[r * k + i]) / 256.0
                                 : fabs((double)w[i]) * amax[i / 32] / 254.0 * 1.13;
                }
            }
            want[r * n + j] = s;
            want_q[r * n + j] = rounds ? sq : s;
            tol_ref[r * n + j] = 1e-6 * sabs + 1e-30;
            tol_q[r * n + j] = 2e-5 * (rounds ? sabsq : sabs) + 1e-30;
            tol_x[r * n + j] = rounds ? qerr + 2e-5 * sabs + 1e-30 : tol_q[r * n + j];
        }
    }

    hn_err err;
    hc_weight w;
    float *dx = NULL, *dy = NULL;
    hc_gemv_scratch s;
    memset(&s, 0, sizeof s);
    hn_status st = hc_weight_upload(&w, t, k, n, wq, &err);
    CHECKF(st == HN_OK, "%s upload: %s", tr->name, err.msg);
    if (st) goto done;
    CHECK(w.gguf_bytes == wbytes);
    st = hc_malloc((void **)&dx, sizeof(float) * (size_t)(MAXR * k), &err);
    if (!st) st = hc_malloc((void **)&dy, sizeof(float) * (size_t)(MAXR * n), &err);
    if (!st) st = hc_upload(dx, x, sizeof(float) * (size_t)(MAXR * k), &err);
    if (!st && !is_f) st = hc_gemv_scratch_init(&s, k, &err);
    CHECKF(st == HN_OK, "%s device buffers: %s", tr->name, err.msg);
    for (int na = 1; na <= MAXR && !st; na++) {
        /* variant -1: the reference kernel; 0..2: rows per warp 1, 2, 4; 3: the
         * default choice reusing the x that variant 2 quantized */
        for (int v = -1; v < 4 && !st; v++) {
            st = hc_fill_f32(dy, (size_t)(MAXR * n), NAN, &err);
            if (!st) {
                if (v < 0) {
                    st = hc_gemv_ref(&w, dx, na, dy, NULL, &err);
                } else {
                    hc_gemv_params p = {v < 3 ? 1 << v : 0, v == 3, 0, 0};
                    st = hc_gemv(&w, dx, na, dy, &s, &p, NULL, &err);
                }
            }
            if (!st) st = hc_sync(&err);
            if (!st) st = hc_download(y, dy, sizeof(float) * (size_t)(na * n), &err);
            CHECKF(st == HN_OK, "%s k=%lld n=%lld na=%d variant %d: %s", tr->name, (long long)k, (long long)n, na, v,
                   err.msg);
            if (st) break;
            int bad = v < 0 ? compare(y, want, tol_ref, na, n) : compare(y, want_q, tol_q, na, n);
            if (v >= 0) bad += compare(y, want, tol_x, na, n);
            CHECKF(bad == 0, "%s k=%lld n=%lld na=%d variant %d (-1: reference, 0..2: rows per warp 1 2 4, 3: reuse_x): %d outputs out of bounds",
                   tr->name, (long long)k, (long long)n, na, v, bad);
            /* the rows past na stay untouched (poisoned) */
            if (na < MAXR && v >= 0) {
                float tail;
                st = hc_download(&tail, dy + (size_t)na * (size_t)n, sizeof tail, &err);
                CHECKF(!st && isnan(tail), "%s na=%d wrote past its rows", tr->name, na);
            }
        }
        /* every configuration the tuner may choose: the built-in choice's bits */
        if (!st) st = hc_gemv(&w, dx, na, dy, &s, NULL, NULL, &err);
        if (!st) st = hc_sync(&err);
        if (!st) st = hc_download(y0, dy, sizeof(float) * (size_t)(na * n), &err);
        CHECKF(st == HN_OK, "%s na=%d built-in: %s", tr->name, na, err.msg);
        int n_cfg = 0, bad_cfg = 0;
        for (int a = 0; a < 3 && !st; a++)
            for (int b = 0; b < 2 && !st; b++)
                for (int c = 0; c < 3 && !st; c++) {
                    hc_gemv_params p = {tune_rpw[a], 0, tune_units[b], tune_warps[c]};
                    st = hc_fill_f32(dy, (size_t)(MAXR * n), NAN, &err);
                    if (!st) st = hc_gemv(&w, dx, na, dy, &s, &p, NULL, &err);
                    if (!st) st = hc_sync(&err);
                    if (!st) st = hc_download(y, dy, sizeof(float) * (size_t)(MAXR * n), &err);
                    CHECKF(st == HN_OK, "%s na=%d rpw %d units %d warps %d: %s", tr->name, na, p.rows_per_warp,
                           p.units, p.warps, err.msg);
                    if (st) break;
                    char what[96];
                    snprintf(what, sizeof what, "%s k=%lld n=%lld na=%d rpw %d units %d warps %d", tr->name,
                             (long long)k, (long long)n, na, p.rows_per_warp, p.units, p.warps);
                    int bad = compare_bits(what, y, y0, na, n);
                    for (int64_t i = (int64_t)na * n; i < MAXR * n; i++) bad += !isnan(y[i]);
                    bad_cfg += bad != 0;
                    n_cfg++;
                }
        CHECKF(n_cfg == 18 && bad_cfg == 0, "%s k=%lld n=%lld na=%d: %d of %d tuned configurations differ from the built-in bits (or wrote past their rows)",
               tr->name, (long long)k, (long long)n, na, bad_cfg, n_cfg);
    }
    /* a clone of the weight (the tuner's rotation) computes the same bits */
    if (!st) {
        hc_weight wc;
        st = hc_weight_clone(&wc, &w, &err);
        CHECKF(st == HN_OK && wc.mem != w.mem && wc.type == w.type && wc.k == k && wc.n == n &&
                   wc.gguf_bytes == w.gguf_bytes,
               "%s clone: %s", tr->name, err.msg);
        if (!st) st = hc_gemv(&wc, dx, MAXR, dy, &s, NULL, NULL, &err);
        if (!st) st = hc_sync(&err);
        if (!st) st = hc_download(y, dy, sizeof(float) * (size_t)(MAXR * n), &err);
        if (!st) st = hc_gemv(&w, dx, MAXR, dy, &s, NULL, NULL, &err);
        if (!st) st = hc_sync(&err);
        if (!st) st = hc_download(y0, dy, sizeof(float) * (size_t)(MAXR * n), &err);
        CHECKF(st == HN_OK && !compare_bits("clone", y, y0, MAXR, n), "%s k=%lld n=%lld: the clone differs: %s",
               tr->name, (long long)k, (long long)n, err.msg);
        hc_weight_free(&wc);
    }
    hc_gemv_scratch_free(&s);
    hc_free(dx);
    hc_free(dy);
    hc_weight_free(&w);
done:
    free(wf);
    free(wd);
    free(wq);
    free(x);
    free(xq);
    free(amax);
    free(y);
    free(want);
    free(want_q);
    free(tol_ref);
    free(tol_q);
    free(tol_x);
    free(y0);
}

/* hc_mmq (prefill) against hc_gemv bit for bit: y of na rows in one hc_mmq
 * call equals, byte for byte, hc_gemv's of the same rows 8 at a time (and
 * row 0 alone), for row counts around the kernel's 64 x 64 tiles, K not a
 * multiple of its 1024-value sweep, N not a multiple of 64; the rows past
 * na stay untouched; reuse_x gives the same bits again. */
#define MQR 512
static const shape mq_shapes_k[] = {{256, 37}, {1280, 130}, {4096, 64}, {4352, 200}, {12288, 67}};
static const shape mq_shapes_32[] = {{32, 5}, {96, 130}, {1120, 64}, {4096, 67}, {4160, 200}};
static const int mq_rows[] = {1, 5, 16, 17, 40, 64, 100, 512};

/* bytes of y against want (na x n); prints the first differences and the largest, relative to the largest |want| */
static int compare_bits(const char *what, const float *y, const float *want, int na, int64_t n) {
    if (!memcmp(y, want, sizeof(float) * (size_t)na * (size_t)n)) return 0;
    int bad = 0, shown = 0;
    double big = 0, worst = 0;
    for (int64_t i = 0; i < na * n; i++) big = fmax(big, fabs((double)want[i]));
    for (int r = 0; r < na; r++)
        for (int64_t j = 0; j < n; j++) {
            const float a = y[r * n + j], b = want[r * n + j];
            if (!memcmp(&a, &b, sizeof a)) continue;
            bad++;
            worst = fmax(worst, isnan(a) || isnan(b) ? INFINITY : fabs((double)a - b));
            if (shown++ < 8)
                fprintf(stderr, "  %s: row %d col %lld: mmq %.9g (%a) gemv %.9g (%a)\n", what, r, (long long)j, a, a, b, b);
        }
    fprintf(stderr, "  %s: %d of %lld outputs differ, largest difference %.3g (largest |output| %.3g)\n", what, bad,
            (long long)(na * n), worst, big);
    return bad;
}

static void test_mmq(qt_type t, const shape *sh) {
    const qt_type_traits *tr = qt_traits(t);
    const int64_t k = sh->k, n = sh->n;
    const size_t wbytes = (size_t)n * qt_row_size(t, k);
    float *wf = malloc(sizeof(float) * (size_t)(n * k)), *x = malloc(sizeof(float) * (size_t)(MQR * k));
    float *yg = malloc(sizeof(float) * (size_t)(MQR * n)), *y = malloc(sizeof(float) * (size_t)(MQR * n));
    void *wq = malloc(wbytes);
    hn_err err;
    hc_weight w;
    memset(&w, 0, sizeof w);
    float *dx = NULL, *dyg = NULL, *dy = NULL;
    hc_gemv_scratch s, s8;
    memset(&s, 0, sizeof s);
    memset(&s8, 0, sizeof s8);
    if (!wf || !x || !yg || !y || !wq) {
        CHECK(!"out of host memory");
        goto done;
    }
    for (int64_t i = 0; i < n * k; i++) wf[i] = 0.05f * test_gauss();
    tr->from_float(wf, wq, n * k);
    for (int r = 0; r < MQR; r++)
        for (int64_t i = 0; i < k; i++) x[r * k + i] = (1.0f + (float)(r % 13)) * test_gauss();
    for (int64_t i = 0; i < k && i < 32; i++) x[1 * k + i] = 0.0f; /* an all-zero block: scale 0 */
    for (int64_t i = 0; i < k; i++) x[3 * k + i] = 0.0f;            /* an all-zero row */
    x[2 * k + k / 2] = 40.0f;                                         /* an outlier */
    x[70 * k + k - 1] = -300.0f;
    hn_status st = hc_weight_upload(&w, t, k, n, wq, &err);
    if (!st) st = hc_malloc((void **)&dx, sizeof(float) * (size_t)(MQR * k), &err);
    if (!st) st = hc_malloc((void **)&dyg, sizeof(float) * (size_t)(MQR * n), &err);
    if (!st) st = hc_malloc((void **)&dy, sizeof(float) * (size_t)(MQR * n), &err);
    if (!st) st = hc_upload(dx, x, sizeof(float) * (size_t)(MQR * k), &err);
    if (!st) st = hc_gemv_scratch_init_rows(&s, k, MQR, &err);
    if (!st) st = hc_gemv_scratch_init(&s8, k, &err);
    /* the reference: hc_gemv, 8 rows at a time */
    for (int r = 0; r < MQR && !st; r += MAXR)
        st = hc_gemv(&w, dx + (size_t)r * (size_t)k, MAXR, dyg + (size_t)r * (size_t)n, &s8, NULL, NULL, &err);
    if (!st) st = hc_sync(&err);
    if (!st) st = hc_download(yg, dyg, sizeof(float) * (size_t)(MQR * n), &err);
    CHECKF(st == HN_OK, "%s mmq k=%lld n=%lld setup: %s", tr->name, (long long)k, (long long)n, err.msg);
    if (st) goto done;
    /* row 0 alone through hc_gemv: the same bits as in its batch of 8 */
    st = hc_gemv(&w, dx, 1, dy, &s8, NULL, NULL, &err);
    if (!st) st = hc_sync(&err);
    if (!st) st = hc_download(y, dy, sizeof(float) * (size_t)n, &err);
    CHECKF(st == HN_OK && !compare_bits("gemv row 0 alone", y, yg, 1, n), "%s k=%lld n=%lld: hc_gemv's row 0 alone differs from its batch of 8",
           tr->name, (long long)k, (long long)n);
    for (size_t ri = 0; ri < sizeof mq_rows / sizeof *mq_rows && !st; ri++) {
        const int na = mq_rows[ri];
        for (int v = 0; v < 2 && !st; v++) { /* v 1: reuse_x, the x that v 0 quantized */
            hc_gemv_params p = {0, v, 0, 0};
            st = hc_fill_f32(dy, (size_t)(MQR * n), NAN, &err);
            if (!st) st = hc_mmq(&w, dx, na, dy, &s, &p, NULL, &err);
            if (!st) st = hc_sync(&err);
            if (!st) st = hc_download(y, dy, sizeof(float) * (size_t)(MQR * n), &err);
            CHECKF(st == HN_OK, "%s mmq k=%lld n=%lld na=%d: %s", tr->name, (long long)k, (long long)n, na, err.msg);
            if (st) break;
            char what[96];
            snprintf(what, sizeof what, "%s k=%lld n=%lld na=%d%s", tr->name, (long long)k, (long long)n, na,
                     v ? " reuse_x" : "");
            const int bad = compare_bits(what, y, yg, na, n);
            CHECKF(bad == 0, "%s: hc_mmq differs from hc_gemv in %d outputs", what, bad);
            int wrote = 0;
            for (int64_t i = (int64_t)na * n; i < MQR * n; i++) wrote += !isnan(y[i]);
            CHECKF(wrote == 0, "%s: hc_mmq wrote %d outputs past its rows", what, wrote);
        }
    }
done:
    hc_gemv_scratch_free(&s);
    hc_gemv_scratch_free(&s8);
    hc_free(dx);
    hc_free(dyg);
    hc_free(dy);
    hc_weight_free(&w);
    free(wf);
    free(x);
    free(yg);
    free(y);
    free(wq);
}

/* hc_gemv_multi: weights sharing x in one launch, with the built-in
 * parameters and with tuned ones, each y[i] with hc_gemv's bits for the
 * same parameters (k = 1280 and 2048); built-in choices that differ cannot share a
 * launch, given parameters can */
/* hc_gemv_slots: an expert stack of 3 matrices; slot s (ids on the device,
 * one out of range) equals a one-row hc_gemv of its matrix uploaded alone,
 * bit for bit, with shared (ks 2) and per-slot x, in one chunk (a scratch of
 * 16 rows) and chunked (the 8 of hc_gemv_scratch_init) */
static void test_slots(qt_type t, int64_t k, int64_t nr) {
    enum { MATS = 3, NS = 13 };
    hn_err err;
    const size_t rb = qt_row_size(t, k);
    float *wf = malloc(sizeof(float) * (size_t)(MATS * nr * k)), *x = malloc(sizeof(float) * (size_t)(NS * k));
    float *y = malloc(sizeof(float) * (size_t)(NS * nr)), *want = malloc(sizeof(float) * (size_t)(NS * nr));
    uint8_t *wq = malloc(rb * (size_t)(MATS * nr));
    hc_weight ws, w1[MATS];
    memset(&ws, 0, sizeof ws);
    memset(w1, 0, sizeof w1);
    hc_gemv_scratch s, s3;
    memset(&s, 0, sizeof s);
    memset(&s3, 0, sizeof s3);
    float *dx = NULL, *dy = NULL;
    int32_t *dids = NULL;
    const int32_t ids[NS] = {2, 0, 1, 1, 7, 0, 2, 2, 0, 1, -1, 0, 2};
    hn_status st = wf && x && y && want && wq ? HN_OK : HN_ERR_NOMEM;
    for (int64_t i = 0; !st && i < MATS * nr * k; i++) wf[i] = 0.05f * test_gauss();
    for (int64_t i = 0; !st && i < NS * k; i++) x[i] = (1.0f + (float)(i / k % 5)) * test_gauss();
    if (!st) qt_traits(t)->from_float(wf, wq, MATS * nr * k);
    if (!st) st = hc_weight_upload(&ws, t, k, MATS * nr, wq, &err);
    for (int m = 0; m < MATS && !st; m++) st = hc_weight_upload(&w1[m], t, k, nr, wq + rb * (size_t)(m * nr), &err);
    if (!st) st = hc_malloc((void **)&dx, sizeof(float) * (size_t)(NS * k), &err);
    if (!st) st = hc_malloc((void **)&dy, sizeof(float) * (size_t)(NS * nr), &err);
    if (!st) st = hc_malloc((void **)&dids, sizeof ids, &err);
    if (!st) st = hc_upload(dx, x, sizeof(float) * (size_t)(NS * k), &err);
    if (!st) st = hc_upload(dids, ids, sizeof ids, &err);
    if (!st) st = hc_gemv_scratch_init(&s, k, &err);
    if (!st) st = hc_gemv_scratch_init_rows(&s3, k, 16, &err);
    if (st) {
        CHECKF(0, "slots %s: set-up: %s", qt_name(t), err.msg);
        goto done;
    }
    for (int ks = 0; ks <= 2; ks += 2)
        for (int sc = 0; sc < 2; sc++) {
            /* the reference: each slot a one-row gemv of its matrix alone */
            for (int q = 0; q < NS && !st; q++) {
                const int xr = ks ? q / ks : q;
                if (ids[q] < 0 || ids[q] >= MATS) {
                    for (int64_t j = 0; j < nr; j++) want[q * nr + j] = 0.0f;
                    continue;
                }
                st = hc_gemv(&w1[ids[q]], dx + (size_t)xr * (size_t)k, 1, dy, &s, NULL, NULL, &err);
                if (!st) st = hc_download(want + (size_t)q * (size_t)nr, dy, sizeof(float) * (size_t)nr, &err);
            }
            if (!st) st = hc_gemv_slots(&ws, nr, MATS, dx, NS, ks, dids, 0, dy, sc ? &s : &s3, 0, NULL, &err);
            if (!st) st = hc_download(y, dy, sizeof(float) * (size_t)(NS * nr), &err);
            if (st) {
                CHECKF(0, "slots %s: %s", qt_name(t), err.msg);
                goto done;
            }
            char what[96];
            snprintf(what, sizeof what, "slots %s %lldx%lld ks %d scratch %s", qt_name(t), (long long)nr, (long long)k, ks,
                     sc ? "8 rows" : "16 rows");
            CHECK(compare_bits(what, y, want, NS, nr) == 0);
        }
    /* reuse_x: the scratch quantized by the call before (ks 2, one chunk) gives the same bits; chunks refused */
    st = hc_gemv_slots(&ws, nr, MATS, dx, NS, 2, dids, 0, dy, &s3, 0, NULL, &err);
    if (!st) st = hc_download(want, dy, sizeof(float) * (size_t)(NS * nr), &err);
    if (!st) st = hc_upload(dx, x + k, sizeof(float) * (size_t)k, &err); /* x changed: reuse must not read it */
    if (!st) st = hc_gemv_slots(&ws, nr, MATS, dx, NS, 2, dids, 0, dy, &s3, 1, NULL, &err);
    if (!st) st = hc_download(y, dy, sizeof(float) * (size_t)(NS * nr), &err);
    CHECKF(!st && compare_bits("slots, reuse_x", y, want, NS, nr) == 0, "slots %s: reuse_x", qt_name(t));
    CHECK(hc_gemv_slots(&ws, nr, MATS, dx, NS, 0, dids, 0, dy, &s, 1, NULL, &err) == HN_ERR_INVALID);
    if (!st) st = hc_upload(dx, x, sizeof(float) * (size_t)(NS * k), &err);
    /* a fixed matrix (ids NULL): rows as slots of matrix 1 */
    st = hc_gemv_slots(&ws, nr, MATS, dx, 5, 0, NULL, 1, dy, &s, 0, NULL, &err);
    for (int q = 0; q < 5 && !st; q++) {
        st = hc_gemv(&w1[1], dx + (size_t)q * (size_t)k, 1, dy + (size_t)(5 + q) * (size_t)nr, &s, NULL, NULL, &err);
    }
    if (!st) st = hc_download(y, dy, sizeof(float) * (size_t)(10 * nr), &err);
    CHECKF(!st && compare_bits("slots, a fixed matrix", y, y + 5 * nr, 5, nr) == 0, "slots %s: a fixed matrix",
           qt_name(t));
    /* hc_gemv_slots2: gate (ws) and up (wu: the matrices rotated by one) in one launch = two hc_gemv_slots calls,
     * bit for bit; h their swiglu */
    {
        hc_weight wu;
        memset(&wu, 0, sizeof wu);
        float *dg = NULL, *du = NULL, *dh = NULL;
        float *yg = malloc(sizeof(float) * (size_t)(NS * nr)), *yu = malloc(sizeof(float) * (size_t)(NS * nr));
        float *yh = malloc(sizeof(float) * (size_t)(NS * nr)), *wg = malloc(sizeof(float) * (size_t)(NS * nr));
        float *wu_ = malloc(sizeof(float) * (size_t)(NS * nr));
        uint8_t *wq2 = malloc(rb * (size_t)(MATS * nr));
        st = yg && yu && yh && wg && wu_ && wq2 ? HN_OK : HN_ERR_NOMEM;
        if (!st) {
            memcpy(wq2, wq + rb * (size_t)nr, rb * (size_t)((MATS - 1) * nr));
            memcpy(wq2 + rb * (size_t)((MATS - 1) * nr), wq, rb * (size_t)nr);
            st = hc_weight_upload(&wu, t, k, MATS * nr, wq2, &err);
        }
        if (!st) st = hc_malloc((void **)&dg, sizeof(float) * (size_t)(NS * nr), &err);
        if (!st) st = hc_malloc((void **)&du, sizeof(float) * (size_t)(NS * nr), &err);
        if (!st) st = hc_malloc((void **)&dh, sizeof(float) * (size_t)(NS * nr), &err);
        for (int ks = 0; ks <= 2 && !st; ks += 2)
            for (int sc = 0; sc < 2 && !st; sc++) {
                hc_gemv_scratch *sp = sc ? &s : &s3;
                st = hc_gemv_slots(&ws, nr, MATS, dx, NS, ks, dids, 0, dy, sp, 0, NULL, &err);
                if (!st) st = hc_download(wg, dy, sizeof(float) * (size_t)(NS * nr), &err);
                if (!st) st = hc_gemv_slots(&wu, nr, MATS, dx, NS, ks, dids, 0, dy, sp, 0, NULL, &err);
                if (!st) st = hc_download(wu_, dy, sizeof(float) * (size_t)(NS * nr), &err);
                if (!st) st = hc_gemv_slots2(&ws, &wu, nr, MATS, dx, NS, ks, dids, dg, du, sc ? dh : NULL, sp, 0, NULL, &err);
                if (!st) st = hc_download(yg, dg, sizeof(float) * (size_t)(NS * nr), &err);
                if (!st) st = hc_download(yu, du, sizeof(float) * (size_t)(NS * nr), &err);
                if (!st && sc) st = hc_download(yh, dh, sizeof(float) * (size_t)(NS * nr), &err);
                if (st) break;
                char what[96];
                snprintf(what, sizeof what, "slots2 %s %lldx%lld ks %d, gate", qt_name(t), (long long)nr, (long long)k, ks);
                CHECK(compare_bits(what, yg, wg, NS, nr) == 0);
                snprintf(what, sizeof what, "slots2 %s %lldx%lld ks %d, up", qt_name(t), (long long)nr, (long long)k, ks);
                CHECK(compare_bits(what, yu, wu_, NS, nr) == 0);
                if (sc) {
                    double worst = 0;
                    for (int64_t i = 0; i < NS * nr; i++) {
                        const double g = wg[i], want_h = g / (1.0 + exp(-g)) * wu_[i];
                        const double d = fabs(yh[i] - want_h) / (fabs(want_h) + 1e-6);
                        if (!(d <= worst)) worst = d;
                    }
                    CHECKF(worst < 1e-5, "slots2 %s ks %d: swiglu off by %g (relative)", qt_name(t), ks, worst);
                }
            }
        CHECKF(!st, "slots2 %s: %s", qt_name(t), st ? err.msg : "");
        CHECK(hc_gemv_slots2(&ws, &wu, nr, MATS, dx, NS, 0, NULL, dg, du, NULL, &s, 0, NULL, &err) == HN_ERR_INVALID);
        CHECK(hc_gemv_slots2(&ws, &ws, nr + 1, MATS, dx, NS, 0, dids, dg, du, NULL, &s, 0, NULL, &err) == HN_ERR_INVALID);
        hc_weight_free(&wu);
        hc_free(dg);
        hc_free(du);
        hc_free(dh);
        free(yg);
        free(yu);
        free(yh);
        free(wg);
        free(wu_);
        free(wq2);
        st = HN_OK;
    }
    /* bad arguments */
    CHECK(hc_gemv_slots(&ws, nr + 1, MATS, dx, NS, 0, dids, 0, dy, &s, 0, NULL, &err) == HN_ERR_INVALID);
    CHECK(hc_gemv_slots(&ws, nr, MATS, dx, NS, 0, NULL, MATS, dy, &s, 0, NULL, &err) == HN_ERR_INVALID);
done:
    hc_weight_free(&ws);
    for (int m = 0; m < MATS; m++) hc_weight_free(&w1[m]);
    hc_gemv_scratch_free(&s);
    hc_gemv_scratch_free(&s3);
    hc_free(dx);
    hc_free(dy);
    hc_free(dids);
    free(wf);
    free(x);
    free(y);
    free(want);
    free(wq);
}

static void test_multi(int64_t k) {
    hn_err err;
    const int64_t ns[3] = {300, 64, 96};
    hc_weight w[3];
    memset(w, 0, sizeof w);
    float *dx = NULL, *dy[3] = {NULL, NULL, NULL}, *dz = NULL;
    hc_gemv_scratch s;
    memset(&s, 0, sizeof s);
    float *x = malloc(sizeof(float) * (size_t)(MAXR * k)), *wf = malloc(sizeof(float) * (size_t)(300 * k));
    float *ya = malloc(sizeof(float) * 300 * MAXR), *yb = malloc(sizeof(float) * 300 * MAXR);
    void *wq = malloc(qt_row_size(QT_Q4_K, k) * 300);
    hn_status st = x && wf && ya && yb && wq ? HN_OK : HN_ERR_NOMEM;
    for (int64_t i = 0; !st && i < MAXR * k; i++) x[i] = test_gauss();
    for (int i = 0; i < 3 && !st; i++) {
        for (int64_t j = 0; j < ns[i] * k; j++) wf[j] = 0.05f * test_gauss();
        qt_traits(QT_Q4_K)->from_float(wf, wq, ns[i] * k);
        st = hc_weight_upload(&w[i], QT_Q4_K, k, ns[i], wq, &err);
        if (!st) st = hc_malloc((void **)&dy[i], sizeof(float) * 300 * MAXR, &err);
    }
    if (!st) st = hc_malloc((void **)&dx, sizeof(float) * (size_t)(MAXR * k), &err);
    if (!st) st = hc_malloc((void **)&dz, sizeof(float) * 300 * MAXR, &err);
    if (!st) st = hc_upload(dx, x, sizeof(float) * (size_t)(MAXR * k), &err);
    if (!st) st = hc_gemv_scratch_init(&s, k, &err);
    CHECKF(st == HN_OK, "multi setup: %s", st == HN_ERR_NOMEM ? "out of host memory" : err.msg);
    const hc_weight *ws[3] = {&w[0], &w[1], &w[2]};
    for (int na = 1; na <= MAXR && !st; na++)
        for (int v = 0; v < 4 && !st; v++) {
            /* v 0: built in; 1..3: tuned configurations */
            static const hc_gemv_params tuned[3] = {{1, 0, 8, 2}, {4, 0, 4, 8}, {2, 0, 8, 4}};
            hc_gemv_params p = v ? tuned[v - 1] : (hc_gemv_params){0, 0, 0, 0};
            CHECK(hc_gemv_multi_ok(3, ws, na, v ? &p : NULL));
            float *ys[3] = {dy[0], dy[1], dy[2]};
            st = hc_gemv_multi(3, ws, dx, na, ys, &s, v ? &p : NULL, NULL, &err);
            for (int i = 0; i < 3 && !st; i++) {
                st = hc_gemv(&w[i], dx, na, dz, &s, v ? &p : NULL, NULL, &err);
                if (!st) st = hc_sync(&err);
                if (!st) st = hc_download(ya, dy[i], sizeof(float) * (size_t)(na * ns[i]), &err);
                if (!st) st = hc_download(yb, dz, sizeof(float) * (size_t)(na * ns[i]), &err);
                CHECKF(st == HN_OK && !compare_bits("multi", ya, yb, na, ns[i]),
                       "multi na=%d configuration %d weight %d: differs from hc_gemv (%s)", na, v, i,
                       st ? err.msg : "bits");
            }
        }
    /* one weight past 65536 rows: another built-in rows per warp at one row, so only given parameters share a launch */
    if (!st && k == 1280) {
        hc_weight big;
        const int64_t kb = 32, nb = 65536;
        void *bq = calloc(1, qt_row_size(QT_Q8_0, kb) * (size_t)nb);
        st = bq ? hc_weight_upload(&big, QT_Q8_0, kb, nb, bq, &err) : HN_ERR_NOMEM;
        free(bq);
        hc_weight small;
        uint8_t sq[34 * 64] = {0};
        if (!st) st = hc_weight_upload(&small, QT_Q8_0, kb, 64, sq, &err);
        CHECKF(st == HN_OK, "multi: big weight: %d", st);
        if (!st) {
            const hc_weight *pair[2] = {&big, &small};
            hc_gemv_params p = {2, 0, 4, 4};
            CHECK(!hc_gemv_multi_ok(2, pair, 1, NULL));
            CHECK(hc_gemv_multi_ok(2, pair, 1, &p));
            CHECK(hc_gemv_multi_ok(2, pair, 2, NULL)); /* 2 rows: the same built-in choice */
            hc_weight_free(&big);
            hc_weight_free(&small);
        }
    }
    for (int i = 0; i < 3; i++) {
        hc_weight_free(&w[i]);
        hc_free(dy[i]);
    }
    hc_free(dx);
    hc_free(dz);
    hc_gemv_scratch_free(&s);
    free(x);
    free(wf);
    free(ya);
    free(yb);
    free(wq);
    printf("gemv_multi k=%lld with tuned parameters: %s\n", (long long)k, st == HN_OK ? "ran" : "FAILED");
}

static void test_mmq_errors(void) {
    hn_err err;
    hc_weight w, wf;
    uint8_t buf[4096] = {0};
    float *d = NULL;
    hc_gemv_scratch s;
    memset(&s, 0, sizeof s);
    CHECK(hc_gemv_scratch_init_rows(&s, 32, MAXR - 1, &err) == HN_ERR_INVALID);
    CHECK(hc_gemv_scratch_init_rows(&s, 32, 65536, &err) == HN_ERR_INVALID);
    CHECK(hc_mmq_supports(QT_Q4_0) && hc_mmq_supports(QT_Q8_0) && hc_mmq_supports(QT_Q4_K) &&
          hc_mmq_supports(QT_Q5_K) && hc_mmq_supports(QT_Q6_K));
    CHECK(!hc_mmq_supports(QT_F16) && !hc_mmq_supports(QT_BF16) && !hc_mmq_supports(QT_Q2_K));
    hn_status st = hc_weight_upload(&w, QT_Q8_0, 64, 4, buf, &err);
    if (!st) st = hc_weight_upload(&wf, QT_F16, 64, 4, buf, &err);
    if (!st) st = hc_malloc((void **)&d, 65536, &err);
    if (!st) st = hc_gemv_scratch_init_rows(&s, 64, 20, &err);
    CHECKF(st == HN_OK, "mmq error buffers: %s", err.msg);
    if (!st) {
        CHECK(s.max_rows == 20 && s.max_k == 64);
        CHECK(hc_mmq(&w, d, 0, d, &s, NULL, NULL, &err) == HN_ERR_INVALID);
        CHECK(hc_mmq(&w, d, 21, d, &s, NULL, NULL, &err) == HN_ERR_INVALID && strstr(err.msg, "scratch"));
        CHECK(hc_mmq(&w, d, 20, d, NULL, NULL, NULL, &err) == HN_ERR_INVALID);
        CHECK(hc_mmq(&wf, d, 20, d, &s, NULL, NULL, &err) == HN_ERR_UNSUPPORTED);
        CHECK(hc_mmq(&w, d, 20, d, &s, NULL, NULL, &err) == HN_OK);
        CHECK(hc_sync(&err) == HN_OK);
        hc_weight_free(&w);
        hc_weight_free(&wf);
    }
    hc_gemv_scratch_free(&s);
    hc_free(d);
}

static void test_errors(void) {
    hn_err err;
    void *p = (void *)1;
    hn_status st = hc_malloc(&p, (size_t)1 << 60, &err);
    CHECKF(st == HN_ERR_NOMEM && p == NULL && strstr(err.msg, "cudaMalloc"), "huge cudaMalloc: %d %s", st, err.msg);
    hc_weight w;
    uint8_t buf[4096] = {0};
    st = hc_weight_upload(&w, QT_Q2_K, 256, 1, buf, &err);
    CHECKF(st == HN_ERR_UNSUPPORTED && err.msg[0], "q2_K upload: %d", st);
    st = hc_weight_upload(&w, QT_Q4_K, 100, 1, buf, &err);
    CHECKF(st == HN_ERR_INVALID && err.msg[0], "q4_K k=100 upload: %d", st);
    st = hc_weight_upload(&w, QT_Q8_0, 32, 4, buf, &err);
    CHECKF(st == HN_OK, "q8_0 upload: %s", err.msg);
    if (st) return;
    float *d = NULL;
    hc_gemv_scratch s;
    st = hc_malloc((void **)&d, 4096, &err);
    if (!st) st = hc_gemv_scratch_init(&s, 32, &err);
    CHECKF(st == HN_OK, "buffers: %s", err.msg);
    if (!st) {
        CHECK(hc_gemv(&w, d, 0, d, &s, NULL, NULL, &err) == HN_ERR_INVALID);
        CHECK(hc_gemv(&w, d, 9, d, &s, NULL, NULL, &err) == HN_ERR_INVALID);
        CHECK(hc_gemv(&w, d, 1, d, NULL, NULL, NULL, &err) == HN_ERR_INVALID);
        hc_gemv_params bad = {3, 0, 0, 0};
        CHECK(hc_gemv(&w, d, 1, d, &s, &bad, NULL, &err) == HN_ERR_INVALID);
        hc_gemv_params bad_u = {1, 0, 6, 4}, bad_w = {1, 0, 4, 16}, bad_w1 = {2, 0, 8, 1};
        CHECK(hc_gemv(&w, d, 1, d, &s, &bad_u, NULL, &err) == HN_ERR_INVALID);
        CHECK(hc_gemv(&w, d, 1, d, &s, &bad_w, NULL, &err) == HN_ERR_INVALID);
        CHECK(hc_gemv(&w, d, 1, d, &s, &bad_w1, NULL, &err) == HN_ERR_INVALID);
        /* the resolved parameters: the built-in ones where 0, p's elsewhere */
        hc_gemv_params half = {0, 1, 8, 0}, r = hc_gemv_resolve(&w, 1, &half);
        CHECK(r.rows_per_warp == hc_gemv_resolve(&w, 1, NULL).rows_per_warp && r.units == 8 && r.warps == 4 &&
              r.reuse_x == 1);
        hc_weight wclone;
        CHECK(hc_weight_clone(&wclone, NULL, &err) == HN_ERR_INVALID);
        /* a scratch made for shorter rows is refused, not overrun */
        hc_weight w2;
        st = hc_weight_upload(&w2, QT_Q8_0, 64, 1, buf, &err);
        CHECK(st == HN_OK);
        if (!st) {
            CHECK(hc_gemv(&w2, d, 1, d, &s, NULL, NULL, &err) == HN_ERR_INVALID && strstr(err.msg, "scratch"));
            hc_weight_free(&w2);
        }
        CHECK(hc_sync(&err) == HN_OK);
        hc_gemv_scratch_free(&s);
    }
    hc_free(d);
    hc_weight_free(&w);
}

/* The fused producers (hc_norm_quant, hc_swiglu_quant) against the unfused
 * path: x updated as x + r (float add), y against the host's rms_norm /
 * swiglu, and the quantized x they leave in the scratch bit for bit equal to
 * what hc_gemv's own quantization of that y makes (for Q8_0 and Q8_K, on
 * row lengths that take the in-register form and ones that do not). */
static int dl_cmp(const void *dev_a, const void *dev_b, size_t bytes) {
    hn_err err;
    unsigned char *a = malloc(bytes), *b = malloc(bytes);
    int same = a && b && !hc_download(a, dev_a, bytes, &err) && !hc_download(b, dev_b, bytes, &err) &&
               !memcmp(a, b, bytes);
    free(a);
    free(b);
    return same;
}

static void test_fused_quant(hc_act act, int64_t dim, int n, int use_r, int use_w, int swiglu) {
    hn_err err;
    const qt_type wt = act == HC_ACT_Q8_K ? QT_Q4_K : QT_Q8_0;
    const size_t rb = qt_row_size(wt, dim), tot = (size_t)n * (size_t)dim;
    float *x = malloc(sizeof(float) * tot), *r = malloc(sizeof(float) * tot), *w = malloc(sizeof(float) * (size_t)dim);
    float *xo = malloc(sizeof(float) * tot), *yo = malloc(sizeof(float) * tot);
    void *wz = calloc(1, rb);
    uint32_t rs = (uint32_t)(dim * 31 + n * 7 + use_r * 3 + use_w + swiglu * 11);
    for (size_t i = 0; i < tot; i++) {
        rs = rs * 1664525u + 1013904223u;
        x[i] = ((float)(rs >> 8) / 16777216.0f - 0.5f) * (i % 97 == 0 ? 40.0f : 4.0f);
        rs = rs * 1664525u + 1013904223u;
        r[i] = ((float)(rs >> 8) / 16777216.0f - 0.5f);
    }
    for (int64_t i = 0; i < dim; i++) w[i] = 0.5f + (float)(i % 13) / 8.0f;
    if (n > 1) memset(x + dim, 0, sizeof(float) * (size_t)dim); /* a zero row: every scale 0 */
    float *dx = NULL, *dr = NULL, *dw = NULL, *dy = NULL, *dout = NULL;
    hc_gemv_scratch s1 = {0}, s2 = {0};
    hc_weight W;
    hn_status st = hc_weight_upload(&W, wt, dim, 1, wz, &err);
    if (!st) st = hc_malloc((void **)&dx, sizeof(float) * tot, &err);
    if (!st) st = hc_malloc((void **)&dr, sizeof(float) * tot, &err);
    if (!st) st = hc_malloc((void **)&dw, sizeof(float) * (size_t)dim, &err);
    if (!st) st = hc_malloc((void **)&dy, sizeof(float) * tot, &err);
    if (!st) st = hc_malloc((void **)&dout, sizeof(float) * (size_t)n, &err);
    if (!st) st = hc_gemv_scratch_init(&s1, dim, &err);
    if (!st) st = hc_gemv_scratch_init(&s2, dim, &err);
    if (!st) st = hc_upload(dx, x, sizeof(float) * tot, &err);
    if (!st) st = hc_upload(dr, r, sizeof(float) * tot, &err);
    if (!st) st = hc_upload(dw, w, sizeof(float) * (size_t)dim, &err);
    const float eps = 1e-6f;
    if (!st) st = swiglu ? hc_swiglu_quant(dx, dr, n, dim, dy, act, &s1, NULL, &err)
                         : hc_norm_quant(dx, use_r ? dr : NULL, use_w ? dw : NULL, n, (int)dim, eps, dy, act, &s1, NULL,
                                         &err);
    if (!st) st = hc_gemv(&W, dy, n, dout, &s2, NULL, NULL, &err);
    if (!st) st = hc_sync(&err);
    if (!st) st = hc_download(xo, dx, sizeof(float) * tot, &err);
    if (!st) st = hc_download(yo, dy, sizeof(float) * tot, &err);
    CHECKF(st == HN_OK, "fused quant act %d dim %lld: %s", (int)act, (long long)dim, err.msg);
    if (!st) {
        int xok = 1;
        double ymax = 0, yerr = 0;
        for (int row = 0; row < n; row++) {
            const float *xr = x + (size_t)row * dim, *rr = r + (size_t)row * dim;
            double ss = 0;
            for (int64_t i = 0; i < dim; i++) {
                const float v = use_r && !swiglu ? xr[i] + rr[i] : xr[i];
                if (!swiglu) xok &= xo[(size_t)row * dim + i] == v;
                ss += (double)v * v;
            }
            const double sc = 1.0 / sqrt(ss / (double)dim + eps);
            for (int64_t i = 0; i < dim; i++) {
                const float v = use_r && !swiglu ? xr[i] + rr[i] : xr[i];
                const double want = swiglu ? (double)xr[i] / (1.0 + exp(-(double)xr[i])) * rr[i]
                                           : (double)v * sc * (use_w ? w[i] : 1.0f);
                ymax = fmax(ymax, fabs(want));
                yerr = fmax(yerr, fabs(yo[(size_t)row * dim + i] - want));
            }
        }
        const size_t nb = tot / 32;
        const int qok = dl_cmp(s1.xq, s2.xq, tot) && dl_cmp(s1.xd, s2.xd, sizeof(float) * nb) &&
                        dl_cmp(s1.xs, s2.xs, sizeof(float) * nb);
        CHECKF(xok && yerr <= 2e-6 * ymax + 1e-30 && qok,
               "%s act %s dim %lld rows %d r %d w %d: x %s, y err %.3g of %.3g, quantized x %s",
               swiglu ? "swiglu_quant" : "norm_quant", act == HC_ACT_Q8_K ? "Q8_K" : "Q8_0", (long long)dim, n,
               use_r, use_w, xok ? "ok" : "differs", yerr, ymax, qok ? "= hc_gemv's" : "DIFFERS from hc_gemv's");
    }
    hc_gemv_scratch_free(&s1);
    hc_gemv_scratch_free(&s2);
    hc_free(dx);
    hc_free(dr);
    hc_free(dw);
    hc_free(dy);
    hc_free(dout);
    hc_weight_free(&W);
    free(x);
    free(r);
    free(w);
    free(xo);
    free(yo);
    free(wz);
}

static void test_fused(void) {
    static const int64_t dims[] = {256, 1024, 2048, 2560, 4096, 5120, 8192};
    const int before = test_failed_;
    for (int a = 0; a < 2; a++) {
        const hc_act act = a ? HC_ACT_Q8_K : HC_ACT_Q8_0;
        for (size_t d = 0; d < sizeof dims / sizeof *dims; d++)
            for (int n = 1; n <= 3; n += 2) {
                test_fused_quant(act, dims[d], n, 1, 1, 0);
                test_fused_quant(act, dims[d], n, 0, n == 1, 0);
            }
        test_fused_quant(act, 12288, 1, 0, 0, 1);
        test_fused_quant(act, 12288, 3, 0, 0, 1);
        test_fused_quant(act, 1024, 2, 0, 0, 1);
    }
    hn_err err;
    CHECK(hc_norm_quant(NULL, NULL, NULL, 1, 16384, 1e-6f, NULL, HC_ACT_Q8_K, NULL, NULL, &err) == HN_ERR_INVALID);
    printf("fused norm/swiglu + quantization: %s\n", test_failed_ == before ? "ok" : "FAILED");
}

int main(void) {
    hn_err err;
    if (hc_device_count() == 0) {
        hn_status st = hc_init(0, &err);
        CHECKF(st == HN_ERR_UNSUPPORTED && err.msg[0], "hc_init without a device: %d", st);
        printf("SKIP: no CUDA device (%s)\n", err.msg);
        TEST_DONE();
    }
    hn_status st = hc_init(0, &err);
    CHECKF(st == HN_OK, "hc_init: %s", err.msg);
    if (st) TEST_DONE();
    hc_device dev;
    st = hc_probe(&dev, &err);
    CHECKF(st == HN_OK && dev.sm_count > 0 && dev.mem_total > 0, "probe: %s", err.msg);
    printf("device: %s, sm_%d%d, %d SMs, %.1f GiB (%.1f free), L2 %d KiB, driver %d, runtime %d\n", dev.name,
           dev.cc_major, dev.cc_minor, dev.sm_count, dev.mem_total / 1073741824.0, dev.mem_free / 1073741824.0,
           dev.l2_bytes / 1024, dev.driver_version, dev.runtime_version);
    test_errors();
    test_fused();
    static const qt_type types[] = {QT_Q4_0, QT_Q8_0, QT_Q4_K, QT_Q5_K, QT_Q6_K, QT_IQ4_XS, QT_MXFP4, QT_F16, QT_BF16};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++) {
        const qt_type t = types[i];
        CHECK(hc_gemv_supports(t));
        const qt_type_traits *tr = qt_traits(t);
        const shape *sh = tr->blck_size == 256 ? shapes_k : tr->blck_size == 32 ? shapes_32 : shapes_f;
        const size_t ns = tr->blck_size == 256 ? sizeof shapes_k / sizeof *shapes_k
                          : tr->blck_size == 32 ? sizeof shapes_32 / sizeof *shapes_32
                                                : sizeof shapes_f / sizeof *shapes_f;
        const int before = test_failed_;
        for (size_t j = 0; j < ns; j++) test_type(t, &sh[j]);
        printf("%-7s %s\n", tr->name, test_failed_ == before ? "ok" : "FAILED");
    }
    test_multi(1280);
    test_multi(2048);
    {
        static const qt_type st[] = {QT_Q4_0, QT_Q8_0, QT_Q4_K, QT_Q5_K, QT_Q6_K, QT_IQ4_XS, QT_MXFP4};
        const int before = test_failed_;
        for (size_t i = 0; i < sizeof st / sizeof *st; i++) {
            CHECK(hc_gemv_slots_supports(st[i]));
            test_slots(st[i], 2048, 96);
            test_slots(st[i], 768, 70);
        }
        CHECK(!hc_gemv_slots_supports(QT_F16));
        printf("slots   = one-row gemv bit for bit: %s\n", test_failed_ == before ? "ok" : "FAILED");
    }
    test_mmq_errors();
    for (size_t i = 0; i < sizeof types / sizeof *types; i++) {
        const qt_type t = types[i];
        if (!hc_mmq_supports(t)) continue;
        const qt_type_traits *tr = qt_traits(t);
        const bool kq = tr->blck_size == 256;
        const shape *sh = kq ? mq_shapes_k : mq_shapes_32;
        const size_t ns = kq ? sizeof mq_shapes_k / sizeof *mq_shapes_k : sizeof mq_shapes_32 / sizeof *mq_shapes_32;
        const int before = test_failed_;
        for (size_t j = 0; j < ns; j++) test_mmq(t, &sh[j]);
        printf("%-7s mmq = gemv bit for bit: %s\n", tr->name, test_failed_ == before ? "ok" : "FAILED");
    }
    TEST_DONE();
}
#endif
