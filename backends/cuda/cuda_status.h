// CUDA runtime errors as absl::Status, carrying CUDA's own name and message. --config=cuda only.
#ifndef BRAID_BACKENDS_CUDA_CUDA_STATUS_H_
#define BRAID_BACKENDS_CUDA_CUDA_STATUS_H_

#include <string>

#include <cuda_runtime_api.h>

#include "absl/status/status.h"

namespace braid::cuda {

// `what` names the CUDA call and what it was for. No driver / no GPU is UNAVAILABLE (nothing
// Braid can fix), running out of memory RESOURCE_EXHAUSTED, a GPU the code was not built for
// FAILED_PRECONDITION, anything else INTERNAL.
absl::Status CudaStatus(cudaError_t err, const std::string& what);

}  // namespace braid::cuda

#endif  // BRAID_BACKENDS_CUDA_CUDA_STATUS_H_
