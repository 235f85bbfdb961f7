// Test helpers for the CPU backend's kernel tests: random tensors, tolerant and bitwise
// comparisons, and a parameter set that runs a test under every code path and thread count.
#ifndef BRAID_BACKENDS_CPU_TEST_UTIL_H_
#define BRAID_BACKENDS_CPU_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace braid::cpu::testing {

inline Tensor RandomTensor(const Shape& shape, std::mt19937& rng, float lo = -1.0f,
                           float hi = 1.0f) {
  Tensor t = Tensor::Empty(shape);
  std::uniform_real_distribution<float> dist(lo, hi);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = dist(rng);
  return t;
}

// ids in [0, v); with ignore_every > 0, every so many entries (at random) is -1 instead.
inline Tensor RandomIds(int64_t n, int64_t v, std::mt19937& rng, int ignore_every = 0) {
  Tensor t = Tensor::Empty({n}, DType::kI32);
  std::uniform_int_distribution<int32_t> dist(0, int32_t(v - 1));
  std::uniform_int_distribution<int> coin(0, std::max(ignore_every, 1) - 1);
  int32_t* p = t.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) p[i] = ignore_every > 0 && coin(rng) == 0 ? -1 : dist(rng);
  return t;
}

// |got - want| <= atol + rtol |want| element-wise; reports the worst element. Non-finite
// values must match exactly (NaN matches NaN): kernels are checked on inf and NaN inputs against
// the reference kernels, where a NaN out is the right answer; a NaN or inf on one side only fails.
inline ::testing::AssertionResult AllClose(const Tensor& got, const Tensor& want, float atol,
                                           float rtol) {
  if (got.numel() != want.numel()) {
    return ::testing::AssertionFailure() << "numel " << got.numel() << " vs " << want.numel();
  }
  std::vector<float> g = got.ToFloatVector(), w = want.ToFloatVector();
  int64_t worst = -1, bad = 0;
  double worst_excess = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (!std::isfinite(w[i]) || !std::isfinite(g[i])) {
      bool same = (std::isnan(w[i]) && std::isnan(g[i])) || g[i] == w[i];
      if (!same) {
        ++bad;
        if (worst < 0 || worst_excess < INFINITY) worst = int64_t(i), worst_excess = INFINITY;
      }
      continue;
    }
    double err = std::fabs(double(g[i]) - double(w[i]));
    double tol = double(atol) + double(rtol) * std::fabs(double(w[i]));
    if (err > tol) {
      ++bad;
      if (err - tol > worst_excess || worst < 0) worst = int64_t(i), worst_excess = err - tol;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << g.size() << " elements differ beyond atol=" << atol << " rtol=" << rtol
         << "; worst at " << worst << ": got " << g[size_t(worst)] << ", want " << w[size_t(worst)];
}

inline ::testing::AssertionResult BitEqual(const Tensor& a, const Tensor& b) {
  if (a.nbytes() != b.nbytes() || a.dtype() != b.dtype()) {
    return ::testing::AssertionFailure() << a.DescribeForError() << " vs " << b.DescribeForError();
  }
  const unsigned char* pa = static_cast<const unsigned char*>(a.raw_data());
  const unsigned char* pb = static_cast<const unsigned char*>(b.raw_data());
  for (size_t i = 0; i < a.nbytes(); ++i) {
    if (pa[i] != pb[i]) {
      return ::testing::AssertionFailure()
             << "first differing byte " << i << " (element " << i / SizeOf(a.dtype()) << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

// Bitwise equality of two floats, where any NaN matches any NaN (the CPU and glibc may differ in
// a NaN's sign): for code written to give another path's results bit for bit.
inline ::testing::AssertionResult SameFloatBits(float got, float want) {
  if (std::isnan(got) && std::isnan(want)) return ::testing::AssertionSuccess();
  uint32_t g, w;
  std::memcpy(&g, &got, 4);
  std::memcpy(&w, &want, 4);
  if (g == w) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "got " << got << " (0x" << std::hex << g << "), want "
                                       << want << " (0x" << w << ")";
}

// A fixture for tests against the portable (non-AVX2) paths: SIMD off for the test, on after.
class PortablePathTest : public ::testing::Test {
 protected:
  void SetUp() override { SetSimdEnabled(false); }
  void TearDown() override { SetSimdEnabled(true); }
};

// A kernel-test configuration: AVX2 paths on or off, and the thread count.
struct Config {
  bool simd;
  int threads;
};

inline std::vector<Config> AllConfigs() { return {{true, 1}, {true, 2}, {false, 1}, {false, 2}}; }

inline std::string ConfigName(const ::testing::TestParamInfo<Config>& info) {
  return std::string(info.param.simd ? "Avx2" : "Portable") + "_" +
         std::to_string(info.param.threads) + "Threads";
}

// Fixture that applies the Config before each test and restores defaults after.
class KernelTest : public ::testing::TestWithParam<Config> {
 protected:
  void SetUp() override {
    SetSimdEnabled(GetParam().simd);
    SetNumThreads(GetParam().threads);
  }
  void TearDown() override {
    SetSimdEnabled(true);
    SetNumThreads(1);
  }
  std::mt19937 rng_{12345};
};

// Runs `fn` once with 1 thread and once with `threads`, for the bitwise comparison of the
// outputs it returns; the current SIMD setting is kept.
inline std::pair<std::vector<Tensor>, std::vector<Tensor>> RunWithThreads(
    const std::function<std::vector<Tensor>()>& fn, int threads = 2) {
  SetNumThreads(1);
  std::vector<Tensor> one = fn();
  SetNumThreads(threads);
  std::vector<Tensor> many = fn();
  SetNumThreads(1);
  return {one, many};
}

// Central finite differences of the scalar f at x (perturbing each element of x in place),
// in double on top of float kernels: good to ~1e-3 relative with O(1) values and h = 1e-2.
inline std::vector<double> NumericGrad(Tensor& x, const std::function<double()>& f,
                                       float h = 1e-2f) {
  std::vector<double> g(size_t(x.numel()));
  float* p = x.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float orig = p[i];
    p[i] = orig + h;
    const double up = f();
    p[i] = orig - h;
    const double down = f();
    p[i] = orig;
    g[size_t(i)] = (up - down) / (2.0 * double(h));
  }
  return g;
}

// sum(t * w) in double: a scalar "loss" whose gradient with respect to t is w.
inline double WeightedSum(const Tensor& t, const Tensor& w) {
  std::vector<float> a = t.ToFloatVector(), b = w.ToFloatVector();
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * double(b[i]);
  return s;
}

// |analytic - numeric| <= atol + rtol |numeric| element-wise, and both finite: `>` is false for
// a NaN, and an infinite numeric would make the tolerance infinite.
inline ::testing::AssertionResult GradClose(const Tensor& analytic,
                                            const std::vector<double>& numeric, double atol,
                                            double rtol) {
  std::vector<float> a = analytic.ToFloatVector();
  if (a.size() != numeric.size()) return ::testing::AssertionFailure() << "size mismatch";
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(numeric[i]) ||
        !(std::fabs(a[i] - numeric[i]) <= atol + rtol * std::fabs(numeric[i]))) {
      return ::testing::AssertionFailure() << "gradient element " << i << ": analytic " << a[i]
                                           << ", finite differences " << numeric[i];
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace braid::cpu::testing

#endif  // BRAID_BACKENDS_CPU_TEST_UTIL_H_
