#include "backends/cuda/kernels/attention_plan.h"

#include "absl/strings/str_cat.h"
#include "backends/cuda/math/flash_attention.h"

namespace braid::cuda {

namespace {
constexpr int64_t kMaxGridY = 65535;
constexpr int64_t kMaxGridX = (int64_t(1) << 31) - 1;
}  // namespace

bool FlashAttentionApplies(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim) {
  const int64_t row_blocks = (seq + math::kFlashRowsPerBlock - 1) / math::kFlashRowsPerBlock;
  return head_dim >= 1 && head_dim <= math::kFlashMaxHeadDim && batch >= 0 && heads >= 0 &&
         batch * heads <= kMaxGridX && row_blocks <= kMaxGridY;
}

AttentionChoice ChooseAttention(const AttentionQuery& q) {
  auto reference = [](std::string why) {
    return AttentionChoice{AttentionPath::kReferenceKernel, std::move(why)};
  };
  if (q.need_probabilities) {
    return reference("the caller saves the softmax probabilities, which the fused kernel never forms");
  }
  if (q.head_dim < 1 || q.head_dim > math::kFlashMaxHeadDim) {
    return reference(absl::StrCat("head_dim ", q.head_dim, " is outside the fused kernel's 1..",
                                  math::kFlashMaxHeadDim));
  }
  if (!FlashAttentionApplies(q.batch, q.seq, q.heads, q.head_dim)) {
    return reference(absl::StrCat("batch * heads = ", q.batch * q.heads, " or seq = ", q.seq,
                                  " is past the fused kernel's grid"));
  }
  return {AttentionPath::kFlashKernel, "the fused kernel applies"};
}

AttentionBytes FlashAttentionMemory(int64_t batch, int64_t heads, int64_t seq) {
  const int64_t rows = batch * heads * seq;
  return AttentionBytes{rows * int64_t(sizeof(float)), rows * int64_t(sizeof(float))};
}

AttentionBytes ReferenceAttentionMemory(int64_t batch, int64_t heads, int64_t seq,
                                        int64_t elem_size) {
  const int64_t scores = batch * heads * seq * seq;
  return AttentionBytes{scores * elem_size, scores * int64_t(sizeof(float))};
}

FlashSharedBytes FlashAttentionSharedBytes(int64_t head_dim) {
  const size_t f = sizeof(float), d = size_t(head_dim);
  const size_t tile = size_t(math::kFlashTile) * (d + 1) * f;  // padded [32][D + 1]
  const size_t rows = size_t(math::kFlashRowsPerBlock) * d * f;  // [rows][D]
  FlashSharedBytes b;
  b.forward = 2 * tile + rows;                                    // K, V tiles; q rows
  b.dq = 2 * tile + 2 * rows;                                     // K, V tiles; q, dout rows
  b.dkdv = 2 * tile + 2 * size_t(math::kFlashTile) * f + 2 * rows;  // q, dout tiles; lse,
                                                                  // delta; k, v rows
  return b;
}

}  // namespace braid::cuda
