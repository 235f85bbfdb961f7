// The threads the Gloo communicator runs work on: a set of threads started on demand (the
// point-to-point waits nobody else performs) and one serial worker (the collectives, in issue
// order). Generic, so kept apart from what runs on them.
#ifndef BRAID_BACKENDS_GLOO_THREADS_H_
#define BRAID_BACKENDS_GLOO_THREADS_H_

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace braid::gloo_backend::internal {

// ---- Threads started on demand -----------------------------------------------------------------

// Each ends on its own (a finished one is joined at the next Start) or is joined by JoinAll.
class ThreadSet {
 public:
  void Start(std::function<void()> fn);
  void JoinAll();

 private:
  absl::Mutex mu_;
  bool closed_ = false;  // GUARDED_BY(mu_)
  std::vector<std::pair<std::thread, std::shared_ptr<std::atomic<bool>>>> threads_;  // GUARDED_BY(mu_)
};

// ---- A thread running posted functions in order (drained on destruction) ---------------------

class SerialThread {
 public:
  SerialThread();
  ~SerialThread();
  void Post(std::function<void()> fn);

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the members it uses exist
};

}  // namespace braid::gloo_backend::internal

#endif  // BRAID_BACKENDS_GLOO_THREADS_H_
