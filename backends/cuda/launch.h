// The stream each CUDA device's kernels are enqueued on. The kernels of //backends/cuda/kernels
// launch on KernelStream(device); the runtime (streams and events, issue 15 part 1) points it at
// its compute stream with SetKernelStream. Until then it is the legacy default stream (nullptr),
// which orders everything on the device, so nothing is ever unordered by default.
//
// Header-only (inline variables, one instance per program) so that the kernels and the runtime
// share it without a library of their own.
#ifndef BRAID_BACKENDS_CUDA_LAUNCH_H_
#define BRAID_BACKENDS_CUDA_LAUNCH_H_

#include <atomic>

#include <cuda_runtime_api.h>

namespace braid::cuda {

// Device indices past this are a broken invariant (no machine has that many GPUs).
inline constexpr int kMaxCudaDevices = 64;

namespace launch_internal {
inline std::atomic<cudaStream_t> g_kernel_streams[kMaxCudaDevices] = {};
inline bool ValidDevice(int device) { return device >= 0 && device < kMaxCudaDevices; }
}  // namespace launch_internal

// The stream for kernels on `device` (the legacy default stream unless the runtime set one).
inline cudaStream_t KernelStream(int device) {
  if (!launch_internal::ValidDevice(device)) return nullptr;
  return launch_internal::g_kernel_streams[device].load(std::memory_order_acquire);
}

// Sets it (nullptr: back to the legacy default stream). Returns false for a device index outside
// [0, kMaxCudaDevices). Call while no kernel is being enqueued for that device; work already
// enqueued on the previous stream is not waited for (the runtime orders the two with an event).
inline bool SetKernelStream(int device, cudaStream_t stream) {
  if (!launch_internal::ValidDevice(device)) return false;
  launch_internal::g_kernel_streams[device].store(stream, std::memory_order_release);
  return true;
}

}  // namespace braid::cuda

#endif  // BRAID_BACKENDS_CUDA_LAUNCH_H_
