/* dot.h: CPU dot-product kernels between a quantized weight row and an
 * activation row, the inner loop of every matmul.
 *
 * Activations are f32 in the model; before a matmul each activation row is
 * converted once with `act` into the kernel's act_type (Q8_0 or Q8_1 for the
 * 32-block types, Q8_K for the K-quants, F32 for F32/F16, BF16 for BF16), then `dot`
 * runs against every weight row. Each weight type has a scalar reference
 * (isa "ref") and, where the CPU has them, faster variants chosen at run time
 * by CPU features (cpu_dot_best). Every variant is tested against the reference. */
#ifndef HN_CPU_DOT_H
#define HN_CPU_DOT_H

#include <stdbool.h>
#include <stdint.h>

#include "../../quant/blocks.h"

/* s = dot(w[0..n), a[0..n)) with w in the weight type and a in act_type. */
typedef void (*cpu_dot_fn)(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);
/* Converts n f32 activations into act_type (n a multiple of its block size). */
typedef void (*cpu_act_fn)(const float *restrict x, void *restrict y, int64_t n);

typedef struct cpu_dot_kernel {
    qt_type wtype;
    qt_type act_type;
    cpu_act_fn act;
    cpu_dot_fn dot;
    const char *isa;   /* "ref", "avx2", "neon", "dotprod" ... */
} cpu_dot_kernel;

/* The fastest variant this CPU supports for weight type t, or NULL if the type has no kernel. */
const cpu_dot_kernel *cpu_dot_best(qt_type t);
/* The scalar reference for weight type t, or NULL. */
const cpu_dot_kernel *cpu_dot_ref(qt_type t);
/* Every variant this CPU can run for t (reference first); returns the count (at most cap written). */
int cpu_dot_variants(qt_type t, const cpu_dot_kernel **out, int cap);

/* One activation converter: the scalar reference or a SIMD version of it that
 * writes the same bytes. The registry's act functions dispatch to the fastest
 * one this CPU runs; the list is for tests and benchmarks. */
typedef struct cpu_act_kernel {
    qt_type act_type;
    cpu_act_fn act;
    const char *isa; /* "ref", "avx2", "avx512", "neon" */
} cpu_act_kernel;

/* Every converter to act_type this CPU can run (reference first); returns the count (at most cap written). */
int cpu_act_variants(qt_type act_type, const cpu_act_kernel **out, int cap);

/* What this CPU and OS support, as the kernels ask it: a view of core/isa.h's
 * probe (the program's one), made once on first use (thread-safe). */
typedef struct cpu_features {
    bool avx2, fma, f16c;
    bool avx512f, avx512bw, avx512vnni, avx_vnni;
    bool neon;
    bool avx512bf16; /* vdpbf16ps (AVX512_BF16) */
    bool dotprod;    /* AArch64 sdot / udot (HWCAP_ASIMDDP) */
    bool i8mm;       /* AArch64 smmla / usmmla / usdot (HWCAP2_I8MM) */
} cpu_features;

/* Returns the detected features (never NULL; all false on unknown CPUs). */
const cpu_features *cpu_dot_features(void);

#endif
