/* pack_kq_int.h: private to the K-quant packed kernels (pack_kq.c and
 * pack_kq_<isa>.c): the packed layouts' shapes and the ISA kernels' entry
 * points that pack_kq.c lists in cpu_pack_table_k_x86.
 *
 * All three layouts interleave R = 8 rows. A group of k elements is one
 * record per 256-element super-block: the 8 rows' header, then their codes.
 * (One stream: a separate header region, read beside the codes, costs a
 * third of the DRAM bandwidth a single thread gets.)
 * Inside a code block, a 64-byte vector holds 4 bytes for each of 16 i32
 * lanes, lane L = 2 * row + e: rows 0..7, and e picks which of two 4-byte
 * runs of the row the lane carries. A kernel keeps one i32 accumulator per
 * lane, so the two lanes of a row are summed once, at the end of the call.
 *
 * Q4_K header (160 bytes): d[8], dmin[8] (f16 bits, row order); sc[8][8]
 *   (sub-block j, row: the 6-bit scales as bytes); mn[2][8][4] (half u, row,
 *   sub-block 4u + i: the 6-bit mins as bytes).
 * Q4_K codes (1024 bytes): chunk c (0..15) = 64 bytes, row r's bytes
 *   qs[8c .. 8c+8) at 8r (the GGUF bytes: low nibble = element 64(c/4) + 8(c%4) + m,
 *   high nibble the same + 32).
 * Q5_K: the Q4_K header and codes, then 32 bytes of fifth bits per chunk
 *   (1280 bytes of codes in all): a 64-bit mask for the low nibbles, then one
 *   for the high nibbles, bit b = byte b of the chunk.
 * Q6_K header (144 bytes): d[8] (f16 bits), sc[8][8][2] (sub-block pair p,
 *   row, e: scale of sub-block 2p + e, signed bytes).
 * Q6_K codes (1536 bytes): per pair p three vectors A, B, C; byte 8r + 4e + b
 *   of quad q (0..3) is the code of row r, element 16(2p + e) + 4q + b:
 *   quads 0 and 1 are A's and B's low 6 bits, quad 2 is C's low nibble with
 *   A's top 2 bits above it, quad 3 C's high nibble with B's top 2 bits.
 *   Its kernels read activations rearranged by cpu_pack_kq_prep_q6_K into
 *   the same (pair, quad, e) order. */
#ifndef HN_CPU_PACK_KQ_INT_H
#define HN_CPU_PACK_KQ_INT_H

#include "pack.h"

#define KQ_R 8

#define KQ4_HDR 160
#define KQ4_SB (KQ4_HDR + 1024) /* Q4_K record: 8 x 148 bytes (GGUF: 8 x 144) */
#define KQ5_SB (KQ4_HDR + 1280) /* Q5_K record: 8 x 180 bytes (GGUF: 8 x 176) */
#define KQ6_HDR 144
#define KQ6_SB (KQ6_HDR + 1536) /* Q6_K record: 8 x 210 bytes, as GGUF */

/* Q6_K's prepped activation block: per super-block the codes in (pair, quad,
 * e) order, -32 * bsums as i32 (pairs in the same order as the scales), the
 * activation scale; 384 bytes so blocks stay 64-byte aligned. */
typedef struct {
    int8_t qs[256];
    int32_t nb[16];
    float d;
    int32_t pad[15];
} kq6_prep_block;
static_assert(sizeof(kq6_prep_block) == 384, "kq6_prep_block size");

void cpu_pack_kq_prep_q6_K(int64_t k, const void *restrict act, void *restrict out);
size_t cpu_pack_kq_prep_bytes_q6_K(int64_t k);

#if defined(__x86_64__)
void cpu_pack_q4_K_vnni(int64_t k, const void *restrict group, int na, const void *const *restrict a, float *restrict s);
void cpu_pack_q5_K_vnni(int64_t k, const void *restrict group, int na, const void *const *restrict a, float *restrict s);
void cpu_pack_q6_K_vnni(int64_t k, const void *restrict group, int na, const void *const *restrict a, float *restrict s);
void cpu_pack_q4_K_avx2(int64_t k, const void *restrict group, int na, const void *const *restrict a, float *restrict s);
void cpu_pack_q5_K_avx2(int64_t k, const void *restrict group, int na, const void *const *restrict a, float *restrict s);
void cpu_pack_q6_K_avx2(int64_t k, const void *restrict group, int na, const void *const *restrict a, float *restrict s);
#endif
#if defined(__aarch64__)
/* pack_kq_arm.h built as pack_kq_neon.c, pack_kq_dotprod.c, pack_kq_i8mm.c (bit-identical to each other) */
#define CPU_PACK_KQ_ARM_DECL(sfx)                                                                            \
    void cpu_pack_q4_K_##sfx(int64_t k, const void *restrict group, int na, const void *const *restrict a, \
                             float *restrict s);                                                            \
    void cpu_pack_q5_K_##sfx(int64_t k, const void *restrict group, int na, const void *const *restrict a, \
                             float *restrict s);                                                            \
    void cpu_pack_q6_K_##sfx(int64_t k, const void *restrict group, int na, const void *const *restrict a, \
                             float *restrict s);
CPU_PACK_KQ_ARM_DECL(neon)
CPU_PACK_KQ_ARM_DECL(dotprod)
CPU_PACK_KQ_ARM_DECL(i8mm)
#endif

#endif
