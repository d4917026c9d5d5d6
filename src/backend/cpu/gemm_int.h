/* gemm_int.h: private to the gemm module (gemm.c and gemm_<isa>.c). gemm.c
 * owns the registry and the references; gemm_<isa>.c files define kernels
 * that gemm.c registers behind a run-time CPU check. */
#ifndef HN_CPU_GEMM_INT_H
#define HN_CPU_GEMM_INT_H

#include "gemm.h"

#if defined(__x86_64__)
/* AVX2+FMA+F16C (gemm_avx2.c) */
void cpu_gemm_q8_0_avx2(int64_t k, const void *restrict w, int na, const void *const *restrict a, float *restrict s);
void cpu_gemm_q4_0_avx2(int64_t k, const void *restrict w, int na, const void *const *restrict a, float *restrict s);
void cpu_gemm_q4_K_avx2(int64_t k, const void *restrict w, int na, const void *const *restrict a, float *restrict s);
void cpu_gemm_q6_K_avx2(int64_t k, const void *restrict w, int na, const void *const *restrict a, float *restrict s);
/* AVX-512 F+BW on top of AVX2 (gemm_avx512.c) */
void cpu_gemm_q4_K_avx512(int64_t k, const void *restrict w, int na, const void *const *restrict a, float *restrict s);
void cpu_gemm_q4_0_avx512(int64_t k, const void *restrict w, int na, const void *const *restrict a, float *restrict s);
void cpu_gemm_prep_q4_0_avx512(int64_t k, const void *restrict act, void *restrict out);
size_t cpu_gemm_prep_bytes_q4_0(int64_t k);
void cpu_gemm_q8_0_avx512(int64_t k, const void *restrict w, int na, const void *const *restrict a, float *restrict s);
void cpu_gemm_prep_q8_0_avx512(int64_t k, const void *restrict act, void *restrict out);
size_t cpu_gemm_prep_bytes_q8_0(int64_t k);
void cpu_gemm_q6_K_avx512(int64_t k, const void *restrict w, int na, const void *const *restrict a, float *restrict s);
/* Q5_K, IQ4_XS (Q8_K activations), F16 (f32 activations), BF16 (bf16
 * activations): AVX2 in gemm_q5k_iq4xs_f16_bf16_avx2.c, AVX-512 F+BW in
 * gemm_q5k_iq4xs_f16_bf16_avx512.c, bit-identical to each other */
#define CPU_GEMM_TWIN_DECL(name)                                                                                   \
    void cpu_gemm_##name##_avx2(int64_t k, const void *restrict w, int na, const void *const *restrict a,         \
                                float *restrict s);                                                                \
    void cpu_gemm_##name##_avx512(int64_t k, const void *restrict w, int na, const void *const *restrict a,       \
                                  float *restrict s);
CPU_GEMM_TWIN_DECL(q5_K)
CPU_GEMM_TWIN_DECL(iq4_xs)
CPU_GEMM_TWIN_DECL(f16)
CPU_GEMM_TWIN_DECL(bf16)
/* BF16 on vdpbf16ps (gemm_bf16_avx512bf16.c): not bit-identical to the two above */
void cpu_gemm_bf16_avx512bf16(int64_t k, const void *restrict w, int na, const void *const *restrict a,
                              float *restrict s);
#endif

#if defined(__aarch64__)
/* AArch64: one body (gemm_arm.h) built for the base ISA (gemm_neon.c) and for
 * dotprod (gemm_dotprod.c; call only when the CPU has it), bit-identical */
#define CPU_GEMM_ARM_DECL(sfx)                                                                                     \
    void cpu_gemm_q8_0_##sfx(int64_t k, const void *restrict w, int na, const void *const *restrict a, float *restrict s); \
    void cpu_gemm_q4_0_##sfx(int64_t k, const void *restrict w, int na, const void *const *restrict a, float *restrict s); \
    void cpu_gemm_q4_K_##sfx(int64_t k, const void *restrict w, int na, const void *const *restrict a, float *restrict s); \
    void cpu_gemm_q5_K_##sfx(int64_t k, const void *restrict w, int na, const void *const *restrict a, float *restrict s); \
    void cpu_gemm_q6_K_##sfx(int64_t k, const void *restrict w, int na, const void *const *restrict a, float *restrict s); \
    void cpu_gemm_iq4_xs_##sfx(int64_t k, const void *restrict w, int na, const void *const *restrict a, float *restrict s); \
    void cpu_gemm_f16_##sfx(int64_t k, const void *restrict w, int na, const void *const *restrict a, float *restrict s); \
    void cpu_gemm_bf16_##sfx(int64_t k, const void *restrict w, int na, const void *const *restrict a, float *restrict s);
CPU_GEMM_ARM_DECL(neon)
CPU_GEMM_ARM_DECL(dotprod)
#endif

/* The ISA files' entry points: instantiate a kernel body (a static inline
 * function templated on the activation-row count by its constant argument)
 * for na = 1..8 rows, so each count gets its own register-resident accumulators. */
#define GEMM_DISPATCH(body, T)                      \
    switch (na) {                                   \
    case 1: body(k, (const T *)w, 1, a, s); break;  \
    case 2: body(k, (const T *)w, 2, a, s); break;  \
    case 3: body(k, (const T *)w, 3, a, s); break;  \
    case 4: body(k, (const T *)w, 4, a, s); break;  \
    case 5: body(k, (const T *)w, 5, a, s); break;  \
    case 6: body(k, (const T *)w, 6, a, s); break;  \
    case 7: body(k, (const T *)w, 7, a, s); break;  \
    default: body(k, (const T *)w, 8, a, s); break; \
    }

#endif
