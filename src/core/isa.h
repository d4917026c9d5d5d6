/* isa.h: the instruction-set extensions this CPU and OS support, probed once.
 *
 * The one CPU-feature probe of the program: the CPU backend picks its kernels
 * by it (backend/cpu/dot.h's cpu_features is a view of it), quant/ picks its
 * f16 rows by it, and the tuner prints it and keys the device fingerprint by
 * it (tune/probe.h). On x86 it reads cpuid, and an extension counts only when
 * the OS saves its registers (xgetbv: YMM for AVX*, opmask and ZMM for
 * AVX-512, tile state for AMX); on AArch64 Linux it reads getauxval; elsewhere
 * it reports nothing. */
#ifndef HN_ISA_H
#define HN_ISA_H

#include <stdint.h>

/* ISA flags (bits of hn_isa()). Append only: the names table in isa.c
 * follows it, and the tuner's fingerprint hashes the bits. */
enum {
    HN_ISA_SSE42 = 1u << 0,
    HN_ISA_AVX = 1u << 1,
    HN_ISA_AVX2 = 1u << 2,
    HN_ISA_FMA = 1u << 3,
    HN_ISA_F16C = 1u << 4,
    HN_ISA_AVX512F = 1u << 5,
    HN_ISA_AVX512BW = 1u << 6,
    HN_ISA_AVX512VL = 1u << 7,
    HN_ISA_AVX512VNNI = 1u << 8,
    HN_ISA_AVX512BF16 = 1u << 9,
    HN_ISA_AVXVNNI = 1u << 10,
    HN_ISA_AMX_TILE = 1u << 11,
    HN_ISA_AMX_INT8 = 1u << 12,
    HN_ISA_AMX_BF16 = 1u << 13,
    HN_ISA_NEON = 1u << 14,
    HN_ISA_DOTPROD = 1u << 15,
    HN_ISA_I8MM = 1u << 16,
    HN_ISA_SVE = 1u << 17,
    HN_ISA_COUNT = 18
};

/* Returns the HN_ISA_* bits this machine supports; probed on the first call
 * (thread-safe), cheap afterwards. Cannot fail: 0 on an unknown CPU. */
uint32_t hn_isa(void);

/* Returns the name of flag bit i ("sse4.2", "avx2", "avx512f", ...), or NULL
 * when i is not in 0 .. HN_ISA_COUNT-1. */
const char *hn_isa_name(int i);

#endif
