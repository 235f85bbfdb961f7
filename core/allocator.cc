#include "core/allocator.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/check.h"
#include "core/pinned_host.h"

namespace braid {

MemoryStats Allocator::stats() const {
  return MemoryStats{current_.load(), peak_.load(), count_.load()};
}

void Allocator::ResetPeak() { peak_.store(current_.load()); }

void Allocator::RecordAlloc(size_t bytes) {
  int64_t now = current_.fetch_add(int64_t(bytes)) + int64_t(bytes);
  count_.fetch_add(1);
  int64_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
}

void Allocator::RecordFree(size_t bytes) { current_.fetch_sub(int64_t(bytes)); }

namespace {

// Training repeats the same shapes every step, so freed blocks are kept by (rounded) size and
// handed out again: fresh pages cost a page fault each (glibc returns large blocks to the kernel
// on free), which was ~7% of a gpt-mini step. current/peak still count live tensors only.
class CpuAllocator final : public Allocator {
 public:
  explicit CpuAllocator(Device d) : device_(d) {}
  ~CpuAllocator() override {
    for (auto& [size, blocks] : free_) {
      for (void* p : blocks) std::free(p);
    }
  }
  void* Allocate(size_t bytes) override {
    size_t rounded = Round(bytes);
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(rounded);
      if (it != free_.end() && !it->second.empty()) {
        p = it->second.back();
        it->second.pop_back();
        cached_ -= rounded;
      }
    }
    // 64-byte alignment: whole cache lines and aligned AVX loads.
    if (p == nullptr) p = std::aligned_alloc(64, rounded);
    BRAID_CHECK(p != nullptr) << "out of host memory on " << device_ << ": asked for " << bytes
                              << " bytes while holding " << stats().current_bytes;
    RecordAlloc(bytes);
    return p;
  }
  void Deallocate(void* ptr, size_t bytes) override {
    RecordFree(bytes);
    size_t rounded = Round(bytes);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cached_ + rounded <= kMaxCached) {
        free_[rounded].push_back(ptr);
        cached_ += rounded;
        return;
      }
    }
    std::free(ptr);
  }

 private:
  static constexpr size_t kMaxCached = size_t(4) << 30;
  static size_t Round(size_t bytes) {
    if (bytes == 0) return 64;
    size_t align = bytes >= (size_t(64) << 10) ? 4096 : 64;
    return (bytes + align - 1) / align * align;
  }

  Device device_;
  std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t cached_ = 0;
};

struct Registry {
  std::mutex mu;
  std::map<std::pair<int, int>, std::unique_ptr<Allocator>> allocators;
  AllocatorFactory factories[kNumDeviceTypes];
  PinnedHostAllocatorFactory pinned_factories[kNumDeviceTypes];
};

Registry& GetRegistry() {
  static Registry* r = new Registry;  // never destroyed: tensors may outlive static teardown
  return *r;
}

}  // namespace

void RegisterAllocatorFactory(DeviceType type, AllocatorFactory factory) {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.factories[int(type)] = std::move(factory);
}

Allocator* GetAllocator(Device device) {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto key = std::make_pair(int(device.type), device.index);
  auto it = r.allocators.find(key);
  if (it != r.allocators.end()) return it->second.get();
  // Made only by OffloadHost, which knows the training device whose runtime pins it.
  BRAID_CHECK(device != PinnedHost()) << "no pinned host memory in this process: choose the "
                                         "host device with OffloadHost(device, pin)";
  std::unique_ptr<Allocator> a;
  if (device.type == DeviceType::kCPU) {
    a = std::make_unique<CpuAllocator>(device);
  } else {
    BRAID_CHECK(r.factories[int(device.type)]) << "no allocator for " << device
                                               << ": is its backend linked into this program?";
    a = r.factories[int(device.type)](device);
  }
  Allocator* raw = a.get();
  r.allocators[key] = std::move(a);
  return raw;
}

void RegisterPinnedHostAllocator(DeviceType compute_type, PinnedHostAllocatorFactory factory) {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.pinned_factories[int(compute_type)] = std::move(factory);
}

bool HasPinnedHostAllocator(DeviceType compute_type) {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  return bool(r.pinned_factories[int(compute_type)]);
}

Device OffloadHost(Device compute, bool pin) {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (!pin || !r.pinned_factories[int(compute.type)]) return Device::Host();
  auto key = std::make_pair(int(PinnedHost().type), PinnedHost().index);
  if (!r.allocators.count(key)) {
    std::unique_ptr<Allocator> a = r.pinned_factories[int(compute.type)](compute);
    BRAID_CHECK(a != nullptr) << "the pinned host allocator factory for " << compute << " returned null";
    r.allocators[key] = std::move(a);
  }
  return PinnedHost();
}

std::vector<std::pair<Device, MemoryStats>> AllMemoryStats() {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::pair<Device, MemoryStats>> out;
  for (auto& [key, a] : r.allocators) {
    out.emplace_back(Device{DeviceType(key.first), key.second}, a->stats());
  }
  return out;
}

}  // namespace braid
