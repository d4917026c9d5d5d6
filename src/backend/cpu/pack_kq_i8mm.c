/* pack_kq_i8mm.c: pack_kq_arm.h's Q4_K / Q5_K / Q6_K x8
 * kernels built for the int8
 * matrix-multiply extension (smmla on pairs of activation rows); run only
 * when the CPU reports it
 * (listed in pack_kq.c's cpu_pack_table_k_arm). */
#if defined(__aarch64__) && defined(__ARM_FEATURE_MATMUL_INT8)

#define ARM_SFX i8mm
#include "pack_kq_arm.h"

#else
typedef int hn_pack_kq_i8mm_unused; /* not an AArch64 build with this file's flags */
#endif
