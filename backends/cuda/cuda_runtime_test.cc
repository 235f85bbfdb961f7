// The runtime over the CUDA runtime (the same host-side logic the fake-device tests check):
// tensors to and from a GPU, the caching allocator's reuse, the batch prefetcher; and, on a
// machine without a GPU, the error the program gets. Under Bazel the GPU cases run in
// cuda_runtime_test_gpu and the no-GPU case in cuda_runtime_test_no_gpu, each skipped where the
// machine cannot run it and failing there when what it promises is missing (gpu_test_env.h);
// the binary run by hand skips, with the reason, whichever cannot run.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "backends/cuda/device.h"
#include "backends/cuda/gpu_test_env.h"
#include "backends/cuda/prefetch.h"
#include "backends/cuda/runtime.h"
#include "core/allocator.h"
#include "core/tensor.h"

namespace braid::cuda {
namespace {

TEST(CudaRuntimeNoGpuTest, AnUnusableDeviceFailsWithCudasReason) {
  absl::StatusOr<int> count = CudaDeviceCount();
  if (count.ok()) {
    if (gpu_test::MustFailWithAGpu()) FAIL() << "this machine has a GPU";
    GTEST_SKIP() << "this machine has a GPU; the no-GPU path is not taken";
  }
  absl::StatusOr<DeviceRuntime*> rt = GetRuntime(0);
  ASSERT_FALSE(rt.ok());
  EXPECT_EQ(rt.status(), count.status());
  EXPECT_DEATH(Tensor::Empty({1}, DType::kF32, Device::CUDA(0)), "cudaGetDeviceCount failed");
}

class CudaRuntimeGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<int> count = CudaDeviceCount();
    if (!count.ok()) {
      if (gpu_test::MustFailWithGpus(1, 0)) FAIL() << count.status();
      GTEST_SKIP() << "No usable CUDA device: " << count.status();
    }
    rt_ = &RuntimeOf(Device::CUDA(0));
  }
  DeviceRuntime* rt_ = nullptr;
};

TEST_F(CudaRuntimeGpuTest, TensorsRoundTripThroughTheGpu) {
  std::vector<float> values(1000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = float(i) * 0.25f - 7.0f;
  const int64_t before = GetMemoryStats(Device::CUDA(0)).current_bytes;
  Tensor dev = Tensor::FromVector(values, {1000}, Device::CUDA(0));
  EXPECT_EQ(GetMemoryStats(Device::CUDA(0)).current_bytes, before + 4000);
  EXPECT_EQ(dev.ToFloatVector(), values);  // exact: bytes copied, no arithmetic
  Tensor bf = Tensor::Empty({1000}, DType::kBF16, Device::CUDA(0));
  bf.CopyFrom(dev);  // on the device, converting
  // These values have at most 8 significant bits (multiples of 0.25 below 256): exact in bf16.
  EXPECT_EQ(bf.ToFloatVector(), values);
}

// The conversion kernel (DeviceApi::ConvertAsync) between every pair of floating dtypes,
// device to device, against the CPU's conversion of the same values: bit for bit, for every
// bf16 and f16 pattern as a source and 65536 f32 patterns over every exponent.
TEST_F(CudaRuntimeGpuTest, DeviceToDeviceConversionIsBitIdenticalToTheCpus) {
  constexpr int64_t n = 65536;
  for (DType from : {DType::kF32, DType::kBF16, DType::kF16}) {
    Tensor host = Tensor::Empty({n}, from);
    for (int64_t i = 0; i < n; ++i) {
      if (from == DType::kF32) {
        static_cast<uint32_t*>(host.raw_data())[i] = uint32_t(uint64_t(i) * 65537u);
      } else {
        static_cast<uint16_t*>(host.raw_data())[i] = uint16_t(i);
      }
    }
    Tensor dev = host.To(Device::CUDA(0));  // same dtype: bytes
    for (DType to : {DType::kF32, DType::kBF16, DType::kF16}) {
      Tensor converted = Tensor::Empty({n}, to, Device::CUDA(0));
      converted.CopyFrom(dev);  // the conversion kernel
      Tensor got = converted.To(Device::CPU());  // same dtype: bytes
      Tensor want = host.To(to);
      ASSERT_EQ(std::memcmp(got.raw_data(), want.raw_data(), want.nbytes()), 0)
          << DTypeName(from) << " -> " << DTypeName(to);
    }
  }
}

TEST_F(CudaRuntimeGpuTest, TheAllocatorReusesBlocksOnTheirStream) {
  CachingAllocator& a = rt_->allocator();
  absl::StatusOr<void*> p = a.TryAllocate(1 << 16, rt_->compute_stream());
  ASSERT_TRUE(p.ok()) << p.status();
  a.Free(*p);
  absl::StatusOr<void*> q = a.TryAllocate(1 << 16, rt_->compute_stream());
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(*q, *p);
  a.Free(*q);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  a.EmptyCache();
}

TEST_F(CudaRuntimeGpuTest, ThePrefetcherDeliversEveryBatchInOrder) {
  int k = 0;
  auto pf = BatchPrefetcher::Create(rt_, [&k]() -> std::optional<std::vector<Tensor>> {
    if (k == 4) return std::nullopt;
    std::vector<float> x(4096, float(k++));
    return std::vector<Tensor>{Tensor::FromVector(x, {4096})};
  });
  ASSERT_TRUE(pf.ok()) << pf.status();
  for (int step = 0; step < 4; ++step) {
    absl::StatusOr<std::optional<std::vector<Tensor>>> batch = (*pf)->Next();
    ASSERT_TRUE(batch.ok() && batch->has_value()) << batch.status();
    std::vector<float> got = (**batch)[0].ToFloatVector();  // on the compute stream: ordered
    EXPECT_EQ(got.front(), float(step));
    EXPECT_EQ(got.back(), float(step));
  }
  EXPECT_FALSE((*pf)->Next()->has_value());
}

}  // namespace
}  // namespace braid::cuda
