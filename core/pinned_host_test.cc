// OffloadHost picks page-locked host memory only where a backend offers it for the training
// device's type, and only when asked; tensors there are CPU tensors with their own counters.
#include "core/pinned_host.h"

#include <cstdlib>
#include <set>

#include "core/tensor.h"
#include "gtest/gtest.h"

namespace braid {
namespace {

// Stands in for a backend's pinned allocator (CUDA's cudaHostAlloc): remembers what it handed
// out, so the test can tell its memory from the pageable host allocator's.
class FakePinnedAllocator final : public Allocator {
 public:
  explicit FakePinnedAllocator(std::set<void*>* live) : live_(live) {}
  void* Allocate(size_t bytes) override {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    live_->insert(p);
    RecordAlloc(bytes);
    return p;
  }
  void Deallocate(void* p, size_t bytes) override {
    live_->erase(p);
    std::free(p);
    RecordFree(bytes);
  }

 private:
  std::set<void*>* live_;
};

TEST(PinnedHostTest, PageableWithoutABackendThatPins) {
  EXPECT_FALSE(HasPinnedHostAllocator(DeviceType::kCPU));
  // A CPU training device copies nothing across a bus: pinning it would mean nothing.
  EXPECT_EQ(OffloadHost(Device::CPU(), /*pin=*/true), Device::Host());
  EXPECT_EQ(OffloadHost(Device::CPU(), /*pin=*/false), Device::Host());
  EXPECT_EQ(Device::Host().ToString(), "host");
}

TEST(PinnedHostTest, PinnedWhereTheBackendOffersItAndOnlyWhenAsked) {
  static std::set<void*> live;
  static int made = 0;
  static Device made_for;
  RegisterPinnedHostAllocator(DeviceType::kCUDA, [](Device compute) {
    ++made;
    made_for = compute;
    return std::make_unique<FakePinnedAllocator>(&live);
  });
  ASSERT_TRUE(HasPinnedHostAllocator(DeviceType::kCUDA));
  EXPECT_EQ(OffloadHost(Device::CUDA(1), /*pin=*/false), Device::Host());
  EXPECT_EQ(made, 0) << "nothing is pinned unless asked";
  const Device pinned = OffloadHost(Device::CUDA(1), /*pin=*/true);
  EXPECT_EQ(pinned, PinnedHost());
  EXPECT_EQ(pinned.ToString(), "host (pinned)");
  EXPECT_EQ(OffloadHost(Device::CUDA(0), /*pin=*/true), PinnedHost());
  EXPECT_EQ(made, 1) << "one pinned allocator per process";
  EXPECT_EQ(made_for, Device::CUDA(1));

  const int64_t before = GetMemoryStats(PinnedHost()).current_bytes;
  {
    Tensor t = Tensor::Full({16}, 2.5f, DType::kF32, PinnedHost());
    EXPECT_EQ(live.count(t.raw_data()), 1u) << "the tensor's memory is the pinned allocator's";
    EXPECT_EQ(GetMemoryStats(PinnedHost()).current_bytes, before + 64);
    // A CPU tensor like any other: copies in and out of pageable memory work.
    Tensor back = t.To(Device::CPU());
    EXPECT_EQ(back.ToVector<float>(), std::vector<float>(16, 2.5f));
  }
  EXPECT_EQ(GetMemoryStats(PinnedHost()).current_bytes, before);
  EXPECT_TRUE(live.empty());
}

}  // namespace
}  // namespace braid
