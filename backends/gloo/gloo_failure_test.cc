// Failures of the Gloo communicator end in bounded time with errors that say what happened: the
// operation, its sequence number, the group and which ranks did not arrive, plus this rank's
// recent operations. Ranks that hang, die, never start or disagree are all simulated here.
#include <signal.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "backends/gloo/test_util.h"
#include "core/communicator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace braid::gloo_test {
namespace {

using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

bool IsTimeoutOrIoError(const absl::Status& s) {
  return s.code() == absl::StatusCode::kDeadlineExceeded ||
         s.code() == absl::StatusCode::kUnavailable;
}

// Rank 2 stops calling collectives (alive, but busy elsewhere): ranks 0 and 1 time out in
// their third all-reduce, and the error names rank 2 as the one that did not arrive.
TEST(GlooFailureTest, TimeoutNamesTheRankThatDidNotArrive) {
  FileStore store(FreshDir());
  RunRanks(3, [&](int rank) {
    auto comm = MakeGloo(rank, 3, &store, absl::Seconds(2));
    ASSERT_TRUE(comm.ok()) << comm.status();
    Communicator& c = **comm;
    for (int i = 0; i < 2; ++i) {
      Tensor x = Input(DType::kF32, rank, 64, i);
      ASSERT_TRUE(c.AllReduce(x, ReduceOp::kSum)->Wait().ok());
    }
    Tensor x = Input(DType::kF32, rank, 64, 2);
    if (rank == 2) {
      absl::SleepFor(absl::Seconds(7));
      // By now the others have given up and closed their connections.
      EXPECT_FALSE(c.AllReduce(x, ReduceOp::kSum)->Wait().ok());
      return;
    }
    absl::Time t0 = absl::Now();
    absl::Status st = c.AllReduce(x, ReduceOp::kSum)->Wait();
    absl::Duration took = absl::Now() - t0;
    std::printf("rank %d's error, for the log: %s\n", rank, st.ToString().c_str());
    ASSERT_FALSE(st.ok());
    EXPECT_TRUE(IsTimeoutOrIoError(st)) << st;
    EXPECT_GE(took, absl::Milliseconds(1900));
    EXPECT_LE(took, absl::Seconds(6)) << "the timeout is 2s, the diagnosis takes about 1.3s";
    EXPECT_THAT(Message(st),
                AllOf(HasSubstr("AllReduce(sum, f32, 64 elements)"), HasSubstr("#2"),
                      HasSubstr("group 'world' (3 ranks)"), HasSubstr("rank(s) 2 did not arrive"),
                      HasSubstr("being at #1 AllReduce(sum, f32, 64 elements)"),
                      HasSubstr("Recent operations on this rank"),
                      HasSubstr("#1 AllReduce(sum, f32, 64 elements) 256 B: ok")))
        << st;
    // Gloo closed this rank's connections: later calls fail at once, naming the first failure.
    absl::Time t1 = absl::Now();
    absl::Status later = c.Barrier()->Wait();
    EXPECT_LT(absl::Now() - t1, absl::Seconds(1));
    EXPECT_EQ(later.code(), absl::StatusCode::kFailedPrecondition) << later;
    EXPECT_THAT(Message(later), AllOf(HasSubstr("unusable"), HasSubstr("#2 AllReduce")));
  });
}

// Rank 2 is killed between two collectives: the survivors learn it from their connections (no
// need to wait for the timeout) and the error names rank 2.
TEST(GlooFailureTest, KilledRankIsNamedWithoutWaitingForTheTimeout) {
  FileStore store(FreshDir());
  std::vector<ChildExit> exits = ForkRanks(3, [&](int rank) {
    auto comm = MakeGloo(rank, 3, &store, absl::Seconds(20));
    ASSERT_TRUE(comm.ok()) << comm.status();
    Communicator& c = **comm;
    Tensor x = Input(DType::kF32, rank, 4096, 1);
    ASSERT_TRUE(c.AllReduce(x, ReduceOp::kSum)->Wait().ok());
    if (rank == 2) ::raise(SIGKILL);
    absl::SleepFor(absl::Milliseconds(300));
    // The first call finds rank 2 gone; the second finds this communicator broken.
    for (int64_t count : {int64_t(4096), int64_t(3 << 20)}) {
      Tensor y = Input(DType::kF32, rank, count, 2);
      absl::Time t0 = absl::Now();
      absl::Status st = c.AllReduce(y, ReduceOp::kSum)->Wait();
      std::printf("rank %d's error, for the log: %s\n", rank, st.ToString().c_str());
      ASSERT_FALSE(st.ok());
      EXPECT_LT(absl::Now() - t0, absl::Seconds(10));
      if (count == 4096) {
        EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
        EXPECT_THAT(Message(st), AllOf(HasSubstr("#1 AllReduce(sum, f32, 4096 elements)"),
                                       HasSubstr("rank(s) 2 did not arrive")))
            << st;
      } else {
        EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
      }
    }
  });
  ASSERT_EQ(exits.size(), 3u);
  for (int r = 0; r < 2; ++r)
    EXPECT_TRUE(exits[r].exited && exits[r].code == 0) << exits[r].Describe();
  EXPECT_TRUE(exits[2].reaped && !exits[2].exited && exits[2].signal == SIGKILL)
      << exits[2].Describe();
}

// A rank that destroys its communicator is reported as such.
TEST(GlooFailureTest, RankThatLeftIsNamed) {
  FileStore store(FreshDir());
  RunRanks(2, [&](int rank) {
    auto comm = MakeGloo(rank, 2, &store, absl::Seconds(20));
    ASSERT_TRUE(comm.ok()) << comm.status();
    Tensor x = Input(DType::kI32, rank, 16, 1);
    ASSERT_TRUE((*comm)->AllReduce(x, ReduceOp::kMax)->Wait().ok());
    if (rank == 1) {
      comm->reset();
      absl::SleepFor(absl::Seconds(4));  // still alive, but gone from the group
      return;
    }
    absl::SleepFor(absl::Milliseconds(300));
    absl::Status st = (*comm)->AllReduce(x, ReduceOp::kMax)->Wait();
    ASSERT_FALSE(st.ok());
    EXPECT_THAT(Message(st), AllOf(HasSubstr("rank(s) 1 did not arrive"),
                                   HasSubstr("it destroyed its communicator after #0")))
        << st;
  });
}

// In a sub-group, the missing member is named by its sub-group rank and its world rank.
TEST(GlooFailureTest, SubGroupTimeoutNamesWorldRanks) {
  FileStore store(FreshDir());
  RunRanks(3, [&](int rank) {
    auto comm = MakeGloo(rank, 3, &store, absl::Seconds(2));
    ASSERT_TRUE(comm.ok()) << comm.status();
    auto sub = (*comm)->NewGroup({1, 2});
    ASSERT_TRUE(sub.ok()) << sub.status();
    if (rank != 1) {
      if (rank == 2) absl::SleepFor(absl::Seconds(5));  // member 1 of the sub-group stays away
      return;
    }
    Tensor x = Input(DType::kF32, rank, 8, 1);
    absl::Status st = (*sub)->AllReduce(x, ReduceOp::kSum)->Wait();
    ASSERT_FALSE(st.ok());
    EXPECT_THAT(Message(st), AllOf(HasSubstr("#0 AllReduce(sum, f32, 8 elements)"),
                                   HasSubstr("group 'world/g0' (2 ranks: world ranks 1,2)"),
                                   HasSubstr("failed on rank 0 (world rank 1)"),
                                   HasSubstr("rank(s) 1 did not arrive (world rank(s) 2)")))
        << st;
  });
}

// Rank 2 never starts: the others' communicators fail to form, naming it, within the timeout.
TEST(GlooFailureTest, RankThatNeverJoinsIsNamed) {
  FileStore store(FreshDir());
  RunRanks(3, [&](int rank) {
    if (rank == 2) return;
    absl::Time t0 = absl::Now();
    auto comm = MakeGloo(rank, 3, &store, absl::Seconds(2));
    ASSERT_FALSE(comm.ok());
    EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
    EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded) << comm.status();
    EXPECT_THAT(Message(comm.status()),
                AllOf(HasSubstr("rank(s) 2 did not join within 2s"), HasSubstr("joined: 0,1")))
        << comm.status();
  });
}

TEST(GlooFailureTest, WorldSizeDisagreementIsNamed) {
  FileStore store(FreshDir());
  RunRanks(2, [&](int rank) {
    auto comm = MakeGloo(rank, rank == 0 ? 2 : 3, &store, absl::Seconds(2));
    ASSERT_FALSE(comm.ok());
    EXPECT_EQ(comm.status().code(), absl::StatusCode::kInvalidArgument) << comm.status();
    EXPECT_THAT(Message(comm.status()), AllOf(HasSubstr("size=2"), HasSubstr("size=3")));
  });
}

// Invalid arguments fail the call on that rank and break the group: the peer, left waiting in
// that collective, times out and is told why.
TEST(GlooFailureTest, InvalidArgumentsAreReportedToTheWaitingPeers) {
  FileStore store(FreshDir());
  RunRanks(2, [&](int rank) {
    auto comm = MakeGloo(rank, 2, &store, absl::Seconds(2));
    ASSERT_TRUE(comm.ok()) << comm.status();
    Communicator& c = **comm;
    Tensor in = Input(DType::kF32, rank, 10, 1);
    Tensor out = Tensor::Zeros({5}, DType::kF32);
    std::vector<int64_t> counts =
        rank == 0 ? std::vector<int64_t>{5, 6} : std::vector<int64_t>{5, 5};
    absl::Status st = c.ReduceScatter(in, out, ReduceOp::kSum, counts)->Wait();
    ASSERT_FALSE(st.ok());
    if (rank == 0) {
      EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
      EXPECT_THAT(Message(st), HasSubstr("counts [5,6]"));
      absl::Status later = c.Barrier()->Wait();
      EXPECT_EQ(later.code(), absl::StatusCode::kFailedPrecondition) << later;
      absl::SleepFor(absl::Seconds(4));  // stay for rank 1's diagnosis
      return;
    }
    EXPECT_TRUE(IsTimeoutOrIoError(st)) << st;
    EXPECT_THAT(Message(st),
                AllOf(HasSubstr("#0 ReduceScatter(sum, f32, 10 elements in blocks 5,5)"),
                      HasSubstr("rank(s) 0 did not arrive"), HasSubstr("invalid arguments")))
        << st;
  });
}

// Ranks that issue different collectives at the same point are told which ones.
TEST(GlooFailureTest, MismatchedCollectivesAreNamed) {
  FileStore store(FreshDir());
  RunRanks(2, [&](int rank) {
    auto comm = MakeGloo(rank, 2, &store, absl::Seconds(2));
    ASSERT_TRUE(comm.ok()) << comm.status();
    Tensor x = Input(DType::kF32, rank, 64, 1);
    absl::Status st = rank == 0 ? (*comm)->AllReduce(x, ReduceOp::kSum)->Wait()
                                : (*comm)->Broadcast(x, 0)->Wait();
    ASSERT_FALSE(st.ok());
    EXPECT_THAT(Message(st), AnyOf(HasSubstr("rank 1 is at #0 Broadcast(root 0, f32, 64 elements)"),
                                   HasSubstr("rank 0 is at #0 AllReduce(sum, f32, 64 elements)")))
        << st;
  });
}

// A Recv whose sender never sends times out naming the peer and the tag.
TEST(GlooFailureTest, RecvWithoutASenderTimesOut) {
  FileStore store(FreshDir());
  RunRanks(2, [&](int rank) {
    auto comm = MakeGloo(rank, 2, &store, absl::Seconds(2));
    ASSERT_TRUE(comm.ok()) << comm.status();
    if (rank == 1) {
      absl::SleepFor(absl::Seconds(3));
      return;
    }
    Tensor x = Tensor::Zeros({8}, DType::kF32);
    absl::Time t0 = absl::Now();
    absl::Status st = (*comm)->Recv(x, 1, 3)->Wait();
    std::printf("rank %d's error, for the log: %s\n", rank, st.ToString().c_str());
    EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
    EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
    EXPECT_THAT(Message(st), AllOf(HasSubstr("Recv #0 from rank 1 (tag 3"),
                                   HasSubstr("has not posted the matching operation")))
        << st;
  });
}

// Between ranks of one host, Send and Recv go through shared memory, where no connection breaks
// when a peer goes: the waits look at the peer's process and at its end of the ring instead.
// Rank 1 is killed (or destroys its communicator) after one message; rank 0's next Recv from it
// fails long before the 20 s timeout, naming the peer and why.
TEST(GlooFailureTest, SharedMemoryPeerThatDiesOrLeavesIsNamedWithoutWaitingForTheTimeout) {
  for (bool kill : {true, false}) {
    SCOPED_TRACE(kill ? "killed" : "left");
    FileStore store(FreshDir(kill ? "killed" : "left"));
    std::vector<ChildExit> exits = ForkRanks(2, [&](int rank) {
      auto comm = MakeGloo(rank, 2, &store, absl::Seconds(20));
      ASSERT_TRUE(comm.ok()) << comm.status();
      Tensor x = Tensor::Full({64}, 1.0f);
      if (rank == 1) {
        ASSERT_TRUE((*comm)->Send(x, 0, 1)->Wait().ok());
        if (kill) ::raise(SIGKILL);
        comm->reset();
        absl::SleepFor(absl::Seconds(4));  // alive, but gone from the group
        return;
      }
      ASSERT_TRUE((*comm)->Recv(x, 1, 1)->Wait().ok());
      absl::Time t0 = absl::Now();
      absl::Status st = (*comm)->Recv(x, 1, 2)->Wait();
      std::printf("rank 0's error, for the log: %s\n", st.ToString().c_str());
      EXPECT_LT(absl::Now() - t0, absl::Seconds(10));
      EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
      EXPECT_THAT(Message(st),
                  AllOf(HasSubstr("Recv #1 from rank 1 (tag 2"), HasSubstr("Shared memory: "),
                        HasSubstr(kill ? "has exited" : "closed its end")))
          << st;
    });
    ASSERT_EQ(exits.size(), 2u);
    EXPECT_TRUE(exits[0].exited && exits[0].code == 0) << exits[0].Describe();
  }
}

// A ring /dev/shm cannot hold (twice its size) is refused when it is made, by name and with what
// to do, instead of a SIGBUS at the first copy that finds no page.
TEST(GlooFailureTest, SharedMemoryThatDoesNotFitIsRefusedByName) {
  struct statvfs fs;
  ASSERT_EQ(statvfs("/dev/shm", &fs), 0);
  // An unlimited tmpfs would try to reserve it page by page; a limited one refuses at once.
  if (fs.f_blocks == 0) GTEST_SKIP() << "/dev/shm has no size limit";
  const uint64_t too_big = 2 * uint64_t(fs.f_blocks) * fs.f_frsize;
  FileStore store(FreshDir());
  RunRanks(2, [&](int rank) {
    auto comm = MakeGloo(rank, 2, &store, absl::Seconds(20),
                         {{"shm_ring_bytes", std::to_string(too_big)}});
    ASSERT_TRUE(comm.ok()) << comm.status();
    Tensor x = Tensor::Zeros({8}, DType::kF32);
    absl::Status st = (*comm)->Recv(x, 1 - rank, 0)->Wait();
    std::printf("rank %d's error, for the log: %s\n", rank, st.ToString().c_str());
    EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
    EXPECT_THAT(Message(st), AllOf(HasSubstr("cannot set up shared memory with rank"),
                                   HasSubstr("in /dev/shm"), HasSubstr("BRAID_GLOO_SHM=0")))
        << st;
  });
}

}  // namespace
}  // namespace braid::gloo_test
