/* dot_int.h: private to the dot-kernel module (dot.c and dot_<isa>.c).
 *
 * dot.c owns the registry, the scalar references and the activation
 * converters; each dot_<isa>.c file only defines kernels, which dot.c lists in
 * its registry behind a run-time CPU check. The activation converters are
 * shared by every variant so that all variants of a type see the same
 * activation bytes. */
#ifndef HN_CPU_DOT_INT_H
#define HN_CPU_DOT_INT_H

#include <stdint.h>
#include <string.h>

#include "dot.h"

/* Activation converters (run once per activation row): cpu_act_<t> picks the
 * fastest version at run time; _ref is the scalar reference, _avx2 (dot_avx2.c),
 * _avx512 (dot_conv_avx512.c) and _neon (dot_neon.c) write the same bytes. */
#define CPU_ACT_DECL(name)                                                             \
    void cpu_act_##name(const float *restrict x, void *restrict y, int64_t n);          \
    void cpu_act_##name##_ref(const float *restrict x, void *restrict y, int64_t n);    \
    void cpu_act_##name##_avx2(const float *restrict x, void *restrict y, int64_t n);   \
    void cpu_act_##name##_avx512(const float *restrict x, void *restrict y, int64_t n); \
    void cpu_act_##name##_neon(const float *restrict x, void *restrict y, int64_t n);
CPU_ACT_DECL(bf16)
CPU_ACT_DECL(q8_0)
CPU_ACT_DECL(q8_1)
CPU_ACT_DECL(q8_K)
void cpu_act_f32(const float *restrict x, void *restrict y, int64_t n);
void cpu_act_f32_ref(const float *restrict x, void *restrict y, int64_t n);

/* The 16 non-linear levels of IQ4_NL / IQ4_XS, and MXFP4's doubled E2M1 levels. */
extern const int8_t cpu_kvalues_iq4nl[16];
extern const int8_t cpu_kvalues_mxfp4[16];

/* MXFP4's E8M0 block exponent as a float scale, halved (its levels are doubled):
 * 2^(e-127) / 2 = 2^(e-128); e < 2 gives a subnormal float. */
static inline float cpu_e8m0_half(uint8_t e) {
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

#if defined(__x86_64__)
/* AVX2+FMA+F16C kernels (dot_avx2.c); call only when the CPU has all three. */
void cpu_dot_f32_avx2(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);
void cpu_dot_f16_avx2(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);
void cpu_dot_bf16_avx2(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);
void cpu_dot_q8_0_avx2(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);
void cpu_dot_q4_0_avx2(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);
void cpu_dot_mxfp4_avx2(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);
void cpu_dot_iq4_nl_avx2(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);
void cpu_dot_q4_1_avx2(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);
void cpu_dot_q5_0_avx2(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);
void cpu_dot_q5_1_avx2(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);
void cpu_dot_q2_K_avx2(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);
void cpu_dot_q3_K_avx2(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);
void cpu_dot_q4_K_avx2(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);
void cpu_dot_q5_K_avx2(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);
void cpu_dot_q6_K_avx2(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);
void cpu_dot_iq4_xs_avx2(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);
#endif

#if defined(__aarch64__)
/* AArch64 kernels: one body (dot_arm.h) built for the base ISA (dot_neon.c,
 * suffix _neon) and for the dot-product extension (dot_dotprod.c, _dotprod;
 * call only when the CPU has it). */
#define CPU_DOT_ARM_DECL(sfx)                                                                                     \
    void cpu_dot_f32_##sfx(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);        \
    void cpu_dot_f16_##sfx(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);        \
    void cpu_dot_bf16_##sfx(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);       \
    void cpu_dot_q8_0_##sfx(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);       \
    void cpu_dot_q4_0_##sfx(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);       \
    void cpu_dot_q4_1_##sfx(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);       \
    void cpu_dot_q5_0_##sfx(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);       \
    void cpu_dot_q5_1_##sfx(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);       \
    void cpu_dot_iq4_nl_##sfx(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);     \
    void cpu_dot_mxfp4_##sfx(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);      \
    void cpu_dot_q2_K_##sfx(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);       \
    void cpu_dot_q3_K_##sfx(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);       \
    void cpu_dot_q4_K_##sfx(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);       \
    void cpu_dot_q5_K_##sfx(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);       \
    void cpu_dot_q6_K_##sfx(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);       \
    void cpu_dot_iq4_xs_##sfx(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);
CPU_DOT_ARM_DECL(neon)
CPU_DOT_ARM_DECL(dotprod)
#endif

#endif
