// A small fork-join thread pool for the CPU kernels.
//
// ParallelFor(n, grain, fn) calls fn(begin, end) on disjoint ranges covering [0, n). With one
// thread, or when n <= grain, or when called from inside a running ParallelFor (nested), or
// when another thread is already using the pool (several cpu:N devices driven from their own
// threads), fn runs inline on the caller: no locks, no atomics, no allocation. Kernels must
// therefore never depend on how [0, n) is split; the ones in this backend give bit-identical
// results for every thread count.
#ifndef BRAID_BACKENDS_CPU_THREAD_POOL_H_
#define BRAID_BACKENDS_CPU_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace braid::cpu {

class ThreadPool {
 public:
  // num_threads counts the calling thread: a pool of N starts N - 1 workers.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  template <typename Fn>
  void ParallelFor(int64_t n, int64_t grain, Fn&& fn) {
    if (n <= 0) return;
    if (num_threads_ <= 1 || n <= grain || in_parallel_region_) {
      fn(int64_t{0}, n);
      return;
    }
    using F = std::remove_reference_t<Fn>;
    Run(
        n, grain, [](void* ctx, int64_t b, int64_t e) { (*static_cast<F*>(ctx))(b, e); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }

 private:
  using Trampoline = void (*)(void* ctx, int64_t begin, int64_t end);
  void Run(int64_t n, int64_t grain, Trampoline call, void* ctx);
  void WorkerLoop();
  // Claims and runs chunks of job `job` until none are left or another job is current.
  void DrainChunks(uint32_t job);

  const int num_threads_;
  std::vector<std::thread> workers_;

  // One job at a time; a second concurrent caller runs its loop inline instead of waiting.
  std::mutex run_mu_;

  // The current job. Its fields are written before state_ announces it and stay fixed until
  // all of its chunks are done.
  Trampoline call_ = nullptr;
  void* ctx_ = nullptr;
  int64_t n_ = 0;
  int64_t chunk_ = 1;
  // job id (32 bits) | number of chunks (16) | next unclaimed chunk (16). Claiming is a CAS
  // that checks the job id, so a worker that wakes late can never take a chunk of a job it
  // has not seen announced; the caller waits for finished chunks (done_), never for workers,
  // so a descheduled worker costs nothing once its chunks are taken by others.
  std::atomic<uint64_t> state_{0};
  std::atomic<uint32_t> done_{0};

  std::atomic<bool> stop_{false};
  std::mutex sleep_mu_;
  std::condition_variable wake_;

  static thread_local bool in_parallel_region_;
};

// The process-wide pool used by the kernels. Its size comes from BRAID_NUM_THREADS, else
// OMP_NUM_THREADS, else 1.
ThreadPool& DefaultPool();
// Replaces the default pool. Not safe while kernels are running on another thread; meant for
// start-up, tests and benchmarks.
void SetDefaultPoolThreads(int num_threads);

template <typename Fn>
inline void ParallelFor(int64_t n, int64_t grain, Fn&& fn) {
  DefaultPool().ParallelFor(n, grain, std::forward<Fn>(fn));
}

}  // namespace braid::cpu

#endif  // BRAID_BACKENDS_CPU_THREAD_POOL_H_
