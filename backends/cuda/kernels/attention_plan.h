// Which attention implementation a call gets, and what device memory each takes: Braid's fused
// kernel (attention_flash.cu: online softmax, only the per-row log-sum-exp kept, backward
// recomputes, memory linear in T) where it applies, else the documented reference kernel
// (attention.cu, which forms the [B, H, T, T] probabilities). Pure host functions, tested on the
// CPU (plan_test.cc).
#ifndef BRAID_BACKENDS_CUDA_KERNELS_ATTENTION_PLAN_H_
#define BRAID_BACKENDS_CUDA_KERNELS_ATTENTION_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace braid::cuda {

enum class AttentionPath { kFlashKernel, kReferenceKernel };
enum class AttentionDType { kF32, kBF16, kF16 };

struct AttentionQuery {
  int64_t batch = 0, seq = 0, heads = 0, head_dim = 0;
  AttentionDType dtype = AttentionDType::kF32;
  // The kernel table's attention_forward slot saves the [B, H, T, T] probabilities for its
  // backward; the fused kernel never forms them (flash_attention_forward keeps lse instead).
  bool need_probabilities = true;
};

struct AttentionChoice {
  AttentionPath path = AttentionPath::kReferenceKernel;
  std::string reason;  // why, for logs and tests
};

// The fused kernel's limits: head_dim 1..256 (the per-lane registers and shared tiles, see
// math/flash_attention.h), B * H blocks along grid x, ceil(T / 8) row blocks along grid y.
bool FlashAttentionApplies(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim);

// The fused kernel unless the caller needs the probabilities or the shape is past its limits.
AttentionChoice ChooseAttention(const AttentionQuery& q);

// Device memory one attention call keeps between forward and backward (`saved`) and takes as
// backward scratch (`workspace`), in bytes.
struct AttentionBytes {
  int64_t saved = 0;
  int64_t workspace = 0;
};
// Fused: lse [B, H, T] f32 saved, delta = rowsum(dout * out) [B, H, T] f32 as workspace (the
// size flash_attention_backward allocates, from the caching allocator).
AttentionBytes FlashAttentionMemory(int64_t batch, int64_t heads, int64_t seq);
// Reference: the probabilities [B, H, T, T] in the input's element size saved, and the
// backward's dS [B, H, T, T] f32 scratch.
AttentionBytes ReferenceAttentionMemory(int64_t batch, int64_t heads, int64_t seq,
                                        int64_t elem_size);

// Dynamic shared memory of the fused kernels for a head dimension: two padded [32][D + 1] f32
// tiles plus per-row vectors (attention_flash.cu). Above 48 KiB (D > 128) the kernels opt in.
struct FlashSharedBytes {
  size_t forward = 0, dq = 0, dkdv = 0;
};
FlashSharedBytes FlashAttentionSharedBytes(int64_t head_dim);

}  // namespace braid::cuda

#endif  // BRAID_BACKENDS_CUDA_KERNELS_ATTENTION_PLAN_H_
