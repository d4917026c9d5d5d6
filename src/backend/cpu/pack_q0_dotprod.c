/* pack_q0_dotprod.c: pack_q0_arm.h's kernels built for the dot-product
 * extension (sdot by element); listed in cpu_pack_table_0_arm and run only
 * when the CPU reports it. */
#if defined(__aarch64__) && defined(__ARM_FEATURE_DOTPROD)

#define ARM_SFX dotprod
#include "pack_q0_arm.h"

#else
typedef int hn_pack_q0_dotprod_unused; /* not an AArch64 build with the dotprod flags */
#endif
