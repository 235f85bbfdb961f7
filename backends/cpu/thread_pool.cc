#include "backends/cpu/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>

#include "core/check.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define BRAID_CPU_RELAX() _mm_pause()
#else
#define BRAID_CPU_RELAX() std::this_thread::yield()
#endif

namespace braid::cpu {

thread_local bool ThreadPool::in_parallel_region_ = false;

namespace {

// How long a worker spins on the job counter before sleeping. Kernels come in quick succession
// during a training step, so a short spin saves a futex wake-up per kernel; it stays short
// because on a 2-core machine a spinning worker competes with OpenBLAS's threads.
constexpr auto kSpin = std::chrono::microseconds(50);

}  // namespace

ThreadPool::ThreadPool(int num_threads) : num_threads_(std::max(1, num_threads)) {
  BRAID_CHECK(num_threads_ <= 4096)
      << "thread pool of " << num_threads << " threads: at most 4096 are supported";
  workers_.reserve(size_t(num_threads_ - 1));
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(sleep_mu_);
    stop_.store(true);
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

namespace {
constexpr uint32_t JobOf(uint64_t state) { return uint32_t(state >> 32); }
constexpr uint32_t ChunksOf(uint64_t state) { return uint32_t(state >> 16) & 0xffffu; }
constexpr uint32_t NextOf(uint64_t state) { return uint32_t(state) & 0xffffu; }
}  // namespace

void ThreadPool::DrainChunks(uint32_t job) {
  uint64_t s = state_.load(std::memory_order_acquire);
  for (;;) {
    if (JobOf(s) != job || NextOf(s) >= ChunksOf(s)) return;
    if (!state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel,
                                      std::memory_order_acquire)) {
      continue;  // s now holds the current state
    }
    // The chunk is ours, so the job's fields stay as published until we report it done.
    const int64_t b = int64_t(NextOf(s)) * chunk_;
    call_(ctx_, b, std::min(n_, b + chunk_));
    done_.fetch_add(1, std::memory_order_release);
    s = state_.load(std::memory_order_acquire);
  }
}

void ThreadPool::Run(int64_t n, int64_t grain, Trampoline call, void* ctx) {
  std::unique_lock<std::mutex> run(run_mu_, std::try_to_lock);
  if (!run.owns_lock()) {
    // Another thread (another cpu:N device) owns the workers: do this loop alone.
    in_parallel_region_ = true;
    call(ctx, 0, n);
    in_parallel_region_ = false;
    return;
  }
  // About four chunks per thread balances a noisy machine without much claiming traffic
  // (and keeps the chunk count within its 16 bits).
  const int64_t chunk = std::max<int64_t>(std::max<int64_t>(grain, 1),
                                          (n + 4 * num_threads_ - 1) / (4 * num_threads_));
  const uint32_t chunks = uint32_t((n + chunk - 1) / chunk);
  call_ = call;
  ctx_ = ctx;
  n_ = n;
  chunk_ = chunk;
  done_.store(0, std::memory_order_relaxed);
  const uint32_t job = JobOf(state_.load(std::memory_order_relaxed)) + 1;
  {
    std::lock_guard<std::mutex> lk(sleep_mu_);
    state_.store((uint64_t(job) << 32) | (uint64_t(chunks) << 16), std::memory_order_release);
  }
  wake_.notify_all();

  in_parallel_region_ = true;
  DrainChunks(job);
  in_parallel_region_ = false;
  // Chunks taken by workers may still be running: spin briefly, then yield in case one of
  // them needs this core (an oversubscribed machine).
  for (int i = 0; done_.load(std::memory_order_acquire) != chunks; ++i) {
    if (i < 4096) {
      BRAID_CPU_RELAX();
    } else {
      std::this_thread::yield();
    }
  }
}

void ThreadPool::WorkerLoop() {
  in_parallel_region_ = true;
  uint32_t seen = 0;  // job 0 is the state at construction: no work
  for (;;) {
    uint32_t job = JobOf(state_.load(std::memory_order_acquire));
    if (job == seen && !stop_.load(std::memory_order_relaxed)) {
      auto until = std::chrono::steady_clock::now() + kSpin;
      for (int i = 0; job == seen; ++i) {
        BRAID_CPU_RELAX();
        job = JobOf(state_.load(std::memory_order_acquire));
        if ((i & 63) == 63 && std::chrono::steady_clock::now() > until) break;
      }
      if (job == seen) {
        std::unique_lock<std::mutex> lk(sleep_mu_);
        wake_.wait(lk, [&] {
          return stop_.load() || JobOf(state_.load(std::memory_order_acquire)) != seen;
        });
        job = JobOf(state_.load(std::memory_order_acquire));
      }
    }
    if (stop_.load()) return;
    seen = job;
    DrainChunks(job);
  }
}

namespace {

int ThreadsFromEnv() {
  for (const char* name : {"BRAID_NUM_THREADS", "OMP_NUM_THREADS"}) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') continue;
    char* end = nullptr;
    long n = std::strtol(v, &end, 10);
    BRAID_CHECK(end != v && *end == '\0' && n >= 1 && n <= 1024)
        << name << "='" << v << "' is not a thread count: set it to an integer in [1, 1024]";
    return int(n);
  }
  return 1;
}

std::atomic<ThreadPool*> g_pool{nullptr};
std::mutex g_pool_mu;

}  // namespace

ThreadPool& DefaultPool() {
  ThreadPool* p = g_pool.load(std::memory_order_acquire);
  if (__builtin_expect(p != nullptr, 1)) return *p;
  std::lock_guard<std::mutex> lk(g_pool_mu);
  p = g_pool.load(std::memory_order_acquire);
  if (p == nullptr) {
    p = new ThreadPool(ThreadsFromEnv());
    g_pool.store(p, std::memory_order_release);
  }
  return *p;
}

void SetDefaultPoolThreads(int num_threads) {
  std::lock_guard<std::mutex> lk(g_pool_mu);
  ThreadPool* old = g_pool.exchange(new ThreadPool(num_threads), std::memory_order_acq_rel);
  delete old;
}

}  // namespace braid::cpu
