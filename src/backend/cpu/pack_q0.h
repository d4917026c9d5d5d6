/* pack_q0.h: the x16 layouts of Q4_0 and Q8_0 and the activation rows their
 * kernels read (private to pack_q0*.c).
 *
 * A group is 16 consecutive weight rows of nb = k/32 blocks, block after
 * block; a block is its codes, then the 16 rows' f16 scales (one stream):
 *   Q4_0: 256 bytes of codes: vector v (0..3) is 64 bytes, lane l (row l)
 *         holds that row's GGUF bytes qs[4v..4v+3]: the low nibbles are
 *         elements 4v..4v+3, the high ones 16+4v..16+4v+3 (unsigned codes;
 *         the value is code - 8); then 16 scales (288 bytes a block).
 *   Q8_0: 512 bytes of codes: vector q (0..7), lane l holds row l's
 *         elements 4q..4q+3 plus 128 (unsigned); then 16 scales (544 bytes).
 * One 64-byte vector is thus 16 rows x 4 elements: a dot-product instruction
 * (vpdpbusd, or vpmaddubsw + vpmaddwd) against one broadcast 4-element piece
 * of an activation block gives 16 rows' partial sums at once.
 *
 * Activations: each Q8_0 block prepped into pq0_act, which adds the
 * corrections for the unsigned codes (-8 and -128 times the block's sum) and
 * the scale as a float. Every kernel sums a block's products exactly in i32,
 * then does acc[row] = fma(d_w[row] * d_a, (float)sum, acc[row]) in block
 * order, so all kernels of a layout agree bit for bit, whatever na. */
#ifndef HN_CPU_PACK_Q0_H
#define HN_CPU_PACK_Q0_H

#include "pack.h"

#define PQ0_R 16
/* bytes of one block of a group: its codes, then the 16 rows' f16 scales */
#define PQ4_BS (PQ0_R * 16 + PQ0_R * 2)
#define PQ8_BS (PQ0_R * 32 + PQ0_R * 2)
/* the scales of block b of group g */
#define PQ4_D(g, b) ((const uint16_t *)((const unsigned char *)(g) + (size_t)(b) * PQ4_BS + PQ0_R * 16))
#define PQ8_D(g, b) ((const uint16_t *)((const unsigned char *)(g) + (size_t)(b) * PQ8_BS + PQ0_R * 32))

typedef struct {
    int8_t qs[32];
    int32_t c4;  /* -8 * sum(qs): Q4_0's offset */
    int32_t c8;  /* -128 * sum(qs): Q8_0's bias */
    float d;
    int32_t pad;
} pq0_act;

#if defined(__x86_64__)
void cpu_pack_q4_0x16_avx2(int64_t k, const void *restrict g, int na, const void *const *restrict a, float *restrict s);
void cpu_pack_q8_0x16_avx2(int64_t k, const void *restrict g, int na, const void *const *restrict a, float *restrict s);
void cpu_pack_q4_0x16_vnni(int64_t k, const void *restrict g, int na, const void *const *restrict a, float *restrict s);
void cpu_pack_q8_0x16_vnni(int64_t k, const void *restrict g, int na, const void *const *restrict a, float *restrict s);
#endif
#if defined(__aarch64__)
/* pack_q0_neon.c (base ISA), pack_q0_dotprod.c (sdot), pack_q0_i8mm.c (smmla) */
void cpu_pack_q4_0x16_neon(int64_t k, const void *restrict g, int na, const void *const *restrict a, float *restrict s);
void cpu_pack_q8_0x16_neon(int64_t k, const void *restrict g, int na, const void *const *restrict a, float *restrict s);
void cpu_pack_q4_0x16_dotprod(int64_t k, const void *restrict g, int na, const void *const *restrict a, float *restrict s);
void cpu_pack_q8_0x16_dotprod(int64_t k, const void *restrict g, int na, const void *const *restrict a, float *restrict s);
void cpu_pack_q4_0x16_i8mm(int64_t k, const void *restrict g, int na, const void *const *restrict a, float *restrict s);
void cpu_pack_q8_0x16_i8mm(int64_t k, const void *restrict g, int na, const void *const *restrict a, float *restrict s);
#endif

#endif
