// Element types a tensor can hold.
#ifndef BRAID_CORE_DTYPE_H_
#define BRAID_CORE_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace braid {

enum class DType : uint8_t { kF32, kBF16, kF16, kI32, kI64, kU8, kI8 };
inline constexpr int kNumDTypes = int(DType::kI8) + 1;

size_t SizeOf(DType t);
const char* DTypeName(DType t);  // "f32", "bf16", ...
absl::StatusOr<DType> ParseDType(const std::string& name);
bool IsFloating(DType t);

// The C++ type behind a dtype, for typed access (bf16/f16 are raw 16-bit words).
template <typename T>
struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::kF32; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::kI32; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::kI64; };
template <> struct DTypeOf<uint8_t> { static constexpr DType value = DType::kU8; };
template <> struct DTypeOf<int8_t> { static constexpr DType value = DType::kI8; };

// Scalar conversions (round-to-nearest-even), used by the kernels and by tests.
uint16_t FloatToBF16(float f);
float BF16ToFloat(uint16_t h);
uint16_t FloatToF16(float f);
float F16ToFloat(uint16_t h);

}  // namespace braid

#endif  // BRAID_CORE_DTYPE_H_
