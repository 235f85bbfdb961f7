// core's CopyAsync on the fake CUDA device (held, not eager, so the test sees what is queued):
// a copy-stream copy waits for the compute stream's position at the call, runs only when the
// device gets to it, and the compute stream, not the host, waits for it; a compute-stream copy
// is in stream order. The host never synchronises.
#include "backends/cuda/async_copy.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/cuda/fake_device_api.h"
#include "backends/cuda/install.h"
#include "backends/cuda/runtime.h"
#include "core/pinned_host.h"

namespace braid::cuda {
namespace {

class AsyncCopyTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    InstallCudaBackend([](int index) -> absl::StatusOr<std::unique_ptr<DeviceApi>> {
      FakeDeviceApi::Options o;
      o.device_index = index;
      return std::make_unique<FakeDeviceApi>(o);
    });
  }
  static DeviceRuntime& Rt() { return RuntimeOf(Device::CUDA(0)); }
  static FakeDeviceApi& Fake() { return static_cast<FakeDeviceApi&>(Rt().api()); }
  static std::string Id(Stream s) { return absl::StrCat(Fake().StreamId(s)); }
};

TEST_F(AsyncCopyTest, ACopyStreamCopyIsOrderedByEventsNotByTheHost) {
  Tensor host = Tensor::FromVector(std::vector<float>{1, 2, 3, 4}, {4}, OffloadHost(Device::CUDA(0), true));
  EXPECT_TRUE(Fake().IsPinned(host.raw_data()));
  Tensor dev = Tensor::FromVector(std::vector<float>(4), {4}, Device::CUDA(0));
  Fake().RunAll();
  Fake().ClearSyncs();
  Fake().ClearIssued();
  const std::string compute = Id(Rt().compute_stream()), copy = Id(Rt().copy_stream());

  std::unique_ptr<InFlightCopy> c = CopyAsync(host, dev, CopyQueue::kCopy);
  EXPECT_FALSE(c->Done());  // the held device has run nothing
  EXPECT_EQ(Fake().Pending(Rt().copy_stream()), 3u);  // wait, copy, record
  c->OrderBeforeCurrentStream();
  c->OrderBeforeCurrentStream();  // once is enough: no second wait
  std::vector<std::string> issued = Fake().issued();
  ASSERT_EQ(issued.size(), 5u) << ::testing::PrintToString(issued);
  // The copy stream waits for the compute stream's position at the call (e1), copies, records
  // e2; the compute stream waits for e2.
  EXPECT_EQ(issued[0], compute + ":record:" + issued[0].substr(issued[0].rfind(':') + 1));
  const std::string ready = issued[0].substr(issued[0].rfind(':') + 1);
  EXPECT_EQ(issued[1], copy + ":wait:" + ready);
  EXPECT_EQ(issued[2], copy + ":H2D:16");
  const std::string done = issued[3].substr(issued[3].rfind(':') + 1);
  EXPECT_EQ(issued[3], copy + ":record:" + done);
  EXPECT_EQ(issued[4], compute + ":wait:" + done);
  EXPECT_NE(ready, done);

  // Running the compute stream runs the copy it waits for: the values are there, and nobody
  // blocked the host.
  Fake().Drain(Rt().compute_stream());
  EXPECT_TRUE(c->Done());
  EXPECT_TRUE(Fake().syncs().empty()) << ::testing::PrintToString(Fake().syncs());
  EXPECT_EQ(dev.ToFloatVector(), (std::vector<float>{1, 2, 3, 4}));
}

TEST_F(AsyncCopyTest, AComputeStreamCopyIsInStreamOrder) {
  Tensor dev = Tensor::FromVector(std::vector<float>{5, 6}, {2}, Device::CUDA(0));
  Tensor host = Tensor::Zeros({2}, DType::kF32, Device::Host());
  Fake().ClearSyncs();
  Fake().ClearIssued();
  std::unique_ptr<InFlightCopy> c = CopyAsync(dev, host, CopyQueue::kCompute);
  c->OrderBeforeCurrentStream();  // on the current stream already: no wait
  const std::string compute = Id(Rt().compute_stream());
  std::vector<std::string> issued = Fake().issued();
  ASSERT_EQ(issued.size(), 2u) << ::testing::PrintToString(issued);
  EXPECT_EQ(issued[0], compute + ":D2H:8");
  EXPECT_EQ(issued[1].rfind(compute + ":record:", 0), 0u) << issued[1];
  EXPECT_FALSE(c->Done());
  EXPECT_EQ(host.ToFloatVector(), (std::vector<float>{0, 0}));  // not copied yet
  Fake().Drain(Rt().compute_stream());
  EXPECT_TRUE(c->Done());
  EXPECT_EQ(host.ToFloatVector(), (std::vector<float>{5, 6}));
  EXPECT_TRUE(Fake().syncs().empty());
  // Wait is the host's explicit wait, the one kind a test would count.
  std::unique_ptr<InFlightCopy> again = CopyAsync(dev, host, CopyQueue::kCopy);
  again->Wait();
  EXPECT_TRUE(again->Done());
  EXPECT_EQ(Fake().syncs(), (std::vector<std::string>{"event"}));
}

// Once the device has passed them: a copy per step does not grow the device's events.
TEST_F(AsyncCopyTest, EventsAreReusedAcrossCopies) {
  Tensor host = Tensor::Zeros({8}, DType::kF32, Device::Host());
  Tensor dev = Tensor::FromVector(std::vector<float>(8), {8}, Device::CUDA(0));
  Fake().RunAll();
  for (int i = 0; i < 3; ++i) (void)CopyAsync(host, dev, CopyQueue::kCopy);
  Fake().RunAll();
  const int64_t events = Fake().live_events();
  for (int i = 0; i < 20; ++i) {
    (void)CopyAsync(host, dev, CopyQueue::kCopy);
    Fake().RunAll();
  }
  EXPECT_EQ(Fake().live_events(), events);
}

TEST_F(AsyncCopyTest, HostToHostIsDoneAtOnceAndMismatchesFailFast) {
  Tensor a = Tensor::FromVector(std::vector<float>{7, 8}, {2});
  Tensor b = Tensor::Zeros({2}, DType::kF32);
  EXPECT_TRUE(CopyAsync(a, b, CopyQueue::kCopy)->Done());
  EXPECT_EQ(b.ToFloatVector(), (std::vector<float>{7, 8}));
  Tensor dev = Tensor::FromVector(std::vector<float>(3), {3}, Device::CUDA(0));
  EXPECT_DEATH(CopyAsync(a, dev, CopyQueue::kCopy), "element counts and dtypes must be equal");
  Tensor dev2 = Tensor::FromVector(std::vector<float>(2), {2}, Device::CUDA(0));
  Tensor dev3 = Tensor::FromVector(std::vector<float>(2), {2}, Device::CUDA(0));
  EXPECT_DEATH(CopyAsync(dev2, dev3, CopyQueue::kCopy), "one side must be host memory");
}

}  // namespace
}  // namespace braid::cuda
