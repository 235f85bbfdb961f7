// The first pieces of Braid's CUDA backend: device discovery and one kernel, reachable from
// host code. Built only with --config=cuda (see docs/GPU.md); the device tensors, allocator and
// the kernel table's CUDA slots come later.
//
// Every function reports CUDA failures as a status carrying CUDA's own message, so that a
// machine without a driver or GPU is a clean, explainable error rather than a crash.
#ifndef BRAID_BACKENDS_CUDA_DEVICE_H_
#define BRAID_BACKENDS_CUDA_DEVICE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace braid::cuda {

// Number of CUDA devices this process may use (CUDA_VISIBLE_DEVICES applies). Unavailable, with
// CUDA's reason, when there is no driver, no GPU, or a driver too old for the CUDA runtime.
absl::StatusOr<int> CudaDeviceCount();

// The device's name as the driver reports it, e.g. "NVIDIA H100 80GB HBM3".
absl::StatusOr<std::string> CudaDeviceName(int index);

// y[i] = a * x[i] + b * y[i] for i in [0, n) on CUDA device `index`, where x and y are HOST
// arrays copied to the device and back. As in BLAS, b == 0 makes y write-only: whatever y held
// (NaN included) does not leak into the result. A bring-up and test path; tensors will keep
// their data on the device. The calling thread's current CUDA device is left as it was.
absl::Status AxpbyOnDevice(int index, float a, const float* x, float b, float* y, int64_t n);

}  // namespace braid::cuda

#endif  // BRAID_BACKENDS_CUDA_DEVICE_H_
