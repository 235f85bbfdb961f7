// Launcher of the device-side dtype conversion (convert.cu), for CudaDeviceApi::ConvertAsync and
// the kernels' GPU test. Formats are math::Format's codes (0 f32, 1 bf16, 2 f16). Nothing here
// includes core, so nvcc never parses absl.
#ifndef BRAID_BACKENDS_CUDA_CONVERT_H_
#define BRAID_BACKENDS_CUDA_CONVERT_H_

#include <cstdint>

#include <cuda_runtime_api.h>

namespace braid::cuda {

// dst[i] = src[i] converted, i < n, enqueued on `stream`; cudaErrorInvalidValue for an unknown
// format code.
cudaError_t LaunchConvert(void* dst, int to, const void* src, int from, int64_t n,
                          cudaStream_t stream);

}  // namespace braid::cuda

#endif  // BRAID_BACKENDS_CUDA_CONVERT_H_
