/* gemm_dotprod.c: gemm_arm.h's kernels built for the dot-product extension
 * (sdot); gemm.c registers them only when the CPU reports it. They write the
 * same bits as gemm_neon.c's. */
#if defined(__aarch64__) && defined(__ARM_FEATURE_DOTPROD)

#define ARM_SFX dotprod
#include "gemm_arm.h"

#else
typedef int hn_gemm_dotprod_unused; /* not an AArch64 build with the dotprod flags */
#endif
