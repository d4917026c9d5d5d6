/* pack.h: weights repacked once at load into row-interleaved layouts.
 *
 * A GGUF weight stores each output row's blocks one after another. A packed
 * layout interleaves R consecutive rows (a "group") block by block, so one
 * kernel call streams R rows' codes and scales from one contiguous run of
 * memory, decodes scales for R rows with one vector op, and keeps R x na
 * accumulators in registers: the activation row is loaded once per R weight
 * rows (decode) and the weight block once per na activation rows (prefill).
 *
 * Contract of a cpu_pack_kernel:
 *   - pack(k, src, src_row_bytes, dst) turns R consecutive GGUF rows of k
 *     elements (src, rows src_row_bytes apart) into one group of
 *     group_bytes(k) bytes; it is pure (the same bytes in give the same bytes out).
 *   - fn(k, group, na, a, s) writes s[r * R + j] = dot(row j of the group,
 *     activation row r) for r < na (1..CPU_PACK_MAX_NA) and j < R, where a[r]
 *     points to the activation row in act_type blocks (as dot.h's converter
 *     for wtype writes them), or to the prep'd row when prep is set.
 *   - A row's result does not depend on na, nor on the other rows of the call
 *     (decode and prefill of the same token agree bit for bit).
 *   - Results match dot.h's reference dot of the unpacked row within the
 *     tolerance tests/test_gemm.c holds gemm kernels to.
 *   - Kernels of the same wtype and layout read the same packed bytes, so the
 *     backend (or the tuner) can switch between them without repacking.
 *   - prep, when set, rearranges one converted activation row into at most
 *     4 bytes per element (prep_bytes(k) <= 4 * k), as gemm.h's prep passes;
 *     kernels sharing a prep function can share one prepped copy.
 * Rows past the last full group (N not a multiple of R) stay unpacked and
 * run the ordinary kernels on the original data. */
#ifndef HN_CPU_PACK_H
#define HN_CPU_PACK_H

#include <stddef.h>
#include <stdint.h>

#include "../../quant/blocks.h"
#include "gemm.h"

/* most activation rows per packed-kernel call */
#define CPU_PACK_MAX_NA 8
/* most weight rows per group (R) */
#define CPU_PACK_MAX_ROWS 16

/* layout ids (per weight type; 0 means not packed) */
enum {
    CPU_LAYOUT_NONE = 0,
    CPU_LAYOUT_X4 = 1,  /* 4 rows interleaved per block */
    CPU_LAYOUT_X8 = 2,  /* 8 rows interleaved per block */
    CPU_LAYOUT_X16 = 3, /* 16 rows interleaved per block */
};

typedef void (*cpu_pack_fn)(int64_t k, const void *restrict src, size_t src_row_bytes, void *restrict dst);
typedef void (*cpu_packed_gemm_fn)(int64_t k, const void *restrict group, int na, const void *const *restrict a,
                                   float *restrict s);

typedef struct cpu_pack_kernel {
    qt_type wtype;
    qt_type act_type;             /* the dot registry's activation type for wtype (Q8_0, Q8_K, ...) */
    int layout;                   /* CPU_LAYOUT_* */
    int rows;                     /* R: weight rows per group */
    int64_t k_align;              /* k must be a multiple of this */
    const char *name;             /* e.g. "q4_0x8-avx512vnni" */
    size_t (*group_bytes)(int64_t k);
    cpu_pack_fn pack;
    cpu_packed_gemm_fn fn;
    cpu_gemm_prep_fn prep;        /* optional activation rearrangement (NULL: none), as in gemm.h */
    size_t (*prep_bytes)(int64_t k);
    /* row j of a group back to its GGUF bytes (the inverse of pack; the layout's reference uses it) */
    void (*unpack_row)(int64_t k, const void *restrict group, int j, void *restrict dst);
    unsigned isa;                 /* CPU_ISA_* bits the kernel needs (0: portable C) */
} cpu_pack_kernel;

/* isa bits: what cpu_dot_features() must report for a kernel to run */
enum {
    CPU_ISA_AVX2 = 1u << 0,      /* avx2 + fma + f16c */
    CPU_ISA_AVX512 = 1u << 1,    /* avx512f + avx512bw (+ vl) */
    CPU_ISA_VNNI512 = 1u << 2,   /* avx512vnni */
    CPU_ISA_AVXVNNI = 1u << 3,   /* avx_vnni (VEX-encoded vpdpbusd) */
    CPU_ISA_NEON = 1u << 4,      /* AArch64 Advanced SIMD */
    CPU_ISA_DOTPROD = 1u << 5,   /* AArch64 sdot / udot */
    CPU_ISA_I8MM = 1u << 6,      /* AArch64 smmla / usmmla */
};

/* Kernel tables: each kernel file exports one (pack.c's registry walks them,
 * in this order, keeping the entries whose isa this CPU has). Within a table,
 * entries of a type go slowest first, and a layout's reference (isa 0, fn =
 * unpack_row + dot.h's reference dot) comes before its other portable kernels.
 * The K-quant tables are optional at link time (pack.c declares them weak). */
typedef struct cpu_pack_table {
    const cpu_pack_kernel *k;
    int n;
} cpu_pack_table;
extern const cpu_pack_table cpu_pack_table_0;   /* pack_q0.c: Q4_0, Q8_0 (refs + portable) */
extern const cpu_pack_table cpu_pack_table_k;   /* pack_kq.c: Q4_K, Q5_K, Q6_K (refs + portable) */
#if defined(__x86_64__)
extern const cpu_pack_table cpu_pack_table_0_x86; /* pack_q0_vnni.c / _avx2.c kernels (one table) */
extern const cpu_pack_table cpu_pack_table_k_x86; /* pack_kq_vnni.c / _avx2.c kernels (one table) */
#endif
#if defined(__aarch64__)
extern const cpu_pack_table cpu_pack_table_0_arm; /* pack_q0_neon.c / _dotprod.c / _i8mm.c kernels */
extern const cpu_pack_table cpu_pack_table_k_arm; /* pack_kq_neon.c / _dotprod.c / _i8mm.c kernels */
#endif

/* Every packed variant this CPU runs for t, slowest first (returns the count; at most cap written). */
int cpu_pack_variants(qt_type t, const cpu_pack_kernel **out, int cap);
/* The fastest packed variant this CPU runs for t and rows of k elements (never a
 * layout's reference), or NULL. */
const cpu_pack_kernel *cpu_pack_best(qt_type t, int64_t k);
/* The reference kernel of a layout: unpack_row + dot.h's reference dot per
 * row (slow; for tests and the tuner's validation), or NULL. */
const cpu_pack_kernel *cpu_pack_ref(qt_type t, int layout);
/* Whether kernel p can run rows of k elements. */
static inline int cpu_pack_fits(const cpu_pack_kernel *p, int64_t k) { return k > 0 && k % p->k_align == 0; }

#endif
