// The fake device keeps CUDA's ordering rules; the host-side tests rely on it doing so.
#include "backends/cuda/fake_device_api.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace braid::cuda {
namespace {

TEST(FakeDeviceApi, StreamsRunInOrderAndOnlyWhenTold) {
  FakeDeviceApi fake;
  Stream s = *fake.CreateStream(StreamKind::kBlocking);
  void* dev = *fake.Malloc(16);
  int host_in[4] = {1, 2, 3, 4}, host_out[4] = {};
  ASSERT_TRUE(fake.MemcpyAsync(dev, host_in, 16, CopyKind::kHostToDevice, s).ok());
  ASSERT_TRUE(fake.MemcpyAsync(host_out, dev, 16, CopyKind::kDeviceToHost, s).ok());
  EXPECT_EQ(fake.Pending(s), 2u);
  EXPECT_EQ(host_out[3], 0);  // nothing ran yet
  ASSERT_TRUE(fake.SynchronizeStream(s).ok());
  EXPECT_EQ(std::memcmp(host_in, host_out, 16), 0);
  EXPECT_EQ(fake.log(), (std::vector<std::string>{"1:H2D:16", "1:D2H:16"}));
  ASSERT_TRUE(fake.Free(dev).ok());
}

// What a training step's synchronisation count rests on: every call that blocks the host is
// recorded, and nothing asynchronous is.
TEST(FakeDeviceApi, RecordsEveryHostSynchronisationAndNothingElse) {
  FakeDeviceApi fake;
  Stream s = *fake.CreateStream(StreamKind::kBlocking);
  Event e = *fake.CreateEvent();
  void* a = *fake.Malloc(8);
  void* b = *fake.Malloc(8);
  void* pinned = *fake.HostAllocPinned(8);
  const float in[2] = {1.5f, -2.0f};
  ASSERT_TRUE(fake.MemcpyAsync(a, in, 8, CopyKind::kHostToDevice, s).ok());
  ASSERT_TRUE(fake.ConvertAsync(b, FloatFormat::kBF16, a, FloatFormat::kF32, 2, s).ok());
  ASSERT_TRUE(fake.RecordEvent(e, s).ok());
  ASSERT_TRUE(fake.StreamWaitEvent(s, e).ok());
  ASSERT_TRUE(fake.QueryEvent(e).ok());
  EXPECT_EQ(fake.syncs(), std::vector<std::string>{});
  ASSERT_TRUE(fake.SynchronizeStream(s).ok());
  ASSERT_TRUE(fake.SynchronizeEvent(e).ok());
  ASSERT_TRUE(fake.SynchronizeDevice().ok());
  ASSERT_TRUE(fake.Free(a).ok());
  ASSERT_TRUE(fake.HostFreePinned(pinned).ok());
  EXPECT_EQ(fake.syncs(), (std::vector<std::string>{"stream:1", "event", "device", "free",
                                                     "free_pinned"}));
  // The conversion ran with the kernels' rounding: 1.5 and -2 are exact in bf16.
  uint16_t out[2];
  std::memcpy(out, b, 4);
  EXPECT_EQ(out[0], 0x3fc0u);
  EXPECT_EQ(out[1], 0xc000u);
  EXPECT_EQ(fake.log(), (std::vector<std::string>{"1:H2D:8", "1:convert:f32->bf16:2"}));
  fake.ClearSyncs();
  EXPECT_TRUE(fake.syncs().empty());
  // A conversion whose pointers are not device memory is refused, as a bad copy is.
  EXPECT_FALSE(fake.ConvertAsync(out, FloatFormat::kBF16, in, FloatFormat::kF32, 2, s).ok());
  ASSERT_TRUE(fake.Free(b).ok());
}

TEST(FakeDeviceApi, EventsCompleteWhenTheirStreamPassesThem) {
  FakeDeviceApi fake;
  Stream s = *fake.CreateStream(StreamKind::kBlocking);
  Event e = *fake.CreateEvent();
  EXPECT_TRUE(*fake.QueryEvent(e));  // never recorded: complete, as in CUDA
  void* dev = *fake.Malloc(4);
  int x = 7;
  ASSERT_TRUE(fake.MemcpyAsync(dev, &x, 4, CopyKind::kHostToDevice, s).ok());
  ASSERT_TRUE(fake.RecordEvent(e, s).ok());
  EXPECT_FALSE(*fake.QueryEvent(e));
  ASSERT_TRUE(fake.Step(s));
  EXPECT_FALSE(*fake.QueryEvent(e));
  ASSERT_TRUE(fake.Step(s));
  EXPECT_TRUE(*fake.QueryEvent(e));
  EXPECT_FALSE(fake.Step(s));  // empty
}

TEST(FakeDeviceApi, AWaitBlocksUntilTheRecordCurrentAtTheCall) {
  FakeDeviceApi fake;
  Stream a = *fake.CreateStream(StreamKind::kBlocking);
  Stream b = *fake.CreateStream(StreamKind::kNonBlocking);
  Event e = *fake.CreateEvent();
  void* dev = *fake.Malloc(8);
  int x[2] = {1, 2}, y[2] = {};
  ASSERT_TRUE(fake.MemcpyAsync(dev, x, 8, CopyKind::kHostToDevice, a).ok());
  ASSERT_TRUE(fake.RecordEvent(e, a).ok());
  ASSERT_TRUE(fake.StreamWaitEvent(b, e).ok());
  ASSERT_TRUE(fake.MemcpyAsync(y, dev, 8, CopyKind::kDeviceToHost, b).ok());
  // Recording e again later must not change what b waits for.
  ASSERT_TRUE(fake.MemcpyAsync(dev, x, 8, CopyKind::kHostToDevice, a).ok());
  ASSERT_TRUE(fake.RecordEvent(e, a).ok());
  EXPECT_FALSE(fake.Step(b));  // blocked on a's first record
  ASSERT_TRUE(fake.Step(a));
  ASSERT_TRUE(fake.Step(a));
  EXPECT_TRUE(fake.Step(b));   // the wait passes: the first record is done
  EXPECT_TRUE(fake.Step(b));   // the copy
  EXPECT_EQ(y[1], 2);
  EXPECT_EQ(fake.Pending(a), 2u);  // a's second copy and record are still pending
  fake.RunAll();
  EXPECT_EQ(fake.log(), (std::vector<std::string>{"1:H2D:8", "2:D2H:8", "1:H2D:8"}));
}

TEST(FakeDeviceApi, DrainRunsOtherStreamsAsFarAsAWaitNeeds) {
  FakeDeviceApi fake;
  Stream a = *fake.CreateStream(StreamKind::kBlocking);
  Stream b = *fake.CreateStream(StreamKind::kNonBlocking);
  Event e = *fake.CreateEvent();
  ASSERT_TRUE(fake.RecordEvent(e, a).ok());
  ASSERT_TRUE(fake.StreamWaitEvent(b, e).ok());
  fake.Drain(b);
  EXPECT_EQ(fake.Pending(b), 0u);
  EXPECT_EQ(fake.Pending(a), 0u);
}

TEST(FakeDeviceApi, RefusesCopiesWhosePointersDoNotMatchTheirKind) {
  FakeDeviceApi fake;
  Stream s = *fake.CreateStream(StreamKind::kBlocking);
  void* dev = *fake.Malloc(8);
  int host[2] = {};
  EXPECT_FALSE(fake.MemcpyAsync(host, dev, 8, CopyKind::kHostToDevice, s).ok());
  EXPECT_FALSE(fake.MemcpyAsync(dev, host, 16, CopyKind::kHostToDevice, s).ok());  // too long
  EXPECT_FALSE(fake.Free(host).ok());
  EXPECT_TRUE(fake.Free(dev).ok());
  EXPECT_FALSE(fake.Free(dev).ok());  // twice
}

TEST(FakeDeviceApi, MallocBeyondCapacityIsResourceExhausted) {
  FakeDeviceApi fake(FakeDeviceApi::Options{0, 1000, false});
  EXPECT_TRUE(fake.Malloc(600).ok());
  absl::StatusOr<void*> no = fake.Malloc(600);
  EXPECT_EQ(no.status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(FakeDeviceApi, EagerModeRunsEverythingAtOnce) {
  FakeDeviceApi fake(FakeDeviceApi::Options{0, 1 << 20, true});
  Stream s = *fake.CreateStream(StreamKind::kBlocking);
  void* dev = *fake.Malloc(4);
  int x = 5, y = 0;
  ASSERT_TRUE(fake.MemcpyAsync(dev, &x, 4, CopyKind::kHostToDevice, s).ok());
  ASSERT_TRUE(fake.MemcpyAsync(&y, dev, 4, CopyKind::kDeviceToHost, s).ok());
  EXPECT_EQ(y, 5);
  EXPECT_EQ(fake.Pending(s), 0u);
}

}  // namespace
}  // namespace braid::cuda
