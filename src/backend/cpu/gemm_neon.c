/* gemm_neon.c: gemm_arm.h's kernels for the base AArch64 ISA (gemm.c
 * registers them on every aarch64 build: NEON is always there). */
#if defined(__aarch64__)

#define ARM_SFX neon
#include "gemm_arm.h"

#else
typedef int hn_gemm_neon_unused; /* not an AArch64 build */
#endif
