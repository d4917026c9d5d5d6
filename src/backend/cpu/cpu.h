/* cpu.h: the CPU backend. Kernels run on the caller's thread pool; matmuls
 * convert activations once per row with dot.h's converter for the weight type
 * and then use a multi-row gemm kernel (gemm.h) where the type has one, else
 * the fastest dot kernel of dot.h, else dequantize weight rows with the quant
 * module's reference to_float and take f32 dots. The kernel choice, the work
 * split and the thread count can be set per weight type (be_cpu_set_mm_params)
 * and per weight shape and call size (be_cpu_set_mm_params_shape), which is
 * how tuned parameters reach the real path. */
#ifndef HN_BACKEND_CPU_H
#define HN_BACKEND_CPU_H

#include "../../core/pool.h"
#include "../backend.h"

/* Creates a CPU backend running on pool p (borrowed: it must outlive the
 * backend). Call ops->reserve before the first op. (be_create("cpu") in
 * registry.h makes one with its own pool.) */
hn_status be_cpu_create(pool *p, be_backend **out, hn_err *err);
/* The pool the backend runs on. */
pool *be_cpu_pool(be_backend *b);

/* Repacks a weight in place (what weight_load does for BE_W_MATMUL): records
 * the backend-owned copy in w->packed / w->layout, or leaves w unpacked when
 * its type has no layout (or packing is off). Fails only when out of memory.
 * flags: BE_W_DROP_SOURCE. For tests and benches of the CPU kernels. */
hn_status be_cpu_prepare_weight(be_backend *b, be_tensor *w, unsigned flags, hn_err *err);

/* A tensor handle over host memory, for tests and benches of the CPU backend
 * (on the CPU a handle's data is a host pointer). */
static inline be_tensor be_cpu_host(qt_type t, void *p) {
    be_tensor x = {.type = t, .ne = {0, 0, 1}};
    x.data = p;
    return x;
}

/* Test hook: when set, matmuls ignore dot kernels and use the dequantize +
 * f32 path (the scalar reference every kernel is compared with). */
void be_cpu_force_reference(be_backend *b, bool on);

/* Load-time repacking: ops->prepare_weight copies a weight into the
 * row-interleaved layout of the fastest packed kernel (pack.h) when its type
 * has one; matmuls then run that kernel on whole groups of rows and the
 * ordinary kernels on the rows past the last group. HONE_NO_PACK=1 in the
 * environment (read at create) turns packing off, for comparisons. */

/* Matmul parameters for one weight type, as the tuner chooses them (all 0:
 * the defaults). They change speed only, never results beyond float
 * summation order: every kernel choice is validated against its reference. */
/* be_mm_params as the CPU backend reads them:
 *   kernel: 0: default (cpu_gemm_pick, else the best dot kernel); v >= 1: variant v-1 of
 *           cpu_gemm_variants(type); v <= -1: dot variant -v-1 of cpu_dot_variants(type)
 *           (one activation row per call); out of range: the default
 *   chunks: weight-row chunks per taking-part thread (0: default, 4 for decode, 8 past 64 rows)
 *   threads: threads that take part (0 or more than the pool has: all)
 *   pack:   weights repacked at load (pack.h): 0: the default packed kernel; -1: ignore the
 *           packed copy (the kernels above on the GGUF rows); v >= 1: variant v-1 of
 *           cpu_pack_variants(type) when it reads the weight's layout (else the default)
 *   tile:   activation rows per tile kept in cache while a chunk's weight rows stream past
 *           (0: default, 64 with a gemm kernel, 16 with a dot kernel) */
typedef be_mm_params be_cpu_mm_params;

/* Sets the parameters of matmuls over weights of type t from now on (NULL:
 * back to defaults). Not thread-safe against running ops: call between steps. */
void be_cpu_set_mm_params(be_backend *b, qt_type t, const be_cpu_mm_params *p);

/* most per-shape entries (be_cpu_set_mm_params_shape) */
#define BE_CPU_MM_SHAPES 128

/* Sets the parameters of matmuls over weights of type t with rows of k
 * elements and n output rows, for calls of at least min_rows (>= 1) activation
 * rows: a call uses the entry of its shape with the largest min_rows <= its
 * rows (e.g. decode at 1, prefill at 9), which overrides the type's
 * parameters (single-matrix weights only: expert stacks keep the type's). Replaces an entry of the same (t, k, n, min_rows); NULL removes
 * it. Returns false when the table is full or the arguments are bad. Not
 * thread-safe against running ops: call between steps. */
bool be_cpu_set_mm_params_shape(be_backend *b, qt_type t, int64_t k, int64_t n, int min_rows,
                                const be_cpu_mm_params *p);
/* Removes every per-shape entry. */
void be_cpu_clear_mm_params_shape(be_backend *b);

#endif
