// Timing of one kernel call for the kernel-sum benchmarks (gemm_bench, llama_kernel_bench), so
// both measure a kernel the same way.
#ifndef BRAID_TOOLS_BENCH_KERNEL_TIMING_H_
#define BRAID_TOOLS_BENCH_KERNEL_TIMING_H_

#include <algorithm>
#include <chrono>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

namespace braid::bench {

// What Time() measures. kWall: elapsed time. kCpu: CPU time of the whole process (all its
// threads; the same as elapsed time at one thread when the core is not shared). On a machine
// where other jobs take the cores, elapsed time swings with their load between one measurement and
// the next, so a trainer's step and its kernel sum taken minutes apart do not compare; CPU time
// leaves out the time the process waited for a core (cache sharing still moves it a little).
enum class Clock { kWall, kCpu };

// Set once by a benchmark's main (its --clock flag); every Time() call then uses it.
inline Clock& TimingClock() {
  static Clock clock = Clock::kWall;
  return clock;
}

// The --clock flag's value: "wall" or "cpu"; false for anything else (the caller names the flag).
inline bool SetTimingClock(const std::string& name) {
  if (name != "wall" && name != "cpu") return false;
  TimingClock() = name == "cpu" ? Clock::kCpu : Clock::kWall;
  return true;
}

inline double Now(Clock clock) {
  if (clock == Clock::kWall) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

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
    const double t0 = Now(TimingClock());
    fn();
    t.push_back(Now(TimingClock()) - t0);
  }
  std::sort(t.begin(), t.end());
  return {t[t.size() / 2], t[0]};
}

}  // namespace braid::bench

#endif  // BRAID_TOOLS_BENCH_KERNEL_TIMING_H_
