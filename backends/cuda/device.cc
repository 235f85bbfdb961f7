#include "backends/cuda/device.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "backends/cuda/axpby.h"
#include "backends/cuda/cuda_status.h"
#include "core/check.h"

namespace braid::cuda {
namespace {

absl::Status CheckDeviceIndex(int index) {
  if (index < 0) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA device index ", index, " is negative"));
  }
  BRAID_ASSIGN_OR_RETURN(int count, CudaDeviceCount());
  if (index >= count) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA device index ", index,
                                                   " is out of range: this process sees ",
                                                   count, " device(s) (CUDA_VISIBLE_DEVICES?)"));
  }
  return absl::OkStatus();
}

// Makes `index` the thread's current device and restores the previous one on destruction, so
// that helpers here never change what the caller's later CUDA calls run on.
class ScopedDevice {
 public:
  absl::Status Enter(int index) {
    BRAID_RETURN_IF_ERROR(CudaStatus(cudaGetDevice(&previous_), "cudaGetDevice"));
    entered_ = true;
    return CudaStatus(cudaSetDevice(index), absl::StrCat("cudaSetDevice(", index, ")"));
  }
  ~ScopedDevice() {
    if (entered_) cudaSetDevice(previous_);
  }

 private:
  int previous_ = 0;
  bool entered_ = false;
};

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  absl::Status Allocate(size_t bytes) {
    return CudaStatus(cudaMalloc(&ptr_, bytes), absl::StrCat("cudaMalloc(", bytes, " bytes)"));
  }
  float* get() const { return static_cast<float*>(ptr_); }

 private:
  void* ptr_ = nullptr;
};

}  // namespace

absl::StatusOr<int> CudaDeviceCount() {
  int count = 0;
  BRAID_RETURN_IF_ERROR(CudaStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount"));
  // The runtime reports "no device" as an error, but be safe against a driver that does not.
  if (count == 0) {
    return absl::UnavailableError("cudaGetDeviceCount found no CUDA device");
  }
  return count;
}

absl::StatusOr<std::string> CudaDeviceName(int index) {
  BRAID_RETURN_IF_ERROR(CheckDeviceIndex(index));
  cudaDeviceProp prop;
  BRAID_RETURN_IF_ERROR(CudaStatus(cudaGetDeviceProperties(&prop, index),
                                   absl::StrCat("cudaGetDeviceProperties(", index, ")")));
  return std::string(prop.name);
}

absl::Status AxpbyOnDevice(int index, float a, const float* x, float b, float* y, int64_t n) {
  if (n < 0) {
    return absl::InvalidArgumentError(absl::StrCat("AxpbyOnDevice: n = ", n, " is negative"));
  }
  BRAID_RETURN_IF_ERROR(CheckDeviceIndex(index));
  if (n == 0) return absl::OkStatus();
  BRAID_CHECK(x != nullptr && y != nullptr) << "AxpbyOnDevice: null host array, n = " << n;

  ScopedDevice scoped;
  BRAID_RETURN_IF_ERROR(scoped.Enter(index));
  const size_t bytes = size_t(n) * sizeof(float);
  DeviceBuffer dx, dy;
  BRAID_RETURN_IF_ERROR(dx.Allocate(bytes));
  BRAID_RETURN_IF_ERROR(dy.Allocate(bytes));
  BRAID_RETURN_IF_ERROR(
      CudaStatus(cudaMemcpy(dx.get(), x, bytes, cudaMemcpyHostToDevice), "cudaMemcpy x to device"));
  if (b != 0.f) {
    BRAID_RETURN_IF_ERROR(CudaStatus(cudaMemcpy(dy.get(), y, bytes, cudaMemcpyHostToDevice),
                                     "cudaMemcpy y to device"));
  }
  // The legacy default stream: the blocking copies around the launch order it.
  BRAID_RETURN_IF_ERROR(CudaStatus(LaunchAxpbyF32(a, dx.get(), b, dy.get(), n, nullptr),
                                   absl::StrCat("launching the axpby kernel (n = ", n, ")")));
  BRAID_RETURN_IF_ERROR(CudaStatus(cudaMemcpy(y, dy.get(), bytes, cudaMemcpyDeviceToHost),
                                   "cudaMemcpy y to host (also reports kernel faults)"));
  return absl::OkStatus();
}

}  // namespace braid::cuda
