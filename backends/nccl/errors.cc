// CUDA and NCCL errors as absl::Status (errors.h).
#include "backends/nccl/errors.h"

#include "absl/strings/str_cat.h"
#include "core/check.h"

namespace braid::nccl::internal {

absl::Status CudaStatus(cudaError_t err, const std::string& what) {
  if (err == cudaSuccess) return absl::OkStatus();
  std::string msg =
      absl::StrCat(what, " failed: ", cudaGetErrorString(err), " (", cudaGetErrorName(err), ")");
  switch (err) {
    // Nothing Braid can fix: no GPU, no driver, or a driver older than this runtime.
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInitializationError:
    case cudaErrorDevicesUnavailable:
    case cudaErrorStubLibrary:
      return absl::UnavailableError(absl::StrCat(
          msg, ". The NCCL communicator needs an NVIDIA GPU with a driver for CUDA 13."));
    default:
      return absl::InternalError(msg);
  }
}

std::string NcclMessage(ncclResult_t r, ncclComm_t comm) {
  const char* last = ncclGetLastError(comm);
  std::string detail = last != nullptr && last[0] != '\0' ? absl::StrCat(" (", last, ")") : "";
  return absl::StrCat(ncclGetErrorString(r), detail);
}

bool IsFatal(ncclResult_t r) {
  return r != ncclSuccess && r != ncclInProgress && r != ncclInvalidArgument &&
         r != ncclInvalidUsage;
}

absl::Status ScopedDevice::Enter(int index) {
  BRAID_RETURN_IF_ERROR(CudaStatus(cudaGetDevice(&previous_), "cudaGetDevice"));
  entered_ = true;
  if (previous_ == index) return absl::OkStatus();
  return CudaStatus(cudaSetDevice(index), absl::StrCat("cudaSetDevice(", index, ")"));
}

}  // namespace braid::nccl::internal
