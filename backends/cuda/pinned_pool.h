// Page-locked host buffers for host-to-device copies, cached like device memory.
//
// Why: a copy from pageable memory is staged by the driver through its own pinned buffer and
// blocks the host; from page-locked memory it is a DMA the host does not wait for. Pinning is
// expensive (cudaHostAlloc maps and locks pages, milliseconds for large buffers), and every step
// copies batches of the same sizes, so buffers are kept and reused.
//
// A buffer handed to the device is in use until the stream that copies from it passes the copy:
// Free records an event on that stream, and the buffer is handed out again only once the event
// has completed (queried, never waited for). Sizes are rounded up to a power of two (at least
// 4 KiB), so a buffer fits every batch of its size class.
#ifndef BRAID_BACKENDS_CUDA_PINNED_POOL_H_
#define BRAID_BACKENDS_CUDA_PINNED_POOL_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "backends/cuda/device_api.h"

namespace braid::cuda {

class PinnedHostPool {
 public:
  explicit PinnedHostPool(DeviceApi* api) : api_(api) {}
  ~PinnedHostPool();  // frees every buffer, waiting for pending ones
  PinnedHostPool(const PinnedHostPool&) = delete;
  PinnedHostPool& operator=(const PinnedHostPool&) = delete;

  absl::StatusOr<void*> Allocate(size_t bytes);
  // Back to the pool once `last_use` has passed the work enqueued on it so far.
  absl::Status Free(void* ptr, Stream last_use);
  // Frees cached buffers whose last use has completed.
  absl::Status EmptyCache();

  static size_t RoundSize(size_t bytes);
  int64_t host_allocs() const;     // cudaHostAlloc calls so far
  int64_t cached_buffers() const;  // free, kept for reuse
  int64_t in_use_buffers() const;

 private:
  struct Buffer {
    size_t size = 0;
    bool in_use = false;
    bool pending = false;  // `event` recorded at Free, not yet seen complete
    Event event;
  };

  DeviceApi* const api_;
  mutable std::mutex mu_;
  std::unordered_map<void*, Buffer> buffers_;
  std::multimap<size_t, void*> free_;
  int64_t host_allocs_ = 0;
};

}  // namespace braid::cuda

#endif  // BRAID_BACKENDS_CUDA_PINNED_POOL_H_
