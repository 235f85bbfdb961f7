// PrepareCudaDevice under --config=cuda: the device's runtime, made here, reports CUDA's reason.
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "backends/cuda/cuda_status.h"
#include "backends/cuda/device_check.h"
#include "backends/cuda/runtime.h"

namespace braid::cuda {

absl::Status PrepareCudaDevice(Device device) {
  absl::StatusOr<DeviceRuntime*> rt = GetRuntime(device.index);
  absl::Status st = rt.ok() ? CudaStatus(cudaSetDevice(device.index), "cudaSetDevice")
                            : rt.status();
  if (st.ok()) return st;
  return absl::Status(st.code(), absl::StrCat("device \"", device.ToString(), "\": ",
                                              st.message()));
}

}  // namespace braid::cuda
