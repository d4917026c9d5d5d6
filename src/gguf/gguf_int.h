/* gguf_int.h: private to gguf/: the tensor-type size table and value-type
 * sizes shared by the reader (gguf_read.c) and the writer (gguf_write.c).
 *
 * The type table is gguf's own small copy of each type's block shape so that
 * reading a file does not depend on the quant module; test_gguf checks it
 * against qt_traits where both know a type. */
#ifndef HN_GGUF_INT_H
#define HN_GGUF_INT_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"

/* Elements per block and bytes per block of a tensor type; false if the id is
 * unknown or retired. */
bool gguf_type_shape(uint32_t type, int64_t *blck_size, size_t *type_size);
/* The type's lower-case name ("q4_K"), or NULL if unknown. */
const char *gguf_type_name(uint32_t type);
/* Bytes of one scalar element of a value type (0 for string/array/unknown). */
size_t gguf_vtype_size(uint32_t t);
/* Bytes of a tensor of this type and shape into *nbytes; false (with a reason
 * in *why) if the type is unknown, ne[0] is not a multiple of the block size,
 * a dimension is negative, or the size overflows. */
bool gguf_tensor_size(uint32_t type, int n_dims, const int64_t *ne, size_t *nbytes,
                      const char **why);

#endif
