// The batch prefetcher's ordering on the fake device, whose streams run only when the test says
// so: the copy of batch k+1 overlaps step k yet never writes memory that step k-1's work may
// still use, step k's work never runs before batch k has arrived, and pinned buffers are reused
// only after their copies. "Step k's work" is a device-to-device copy on the compute stream that
// reads the batch, standing in for kernels.
#include "backends/cuda/prefetch.h"

#include <gtest/gtest.h>

#include "backends/cuda/fake_device_api.h"
#include "backends/cuda/install.h"

namespace braid::cuda {
namespace {

class PrefetchTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    InstallCudaBackend([](int index) -> absl::StatusOr<std::unique_ptr<DeviceApi>> {
      FakeDeviceApi::Options o;
      o.device_index = index;
      return std::make_unique<FakeDeviceApi>(o);
    });
  }
  PrefetchTest()
      : rt_(RuntimeOf(Device::CUDA(0))), fake_(static_cast<FakeDeviceApi&>(rt_.api())) {
    fake_.RunAll();
    fake_.ClearLog();
  }

  // Batches k = 0 .. n-1: x = [k, k+0.5] (f32), y = [k] (i32).
  BatchProducer Batches(int n) {
    return [this, n]() -> std::optional<std::vector<Tensor>> {
      if (produced_ == n) return std::nullopt;
      int k = produced_++;
      return std::vector<Tensor>{
          Tensor::FromVector(std::vector<float>{float(k), k + 0.5f}, {2}),
          Tensor::FromVector(std::vector<int32_t>{k}, {1})};
    };
  }
  // Enqueues "step work" reading batch[0] on the compute stream; returns where it lands.
  Tensor StepWork(const std::vector<Tensor>& batch) {
    Tensor out = Tensor::Empty({2}, DType::kF32, Device::CUDA(0));
    EXPECT_TRUE(fake_.MemcpyAsync(out.raw_data(), batch[0].raw_data(), 8,
                                  CopyKind::kDeviceToDevice, rt_.compute_stream())
                    .ok());
    return out;
  }

  DeviceRuntime& rt_;
  FakeDeviceApi& fake_;
  int produced_ = 0;
};

TEST_F(PrefetchTest, StepWorkWaitsForItsBatchAndTheNextCopyOverlapsIt) {
  auto pf = *BatchPrefetcher::Create(&rt_, Batches(3));
  const Stream compute = rt_.compute_stream(), copy = rt_.copy_stream();

  std::vector<Tensor> b0 = **pf->Next();  // batch 0 handed out, batch 1's copy enqueued
  EXPECT_EQ(produced_, 2);
  Tensor out0 = StepWork(b0);
  EXPECT_EQ(fake_.log().size(), 0u);  // nothing has run on the "GPU" yet

  // The compute stream cannot pass batch 0's arrival: its step work is blocked.
  EXPECT_TRUE(fake_.Step(compute));   // "allocated" event of batch 0
  EXPECT_FALSE(fake_.Step(compute));  // waits for batch 0's copies
  // The copy stream copies batch 0 (2 tensors), then stops at batch 1's "allocated" wait:
  // batch 1's memory is not written before the compute stream reaches that point.
  fake_.Drain(copy);  // runs compute as far as the copy stream's waits need
  EXPECT_EQ(fake_.log(), (std::vector<std::string>{"2:H2D:8", "2:H2D:4", "2:H2D:8", "2:H2D:4"}));
  // Batch 1's copies ran while step 0's work was still queued on the compute stream: overlap.
  EXPECT_EQ(fake_.Pending(compute), 1u);
  fake_.Drain(compute);
  EXPECT_EQ(fake_.log().back(), "1:D2D:8");
  EXPECT_EQ(out0.ToFloatVector(), (std::vector<float>{0.0f, 0.5f}));
  EXPECT_EQ(b0[1].ToVector<int32_t>(), std::vector<int32_t>{0});

  std::vector<Tensor> b1 = **pf->Next();
  Tensor out1 = StepWork(b1);
  std::vector<Tensor> b2 = **pf->Next();
  Tensor out2 = StepWork(b2);
  EXPECT_FALSE((*pf->Next()).has_value());  // end of data
  fake_.RunAll();
  EXPECT_EQ(out1.ToFloatVector(), (std::vector<float>{1.0f, 1.5f}));
  EXPECT_EQ(out2.ToFloatVector(), (std::vector<float>{2.0f, 2.5f}));
}

TEST_F(PrefetchTest, TheNextBatchsCopyWaitsForComputeWorkQueuedBeforeIt) {
  auto pf = *BatchPrefetcher::Create(&rt_, Batches(2));
  const Stream compute = rt_.compute_stream(), copy = rt_.copy_stream();
  // Compute work queued before the prefetcher (step k-1) that the copy stream must not overtake.
  Tensor earlier = Tensor::FromVector(std::vector<float>{5, 6}, {2}, Device::CUDA(0));
  Tensor sink = Tensor::Empty({2}, DType::kF32, Device::CUDA(0));
  ASSERT_TRUE(fake_.MemcpyAsync(sink.raw_data(), earlier.raw_data(), 8,
                                CopyKind::kDeviceToDevice, compute)
                  .ok());
  fake_.ClearLog();
  (void)*pf->Next();
  EXPECT_FALSE(fake_.Step(copy));  // batch 0's copy waits for the compute stream
  ASSERT_TRUE(fake_.Step(compute));  // the earlier work
  ASSERT_TRUE(fake_.Step(compute));  // batch 0's "allocated" event
  EXPECT_TRUE(fake_.Step(copy));     // now the wait passes
  fake_.RunAll();
  EXPECT_EQ(fake_.log().front(), "1:D2D:8");
}

TEST_F(PrefetchTest, PinnedBuffersAreReusedOnlyAfterTheirCopies) {
  PinnedHostPool& pool = rt_.pinned();
  ASSERT_TRUE(pool.EmptyCache().ok());
  const int64_t allocs0 = pool.host_allocs();
  auto pf = *BatchPrefetcher::Create(&rt_, Batches(6));
  // Batches 0 and 1 are staged before anything runs: 4 buffers, none reusable yet.
  std::vector<Tensor> b = **pf->Next();
  EXPECT_EQ(pool.host_allocs() - allocs0, 4);
  for (int k = 1; k < 6; ++k) {
    fake_.RunAll();  // the copies are done: their buffers may be reused
    b = **pf->Next();
    EXPECT_EQ(pool.host_allocs() - allocs0, 4) << "batch " << k;
  }
}

TEST_F(PrefetchTest, APinnedBufferWaitsForTheStreamThatCopiesFromIt) {
  PinnedHostPool& pool = rt_.pinned();
  ASSERT_TRUE(pool.EmptyCache().ok());  // forget earlier tests' buffers
  const Stream copy = rt_.copy_stream();
  Tensor dev = Tensor::Empty({1024}, DType::kF32, Device::CUDA(0));
  void* p = *pool.Allocate(4096);
  ASSERT_TRUE(fake_.MemcpyAsync(dev.raw_data(), p, 4096, CopyKind::kHostToDevice, copy).ok());
  ASSERT_TRUE(pool.Free(p, copy).ok());
  void* q = *pool.Allocate(4096);
  EXPECT_NE(q, p);  // the copy from p has not run
  ASSERT_TRUE(pool.Free(q, copy).ok());
  fake_.Drain(copy);
  void* r = *pool.Allocate(4096);
  EXPECT_TRUE(r == p || r == q);  // both copies done: either is reusable
  const int64_t allocs = pool.host_allocs();
  void* s = *pool.Allocate(3000);  // same size class (4096), the other buffer
  EXPECT_TRUE(s == p || s == q);
  EXPECT_NE(s, r);
  EXPECT_EQ(pool.host_allocs(), allocs);
  EXPECT_TRUE(fake_.IsPinned(r));
  ASSERT_TRUE(pool.Free(r, copy).ok());
  ASSERT_TRUE(pool.Free(s, copy).ok());
}

TEST_F(PrefetchTest, RefusesDeviceTensorsFromTheProducer) {
  auto pf = *BatchPrefetcher::Create(&rt_, []() -> std::optional<std::vector<Tensor>> {
    return std::vector<Tensor>{Tensor::Empty({1}, DType::kF32, Device::CUDA(0))};
  });
  absl::StatusOr<std::optional<std::vector<Tensor>>> r = pf->Next();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("must return host (cpu) tensors"), std::string::npos);
}

}  // namespace
}  // namespace braid::cuda
