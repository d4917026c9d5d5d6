/* pack_q0_neon.c: pack_q0_arm.h's kernels for the base AArch64 ISA (listed in
 * pack_q0.c's cpu_pack_table_0_arm). */
#if defined(__aarch64__)

#define ARM_SFX neon
#include "pack_q0_arm.h"

#else
typedef int hn_pack_q0_neon_unused; /* not an AArch64 build */
#endif
