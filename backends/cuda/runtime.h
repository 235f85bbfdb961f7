// One CUDA device as the backend sees it: its DeviceApi, a compute stream, a copy stream, the
// calling thread's current stream, pinned host buffers; and the process-wide table of them.
//
// Streams. Kernels and the allocator work on the thread's *current* stream, the compute stream
// unless a CurrentStreamGuard says otherwise. The compute stream is a blocking stream (it
// synchronises with CUDA's legacy default stream, which the NCCL communicator orders its
// collectives after); the copy stream is non-blocking, so host-to-device copies of the next
// batch overlap the step (prefetch.h).
//
// The table. InstallCudaBackend (install.h) gives it a DeviceApi factory: the CUDA runtime in
// programs built with --config=cuda, the fake in tests. Each device's runtime is made on first
// use; a failure (no driver, no such device) is returned every time it is asked for, with
// CUDA's reason.
#ifndef BRAID_BACKENDS_CUDA_RUNTIME_H_
#define BRAID_BACKENDS_CUDA_RUNTIME_H_

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "backends/cuda/caching_allocator.h"
#include "backends/cuda/device_api.h"
#include "backends/cuda/pinned_pool.h"

namespace braid::cuda {

class DeviceRuntime {
 public:
  static absl::StatusOr<std::unique_ptr<DeviceRuntime>> Create(std::unique_ptr<DeviceApi> api);
  ~DeviceRuntime();

  int index() const { return api_->device_index(); }
  Device device() const { return Device::CUDA(index()); }
  DeviceApi& api() { return *api_; }
  Stream compute_stream() const { return compute_; }
  Stream copy_stream() const { return copy_; }
  // The calling thread's current stream on this device (the compute stream by default).
  Stream current_stream() const;
  PinnedHostPool& pinned() { return *pinned_; }
  // The device's allocator, the one core's GetAllocator(cuda:N) returns (install.h).
  CachingAllocator& allocator();

 private:
  friend class CurrentStreamGuard;
  DeviceRuntime(std::unique_ptr<DeviceApi> api, Stream compute, Stream copy);
  std::unique_ptr<DeviceApi> api_;
  Stream compute_, copy_;
  std::unique_ptr<PinnedHostPool> pinned_;
};

// Makes `stream` the calling thread's current stream of `runtime` until destroyed.
class CurrentStreamGuard {
 public:
  CurrentStreamGuard(DeviceRuntime& runtime, Stream stream);
  ~CurrentStreamGuard();
  CurrentStreamGuard(const CurrentStreamGuard&) = delete;
  CurrentStreamGuard& operator=(const CurrentStreamGuard&) = delete;

 private:
  const DeviceRuntime* runtime_;
  bool had_previous_;
  Stream previous_;
};

using DeviceApiFactory = std::function<absl::StatusOr<std::unique_ptr<DeviceApi>>(int index)>;

// Sets the factory every later GetRuntime uses (once per process; see install.h).
void SetDeviceApiFactory(DeviceApiFactory factory);
// Called once for each runtime GetRuntime makes, before anyone else sees it: how the CUDA build
// points the kernels' launch stream (launch.h) at the device's compute stream.
void SetRuntimeCreatedHook(std::function<void(DeviceRuntime&)> hook);
// The runtime of cuda:index, made on first use. FAILED_PRECONDITION when no backend is
// installed; otherwise the factory's error (CUDA's reason) when the device cannot be used.
absl::StatusOr<DeviceRuntime*> GetRuntime(int index);
// For code that already holds a tensor on the device (so its runtime exists): fails fast.
DeviceRuntime& RuntimeOf(Device device);

}  // namespace braid::cuda

#endif  // BRAID_BACKENDS_CUDA_RUNTIME_H_
