// Launchers of the row kernels (nn.cu) on any storage format, for the native bf16/f16 slots
// (register_rows_half.cc) and for tests: `fmt` is math::Format's code (0 f32, 1 bf16, 2 f16;
// cudaErrorInvalidValue for another), the stored tensors are in that format, LayerNorm's mean
// and rstd and cross-entropy's losses, probabilities and dloss are f32 (core/kernel_checks.h).
// Sums and row statistics are f32, each stored output rounded once (math/rows.h). The f32
// launchers of launchers.h are these with code 0. Each enqueues on `s` and returns the launch's
// error.
#ifndef BRAID_BACKENDS_CUDA_KERNELS_ROWS_HALF_LAUNCH_H_
#define BRAID_BACKENDS_CUDA_KERNELS_ROWS_HALF_LAUNCH_H_

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace braid::cuda {

cudaError_t LaunchLayerNormForwardHalf(int fmt, const void* x, const void* w, const void* b,
                                       float eps, int64_t rows, int64_t cols, void* out,
                                       float* mean, float* rstd, cudaStream_t s);
// dx written; dw, db added into (in f32, rounded once).
cudaError_t LaunchLayerNormBackwardHalf(int fmt, const void* dout, const void* x, const void* w,
                                        const float* mean, const float* rstd, int64_t rows,
                                        int64_t cols, void* dx, void* dw, void* db,
                                        cudaStream_t s);
cudaError_t LaunchSoftmaxForwardHalf(int fmt, const void* x, int64_t rows, int64_t cols,
                                     void* out, cudaStream_t s);
cudaError_t LaunchSoftmaxBackwardHalf(int fmt, const void* y, const void* dy, int64_t rows,
                                      int64_t cols, void* dx, cudaStream_t s);
cudaError_t LaunchCrossEntropyForwardHalf(int fmt, const void* logits, const int32_t* targets,
                                          int64_t rows, int64_t vocab, float* losses,
                                          float* probs, cudaStream_t s);
cudaError_t LaunchCrossEntropyBackwardHalf(int fmt, const float* probs, const int32_t* targets,
                                           const float* dloss, int64_t rows, int64_t vocab,
                                           void* dlogits, cudaStream_t s);
// A gather of 16-bit rows (bf16 or f16 alike).
cudaError_t LaunchEmbeddingForwardHalf(const void* weight, const int32_t* ids, int64_t n,
                                       int64_t cols, void* out, cudaStream_t s);
// The embedding backward on a bf16/f16 table [vocab, cols] (fmt 1 or 2): positions sorted by id
// (a stable radix sort), each id's gradient rows added to its table row in position order in
// f32, rounded once, as the CPU's half kernel. It needs `scratch` of at least
// EmbeddingBackwardHalfScratchBytes(n, vocab) device bytes, free once the stream has run it.
// Ids must lie in [0, vocab) (the caller's contract, as for the f32 kernel).
cudaError_t EmbeddingBackwardHalfScratchBytes(int64_t n, int64_t vocab, size_t* bytes);
cudaError_t LaunchEmbeddingBackwardHalf(int fmt, const void* dout, const int32_t* ids, int64_t n,
                                        int64_t cols, int64_t vocab, void* dweight, void* scratch,
                                        size_t scratch_bytes, cudaStream_t s);

}  // namespace braid::cuda

#endif  // BRAID_BACKENDS_CUDA_KERNELS_ROWS_HALF_LAUNCH_H_
