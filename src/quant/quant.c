/* quant.c: the type traits table, type names, row sizes, and the IEEE half /
 * bfloat16 conversions with the plain-float row converters (F32, F16, BF16).
 *
 * The quantized families live beside this file: quant_legacy.c (32-element
 * blocks: q4_0 ... q8_1, mxfp4), quant_k.c (256-element super-blocks: q2_K ...
 * q8_K) and quant_iq.c (iq4_nl, iq4_xs). Types that GGUF names but hone cannot
 * convert yet still have their sizes here, so that every file can be sized. */
#include <ctype.h>
#include <stddef.h>
#include <string.h>

#include "../core/isa.h"
#include "quant.h"
#include "quant_int.h"

#define CONV(nm) .to_float = qt_dequant_##nm, .from_float = qt_quant_##nm

static const qt_type_traits traits[QT_TYPE_COUNT] = {
    [QT_F32] = {"f32", 1, 4, false, CONV(f32), QT_F32},
    [QT_F16] = {"f16", 1, 2, false, CONV(f16), QT_F16},
    [QT_BF16] = {"bf16", 1, 2, false, CONV(bf16), QT_BF16},
    [QT_Q4_0] = {"q4_0", QK4_0, sizeof(block_q4_0), true, CONV(q4_0), QT_Q8_0},
    [QT_Q4_1] = {"q4_1", QK4_1, sizeof(block_q4_1), true, CONV(q4_1), QT_Q8_1},
    [QT_Q5_0] = {"q5_0", QK5_0, sizeof(block_q5_0), true, CONV(q5_0), QT_Q8_0},
    [QT_Q5_1] = {"q5_1", QK5_1, sizeof(block_q5_1), true, CONV(q5_1), QT_Q8_1},
    [QT_Q8_0] = {"q8_0", QK8_0, sizeof(block_q8_0), true, CONV(q8_0), QT_Q8_0},
    [QT_Q8_1] = {"q8_1", QK8_1, sizeof(block_q8_1), true, CONV(q8_1), QT_Q8_1},
    [QT_Q2_K] = {"q2_K", QK_K, sizeof(block_q2_K), true, CONV(q2_K), QT_Q8_K},
    [QT_Q3_K] = {"q3_K", QK_K, sizeof(block_q3_K), true, CONV(q3_K), QT_Q8_K},
    [QT_Q4_K] = {"q4_K", QK_K, sizeof(block_q4_K), true, CONV(q4_K), QT_Q8_K},
    [QT_Q5_K] = {"q5_K", QK_K, sizeof(block_q5_K), true, CONV(q5_K), QT_Q8_K},
    [QT_Q6_K] = {"q6_K", QK_K, sizeof(block_q6_K), true, CONV(q6_K), QT_Q8_K},
    [QT_Q8_K] = {"q8_K", QK_K, sizeof(block_q8_K), true, CONV(q8_K), QT_Q8_K},
    [QT_IQ4_NL] = {"iq4_nl", QK4_NL, sizeof(block_iq4_nl), true, CONV(iq4_nl), QT_Q8_0},
    [QT_IQ4_XS] = {"iq4_xs", QK_K, sizeof(block_iq4_xs), true, CONV(iq4_xs), QT_Q8_K},
    [QT_MXFP4] = {"mxfp4", QK_MXFP4, sizeof(block_mxfp4), true, CONV(mxfp4), QT_Q8_0},
    /* sized only: no conversion in hone yet */
    [QT_IQ2_XXS] = {"iq2_xxs", QK_K, 66, true, NULL, NULL, QT_Q8_K},
    [QT_IQ2_XS] = {"iq2_xs", QK_K, 74, true, NULL, NULL, QT_Q8_K},
    [QT_IQ3_XXS] = {"iq3_xxs", QK_K, 98, true, NULL, NULL, QT_Q8_K},
    [QT_IQ1_S] = {"iq1_s", QK_K, 50, true, NULL, NULL, QT_Q8_K},
    [QT_IQ3_S] = {"iq3_s", QK_K, 110, true, NULL, NULL, QT_Q8_K},
    [QT_IQ2_S] = {"iq2_s", QK_K, 82, true, NULL, NULL, QT_Q8_K},
    [QT_IQ1_M] = {"iq1_m", QK_K, 56, true, NULL, NULL, QT_Q8_K},
    [QT_TQ1_0] = {"tq1_0", QK_K, 54, true, NULL, NULL, QT_Q8_K},
    [QT_TQ2_0] = {"tq2_0", QK_K, 66, true, NULL, NULL, QT_Q8_K},
    [QT_I8] = {"i8", 1, 1, false, NULL, NULL, QT_I8},
    [QT_I16] = {"i16", 1, 2, false, NULL, NULL, QT_I16},
    [QT_I32] = {"i32", 1, 4, false, NULL, NULL, QT_I32},
    [QT_I64] = {"i64", 1, 8, false, NULL, NULL, QT_I64},
    [QT_F64] = {"f64", 1, 8, false, NULL, NULL, QT_F64},
};

const qt_type_traits *qt_traits(qt_type t) {
    if ((int)t < 0 || t >= QT_TYPE_COUNT || !traits[t].name) return NULL;
    return &traits[t];
}

const char *qt_name(qt_type t) {
    const qt_type_traits *tr = qt_traits(t);
    return tr ? tr->name : "unknown";
}

bool qt_from_name(const char *name, qt_type *out) {
    if (!name) return false;
    for (int t = 0; t < QT_TYPE_COUNT; t++) {
        const char *n = traits[t].name;
        if (!n) continue;
        size_t i = 0;
        while (n[i] && name[i] && tolower((unsigned char)n[i]) == tolower((unsigned char)name[i])) i++;
        if (!n[i] && !name[i]) {
            *out = (qt_type)t;
            return true;
        }
    }
    return false;
}

size_t qt_row_size(qt_type t, int64_t n) {
    const qt_type_traits *tr = qt_traits(t);
    if (!tr || n < 0 || n % tr->blck_size) return 0;
    return (size_t)(n / tr->blck_size) * tr->type_size;
}

/* ---- half and bfloat16 ---- */

static inline uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Shifts m right by s (1..31) rounding to nearest, ties to even. */
static inline uint32_t shr_rne(uint32_t m, int s) {
    uint32_t q = m >> s, rem = m & ((1u << s) - 1), half = 1u << (s - 1);
    if (rem > half || (rem == half && (q & 1))) q++;
    return q;
}

uint16_t qt_f32_to_f16(float f) {
    uint32_t w = f2u(f);
    uint16_t sign = (uint16_t)((w >> 16) & 0x8000);
    uint32_t a = w & 0x7fffffff;
    if (a > 0x7f800000) return sign | 0x7e00;          /* NaN: quiet, as ggml writes it */
    if (a >= 0x477ff000) return sign | 0x7c00;         /* >= 65520 rounds to inf */
    if (a >= 0x38800000) {                             /* normal half: rebias 127 -> 15 */
        return sign | (uint16_t)shr_rne(a - (112u << 23), 13);
    }
    if (a <= 0x33000000) return sign;                  /* <= 2^-25 rounds to zero (tie to even) */
    uint32_t e = a >> 23;                              /* 102..112 */
    uint32_t m = (a & 0x7fffff) | 0x800000;
    return sign | (uint16_t)shr_rne(m, (int)(126 - e));
}

uint16_t qt_f32_to_bf16(float f) {
    uint32_t u = f2u(f);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40); /* NaN: force quiet */
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

/* ---- plain float rows ---- */

void qt_dequant_f32(const void *restrict x, float *restrict y, int64_t n) {
    memcpy(y, x, (size_t)n * sizeof(float));
}

void qt_quant_f32(const float *restrict x, void *restrict y, int64_t n) {
    memcpy(y, x, (size_t)n * sizeof(float));
}

#if defined(__x86_64__)
/* Whether quant_avx2.c's f16 rows may run (the KV store converts a row per token and layer). */
static bool f16_simd(void) {
    const uint32_t need = HN_ISA_AVX2 | HN_ISA_FMA | HN_ISA_F16C;
    return (hn_isa() & need) == need;
}
#endif

void qt_dequant_f16(const void *restrict x, float *restrict y, int64_t n) {
#if defined(__x86_64__)
    if (n >= 8 && f16_simd()) {
        qt_dequant_f16_avx2(x, y, n);
        return;
    }
#elif defined(__aarch64__)
    if (n >= 8) {
        qt_dequant_f16_neon(x, y, n); /* NEON is in every AArch64 CPU */
        return;
    }
#endif
    const uint16_t *h = x;
    for (int64_t i = 0; i < n; i++) y[i] = qt_f16_to_f32(h[i]);
}

void qt_quant_f16(const float *restrict x, void *restrict y, int64_t n) {
#if defined(__x86_64__)
    if (n >= 16 && f16_simd()) {
        qt_quant_f16_avx2(x, y, n);
        return;
    }
#elif defined(__aarch64__)
    if (n >= 8) {
        qt_quant_f16_neon(x, y, n);
        return;
    }
#endif
    uint16_t *h = y;
    for (int64_t i = 0; i < n; i++) h[i] = qt_f32_to_f16(x[i]);
}

void qt_dequant_bf16(const void *restrict x, float *restrict y, int64_t n) {
    const uint16_t *h = x;
    for (int64_t i = 0; i < n; i++) y[i] = qt_bf16_to_f32(h[i]);
}

void qt_quant_bf16(const float *restrict x, void *restrict y, int64_t n) {
    uint16_t *h = y;
    for (int64_t i = 0; i < n; i++) h[i] = qt_f32_to_bf16(x[i]);
}
