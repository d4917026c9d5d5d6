/* gguf_types.c: the tensor-type block shapes and value-type sizes that both
 * the GGUF reader and writer need (see gguf_int.h). */
#include "gguf_int.h"

typedef struct {
    const char *name;
    int64_t blck;
    size_t size;
} type_shape;

/* Indexed by GGUF type id; {0} marks retired or unknown ids. */
static const type_shape type_shapes[QT_TYPE_COUNT] = {
    [QT_F32] = {"f32", 1, 4},
    [QT_F16] = {"f16", 1, 2},
    [QT_Q4_0] = {"q4_0", 32, 18},
    [QT_Q4_1] = {"q4_1", 32, 20},
    [QT_Q5_0] = {"q5_0", 32, 22},
    [QT_Q5_1] = {"q5_1", 32, 24},
    [QT_Q8_0] = {"q8_0", 32, 34},
    [QT_Q8_1] = {"q8_1", 32, 36},
    [QT_Q2_K] = {"q2_K", 256, 84},
    [QT_Q3_K] = {"q3_K", 256, 110},
    [QT_Q4_K] = {"q4_K", 256, 144},
    [QT_Q5_K] = {"q5_K", 256, 176},
    [QT_Q6_K] = {"q6_K", 256, 210},
    [QT_Q8_K] = {"q8_K", 256, 292},
    [QT_IQ2_XXS] = {"iq2_xxs", 256, 66},
    [QT_IQ2_XS] = {"iq2_xs", 256, 74},
    [QT_IQ3_XXS] = {"iq3_xxs", 256, 98},
    [QT_IQ1_S] = {"iq1_s", 256, 50},
    [QT_IQ4_NL] = {"iq4_nl", 32, 18},
    [QT_IQ3_S] = {"iq3_s", 256, 110},
    [QT_IQ2_S] = {"iq2_s", 256, 82},
    [QT_IQ4_XS] = {"iq4_xs", 256, 136},
    [QT_I8] = {"i8", 1, 1},
    [QT_I16] = {"i16", 1, 2},
    [QT_I32] = {"i32", 1, 4},
    [QT_I64] = {"i64", 1, 8},
    [QT_F64] = {"f64", 1, 8},
    [QT_IQ1_M] = {"iq1_m", 256, 56},
    [QT_BF16] = {"bf16", 1, 2},
    [QT_TQ1_0] = {"tq1_0", 256, 54},
    [QT_TQ2_0] = {"tq2_0", 256, 66},
    [QT_MXFP4] = {"mxfp4", 32, 17},
};

bool gguf_type_shape(uint32_t type, int64_t *blck_size, size_t *type_size) {
    if (type >= QT_TYPE_COUNT || !type_shapes[type].name) return false;
    if (blck_size) *blck_size = type_shapes[type].blck;
    if (type_size) *type_size = type_shapes[type].size;
    return true;
}

const char *gguf_type_name(uint32_t type) {
    if (type >= QT_TYPE_COUNT) return NULL;
    return type_shapes[type].name;
}

size_t gguf_vtype_size(uint32_t t) {
    switch (t) {
    case GGUF_U8: case GGUF_I8: case GGUF_BOOL: return 1;
    case GGUF_U16: case GGUF_I16: return 2;
    case GGUF_U32: case GGUF_I32: case GGUF_F32: return 4;
    case GGUF_U64: case GGUF_I64: case GGUF_F64: return 8;
    default: return 0;
    }
}

bool gguf_tensor_size(uint32_t type, int n_dims, const int64_t *ne, size_t *nbytes,
                      const char **why) {
    int64_t blck;
    size_t tsize;
    if (!gguf_type_shape(type, &blck, &tsize)) {
        *why = "unknown tensor type";
        return false;
    }
    if (n_dims < 0 || n_dims > GGUF_MAX_DIMS) {
        *why = "bad number of dimensions";
        return false;
    }
    for (int d = 0; d < n_dims; d++) {
        if (ne[d] < 0) {
            *why = "negative dimension";
            return false;
        }
    }
    int64_t ne0 = n_dims > 0 ? ne[0] : 1;
    if (ne0 % blck != 0) {
        *why = "row length is not a multiple of the type's block size";
        return false;
    }
    /* bytes = (ne0 / blck) * tsize * ne1 * ne2 * ne3, each step overflow-checked
     * against SIZE_MAX and INT64_MAX (element count must fit int64 too). */
    uint64_t elems = (uint64_t)ne0, bytes = (uint64_t)(ne0 / blck);
    if (bytes && tsize > UINT64_MAX / bytes) goto overflow;
    bytes *= tsize;
    for (int d = 1; d < n_dims; d++) {
        uint64_t n = (uint64_t)ne[d];
        if (n && elems > (uint64_t)INT64_MAX / n) goto overflow;
        elems *= n;
        if (n && bytes > UINT64_MAX / n) goto overflow;
        bytes *= n;
    }
    if (bytes > SIZE_MAX || bytes > (uint64_t)INT64_MAX) goto overflow;
    *nbytes = (size_t)bytes;
    return true;
overflow:
    *why = "tensor size overflows";
    return false;
}
