/* test_quant.c: the quant module. Static sizes and names; IEEE half/bfloat16
 * conversions (exhaustive over half, against an independent nearest-value
 * search for f32 -> f16, edge cases); quantize/dequantize round trips with
 * per-type error bounds; and the evidence that the reference quantizers are
 * llama.cpp's: every tensor of the shared llama.cpp-quantized models is
 * re-quantized from the f32 model it was made from and compared byte for byte,
 * and every tensor of every shared model dequantizes to finite values. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/alloc.h"
#include "gguf/gguf.h"
#include "quant/quant.h"
#include "test.h"

/* ---- sizes and names ---- */

static void test_traits(void) {
    static const struct { qt_type t; const char *name; int64_t blck; size_t size; } want[] = {
        {QT_F32, "f32", 1, 4}, {QT_F16, "f16", 1, 2}, {QT_BF16, "bf16", 1, 2},
        {QT_Q4_0, "q4_0", 32, 18}, {QT_Q4_1, "q4_1", 32, 20}, {QT_Q5_0, "q5_0", 32, 22},
        {QT_Q5_1, "q5_1", 32, 24}, {QT_Q8_0, "q8_0", 32, 34}, {QT_Q8_1, "q8_1", 32, 36},
        {QT_Q2_K, "q2_K", 256, 84}, {QT_Q3_K, "q3_K", 256, 110}, {QT_Q4_K, "q4_K", 256, 144},
        {QT_Q5_K, "q5_K", 256, 176}, {QT_Q6_K, "q6_K", 256, 210}, {QT_Q8_K, "q8_K", 256, 292},
        {QT_IQ4_NL, "iq4_nl", 32, 18}, {QT_IQ4_XS, "iq4_xs", 256, 136}, {QT_MXFP4, "mxfp4", 32, 17},
        {QT_IQ2_XXS, "iq2_xxs", 256, 66}, {QT_IQ2_XS, "iq2_xs", 256, 74}, {QT_IQ3_XXS, "iq3_xxs", 256, 98},
        {QT_IQ1_S, "iq1_s", 256, 50}, {QT_IQ3_S, "iq3_s", 256, 110}, {QT_IQ2_S, "iq2_s", 256, 82},
        {QT_IQ1_M, "iq1_m", 256, 56}, {QT_TQ1_0, "tq1_0", 256, 54}, {QT_TQ2_0, "tq2_0", 256, 66},
        {QT_I8, "i8", 1, 1}, {QT_I16, "i16", 1, 2}, {QT_I32, "i32", 1, 4}, {QT_I64, "i64", 1, 8},
        {QT_F64, "f64", 1, 8},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const qt_type_traits *tr = qt_traits(want[i].t);
        CHECKF(tr != NULL, "traits of %s", want[i].name);
        if (!tr) continue;
        CHECKF(!strcmp(tr->name, want[i].name), "name %s vs %s", tr->name, want[i].name);
        CHECKF(tr->blck_size == want[i].blck && tr->type_size == want[i].size, "%s size", want[i].name);
        CHECKF(tr->is_quantized == (want[i].blck > 1), "%s is_quantized", want[i].name);
        qt_type back;
        CHECKF(qt_from_name(want[i].name, &back) && back == want[i].t, "from_name %s", want[i].name);
        CHECK(qt_row_size(want[i].t, want[i].blck * 3) == 3 * want[i].size);
    }
    /* block structs agree with the table */
    CHECK(qt_traits(QT_Q4_K)->type_size == sizeof(block_q4_K));
    CHECK(qt_traits(QT_Q8_K)->type_size == sizeof(block_q8_K));
    CHECK(qt_traits(QT_IQ4_XS)->type_size == sizeof(block_iq4_xs));
    /* retired / unknown ids */
    CHECK(qt_traits((qt_type)4) == NULL && qt_traits((qt_type)5) == NULL && qt_traits((qt_type)31) == NULL);
    CHECK(qt_traits(QT_TYPE_COUNT) == NULL && qt_traits((qt_type)-1) == NULL);
    CHECK(!strcmp(qt_name((qt_type)4), "unknown"));
    qt_type t;
    CHECK(qt_from_name("Q4_K", &t) && t == QT_Q4_K);
    CHECK(qt_from_name("IQ4_XS", &t) && t == QT_IQ4_XS);
    CHECK(!qt_from_name("q4_k_m", &t) && !qt_from_name("", &t) && !qt_from_name("q4", &t));
    CHECK(qt_row_size(QT_Q4_K, 255) == 0 && qt_row_size(QT_Q4_0, 33) == 0 && qt_row_size(QT_F32, 7) == 28);
    /* vec_dot types as the CPU kernels expect them */
    CHECK(qt_traits(QT_Q4_0)->vec_dot_type == QT_Q8_0 && qt_traits(QT_Q4_1)->vec_dot_type == QT_Q8_1);
    CHECK(qt_traits(QT_Q5_K)->vec_dot_type == QT_Q8_K && qt_traits(QT_IQ4_NL)->vec_dot_type == QT_Q8_0);
    CHECK(qt_traits(QT_IQ4_XS)->vec_dot_type == QT_Q8_K && qt_traits(QT_BF16)->vec_dot_type == QT_BF16);
}

/* ---- half and bfloat16 ---- */

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* positive finite halves in increasing order (0x0000..0x7bff), as doubles */
static double half_val[0x7c00];

/* Independent f32 -> f16: nearest half by bisection over all halves, ties to the even pattern. */
static uint16_t f16_by_search(float f) {
    uint16_t sign = (bits_of(f) >> 16) & 0x8000;
    double a = fabs((double)f);
    if (a >= 65520.0) return sign | 0x7c00; /* half-way to 65536 and up -> inf (65504 is odd) */
    int lo = 0, hi = 0x7bff;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (half_val[mid] <= a) lo = mid;
        else hi = mid;
    }
    if (a >= half_val[hi]) return sign | (uint16_t)hi;
    double dl = a - half_val[lo], dh = half_val[hi] - a;
    int pick = dl < dh ? lo : dh < dl ? hi : (lo % 2 == 0 ? lo : hi);
    return sign | (uint16_t)pick;
}

static void test_f16(void) {
    /* every half converts to f32 and back unchanged (NaN stays NaN) */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = qt_f16_to_f32((uint16_t)h);
        bool nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
        if (nan) {
            if (!isnan(f) || qt_f32_to_f16(f) != ((h & 0x8000) | 0x7e00)) bad++;
        } else if (qt_f32_to_f16(f) != h) {
            bad++;
        }
    }
    CHECKF(bad == 0, "%d halves do not round-trip", bad);
    for (int h = 0; h < 0x7c00; h++) half_val[h] = (double)qt_f16_to_f32((uint16_t)h);
    CHECK(half_val[1] == ldexp(1, -24) && half_val[0x3ff] == ldexp(1023, -24) && half_val[0x3c00] == 1.0);
    CHECK(half_val[0x7bff] == 65504.0);

    /* f32 -> f16 against the search, over a stride through all bit patterns */
    bad = 0;
    uint64_t step = getenv("HONE_SANITIZED") ? 40009 : 2003;
    for (uint64_t u = 0; u < (1ull << 32); u += step) {
        float f = float_of((uint32_t)u);
        if (isnan(f)) continue;
        if (qt_f32_to_f16(f) != f16_by_search(f)) bad++;
    }
    CHECKF(bad == 0, "%d f32 values round differently from the nearest-half search", bad);

    /* the edges */
    CHECK(qt_f32_to_f16(0.0f) == 0x0000 && qt_f32_to_f16(-0.0f) == 0x8000);
    CHECK(qt_f32_to_f16(1.0f) == 0x3c00 && qt_f32_to_f16(-2.0f) == 0xc000);
    CHECK(qt_f32_to_f16(65504.0f) == 0x7bff && qt_f32_to_f16(65519.99f) == 0x7bff);
    CHECK(qt_f32_to_f16(65520.0f) == 0x7c00 && qt_f32_to_f16(-1e10f) == 0xfc00);
    CHECK(qt_f32_to_f16(INFINITY) == 0x7c00 && qt_f32_to_f16(-INFINITY) == 0xfc00);
    CHECK(qt_f32_to_f16(NAN) == 0x7e00 && (qt_f32_to_f16(-NAN) & 0x7fff) == 0x7e00);
    CHECK(qt_f32_to_f16(0x1p-24f) == 0x0001 && qt_f32_to_f16(0x1p-25f) == 0x0000);        /* tie -> even 0 */
    CHECK(qt_f32_to_f16(0x1.000002p-25f) == 0x0001);                                      /* just above the tie */
    CHECK(qt_f32_to_f16(0x3p-25f) == 0x0002 && qt_f32_to_f16(0x5p-25f) == 0x0002);         /* 1.5, 2.5 ulp */
    CHECK(qt_f32_to_f16(0x1p-14f) == 0x0400 && qt_f32_to_f16(0x1.ffcp-15f) == 0x0400);    /* tie above the largest subnormal -> even */
    CHECK(qt_f32_to_f16(0x1.ff8p-15f) == 0x03ff && qt_f32_to_f16(0x1.ffbffep-15f) == 0x03ff);
    CHECK(qt_f32_to_f16(1.0f + 0x1p-11f) == 0x3c00 && qt_f32_to_f16(1.0f + 0x3p-11f) == 0x3c02);
    CHECK(qt_f16_to_f32(0x7c00) == INFINITY && qt_f16_to_f32(0xfc00) == -INFINITY);
    CHECK(isnan(qt_f16_to_f32(0x7e00)) && isnan(qt_f16_to_f32(0x7c01)));
    CHECK(qt_f16_to_f32(0x8001) == -0x1p-24f && qt_f16_to_f32(0x3555) == 0x1.554p-2f);
}

static void test_bf16(void) {
    CHECK(qt_f32_to_bf16(1.0f) == 0x3f80 && qt_bf16_to_f32(0x3f80) == 1.0f);
    CHECK(qt_f32_to_bf16(float_of(0x3f808000)) == 0x3f80); /* tie, even stays */
    CHECK(qt_f32_to_bf16(float_of(0x3f818000)) == 0x3f82); /* tie, odd rounds up */
    CHECK(qt_f32_to_bf16(float_of(0x3f808001)) == 0x3f81);
    CHECK(qt_f32_to_bf16(float_of(0x7f7fffff)) == 0x7f80); /* max float rounds to inf */
    CHECK(qt_f32_to_bf16(INFINITY) == 0x7f80 && qt_f32_to_bf16(-INFINITY) == 0xff80);
    CHECK(qt_f32_to_bf16(float_of(0x7f800001)) == 0x7fc0); /* signalling NaN made quiet */
    CHECK(qt_f32_to_bf16(float_of(0xffc12345)) == 0xffc1);
    CHECK(qt_f32_to_bf16(float_of(0x00010000)) == 0x0001); /* subnormals kept */
    CHECK(qt_f32_to_bf16(-0.0f) == 0x8000);
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = qt_bf16_to_f32((uint16_t)h);
        if (bits_of(f) != h << 16) bad++;
        if (!isnan(f) && qt_f32_to_bf16(f) != h) bad++;
    }
    CHECKF(bad == 0, "%d bf16 values do not round-trip", bad);
}

/* ---- round trips on synthetic data ---- */

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double urand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}
static float grand(void) { return (float)(sqrt(-2 * log(urand() + 1e-300)) * cos(6.283185307179586 * urand())); }

static void test_round_trips(void) {
    /* bound on rmse / rms for gaussian data */
    static const struct { qt_type t; double bound; } types[] = {
        {QT_F32, 0}, {QT_F16, 1e-3}, {QT_BF16, 5e-3}, {QT_Q8_0, 0.01}, {QT_Q8_1, 0.01}, {QT_Q8_K, 0.01},
        {QT_Q6_K, 0.03}, {QT_Q5_0, 0.07}, {QT_Q5_1, 0.07}, {QT_Q5_K, 0.06}, {QT_Q4_0, 0.14},
        {QT_Q4_1, 0.14}, {QT_Q4_K, 0.12}, {QT_IQ4_NL, 0.12}, {QT_IQ4_XS, 0.12}, {QT_MXFP4, 0.2},
        {QT_Q3_K, 0.25}, {QT_Q2_K, 0.45},
    };
    enum { N = 4096 };
    static float x[N], y[N];
    static uint8_t q[N * 4];
    for (int i = 0; i < N; i++) x[i] = grand() * 0.02f;
    double rms = 0;
    for (int i = 0; i < N; i++) rms += (double)x[i] * x[i];
    rms = sqrt(rms / N);
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        const qt_type_traits *tr = qt_traits(types[k].t);
        CHECKF(tr && tr->from_float && tr->to_float, "%s converts", qt_name(types[k].t));
        if (!tr || !tr->from_float || !tr->to_float) continue;
        tr->from_float(x, q, N);
        tr->to_float(q, y, N);
        double e = 0;
        for (int i = 0; i < N; i++) e += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
        e = sqrt(e / N) / rms;
        CHECKF(e <= types[k].bound, "%s relative rmse %.4f > %.4f", tr->name, e, types[k].bound);
        /* an all-zero row stays exactly zero, a constant row stays near constant */
        float z[512] = {0}, zy[512];
        uint8_t zq[2048];
        tr->from_float(z, zq, 512);
        tr->to_float(zq, zy, 512);
        int nz = 0;
        for (int i = 0; i < 512; i++) nz += zy[i] != 0.0f;
        CHECKF(nz == 0, "%s: zero row dequantizes to %d non-zeros", tr->name, nz);
        for (int i = 0; i < 512; i++) z[i] = 0.5f;
        tr->from_float(z, zq, 512);
        tr->to_float(zq, zy, 512);
        double worst = 0;
        for (int i = 0; i < 512; i++) worst = fmax(worst, fabs(zy[i] - 0.5));
        CHECKF(worst < 0.05, "%s: constant row off by %g", tr->name, worst);
    }
    /* q8_1 keeps s = d * sum(q); q8_K keeps the 16-element sums */
    block_q8_1 b1[N / 32];
    qt_traits(QT_Q8_1)->from_float(x, b1, N);
    int bad = 0;
    for (int i = 0; i < N / 32; i++) {
        int sum = 0;
        for (int j = 0; j < 32; j++) sum += b1[i].qs[j];
        if (fabsf(qt_f16_to_f32(b1[i].s) - sum * qt_f16_to_f32(b1[i].d)) > 1e-3f * (1 + fabsf((float)sum) * qt_f16_to_f32(b1[i].d))) bad++;
    }
    CHECK(bad == 0);
    static block_q8_K bk[N / 256];
    qt_traits(QT_Q8_K)->from_float(x, bk, N);
    bad = 0;
    for (int i = 0; i < N / 256; i++)
        for (int j = 0; j < 16; j++) {
            int sum = 0;
            for (int l = 0; l < 16; l++) sum += bk[i].qs[16 * j + l];
            if (sum != bk[i].bsums[j]) bad++;
        }
    CHECK(bad == 0);
    /* hand-made q4_0 block decodes as d * (q - 8) */
    block_q4_0 b = {qt_f32_to_f16(0.5f), {0}};
    for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)(j | ((15 - j) << 4));
    float out[32];
    qt_traits(QT_Q4_0)->to_float(&b, out, 32);
    CHECK(out[0] == -4.0f && out[15] == 3.5f && out[16] == 3.5f && out[31] == -4.0f);
    /* q4_0 of a known block: max magnitude -8 maps to code 0, d = 1 */
    float in[32];
    for (int j = 0; j < 32; j++) in[j] = (float)(j % 16) - 8.0f;
    qt_traits(QT_Q4_0)->from_float(in, &b, 32);
    CHECK(b.d == qt_f32_to_f16(1.0f) && b.qs[0] == 0x00 && b.qs[15] == 0xff);
}

/* ---- byte identity with llama.cpp on the shared models ---- */

static int64_t n_elems(const gguf_tensor *t) { return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]; }

/* Re-quantizes every tensor of quant_file from the f32 tensor of the same name in
 * src and counts tensors whose bytes differ. Also checks token_embd's type. */
static void check_identity(const char *src_file, const char *quant_file) {
    char p1[512], p2[512];
    gguf_ctx *src = NULL, *q = NULL;
    hn_err err;
    if (gguf_open(test_data_path(p1, sizeof p1, src_file), &src, &err) != HN_OK ||
        gguf_open(test_data_path(p2, sizeof p2, quant_file), &q, &err) != HN_OK) {
        CHECKF(0, "open %s / %s: %s", src_file, quant_file, err.msg);
        gguf_close(src);
        gguf_close(q);
        return;
    }
    int64_t n = gguf_n_tensors(q), same = 0, quantized = 0;
    for (int64_t i = 0; i < n; i++) {
        const gguf_tensor *t = gguf_tensor_at(q, i);
        const gguf_tensor *s = gguf_find_tensor(src, t->name);
        const qt_type_traits *tr = qt_traits(t->type);
        CHECKF(s && s->type == QT_F32 && tr && tr->from_float, "%s: %s has no f32 source or quantizer", quant_file, t->name);
        if (!s || s->type != QT_F32 || !tr || !tr->from_float) continue;
        int64_t ne = n_elems(t);
        CHECKF(ne == n_elems(s) && s->ne[0] == t->ne[0], "%s: %s shape", quant_file, t->name);
        if (ne != n_elems(s) || s->ne[0] != t->ne[0]) continue;
        size_t nbytes = qt_row_size(t->type, t->ne[0]) * (size_t)(ne / t->ne[0]);
        CHECK(nbytes == t->nbytes);
        uint8_t *buf = hn_malloc(nbytes);
        tr->from_float(s->data, buf, ne);
        bool eq = nbytes == t->nbytes && !memcmp(buf, t->data, nbytes);
        if (!eq) {
            size_t k = 0;
            while (k < nbytes && buf[k] == ((const uint8_t *)t->data)[k]) k++;
            fprintf(stderr, "  %s %s (%s): first differing byte %zu of %zu\n", quant_file, t->name, tr->name, k, nbytes);
        }
        same += eq;
        quantized += tr->is_quantized;
        hn_free(buf);
    }
    CHECKF(same == n, "%s: %lld of %lld tensors byte-identical", quant_file, (long long)same, (long long)n);
    CHECKF(quantized > 0 || strstr(quant_file, "f16"), "%s has quantized tensors", quant_file);
    printf("ok %-22s %lld/%lld tensors byte-identical (%lld quantized)\n", quant_file,
           (long long)same, (long long)n, (long long)quantized);
    gguf_close(src);
    gguf_close(q);
}

/* Dequantizes every tensor of a file; all values must be finite. */
static void check_dequant_file(const char *file) {
    char path[512];
    gguf_ctx *g = NULL;
    hn_err err;
    if (gguf_open(test_data_path(path, sizeof path, file), &g, &err) != HN_OK) {
        CHECKF(0, "open %s: %s", file, err.msg);
        return;
    }
    int64_t n = gguf_n_tensors(g), ok = 0;
    for (int64_t i = 0; i < n; i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        const qt_type_traits *tr = qt_traits(t->type);
        if (!tr || !tr->to_float) {
            CHECKF(0, "%s: %s type %d cannot be dequantized", file, t->name, (int)t->type);
            continue;
        }
        int64_t ne = n_elems(t);
        float *y = hn_malloc((size_t)ne * sizeof(float));
        tr->to_float(t->data, y, ne);
        int64_t bad = 0;
        for (int64_t k = 0; k < ne; k++) bad += !isfinite(y[k]);
        ok += bad == 0;
        hn_free(y);
    }
    CHECKF(ok == n, "%s: %lld of %lld tensors dequantize to finite values", file, (long long)ok, (long long)n);
    gguf_close(g);
}

static void test_files(void) {
    static const char *llama[] = {"q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k_m", "q4_k_m",
                                  "q5_k_m", "q6_k", "iq4_nl", "iq4_xs", "f16", "bf16"};
    for (size_t i = 0; i < sizeof llama / sizeof llama[0]; i++) {
        char name[64];
        snprintf(name, sizeof name, "data/models/llama-2k-%s.gguf", llama[i]);
        check_identity("data/models/llama-2k-f32.gguf", name);
    }
    check_identity("data/models/qwen3-2k-f32.gguf", "data/models/qwen3-2k-q8_0.gguf");
    check_identity("data/models/qwen3-2k-f32.gguf", "data/models/qwen3-2k-q4_k_m.gguf");

    static const char *all[] = {
        "llama-2k-f32", "llama-2k-f16", "llama-2k-bf16", "llama-2k-q8_0", "llama-2k-q4_0", "llama-2k-q4_1",
        "llama-2k-q5_0", "llama-2k-q5_1", "llama-2k-q2_k", "llama-2k-q3_k_m", "llama-2k-q4_k_m",
        "llama-2k-q5_k_m", "llama-2k-q6_k", "llama-2k-iq4_nl", "llama-2k-iq4_xs", "qwen2-2k-f16",
        "qwen2-2k-q8_0", "qwen3-2k-f16", "qwen3-2k-f32", "qwen3-2k-q4_k_m", "qwen3-2k-q8_0",
        "qwen3-real-q8_0", "qwen3moe-2k-f16", "qwen3moe-2k-mxfp4_moe", "qwen3moe-2k-q4_k_m", "qwen3moe-2k-q8_0",
    };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        char name[96];
        snprintf(name, sizeof name, "data/models/%s.gguf", all[i]);
        check_dequant_file(name);
    }
}

int main(void) {
    test_traits();
    test_f16();
    test_bf16();
    test_round_trips();
    test_files();
    TEST_DONE();
}
