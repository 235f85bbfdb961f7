// The CUDA backend's wiring into core, on the fake device: tensors on cuda:N allocate from the
// caching allocator (GetMemoryStats works), Tensor::To / CopyFrom move data host<->device and
// device<->device with dtype conversion, and the current stream is per thread.
#include "backends/cuda/runtime.h"

#include <gtest/gtest.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "backends/cuda/fake_device_api.h"
#include "backends/cuda/install.h"
#include "core/allocator.h"
#include "core/pinned_host.h"

namespace braid::cuda {
namespace {

class CudaRuntimeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    InstallCudaBackend([](int index) -> absl::StatusOr<std::unique_ptr<DeviceApi>> {
      if (index >= 2) {
        return absl::InvalidArgumentError("fake: this machine has 2 CUDA devices");
      }
      FakeDeviceApi::Options o;
      o.device_index = index;
      return std::make_unique<FakeDeviceApi>(o);
    });
  }
  static FakeDeviceApi& Fake(int index) {
    return static_cast<FakeDeviceApi&>(RuntimeOf(Device::CUDA(index)).api());
  }
};

TEST_F(CudaRuntimeTest, RoundTripsThroughTheDeviceInEveryDtypePair) {
  std::vector<float> values = {1.5f, -2.0f, 3.25f, 0.0f, 1024.0f};
  Tensor host = Tensor::FromVector(values, {5});
  Tensor dev = host.To(Device::CUDA(0));
  EXPECT_EQ(dev.device(), Device::CUDA(0));
  EXPECT_EQ(dev.ToFloatVector(), values);  // D2H, same dtype
  // These values are exact in bf16 and f16, so every conversion path must return them exactly.
  for (DType to : {DType::kBF16, DType::kF16, DType::kF32}) {
    Tensor d2 = Tensor::Empty({5}, to, Device::CUDA(0));
    d2.CopyFrom(host);  // H2D, converting on the host first
    EXPECT_EQ(d2.ToFloatVector(), values) << DTypeName(to);
    Tensor d3 = Tensor::Empty({5}, DType::kF32, Device::CUDA(0));
    d3.CopyFrom(d2);  // D2D, converting on the device
    EXPECT_EQ(d3.ToFloatVector(), values) << DTypeName(to);
    Tensor h2 = Tensor::Empty({5}, DType::kF32);
    h2.CopyFrom(d2);  // D2H, converting on the host after
    EXPECT_EQ(h2.ToFloatVector(), values) << DTypeName(to);
  }
  std::vector<int32_t> ids = {3, 1, 4, 1, 5, 9};
  EXPECT_EQ(Tensor::FromVector(ids, {6}, Device::CUDA(0)).ToVector<int32_t>(), ids);
}

// Device-to-device copies between dtypes are one conversion on the device (mixed precision's
// up-casts run every step): the stream runs it, the host never waits, no host memory is used.
TEST_F(CudaRuntimeTest, ConvertsBetweenDtypesOnTheDeviceWithoutSynchronising) {
  FakeDeviceApi& fake = Fake(0);
  Tensor f32 = Tensor::FromVector(std::vector<float>{1.0f, -3.0f, 0.1f}, {3}, Device::CUDA(0));
  Tensor bf = Tensor::Empty({3}, DType::kBF16, Device::CUDA(0));
  Tensor f16 = Tensor::Empty({3}, DType::kF16, Device::CUDA(0));
  fake.ClearLog();
  fake.ClearSyncs();
  bf.CopyFrom(f32);
  f16.CopyFrom(bf);
  EXPECT_EQ(fake.syncs(), std::vector<std::string>{});
  fake.RunAll();
  const int s = fake.StreamId(RuntimeOf(Device::CUDA(0)).compute_stream());
  EXPECT_EQ(fake.log(), (std::vector<std::string>{absl::StrCat(s, ":convert:f32->bf16:3"),
                                                  absl::StrCat(s, ":convert:bf16->f16:3")}));
  // 0.1 rounds to bf16 0x3dcd (0.10009765625), which f16 holds exactly.
  EXPECT_EQ(f16.ToFloatVector(), (std::vector<float>{1.0f, -3.0f, 0.10009765625f}));
  EXPECT_EQ(fake.syncs().size(), 1u);  // the read-back above, and only it
}

TEST_F(CudaRuntimeTest, CopiesBetweenTwoDevices) {
  std::vector<float> values = {7, 8, 9};
  Tensor on0 = Tensor::FromVector(values, {3}, Device::CUDA(0));
  Tensor on1 = on0.To(Device::CUDA(1));
  EXPECT_EQ(on1.device(), Device::CUDA(1));
  EXPECT_EQ(on1.ToFloatVector(), values);
  Tensor clone = on1.Clone();  // D2D on one device
  EXPECT_EQ(clone.ToFloatVector(), values);
  EXPECT_NE(clone.raw_data(), on1.raw_data());
}

// pin_memory's host memory comes from cudaHostAlloc (here the fake's), and copies between it and
// the device move the values both ways.
TEST_F(CudaRuntimeTest, OffloadedStateIsPinnedWhenAsked) {
  EXPECT_EQ(OffloadHost(Device::CUDA(0), /*pin=*/false), Device::Host());
  const Device host = OffloadHost(Device::CUDA(0), /*pin=*/true);
  ASSERT_EQ(host, PinnedHost());
  std::vector<float> values = {0.5f, -1.0f, 2.0f};
  Tensor shard = Tensor::FromVector(values, {3}, host);
  EXPECT_TRUE(Fake(0).IsPinned(shard.raw_data()));
  Tensor on_device = Tensor::Empty({3}, DType::kF32, Device::CUDA(0));
  on_device.CopyFrom(shard);  // the H2D copy ZeRO-3 does before a unit's all-gather
  EXPECT_EQ(on_device.ToFloatVector(), values);
  Tensor back = Tensor::Zeros({3}, DType::kF32, host);
  back.CopyFrom(on_device);
  EXPECT_EQ(back.ToFloatVector(), values);
  EXPECT_GT(GetMemoryStats(host).current_bytes, 0);
}

TEST_F(CudaRuntimeTest, TensorsCountInTheDevicesMemoryStats) {
  const Device d = Device::CUDA(0);
  const int64_t before = GetMemoryStats(d).current_bytes;
  {
    Tensor t = Tensor::Empty({256}, DType::kF32, d);
    EXPECT_EQ(GetMemoryStats(d).current_bytes, before + 1024);
    EXPECT_GE(GetMemoryStats(d).peak_bytes, before + 1024);
    EXPECT_EQ(RuntimeOf(d).allocator().StreamOf(t.raw_data()), RuntimeOf(d).compute_stream());
  }
  EXPECT_EQ(GetMemoryStats(d).current_bytes, before);
  bool listed = false;
  for (auto& [dev, stats] : AllMemoryStats()) listed |= dev == d;
  EXPECT_TRUE(listed);
}

TEST_F(CudaRuntimeTest, TheCurrentStreamIsPerThreadAndRestored) {
  DeviceRuntime& rt = RuntimeOf(Device::CUDA(0));
  EXPECT_EQ(rt.current_stream(), rt.compute_stream());
  EXPECT_NE(rt.copy_stream(), rt.compute_stream());
  {
    CurrentStreamGuard g(rt, rt.copy_stream());
    EXPECT_EQ(rt.current_stream(), rt.copy_stream());
    Tensor t = Tensor::Empty({4}, DType::kF32, Device::CUDA(0));
    EXPECT_EQ(rt.allocator().StreamOf(t.raw_data()), rt.copy_stream());
    Stream other_thread;
    std::thread th([&] { other_thread = rt.current_stream(); });
    th.join();
    EXPECT_EQ(other_thread, rt.compute_stream());
  }
  EXPECT_EQ(rt.current_stream(), rt.compute_stream());
}

TEST_F(CudaRuntimeTest, HostCopiesSynchroniseTheCurrentStream) {
  // A host tensor may be freed the moment CopyFrom returns: nothing may still be queued.
  Tensor dev = Tensor::FromVector(std::vector<float>{1, 2}, {2}, Device::CUDA(0));
  EXPECT_EQ(Fake(0).Pending(RuntimeOf(Device::CUDA(0)).compute_stream()), 0u);
  (void)dev;
}

TEST_F(CudaRuntimeTest, AnUnusableDeviceReportsTheFactorysReasonEveryTime) {
  absl::StatusOr<DeviceRuntime*> rt = GetRuntime(5);
  ASSERT_FALSE(rt.ok());
  EXPECT_EQ(rt.status().message(), "fake: this machine has 2 CUDA devices");
  EXPECT_EQ(GetRuntime(5).status(), rt.status());
  EXPECT_DEATH(Tensor::Empty({1}, DType::kF32, Device::CUDA(5)), "this machine has 2 CUDA devices");
}

}  // namespace
}  // namespace braid::cuda
