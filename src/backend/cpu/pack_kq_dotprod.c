/* pack_kq_dotprod.c: pack_kq_arm.h's Q4_K / Q5_K / Q6_K x8
 * kernels built for the dot-product
 * extension (sdot); run only when the CPU reports it
 * (listed in pack_kq.c's cpu_pack_table_k_arm). */
#if defined(__aarch64__) && defined(__ARM_FEATURE_DOTPROD)

#define ARM_SFX dotprod
#include "pack_kq_arm.h"

#else
typedef int hn_pack_kq_dotprod_unused; /* not an AArch64 build with this file's flags */
#endif
