// PrepareCudaDevice in the default build: there is no CUDA backend to use.
#include "absl/strings/str_cat.h"
#include "backends/cuda/device_check.h"

namespace braid::cuda {

absl::StatusOr<std::function<Batch()>> PrefetchBatches(Device device, std::function<Batch()>) {
  return PrepareCudaDevice(device);
}

absl::StatusOr<double> DevicePeakFlops(Device device, DType, std::string*) {
  return PrepareCudaDevice(device);
}

absl::StatusOr<HalfSupport> DeviceHalfSupport(Device device, std::string*) {
  return PrepareCudaDevice(device);
}

absl::Status PrepareCudaDevice(Device device) {
  return absl::FailedPreconditionError(absl::StrCat(
      "device \"", device.ToString(),
      "\": this build has no CUDA backend: build with --config=cuda (needs the CUDA toolkit; "
      "see docs/GPU.md), or use device: \"cpu\""));
}

}  // namespace braid::cuda
