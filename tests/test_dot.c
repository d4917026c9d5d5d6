/* test_dot.c: the CPU dot kernels.
 *
 * For every weight type the engine loads: the scalar reference against an
 * f64 dot of the dequantized rows (the quant module's to_float, written
 * independently), and every variant this CPU can run against the reference,
 * on rows made by the reference quantizer, on random block bytes (every code
 * and scale bit pattern), on all-max / all-min codes with saturated
 * activations, and with zero scales; at one block, several blocks and odd
 * block counts. The activation converters are checked against the exact
 * arithmetic the engine shares with llama.cpp (rounding ties included). */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/cpu/dot.h"
#include "core/alloc.h"
#include "quant/quant.h"
#include "test.h"

static float unif(void) { return (float)test_rnd() / 4294967296.0f; } /* [0,1) */

/* Where a block keeps its f16 scale fields (-1: none). */
typedef struct {
    qt_type t;
    int f16_off[2];
} type_info;

static const type_info k_types[] = {
    {QT_F32, {-1, -1}},
    {QT_F16, {-1, -1}},
    {QT_BF16, {-1, -1}},
    {QT_Q4_0, {offsetof(block_q4_0, d), -1}},
    {QT_Q4_1, {offsetof(block_q4_1, d), offsetof(block_q4_1, m)}},
    {QT_Q5_0, {offsetof(block_q5_0, d), -1}},
    {QT_Q5_1, {offsetof(block_q5_1, d), offsetof(block_q5_1, m)}},
    {QT_Q8_0, {offsetof(block_q8_0, d), -1}},
    {QT_Q2_K, {offsetof(block_q2_K, d), offsetof(block_q2_K, dmin)}},
    {QT_Q3_K, {offsetof(block_q3_K, d), -1}},
    {QT_Q4_K, {offsetof(block_q4_K, d), offsetof(block_q4_K, dmin)}},
    {QT_Q5_K, {offsetof(block_q5_K, d), offsetof(block_q5_K, dmin)}},
    {QT_Q6_K, {offsetof(block_q6_K, d), -1}},
    {QT_IQ4_NL, {offsetof(block_iq4_nl, d), -1}},
    {QT_IQ4_XS, {offsetof(block_iq4_xs, d), -1}},
    {QT_MXFP4, {-1, -1}},
};

enum { MODE_QUANT, MODE_BYTES, MODE_ZERO_SCALES, MODE_FF, MODE_00, MODE_80, MODE_COUNT };
static const char *k_mode_names[] = {"quantized", "random bytes", "zero scales", "bytes 0xff", "bytes 0x00", "bytes 0x80"};

static void set_f16(uint8_t *p, float v) {
    uint16_t h = qt_f32_to_f16(v);
    memcpy(p, &h, 2);
}

/* Fills a weight row of n elements in the given mode. */
static void make_weights(const type_info *ti, int mode, int64_t n, float *wf, void *w) {
    const qt_type_traits *tr = qt_traits(ti->t);
    for (int64_t i = 0; i < n; i++) wf[i] = test_gauss() * (test_rnd() % 16 == 0 ? 8.0f : 1.0f);
    if (mode == MODE_QUANT || !tr->is_quantized) {
        tr->from_float(wf, w, n);
        return;
    }
    size_t bytes = qt_row_size(ti->t, n);
    uint8_t *p = w;
    for (size_t i = 0; i < bytes; i++)
        p[i] = mode == MODE_FF ? 0xff : mode == MODE_00 ? 0x00 : mode == MODE_80 ? 0x80 : (uint8_t)test_rnd();
    int64_t nb = n / tr->blck_size;
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *blk = p + b * tr->type_size;
        if (ti->t == QT_MXFP4) {
            blk[0] = (uint8_t)(mode == MODE_ZERO_SCALES && b % 2 ? 0 : 120 + test_rnd() % 15);
            continue;
        }
        for (int k = 0; k < 2; k++) {
            if (ti->f16_off[k] < 0) continue;
            float v = (unif() - 0.5f) * 0.2f;
            if (mode == MODE_ZERO_SCALES && (b % 2 == 0 || k == 1)) v = 0;
            if (mode == MODE_FF || mode == MODE_00 || mode == MODE_80) v = k ? 0.05f : 0.1f;
            set_f16(blk + ti->f16_off[k], v);
        }
    }
}

/* Activations: gaussian, or saturated (every code +-127), with a zero block now and then. */
static void make_acts(int mode, int64_t n, float *x) {
    float sign = test_rnd() & 1 ? 1.0f : -1.0f;
    for (int64_t i = 0; i < n; i++) {
        if (mode >= MODE_FF) x[i] = sign * 3.0f;
        else x[i] = test_gauss();
    }
    if (mode == MODE_ZERO_SCALES && n >= 512)
        for (int64_t i = 256; i < 512; i++) x[i] = 0; /* a whole zero block of either size */
}

static float *g_wdq, *g_adq;

/* Checks the reference and every variant of one type on one (w, a) pair. */
static void check_pair(const type_info *ti, const char *mode, int64_t n, const void *w, const float *x, void *a) {
    const cpu_dot_kernel *ref = cpu_dot_ref(ti->t), *vars[8];
    ref->act(x, a, n);
    qt_traits(ti->t)->to_float(w, g_wdq, n);
    if (ref->act_type == QT_F32) memcpy(g_adq, a, (size_t)n * sizeof(float));
    else qt_traits(ref->act_type)->to_float(a, g_adq, n);
    double exact = 0, mag = 0, wmax = 0, asum = 0;
    for (int64_t i = 0; i < n; i++) {
        exact += (double)g_wdq[i] * g_adq[i];
        mag += fabs((double)g_wdq[i] * g_adq[i]);
        wmax = fmax(wmax, fabs(g_wdq[i]));
        asum += fabs(g_adq[i]);
    }
    /* Q8_1 activations (Q4_1, Q5_1 weights): the kernels take the min term from
     * the block's f16 s = d*sum(q), as llama.cpp does, not from the codes */
    if (ref->act_type == QT_Q8_1) {
        const qt_type_traits *tr = qt_traits(ti->t);
        const block_q8_1 *ab = a;
        for (int64_t b = 0; b < n / QK8_1; b++) {
            uint16_t mh;
            memcpy(&mh, (const uint8_t *)w + b * tr->type_size + ti->f16_off[1], 2);
            int sumq = 0;
            for (int j = 0; j < QK8_1; j++) sumq += ab[b].qs[j];
            exact += (double)qt_f16_to_f32(mh) *
                     ((double)qt_f16_to_f32(ab[b].s) - (double)qt_f16_to_f32(ab[b].d) * sumq);
        }
    }
    /* to_float rounds each weight to float: allow that, relative to the row's scale */
    double tol = 2e-6 * mag + 1e-6 * wmax * asum + 1e-30;
    float r = NAN;
    ref->dot(n, &r, w, a);
    CHECKF(fabs(r - exact) <= tol, "%s ref (%s, n=%lld): %.9g vs f64 %.9g (tol %.3g)", qt_name(ti->t), mode,
           (long long)n, r, exact, tol);
    int nv = cpu_dot_variants(ti->t, vars, 8);
    for (int v = 1; v < nv; v++) {
        float f = NAN;
        vars[v]->dot(n, &f, w, a);
        double vtol = 4e-6 * mag + 1e-6 * wmax * asum + 1e-30;
        CHECKF(fabs(f - r) <= vtol && vars[v]->act_type == ref->act_type && vars[v]->wtype == ti->t,
               "%s %s (%s, n=%lld): %.9g vs ref %.9g (tol %.3g)", qt_name(ti->t), vars[v]->isa, mode, (long long)n, f, r,
               vtol);
    }
}

/* The activation converters follow llama.cpp's arithmetic to the bit: on rows
 * that come from 4-bit embeddings, x = amax/2 lands on a tie (63.5), and only
 * the exact formula (q = round-half-even(x * (127/amax)), d = fp16(amax/127),
 * s = fp16(d * sum q)) gives llama.cpp's codes. The other natural formula,
 * x * (1 / (amax/127)), must differ on some of these rows, or this test could
 * not tell them apart. */
static void test_act_rounding(void) {
    const cpu_dot_kernel *k0 = cpu_dot_ref(QT_Q4_0), *k1 = cpu_dot_ref(QT_Q4_1), *kb = cpu_dot_ref(QT_BF16);
    CHECK(k0->act_type == QT_Q8_0 && k1->act_type == QT_Q8_1 && kb->act_type == QT_BF16);
    int bad0 = 0, bad1 = 0, other_differs = 0;
    for (int trial = 0; trial < 2000; trial++) {
        float x[QK8_0];
        float c = 0.001f + unif() * 0.1f, w = 0.5f + unif();
        for (int j = 0; j < QK8_0; j++) x[j] = (float)((int)(test_rnd() % 16) - 8) * c * w;
        x[test_rnd() % QK8_0] = -8.0f * c * w; /* amax = 8c*w, so 4c*w sits on a tie */
        float amax = 0;
        for (int j = 0; j < QK8_0; j++) amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f, id = 127.0f / amax, id_other = 1.0f / d;
        block_q8_0 q0;
        block_q8_1 q1;
        k0->act(x, &q0, QK8_0);
        k1->act(x, &q1, QK8_0);
        int sum = 0;
        bool ok0 = q0.d == qt_f32_to_f16(d), ok1 = q1.d == q0.d;
        for (int j = 0; j < QK8_0; j++) {
            int want = (int)lrintf(x[j] * id);
            ok0 = ok0 && q0.qs[j] == want;
            ok1 = ok1 && q1.qs[j] == want;
            sum += want;
            if ((int)lrintf(x[j] * id_other) != want) other_differs++;
        }
        ok1 = ok1 && q1.s == qt_f32_to_f16(d * (float)sum);
        bad0 += !ok0;
        bad1 += !ok1;
    }
    CHECKF(bad0 == 0 && bad1 == 0, "q8_0 / q8_1 codes follow 127/amax on ties: %d, %d blocks differ", bad0, bad1);
    CHECKF(other_differs > 0, "the tie rows tell the two inverse-scale formulas apart");
    /* bf16 activations: round to nearest even, quiet NaN */
    float xb[6] = {1.0f + 0x1p-8f, 1.0f + 0x3p-8f, -1.0f - 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-20f, 3.0e38f, NAN};
    uint16_t yb[6];
    kb->act(xb, yb, 6);
    CHECKF(yb[0] == 0x3f80 && yb[1] == 0x3f82 && yb[2] == 0xbf80 && yb[3] == 0x3f81 && yb[4] == qt_f32_to_bf16(3.0e38f) &&
               (yb[5] & 0x7fc0) == 0x7fc0,
           "bf16 activations: %04x %04x %04x %04x %04x", yb[0], yb[1], yb[2], yb[3], yb[5]);
}

/* Fills x[0..n) with one of the converter test patterns. */
static void act_pattern(int pat, float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float g = test_gauss();
        switch (pat) {
        case 0: x[i] = g; break;
        case 1: x[i] = (i / 32) % 3 == 1 ? 0.0f : g; break;                            /* zero blocks */
        case 2: x[i] = g * 1e37f * (test_rnd() % 8 == 0 ? 3.0f : 1.0f); break;              /* huge */
        case 3: x[i] = g * 1e-39f; break;                                               /* subnormal */
        case 4: x[i] = g * 1e-30f; break;                                               /* tiny */
        case 5: x[i] = (float)((int)(test_rnd() % 16) - 8) * 0.013f; break;                  /* ties (4-bit rows) */
        case 6: x[i] = test_rnd() % 4 ? (test_rnd() % 2 ? 2.5f : -2.5f) : g; break;               /* +-amax both present */
        case 7: x[i] = test_rnd() % 3 ? 0.0f : (test_rnd() % 2 ? -0.0f : g * 1e-42f); break;      /* signed zeros */
        case 8: x[i] = test_rnd() % 50 == 0 ? (test_rnd() % 2 ? INFINITY : NAN) : g; break;       /* inf and NaN */
        default: {
            /* any bit pattern but signaling NaNs: glibc's fmaxf propagates
             * those, and arithmetic never makes one */
            uint32_t u = test_rnd();
            if ((u & 0x7f800000) == 0x7f800000 && (u & 0x7fffff)) u |= 0x400000;
            memcpy(&x[i], &u, 4);
        }
        }
    }
}

/* Every SIMD converter writes the scalar converter's bytes, on every pattern
 * above, for row lengths of one block, several and odd counts. */
static void test_act_variants(void) {
    static const qt_type acts[] = {QT_BF16, QT_Q8_0, QT_Q8_1, QT_Q8_K};
    static const int64_t ns[] = {256, 512, 768, 1280, 4096};
    const int64_t max_n = 4096 + 64;
    float *x = hn_malloc(sizeof(float) * (size_t)max_n);
    uint8_t *want = hn_malloc((size_t)max_n * 4), *got = hn_malloc((size_t)max_n * 4);
    for (size_t ti = 0; ti < sizeof acts / sizeof acts[0]; ti++) {
        const cpu_act_kernel *v[8];
        int nv = cpu_act_variants(acts[ti], v, 8);
        CHECKF(nv >= 1 && !strcmp(v[0]->isa, "ref") && v[0]->act_type == acts[ti], "%s converters", qt_name(acts[ti]));
        /* the registry's converter for the type is one of them, so it is checked too */
        const cpu_dot_kernel *dk = cpu_dot_best(acts[ti] == QT_BF16 ? QT_BF16 : acts[ti] == QT_Q8_0 ? QT_Q8_0
                                                : acts[ti] == QT_Q8_1 ? QT_Q4_1 : QT_Q4_K);
        for (int pat = 0; pat < 10; pat++)
            for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
                for (int extra = 0; extra < (acts[ti] == QT_BF16 ? 3 : 1); extra++) {
                    int64_t n = ns[ni] + (extra == 1 ? 7 : extra == 2 ? 16 : 0); /* bf16 tails */
                    act_pattern(pat, x, n);
                    size_t bytes = qt_row_size(acts[ti], n);
                    memset(want, 0xa5, bytes);
                    v[0]->act(x, want, n);
                    for (int k = 1; k <= nv && k < 8; k++) {
                        cpu_act_fn fn = k < nv ? v[k]->act : dk->act;
                        memset(got, 0x5a, bytes);
                        fn(x, got, n);
                        size_t at = 0;
                        while (at < bytes && want[at] == got[at]) at++;
                        CHECKF(at == bytes, "%s %s pattern %d n=%lld: byte %zu differs (%02x vs ref %02x)", qt_name(acts[ti]),
                               k < nv ? v[k]->isa : "registry", pat, (long long)n, at, at < bytes ? got[at] : 0,
                               at < bytes ? want[at] : 0);
                    }
                }
    }
    const cpu_features *f = cpu_dot_features();
    const cpu_act_kernel *v[8];
    int nv = cpu_act_variants(QT_Q8_K, v, 8);
    CHECKF(nv == 1 + (f->avx2 && f->fma && f->f16c) + (f->avx2 && f->fma && f->f16c && f->avx512f && f->avx512bw) + f->neon,
           "q8_K converter variants: %d", nv);
    hn_free(x);
    hn_free(want);
    hn_free(got);
}

/* The quant module's f16 rows (the KV store's K/V conversion; SIMD where the
 * CPU has F16C) write qt_f32_to_f16's bits for every float, NaNs and
 * subnormals included, and widen every one of the 65536 halves as
 * qt_f16_to_f32 does. */
static void test_f16_rows(void) {
    enum { N = 4096 + 5 };
    float *x = hn_malloc(sizeof(float) * N), *back = hn_malloc(sizeof(float) * 65536);
    uint16_t *h = hn_malloc(2 * N), *all = hn_malloc(2 * 65536);
    const qt_type_traits *tr = qt_traits(QT_F16);
    int bad = 0;
    for (int trial = 0; trial < 64; trial++) {
        for (int i = 0; i < N; i++) {
            uint32_t u = test_rnd();
            if (trial % 4 == 1) u = (u & 0x807fffffu) | ((uint32_t)(100 + test_rnd() % 50) << 23); /* near the half range */
            if (trial % 4 == 2) u = (u & 0x80001fffu) | (0x33000000u + (test_rnd() % 16) * 0x00800000u); /* ties, subnormals */
            memcpy(&x[i], &u, 4);
        }
        if (trial == 0) {
            static const float edge[] = {65504.0f, 65519.99f, 65520.0f, -65520.0f, 0x1p-24f, 0x1p-25f, 0x1.8p-25f, 0x1p-26f,
                                         -0.0f, 0.0f, INFINITY, -INFINITY, NAN, -NAN};
            memcpy(x, edge, sizeof edge);
        }
        int64_t n = N - trial % 5;
        tr->from_float(x, h, n);
        for (int64_t i = 0; i < n; i++) bad += h[i] != qt_f32_to_f16(x[i]);
    }
    CHECKF(bad == 0, "f16 rows: %d halves differ from qt_f32_to_f16", bad);
    for (int i = 0; i < 65536; i++) all[i] = (uint16_t)i;
    tr->to_float(all, back, 65536);
    bad = 0;
    for (int i = 0; i < 65536; i++) {
        float want = qt_f16_to_f32((uint16_t)i);
        bad += memcmp(&want, &back[i], 4) != 0;
    }
    CHECKF(bad == 0, "f16 rows: %d halves widen differently", bad);
    hn_free(x);
    hn_free(back);
    hn_free(h);
    hn_free(all);
}

int main(void) {
    int sanitized = getenv("HONE_SANITIZED") != NULL;
    const int64_t max_n = 16 * 256 + 256;
    float *wf = hn_malloc(max_n * sizeof(float)), *x = hn_malloc(max_n * sizeof(float));
    g_wdq = hn_malloc(max_n * sizeof(float));
    g_adq = hn_malloc(max_n * sizeof(float));
    void *w = hn_malloc(max_n * 4), *a = hn_malloc(max_n * 4 + 1024);

    /* registry: every type has a reference first; variants agree on types */
    for (size_t i = 0; i < sizeof(k_types) / sizeof(k_types[0]); i++) {
        qt_type t = k_types[i].t;
        const cpu_dot_kernel *r = cpu_dot_ref(t), *b = cpu_dot_best(t), *v[8];
        int n = cpu_dot_variants(t, v, 8);
        CHECKF(r && b && n >= 1 && v[0] == r && !strcmp(r->isa, "ref") && r->wtype == t && b->wtype == t,
               "%s registry", qt_name(t));
        CHECKF(n == 1 || b == v[n - 1], "%s best is the last variant", qt_name(t));
    }
    CHECK(cpu_dot_ref(QT_I32) == NULL && cpu_dot_best(QT_I32) == NULL);
    CHECK(cpu_dot_variants(QT_IQ2_XXS, NULL, 0) == 0);
    const cpu_features *f = cpu_dot_features();
    CHECK(f == cpu_dot_features());
    printf("cpu: avx2=%d fma=%d f16c=%d avx512f=%d avx512bw=%d avx512vnni=%d avx_vnni=%d avx512bf16=%d neon=%d dotprod=%d "
           "i8mm=%d\n",
           f->avx2, f->fma, f->f16c, f->avx512f, f->avx512bw, f->avx512vnni, f->avx_vnni, f->avx512bf16, f->neon, f->dotprod,
           f->i8mm);
    static const qt_type fast[] = {QT_F32, QT_F16, QT_BF16, QT_Q4_0, QT_Q4_1, QT_Q5_0, QT_Q5_1, QT_Q8_0, QT_Q2_K,
                                   QT_Q3_K, QT_Q4_K, QT_Q5_K, QT_Q6_K, QT_IQ4_NL, QT_IQ4_XS, QT_MXFP4};
    if (f->avx2 && f->fma && f->f16c) {
        for (size_t i = 0; i < sizeof(fast) / sizeof(fast[0]); i++)
            CHECKF(!strcmp(cpu_dot_best(fast[i])->isa, "avx2"), "%s has an avx2 kernel", qt_name(fast[i]));
    }
    if (f->neon) { /* AArch64: the NEON kernels, and the dotprod build of them where the CPU has sdot */
        const char *want = f->dotprod ? "dotprod" : "neon";
        for (size_t i = 0; i < sizeof(fast) / sizeof(fast[0]); i++) {
            const cpu_dot_kernel *v[8];
            int nv = cpu_dot_variants(fast[i], v, 8);
            CHECKF(!strcmp(cpu_dot_best(fast[i])->isa, want) && nv == 2 + f->dotprod, "%s has a %s kernel (%d variants)",
                   qt_name(fast[i]), want, nv);
        }
    }

    test_act_rounding();
    test_act_variants();
    test_f16_rows();

    static const int nblocks[] = {1, 2, 3, 8, 17};
    static const int64_t float_ns[] = {1, 7, 8, 31, 32, 33, 100, 1024, 4097};
    int trials = sanitized ? 2 : 6;
    for (size_t ti = 0; ti < sizeof(k_types) / sizeof(k_types[0]); ti++) {
        const type_info *tinfo = &k_types[ti];
        const qt_type_traits *tr = qt_traits(tinfo->t);
        if (!tr->is_quantized) {
            for (size_t k = 0; k < sizeof(float_ns) / sizeof(float_ns[0]); k++)
                for (int trial = 0; trial < trials; trial++) {
                    int64_t n = float_ns[k];
                    make_weights(tinfo, MODE_QUANT, n, wf, w);
                    make_acts(MODE_QUANT, n, x);
                    check_pair(tinfo, "float", n, w, x, a);
                }
            continue;
        }
        for (int mode = 0; mode < MODE_COUNT; mode++)
            for (size_t k = 0; k < sizeof(nblocks) / sizeof(nblocks[0]); k++)
                for (int trial = 0; trial < trials; trial++) {
                    int64_t n = nblocks[k] * tr->blck_size;
                    if (n > max_n) continue;
                    make_weights(tinfo, mode, n, wf, w);
                    make_acts(mode, n, x);
                    check_pair(tinfo, k_mode_names[mode], n, w, x, a);
                }
    }

    /* a known value: Q8_0 of a ramp against itself is close to the sum of squares */
    for (int i = 0; i < 64; i++) x[i] = (float)(i - 32) / 8.0f;
    const cpu_dot_kernel *k8 = cpu_dot_best(QT_Q8_0);
    k8->act(x, w, 64);
    k8->act(x, a, 64);
    float s = 0;
    k8->dot(64, &s, w, a);
    double want = 0;
    for (int i = 0; i < 64; i++) want += (double)x[i] * x[i];
    CHECKF(fabs(s - want) < 0.01 * want, "q8_0 ramp %f vs %f", s, want);

    hn_free(wf);
    hn_free(x);
    hn_free(g_wdq);
    hn_free(g_adq);
    hn_free(w);
    hn_free(a);
    TEST_DONE();
}
