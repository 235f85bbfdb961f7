// Which attention implementation a call gets: cuDNN's fused scaled-dot-product attention (flash
// attention in cuDNN's graph API) where it applies, else Braid's documented kernel
// (attention.cu). A pure host function, tested on the CPU.
#ifndef BRAID_BACKENDS_CUDA_KERNELS_ATTENTION_PLAN_H_
#define BRAID_BACKENDS_CUDA_KERNELS_ATTENTION_PLAN_H_

#include <cstdint>
#include <string>

namespace braid::cuda {

enum class AttentionPath { kCudnnSdpa, kReferenceKernel };
enum class AttentionDType { kF32, kBF16, kF16 };

struct AttentionQuery {
  int64_t batch = 0, seq = 0, heads = 0, head_dim = 0;
  AttentionDType dtype = AttentionDType::kF32;
  // The kernel table's attention slot saves the [B, H, T, T] probabilities for its backward;
  // cuDNN's fused SDPA never materialises them (it keeps one statistic per row).
  bool need_probabilities = true;
  int cudnn_version = 0;       // cudnnGetVersion(), 0 when cuDNN is not available
  int compute_capability = 0;  // major * 10 + minor, e.g. 90 for H100
};

struct AttentionChoice {
  AttentionPath path = AttentionPath::kReferenceKernel;
  std::string reason;  // why, for logs and tests
};

// cuDNN's fused SDPA: cuDNN >= 9.0, sm_80 or newer, bf16 or f16, head_dim a multiple of 8 and
// at most 128, no saved probabilities. Anything else takes the reference kernel.
AttentionChoice ChooseAttention(const AttentionQuery& q);

}  // namespace braid::cuda

#endif  // BRAID_BACKENDS_CUDA_KERNELS_ATTENTION_PLAN_H_
