#include "core/allocator.h"

#include <cstdlib>
#include <map>
#include <mutex>

#include "core/check.h"

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

class CpuAllocator final : public Allocator {
 public:
  explicit CpuAllocator(Device d) : device_(d) {}
  void* Allocate(size_t bytes) override {
    // 64-byte alignment: whole cache lines and aligned AVX loads.
    size_t rounded = (bytes + 63) & ~size_t(63);
    void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    BRAID_CHECK(p != nullptr) << "out of host memory on " << device_ << ": asked for " << bytes
                              << " bytes while holding " << stats().current_bytes;
    RecordAlloc(bytes);
    return p;
  }
  void Deallocate(void* ptr, size_t bytes) override {
    std::free(ptr);
    RecordFree(bytes);
  }

 private:
  Device device_;
};

struct Registry {
  std::mutex mu;
  std::map<std::pair<int, int>, std::unique_ptr<Allocator>> allocators;
  AllocatorFactory factories[kNumDeviceTypes];
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

}  // namespace braid
