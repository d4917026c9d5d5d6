/* cpu_tune.h: the CPU backend's matmul cases for the tuner (tune/tune.h),
 * reached through the backend's mm_case_* ops: decode matrix-vector
 * products y = W x (family "gemv", one activation row) and prefill
 * matrix-matrix products Y = X W^T (family "prefill", rows activation rows,
 * e.g. 32 or 128) with a quantized weight W of n rows of k elements. Runs are
 * the CPU backend's own matmul (a backend on the case's pool, parameters set
 * with be_cpu_set_mm_params): convert the activation rows once into the
 * kernel's activation type, then split W's rows into chunks that threads of
 * the pool take from an atomic counter; inside a chunk, activation rows are
 * taken in tiles.
 *
 * Parameters (the backend's be_cpu_mm_params; tn_gemv_params translates):
 *   kernel  the dot variants of cpu_dot_variants (labels "avx2", ...), then
 *           the gemm variants of cpu_gemm_variants ("gemm-avx2",
 *           "gemm-avx512"); the scalar references ("ref", "gemm-ref") are what
 *           every candidate is validated against and never faster, so they are
 *           candidates only when they are the type's default; these run on
 *           the GGUF rows even where the model repacked the weight. Then, when
 *           the model repacks this shape at load (pack.h: cpu_pack_best fits,
 *           HONE_NO_PACK unset), the packed variants of that layout
 *           ("pack-q4_0x16-avx512vnni", ...; the layout's reference excluded)
 *           over packed copies of the rotation: the layout choice, packed or
 *           not and which packed kernel. Default: what the backend uses
 *           untuned (the best packed kernel, else cpu_gemm_pick_k, else
 *           cpu_dot_best)
 *   threads how many of the pool's threads take part (1 runs on the caller
 *           only); default: all of them
 *   chunks  chunks per participating thread; default the backend's (4, or 8
 *           past 64 rows); more chunks balance load when another process
 *           steals a core
 *   tile    (prefill only) activation rows per tile that stay in cache while
 *           a chunk's weight rows stream past; default "auto" (value 0), the
 *           backend's choice
 *
 * Weights stream from memory as they do in a real step: the case owns a
 * rotation buffer (rotate_bytes, at least one matrix) filled with copies of
 * the real matrices (or of synthetic ones), and each run uses the next copy.
 * The buffer is made, and the reference computed, on the case's first
 * reference() call, so a case answered from the cache costs nothing.
 * The reference is the scalar "ref" dot kernel of every (activation row,
 * weight row) over the first copy (spread over the pool's threads; the
 * kernel's result does not depend on the thread); the validation run is
 * rewound to that copy. The stated tolerance is |y - ref| <= 1e-3 |ref| +
 * 1e-4 max|ref| per element (the variants differ only in float summation
 * order; a wrong kernel is off by far more). */
#ifndef HN_CPU_TUNE_H
#define HN_CPU_TUNE_H

#include <stddef.h>
#include <stdint.h>

#include "../../core/pool.h"
#include "../../core/status.h"
#include "../../quant/blocks.h"
#include "../../tune/tune.h"
#include "cpu.h"

/* The decode and prefill families' versions: bump one when its split or the
 * meaning of its parameters changes, and cached winners retune. The version a
 * case carries (tn_gemv_version) adds a checksum of the kernel sources taken
 * at build time, so any change to a kernel also retunes. */
#define TN_GEMV_VERSION "gemv3"
#define TN_PREFILL_VERSION "prefill1"

/* The full version string of the decode (rows == 1) or prefill family. */
const char *tn_gemv_version(int rows);

typedef struct tn_gemv tn_gemv;

/* Makes a decode case (one activation row) for weight type t, k columns and n
 * rows. mats: n_mats borrowed matrices of that type and shape (e.g. one tensor
 * from several layers) whose bytes are copied cyclically into the rotation
 * buffer; NULL makes synthetic weights (random rows quantized with the
 * reference quantizer, tiled). rotate_bytes is the rotation buffer's target
 * size (at least one matrix). p (borrowed) runs the threads;
 * HN_ERR_UNSUPPORTED when t has no dot kernel. */
hn_status tn_gemv_create(qt_type t, int64_t k, int64_t n, const void *const *mats, int n_mats, size_t rotate_bytes,
                         pool *p, tn_gemv **out, hn_err *err);
/* As tn_gemv_create, for a prefill case of `rows` activation rows (2..4096). */
hn_status tn_prefill_create(qt_type t, int64_t k, int64_t n, int rows, const void *const *mats, int n_mats,
                            size_t rotate_bytes, pool *p, tn_gemv **out, hn_err *err);
/* Frees the case (NULL is fine). */
void tn_gemv_free(tn_gemv *g);
/* Fills c to tune g (c borrows g). */
void tn_gemv_case(tn_gemv *g, tn_case *c);
/* Keeps the threads parameter at the pool's size (when other work keeps the
 * CPUs busy, fewer-thread winners measured in isolation do not hold in a model
 * step). Call before tn_gemv_case. */
void tn_gemv_all_threads(tn_gemv *g);
/* Weight bytes one run reads (for GB/s). */
size_t tn_gemv_bytes(const tn_gemv *g);
/* Multiply-adds one run does (rows x k x n). */
double tn_gemv_macs(const tn_gemv *g);
/* The backend parameters of configuration cfg (values of tn_gemv_case's params). */
void tn_gemv_params(const tn_gemv *g, const int *cfg, be_cpu_mm_params *out);

#endif
