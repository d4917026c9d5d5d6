/* blocks.h: the tensor types hone reads from GGUF and their block layouts.
 *
 * The enum values are GGUF's on-disk type ids (append-only; gaps are ids that
 * GGUF retired). Each quantized type stores a row as a sequence of fixed-size
 * blocks; the structs below are those blocks byte for byte, checked by
 * static_assert, and shared by the C kernels and (later) CUDA. Scales are IEEE
 * half (uint16_t bits) unless noted. */
#ifndef HN_QUANT_BLOCKS_H
#define HN_QUANT_BLOCKS_H

#include <assert.h>
#include <stdint.h>

typedef enum qt_type {
    QT_F32 = 0,
    QT_F16 = 1,
    QT_Q4_0 = 2,
    QT_Q4_1 = 3,
    QT_Q5_0 = 6,
    QT_Q5_1 = 7,
    QT_Q8_0 = 8,
    QT_Q8_1 = 9,
    QT_Q2_K = 10,
    QT_Q3_K = 11,
    QT_Q4_K = 12,
    QT_Q5_K = 13,
    QT_Q6_K = 14,
    QT_Q8_K = 15,
    QT_IQ2_XXS = 16,
    QT_IQ2_XS = 17,
    QT_IQ3_XXS = 18,
    QT_IQ1_S = 19,
    QT_IQ4_NL = 20,
    QT_IQ3_S = 21,
    QT_IQ2_S = 22,
    QT_IQ4_XS = 23,
    QT_I8 = 24,
    QT_I16 = 25,
    QT_I32 = 26,
    QT_I64 = 27,
    QT_F64 = 28,
    QT_IQ1_M = 29,
    QT_BF16 = 30,
    QT_TQ1_0 = 34,
    QT_TQ2_0 = 35,
    QT_MXFP4 = 39,
    QT_TYPE_COUNT = 40
} qt_type;

#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK8_0 32
#define QK8_1 32
#define QK4_NL 32
#define QK_MXFP4 32
#define QK_K 256
#define K_SCALE_SIZE 12

typedef struct { uint16_t d; uint8_t qs[QK4_0 / 2]; } block_q4_0;
static_assert(sizeof(block_q4_0) == 18, "block_q4_0 size");

typedef struct { uint16_t d, m; uint8_t qs[QK4_1 / 2]; } block_q4_1;
static_assert(sizeof(block_q4_1) == 20, "block_q4_1 size");

typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; } block_q5_0;
static_assert(sizeof(block_q5_0) == 22, "block_q5_0 size");

typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; } block_q5_1;
static_assert(sizeof(block_q5_1) == 24, "block_q5_1 size");

typedef struct { uint16_t d; int8_t qs[QK8_0]; } block_q8_0;
static_assert(sizeof(block_q8_0) == 34, "block_q8_0 size");

/* d = scale, s = d * sum(qs) */
typedef struct { uint16_t d, s; int8_t qs[QK8_1]; } block_q8_1;
static_assert(sizeof(block_q8_1) == 36, "block_q8_1 size");

/* 2.625 bits: 16 sub-blocks of 16, 4-bit scale and 4-bit min each */
typedef struct { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; uint16_t d, dmin; } block_q2_K;
static_assert(sizeof(block_q2_K) == 84, "block_q2_K size");

/* 3.4375 bits: low 2 bits in qs, high bit in hmask, 6-bit scales packed in 12 bytes */
typedef struct { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; uint16_t d; } block_q3_K;
static_assert(sizeof(block_q3_K) == 110, "block_q3_K size");

/* 4.5 bits: 8 sub-blocks of 32, 6-bit scale and min each, packed in 12 bytes */
typedef struct { uint16_t d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K / 2]; } block_q4_K;
static_assert(sizeof(block_q4_K) == 144, "block_q4_K size");

typedef struct { uint16_t d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; } block_q5_K;
static_assert(sizeof(block_q5_K) == 176, "block_q5_K size");

/* 6.5625 bits: low 4 bits in ql, high 2 in qh, 16 int8 scales */
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; uint16_t d; } block_q6_K;
static_assert(sizeof(block_q6_K) == 210, "block_q6_K size");

/* activations for K-quant dot products: float scale, bsums = sums of 16-groups */
typedef struct { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; } block_q8_K;
static_assert(sizeof(block_q8_K) == 292, "block_q8_K size");

/* non-linear 4-bit: indices into a 16-entry int8 table */
typedef struct { uint16_t d; uint8_t qs[QK4_NL / 2]; } block_iq4_nl;
static_assert(sizeof(block_iq4_nl) == 18, "block_iq4_nl size");

typedef struct { uint16_t d; uint16_t scales_h; uint8_t scales_l[QK_K / 64]; uint8_t qs[QK_K / 2]; } block_iq4_xs;
static_assert(sizeof(block_iq4_xs) == 136, "block_iq4_xs size");

/* OCP microscaling FP4 (E2M1) with a shared E8M0 exponent */
typedef struct { uint8_t e; uint8_t qs[QK_MXFP4 / 2]; } block_mxfp4;
static_assert(sizeof(block_mxfp4) == 17, "block_mxfp4 size");

#endif
