// The NCCL communicator's watchdog: a thread that polls the operations nobody waits for on the
// host (Work::WaitOnDevice: the compute stream waits for them instead) and ends those still
// running at their deadline, so that a collective ordered only on the device keeps the rule
// "every collective has a timeout" (PyTorch's NCCL watchdog plays the same part). Separate from
// the communicator, and free of CUDA and NCCL: what "ended" and "time out" mean are the
// caller's functions, so the sweep's logic is tested in every build with fake polls and a fake
// clock (watchdog_test), and the communicator gives it functions over CUDA events.
#ifndef BRAID_BACKENDS_NCCL_WATCHDOG_H_
#define BRAID_BACKENDS_NCCL_WATCHDOG_H_

#include <cstddef>
#include <functional>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace braid::nccl::internal {

class Watchdog {
 public:
  struct Watch {
    // Whether the operation has ended, successfully or not (a failure the poll found is the
    // caller's to report). Called off the watchdog's lock, from its thread or Sweep's caller.
    std::function<bool()> ended;
    // Called once, off the lock, when a sweep at or past `deadline` finds it still running.
    // It must end the operation (the communicator aborts NCCL and fails it with its error).
    std::function<void()> on_timeout;
    absl::Time deadline;
  };

  // `run_thread`: sweep every `period` on a thread of its own, started by the first Add (a
  // communicator that never waits on the device never starts one). Tests pass false and call
  // Sweep with their own clock.
  explicit Watchdog(absl::Duration period, bool run_thread = true);
  // Stops the thread (a sweep in progress finishes first). Watches left are dropped unpolled.
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  void Add(Watch watch);

  // One pass at `now`: polls every watched operation, forgets those that ended, calls
  // on_timeout for those still running at or past their deadline (and forgets them), keeps the
  // others. An operation that has ended by its deadline is never timed out: the poll comes
  // first. Returns how many are still watched.
  size_t Sweep(absl::Time now);

  size_t watched() const;

 private:
  void Run();

  const absl::Duration period_;
  const bool run_thread_;
  mutable absl::Mutex mu_;
  std::vector<Watch> watches_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  int sweeping_ ABSL_GUARDED_BY(mu_) = 0;  // watches taken out by a sweep in progress
  std::thread thread_;
};

}  // namespace braid::nccl::internal

#endif  // BRAID_BACKENDS_NCCL_WATCHDOG_H_
