// Failures of the Gloo communicator end in bounded time with errors that say what happened: the
// operation, its sequence number, the group and which ranks did not arrive, plus this rank's
// recent operations. Ranks that hang, die, never start or disagree are all simulated here.
//
// Deterministic on a loaded machine: ranks (processes) wait for each other through the store,
// never by sleeping; a 2 s timeout is set only on the operation whose timeout is under test
// (communicators are made with a safety net of minutes), and no case asserts that something
// took less than some time. "Without waiting for the timeout" is shown by the error's kind
// (Unavailable, not DeadlineExceeded) with the timeout a safety net.
#include <signal.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "backends/gloo/test_util.h"
#include "core/check.h"
#include "core/communicator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace braid::gloo_test {
namespace {

using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

bool IsTimeoutOrIoError(const absl::Status& s) {
  return s.code() == absl::StatusCode::kDeadlineExceeded ||
         s.code() == absl::StatusCode::kUnavailable;
}

// The timeout of whatever must not end by a timeout (making communicators, waits for another
// rank): far beyond any scheduling delay. Should it ever be needed, ForkRanks' deadline (90 s)
// fails the test first.
constexpr absl::Duration kSafetyNet = absl::Minutes(10);
// The timeout of the operation whose timeout is under test.
constexpr absl::Duration kTimeout = absl::Seconds(2);

// Ranks are processes: they tell each other where they are through the test's store.
void Tell(Store& store, const std::string& what) {
  absl::Status st = store.Set("test/" + what, "1");
  EXPECT_TRUE(st.ok()) << st;
}

void AwaitTold(Store& store, const std::vector<std::string>& whats) {
  std::vector<std::string> keys;
  for (const std::string& w : whats) keys.push_back("test/" + w);
  absl::Status st = store.Wait(keys, kSafetyNet);
  EXPECT_TRUE(st.ok()) << st;
}

// Tells `what` when it goes out of scope, however the rank's body ends (a failed ASSERT returns
// early), so that a rank waiting for it is never left hanging.
class TellOnExit {
 public:
  TellOnExit(Store& store, std::string what) : store_(store), what_(std::move(what)) {}
  ~TellOnExit() { Tell(store_, what_); }
  TellOnExit(const TellOnExit&) = delete;
  TellOnExit& operator=(const TellOnExit&) = delete;

 private:
  Store& store_;
  std::string what_;
};

// Whether process `pid` has ended: gone, or a zombie its parent has not reaped yet.
bool Ended(pid_t pid) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat;
  if (!std::getline(f, stat)) return true;
  const size_t p = stat.rfind(')');  // "pid (comm) S ...": the state follows the name
  if (p == std::string::npos || p + 2 >= stat.size()) return false;
  return stat[p + 2] == 'Z' || stat[p + 2] == 'X';
}

// For the tests of the join timeout: a FileStore where a rank's Set of its join key (JoinGroup,
// core_state.cc: "<prefix>/join/<rank>") returns only once every rank of `together` has set its
// own. Each of them then starts its join timeout with the others already joined, however late
// its process was scheduled, so that only a rank outside `together` can be missing.
class JoinTogetherStore final : public Store {
 public:
  JoinTogetherStore(std::string dir, std::vector<int> together)
      : base_(std::move(dir)), together_(std::move(together)) {}
  absl::Status Set(const std::string& key, const std::string& value) override {
    BRAID_RETURN_IF_ERROR(base_.Set(key, value));
    const size_t at = key.rfind("/join/");
    if (at == std::string::npos) return absl::OkStatus();
    std::vector<std::string> keys;
    for (int r : together_) keys.push_back(absl::StrCat(key.substr(0, at), "/join/", r));
    return base_.Wait(keys, kSafetyNet);
  }
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    return base_.Get(key, timeout);
  }
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    return base_.Wait(keys, timeout);
  }
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    return base_.Add(key, delta);
  }
  absl::StatusOr<std::string> CompareSet(const std::string& key, const std::string& expected,
                                         const std::string& desired) override {
    return base_.CompareSet(key, expected, desired);
  }
  absl::Status Delete(const std::string& key) override { return base_.Delete(key); }

 private:
  FileStore base_;
  std::vector<int> together_;
};

// Rank 2 stops calling collectives (alive, but busy elsewhere): ranks 0 and 1 time out in
// their third all-reduce, and the error names rank 2 as the one that did not arrive.
TEST(GlooFailureTest, TimeoutNamesTheRankThatDidNotArrive) {
  FileStore store(FreshDir());
  RunRanks(3, [&](int rank) {
    auto comm = MakeGloo(rank, 3, &store, kSafetyNet);
    ASSERT_TRUE(comm.ok()) << comm.status();
    Communicator& c = **comm;
    for (int i = 0; i < 2; ++i) {
      Tensor x = Input(DType::kF32, rank, 64, i);
      ASSERT_TRUE(c.AllReduce(x, ReduceOp::kSum)->Wait().ok());
    }
    Tensor x = Input(DType::kF32, rank, 64, 2);
    c.set_timeout(kTimeout);
    if (rank == 2) {
      // Elsewhere until ranks 0 and 1 have timed out, been diagnosed and checked it all.
      AwaitTold(store, {"checked/0", "checked/1"});
      // Everyone else has given up on this all-reduce: it fails (at once, or by its timeout).
      EXPECT_FALSE(c.AllReduce(x, ReduceOp::kSum)->Wait().ok());
      return;
    }
    TellOnExit checked(store, absl::StrCat("checked/", rank));
    absl::Time t0 = absl::Now();
    absl::Status st = c.AllReduce(x, ReduceOp::kSum)->Wait();
    absl::Duration took = absl::Now() - t0;
    std::printf("rank %d's error, for the log: %s\n", rank, st.ToString().c_str());
    ASSERT_FALSE(st.ok());
    // Its own timeout, never cut short; or (Unavailable) the other waiting rank's timeout
    // ended the all-reduce for both of them first.
    EXPECT_TRUE(IsTimeoutOrIoError(st)) << st;
    if (st.code() == absl::StatusCode::kDeadlineExceeded) {
      EXPECT_GE(took, absl::Milliseconds(1900));
      EXPECT_THAT(Message(st), HasSubstr("(timeout 2s)"));
    }
    EXPECT_THAT(Message(st),
                AllOf(HasSubstr("AllReduce(sum, f32, 64 elements)"), HasSubstr("#2"),
                      HasSubstr("group 'world' (3 ranks)"), HasSubstr("rank(s) 2 did not arrive"),
                      HasSubstr("being at #1 AllReduce(sum, f32, 64 elements)"),
                      HasSubstr("Recent operations on this rank"),
                      HasSubstr("#1 AllReduce(sum, f32, 64 elements) 256 B: ok")))
        << st;
    // The communicator is broken: later calls fail at once, naming the first failure. "At
    // once": FailedPrecondition comes from the check made before anything is sent (a call
    // that went to the network would end Unavailable or DeadlineExceeded).
    absl::Status later = c.Barrier()->Wait();
    EXPECT_EQ(later.code(), absl::StatusCode::kFailedPrecondition) << later;
    EXPECT_THAT(Message(later), AllOf(HasSubstr("unusable"), HasSubstr("#2 AllReduce")));
  });
}

// Rank 2 is killed between two collectives: the survivors learn it from their connections (no
// need to wait for the timeout, here only a safety net: a survivor that waited for it would be
// killed at ForkRanks' deadline) and the error names rank 2.
TEST(GlooFailureTest, KilledRankIsNamedWithoutWaitingForTheTimeout) {
  FileStore store(FreshDir());
  std::vector<ChildExit> exits = ForkRanks(3, [&](int rank) {
    auto comm = MakeGloo(rank, 3, &store, kSafetyNet);
    ASSERT_TRUE(comm.ok()) << comm.status();
    Communicator& c = **comm;
    Tensor x = Input(DType::kF32, rank, 4096, 1);
    ASSERT_TRUE(c.AllReduce(x, ReduceOp::kSum)->Wait().ok());
    if (rank == 2) {
      ASSERT_TRUE(store.Set("test/pid/2", std::to_string(::getpid())).ok());
      ::raise(SIGKILL);
    }
    // The next collective starts once rank 2 is dead.
    absl::StatusOr<std::string> pid = store.Get("test/pid/2", kSafetyNet);
    ASSERT_TRUE(pid.ok()) << pid.status();
    while (!Ended(std::stoi(*pid))) absl::SleepFor(absl::Milliseconds(10));
    // The first call finds rank 2 gone; the second finds this communicator broken.
    for (int64_t count : {int64_t(4096), int64_t(3 << 20)}) {
      Tensor y = Input(DType::kF32, rank, count, 2);
      absl::Status st = c.AllReduce(y, ReduceOp::kSum)->Wait();
      std::printf("rank %d's error, for the log: %s\n", rank, st.ToString().c_str());
      ASSERT_FALSE(st.ok());
      if (count == 4096) {
        // Unavailable, not DeadlineExceeded: a broken connection, not the timeout.
        EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
        // Rank 2 is among the ranks named as missing. The other survivor may be named too: its
        // report that it reached #1 can come after this rank saw the connection close.
        EXPECT_THAT(Message(st), AllOf(HasSubstr("#1 AllReduce(sum, f32, 4096 elements)"),
                                       ContainsRegex("rank\\(s\\) ([0-9]+,)*2 did not arrive")))
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
    auto comm = MakeGloo(rank, 2, &store, kSafetyNet);
    ASSERT_TRUE(comm.ok()) << comm.status();
    Tensor x = Input(DType::kI32, rank, 16, 1);
    ASSERT_TRUE((*comm)->AllReduce(x, ReduceOp::kMax)->Wait().ok());
    if (rank == 1) {
      comm->reset();  // publishes that it left, then closes its connections
      Tell(store, "left/1");
      AwaitTold(store, {"checked/0"});  // still alive, but gone from the group
      return;
    }
    TellOnExit checked(store, "checked/0");
    AwaitTold(store, {"left/1"});
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
    auto comm = MakeGloo(rank, 3, &store, kSafetyNet);
    ASSERT_TRUE(comm.ok()) << comm.status();
    auto sub = (*comm)->NewGroup({1, 2});
    ASSERT_TRUE(sub.ok()) << sub.status();
    if (rank != 1) {
      // Member 1 of the sub-group stays away (alive) until member 0 has checked its error.
      if (rank == 2) AwaitTold(store, {"checked/1"});
      return;
    }
    TellOnExit checked(store, "checked/1");
    (*sub)->set_timeout(kTimeout);
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

// Rank 2 never starts: the others' communicators fail to form, naming it, by the timeout.
TEST(GlooFailureTest, RankThatNeverJoinsIsNamed) {
  JoinTogetherStore store(FreshDir(), {0, 1});
  RunRanks(3, [&](int rank) {
    if (rank == 2) return;
    auto comm = MakeGloo(rank, 3, &store, kTimeout);
    ASSERT_FALSE(comm.ok());
    EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded) << comm.status();
    EXPECT_THAT(Message(comm.status()),
                AllOf(HasSubstr("rank(s) 2 did not join within 2s"), HasSubstr("joined: 0,1")))
        << comm.status();
  });
}

// Rank 0 says 2 ranks, rank 1 says 3: rank 0 finds rank 1's size at once, rank 1 after waiting
// for a rank 2 (the store makes each join with the other there, however late it started).
TEST(GlooFailureTest, WorldSizeDisagreementIsNamed) {
  JoinTogetherStore store(FreshDir(), {0, 1});
  RunRanks(2, [&](int rank) {
    auto comm = MakeGloo(rank, rank == 0 ? 2 : 3, &store, kTimeout);
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
    auto comm = MakeGloo(rank, 2, &store, kSafetyNet);
    ASSERT_TRUE(comm.ok()) << comm.status();
    Communicator& c = **comm;
    c.set_timeout(kTimeout);
    Tensor in = Input(DType::kF32, rank, 10, 1);
    Tensor out = Tensor::Zeros({5}, DType::kF32);
    std::vector<int64_t> counts =
        rank == 0 ? std::vector<int64_t>{5, 6} : std::vector<int64_t>{5, 5};
    if (rank == 0) {
      absl::Status st = c.ReduceScatter(in, out, ReduceOp::kSum, counts)->Wait();
      // The failure, and why, is published before this Wait returns: rank 1 may start now.
      Tell(store, "failed/0");
      EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
      EXPECT_THAT(Message(st), HasSubstr("counts [5,6]"));
      absl::Status later = c.Barrier()->Wait();
      EXPECT_EQ(later.code(), absl::StatusCode::kFailedPrecondition) << later;
      AwaitTold(store, {"checked/1"});  // stay for rank 1's diagnosis
      return;
    }
    TellOnExit checked(store, "checked/1");
    AwaitTold(store, {"failed/0"});
    absl::Status st = c.ReduceScatter(in, out, ReduceOp::kSum, counts)->Wait();
    ASSERT_FALSE(st.ok());
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
    auto comm = MakeGloo(rank, 2, &store, kSafetyNet);
    ASSERT_TRUE(comm.ok()) << comm.status();
    (*comm)->set_timeout(kTimeout);
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
    auto comm = MakeGloo(rank, 2, &store, kSafetyNet);
    ASSERT_TRUE(comm.ok()) << comm.status();
    if (rank == 1) {
      AwaitTold(store, {"checked/0"});  // alive, sending nothing
      return;
    }
    TellOnExit checked(store, "checked/0");
    (*comm)->set_timeout(kTimeout);
    Tensor x = Tensor::Zeros({8}, DType::kF32);
    absl::Status st = (*comm)->Recv(x, 1, 3)->Wait();
    std::printf("rank %d's error, for the log: %s\n", rank, st.ToString().c_str());
    EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
    EXPECT_THAT(Message(st), AllOf(HasSubstr("Recv #0 from rank 1 (tag 3"),
                                   HasSubstr("has not posted the matching operation")))
        << st;
  });
}

// Between ranks of one host, Send and Recv go through shared memory, where no connection breaks
// when a peer goes: the waits look at the peer's process and at its end of the ring instead.
// Rank 1 is killed (or destroys its communicator) after one message; rank 0's next Recv from it
// fails without waiting for the timeout (a safety net here: Unavailable, not DeadlineExceeded),
// naming the peer and why.
TEST(GlooFailureTest, SharedMemoryPeerThatDiesOrLeavesIsNamedWithoutWaitingForTheTimeout) {
  for (bool kill : {true, false}) {
    SCOPED_TRACE(kill ? "killed" : "left");
    FileStore store(FreshDir(kill ? "killed" : "left"));
    std::vector<ChildExit> exits = ForkRanks(2, [&](int rank) {
      auto comm = MakeGloo(rank, 2, &store, kSafetyNet);
      ASSERT_TRUE(comm.ok()) << comm.status();
      Tensor x = Tensor::Full({64}, 1.0f);
      if (rank == 1) {
        ASSERT_TRUE((*comm)->Send(x, 0, 1)->Wait().ok());
        if (kill) ::raise(SIGKILL);
        comm->reset();
        AwaitTold(store, {"checked/0"});  // alive, but gone from the group
        return;
      }
      TellOnExit checked(store, "checked/0");
      ASSERT_TRUE((*comm)->Recv(x, 1, 1)->Wait().ok());
      absl::Status st = (*comm)->Recv(x, 1, 2)->Wait();
      std::printf("rank 0's error, for the log: %s\n", st.ToString().c_str());
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
// to do, instead of a SIGBUS at the first copy that finds no page. Runs in its own target,
// gloo_failure_test_shm_limit, which Bazel skips where /dev/shm has no size limit
// (third_party/host): here a missing limit is a failure.
TEST(GlooFailureTest, SharedMemoryThatDoesNotFitIsRefusedByName) {
  struct statvfs fs;
  ASSERT_EQ(statvfs("/dev/shm", &fs), 0);
  // An unlimited tmpfs would try to reserve it page by page; a limited one refuses at once.
  ASSERT_GT(fs.f_blocks, 0u) << "/dev/shm has no size limit, but the target requires one";
  const uint64_t too_big = 2 * uint64_t(fs.f_blocks) * fs.f_frsize;
  FileStore store(FreshDir());
  RunRanks(2, [&](int rank) {
    auto comm = MakeGloo(rank, 2, &store, kSafetyNet,
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
