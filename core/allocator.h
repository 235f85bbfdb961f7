// Per-device memory allocation with current/peak accounting. Every tensor's storage comes from
// the allocator of its device; the peak figures that benchmarks quote are read here.
#ifndef BRAID_CORE_ALLOCATOR_H_
#define BRAID_CORE_ALLOCATOR_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "core/device.h"

namespace braid {

struct MemoryStats {
  int64_t current_bytes = 0;
  int64_t peak_bytes = 0;
  int64_t num_allocs = 0;  // calls to Allocate since start
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Never returns null: running out of memory is fatal with a message that says what was asked
  // for and what is held.
  virtual void* Allocate(size_t bytes) = 0;
  virtual void Deallocate(void* ptr, size_t bytes) = 0;

  MemoryStats stats() const;
  void ResetPeak();

 protected:
  void RecordAlloc(size_t bytes);
  void RecordFree(size_t bytes);

 private:
  std::atomic<int64_t> current_{0}, peak_{0}, count_{0};
};

// The allocator of a device. CPU devices get a 64-byte-aligned host allocator on first use;
// other device types get theirs from the backend that registers a factory for the type.
Allocator* GetAllocator(Device device);
using AllocatorFactory = std::function<std::unique_ptr<Allocator>(Device)>;
void RegisterAllocatorFactory(DeviceType type, AllocatorFactory factory);

inline MemoryStats GetMemoryStats(Device d) { return GetAllocator(d)->stats(); }
// Every device that has allocated so far, with its figures (per-device imbalance, e.g. under
// single-process data parallelism).
std::vector<std::pair<Device, MemoryStats>> AllMemoryStats();

}  // namespace braid

#endif  // BRAID_CORE_ALLOCATOR_H_
