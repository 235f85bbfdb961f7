// The test harness itself: the file store across processes and threads, and ForkRanks'
// reporting and reaping.
#include "backends/gloo/test_util.h"

#include <errno.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace braid::gloo_test {
namespace {

TEST(FileStoreTest, SetGetWaitDeleteWithAnyKeyAndBinaryValue) {
  FileStore store(FreshDir());
  const std::string key = "a/b c%d.e";
  const std::string value("x\0y\n\xff", 5);
  ASSERT_TRUE(store.Set(key, value).ok());
  absl::StatusOr<std::string> got = store.Get(key, absl::ZeroDuration());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, value);
  EXPECT_TRUE(store.Wait({key}, absl::ZeroDuration()).ok());
  absl::Status missing = store.Wait({key, "other"}, absl::Milliseconds(30));
  EXPECT_EQ(missing.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(std::string(missing.message()).find("other"), std::string::npos) << missing;
  ASSERT_TRUE(store.Delete(key).ok());
  EXPECT_FALSE(store.Get(key, absl::ZeroDuration()).ok());
  EXPECT_TRUE(store.Delete(key).ok());  // deleting an absent key is fine
}

TEST(FileStoreTest, CompareSetOnlyReplacesTheExpectedValue) {
  FileStore store(FreshDir());
  EXPECT_EQ(*store.CompareSet("k", "", "first"), "first");  // "" matches an absent key
  EXPECT_EQ(*store.CompareSet("k", "wrong", "second"), "first");
  EXPECT_EQ(*store.CompareSet("k", "first", "second"), "second");
}

// Add is atomic across processes: 4 processes x 2 threads x 50 increments.
TEST(FileStoreTest, AddIsAtomicAcrossProcessesAndThreads) {
  FileStore store(FreshDir());
  RunRanks(4, [&](int rank) {
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t) {
      threads.emplace_back([&] {
        for (int i = 0; i < 50; ++i) ASSERT_TRUE(store.Add("counter", 1).ok());
      });
    }
    for (auto& t : threads) t.join();
  });
  EXPECT_EQ(*store.Add("counter", 0), 400);
}

// A Get waits for a key another process sets later.
TEST(FileStoreTest, GetWaitsForAnotherProcess) {
  FileStore store(FreshDir());
  RunRanks(2, [&](int rank) {
    if (rank == 0) {
      absl::SleepFor(absl::Milliseconds(100));
      ASSERT_TRUE(store.Set("late", "here").ok());
    } else {
      absl::StatusOr<std::string> v = store.Get("late", absl::Seconds(10));
      ASSERT_TRUE(v.ok()) << v.status();
      EXPECT_EQ(*v, "here");
    }
  });
}

TEST(ForkRanksTest, ReportsExitCodesSignalsAndKillsStragglers) {
  std::vector<ChildExit> exits = ForkRanks(
      4,
      [](int rank) {
        if (rank == 1) ADD_FAILURE() << "deliberate failure in rank 1 (expected by the test)";
        if (rank == 2) ::raise(SIGKILL);
        if (rank == 3) absl::SleepFor(absl::Seconds(60));
      },
      absl::Seconds(2));
  // Rank 3 would sleep 60 s: that it was not reaped (it was killed at the 2 s deadline) says the
  // deadline held, with no bound on the elapsed time a loaded machine could break.
  ASSERT_EQ(exits.size(), 4u);
  EXPECT_TRUE(exits[0].reaped && exits[0].exited && exits[0].code == 0) << exits[0].Describe();
  EXPECT_TRUE(exits[1].reaped && exits[1].exited && exits[1].code == 1) << exits[1].Describe();
  EXPECT_TRUE(exits[2].reaped && exits[2].signal == SIGKILL) << exits[2].Describe();
  EXPECT_FALSE(exits[3].reaped) << exits[3].Describe();
  // Every child is gone: no zombie or orphan left behind.
  EXPECT_EQ(::waitpid(-1, nullptr, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
}

}  // namespace
}  // namespace braid::gloo_test
