/* gemm.h: multi-row CPU matmul kernels: one weight row against up to
 * CPU_GEMM_MAX_NA activation rows per call.
 *
 * A dot kernel (dot.h) decodes a weight row once per activation row; a gemm
 * kernel decodes each chunk of the weight row once (nibbles, 6-bit scales,
 * mins) and multiplies it into every activation row of the call while it is
 * still in registers. Decode (1-8 rows) and prefill (tiles of 8) share the
 * kernels: the matmul walks weight rows and calls the kernel on tiles of
 * activation rows.
 *
 * Activations are the blocks dot.h's converters produce for the weight type
 * (cpu_dot_best(t)->act, act_type Q8_0 or Q8_K): a gemm kernel is only handed
 * out when its act_type equals the dot registry's, so both always read the
 * same bytes. The reference for every type is a loop of dot.h's reference dot;
 * every variant is tested against it (tests/test_gemm.c). */
#ifndef HN_CPU_GEMM_H
#define HN_CPU_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include "../../quant/blocks.h"

#define CPU_GEMM_MAX_NA 8

/* s[r] = dot(w[0..k), a[r][0..k)) for r < na (1 <= na <= CPU_GEMM_MAX_NA). */
typedef void (*cpu_gemm_fn)(int64_t k, const void *restrict w, int na, const void *const *restrict a,
                            float *restrict s);

/* Rearranges one converted activation row (act_type blocks, k elements) into
 * the private layout a kernel reads instead (out: prep_bytes(k) bytes). */
typedef void (*cpu_gemm_prep_fn)(int64_t k, const void *restrict act, void *restrict out);

typedef struct cpu_gemm_kernel {
    qt_type wtype;
    qt_type act_type;
    cpu_gemm_fn fn;
    const char *isa; /* "ref", "avx2", "avx512" */
    /* NULL: fn reads the converter's blocks. Else fn reads rows made by prep
     * from them, prep_bytes(k) bytes each (at most 4 bytes per element), and
     * only for k a multiple of k_align. */
    cpu_gemm_prep_fn prep;
    size_t (*prep_bytes)(int64_t k);
    int k_align;
} cpu_gemm_kernel;

/* Whether kernel g can run rows of k elements (k a multiple of its k_align). */
static inline int cpu_gemm_fits(const cpu_gemm_kernel *g, int64_t k) { return !g->prep || k % g->k_align == 0; }

/* The fastest gemm variant this CPU runs for t, or NULL (no kernel, or the dot
 * registry's activation type differs from what the kernel reads). */
const cpu_gemm_kernel *cpu_gemm_best(qt_type t);
/* The default variant for a matmul of na activation rows: cpu_gemm_best, except
 * Q4_K and Q5_K at one row, where AVX2 beats AVX-512 on Zen 4. Variants that the pick
 * may mix are bit-identical (tested), so a row's result never depends on the
 * batch it is in. NULL as cpu_gemm_best. */
const cpu_gemm_kernel *cpu_gemm_pick(qt_type t, int na);
/* As cpu_gemm_pick, for rows of k elements (skips variants that cannot run k). */
const cpu_gemm_kernel *cpu_gemm_pick_k(qt_type t, int na, int64_t k);
/* The reference for t (dot.h's reference dot per activation row), or NULL. */
const cpu_gemm_kernel *cpu_gemm_ref(qt_type t);
/* Every variant this CPU can run for t (reference first); returns the count (at most cap written). */
int cpu_gemm_variants(qt_type t, const cpu_gemm_kernel **out, int cap);

#endif
