/* gemm.c: the gemm-kernel registry and its scalar references (see gemm.h).
 * A reference is dot.h's reference dot of the same weight type, once per
 * activation row, so a gemm variant is held to exactly what the dot kernels
 * are held to. */
#include "gemm.h"

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "dot.h"
#include "gemm_int.h"

static void gemm_by_ref(qt_type t, int64_t k, const void *w, int na, const void *const *a, float *s) {
    cpu_dot_fn dot = cpu_dot_ref(t)->dot;
    for (int r = 0; r < na; r++) dot(k, &s[r], w, a[r]);
}

#define REF_FN(name, T)                                                                                   \
    static void name(int64_t k, const void *restrict w, int na, const void *const *restrict a, float *restrict s) { \
        gemm_by_ref(T, k, w, na, a, s);                                                                   \
    }
REF_FN(gemm_q8_0_ref, QT_Q8_0)
REF_FN(gemm_q4_0_ref, QT_Q4_0)
REF_FN(gemm_q4_K_ref, QT_Q4_K)
REF_FN(gemm_q6_K_ref, QT_Q6_K)
REF_FN(gemm_q5_K_ref, QT_Q5_K)
REF_FN(gemm_iq4_xs_ref, QT_IQ4_XS)
REF_FN(gemm_f16_ref, QT_F16)
REF_FN(gemm_bf16_ref, QT_BF16)

enum { ISA_REF, ISA_AVX2, ISA_AVX512, ISA_AVX512BF16, ISA_NEON, ISA_DOTPROD };

typedef struct {
    cpu_gemm_kernel k;
    int isa;
} entry;

/* Reference first for every type, then faster variants in order of preference. */
static const entry g_kernels[] = {
    {{QT_Q8_0, QT_Q8_0, gemm_q8_0_ref, "ref", NULL, NULL, 1}, ISA_REF},
    {{QT_Q4_0, QT_Q8_0, gemm_q4_0_ref, "ref", NULL, NULL, 1}, ISA_REF},
    {{QT_Q4_K, QT_Q8_K, gemm_q4_K_ref, "ref", NULL, NULL, 1}, ISA_REF},
    {{QT_Q6_K, QT_Q8_K, gemm_q6_K_ref, "ref", NULL, NULL, 1}, ISA_REF},
    {{QT_Q5_K, QT_Q8_K, gemm_q5_K_ref, "ref", NULL, NULL, 1}, ISA_REF},
    {{QT_IQ4_XS, QT_Q8_K, gemm_iq4_xs_ref, "ref", NULL, NULL, 1}, ISA_REF},
    {{QT_F16, QT_F32, gemm_f16_ref, "ref", NULL, NULL, 1}, ISA_REF},
    {{QT_BF16, QT_BF16, gemm_bf16_ref, "ref", NULL, NULL, 1}, ISA_REF},
#if defined(__x86_64__)
    {{QT_Q8_0, QT_Q8_0, cpu_gemm_q8_0_avx2, "avx2", NULL, NULL, 1}, ISA_AVX2},
    {{QT_Q4_0, QT_Q8_0, cpu_gemm_q4_0_avx2, "avx2", NULL, NULL, 1}, ISA_AVX2},
    {{QT_Q4_K, QT_Q8_K, cpu_gemm_q4_K_avx2, "avx2", NULL, NULL, 1}, ISA_AVX2},
    {{QT_Q6_K, QT_Q8_K, cpu_gemm_q6_K_avx2, "avx2", NULL, NULL, 1}, ISA_AVX2},
    {{QT_Q4_K, QT_Q8_K, cpu_gemm_q4_K_avx512, "avx512", NULL, NULL, 1}, ISA_AVX512},
    {{QT_Q8_0, QT_Q8_0, cpu_gemm_q8_0_avx512, "avx512", cpu_gemm_prep_q8_0_avx512, cpu_gemm_prep_bytes_q8_0, 64},
     ISA_AVX512},
    {{QT_Q4_0, QT_Q8_0, cpu_gemm_q4_0_avx512, "avx512", cpu_gemm_prep_q4_0_avx512, cpu_gemm_prep_bytes_q4_0, 64},
     ISA_AVX512},
    {{QT_Q6_K, QT_Q8_K, cpu_gemm_q6_K_avx512, "avx512", NULL, NULL, 1}, ISA_AVX512},
    {{QT_Q5_K, QT_Q8_K, cpu_gemm_q5_K_avx2, "avx2", NULL, NULL, 1}, ISA_AVX2},
    {{QT_Q5_K, QT_Q8_K, cpu_gemm_q5_K_avx512, "avx512", NULL, NULL, 1}, ISA_AVX512},
    {{QT_IQ4_XS, QT_Q8_K, cpu_gemm_iq4_xs_avx2, "avx2", NULL, NULL, 1}, ISA_AVX2},
    {{QT_IQ4_XS, QT_Q8_K, cpu_gemm_iq4_xs_avx512, "avx512", NULL, NULL, 1}, ISA_AVX512},
    {{QT_F16, QT_F32, cpu_gemm_f16_avx2, "avx2", NULL, NULL, 1}, ISA_AVX2},
    {{QT_F16, QT_F32, cpu_gemm_f16_avx512, "avx512", NULL, NULL, 1}, ISA_AVX512},
    {{QT_BF16, QT_BF16, cpu_gemm_bf16_avx2, "avx2", NULL, NULL, 1}, ISA_AVX2},
    {{QT_BF16, QT_BF16, cpu_gemm_bf16_avx512, "avx512", NULL, NULL, 1}, ISA_AVX512},
    /* not bit-identical to the two above: the pick uses it for every row count */
    {{QT_BF16, QT_BF16, cpu_gemm_bf16_avx512bf16, "avx512bf16", NULL, NULL, 1}, ISA_AVX512BF16},
#endif
#if defined(__aarch64__)
    /* the two builds of gemm_arm.h, bit-identical */
    {{QT_Q8_0, QT_Q8_0, cpu_gemm_q8_0_neon, "neon", NULL, NULL, 1}, ISA_NEON},
    {{QT_Q4_0, QT_Q8_0, cpu_gemm_q4_0_neon, "neon", NULL, NULL, 1}, ISA_NEON},
    {{QT_Q4_K, QT_Q8_K, cpu_gemm_q4_K_neon, "neon", NULL, NULL, 1}, ISA_NEON},
    {{QT_Q6_K, QT_Q8_K, cpu_gemm_q6_K_neon, "neon", NULL, NULL, 1}, ISA_NEON},
    {{QT_Q5_K, QT_Q8_K, cpu_gemm_q5_K_neon, "neon", NULL, NULL, 1}, ISA_NEON},
    {{QT_IQ4_XS, QT_Q8_K, cpu_gemm_iq4_xs_neon, "neon", NULL, NULL, 1}, ISA_NEON},
    {{QT_F16, QT_F32, cpu_gemm_f16_neon, "neon", NULL, NULL, 1}, ISA_NEON},
    {{QT_BF16, QT_BF16, cpu_gemm_bf16_neon, "neon", NULL, NULL, 1}, ISA_NEON},
    {{QT_Q8_0, QT_Q8_0, cpu_gemm_q8_0_dotprod, "dotprod", NULL, NULL, 1}, ISA_DOTPROD},
    {{QT_Q4_0, QT_Q8_0, cpu_gemm_q4_0_dotprod, "dotprod", NULL, NULL, 1}, ISA_DOTPROD},
    {{QT_Q4_K, QT_Q8_K, cpu_gemm_q4_K_dotprod, "dotprod", NULL, NULL, 1}, ISA_DOTPROD},
    {{QT_Q6_K, QT_Q8_K, cpu_gemm_q6_K_dotprod, "dotprod", NULL, NULL, 1}, ISA_DOTPROD},
    {{QT_Q5_K, QT_Q8_K, cpu_gemm_q5_K_dotprod, "dotprod", NULL, NULL, 1}, ISA_DOTPROD},
    {{QT_IQ4_XS, QT_Q8_K, cpu_gemm_iq4_xs_dotprod, "dotprod", NULL, NULL, 1}, ISA_DOTPROD},
    {{QT_F16, QT_F32, cpu_gemm_f16_dotprod, "dotprod", NULL, NULL, 1}, ISA_DOTPROD},
    {{QT_BF16, QT_BF16, cpu_gemm_bf16_dotprod, "dotprod", NULL, NULL, 1}, ISA_DOTPROD},
#endif
};

static bool isa_ok(int isa) {
    const cpu_features *f = cpu_dot_features();
    bool avx2 = f->avx2 && f->fma && f->f16c;
    switch (isa) {
    case ISA_REF: return true;
    case ISA_AVX2: return avx2;
    case ISA_AVX512: return avx2 && f->avx512f && f->avx512bw;
    case ISA_AVX512BF16: return avx2 && f->avx512f && f->avx512bw && f->avx512bf16;
    case ISA_NEON: return f->neon;
    case ISA_DOTPROD: return f->neon && f->dotprod;
    default: return false;
    }
}

/* A kernel is usable only while it reads what the dot registry's converter writes. */
static bool act_ok(const entry *e) {
    const cpu_dot_kernel *d = cpu_dot_ref(e->k.wtype);
    return d && d->act_type == e->k.act_type;
}

int cpu_gemm_variants(qt_type t, const cpu_gemm_kernel **out, int cap) {
    int n = 0;
    for (size_t i = 0; i < sizeof(g_kernels) / sizeof(g_kernels[0]); i++) {
        if (g_kernels[i].k.wtype != t || !isa_ok(g_kernels[i].isa) || !act_ok(&g_kernels[i])) continue;
        if (n < cap) out[n] = &g_kernels[i].k;
        n++;
    }
    return n;
}

const cpu_gemm_kernel *cpu_gemm_best(qt_type t) {
    const cpu_gemm_kernel *best = NULL;
    for (size_t i = 0; i < sizeof(g_kernels) / sizeof(g_kernels[0]); i++)
        if (g_kernels[i].k.wtype == t && isa_ok(g_kernels[i].isa) && act_ok(&g_kernels[i])) best = &g_kernels[i].k;
    return best;
}

const cpu_gemm_kernel *cpu_gemm_ref(qt_type t) {
    for (size_t i = 0; i < sizeof(g_kernels) / sizeof(g_kernels[0]); i++)
        if (g_kernels[i].k.wtype == t && g_kernels[i].isa == ISA_REF && act_ok(&g_kernels[i])) return &g_kernels[i].k;
    return NULL;
}

const cpu_gemm_kernel *cpu_gemm_pick(qt_type t, int na) {
    const cpu_gemm_kernel *best = cpu_gemm_best(t);
    /* Q4_K, Q5_K: AVX2 for decode (fewer instructions per weight byte at one
     * row), AVX-512 for tiles; the two are bit-identical (tests/test_gemm.c) */
    if (!best || na > 1 || (t != QT_Q4_K && t != QT_Q5_K)) return best;
    const cpu_gemm_kernel *v[8];
    int n = cpu_gemm_variants(t, v, 8);
    for (int i = 0; i < n && i < 8; i++)
        if (!strcmp(v[i]->isa, "avx2")) return v[i];
    return best;
}

const cpu_gemm_kernel *cpu_gemm_pick_k(qt_type t, int na, int64_t k) {
    const cpu_gemm_kernel *g = cpu_gemm_pick(t, na);
    if (!g || cpu_gemm_fits(g, k)) return g;
    /* the fastest variant that fits (variants are listed slowest first) */
    const cpu_gemm_kernel *v[8], *fit = NULL;
    int n = cpu_gemm_variants(t, v, 8);
    for (int i = 0; i < n && i < 8; i++)
        if (cpu_gemm_fits(v[i], k)) fit = v[i];
    return fit;
}
