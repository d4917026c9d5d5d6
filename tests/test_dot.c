/* test_dot.c: the CPU dot-kernel registry and kernels (first cut: registry
 * coverage and the plain types; per-type checks against dequantized rows
 * follow once the quant module's to_float lands). */
#include <math.h>
#include <stdint.h>

#include "backend/cpu/dot.h"
#include "test.h"

static const qt_type k_types[] = {QT_F32,  QT_F16,  QT_BF16, QT_Q4_0, QT_Q4_1,   QT_Q5_0,   QT_Q5_1, QT_Q8_0,
                                  QT_Q2_K, QT_Q3_K, QT_Q4_K, QT_Q5_K, QT_Q6_K, QT_IQ4_NL, QT_IQ4_XS, QT_MXFP4};

int main(void) {
    for (size_t i = 0; i < sizeof(k_types) / sizeof(k_types[0]); i++) {
        qt_type t = k_types[i];
        const cpu_dot_kernel *r = cpu_dot_ref(t), *b = cpu_dot_best(t), *v[8];
        int n = cpu_dot_variants(t, v, 8);
        CHECKF(r && b && n >= 1 && v[0] == r && !strcmp(r->isa, "ref"), "type %d registry", (int)t);
    }
    CHECK(cpu_dot_ref(QT_I32) == NULL && cpu_dot_best(QT_I32) == NULL);

    /* Q8_0 x Q8_0 on a known row: w = a = ramp, dot = sum of squares after quantization */
    float x[64];
    for (int i = 0; i < 64; i++) x[i] = (float)(i - 32) / 8.0f;
    const cpu_dot_kernel *k = cpu_dot_ref(QT_Q8_0);
    block_q8_0 w[2], a[2];
    k->act(x, w, 64);
    k->act(x, a, 64);
    float s = 0;
    k->dot(64, &s, w, a);
    double want = 0;
    for (int i = 0; i < 64; i++) want += (double)x[i] * x[i];
    CHECKF(fabs(s - want) < 0.02 * want, "q8_0 %f vs %f", s, want);
    TEST_DONE();
}
