// KeptInputs (kept_inputs.h), alone: a partitioned input comes back bit for bit from the group's
// blocks, of any size (the first numel % t ranks one element longer), each rank holding only its
// block; cpu_checkpointing moves a CUDA device's input to pinned host memory and back through the
// CUDA backend's copies, here on the fake device (backends/cuda/fake_device_api.h), and moves
// nothing on a CPU device.
#include "launcher/activation_checkpointing/kept_inputs.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/cuda/fake_device_api.h"
#include "backends/cuda/install.h"
#include "backends/cuda/runtime.h"
#include "backends/in_process/run_ranks.h"
#include "core/allocator.h"
#include "core/pinned_host.h"
#include "gtest/gtest.h"

namespace braid {
namespace {

// Distinct values, so a block put in the wrong place shows.
Tensor Numbered(const Shape& shape, float first) {
  std::vector<float> v(size_t(NumElements(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = first + 0.25f * float(i);
  return Tensor::FromVector(v, shape);
}

TEST(KeptInputs, PartitionKeepsThisRanksBlockAndGathersTheInputBack) {
  // 35 elements over 3 ranks: blocks of 12, 12 and 11.
  const Shape shape = {5, 7};
  const std::vector<int64_t> block = {12, 12, 11};
  testing::RunRanks(3, [&](int rank, Communicator* comm) {
    KeptInputs::Options o;
    o.partition_group = comm;
    KeptInputs store(o);
    const Tensor input = Numbered(shape, 1.0f);
    {
      std::shared_ptr<KeptInputs::Kept> kept = store.Keep(input);
      EXPECT_EQ(kept->part().numel(), block[size_t(rank)]);
      EXPECT_EQ(store.held_bytes(), block[size_t(rank)] * 4);
      // Its own memory, not a view that would keep the whole input alive.
      EXPECT_NE(kept->part().storage(), input.storage());
      const int64_t offset = rank == 0 ? 0 : rank == 1 ? 12 : 24;
      EXPECT_EQ(kept->part().ToFloatVector(),
                input.FlatRange(offset, block[size_t(rank)]).ToFloatVector());
      // Twice (a second backward through a kept graph recomputes again).
      for (int i = 0; i < 2; ++i) {
        Tensor back = store.Restore(*kept);
        EXPECT_EQ(back.shape(), shape);
        EXPECT_EQ(back.ToFloatVector(), input.ToFloatVector());
      }
      EXPECT_EQ(store.gathered(), 2);
    }
    EXPECT_EQ(store.held_bytes(), 0) << "the count drops when the checkpoint lets go";
    EXPECT_EQ(store.peak_held_bytes(), block[size_t(rank)] * 4);
    EXPECT_EQ(store.ToString(Device::CPU()),
              "each rank keeps 1/3 of each (partition_activations over the tensor-parallel group)");
  });
}

TEST(KeptInputs, WholeAndOnACpuDeviceNothingMoves) {
  KeptInputs::Options o;
  o.to_host = true;  // cpu_checkpointing on a CPU device: already in host memory
  KeptInputs store(o);
  const Tensor input = Numbered({4, 3}, -2.0f);
  std::shared_ptr<KeptInputs::Kept> kept = store.Keep(input);
  EXPECT_EQ(kept->part().storage(), input.storage());
  EXPECT_EQ(store.held_bytes(), 48);
  EXPECT_EQ(store.Restore(*kept).storage(), input.storage());
  EXPECT_EQ(store.ToString(Device::CPU()), "");
  EXPECT_EQ(store.gathered(), 0);
}

class KeptInputsOnCuda : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cuda::InstallCudaBackend([](int index) -> absl::StatusOr<std::unique_ptr<cuda::DeviceApi>> {
      cuda::FakeDeviceApi::Options o;
      o.device_index = index;
      return std::make_unique<cuda::FakeDeviceApi>(o);
    });
  }
  static cuda::FakeDeviceApi& Fake() {
    return static_cast<cuda::FakeDeviceApi&>(cuda::RuntimeOf(Device::CUDA(0)).api());
  }
};

// cpu_checkpointing: the kept input leaves the device for page-locked host memory (the device's
// bytes go back to its allocator) and returns, bit for bit, before the recompute; the fake logs
// one device-to-host copy at Keep and one host-to-device copy at Restore, of the input's bytes,
// both on the copy stream and waited for by the compute stream, never by the host; the next
// input of that size reuses the host buffer (no page-locked allocation or free per input: a free
// would synchronise the device).
TEST_F(KeptInputsOnCuda, CpuCheckpointingKeepsTheInputInPinnedHostMemory) {
  const Device gpu = Device::CUDA(0);
  KeptInputs::Options o;
  o.to_host = true;
  KeptInputs store(o);
  const Tensor host_values = Numbered({6, 8}, 3.0f);
  Tensor input = host_values.To(gpu);
  const int64_t with_input = GetMemoryStats(gpu).current_bytes;
  Fake().RunAll();
  Fake().ClearLog();
  Fake().ClearSyncs();
  Fake().ClearIssued();
  std::shared_ptr<KeptInputs::Kept> kept = store.Keep(input);
  EXPECT_EQ(kept->part().device(), PinnedHost());
  EXPECT_TRUE(Fake().IsPinned(kept->part().raw_data()));
  EXPECT_EQ(store.held_bytes(), 6 * 8 * 4);
  input = Tensor();  // the forward's own reference gone: only the host copy remains
  EXPECT_EQ(GetMemoryStats(gpu).current_bytes, with_input - 6 * 8 * 4);
  Tensor back = store.Restore(*kept);
  EXPECT_EQ(back.device(), gpu);
  EXPECT_TRUE(Fake().syncs().empty()) << ::testing::PrintToString(Fake().syncs());
  cuda::DeviceRuntime& rt = cuda::RuntimeOf(gpu);
  const std::string copy = absl::StrCat(Fake().StreamId(rt.copy_stream()), ":");
  const std::string compute = absl::StrCat(Fake().StreamId(rt.compute_stream()), ":");
  std::vector<std::string> waits;  // the compute stream's waits, and the copies before them
  for (const std::string& op : Fake().issued()) {
    if (op.rfind(copy + "D2H", 0) == 0 || op.rfind(copy + "H2D", 0) == 0 || op.rfind(compute + "wait", 0) == 0) {
      waits.push_back(op.substr(0, op.rfind(':')));
    }
  }
  EXPECT_EQ(waits, (std::vector<std::string>{copy + "D2H", compute + "wait", copy + "H2D", compute + "wait"}))
      << ::testing::PrintToString(Fake().issued());
  Fake().RunAll();
  const std::vector<std::string> log = Fake().log();
  ASSERT_EQ(log.size(), 2u) << ::testing::PrintToString(log);
  EXPECT_NE(log[0].find(":D2H:192"), std::string::npos) << log[0];
  EXPECT_NE(log[1].find(":H2D:192"), std::string::npos) << log[1];
  EXPECT_EQ(back.ToFloatVector(), host_values.ToFloatVector());
  EXPECT_EQ(store.ToString(gpu), "in pinned host memory (cpu_checkpointing)");

  const void* buffer = kept->part().raw_data();
  kept.reset();  // after the recompute: the buffer goes back to the store
  const int64_t pinned_allocs = GetMemoryStats(PinnedHost()).num_allocs;
  std::shared_ptr<KeptInputs::Kept> next = store.Keep(host_values.To(gpu));
  EXPECT_EQ(next->part().raw_data(), buffer);
  EXPECT_EQ(GetMemoryStats(PinnedHost()).num_allocs, pinned_allocs);
  Fake().RunAll();
  EXPECT_EQ(store.Restore(*next).ToFloatVector(), host_values.ToFloatVector());
  const std::vector<std::string> syncs = Fake().syncs();  // the reads above, no pinned free
  EXPECT_EQ(std::count(syncs.begin(), syncs.end(), "free_pinned"), 0) << ::testing::PrintToString(syncs);
}

}  // namespace
}  // namespace braid
