// Helpers of the kernel-table adapters (register.cc, matmul.cc): device checks, the current
// device guard, and CUDA errors as fatal checks. Kernel-table slots return nothing, so a CUDA
// failure inside one is a broken invariant: it fails fast naming the kernel and CUDA's error.
#ifndef BRAID_BACKENDS_CUDA_KERNELS_REGISTER_UTIL_H_
#define BRAID_BACKENDS_CUDA_KERNELS_REGISTER_UTIL_H_

#include <cuda_runtime_api.h>

#include <initializer_list>

#include "core/check.h"
#include "core/tensor.h"

namespace braid::cuda {

inline void CheckCuda(cudaError_t e, const char* what) {
  BRAID_CHECK(e == cudaSuccess)
      << "cuda kernel '" << what << "': " << cudaGetErrorName(e) << ": " << cudaGetErrorString(e)
      << (e == cudaErrorNoKernelImageForDevice
              ? " (Braid is built for sm_80, sm_90 and compute_90 PTX; see docs/GPU.md)"
              : "");
}

// Makes `device` current for the scope (kernels and cuBLASLt act on the current device).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    CheckCuda(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) CheckCuda(cudaSetDevice(device), "cudaSetDevice");
    changed_ = previous_ != device;
  }
  ~DeviceGuard() {
    if (changed_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

inline void CheckCudaTensors(const char* kernel, std::initializer_list<const Tensor*> ts) {
  const Device d = (*ts.begin())->device();
  for (const Tensor* t : ts) {
    BRAID_CHECK(t->device().type == DeviceType::kCUDA && t->device() == d)
        << "cuda kernel '" << kernel << "': " << t->DescribeForError() << " is not on " << d;
  }
}

}  // namespace braid::cuda

#endif  // BRAID_BACKENDS_CUDA_KERNELS_REGISTER_UTIL_H_
