// Element-wise reductions and dtype conversions for the Gloo communicator.
//
// Gloo reduces through a function pointer over raw bytes; these are ours (not gloo's math.h
// templates) so that they compile at -O3 with the plugin and vectorise. bf16/f16 have no native
// reduction here: the communicator up-casts them to f32, reduces, and rounds back once.
#ifndef BRAID_BACKENDS_GLOO_REDUCE_KERNELS_H_
#define BRAID_BACKENDS_GLOO_REDUCE_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "core/communicator.h"
#include "core/dtype.h"

namespace braid::gloo_backend {

// out[i] = a[i] op b[i] for n elements; out may alias a or b (Gloo reduces in place).
using ReduceFn = void (*)(void* out, const void* a, const void* b, size_t n);

// The function for `op` on dtype `t`, or nullptr when `t` must be up-cast first (bf16, f16).
// kAvg reduces with kSum (the caller divides afterwards). Integer sums wrap like C++ unsigned
// arithmetic would (u8) or are undefined on overflow (i32/i64): callers keep them in range.
ReduceFn NativeReduceFn(DType t, ReduceOp op);

// bf16/f16 <-> f32, round to nearest even (the same results as core's scalar conversions).
void UpcastToF32(DType t, const void* in, float* out, size_t n);
void DowncastFromF32(DType t, const float* in, void* out, size_t n);

// x[i] /= d: what kAvg does after the sum (a division, not a multiplication by 1/d, so that
// an average of exact sums is the correctly rounded quotient).
void DivideInPlace(float* x, size_t n, float d);

}  // namespace braid::gloo_backend

#endif  // BRAID_BACKENDS_GLOO_REDUCE_KERNELS_H_
