// The device-side dtype conversion behind DeviceApi::ConvertAsync (cuda_device_api.cc): one
// grid-stride kernel per format pair, the per-element rounding of math/convert.h (the code the
// CPU tests check bit for bit against core's conversions).
#include "backends/cuda/convert.h"

#include <algorithm>

#include "backends/cuda/math/convert.h"

namespace braid::cuda {
namespace {

template <math::Format From, math::Format To>
__global__ void ConvertKernel(const void* src, void* dst, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    math::ConvertOne<From, To>(src, dst, i);
  }
}

}  // namespace

cudaError_t LaunchConvert(void* dst, int to, const void* src, int from, int64_t n,
                          cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (to < 0 || to > 2 || from < 0 || from > 2) return cudaErrorInvalidValue;
  // 256 threads, at most 4096 blocks (grid-stride beyond), as the elementwise kernels.
  constexpr int kBlock = 256;
  const int grid = int(std::min<int64_t>((n + kBlock - 1) / kBlock, 4096));
  math::DispatchFormats(math::Format(from), math::Format(to), [&](auto f, auto t) {
    ConvertKernel<decltype(f)::value, decltype(t)::value><<<grid, kBlock, 0, stream>>>(src, dst, n);
  });
  return cudaGetLastError();
}

}  // namespace braid::cuda
