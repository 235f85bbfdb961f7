// Argument checks shared by core's op files (ops.cc, ops_llama.cc); not part of core's interface.
#ifndef BRAID_CORE_OPS_INTERNAL_H_
#define BRAID_CORE_OPS_INTERNAL_H_

#include "core/check.h"
#include "core/tensor.h"

namespace braid::ops::internal {

inline Tensor EmptyLike(const Tensor& t) {
  return Tensor::Empty(t.shape(), t.dtype(), t.device());
}

inline void CheckSameDevice(const char* op, const Tensor& a, const Tensor& b) {
  BRAID_CHECK(a.device() == b.device()) << op << ": tensors on different devices: "
                                        << a.DescribeForError() << " and " << b.DescribeForError();
}

// Ops compute in f32, bf16 or f16: a half op's kernel computes in f32 and rounds once.
inline void CheckFloat(const char* op, const Tensor& a) {
  BRAID_CHECK(a.dtype() == DType::kF32 || a.dtype() == DType::kBF16 || a.dtype() == DType::kF16)
      << op << " needs f32, bf16 or f16, got " << a.DescribeForError();
}

// All floating operands of one op share a dtype: silently promoting would hide where a model
// meant to compute in half precision and did not (and double the memory). Callers convert
// explicitly with Cast.
inline void CheckSameDType(const char* op, const Tensor& a, const Tensor& b) {
  BRAID_CHECK(a.dtype() == b.dtype())
      << op << ": operands have different dtypes: " << a.DescribeForError() << " and "
      << b.DescribeForError() << " (convert one with ops::Cast)";
}

}  // namespace braid::ops::internal

#endif  // BRAID_CORE_OPS_INTERNAL_H_
