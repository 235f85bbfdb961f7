#include "backends/cpu/thread_pool.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace braid::cpu {
namespace {

// Every index in [0, n) is visited exactly once, by ranges inside [0, n).
void ExpectCoversOnce(ThreadPool& pool, int64_t n, int64_t grain) {
  std::vector<std::atomic<int>> hits(size_t(std::max<int64_t>(n, 0)));
  std::atomic<int> bad_ranges{0};
  pool.ParallelFor(n, grain, [&](int64_t b, int64_t e) {
    if (b < 0 || e > n || b >= e) bad_ranges++;
    for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
  });
  EXPECT_EQ(bad_ranges.load(), 0) << "n=" << n << " grain=" << grain;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(hits[size_t(i)].load(), 1) << "index " << i << " n=" << n << " grain=" << grain;
  }
}

TEST(ThreadPoolTest, CoversEveryIndexOnceForManyShapes) {
  for (int threads : {1, 2, 3, 4}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (int64_t n : {1, 2, 3, 7, 64, 1000, 4097}) {
      for (int64_t grain : {1, 5, 64, 100000}) ExpectCoversOnce(pool, n, grain);
    }
  }
}

TEST(ThreadPoolTest, EmptyRangeCallsNothing) {
  ThreadPool pool(2);
  int calls = 0;
  pool.ParallelFor(0, 1, [&](int64_t, int64_t) { ++calls; });
  pool.ParallelFor(-3, 1, [&](int64_t, int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
}

TEST(ThreadPoolTest, OneThreadRunsInlineAsOneRange) {
  ThreadPool pool(1);
  std::vector<std::pair<int64_t, int64_t>> ranges;
  std::thread::id where;
  pool.ParallelFor(1000, 1, [&](int64_t b, int64_t e) {
    ranges.emplace_back(b, e);
    where = std::this_thread::get_id();
  });
  ASSERT_EQ(ranges.size(), 1u);
  EXPECT_EQ(ranges[0], std::make_pair(int64_t{0}, int64_t{1000}));
  EXPECT_EQ(where, std::this_thread::get_id());
}

TEST(ThreadPoolTest, SmallRangeBelowGrainRunsInline) {
  ThreadPool pool(4);
  int calls = 0;
  std::thread::id where;
  pool.ParallelFor(10, 10, [&](int64_t, int64_t) {
    ++calls;
    where = std::this_thread::get_id();
  });
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(where, std::this_thread::get_id());
}

TEST(ThreadPoolTest, UsesMoreThanOneThreadForLargeRanges) {
  ThreadPool pool(2);
  // Each chunk waits a little so the worker gets a chance to claim one.
  std::vector<std::thread::id> ids(64);
  pool.ParallelFor(64, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      ids[size_t(i)] = std::this_thread::get_id();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  bool other = false;
  for (auto id : ids) other |= id != std::this_thread::get_id();
  EXPECT_TRUE(other) << "no chunk ran on a worker thread";
}

TEST(ThreadPoolTest, NestedCallsRunInlineAndCover) {
  ThreadPool pool(2);
  const int64_t outer = 16, inner = 300;
  std::vector<std::atomic<int>> hits(size_t(outer * inner));
  pool.ParallelFor(outer, 1, [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o) {
      pool.ParallelFor(inner, 1, [&](int64_t ib, int64_t ie) {
        for (int64_t i = ib; i < ie; ++i) hits[size_t(o * inner + i)]++;
      });
    }
  });
  for (auto& h : hits) ASSERT_EQ(h.load(), 1);
}

TEST(ThreadPoolTest, ConcurrentCallersFromSeveralThreadsAllComplete) {
  // As with several cpu:N devices each driven by its own thread.
  ThreadPool pool(2);
  const int kCallers = 3, kRounds = 200, kN = 2000;
  std::vector<int64_t> sums(kCallers, 0);
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int r = 0; r < kRounds; ++r) {
        std::atomic<int64_t> s{0};
        pool.ParallelFor(kN, 16, [&](int64_t b, int64_t e) {
          int64_t local = 0;
          for (int64_t i = b; i < e; ++i) local += i;
          s += local;
        });
        sums[size_t(c)] += s.load();
      }
    });
  }
  for (auto& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) {
    EXPECT_EQ(sums[size_t(c)], int64_t(kRounds) * (int64_t(kN) * (kN - 1) / 2)) << "caller " << c;
  }
}

TEST(ThreadPoolTest, ManyBackToBackJobs) {
  // Exercises the spin/sleep hand-off: jobs separated by pauses longer than the spin.
  ThreadPool pool(3);
  for (int r = 0; r < 50; ++r) {
    ExpectCoversOnce(pool, 97, 1);
    if (r % 10 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

TEST(ThreadPoolTest, DefaultPoolCanBeResized) {
  SetDefaultPoolThreads(3);
  EXPECT_EQ(DefaultPool().num_threads(), 3);
  std::atomic<int64_t> s{0};
  ParallelFor(1000, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) s += i;
  });
  EXPECT_EQ(s.load(), 999 * 1000 / 2);
  SetDefaultPoolThreads(1);
  EXPECT_EQ(DefaultPool().num_threads(), 1);
}

}  // namespace
}  // namespace braid::cpu
