/* test_gemm.c: the multi-row gemm kernels (backend/cpu/gemm.h).
 *
 * Every variant this CPU can run, for every type with a gemm kernel, against
 * the reference (dot.h's reference dot per activation row): 1..8 activation
 * rows, one and several super-blocks, on rows from the reference quantizer,
 * on random block bytes (every code and scale pattern) and on saturated
 * all-0xff codes with activations at +-127, so the i16 pair sums are pushed
 * to their limits. Also checks that the registry only hands out kernels whose
 * activation type matches the dot registry's converter. */
#include <math.h>
#include <stdint.h>

#include "backend/cpu/dot.h"
#include "backend/cpu/gemm.h"
#include "core/alloc.h"
#include "quant/quant.h"
#include "test.h"


static const qt_type k_types[] = {QT_Q8_0, QT_Q4_0, QT_Q4_K, QT_Q6_K, QT_Q5_K, QT_IQ4_XS, QT_F16, QT_BF16};
enum { MODE_QUANT, MODE_BYTES, MODE_FF, MODE_COUNT };

/* Keeps f16 scale fields finite in random-byte blocks (an f16 of 0x7c00.. is inf/nan);
 * for F16/BF16 rows every element: random sign and mantissa, exponent within
 * 2^-8..2^7 (mode BYTES), or the largest value below 2^16 with a sign pattern (mode FF). */
static void tame_f16(qt_type t, uint8_t *row, int64_t n, int mode) {
    const qt_type_traits *tr = qt_traits(t);
    if (t == QT_F16 || t == QT_BF16) {
        uint16_t *h = (uint16_t *)row;
        for (int64_t i = 0; i < n; i++) {
            uint16_t sign = (uint16_t)(mode == MODE_FF ? (i % 3 ? 0 : 0x8000) : (h[i] & 0x8000));
            if (t == QT_F16)
                h[i] = mode == MODE_FF ? (uint16_t)(sign | 0x7bff) : (uint16_t)(sign | ((7 + test_rnd() % 16) << 10) | (h[i] & 0x3ff));
            else
                h[i] = mode == MODE_FF ? (uint16_t)(sign | 0x477f) : (uint16_t)(sign | ((119 + test_rnd() % 16) << 7) | (h[i] & 0x7f));
        }
        return;
    }
    for (int64_t b = 0; b < n / tr->blck_size; b++) {
        uint8_t *blk = row + b * tr->type_size;
        uint16_t h = qt_f32_to_f16(0.01f + 0.01f * (float)(test_rnd() % 100));
        if (t == QT_Q6_K) {
            memcpy(blk + offsetof(block_q6_K, d), &h, 2);
        } else {
            memcpy(blk, &h, 2);
            if (t == QT_Q4_K || t == QT_Q5_K) memcpy(blk + 2, &h, 2); /* dmin */
        }
    }
}

static void check_type(qt_type t) {
    const cpu_gemm_kernel *ref = cpu_gemm_ref(t);
    const cpu_dot_kernel *dref = cpu_dot_ref(t);
    CHECKF(ref != NULL && dref != NULL, "%s: no reference", qt_traits(t)->name);
    if (!ref || !dref) return;
    CHECK(ref->act_type == dref->act_type);
    const cpu_gemm_kernel *vars[8];
    int nv = cpu_gemm_variants(t, vars, 8);
    CHECK(nv >= 1 && vars[0] == ref);
    static const int64_t ks[] = {256, 512, 1280, 96, 1000, 1031, 1048, 48, 40, 7};
    for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
        int64_t k = ks[ki];
        if (k % qt_traits(t)->blck_size) continue;
        size_t wbytes = qt_row_size(t, k), abytes = qt_row_size(ref->act_type, k);
        float *xf = hn_malloc(sizeof(float) * (size_t)k);
        uint8_t *w = hn_malloc(wbytes);
        uint8_t *acts = hn_malloc(abytes * CPU_GEMM_MAX_NA);
        uint8_t *prep = hn_malloc((size_t)k * 4 * CPU_GEMM_MAX_NA);
        for (int mode = 0; mode < MODE_COUNT; mode++) {
            for (int64_t i = 0; i < k; i++) xf[i] = test_gauss() * (test_rnd() % 16 == 0 ? 8.0f : 1.0f);
            if (mode == MODE_QUANT) {
                qt_traits(t)->from_float(xf, w, k);
            } else {
                for (size_t i = 0; i < wbytes; i++) w[i] = mode == MODE_FF ? 0xff : (uint8_t)test_rnd();
                tame_f16(t, w, k, mode);
            }
            const void *aptr[CPU_GEMM_MAX_NA];
            for (int r = 0; r < CPU_GEMM_MAX_NA; r++) {
                for (int64_t i = 0; i < k; i++)
                    xf[i] = mode == MODE_FF ? ((r + i) % 3 ? 1.0f : -1.0f) : test_gauss() * (1.0f + (float)r);
                dref->act(xf, acts + (size_t)r * abytes, k);
                aptr[r] = acts + (size_t)r * abytes;
            }
            for (int na = 1; na <= CPU_GEMM_MAX_NA; na++) {
                float want[CPU_GEMM_MAX_NA], got[CPU_GEMM_MAX_NA];
                ref->fn(k, w, na, aptr, want);
                for (int v = 1; v < nv && v < 8; v++) {
                    if (!cpu_gemm_fits(vars[v], k)) continue;
                    /* a kernel with a prep pass reads its own rearrangement of the rows */
                    const void *vptr[CPU_GEMM_MAX_NA];
                    for (int r = 0; r < CPU_GEMM_MAX_NA; r++) {
                        vptr[r] = aptr[r];
                        if (vars[v]->prep) {
                            CHECK(vars[v]->prep_bytes(k) <= (size_t)k * 4);
                            vars[v]->prep(k, aptr[r], prep + (size_t)r * (size_t)k * 4);
                            vptr[r] = prep + (size_t)r * (size_t)k * 4;
                        }
                    }
                    for (int r = 0; r < na; r++) got[r] = NAN;
                    vars[v]->fn(k, w, na, vptr, got);
                    double scale = 0;
                    for (int r = 0; r < na; r++) scale = fmax(scale, fabs(want[r]));
                    for (int r = 0; r < na; r++) {
                        double tol = 1e-5 * (scale + 1.0) + 1e-4 * fabs(want[r]);
                        /* the SIMD variants of a type are bit-identical (the backend mixes them),
                         * but for vdpbf16ps, which it never mixes (checked in main) */
                        if (v > 1 && !vars[v]->prep && !vars[1]->prep && strcmp(vars[v]->isa, "avx512bf16") != 0) {
                            float other[CPU_GEMM_MAX_NA];
                            vars[1]->fn(k, w, na, aptr, other);
                            CHECKF(!memcmp(&other[r], &got[r], sizeof(float)), "%s %s vs %s k=%lld na=%d: %.9g vs %.9g",
                                   qt_traits(t)->name, vars[v]->isa, vars[1]->isa, (long long)k, na, got[r], other[r]);
                        }
                        float one;
                        vars[v]->fn(k, w, 1, &vptr[r], &one);
                        CHECKF(memcmp(&one, &got[r], sizeof one) == 0, "%s %s k=%lld na=%d row %d: %.9g alone, %.9g in a batch",
                               qt_traits(t)->name, vars[v]->isa, (long long)k, na, r, one, got[r]);
                        CHECKF(fabs((double)got[r] - want[r]) <= tol, "%s %s k=%lld mode=%d na=%d row %d: %g vs ref %g",
                               qt_traits(t)->name, vars[v]->isa, (long long)k, mode, na, r, got[r], want[r]);
                    }
                }
            }
        }
        hn_free(xf);
        hn_free(w);
        hn_free(acts);
        hn_free(prep);
    }
}

int main(void) {
    *test_rng_state() = 0x2545f4914f6cdd1dull;
    for (size_t i = 0; i < sizeof k_types / sizeof k_types[0]; i++) check_type(k_types[i]);
    /* a type without a gemm kernel gives none */
    CHECK(cpu_gemm_best(QT_Q5_1) == NULL);
    CHECK(cpu_gemm_ref(QT_F32) == NULL);
    const cpu_features *f = cpu_dot_features();
    if (f->avx2 && f->fma && f->f16c) {
        CHECK(strcmp(cpu_gemm_best(QT_Q8_0)->isa, f->avx512f && f->avx512bw ? "avx512" : "avx2") == 0);
        CHECK(strcmp(cpu_gemm_best(QT_Q4_K)->isa, f->avx512f && f->avx512bw ? "avx512" : "avx2") == 0);
        static const qt_type more[] = {QT_Q5_K, QT_IQ4_XS, QT_F16, QT_BF16};
        for (size_t i = 0; i < sizeof more / sizeof more[0]; i++) {
            const cpu_gemm_kernel *b = cpu_gemm_best(more[i]);
            CHECKF(b && strncmp(b->isa, f->avx512f && f->avx512bw ? "avx512" : "avx2", 6) == 0 &&
                       b->act_type == cpu_dot_best(more[i])->act_type,
                   "%s gemm kernel", qt_name(more[i]));
        }
        CHECK(strcmp(cpu_gemm_pick(QT_Q5_K, 1)->isa, "avx2") == 0);
        /* the pick never mixes variants that are not bit-identical */
        for (int na = 1; na <= CPU_GEMM_MAX_NA; na++)
            CHECK(cpu_gemm_pick(QT_BF16, na) == cpu_gemm_best(QT_BF16));
        if (f->avx512bf16) CHECK(strcmp(cpu_gemm_best(QT_BF16)->isa, "avx512bf16") == 0);
    } else if (f->neon) { /* AArch64: every type has its NEON kernel, and the dotprod build where the CPU has sdot */
        for (size_t i = 0; i < sizeof k_types / sizeof k_types[0]; i++) {
            const cpu_gemm_kernel *b = cpu_gemm_best(k_types[i]), *v[8];
            int nv = cpu_gemm_variants(k_types[i], v, 8);
            CHECKF(b && !strcmp(b->isa, f->dotprod ? "dotprod" : "neon") && nv == 2 + f->dotprod &&
                       b->act_type == cpu_dot_best(k_types[i])->act_type,
                   "%s gemm kernel (%d variants)", qt_name(k_types[i]), nv);
        }
    } else {
        printf("no AVX2 or NEON here: only the references were checked\n");
    }
    TEST_DONE();
}
