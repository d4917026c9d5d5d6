/* pack_q0.h: the x16 layouts of Q4_0 and Q8_0 and the activation rows their
 * kernels read (private to pack_q0*.c).
 *
 * A group is 16 consecutive weight rows of nb = k/32 blocks. Codes first,
 * block by block, then the 16 rows' f16 scales block by block:
 *   Q4_0: codes nb x 256 bytes: vector v (0..3) of block b is 64 bytes, lane
 *         l (row l) holds that row's GGUF bytes qs[4v..4v+3]: the low nibbles
 *         are elements 4v..4v+3, the high ones 16+4v..16+4v+3 (unsigned codes;
 *         the value is code - 8). Then nb x 16 scales.
 *   Q8_0: codes nb x 512 bytes: vector q (0..7), lane l holds row l's
 *         elements 4q..4q+3 plus 128 (unsigned). Then nb x 16 scales.
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

#endif
