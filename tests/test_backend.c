/* test_backend.c: every CPU backend op against a naive scalar reference
 * written here in double precision: matmul (dot kernels and the dequantize
 * reference path, 1 and 2 threads, GEMV and GEMM row counts), grouped expert
 * matmul, paged attention (GQA, causal, sliding window, several sequences,
 * block boundaries), rope (normal and neox), rms_norm, swiglu, add/mul/bias,
 * routing, argmax (lowest index on ties), softmax and get_rows. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "backend/cpu/cpu.h"
#include "core/pool.h"
#include "kv/kv.h"
#include "quant/quant.h"
#include "test.h"

static uint32_t rng = 1;
static float frand(void) {
    rng = rng * 1664525u + 1013904223u;
    return (float)((rng >> 8) & 0xffff) / 65536.0f - 0.5f;
}

typedef struct {
    pool *p;
    be_backend *b;
} rig;

static void rig_open(rig *r, int nth) {
    hn_err e;
    pool_create(nth, &r->p, &e);
    be_cpu_create(r->p, &r->b, &e);
    be_limits l = {.max_rows = 64, .max_k = 512, .max_head_dim = 64, .max_group = 4, .max_experts = 8};
    if (r->b->ops->reserve(r->b, &l, &e)) fprintf(stderr, "reserve: %s\n", e.msg);
}

static void rig_close(rig *r) {
    be_free(r->b);
    pool_free(r->p);
}

/* ---- matmul ---- */

static void test_matmul(rig *r, qt_type t, int K, int N, int n, int n_mat) {
    const qt_type_traits *tr = qt_traits(t);
    size_t rb = qt_row_size(t, K);
    unsigned char *w = malloc(rb * (size_t)N * (size_t)n_mat);
    float *row = malloc(sizeof(float) * (size_t)K), *wf = malloc(sizeof(float) * (size_t)K * (size_t)N * (size_t)n_mat);
    for (int j = 0; j < N * n_mat; j++) {
        for (int i = 0; i < K; i++) row[i] = frand();
        if (t == QT_F32)
            memcpy(w + rb * (size_t)j, row, rb);
        else
            tr->from_float(row, w + rb * (size_t)j, K);
        if (t == QT_F32)
            memcpy(wf + (size_t)j * (size_t)K, row, rb);
        else
            tr->to_float(w + rb * (size_t)j, wf + (size_t)j * (size_t)K, K);
    }
    float *x = malloc(sizeof(float) * (size_t)K * (size_t)n), *y = malloc(sizeof(float) * (size_t)N * (size_t)n),
          *yr = malloc(sizeof(float) * (size_t)N * (size_t)n);
    for (int i = 0; i < K * n; i++) x[i] = frand() * 2;
    be_weight W = {.type = t, .ne = {K, N, n_mat}, .row_bytes = rb, .mat_bytes = rb * (size_t)N, .data = w};
    int mat = n_mat - 1;
    r->b->ops->matmul(r->b, &W, mat, x, n, y);
    be_cpu_force_reference(r->b, true);
    r->b->ops->matmul(r->b, &W, mat, x, n, yr);
    be_cpu_force_reference(r->b, false);
    double err_k = 0, err_r = 0, scale = 0;
    for (int q = 0; q < n; q++)
        for (int j = 0; j < N; j++) {
            double s = 0, a = 0;
            const float *wr = wf + ((size_t)mat * (size_t)N + (size_t)j) * (size_t)K;
            for (int i = 0; i < K; i++) {
                s += (double)wr[i] * x[(size_t)q * (size_t)K + (size_t)i];
                a += fabs((double)wr[i] * x[(size_t)q * (size_t)K + (size_t)i]);
            }
            size_t o = (size_t)q * (size_t)N + (size_t)j;
            if (fabs(y[o] - s) > err_k) err_k = fabs(y[o] - s);
            if (fabs(yr[o] - s) > err_r) err_r = fabs(yr[o] - s);
            if (a > scale) scale = a;
        }
    /* the reference path is f32 throughout; kernels may quantize activations to 8 bits */
    CHECKF(err_r <= 1e-5 * scale, "%s %dx%d n=%d: reference path error %g (scale %g)", qt_name(t), N, K, n, err_r, scale);
    CHECKF(err_k <= 2e-2 * scale, "%s %dx%d n=%d: kernel path error %g (scale %g)", qt_name(t), N, K, n, err_k, scale);

    /* grouped expert matmul equals one matmul per routed (row, slot) */
    if (n_mat > 1) {
        int k = 2;
        int32_t ids[64];
        for (int i = 0; i < n * k; i++) ids[i] = (int32_t)((i * 5 + i / 3) % n_mat);
        float *ym = malloc(sizeof(float) * (size_t)N * (size_t)n * (size_t)k), *y1 = malloc(sizeof(float) * (size_t)N);
        r->b->ops->moe_matmul(r->b, &W, x, true, n, k, ids, ym);
        int ok = 1;
        for (int i = 0; i < n * k; i++) {
            r->b->ops->matmul(r->b, &W, ids[i], x + (size_t)(i / k) * (size_t)K, 1, y1);
            for (int j = 0; j < N; j++) ok &= ym[(size_t)i * (size_t)N + (size_t)j] == y1[j];
        }
        CHECKF(ok, "%s: moe_matmul (shared x) equals per-slot matmuls", qt_name(t));
        /* per-slot inputs: x rows i (n*k of them); reuse x's first rows */
        if (n * k <= n * 2 && n >= 2) {
            int nn = n / 2;
            r->b->ops->moe_matmul(r->b, &W, x, false, nn, k, ids, ym);
            ok = 1;
            for (int i = 0; i < nn * k; i++) {
                r->b->ops->matmul(r->b, &W, ids[i], x + (size_t)i * (size_t)K, 1, y1);
                for (int j = 0; j < N; j++) ok &= ym[(size_t)i * (size_t)N + (size_t)j] == y1[j];
            }
            CHECKF(ok, "%s: moe_matmul (per-slot x) equals per-slot matmuls", qt_name(t));
        }
        free(ym);
        free(y1);
    }
    free(w);
    free(row);
    free(wf);
    free(x);
    free(y);
    free(yr);
}

/* ---- attention ---- */

static void test_attention(rig *r, int window, bool ref) {
    hn_err e;
    const int L = 2, HKV = 2, G = 3, H = HKV * G, HD = 16, BS = 4;
    kv_config c = {.n_layer = L, .n_head_kv = HKV, .head_dim = HD, .block_size = BS, .n_blocks = 32, .type = QT_F32};
    kv_cache *kv;
    CHECK(kv_create(&c, &kv, &e) == HN_OK);
    kv_seq s[2];
    int len[2] = {13, 6};
    for (int q = 0; q < 2; q++) {
        kv_seq_init(&s[q], kv, 64, &e);
        kv_seq_reserve(kv, &s[q], len[q], &e);
        for (int p = 0; p < len[q]; p++)
            for (int l = 0; l < L; l++)
                for (int i = 0; i < HKV * HD; i++) {
                    kv_k(kv, &s[q], l, p)[i] = frand() * 3;
                    kv_v(kv, &s[q], l, p)[i] = frand();
                }
    }
    /* queries: every position of both sequences, interleaved */
    int n = 0;
    int32_t pos[32];
    const kv_seq *seqs[32];
    for (int p = 0; p < 13; p++)
        for (int q = 0; q < 2; q++)
            if (p < len[q]) {
                pos[n] = p;
                seqs[n] = &s[q];
                n++;
            }
    float *qv = malloc(sizeof(float) * (size_t)n * H * HD), *out = malloc(sizeof(float) * (size_t)n * H * HD);
    for (int i = 0; i < n * H * HD; i++) qv[i] = frand() * 2;
    int layer = 1;
    be_attn_args a = {.q = qv, .out = out, .n_tokens = n, .n_head = H, .n_head_kv = HKV, .head_dim = HD,
                      .scale = 1.0f / sqrtf((float)HD), .window = window, .kv = kv, .layer = layer, .pos = pos, .seqs = seqs};
    be_cpu_force_reference(r->b, ref);
    r->b->ops->attention(r->b, &a);
    be_cpu_force_reference(r->b, false);
    double err = 0;
    for (int t = 0; t < n; t++)
        for (int h = 0; h < H; h++) {
            const float *qh = qv + ((size_t)t * H + h) * HD;
            int kvh = h / G, lo = window > 0 && pos[t] - window + 1 > 0 ? pos[t] - window + 1 : 0;
            double sc[32], mx = -1e300, sum = 0;
            for (int p = lo; p <= pos[t]; p++) {
                const float *k = kv_k(kv, seqs[t], layer, p) + kvh * HD;
                double d = 0;
                for (int i = 0; i < HD; i++) d += (double)qh[i] * k[i];
                sc[p] = d / sqrt((double)HD);
                if (sc[p] > mx) mx = sc[p];
            }
            for (int p = lo; p <= pos[t]; p++) sum += exp(sc[p] - mx);
            for (int i = 0; i < HD; i++) {
                double o = 0;
                for (int p = lo; p <= pos[t]; p++) o += exp(sc[p] - mx) / sum * kv_v(kv, seqs[t], layer, p)[kvh * HD + i];
                double d = fabs(o - out[((size_t)t * H + h) * HD + i]);
                if (d > err) err = d;
            }
        }
    CHECKF(err < 1e-5, "attention (window %d%s): max error %g", window, ref ? ", reference" : "", err);
    free(qv);
    free(out);
    kv_seq_free(&s[0], kv);
    kv_seq_free(&s[1], kv);
    kv_free(kv);
}

/* ---- small ops ---- */

static void test_small_ops(rig *r) {
    const be_ops *o = r->b->ops;
    /* rope */
    const int n = 9, H = 2, HD = 8, NR = 6;
    float x[9 * 2 * 8], x0[9 * 2 * 8];
    int32_t pos[9];
    for (int i = 0; i < n; i++) pos[i] = i * 37;
    for (int mode = 0; mode < 2; mode++) {
        for (int i = 0; i < n * H * HD; i++) x[i] = x0[i] = frand();
        o->rope(r->b, x, n, H, HD, NR, pos, 10000.0f, mode ? BE_ROPE_NEOX : BE_ROPE_NORM);
        double err = 0;
        for (int t = 0; t < n; t++)
            for (int h = 0; h < H; h++) {
                const float *a = x0 + ((size_t)t * H + h) * HD;
                const float *b = x + ((size_t)t * H + h) * HD;
                for (int i = 0; i < NR / 2; i++) {
                    double th = pos[t] * pow(10000.0, -2.0 * i / NR);
                    int i0 = mode ? i : 2 * i, i1 = mode ? i + NR / 2 : 2 * i + 1;
                    double r0 = a[i0] * cos(th) - a[i1] * sin(th), r1 = a[i0] * sin(th) + a[i1] * cos(th);
                    err = fmax(err, fmax(fabs(r0 - b[i0]), fabs(r1 - b[i1])));
                }
                for (int i = NR; i < HD; i++) err = fmax(err, fabs(a[i] - b[i]));
            }
        CHECKF(err < 1e-4, "rope %s: error %g", mode ? "neox" : "normal", err);
    }
    /* rms_norm (in place, with weight) */
    float v[3 * 16], v0[3 * 16], w[16];
    for (int i = 0; i < 48; i++) v[i] = v0[i] = frand() * 4;
    for (int i = 0; i < 16; i++) w[i] = 1 + frand();
    o->rms_norm(r->b, v, w, 3, 16, 1e-6f, v);
    double err = 0;
    for (int q = 0; q < 3; q++) {
        double ss = 0;
        for (int i = 0; i < 16; i++) ss += (double)v0[q * 16 + i] * v0[q * 16 + i];
        double sc = 1 / sqrt(ss / 16 + 1e-6);
        for (int i = 0; i < 16; i++) err = fmax(err, fabs(v0[q * 16 + i] * sc * w[i] - v[q * 16 + i]));
    }
    CHECKF(err < 1e-5, "rms_norm error %g", err);
    /* swiglu, add, mul, add_bias */
    float g[40], u[40], y[40];
    for (int i = 0; i < 40; i++) {
        g[i] = frand() * 8;
        u[i] = frand();
    }
    o->swiglu(r->b, g, u, y, 40);
    err = 0;
    for (int i = 0; i < 40; i++) err = fmax(err, fabs(g[i] / (1 + exp(-g[i])) * u[i] - y[i]));
    CHECKF(err < 1e-6, "swiglu error %g", err);
    o->add(r->b, g, u, y, 40);
    CHECK(y[7] == g[7] + u[7]);
    o->mul(r->b, g, u, y, 40);
    CHECK(y[9] == g[9] * u[9]);
    memcpy(y, g, sizeof y);
    o->add_bias(r->b, y, u, 4, 10);
    CHECK(y[23] == g[23] + u[3]);
    /* routing: top-2 of 5 by softmax, normalised; ties go to the lower id */
    float lg[2 * 5] = {0.1f, 2.0f, -1.0f, 2.0f, 0.5f, 3, 1, 1, 1, 3};
    int32_t ids[4];
    float wt[4];
    o->moe_route(r->b, lg, 2, 5, 2, ids, wt);
    CHECKF(ids[0] == 1 && ids[1] == 3 && fabsf(wt[0] - 0.5f) < 1e-6f && fabsf(wt[1] - 0.5f) < 1e-6f, "route row 0: %d %d %g %g",
           ids[0], ids[1], wt[0], wt[1]);
    CHECK(ids[2] == 0 && ids[3] == 4 && fabsf(wt[2] + wt[3] - 1) < 1e-6f);
    /* argmax and softmax */
    float am[6] = {1, 5, 2, 5, -1, 0};
    CHECK(o->argmax(r->b, am, 6) == 1);
    o->softmax(r->b, am, 6);
    double sum = 0;
    for (int i = 0; i < 6; i++) sum += am[i];
    CHECK(fabs(sum - 1) < 1e-6 && am[1] == am[3] && am[1] > am[2]);
    /* get_rows from a q8_0 table */
    size_t rb = qt_row_size(QT_Q8_0, 64);
    unsigned char tab[4 * 68];
    float row[64], got[2 * 64], want[64];
    for (int j = 0; j < 4; j++) {
        for (int i = 0; i < 64; i++) row[i] = frand();
        qt_traits(QT_Q8_0)->from_float(row, tab + rb * (size_t)j, 64);
    }
    be_weight T = {.type = QT_Q8_0, .ne = {64, 4, 1}, .row_bytes = rb, .mat_bytes = rb * 4, .data = tab};
    int32_t gi[2] = {3, 1};
    o->get_rows(r->b, &T, gi, 2, got);
    qt_traits(QT_Q8_0)->to_float(tab + rb * 1, want, 64);
    CHECK(!memcmp(got + 64, want, sizeof want));
}

/* matmul_multi equals separate matmuls (weights sharing an act type, and not) */
static void test_multi(rig *r) {
    static const qt_type ts[4] = {QT_Q4_K, QT_Q6_K, QT_Q8_0, QT_F16};
    const int K = 256, n = 3;
    int N[4] = {40, 24, 64, 8};
    unsigned char *w[4];
    be_weight W[4];
    float row[256], x[3 * 256], *y[4], *ys[4];
    for (int q = 0; q < 4; q++) {
        size_t rb = qt_row_size(ts[q], K);
        w[q] = malloc(rb * (size_t)N[q]);
        for (int j = 0; j < N[q]; j++) {
            for (int i = 0; i < K; i++) row[i] = frand();
            qt_traits(ts[q])->from_float(row, w[q] + rb * (size_t)j, K);
        }
        W[q] = (be_weight){.type = ts[q], .ne = {K, N[q], 1}, .row_bytes = rb, .mat_bytes = rb * (size_t)N[q], .data = w[q]};
        y[q] = malloc(sizeof(float) * (size_t)N[q] * n);
        ys[q] = malloc(sizeof(float) * (size_t)N[q] * n);
    }
    for (int i = 0; i < K * n; i++) x[i] = frand();
    const be_weight *wp[4] = {&W[0], &W[1], &W[2], &W[3]};
    r->b->ops->matmul_multi(r->b, 4, wp, x, n, y);
    int ok = 1;
    for (int q = 0; q < 4; q++) {
        r->b->ops->matmul(r->b, &W[q], 0, x, n, ys[q]);
        ok &= !memcmp(y[q], ys[q], sizeof(float) * (size_t)N[q] * n);
        free(w[q]);
        free(y[q]);
        free(ys[q]);
    }
    CHECKF(ok, "matmul_multi equals separate matmuls");
}

int main(void) {
    static const qt_type types[] = {QT_F32, QT_F16, QT_BF16, QT_Q8_0, QT_Q4_0, QT_Q4_1, QT_Q5_0, QT_Q5_1, QT_Q4_K,
                                    QT_Q5_K, QT_Q6_K, QT_Q3_K, QT_Q2_K, QT_IQ4_NL, QT_IQ4_XS};
    for (int nth = 1; nth <= 2; nth++) {
        rig r;
        rig_open(&r, nth);
        for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
            test_matmul(&r, types[i], 512, 96, 1, 1);
            test_matmul(&r, types[i], 256, 64, 37, 1);
            test_matmul(&r, types[i], 256, 48, 6, 3);
        }
        test_attention(&r, 0, false);
        test_attention(&r, 5, false);
        test_attention(&r, 3, true);
        test_small_ops(&r);
        test_multi(&r);
        rig_close(&r);
    }
    TEST_DONE();
}
