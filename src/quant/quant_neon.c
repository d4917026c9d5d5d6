/* quant_neon.c: AArch64 Advanced SIMD versions of the f16 row converters
 * (NEON is part of the base ISA; quant.c calls them on every aarch64 build).
 *
 * fcvtn rounds to nearest even exactly as qt_f32_to_f16 does (subnormal
 * halves and overflow to inf included, with the default FPCR: no flush to
 * zero, IEEE halves); NaNs are patched to the quiet 0x7e00 (sign kept) that
 * qt_f32_to_f16 writes. Widening is exact, and fcvtl quiets a NaN half as
 * qt_f16_to_f32 does. */
#if defined(__aarch64__)

#include <arm_neon.h>

#include "quant_int.h"

void qt_quant_f16_neon(const float *restrict x, void *restrict vy, int64_t n) {
    uint16_t *y = vy;
    int64_t i = 0;
    const uint32x4_t qnan = vdupq_n_u32(0x7e00), sign = vdupq_n_u32(0x8000);
    for (; i + 8 <= n; i += 8) {
        float32x4_t v0 = vld1q_f32(x + i), v1 = vld1q_f32(x + i + 4);
        uint16x8_t h = vreinterpretq_u16_f16(vcvt_high_f16_f32(vcvt_f16_f32(v0), v1));
        /* lanes that are not NaN compare equal to themselves */
        uint16x8_t ok = vcombine_u16(vmovn_u32(vceqq_f32(v0, v0)), vmovn_u32(vceqq_f32(v1, v1)));
        if (vminvq_u16(ok) != 0xffff) {
            uint32x4_t s0 = vorrq_u32(vandq_u32(vshrq_n_u32(vreinterpretq_u32_f32(v0), 16), sign), qnan);
            uint32x4_t s1 = vorrq_u32(vandq_u32(vshrq_n_u32(vreinterpretq_u32_f32(v1), 16), sign), qnan);
            h = vbslq_u16(ok, h, vcombine_u16(vmovn_u32(s0), vmovn_u32(s1)));
        }
        vst1q_u16(y + i, h);
    }
    for (; i < n; i++) y[i] = qt_f32_to_f16(x[i]);
}

void qt_dequant_f16_neon(const void *restrict vx, float *restrict y, int64_t n) {
    const uint16_t *x = vx;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(x + i));
        vst1q_f32(y + i, vcvt_f32_f16(vget_low_f16(h)));
        vst1q_f32(y + i + 4, vcvt_high_f32_f16(h));
    }
    for (; i < n; i++) y[i] = qt_f16_to_f32(x[i]);
}

#else
typedef int hn_quant_neon_unused;
#endif
