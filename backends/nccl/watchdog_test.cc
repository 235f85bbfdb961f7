// The watchdog's sweep on fake polls and a fake clock (no GPU, every build), and its thread
// timing out an operation whose deadline has passed.
#include "backends/nccl/watchdog.h"

#include <atomic>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace braid::nccl::internal {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);

// A fake operation: `ended` is what its poll answers; the timeout ends it, as the
// communicator's abort does.
struct FakeOp {
  bool ended = false;
  int polls = 0;
  int timeouts = 0;
  Watchdog::Watch WatchUntil(absl::Time deadline) {
    return {[this] {
              ++polls;
              return ended;
            },
            [this] {
              ++timeouts;
              ended = true;
            },
            deadline};
  }
};

TEST(WatchdogTest, TimesOutOnlyWhatIsStillRunningAtItsDeadline) {
  Watchdog dog(absl::Milliseconds(1), /*run_thread=*/false);
  FakeOp early, late, finished;
  dog.Add(early.WatchUntil(kT0 + absl::Seconds(1)));
  dog.Add(late.WatchUntil(kT0 + absl::Seconds(5)));
  dog.Add(finished.WatchUntil(kT0 + absl::Seconds(1)));
  EXPECT_EQ(dog.watched(), 3u);

  EXPECT_EQ(dog.Sweep(kT0), 3u);  // nothing due, nothing ended
  EXPECT_EQ(early.timeouts + late.timeouts + finished.timeouts, 0);

  finished.ended = true;  // ends before its deadline: forgotten, never timed out
  EXPECT_EQ(dog.Sweep(kT0 + absl::Milliseconds(500)), 2u);
  EXPECT_EQ(finished.timeouts, 0);

  // At the deadline exactly, still running: timed out once and forgotten.
  EXPECT_EQ(dog.Sweep(kT0 + absl::Seconds(1)), 1u);
  EXPECT_EQ(early.timeouts, 1);
  EXPECT_EQ(late.timeouts, 0);
  const int early_polls = early.polls;
  EXPECT_EQ(dog.Sweep(kT0 + absl::Seconds(2)), 1u);
  EXPECT_EQ(early.polls, early_polls) << "a timed-out operation is no longer polled";
  EXPECT_EQ(early.timeouts, 1);
  EXPECT_EQ(finished.polls, 2);
}

TEST(WatchdogTest, AnOperationThatEndedByItsDeadlineIsNotTimedOut) {
  // The poll comes before the deadline check: a collective that finished just before a late
  // sweep succeeded, and aborting the communicator for it would be wrong.
  Watchdog dog(absl::Milliseconds(1), /*run_thread=*/false);
  FakeOp op;
  dog.Add(op.WatchUntil(kT0));
  op.ended = true;
  EXPECT_EQ(dog.Sweep(kT0 + absl::Hours(1)), 0u);
  EXPECT_EQ(op.timeouts, 0);
  EXPECT_EQ(op.polls, 1);
}

TEST(WatchdogTest, AWatchAddedDuringATimeoutIsKept) {
  // on_timeout runs off the lock; what it (or the training thread meanwhile) adds is watched
  // by the next sweep.
  Watchdog dog(absl::Milliseconds(1), /*run_thread=*/false);
  FakeOp first, second;
  Watchdog::Watch w = first.WatchUntil(kT0);
  w.on_timeout = [&] {
    ++first.timeouts;
    first.ended = true;
    dog.Add(second.WatchUntil(kT0 + absl::Seconds(10)));
  };
  dog.Add(std::move(w));
  EXPECT_EQ(dog.Sweep(kT0), 1u);
  EXPECT_EQ(first.timeouts, 1);
  EXPECT_EQ(dog.Sweep(kT0 + absl::Seconds(10)), 0u);
  EXPECT_EQ(second.timeouts, 1);
}

TEST(WatchdogTest, ItsThreadEndsAnOperationPastItsDeadlineWithoutAnyoneWaiting) {
  // The training thread never waits: the watchdog's own thread finds the operation past its
  // deadline (already past when added) and times it out. Synchronised by the notification,
  // not by time.
  Watchdog dog(absl::Milliseconds(1));
  absl::Notification timed_out;
  std::atomic<int> polls{0};
  dog.Add({[&] {
             ++polls;
             return timed_out.HasBeenNotified();
           },
           [&] { timed_out.Notify(); }, absl::InfinitePast()});
  timed_out.WaitForNotification();
  EXPECT_GE(polls.load(), 1);
}

TEST(WatchdogTest, ItsThreadForgetsWhatEndsAndStopsWhenDestroyed) {
  auto dog = std::make_unique<Watchdog>(absl::Milliseconds(1));
  absl::Notification polled_ended;
  dog->Add({[&] {
              if (!polled_ended.HasBeenNotified()) polled_ended.Notify();
              return true;
            },
            [] { ADD_FAILURE() << "an ended operation timed out"; }, absl::InfiniteFuture()});
  polled_ended.WaitForNotification();
  dog.reset();  // joins the thread; a hang here is the test's failure (Bazel's timeout)
}

}  // namespace
}  // namespace braid::nccl::internal
