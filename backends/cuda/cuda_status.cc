#include "backends/cuda/cuda_status.h"

#include "absl/strings/str_cat.h"

namespace braid::cuda {

absl::Status CudaStatus(cudaError_t err, const std::string& what) {
  if (err == cudaSuccess) return absl::OkStatus();
  std::string msg = absl::StrCat(what, " failed: ", cudaGetErrorString(err), " (",
                                 cudaGetErrorName(err), ")");
  switch (err) {
    // Nothing Braid can fix: no GPU, no driver, or a driver older than this runtime.
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInitializationError:
    case cudaErrorDevicesUnavailable:
    case cudaErrorStubLibrary:
      return absl::UnavailableError(absl::StrCat(
          msg, ". The program was built with --config=cuda and needs an NVIDIA GPU with a "
               "driver for CUDA 13 at run time."));
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(msg);
    case cudaErrorNoKernelImageForDevice:
      return absl::FailedPreconditionError(absl::StrCat(
          msg, ". Braid's CUDA code is built for sm_80 and sm_90 (plus compute_90 PTX); see "
               "docs/GPU.md."));
    default:
      return absl::InternalError(msg);
  }
}

}  // namespace braid::cuda
