/* test_cuda_mmf: prefill's tensor-core matrix-matrix kernels hc_mmf
 * (backend/cuda/cuda.h) against the CPU: every type they take, shapes whose
 * N and row counts are not multiples of the 128 x 128 tile, and
 * - accuracy: y against the f64 product of the CPU's dequantized weights
 *   and the CPU's activation rounding for the type (Q8_0 / Q8_K; f16: x
 *   itself). The integer types' dots are exact, so only float scalings and
 *   sums differ: 2e-5 of sum |w x^| (as test_cuda_gemv bounds the gemv).
 *   f16 rounds x to f16: 2^-11 of sum |w x| plus f32 summation. And on
 *   average far inside the bound (mean error under 1/8 of it). A row of
 *   huge values (1e5: f16 products past its range unless the row is scaled)
 *   and small weights (0.05e-3) included;
 * - batch invariance: a row's bits do not depend on the rows around it or
 *   their number (the rows of a 300-row call = the same rows in a 7-row call
 *   at another offset = one row alone), and reuse_x gives the same bits;
 * - nothing is written past the rows asked for.
 * Skips (passing) without a CUDA build or device. */
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

typedef struct shape {
    int64_t k, n;
} shape;

static const shape shapes_k[] = {{256, 37}, {4096, 130}, {12288, 67}};
static const shape shapes_32[] = {{64, 5}, {1088, 130}, {4096, 67}};
#define NA 300

/* the CPU's activation rounding for weights of type t (dequantized) */
static void round_x(qt_type t, const float *x, int64_t k, float *xq) {
    const hc_act a = hc_gemv_act(t);
    if (a == HC_ACT_Q8_0) {
        block_q8_0 *q = malloc(sizeof(block_q8_0) * (size_t)(k / 32));
        cpu_act_q8_0_ref(x, q, k);
        for (int64_t b = 0; b < k / 32; b++)
            for (int j = 0; j < 32; j++) xq[b * 32 + j] = qt_f16_to_f32(q[b].d) * (float)q[b].qs[j];
        free(q);
    } else if (a == HC_ACT_Q8_K) {
        block_q8_K *q = malloc(sizeof(block_q8_K) * (size_t)(k / 256));
        cpu_act_q8_K_ref(x, q, k);
        for (int64_t b = 0; b < k / 256; b++)
            for (int j = 0; j < 256; j++) xq[b * 256 + j] = q[b].d * (float)q[b].qs[j];
        free(q);
    } else {
        memcpy(xq, x, sizeof(float) * (size_t)k);
    }
}

static int n_print;

static int bits_differ(const char *what, const float *a, const float *b, size_t n) {
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float))) {
            if (n_print++ < 8) fprintf(stderr, "  %s: output %zu: %.9g vs %.9g\n", what, i, a[i], b[i]);
            bad++;
        }
    return bad;
}

static void test_type(qt_type t, const shape *sh, float wscale) {
    const qt_type_traits *tr = qt_traits(t);
    const int64_t k = sh->k, n = sh->n;
    char what[96];
    snprintf(what, sizeof what, "%s k=%lld n=%lld w*%g", tr->name, (long long)k, (long long)n, wscale);
    const size_t wbytes = (size_t)n * qt_row_size(t, k);
    float *wf = malloc(sizeof(float) * (size_t)(n * k)), *wd = malloc(sizeof(float) * (size_t)(n * k));
    void *wq = malloc(wbytes);
    float *x = malloc(sizeof(float) * (size_t)(NA * k)), *xq = malloc(sizeof(float) * (size_t)k);
    float *y = malloc(sizeof(float) * (size_t)(NA + 8) * (size_t)n), *y2 = malloc(sizeof(float) * (size_t)(NA * n));
    hc_weight w;
    memset(&w, 0, sizeof w);
    hc_gemv_scratch s;
    memset(&s, 0, sizeof s);
    float *dx = NULL, *dy = NULL;
    hn_err err;
    if (!wf || !wd || !wq || !x || !xq || !y || !y2) {
        CHECK(!"out of host memory");
        goto done;
    }
    for (int64_t i = 0; i < n * k; i++) wf[i] = wscale * 0.05f * test_gauss();
    tr->from_float(wf, wq, n * k);
    tr->to_float(wq, wd, n * k);
    for (int r = 0; r < NA; r++)
        for (int64_t i = 0; i < k; i++) x[r * k + i] = (1.0f + (float)(r % 5)) * test_gauss();
    for (int64_t i = 0; i < 32; i++) x[1 * k + i] = 0.0f; /* an all-zero block */
    x[2 * k + k / 2] = 40.0f;                             /* an outlier */
    for (int64_t i = 0; i < k; i++) x[3 * k + i] *= 1e5f; /* past f16's range unless scaled */
    hn_status st = hc_weight_upload(&w, t, k, n, wq, &err);
    if (!st) st = hc_gemv_scratch_init_rows(&s, k, NA, &err);
    if (!st) st = hc_malloc((void **)&dx, sizeof(float) * (size_t)(NA * k), &err);
    if (!st) st = hc_malloc((void **)&dy, sizeof(float) * (size_t)(NA + 8) * (size_t)n, &err);
    if (!st) st = hc_upload(dx, x, sizeof(float) * (size_t)(NA * k), &err);
    if (!st) st = hc_fill_f32(dy, (size_t)(NA + 8) * (size_t)n, NAN, &err);
    if (!st) st = hc_mmf(&w, dx, NA, dy, &s, 0, NULL, &err);
    if (!st) st = hc_sync(&err);
    if (!st) st = hc_download(y, dy, sizeof(float) * (size_t)(NA + 8) * (size_t)n, &err);
    CHECKF(st == HN_OK, "%s: %s", what, err.msg);
    if (st) goto done;
    CHECKF(hc_mmf_takes(&w), "%s: hc_mmf_takes", what);
    /* accuracy */
    {
        int bad = 0;
        double sum_err = 0, sum_bound = 0;
        for (int r = 0; r < NA; r++) {
            round_x(t, x + r * k, k, xq);
            for (int64_t j = 0; j < n; j++) {
                double sq = 0, sabs = 0;
                for (int64_t i = 0; i < k; i++) {
                    sq += (double)wd[j * k + i] * xq[i];
                    sabs += fabs((double)wd[j * k + i] * xq[i]);
                }
                const double bound =
                    (t == QT_F16 ? sabs * (1.0 / 2048 + (double)k / 16777216.0) : 2e-5 * sabs) + 1e-30;
                const double d = fabs((double)y[r * n + j] - sq);
                if (!(d <= bound)) {
                    if (n_print++ < 8)
                        fprintf(stderr, "  %s: row %d col %lld: %.9g want %.9g (bound %.3g)\n", what, r, (long long)j,
                                y[r * n + j], sq, bound);
                    bad++;
                }
                sum_err += d;
                sum_bound += bound;
            }
        }
        CHECKF(bad == 0, "%s: %d outputs outside the bound", what, bad);
        CHECKF(sum_err < sum_bound / 8, "%s: mean error %.3g of the bound (want < 1/8)", what, sum_err / sum_bound);
        int wrote = 0;
        for (size_t i = (size_t)NA * (size_t)n; i < (size_t)(NA + 8) * (size_t)n; i++) wrote += !isnan(y[i]);
        CHECKF(wrote == 0, "%s: %d outputs written past the rows", what, wrote);
    }
    /* invariance: 7 rows at offset 293; row 150 alone; the same call with reuse_x */
    {
        const int off[2] = {NA - 7, 150}, cnt[2] = {7, 1};
        for (int c = 0; c < 2; c++) {
            st = hc_mmf(&w, dx + (size_t)off[c] * (size_t)k, cnt[c], dy, &s, 0, NULL, &err);
            if (!st) st = hc_sync(&err);
            if (!st) st = hc_download(y2, dy, sizeof(float) * (size_t)cnt[c] * (size_t)n, &err);
            CHECKF(st == HN_OK, "%s: %s", what, err.msg);
            if (st) goto done;
            CHECKF(!bits_differ(what, y2, y + (size_t)off[c] * (size_t)n, (size_t)cnt[c] * (size_t)n),
                   "%s: %d rows at %d differ from the same rows of %d", what, cnt[c], off[c], NA);
        }
        st = hc_mmf(&w, dx, NA, dy, &s, 0, NULL, &err);
        if (!st) st = hc_mmf(&w, dx, NA, dy, &s, 1, NULL, &err);
        if (!st) st = hc_sync(&err);
        if (!st) st = hc_download(y2, dy, sizeof(float) * (size_t)(NA * n), &err);
        CHECKF(st == HN_OK, "%s: %s", what, err.msg);
        if (!st) CHECKF(!bits_differ(what, y2, y, (size_t)(NA * n)), "%s: reuse_x changed the bits", what);
    }
done:
    hc_free(dx);
    hc_free(dy);
    hc_gemv_scratch_free(&s);
    hc_weight_free(&w);
    free(wf);
    free(wd);
    free(wq);
    free(x);
    free(xq);
    free(y);
    free(y2);
}

static void test_errors(void) {
    hn_err err;
    CHECK(hc_mmf_supports(QT_Q4_0) && hc_mmf_supports(QT_Q8_0) && hc_mmf_supports(QT_Q4_K) &&
          hc_mmf_supports(QT_Q5_K) && hc_mmf_supports(QT_Q6_K) && hc_mmf_supports(QT_IQ4_XS) &&
          hc_mmf_supports(QT_MXFP4) && hc_mmf_supports(QT_F16));
    CHECK(!hc_mmf_supports(QT_BF16) && !hc_mmf_supports(QT_Q2_K) && !hc_mmf_supports(QT_F32));
    hc_weight w, w32;
    memset(&w, 0, sizeof w);
    memset(&w32, 0, sizeof w32);
    hc_gemv_scratch s;
    memset(&s, 0, sizeof s);
    float *d = NULL;
    void *q = calloc(1, 20 * qt_row_size(QT_Q8_0, 64));
    hn_status st = hc_weight_upload(&w, QT_Q8_0, 64, 20, q, &err);
    if (!st) st = hc_weight_upload(&w32, QT_Q8_0, 32, 20, q, &err); /* 32 values a row: not a whole step */
    if (!st) st = hc_gemv_scratch_init_rows(&s, 64, 20, &err);
    if (!st) st = hc_malloc((void **)&d, sizeof(float) * 64 * 21, &err);
    CHECKF(st == HN_OK, "mmf error buffers: %s", err.msg);
    if (!st) {
        CHECK(!hc_mmf_takes(&w32) && hc_mmf_takes(&w));
        CHECK(hc_mmf(&w32, d, 5, d, &s, 0, NULL, &err) == HN_ERR_UNSUPPORTED);
        CHECK(hc_mmf(&w, d, 0, d, &s, 0, NULL, &err) == HN_ERR_INVALID);
        CHECK(hc_mmf(&w, d, 21, d, &s, 0, NULL, &err) == HN_ERR_INVALID && strstr(err.msg, "scratch"));
        CHECK(hc_mmf(&w, d, 20, d, NULL, 0, NULL, &err) == HN_ERR_INVALID);
        CHECK(hc_mmf(&w, d, 20, d, &s, 0, NULL, &err) == HN_OK && hc_sync(&err) == HN_OK);
    }
    hc_free(d);
    hc_gemv_scratch_free(&s);
    hc_weight_free(&w);
    hc_weight_free(&w32);
    free(q);
}

/* hc_mmf_slots: an expert stack of MATS matrices, NS slots routed unevenly
 * (one expert past a 128-slot tile, one with none, two ids out of range),
 * shared (ks 4) and per-slot x: each written slot equals hc_mmf of its row
 * alone times its matrix uploaded alone, bit for bit; out-of-range slots are
 * left as they were */
static void test_slots(qt_type t, int64_t k, int64_t nr) {
    enum { MATS = 5, NS = 300 };
    const size_t rb = qt_row_size(t, k);
    float *wf = malloc(sizeof(float) * (size_t)(MATS * nr * k)), *x = malloc(sizeof(float) * (size_t)(NS * k));
    float *y = malloc(sizeof(float) * (size_t)(NS * nr)), *y1 = malloc(sizeof(float) * (size_t)nr);
    uint8_t *wq = malloc(rb * (size_t)(MATS * nr));
    int32_t ids[NS];
    hc_weight ws, w1[MATS];
    memset(&ws, 0, sizeof ws);
    memset(w1, 0, sizeof w1);
    hc_gemv_scratch s;
    memset(&s, 0, sizeof s);
    float *dx = NULL, *dy = NULL, *d1 = NULL;
    int32_t *dids = NULL;
    void *work = NULL;
    const size_t wb = hc_mmf_slots_work(NS, MATS);
    hn_err err;
    hn_status st = wf && x && y && y1 && wq ? HN_OK : HN_ERR_NOMEM;
    for (int q = 0; q < NS; q++) ids[q] = q < 150 ? 1 : (q * 7 + q / 5) % 4 == 3 ? 4 : (q * 7 + q / 5) % 4; /* no 3 */
    ids[17] = -1;
    ids[200] = MATS;
    for (int64_t i = 0; !st && i < MATS * nr * k; i++) wf[i] = 0.05f * test_gauss();
    for (int64_t i = 0; !st && i < NS * k; i++) x[i] = (1.0f + (float)(i / k % 5)) * test_gauss();
    if (!st) qt_traits(t)->from_float(wf, wq, MATS * nr * k);
    if (!st) st = hc_weight_upload(&ws, t, k, MATS * nr, wq, &err);
    for (int m = 0; m < MATS && !st; m++) st = hc_weight_upload(&w1[m], t, k, nr, wq + rb * (size_t)(m * nr), &err);
    if (!st) st = hc_gemv_scratch_init_rows(&s, k, NS, &err);
    if (!st) st = hc_malloc((void **)&dx, sizeof(float) * (size_t)(NS * k), &err);
    if (!st) st = hc_malloc((void **)&dy, sizeof(float) * (size_t)(NS * nr), &err);
    if (!st) st = hc_malloc((void **)&d1, sizeof(float) * (size_t)nr, &err);
    if (!st) st = hc_malloc((void **)&dids, sizeof ids, &err);
    if (!st) st = hc_malloc(&work, wb, &err);
    if (!st) st = hc_upload(dx, x, sizeof(float) * (size_t)(NS * k), &err);
    if (!st) st = hc_upload(dids, ids, sizeof ids, &err);
    CHECKF(!st && hc_mmf_slots_takes(&ws, nr, MATS), "slots %s: set-up: %s", qt_name(t), st ? err.msg : "not taken");
    for (int ks = 0; !st && ks <= 4; ks += 4) {
        st = hc_fill_f32(dy, (size_t)(NS * nr), 7.0f, &err);
        if (!st) st = hc_mmf_slots(&ws, nr, MATS, dx, NS, ks, dids, dy, &s, work, wb, NULL, &err);
        if (!st) st = hc_download(y, dy, sizeof(float) * (size_t)(NS * nr), &err);
        int bad = 0;
        for (int q = 0; q < NS && !st; q++) {
            const int r = ks ? q / ks : q;
            if (ids[q] < 0 || ids[q] >= MATS) {
                for (int64_t j = 0; j < nr; j++) bad += y[(size_t)q * (size_t)nr + (size_t)j] != 7.0f;
                continue;
            }
            st = hc_mmf(&w1[ids[q]], dx + (size_t)r * (size_t)k, 1, d1, &s, 0, NULL, &err);
            if (!st) st = hc_download(y1, d1, sizeof(float) * (size_t)nr, &err);
            if (!st) bad += memcmp(y1, y + (size_t)q * (size_t)nr, sizeof(float) * (size_t)nr) != 0;
        }
        CHECKF(!st && bad == 0, "slots %s %lldx%lld ks %d: %d slots differ from hc_mmf alone%s%s", qt_name(t),
               (long long)nr, (long long)k, ks, bad, st ? ": " : "", st ? err.msg : "");
    }
    /* refused: a small workspace, too many rows for the scratch, a shape that is not the stack's */
    CHECK(hc_mmf_slots(&ws, nr, MATS, dx, NS, 0, dids, dy, &s, work, wb - 4, NULL, &err) == HN_ERR_INVALID);
    CHECK(hc_mmf_slots(&ws, nr + 1, MATS, dx, NS, 0, dids, dy, &s, work, wb, NULL, &err) == HN_ERR_UNSUPPORTED);
    CHECK(hc_mmf_slots(&ws, nr, MATS, dx, NS + 1, 0, dids, dy, &s, work, hc_mmf_slots_work(NS + 1, MATS), NULL,
                       &err) == HN_ERR_INVALID);
    hc_weight_free(&ws);
    for (int m = 0; m < MATS; m++) hc_weight_free(&w1[m]);
    hc_gemv_scratch_free(&s);
    hc_free(dx);
    hc_free(dy);
    hc_free(d1);
    hc_free(dids);
    hc_free(work);
    free(wf);
    free(x);
    free(y);
    free(y1);
    free(wq);
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
    test_errors();
    static const qt_type types[] = {QT_Q4_0, QT_Q8_0, QT_Q4_K, QT_Q5_K, QT_Q6_K, QT_IQ4_XS, QT_MXFP4, QT_F16};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++) {
        const qt_type t = types[i];
        const qt_type_traits *tr = qt_traits(t);
        const bool kq = tr->blck_size == 256;
        const shape *sh = kq ? shapes_k : shapes_32;
        const int before = test_failed_;
        for (size_t j = 0; j < 3; j++) test_type(t, &sh[j], 1.0f);
        if (t != QT_F16) test_type(t, &sh[1], 1e-3f); /* small weights */
        printf("%-7s mmf: %s\n", tr->name, test_failed_ == before ? "ok" : "FAILED");
        if (t == QT_F16) {
            CHECK(!hc_mmf_slots_work(5, 0));
            continue;
        }
        const int b2 = test_failed_;
        test_slots(t, kq ? 2048 : 1088, 192);
        test_slots(t, kq ? 768 : 64, 70);
        printf("%-7s mmf slots = mmf of each row alone: %s\n", tr->name, test_failed_ == b2 ? "ok" : "FAILED");
    }
    TEST_DONE();
}
#endif
