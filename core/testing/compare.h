// The distances that tests compare against a tolerance (or against 0), made so that NaN and
// infinity fail them. Every comparison with NaN is false, so a hand-rolled
// `worst = std::max(worst, d)` or `if (d > worst)` silently drops a NaN d, and
// `EXPECT_EQ(worst, 0.0)` then passes on NaN weights. These return +infinity instead, which fails
// `EXPECT_LE(d, tol)`, `EXPECT_LT(d, tol)` and `EXPECT_EQ(d, 0.0)` alike and prints plainly.
//
// No dependencies (plain vectors): a test of a Tensor passes t.ToFloatVector().
#ifndef BRAID_CORE_TESTING_COMPARE_H_
#define BRAID_CORE_TESTING_COMPARE_H_

#include <vector>

namespace braid::testing {

// max_i |a[i] - b[i]| (in double). +infinity when the sizes differ or any value of either side is
// NaN or infinite: two runs that both diverged to the same inf are not "equal" for a test. 0 for
// two empty vectors.
double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b);

// max_i |a[i] - b[i]| / max(floor, max_i |b[i]|): the difference relative to the largest magnitude
// of b (the reference), a scale-free rounding measure. The floor keeps a tensor near zero from
// turning rounding noise into a large ratio (floor 1: absolute below 1, relative above); with
// floor 0 and b all zeros it is the absolute difference. +infinity exactly when MaxAbsDiff is.
double MaxRelDiff(const std::vector<float>& a, const std::vector<float>& b, double floor = 1);

// max(so_far, d) for folding per-element or per-step distances computed by hand: a NaN d (as
// |x - y| is when x or y is NaN, or both are inf) makes the result +infinity rather than being
// dropped as std::max drops it.
double Worst(double so_far, double d);

}  // namespace braid::testing

#endif  // BRAID_CORE_TESTING_COMPARE_H_
