// DeviceApi over the CUDA runtime, for one device. --config=cuda only.
#ifndef BRAID_BACKENDS_CUDA_CUDA_DEVICE_API_H_
#define BRAID_BACKENDS_CUDA_CUDA_DEVICE_API_H_

#include <memory>

#include "absl/status/statusor.h"
#include "backends/cuda/device_api.h"

namespace braid::cuda {

// Checks that cuda:index exists (CUDA's reason when there is no driver or GPU; the device count
// when the index is out of range). Each call runs with cuda:index current and restores the
// calling thread's current device afterwards.
absl::StatusOr<std::unique_ptr<DeviceApi>> MakeCudaDeviceApi(int index);

}  // namespace braid::cuda

#endif  // BRAID_BACKENDS_CUDA_CUDA_DEVICE_API_H_
