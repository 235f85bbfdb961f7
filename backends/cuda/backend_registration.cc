// The CUDA backend of programs built with --config=cuda: core's allocator and copy slot for
// kCUDA over the CUDA runtime, installed when the program starts (alwayslink), and the kernels
// (//backends/cuda/kernels) launching on each device's compute stream.
#include <cuda_runtime_api.h>

#include "backends/cuda/cuda_device_api.h"
#include "backends/cuda/install.h"
#include "backends/cuda/launch.h"
#include "core/check.h"

namespace braid::cuda {
namespace {

bool Install() {
  // Kernels, the allocator's frees and the copies then share one stream order per device.
  SetRuntimeCreatedHook([](DeviceRuntime& rt) {
    BRAID_CHECK(SetKernelStream(rt.index(), static_cast<cudaStream_t>(rt.compute_stream().handle)))
        << "cuda:" << rt.index() << ": beyond the " << kMaxCudaDevices << " devices launch.h keeps";
  });
  InstallCudaBackend(&MakeCudaDeviceApi);
  return true;
}

const bool installed = Install();

}  // namespace
}  // namespace braid::cuda
