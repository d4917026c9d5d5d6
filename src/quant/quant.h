/* quant.h: per-type traits and the scalar reference (de)quantizers.
 *
 * qt_traits(type) is the table every other module uses to size rows and to
 * convert them: to_float dequantizes, from_float quantizes (the reference
 * quantizer, byte-identical to llama.cpp's for the same input where the type
 * has one). These are the references that every fast kernel is tested against.
 * Rows are whole blocks: n must be a multiple of blck_size.
 * For iq4_nl/iq4_xs, from_float is the variant llama-quantize writes files with
 * (scale search, no importance matrix); for q8_K an all-zero block gets zero
 * bsums (llama.cpp leaves them unwritten). */
#ifndef HN_QUANT_H
#define HN_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "blocks.h"

typedef void (*qt_to_float_fn)(const void *restrict x, float *restrict y, int64_t n);
typedef void (*qt_from_float_fn)(const float *restrict x, void *restrict y, int64_t n);

typedef struct qt_type_traits {
    const char *name;          /* "q4_K", as llama.cpp names it */
    int64_t blck_size;         /* elements per block (1 for plain types) */
    size_t type_size;          /* bytes per block */
    bool is_quantized;
    qt_to_float_fn to_float;   /* NULL if the type cannot be dequantized */
    qt_from_float_fn from_float; /* reference quantizer; NULL if none */
    qt_type vec_dot_type;      /* what activations are converted to for dot products */
} qt_type_traits;

/* Returns the traits of a type, or NULL if the id is unknown or retired. */
const qt_type_traits *qt_traits(qt_type t);
/* Returns the type's name, or "unknown". */
const char *qt_name(qt_type t);
/* Parses a type name (case-insensitive, "q4_k" or "Q4_K"); returns false if unknown. */
bool qt_from_name(const char *name, qt_type *out);
/* Bytes of a row of n elements; 0 if n is not a multiple of the block size or the type is unknown. */
size_t qt_row_size(qt_type t, int64_t n);

/* IEEE half and bfloat16 conversions (round to nearest even, as ggml does).
 * The widening ones are inline: kernels' scalar paths call them per element. */
static inline float qt_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) { /* zero or subnormal: man * 2^-24, exact in f32 */
        float v = (float)man * 0x1p-24f;
        return sign ? -v : v;
    }
    if (exp == 0x1f) bits = sign | 0x7f800000 | (man ? 0x400000 | (man << 13) : 0); /* inf; NaN made quiet */
    else bits = sign | ((exp + 112) << 23) | (man << 13);
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}
static inline float qt_bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}
uint16_t qt_f32_to_f16(float f);
uint16_t qt_f32_to_bf16(float f);

#endif
