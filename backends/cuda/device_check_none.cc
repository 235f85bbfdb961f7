// PrepareCudaDevice in the default build: there is no CUDA backend to use.
#include "absl/strings/str_cat.h"
#include "backends/cuda/device_check.h"

namespace braid::cuda {

absl::Status PrepareCudaDevice(Device device) {
  return absl::FailedPreconditionError(absl::StrCat(
      "device \"", device.ToString(),
      "\": this build has no CUDA backend: build with --config=cuda (needs the CUDA toolkit; "
      "see docs/GPU.md), or use device: \"cpu\""));
}

}  // namespace braid::cuda
