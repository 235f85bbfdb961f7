// ThreadSet and SerialThread: starting, joining and draining.
#include "backends/gloo/threads.h"

namespace braid::gloo_backend::internal {

void ThreadSet::Start(std::function<void()> fn) {
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::thread t([fn = std::move(fn), done] {
    fn();
    done->store(true);
  });
  absl::MutexLock lock(&mu_);
  if (closed_) {  // nothing will join it; it ends by its operation's timeout at the latest
    t.detach();
    return;
  }
  for (auto it = threads_.begin(); it != threads_.end();) {
    if (it->second->load()) {
      it->first.join();
      it = threads_.erase(it);
    } else {
      ++it;
    }
  }
  threads_.emplace_back(std::move(t), std::move(done));
}

void ThreadSet::JoinAll() {
  absl::MutexLock lock(&mu_);
  for (auto& [t, done] : threads_) t.join();
  threads_.clear();
  closed_ = true;
}

SerialThread::SerialThread() : thread_([this] { Loop(); }) {}

SerialThread::~SerialThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void SerialThread::Post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(fn));
  }
  cv_.notify_one();
}

void SerialThread::Loop() {
  for (;;) {
    std::function<void()> fn;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      fn = std::move(queue_.front());
      queue_.pop_front();
    }
    fn();
  }
}

}  // namespace braid::gloo_backend::internal
