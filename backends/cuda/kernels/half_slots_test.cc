// Which kernel-table slots the CUDA kernels register for bf16 and f16 themselves, checked without
// a GPU (registration happens at static initialisation). This binary links the kernels but not
// the backend, so RegisterHalfFallbacks has not run: a slot found here is a native half kernel,
// and the fallbacks (which fill only empty slots) never replace it. docs/GPU.md lists the same.
#include <gtest/gtest.h>

#include "core/kernels.h"

namespace braid::cuda {
namespace {

constexpr DeviceType kCuda = DeviceType::kCUDA;

TEST(HalfSlots, NativeHalfKernelsAreRegisteredForBf16AndF16) {
  for (DType dt : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(DTypeName(dt));
    EXPECT_NE(kernels::binary.Find(kCuda, dt), nullptr);
    EXPECT_NE(kernels::unary.Find(kCuda, dt), nullptr);
    EXPECT_NE(kernels::unary_backward.Find(kCuda, dt), nullptr);
    EXPECT_NE(kernels::axpby.Find(kCuda, dt), nullptr);
    EXPECT_NE(kernels::sum_all.Find(kCuda, dt), nullptr);
    EXPECT_NE(kernels::sum_rows.Find(kCuda, dt), nullptr);
    EXPECT_NE(kernels::matmul.Find(kCuda, dt), nullptr);
    EXPECT_NE(kernels::linear_gelu_forward.Find(kCuda, dt), nullptr);
    EXPECT_NE(kernels::linear_gelu_backward.Find(kCuda, dt), nullptr);
    EXPECT_NE(kernels::layernorm_forward.Find(kCuda, dt), nullptr);
    EXPECT_NE(kernels::layernorm_backward.Find(kCuda, dt), nullptr);
    EXPECT_NE(kernels::softmax_forward.Find(kCuda, dt), nullptr);
    EXPECT_NE(kernels::softmax_backward.Find(kCuda, dt), nullptr);
    EXPECT_NE(kernels::cross_entropy_forward.Find(kCuda, dt), nullptr);
    EXPECT_NE(kernels::cross_entropy_backward.Find(kCuda, dt), nullptr);
    EXPECT_NE(kernels::embedding_forward.Find(kCuda, dt), nullptr);
    EXPECT_NE(kernels::embedding_backward.Find(kCuda, dt), nullptr);
    EXPECT_NE(kernels::flash_attention_forward.Find(kCuda, dt), nullptr);
    EXPECT_NE(kernels::flash_attention_backward.Find(kCuda, dt), nullptr);
    // Still the up-cast fallbacks' in a program (GPU.md says so): no half kernel of their own.
    EXPECT_EQ(kernels::attention_forward.Find(kCuda, dt), nullptr);
    EXPECT_EQ(kernels::attention_backward.Find(kCuda, dt), nullptr);
  }
}

}  // namespace
}  // namespace braid::cuda
