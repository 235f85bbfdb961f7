// Launchers of the Llama-family CUDA kernels (llama.cu) on raw device pointers, for
// register_llama.cc, which adapts the kernel table's Tensor signatures (core/kernels.h gives each
// slot's contract). Each enqueues on `s` and returns the launch's error. f32 only. Nothing here
// includes core, so nvcc never parses absl. Grouped-query attention's are in launchers.h, beside
// the multi-head attention whose kernels they share.
#ifndef BRAID_BACKENDS_CUDA_KERNELS_LLAMA_LAUNCH_H_
#define BRAID_BACKENDS_CUDA_KERNELS_LLAMA_LAUNCH_H_

#include <cstdint>

#include <cuda_runtime_api.h>

namespace braid::cuda {

// x [rows, cols]; rstd [rows]. Backward writes dx and adds into dw.
cudaError_t LaunchRmsNormForward(const float* x, const float* w, float eps, int64_t rows,
                                 int64_t cols, float* out, float* rstd, cudaStream_t s);
cudaError_t LaunchRmsNormBackward(const float* dout, const float* x, const float* w,
                                  const float* rstd, int64_t rows, int64_t cols, float* dx,
                                  float* dw, cudaStream_t s);

// `up` null: plain SiLU. Backward: `dup` null when there is no `up`.
cudaError_t LaunchSwiGluForward(const float* gate, const float* up, float* out, int64_t n,
                                cudaStream_t s);
cudaError_t LaunchSwiGluBackward(const float* dout, const float* gate, const float* up,
                                 float* dgate, float* dup, int64_t n, cudaStream_t s);

cudaError_t LaunchDropout(const float* x, float p, uint64_t seed, float* out, int64_t n,
                          cudaStream_t s);

// x, out [b, t, h, d]; `table`: device scratch of t * d floats (the cos and sin per time step
// and frequency), the caller's, free again once the stream has run the launch.
struct RopeLaunch {
  int64_t b, t, h, d;
  double theta, position_scale;
  int64_t position_offset;
  bool inverse;
};
cudaError_t LaunchRope(const float* x, const RopeLaunch& p, float* table, float* out,
                       cudaStream_t s);

}  // namespace braid::cuda

#endif  // BRAID_BACKENDS_CUDA_KERNELS_LLAMA_LAUNCH_H_
