/* pack_kq_neon.c: pack_kq_arm.h's Q4_K / Q5_K / Q6_K x8
 * kernels for the base AArch64 ISA
 * (listed in pack_kq.c's cpu_pack_table_k_arm). */
#if defined(__aarch64__)

#define ARM_SFX neon
#include "pack_kq_arm.h"

#else
typedef int hn_pack_kq_neon_unused; /* not an AArch64 build with this file's flags */
#endif
