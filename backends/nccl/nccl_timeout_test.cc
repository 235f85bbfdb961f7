// Timeouts of the NCCL communicator: an error naming the operation, its sequence number, the
// group and the ranks that did not come (from the store's progress keys), never a hang; and an
// aborted communicator that refuses every later call. In their own process because an abort
// may leave NCCL's kernels finishing on the GPU for a while. Skips without GPUs.
#include <atomic>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "backends/nccl/nccl_communicator.h"
#include "backends/nccl/test_util.h"
#include "core/store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace braid::nccl {
namespace {

using ::testing::HasSubstr;
using testing::MakeNccl;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

Tensor DeviceTensor(int64_t n, int device) {
  testing::UseCudaMallocAllocator();
  Tensor t = Tensor::Empty({n}, DType::kF32, Device::CUDA(device));
  testing::FillBytes(t, 0);
  return t;
}

// Holds the stream until the test releases it: a collective queued behind it cannot finish.
void HoldUntilReleased(void* release) {
  static_cast<absl::Notification*>(release)->WaitForNotification();
}

// One GPU: the caller's stream is held by a host function until the test releases it, so the
// collective that waits for it cannot finish within its 300 ms timeout.
TEST(NcclTimeoutTest, AWaitThatTimesOutSaysWhatAndAbortsTheCommunicator) {
  int gpus = 0;
  BRAID_REQUIRE_GPUS(1, gpus);
  InMemoryStore store;
  auto made = MakeNccl(0, 1, &store, 0, absl::Milliseconds(300), {{"group_name", "tp"}});
  ASSERT_TRUE(made.ok()) << made.status();
  Communicator& comm = **made;
  Tensor x = DeviceTensor(256, 0);
  ASSERT_TRUE(comm.AllReduce(x, ReduceOp::kSum)->Wait().ok());  // #0
  ASSERT_TRUE(comm.Barrier()->Wait().ok());                     // #1

  static absl::Notification release;
  ASSERT_EQ(cudaLaunchHostFunc(cudaStreamLegacy, HoldUntilReleased, &release), cudaSuccess);
  std::shared_ptr<Work> late = comm.AllReduce(x, ReduceOp::kMax);  // #2
  absl::Status st = late->Wait();
  // The stream is still held when Wait returns: the timeout did not wait for the stream (no
  // bound on elapsed time, which a loaded machine could break).
  EXPECT_EQ(cudaStreamQuery(cudaStreamLegacy), cudaErrorNotReady)
      << "the timeout must not wait for the stream";
  release.Notify();
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_THAT(Message(st), HasSubstr("AllReduce(max, f32, 256 elements) #2"));
  EXPECT_THAT(Message(st), HasSubstr("group 'tp' (1 rank)"));
  EXPECT_THAT(Message(st), HasSubstr("timed out after 300ms on rank 0 (cuda:0)"));
  EXPECT_THAT(Message(st), HasSubstr("aborted"));
  // The per-rank log of recent collectives.
  EXPECT_THAT(Message(st), HasSubstr("#0 AllReduce(sum, f32, 256 elements) 1024 B, #1 Barrier()"));

  NcclCommunicator* nccl = NcclCommunicator::From(&comm);
  EXPECT_TRUE(nccl->aborted());
  EXPECT_TRUE(late->IsCompleted());
  EXPECT_EQ(late->Wait(), st) << "Wait again gives the same answer";
  absl::Status after = comm.Barrier()->Wait();
  EXPECT_EQ(after.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Message(after), HasSubstr("the communicator was aborted (timeout of AllReduce"));
  EXPECT_THAT(Message(after), HasSubstr("create a new communicator"));

  EXPECT_EQ(cudaStreamSynchronize(cudaStreamLegacy), cudaSuccess);
  // A new communicator works.
  made->reset();
  auto fresh = MakeNccl(0, 1, &store, 0);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  ASSERT_TRUE((*fresh)->AllReduce(x, ReduceOp::kSum)->Wait().ok());
}

// One GPU: the same hold, but the collective is waited for on the device (WaitOnDevice), so
// nobody waits on the host: the watchdog times it out by itself, aborts the communicator and
// every later call reports why; the compute stream's wait ends with the abort.
TEST(NcclTimeoutTest, TheWatchdogTimesOutACollectiveWaitedForOnTheDevice) {
  int gpus = 0;
  BRAID_REQUIRE_GPUS(1, gpus);
  InMemoryStore store;
  auto made = MakeNccl(0, 1, &store, 0, absl::Milliseconds(300), {{"group_name", "dp"}});
  ASSERT_TRUE(made.ok()) << made.status();
  Communicator& comm = **made;
  Tensor x = DeviceTensor(256, 0);
  ASSERT_TRUE(comm.AllReduce(x, ReduceOp::kSum)->WaitOnDevice().ok());  // #0: ends normally

  static absl::Notification release;
  ASSERT_EQ(cudaLaunchHostFunc(cudaStreamLegacy, HoldUntilReleased, &release), cudaSuccess);
  std::shared_ptr<Work> late = comm.AllReduce(x, ReduceOp::kMax);  // #1
  EXPECT_TRUE(late->WaitOnDevice().ok()) << "the host does not wait";
  NcclCommunicator* nccl = NcclCommunicator::From(&comm);
  // The watchdog's thread aborts it; nothing on this thread waits for the GPU meanwhile. Polled
  // with a bound far past the 300 ms timeout, so a watchdog that never fires fails here, named,
  // instead of hanging until Bazel's limit.
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (!nccl->aborted() && absl::Now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const bool aborted = nccl->aborted();
  release.Notify();  // the stream was held until now: the collective could not have finished
  ASSERT_TRUE(aborted) << "the watchdog did not abort the communicator within 60 s";
  EXPECT_TRUE(late->IsCompleted());
  absl::Status st = late->Wait();
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_THAT(Message(st), HasSubstr("AllReduce(max, f32, 256 elements) #1"));
  EXPECT_THAT(Message(st), HasSubstr("group 'dp' (1 rank)"));
  EXPECT_THAT(Message(st), HasSubstr("timed out after 300ms on rank 0 (cuda:0)"));
  absl::Status after = comm.Barrier()->Wait();
  EXPECT_EQ(after.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Message(after), HasSubstr("the communicator was aborted (timeout of AllReduce"));
  EXPECT_EQ(cudaStreamSynchronize(cudaStreamLegacy), cudaSuccess);
}

// One GPU: a world of two whose rank 1 never comes. Creation is bounded by the timeout and
// names the rank that did not join.
TEST(NcclTimeoutTest, CreationWithoutTheOtherRanksTimesOutNamingThem) {
  int gpus = 0;
  BRAID_REQUIRE_GPUS(1, gpus);
  InMemoryStore store;
  auto comm = MakeNccl(0, 2, &store, 0, absl::Seconds(2));
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded) << comm.status();
  EXPECT_THAT(Message(comm.status()), HasSubstr("rank(s) 1 have not joined"));
  // (Bounded by the 2 s timeout, DeadlineExceeded says; a hang is the test's timeout's to catch.)
}

// One GPU, no GPU work at all: rank 1 waits for rank 0's unique id, which never comes.
TEST(NcclTimeoutTest, AMissingUniqueIdTimesOutNamingTheKey) {
  int gpus = 0;
  BRAID_REQUIRE_GPUS(1, gpus);
  InMemoryStore store;
  auto comm = MakeNccl(1, 2, &store, 0, absl::Milliseconds(200));
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded) << comm.status();
  EXPECT_THAT(Message(comm.status()), HasSubstr("no unique id from rank 0 under store key "
                                                "'nccl/1/unique_id'"));
}

// Two or more GPUs: the last rank skips one allreduce; every other rank's Wait times out naming
// it, from the progress keys.
TEST(NcclTimeoutTest, ACollectiveThatOneRankSkipsNamesThatRank) {
  int gpus = 0;
  BRAID_REQUIRE_GPUS(2, gpus);
  const int n = std::min(gpus, 4);
  const int missing = n - 1;
  InMemoryStore store;
  std::atomic<int> finished{0};
  testing::RunRanks(n, [&](int rank) {
    auto made = MakeNccl(rank, n, &store, rank, absl::Seconds(3));
    ASSERT_TRUE(made.ok()) << made.status();
    Communicator& comm = **made;
    Tensor x = DeviceTensor(1024, rank);
    ASSERT_TRUE(comm.AllReduce(x, ReduceOp::kSum)->Wait().ok());  // #0, everyone
    if (rank != missing) {
      absl::Status st = comm.AllReduce(x, ReduceOp::kSum)->Wait();  // #1, without `missing`
      EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
      EXPECT_THAT(Message(st), HasSubstr("AllReduce(sum, f32, 1024 elements) #1"));
      EXPECT_THAT(Message(st), HasSubstr(absl::StrCat("group 'world' (", n, " ranks)")));
      EXPECT_THAT(Message(st),
                  HasSubstr(absl::StrCat("rank(s) ", missing, " have not started it")));
      EXPECT_THAT(Message(st), HasSubstr("NCCL itself cannot tell which rank is missing"));
      EXPECT_THAT(Message(st),
                  HasSubstr(absl::StrCat("rank ", missing, ": #0 AllReduce(sum, f32, 1024")));
    }
    // The missing rank keeps its communicator until the others have given up.
    ++finished;
    while (finished.load() < n) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  });
}

}  // namespace
}  // namespace braid::nccl
