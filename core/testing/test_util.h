// Helpers for tests of ops, models and backends: seeded random tensors, closeness checks and a
// finite-difference gradient check.
#ifndef BRAID_CORE_TESTING_TEST_UTIL_H_
#define BRAID_CORE_TESTING_TEST_UTIL_H_

#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "core/tensor.h"
#include "gtest/gtest.h"

namespace braid::test {

// Uniform values in [lo, hi) on `device`.
Tensor RandomTensor(const Shape& shape, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f,
                    Device device = Device::CPU());
// Like RandomTensor, but every value has magnitude >= min_abs (keeps clear of kinks such as
// Relu's at 0, where finite differences are meaningless).
Tensor RandomTensorAwayFromZero(const Shape& shape, std::mt19937& rng, float min_abs,
                                float max_abs = 1.0f);

std::vector<double> ToDoubles(const Tensor& t);

// Passes when |got[i] - want[i]| <= atol + rtol * |want[i]| for every i (and sizes match); the
// failure message names the worst element.
::testing::AssertionResult AllClose(const std::vector<float>& got, const std::vector<double>& want,
                                    double rtol, double atol);
::testing::AssertionResult AllClose(const Tensor& got, const std::vector<double>& want,
                                    double rtol, double atol);

struct GradCheckOptions {
  float eps = 1e-2f;    // central-difference step, in the input's units
  double rtol = 1e-2;   // relative to max(|analytic|, |numeric|)
  double atol = 1e-3;
  uint32_t seed = 1234;  // for the random projection of the output
  // Fail when an input that requires grad gets an all-zero gradient: a check that compares zero
  // with zero proves nothing.
  bool require_nonzero = true;
};

// Checks d/d(inputs) of L = sum(fn(inputs) * R), R a fixed random tensor of the output's shape,
// computed by autograd against central differences of L (computed in double from fn's outputs
// under no-grad). Only f32 inputs that require grad are checked (they must be on the CPU); their
// .grad is cleared first and left holding the analytic gradient.
::testing::AssertionResult GradCheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                                     const std::vector<Tensor>& inputs,
                                     const GradCheckOptions& opts = {});

}  // namespace braid::test

#endif  // BRAID_CORE_TESTING_TEST_UTIL_H_
