// Launchers of the fused causal attention (attention_flash.cu) on raw device pointers, for its
// kernel-table adapters (attention_flash_register.cc) and tests. qkv [B, T, 3C], out and dout
// [B, T, C], dqkv [B, T, 3C] in `dtype`; lse and the backward's delta workspace [B, H, T] f32
// (FlashAttentionMemory in attention_plan.h gives their bytes). Each enqueues on `stream` and
// returns the launch's error; cudaErrorInvalidValue where FlashAttentionApplies is false (the
// adapters check it first and say why).
#ifndef BRAID_BACKENDS_CUDA_KERNELS_ATTENTION_FLASH_LAUNCH_H_
#define BRAID_BACKENDS_CUDA_KERNELS_ATTENTION_FLASH_LAUNCH_H_

#include <cstdint>

#include <cuda_runtime_api.h>

#include "backends/cuda/kernels/attention_plan.h"

namespace braid::cuda {

cudaError_t LaunchFlashAttentionForward(AttentionDType dtype, const void* qkv, int64_t B,
                                        int64_t T, int64_t C, int64_t H, void* out, float* lse,
                                        cudaStream_t stream);
// Writes every element of dqkv.
cudaError_t LaunchFlashAttentionBackward(AttentionDType dtype, const void* dout, const void* qkv,
                                         const void* out, const float* lse, int64_t B, int64_t T,
                                         int64_t C, int64_t H, float* delta_workspace, void* dqkv,
                                         cudaStream_t stream);

}  // namespace braid::cuda

#endif  // BRAID_BACKENDS_CUDA_KERNELS_ATTENTION_FLASH_LAUNCH_H_
