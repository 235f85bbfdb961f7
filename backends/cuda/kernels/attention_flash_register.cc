// The fused attention (attention_flash.cu) in the kernel table: flash_attention_forward and
// flash_attention_backward for CUDA in f32, bf16 and f16, so ops::CausalSelfAttention keeps
// lse [B, H, T] instead of the [B, H, T, T] probabilities on a GPU. The backward's delta
// workspace ([B, H, T] f32) is a tensor on the device: the runtime's caching allocator, on the
// kernel stream, freed (reusable in stream order) when the call returns.
#include "backends/cuda/kernels/attention_flash_launch.h"
#include "backends/cuda/kernels/attention_plan.h"
#include "backends/cuda/kernels/register_util.h"
#include "backends/cuda/launch.h"
#include "core/check.h"
#include "core/kernel_checks.h"
#include "core/kernels.h"

namespace braid::cuda {
namespace {

AttentionDType ToAttentionDType(DType t) {
  switch (t) {
    case DType::kBF16: return AttentionDType::kBF16;
    case DType::kF16: return AttentionDType::kF16;
    default: return AttentionDType::kF32;
  }
}

// Shapes past the kernel's limits are refused with the planner's reason (a head_dim over 256 has
// no fused kernel; no model Braid ships has one).
void CheckApplies(const char* kernel, const kernels::checks::AttentionDims& s, DType dtype) {
  AttentionQuery q;
  q.batch = s.b, q.seq = s.t, q.heads = s.h, q.head_dim = s.d;
  q.dtype = ToAttentionDType(dtype);
  q.need_probabilities = false;
  const AttentionChoice c = ChooseAttention(q);
  BRAID_CHECK(c.path == AttentionPath::kFlashKernel)
      << "cuda kernel '" << kernel << "': " << c.reason;
}

template <DType kDType>
void FlashForward(const Tensor& qkv, int n_head, Tensor& out, Tensor& lse) {
  const char* k = "flash_attention_forward";
  CheckCudaTensors(k, {&qkv, &out, &lse});
  const auto s = kernels::checks::FlashAttentionForward("cuda", kDType, qkv, n_head, out, lse);
  CheckApplies(k, s, kDType);
  const int dev = qkv.device().index;
  DeviceGuard g(dev);
  CheckCuda(LaunchFlashAttentionForward(ToAttentionDType(kDType), qkv.raw_data(), s.b, s.t, s.c,
                                        s.h, out.raw_data(), lse.data<float>(), KernelStream(dev)),
            k);
}

template <DType kDType>
void FlashBackward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                   int n_head, Tensor& dqkv) {
  const char* k = "flash_attention_backward";
  CheckCudaTensors(k, {&dout, &qkv, &out, &lse, &dqkv});
  const auto s =
      kernels::checks::FlashAttentionBackward("cuda", kDType, dout, qkv, out, lse, n_head, dqkv);
  CheckApplies(k, s, kDType);
  const int dev = qkv.device().index;
  DeviceGuard g(dev);
  const AttentionBytes bytes = FlashAttentionMemory(s.b, s.h, s.t);
  Tensor delta = Tensor::Empty({bytes.workspace / int64_t(sizeof(float))}, DType::kF32,
                               qkv.device());
  CheckCuda(LaunchFlashAttentionBackward(ToAttentionDType(kDType), dout.raw_data(),
                                         qkv.raw_data(), out.raw_data(), lse.data<float>(), s.b,
                                         s.t, s.c, s.h, delta.data<float>(), dqkv.raw_data(),
                                         KernelStream(dev)),
            k);
}

}  // namespace

BRAID_REGISTER_KERNEL(kernels::flash_attention_forward, DeviceType::kCUDA,
                      &FlashForward<DType::kF32>);
BRAID_REGISTER_KERNEL_FOR_DTYPE(kernels::flash_attention_forward, DeviceType::kCUDA, DType::kBF16,
                                &FlashForward<DType::kBF16>);
BRAID_REGISTER_KERNEL_FOR_DTYPE(kernels::flash_attention_forward, DeviceType::kCUDA, DType::kF16,
                                &FlashForward<DType::kF16>);
BRAID_REGISTER_KERNEL(kernels::flash_attention_backward, DeviceType::kCUDA,
                      &FlashBackward<DType::kF32>);
BRAID_REGISTER_KERNEL_FOR_DTYPE(kernels::flash_attention_backward, DeviceType::kCUDA,
                                DType::kBF16, &FlashBackward<DType::kBF16>);
BRAID_REGISTER_KERNEL_FOR_DTYPE(kernels::flash_attention_backward, DeviceType::kCUDA,
                                DType::kF16, &FlashBackward<DType::kF16>);

}  // namespace braid::cuda
