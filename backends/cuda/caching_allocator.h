// The CUDA device allocator: a caching allocator over DeviceApi, in the manner of PyTorch's.
//
// Why cache: cudaMalloc and cudaFree synchronise the device and cost tens of microseconds to
// milliseconds, and training allocates the same shapes every step. So device memory is taken
// in segments and kept; tensors get blocks carved out of them.
//
// Size classes. Every request is rounded up to 512 bytes. Requests up to 1 MiB come from the
// small pool, whose segments are 2 MiB; larger ones from the large pool, whose segments are
// 20 MiB for requests under 10 MiB and the request rounded up to 2 MiB otherwise. A free block
// bigger than a request is split (small pool: when at least 512 bytes remain; large pool: when
// more than 1 MiB remains, so big blocks are not whittled into unusable slivers), and a freed
// block merges with free neighbours of its segment.
//
// Stream-ordered reuse. A block belongs to the stream it was allocated on. Freeing it records
// an event on that stream: work already enqueued there may still read or write the block, but
// anything enqueued on the same stream later runs after that work, so the block is reusable on
// that stream at once. Another stream gets it only once the event has completed (queried, never
// waited for). A tensor used on a second stream must stay alive until that use is known to be
// done (the NCCL communicator holds its tensors until the collective completes, for instance).
//
// Statistics: core's MemoryStats (current/peak/num_allocs count requested bytes of live
// tensors, as the CPU allocator does), plus what is reserved from the device and cache hits.
// Out of memory: the cache's free segments are returned to the device and the request retried;
// if it still fails, TryAllocate says what was asked and what is held, and Allocate (core's
// contract: never null) fails fast with the same message.
#ifndef BRAID_BACKENDS_CUDA_CACHING_ALLOCATOR_H_
#define BRAID_BACKENDS_CUDA_CACHING_ALLOCATOR_H_

#include <cstdint>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "backends/cuda/device_api.h"
#include "core/allocator.h"

namespace braid::cuda {

struct CachingAllocatorStats {
  int64_t allocated_bytes = 0;      // live blocks, rounded sizes
  int64_t reserved_bytes = 0;       // segments held from the device
  int64_t peak_reserved_bytes = 0;
  int64_t num_allocs = 0;           // successful allocations
  int64_t cache_hits = 0;           // allocations served without a device malloc
  int64_t device_mallocs = 0, device_frees = 0;
  int64_t num_ooms = 0;             // requests refused after emptying the cache
  int64_t segments = 0;
};

class CachingAllocator final : public Allocator {
 public:
  static constexpr size_t kRound = 512;
  static constexpr size_t kSmallLimit = size_t(1) << 20;        // small pool: <= 1 MiB
  static constexpr size_t kSmallSegment = size_t(2) << 20;
  static constexpr size_t kLargeSegment = size_t(20) << 20;     // for requests < 10 MiB
  static constexpr size_t kLargeDirect = size_t(10) << 20;
  static constexpr size_t kLargeRound = size_t(2) << 20;

  // `current_stream` names the stream Allocate (core's interface, which has none) allocates
  // on: the calling thread's current stream of the device.
  CachingAllocator(Device device, DeviceApi* api, std::function<Stream()> current_stream);
  ~CachingAllocator() override;  // returns every segment; blocks must not be in use any more

  // core's Allocator: on the current stream; out of memory is fatal (message as TryAllocate's).
  void* Allocate(size_t bytes) override;
  void Deallocate(void* ptr, size_t bytes) override;

  absl::StatusOr<void*> TryAllocate(size_t bytes, Stream stream);
  void Free(void* ptr);

  // Returns to the device every segment that is wholly free and whose last use has completed.
  // Segments still waiting for an event stay (synchronise first to release everything).
  void EmptyCache();

  CachingAllocatorStats caching_stats() const;
  void ResetPeakReserved();
  Device device() const { return device_; }
  // The stream a live pointer was allocated on (a fatal error for a pointer not allocated here).
  Stream StreamOf(const void* ptr) const;

  static size_t RoundSize(size_t bytes);
  static size_t SegmentSize(size_t rounded);

 private:
  struct Block {
    char* ptr = nullptr;
    size_t size = 0;
    bool small = false;
    bool allocated = false;
    Block *prev = nullptr, *next = nullptr;  // neighbours within the segment
    Stream stream;
    size_t requested = 0;
    // Free blocks: the event recorded on `stream` when freed; while it has not completed the
    // block is reusable on `stream` only. `untracked`: the event could not be recorded (device
    // broken or shutting down): the block stays with its stream for good.
    Event event;
    bool pending = false;
    bool untracked = false;
    int64_t free_seq = 0;  // order of frees, to keep the later of two events on one stream
  };
  struct BySize {
    bool operator()(const Block* a, const Block* b) const {
      return a->size != b->size ? a->size < b->size : a->ptr < b->ptr;
    }
  };
  using Pool = std::set<Block*, BySize>;

  bool Idle(const Block* b) const { return !b->pending && !b->untracked; }
  Pool& PoolOf(const Block* b) { return b->small ? small_ : large_; }
  Block* FindFreeLocked(size_t rounded, bool small, Stream stream);
  void SplitLocked(Block* b, size_t rounded);
  void ProcessEventsLocked();
  // Merges free `b` (in no pool) with free neighbours it may merge with, taking them out of
  // their pool and of `todo`; returns the block that remains (in no pool either).
  Block* MergeLocked(Block* b, std::set<Block*>* todo);
  bool CanMerge(const Block* a, const Block* b) const;
  void ReleaseEventLocked(Block* b);
  absl::StatusOr<Event> GetEventLocked();
  size_t ReleaseFreeSegmentsLocked();
  std::string DescribeLocked() const;

  const Device device_;
  DeviceApi* const api_;
  const std::function<Stream()> current_stream_;
  mutable std::mutex mu_;
  Pool small_, large_;
  std::set<Block*> pending_;  // free blocks whose event has not been seen complete
  std::unordered_map<const void*, Block*> live_;
  std::vector<Event> spare_events_;
  CachingAllocatorStats stats_;
  int64_t free_seq_ = 0;
};

}  // namespace braid::cuda

#endif  // BRAID_BACKENDS_CUDA_CACHING_ALLOCATOR_H_
