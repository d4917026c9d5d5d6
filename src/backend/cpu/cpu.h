/* cpu.h: the CPU backend. Kernels run on the caller's thread pool; matmuls
 * use the fastest dot kernel of dot.h for the weight type when there is one
 * (activations converted once per row), else dequantize weight rows with the
 * quant module's reference to_float and take f32 dots. */
#ifndef HN_BACKEND_CPU_H
#define HN_BACKEND_CPU_H

#include "../../core/pool.h"
#include "../backend.h"

/* Creates a CPU backend running on pool p (borrowed: it must outlive the
 * backend). Call ops->reserve before the first op. */
hn_status be_cpu_create(pool *p, be_backend **out, hn_err *err);

/* Test hook: when set, matmuls ignore dot kernels and use the dequantize +
 * f32 path (the scalar reference every kernel is compared with). */
void be_cpu_force_reference(be_backend *b, bool on);

#endif
