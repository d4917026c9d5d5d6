/* gemv.h: the first tunable kernel family: decode matrix-vector products
 * y = W x (one activation row) with a quantized weight W of n rows of k
 * elements, run by the CPU backend's own matmul (a backend on the case's
 * pool, parameters set with be_cpu_set_mm_params): convert x once into the
 * kernel's activation type, then split W's rows into chunks that threads of
 * the pool take from an atomic counter.
 *
 * Parameters:
 *   kernel  the dot variants of cpu_dot_variants (labels "ref", "avx2", ...),
 *           then the gemm variants of cpu_gemm_variants ("gemm-ref",
 *           "gemm-avx2", "gemm-avx512"); default: what the backend uses
 *           untuned (cpu_gemm_pick, else cpu_dot_best)
 *   threads how many of the pool's threads take part (1 runs on the caller
 *           only); default: all of them
 *   chunks  chunks per participating thread (the backend's split is 4);
 *           more chunks balance load when another process steals a core
 *
 * Weights stream from memory as they do in a real decode step: the case owns a
 * rotation buffer of at least 2x the last level cache filled with copies of
 * the real matrices (or of synthetic ones), and each run uses the next copy.
 * The buffer is made, and the reference computed, on the case's first
 * reference() call, so a case answered from the cache costs nothing.
 * The reference is the scalar "ref" dot kernel on one thread over the first
 * copy; the validation run is rewound to that copy. The stated tolerance is
 * |y - ref| <= 1e-3 |ref| + 1e-4 max|ref| per element (the variants differ
 * only in float summation order; a wrong kernel is off by far more). */
#ifndef HN_TN_GEMV_H
#define HN_TN_GEMV_H

#include <stddef.h>
#include <stdint.h>

#include "../core/pool.h"
#include "../core/status.h"
#include "../quant/blocks.h"
#include "tune.h"

/* Bump when the kernels or the split change: cached winners then retune. */
#define TN_GEMV_VERSION "gemv2"

typedef struct tn_gemv tn_gemv;

/* Makes a case for weight type t, k columns and n rows. mats: n_mats borrowed
 * matrices of that type and shape (e.g. one tensor from several layers) whose
 * bytes are copied cyclically into the rotation buffer; NULL makes synthetic
 * weights (random rows quantized with the reference quantizer, tiled).
 * rotate_bytes is the rotation buffer's target size (at least one matrix).
 * p (borrowed) runs the threads; HN_ERR_UNSUPPORTED when t has no dot kernel. */
hn_status tn_gemv_create(qt_type t, int64_t k, int64_t n, const void *const *mats, int n_mats, size_t rotate_bytes,
                         pool *p, tn_gemv **out, hn_err *err);
/* Frees the case (NULL is fine). */
void tn_gemv_free(tn_gemv *g);
/* Fills c to tune g (c borrows g). */
void tn_gemv_case(tn_gemv *g, tn_case *c);
/* Weight bytes one run reads (for GB/s). */
size_t tn_gemv_bytes(const tn_gemv *g);

#endif
