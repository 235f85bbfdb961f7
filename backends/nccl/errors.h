// CUDA's and NCCL's errors as absl::Status, and the scoped current device every CUDA call of the
// communicator runs under. Separate from the communicator because every part of it (Works,
// launches, creation, teardown) translates errors the same way.
#ifndef BRAID_BACKENDS_NCCL_ERRORS_H_
#define BRAID_BACKENDS_NCCL_ERRORS_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>

#include "absl/status/status.h"

namespace braid::nccl::internal {

absl::Status CudaStatus(cudaError_t err, const std::string& what);

// NCCL's own words: the result's name, and the last error message NCCL logged for `comm`.
std::string NcclMessage(ncclResult_t r, ncclComm_t comm);

// Errors after which the communicator cannot be trusted: a peer or the network failed, or
// device state is gone. Argument and usage errors are caught before anything is enqueued.
bool IsFatal(ncclResult_t r);

// Makes `index` the thread's current device and restores the previous one, so that the
// communicator never changes what the caller's later CUDA calls run on.
class ScopedDevice {
 public:
  absl::Status Enter(int index);
  ~ScopedDevice() {
    if (entered_) cudaSetDevice(previous_);
  }

 private:
  int previous_ = 0;
  bool entered_ = false;
};

}  // namespace braid::nccl::internal

#endif  // BRAID_BACKENDS_NCCL_ERRORS_H_
