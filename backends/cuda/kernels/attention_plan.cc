#include "backends/cuda/kernels/attention_plan.h"

#include "absl/strings/str_cat.h"

namespace braid::cuda {

AttentionChoice ChooseAttention(const AttentionQuery& q) {
  auto reference = [](std::string why) {
    return AttentionChoice{AttentionPath::kReferenceKernel, std::move(why)};
  };
  if (q.need_probabilities) {
    return reference("the caller saves the softmax probabilities, which fused SDPA never forms");
  }
  if (q.cudnn_version < 90000) {
    return reference(q.cudnn_version == 0
                         ? std::string("cuDNN is not available")
                         : absl::StrCat("cuDNN ", q.cudnn_version, " is older than 9.0"));
  }
  if (q.compute_capability < 80) {
    return reference(absl::StrCat("compute capability ", q.compute_capability,
                                  " is below 8.0 (fused SDPA needs Ampere or newer)"));
  }
  if (q.dtype == AttentionDType::kF32) {
    return reference("f32: cuDNN's fused SDPA takes bf16 or f16 only");
  }
  if (q.head_dim % 8 != 0 || q.head_dim > 128) {
    return reference(absl::StrCat("head_dim ", q.head_dim,
                                  " is not a multiple of 8 up to 128 (fused SDPA's limit)"));
  }
  if (q.batch <= 0 || q.seq <= 0 || q.heads <= 0) {
    return reference("an empty problem");
  }
  return {AttentionPath::kCudnnSdpa, "cuDNN fused SDPA applies"};
}

}  // namespace braid::cuda
