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
#endif

#endif
