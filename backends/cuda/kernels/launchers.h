// Launchers of the CUDA kernels on raw device pointers, for register.cc (which adapts the
// kernel table's Tensor signatures) and for tests. Each enqueues on `stream` and returns the
// launch's error (cudaSuccess once enqueued). Nothing here includes core, so nvcc never parses
// absl.
#ifndef BRAID_BACKENDS_CUDA_KERNELS_LAUNCHERS_H_
#define BRAID_BACKENDS_CUDA_KERNELS_LAUNCHERS_H_

#include <cstdint>

#include <cuda_runtime_api.h>

#include "backends/cuda/math/optimizer.h"
#include "backends/cuda/math/unary.h"

namespace braid::cuda {

// Fills n elements of `elem_size` bytes (1, 2, 4 or 8) with the bit pattern `bits`.
cudaError_t LaunchFill(void* dst, int64_t n, int elem_size, uint64_t bits, cudaStream_t s);
// out[i] = a[i] op b[i % nb].
cudaError_t LaunchBinary(math::Binary op, const float* a, const float* b, int64_t nb, float* out,
                         int64_t n, cudaStream_t s);
cudaError_t LaunchUnary(math::Unary op, const float* a, float scalar, float* out, int64_t n,
                        cudaStream_t s);
cudaError_t LaunchUnaryGrad(math::Unary op, const float* a, const float* g, float* out, int64_t n,
                            cudaStream_t s);
cudaError_t LaunchAxpby(float alpha, const float* x, float beta, float* y, int64_t n,
                        cudaStream_t s);
cudaError_t LaunchAdamW(const math::AdamWConsts& k, float* w, const float* g, float* m, float* v,
                        int64_t n, cudaStream_t s);
cudaError_t LaunchSgd(const math::SgdConsts& k, float* w, const float* g, float* buf, int64_t n,
                      cudaStream_t s);

// Native half kernels: storage in bf16 or f16 (`fmt`, math::Format's code: 1 bf16, 2 f16),
// arithmetic in f32, each output rounded once (math/unary.h's *Half). cudaErrorInvalidValue for
// another code.
cudaError_t LaunchBinaryHalf(int fmt, math::Binary op, const void* a, const void* b, int64_t nb,
                             void* out, int64_t n, cudaStream_t s);
cudaError_t LaunchUnaryHalf(int fmt, math::Unary op, const void* a, float scalar, void* out,
                            int64_t n, cudaStream_t s);
cudaError_t LaunchUnaryGradHalf(int fmt, math::Unary op, const void* a, const void* g, void* out,
                                int64_t n, cudaStream_t s);
// y = alpha x + beta y with x and y each in any of the three formats (codes 0 f32, 1 bf16, 2 f16).
cudaError_t LaunchAxpbyMixed(int x_fmt, int y_fmt, float alpha, const void* x, float beta,
                             void* y, int64_t n, cudaStream_t s);
// out[0] (in a's format) = the sum of a, accumulated as LaunchSumAll's (double partials, block
// order), rounded once.
cudaError_t LaunchSumAllHalf(int fmt, const void* a, int64_t n, void* out, double* partial,
                             cudaStream_t s);

// out[0] = sum of a (deterministic: fixed grid, per-block partials in double, summed in order).
// `partial`: device scratch of ReductionGeometry(n).grid doubles, the caller's (register.cc takes
// it from the device's allocator, the caching allocator, so a reduction never calls
// cudaMallocAsync), free again once the stream has run the launch.
cudaError_t LaunchSumAll(const float* a, int64_t n, float* out, double* partial, cudaStream_t s);
// out[c] = beta out[c] + sum over rows of a[r, c], rows in order (one thread per column).
cudaError_t LaunchSumRows(const float* a, int64_t rows, int64_t cols, float* out, float beta,
                          cudaStream_t s);
// The same on bf16/f16 storage (`fmt` as above): f32 accumulation in row order, out's f32 scaled
// by beta added (out not read when beta is 0), rounded once (math/rows.h's SumRowsColumn).
cudaError_t LaunchSumRowsHalf(int fmt, const void* a, int64_t rows, int64_t cols, void* out,
                              float beta, cudaStream_t s);
// LinearGeluTanh's backward through its GELU (`fmt`: 0 f32, else as above): dpre[r, c] =
// gelu_tanh'(pre[r, c]) dout[r, c], stored in fmt, and dbias[c] = the sum over rows of dpre as
// stored, rows in order, rounded once: unary_backward then sum_rows (beta 0), bit for bit, in
// one pass over dout (one thread per column, as sum_rows).
cudaError_t LaunchGeluBiasGrad(int fmt, const void* pre, const void* dout, int64_t rows,
                               int64_t cols, void* dpre, void* dbias, cudaStream_t s);

cudaError_t LaunchLayerNormForward(const float* x, const float* w, const float* b, float eps,
                                   int64_t rows, int64_t cols, float* out, float* mean,
                                   float* rstd, cudaStream_t s);
// dx written; dw, db added into.
cudaError_t LaunchLayerNormBackward(const float* dout, const float* x, const float* w,
                                    const float* mean, const float* rstd, int64_t rows,
                                    int64_t cols, float* dx, float* dw, float* db, cudaStream_t s);
cudaError_t LaunchSoftmaxForward(const float* x, int64_t rows, int64_t cols, float* out,
                                 cudaStream_t s);
cudaError_t LaunchSoftmaxBackward(const float* y, const float* dy, int64_t rows, int64_t cols,
                                  float* dx, cudaStream_t s);
cudaError_t LaunchCrossEntropyForward(const float* logits, const int32_t* targets, int64_t rows,
                                      int64_t vocab, float* losses, float* probs, cudaStream_t s);
cudaError_t LaunchCrossEntropyBackward(const float* probs, const int32_t* targets,
                                       const float* dloss, int64_t rows, int64_t vocab,
                                       float* dlogits, cudaStream_t s);
// out[0] = 1 / (number of ids >= 0), 0 when none (one block; an exact integer count).
cudaError_t LaunchInverseCountNonnegative(const int32_t* ids, int64_t n, float* out,
                                          cudaStream_t s);
cudaError_t LaunchEmbeddingForward(const float* weight, const int32_t* ids, int64_t n,
                                   int64_t cols, float* out, cudaStream_t s);
cudaError_t LaunchEmbeddingBackward(const float* dout, const int32_t* ids, int64_t n,
                                    int64_t cols, float* dweight, cudaStream_t s);

// Causal attention, the reference kernel (attention.cu). `ds_scratch` (backward) holds
// B * H * T * T floats.
cudaError_t LaunchAttentionForward(const float* qkv, int64_t B, int64_t T, int64_t C, int64_t H,
                                   float* out, float* att, cudaStream_t s);
cudaError_t LaunchAttentionBackward(const float* dout, const float* qkv, const float* att,
                                    int64_t B, int64_t T, int64_t C, int64_t H, float* ds_scratch,
                                    float* dqkv, cudaStream_t s);
// The same kernels for grouped-query attention (the gqa_* slots): q [B, T, H, D]; k, v [B, T,
// Hkv, D], query head h reading K/V head h / (H / Hkv); att [B, H, T, T]. dq, dk, dv are written;
// `ds_scratch` as above.
cudaError_t LaunchGqaForward(const float* q, const float* k, const float* v, int64_t B,
                             int64_t T, int64_t H, int64_t Hkv, int64_t D, float* out, float* att,
                             cudaStream_t s);
cudaError_t LaunchGqaBackward(const float* dout, const float* q, const float* k, const float* v,
                              const float* att, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                              int64_t D, float* ds_scratch, float* dq, float* dk, float* dv,
                              cudaStream_t s);

}  // namespace braid::cuda

#endif  // BRAID_BACKENDS_CUDA_KERNELS_LAUNCHERS_H_
