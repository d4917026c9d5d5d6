/* dot_dotprod.c: the AArch64 dot kernels of dot_arm.h built for the
 * dot-product extension (-march=armv8.2-a+dotprod: sdot); dot.c registers
 * them only when the CPU reports it (HWCAP_ASIMDDP). */
#if defined(__aarch64__) && defined(__ARM_FEATURE_DOTPROD)

#define ARM_SFX dotprod
#include "dot_arm.h"

#else
/* Not an AArch64 build with the dotprod flags: nothing here (dot.c registers nothing). */
typedef int hn_dot_dotprod_unused;
#endif
