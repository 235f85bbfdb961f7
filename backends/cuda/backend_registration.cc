// The CUDA backend of programs built with --config=cuda: core's allocator and copy slot for
// kCUDA over the CUDA runtime, installed when the program starts (alwayslink), and the kernels
// (//backends/cuda/kernels) launching on each device's compute stream.
#include <cuda_runtime_api.h>

#include "backends/cuda/cuda_device_api.h"
#include "backends/cuda/install.h"
#include "backends/cuda/launch.h"
#include "core/check.h"
#include "core/kernels.h"

namespace braid::cuda {
namespace {

bool Install() {
  // Kernels, the allocator's frees and the copies then share one stream order per device.
  SetRuntimeCreatedHook([](DeviceRuntime& rt) {
    BRAID_CHECK(SetKernelStream(rt.index(), static_cast<cudaStream_t>(rt.compute_stream().handle)))
        << "cuda:" << rt.index() << ": beyond the " << kMaxCudaDevices << " devices launch.h keeps";
  });
  InstallCudaBackend(&MakeCudaDeviceApi);
  // bf16/f16 (mixed precision) on the GPU: until native half kernels exist, every f32 kernel
  // also serves half tensors by computing in f32 and rounding once (core/kernels.h). The
  // wrappers look the f32 kernel up at each call, so static-initialisation order does not
  // matter. Correct, not fast: the dtype conversions are copies (docs/GPU.md).
  kernels::RegisterHalfFallbacks(DeviceType::kCUDA);
  return true;
}

const bool installed = Install();

}  // namespace
}  // namespace braid::cuda
