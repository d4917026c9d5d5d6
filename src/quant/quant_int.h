/* quant_int.h: private to quant/. The per-type row converters that fill the
 * traits table in quant.c, and small helpers shared by the family files
 * (quant_legacy.c, quant_k.c, quant_iq.c). Not for other modules: they go
 * through qt_traits(). */
#ifndef HN_QUANT_INT_H
#define HN_QUANT_INT_H

#include <stdint.h>
#include <string.h>

#include "quant.h"

/* Round to nearest, ties to even, for |f| < 2^22: adding 1.5*2^23 leaves the
 * rounded integer in the low mantissa bits (the FPU does the rounding). This is
 * the rounding every K-quant decision uses, so it must be exactly this. */
static inline int qt_nearest_int(float f) {
    float v = f + 12582912.f;
    int32_t i;
    memcpy(&i, &v, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

#define QT_DECL(name)                                                          \
    void qt_dequant_##name(const void *restrict x, float *restrict y, int64_t n); \
    void qt_quant_##name(const float *restrict x, void *restrict y, int64_t n);

/* quant.c */
QT_DECL(f32)
QT_DECL(f16)
QT_DECL(bf16)
/* quant_avx2.c: AVX2+F16C versions of the f16 rows (same bits); call only
 * when the CPU has AVX2, FMA and F16C (quant.c checks) */
void qt_quant_f16_avx2(const float *restrict x, void *restrict y, int64_t n);
void qt_dequant_f16_avx2(const void *restrict x, float *restrict y, int64_t n);
/* quant_neon.c: the same for AArch64 (NEON is always there) */
void qt_quant_f16_neon(const float *restrict x, void *restrict y, int64_t n);
void qt_dequant_f16_neon(const void *restrict x, float *restrict y, int64_t n);
/* quant_legacy.c */
QT_DECL(q4_0)
QT_DECL(q4_1)
QT_DECL(q5_0)
QT_DECL(q5_1)
QT_DECL(q8_0)
QT_DECL(q8_1)
QT_DECL(mxfp4)
/* quant_k.c */
QT_DECL(q2_K)
QT_DECL(q3_K)
QT_DECL(q4_K)
QT_DECL(q5_K)
QT_DECL(q6_K)
QT_DECL(q8_K)
/* quant_iq.c */
QT_DECL(iq4_nl)
QT_DECL(iq4_xs)

#undef QT_DECL

#endif
