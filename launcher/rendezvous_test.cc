#include "launcher/rendezvous.h"

#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/check.h"

namespace braid::launcher {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

LauncherInfo Node(int id, int nnodes, int nproc, int max_restarts = 0) {
  LauncherInfo i;
  i.id = id;
  i.num_launchers = nnodes;
  i.world_size = nnodes * nproc;
  i.local_workers = nproc;
  i.max_restarts = max_restarts;
  i.label = absl::StrCat("node ", id);
  i.host = absl::StrCat("host", id);
  i.layout = absl::StrCat("--nnodes=", nnodes, " --nproc_per_node=", nproc);
  return i;
}

// The timeout of check-ins that must end without it (they succeed, or fail on what the others
// published): only a safety net, far longer than any scheduling delay. A launcher that waited
// for it instead would hang the test until Bazel's timeout fails it; none of these tests
// asserts how fast anything was.
constexpr absl::Duration kSafetyNet = absl::Minutes(10);

// Checks every launcher in on its own thread (as on separate machines); returns their statuses.
std::vector<absl::Status> CheckInAll(const std::vector<LauncherRendezvous*>& launchers,
                                     absl::Duration timeout) {
  std::vector<absl::Status> out(launchers.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < launchers.size(); ++i) {
    threads.emplace_back([&, i] { out[i] = launchers[i]->CheckIn(0, timeout, nullptr); });
  }
  for (auto& t : threads) t.join();
  return out;
}

std::vector<absl::Status> CheckInAll(Store* store, const std::vector<LauncherInfo>& infos,
                                     absl::Duration timeout) {
  std::vector<std::unique_ptr<LauncherRendezvous>> owned;
  std::vector<LauncherRendezvous*> ptrs;
  for (const LauncherInfo& i : infos) {
    owned.push_back(std::make_unique<LauncherRendezvous>(store, i));
    ptrs.push_back(owned.back().get());
  }
  return CheckInAll(ptrs, timeout);
}

// An InMemoryStore whose Set of a launcher's info returns only once `n` launchers have set
// theirs: every launcher then finds the others' info on its first look, before it can check
// its deadline, however late its thread or the others' started.
class InfoGateStore final : public Store {
 public:
  explicit InfoGateStore(int n) : n_(n) {}
  absl::Status Set(const std::string& key, const std::string& value) override {
    BRAID_RETURN_IF_ERROR(base_.Set(key, value));
    if (absl::StrContains(key, "/info/")) {
      std::unique_lock<std::mutex> lock(mu_);
      ++infos_;
      cv_.notify_all();
      // The safety net: a launcher that never publishes fails the test, after minutes.
      if (!cv_.wait_for(lock, absl::ToChronoSeconds(kSafetyNet), [&] { return infos_ >= n_; })) {
        return absl::DeadlineExceededError("InfoGateStore: the others never set their info");
      }
    }
    return absl::OkStatus();
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
  const int n_;
  InMemoryStore base_;
  std::mutex mu_;
  std::condition_variable cv_;
  int infos_ = 0;
};

TEST(LauncherInfo, RoundTrip) {
  LauncherInfo a = Node(3, 4, 2, 1);
  a.uniform = false;
  auto b = LauncherInfo::Parse(a.Serialize());
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->id, 3);
  EXPECT_EQ(b->num_launchers, 4);
  EXPECT_EQ(b->world_size, 8);
  EXPECT_EQ(b->local_workers, 2);
  EXPECT_FALSE(b->uniform);
  EXPECT_EQ(b->max_restarts, 1);
  EXPECT_EQ(b->label, "node 3");
  EXPECT_EQ(b->host, "host3");
  EXPECT_EQ(b->layout, "--nnodes=4 --nproc_per_node=2");
  EXPECT_EQ(b->run_id, "none");
  EXPECT_FALSE(LauncherInfo::Parse("garbage").ok());
}

TEST(LauncherRendezvous, AgreeingLaunchersAllCheckIn) {
  InMemoryStore store;
  LauncherRendezvous a(&store, Node(0, 3, 2)), b(&store, Node(1, 3, 2)), c(&store, Node(2, 3, 2));
  for (const auto& s : CheckInAll({&a, &b, &c}, kSafetyNet)) EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(b.peers().size(), 2u);
  EXPECT_EQ(b.peers().at(2).host, "host2");
  EXPECT_EQ(b.peers().at(0).layout, "--nnodes=3 --nproc_per_node=2");
  EXPECT_EQ(*a.CountArrived(0), 3);
  EXPECT_EQ(*a.CountArrived(1), 0);
}

TEST(LauncherRendezvous, WorldSizeDisagreementFailsBothSidesFastNamingBoth) {
  InMemoryStore store;
  // Node 0 thinks 2 nodes, node 1 thinks 3: node 0 would never wait for node 2, node 1 would
  // wait forever for it. Both must fail at once with both views: with the timeout only a
  // safety net, an error that names the disagreement (not a deadline) shows neither waited.
  auto st = CheckInAll(&store, {Node(0, 2, 4), Node(1, 3, 4)}, kSafetyNet);
  for (const auto& s : st) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(std::string(s.message()),
                AllOf(HasSubstr("world size disagreement"), HasSubstr("node 0 (host host0: --nnodes=2 --nproc_per_node=4)"),
                      HasSubstr("world size 8"), HasSubstr("node 1 (host host1: --nnodes=3 --nproc_per_node=4)"),
                      HasSubstr("world size 12")));
  }
}

TEST(LauncherRendezvous, WorkersPerNodeDisagreement) {
  InMemoryStore store;
  auto st = CheckInAll(&store, {Node(0, 2, 2), Node(1, 2, 3)}, kSafetyNet);
  for (const auto& s : st) EXPECT_THAT(std::string(s.message()), HasSubstr("--nproc_per_node=3"));
}

TEST(LauncherRendezvous, UnevenWorkersAreFineWhenTheSchedulerSaysSo) {
  // Slurm with SLURM_TASKS_PER_NODE=2,1: launchers are per task, each with one worker.
  InMemoryStore store;
  std::vector<LauncherInfo> infos;
  for (int i = 0; i < 3; ++i) {
    LauncherInfo l = Node(i, 3, 1);
    l.uniform = false;
    infos.push_back(l);
  }
  for (const auto& s : CheckInAll(&store, infos, kSafetyNet)) EXPECT_TRUE(s.ok()) << s;
}

TEST(LauncherRendezvous, MaxRestartsDisagreement) {
  InMemoryStore store;
  auto st = CheckInAll(&store, {Node(0, 2, 1, 0), Node(1, 2, 1, 2)}, kSafetyNet);
  for (const auto& s : st) EXPECT_THAT(std::string(s.message()), HasSubstr("--max_restarts=2"));
}

TEST(LauncherRendezvous, RunIdDisagreement) {
  InMemoryStore store;
  LauncherInfo a = Node(0, 2, 1), b = Node(1, 2, 1);
  a.run_id = "job-1";
  b.run_id = "job-2";
  auto st = CheckInAll(&store, {a, b}, kSafetyNet);
  for (const auto& s : st) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(std::string(s.message()),
                AllOf(HasSubstr("--rdzv_id disagreement"), HasSubstr("--rdzv_id=job-1"),
                      HasSubstr("--rdzv_id=job-2")));
  }
  // A record without the field (an older launcher) means torchrun's default, "none".
  std::string old = Node(1, 2, 1).Serialize();
  old = old.substr(0, old.find("\nrun_id="));
  EXPECT_EQ(LauncherInfo::Parse(old)->run_id, "none");
}

TEST(LauncherRendezvous, TwoLaunchersWithTheSameNodeRank) {
  InMemoryStore store;
  LauncherInfo twin = Node(1, 3, 1);
  twin.host = "other";
  // Node 2 never comes: every launcher ends on the twins' error, not on the safety net.
  auto st = CheckInAll(&store, {Node(0, 3, 1), Node(1, 3, 1), twin}, kSafetyNet);
  for (const auto& s : st) {
    EXPECT_FALSE(absl::IsDeadlineExceeded(s)) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("two launchers claim to be node 1"));
  }
}

// Nodes 0 and 2 come, node 1 never does: both time out naming node 1 alone. The gate makes each
// see the other before its 400 ms can run out; the message's "within 400ms" names the timeout.
TEST(LauncherRendezvous, TimeoutNamesTheMissingNodes) {
  InfoGateStore store(2);
  auto st = CheckInAll(&store, {Node(0, 3, 1), Node(2, 3, 1)}, absl::Milliseconds(400));
  for (const auto& s : st) {
    EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
    EXPECT_THAT(std::string(s.message()),
                AllOf(HasSubstr("only 2 of 3 launchers checked in within 400ms"),
                      HasSubstr("missing: node 1.")));
  }
}

// The wait polls `cancelled` between its looks at the store and stops at the first true: here
// the third poll, so the wait has gone round twice (node 1 never comes) before it is cancelled.
TEST(LauncherRendezvous, CancelStopsTheWait) {
  InMemoryStore store;
  LauncherRendezvous r(&store, Node(0, 2, 1));
  int polls = 0;
  absl::Status s = r.CheckIn(0, kSafetyNet, [&] { return ++polls == 3; });
  EXPECT_TRUE(absl::IsCancelled(s)) << s;
  EXPECT_EQ(polls, 3) << "the wait went on after it was cancelled";
}

TEST(LauncherRendezvous, FirstFailureWinsAndEveryoneSeesIt) {
  InMemoryStore store;
  LauncherRendezvous a(&store, Node(0, 2, 1)), b(&store, Node(1, 2, 1));
  EXPECT_FALSE(a.CheckFailure(0)->has_value());
  ASSERT_TRUE(b.ReportFailure(0, {"rank 1 exited with code 3", true}).ok());
  ASSERT_TRUE(a.ReportFailure(0, {"node 0's launcher received SIGINT", false}).ok());
  for (LauncherRendezvous* r : {&a, &b}) {
    auto f = r->CheckFailure(0);
    ASSERT_TRUE(f.ok() && f->has_value());
    EXPECT_EQ((*f)->message, "rank 1 exited with code 3");
    EXPECT_TRUE((*f)->restartable);
  }
  // A restart starts clean.
  EXPECT_FALSE(a.CheckFailure(1)->has_value());
  ASSERT_TRUE(a.ReportFailure(1, {"node 0's launcher received SIGINT", false}).ok());
  EXPECT_FALSE(b.CheckFailure(1)->value().restartable);
}

TEST(LauncherRendezvous, SilentLauncherIsNoticed) {
  InMemoryStore store;
  LauncherRendezvous zero(&store, Node(0, 3, 1)), one(&store, Node(1, 3, 1)), two(&store, Node(2, 3, 1));
  for (const auto& s : CheckInAll({&zero, &one, &two}, kSafetyNet)) ASSERT_TRUE(s.ok()) << s;
  absl::Time t0 = absl::Now();
  std::vector<LauncherInfo> silent;
  // Node 1 beats before every look, so its value has always moved since the last one (silence
  // is "no change between looks", whatever the time between them); node 2 never beats. Looks
  // until someone is silent: node 2 must be, and only once 500 ms have passed.
  while (absl::Now() - t0 < kSafetyNet) {
    ASSERT_TRUE(one.Heartbeat(0).ok());
    auto s = zero.SilentLaunchers(0, absl::Milliseconds(500));
    ASSERT_TRUE(s.ok());
    silent = *s;
    if (!silent.empty()) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_EQ(silent.size(), 1u);
  EXPECT_EQ(silent[0].id, 2);
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(500));
}

// A restart whose check-in waits for a launcher that was SIGKILLed mid-run (found by
// tools/chaos): its workers died with it, the others' failed, and node 0 restarted the group and
// then waited --rdzv_timeout_s (5 minutes) for it. Its heartbeat of the run it left stands still,
// so the check-in ends naming it once `silence` has passed.
TEST(LauncherRendezvous, RestartCheckInNamesALauncherThatVanished) {
  InMemoryStore store;
  LauncherRendezvous zero(&store, Node(0, 2, 1, 1)), one(&store, Node(1, 2, 1, 1));
  for (const auto& s : CheckInAll({&zero, &one}, kSafetyNet)) ASSERT_TRUE(s.ok()) << s;
  ASSERT_TRUE(one.Heartbeat(0).ok());  // then it is killed: no more beats, no check-in
  absl::Status s = zero.CheckIn(1, kSafetyNet, nullptr, absl::Milliseconds(300));
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("node 1's launcher (host host1) stopped responding: no heartbeat for 300ms"),
                    HasSubstr("it never checked in for restart 1")));
}

// A store on which node 1 is alive and slow to come back: its heartbeat of attempt 0 moves at
// every look node 0 takes at it, and after `checkin_after` looks it checks in for attempt 1.
class SlowRestartStore final : public Store {
 public:
  explicit SlowRestartStore(int checkin_after) : checkin_after_(checkin_after) {}
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    if (key == "braid.launcher/0/beat/1" && !checked_in_) {
      BRAID_RETURN_IF_ERROR(base_.Set(key, absl::StrCat(++looks_)));
      if (looks_ == checkin_after_) {
        checked_in_ = true;
        BRAID_RETURN_IF_ERROR(base_.Set("braid.launcher/1/info/1", Node(1, 2, 1, 1).Serialize()));
      }
    }
    return base_.Get(key, timeout);
  }
  absl::Status Set(const std::string& key, const std::string& value) override { return base_.Set(key, value); }
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    return base_.Wait(keys, timeout);
  }
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override { return base_.Add(key, delta); }
  absl::StatusOr<std::string> CompareSet(const std::string& key, const std::string& expected,
                                         const std::string& desired) override {
    return base_.CompareSet(key, expected, desired);
  }
  absl::Status Delete(const std::string& key) override { return base_.Delete(key); }
  int looks() const { return looks_; }

 private:
  const int checkin_after_;
  int looks_ = 0;
  bool checked_in_ = false;
  InMemoryStore base_;
};

// ...while one that still beats (stopping its workers takes a while) is waited for: node 1's beat
// moves between every two looks, so however long those 20 looks take, it is never silent.
TEST(LauncherRendezvous, RestartCheckInWaitsForALauncherThatStillBeats) {
  SlowRestartStore store(20);
  LauncherRendezvous zero(&store, Node(0, 2, 1, 1)), one(&store, Node(1, 2, 1, 1));
  for (const auto& s : CheckInAll({&zero, &one}, kSafetyNet)) ASSERT_TRUE(s.ok()) << s;
  absl::Status s = zero.CheckIn(1, kSafetyNet, nullptr, absl::Milliseconds(1));
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(store.looks(), 20);
}

TEST(LauncherRendezvous, DoneAndExitCounts) {
  InMemoryStore store;
  LauncherRendezvous a(&store, Node(0, 2, 1)), b(&store, Node(1, 2, 1));
  EXPECT_EQ(*a.CountDone(0), 0);
  EXPECT_EQ(*a.ReportDone(0), 1);
  EXPECT_EQ(*b.ReportDone(0), 2);
  EXPECT_EQ(*a.CountDone(0), 2);
  EXPECT_EQ(*b.ReportExit(0), 1);
  EXPECT_EQ(*a.CountExit(0), 1);
  EXPECT_EQ(*a.CountDone(1), 0);
}

}  // namespace
}  // namespace braid::launcher
