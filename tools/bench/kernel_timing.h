// Timing of one kernel call for the kernel-sum benchmarks (gemm_bench, llama_kernel_bench), so
// both measure a kernel the same way.
#ifndef BRAID_TOOLS_BENCH_KERNEL_TIMING_H_
#define BRAID_TOOLS_BENCH_KERNEL_TIMING_H_

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace braid::bench {

struct Timing {
  double median, best;  // seconds
};

// Median and fastest of reps timed runs, after two warm-up runs. On a shared machine the
// fastest run is the better estimate of what the code can do; the median is what it did.
inline Timing Time(const std::function<void()>& fn, int reps) {
  fn();
  fn();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return {t[t.size() / 2], t[0]};
}

}  // namespace braid::bench

#endif  // BRAID_TOOLS_BENCH_KERNEL_TIMING_H_
