// The watchdog's sweep and thread (watchdog.h).
#include "backends/nccl/watchdog.h"

#include <utility>

#include "absl/time/clock.h"

namespace braid::nccl::internal {

Watchdog::Watchdog(absl::Duration period, bool run_thread)
    : period_(period), run_thread_(run_thread) {}

Watchdog::~Watchdog() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void Watchdog::Add(Watch watch) {
  absl::MutexLock lock(&mu_);
  watches_.push_back(std::move(watch));
  if (run_thread_ && !started_ && !stop_) {
    started_ = true;
    thread_ = std::thread([this] { Run(); });
  }
}

size_t Watchdog::Sweep(absl::Time now) {
  std::vector<Watch> batch;
  {
    absl::MutexLock lock(&mu_);
    batch.swap(watches_);
    sweeping_ += int(batch.size());
  }
  std::vector<Watch> keep, expired;
  // Polls and callbacks run off the lock: they take the communicator's lock, and an Add from
  // the training thread must not wait for a poll.
  for (Watch& w : batch) {
    if (w.ended()) continue;
    (now >= w.deadline ? expired : keep).push_back(std::move(w));
  }
  for (Watch& w : expired) w.on_timeout();
  absl::MutexLock lock(&mu_);
  sweeping_ -= int(batch.size());
  for (Watch& w : keep) watches_.push_back(std::move(w));
  return watches_.size();
}

size_t Watchdog::watched() const {
  absl::MutexLock lock(&mu_);
  return watches_.size() + size_t(sweeping_);
}

void Watchdog::Run() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      // Idle (nothing watched) until an Add or the stop; otherwise one period between sweeps.
      auto wake = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_ || !watches_.empty(); };
      mu_.Await(absl::Condition(&wake));
      if (stop_) return;
      auto stopping = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping), period_)) return;
    }
    Sweep(absl::Now());
  }
}

}  // namespace braid::nccl::internal
