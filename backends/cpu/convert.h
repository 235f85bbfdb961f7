// Internal to backends/cpu: f32 <-> bf16/f16 conversion of contiguous runs, AVX2/F16C when the
// CPU has it, bit-identical to core's scalar conversions (round to nearest even, NaN quieted
// the same way) on every input.
#ifndef BRAID_BACKENDS_CPU_CONVERT_H_
#define BRAID_BACKENDS_CPU_CONVERT_H_

#include <cstdint>

#include "core/dtype.h"

namespace braid::cpu {

// n elements of floating dtype t at src to f32 (a copy when t is f32).
void ToF32(DType t, const void* src, float* dst, int64_t n);
// n f32 values to floating dtype t, rounded once.
void FromF32(DType t, const float* src, void* dst, int64_t n);

}  // namespace braid::cpu

#endif  // BRAID_BACKENDS_CPU_CONVERT_H_
