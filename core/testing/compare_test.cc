// The comparison helpers fail on a planted NaN or inf, on either side and anywhere in the vector
// (first, middle, last: a hand-rolled std::max loop drops a NaN wherever it sits), and still
// measure ordinary differences exactly.
#include "core/testing/compare.h"

#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "core/testing/equivalence.h"
#include "gtest/gtest.h"

namespace braid::testing {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Every non-finite value planted at every position of one side of `base` (against `base`).
struct Planted {
  std::vector<float> bad;
  std::string what;
};
std::vector<Planted> PlantEach(const std::vector<float>& base) {
  std::vector<Planted> out;
  for (float v : {kNaN, kInf, -kInf}) {
    for (size_t i : {size_t(0), base.size() / 2, base.size() - 1}) {
      std::vector<float> bad = base;
      bad[i] = v;
      out.push_back({bad, std::to_string(v) + " at " + std::to_string(i)});
    }
  }
  return out;
}

const std::vector<float> kBase = {0.5f, -2.0f, 3.0f, 0.25f, -1.0f};

TEST(Compare, MaxAbsDiffMeasuresOrdinaryValues) {
  EXPECT_EQ(MaxAbsDiff(kBase, kBase), 0.0);
  std::vector<float> moved = kBase;
  moved[2] += 0.5f;
  moved[4] -= 0.25f;
  EXPECT_EQ(MaxAbsDiff(moved, kBase), 0.5);
  EXPECT_EQ(MaxAbsDiff(kBase, moved), 0.5);
  EXPECT_EQ(MaxAbsDiff({}, {}), 0.0);
}

TEST(Compare, MaxAbsDiffIsInfiniteOnNanOrInfOnEitherSide) {
  for (const Planted& p : PlantEach(kBase)) {
    EXPECT_EQ(MaxAbsDiff(p.bad, kBase), INFINITY) << p.what << " in a";
    EXPECT_EQ(MaxAbsDiff(kBase, p.bad), INFINITY) << p.what << " in b";
    // The same non-finite value on both sides is not agreement.
    EXPECT_EQ(MaxAbsDiff(p.bad, p.bad), INFINITY) << p.what << " in both";
    // What a test writes with it fails.
    EXPECT_FALSE(MaxAbsDiff(p.bad, kBase) <= 1e30) << p.what;
    EXPECT_NE(MaxAbsDiff(p.bad, kBase), 0.0) << p.what;
  }
}

TEST(Compare, MaxAbsDiffIsInfiniteOnSizesThatDiffer) {
  EXPECT_EQ(MaxAbsDiff(kBase, {0.5f, -2.0f}), INFINITY);
  EXPECT_EQ(MaxAbsDiff({}, {1.0f}), INFINITY);
}

TEST(Compare, MaxRelDiffScalesByTheLargestReferenceMagnitudeAboveTheFloor) {
  std::vector<float> moved = kBase;
  moved[0] += 0.75f;
  EXPECT_EQ(MaxRelDiff(moved, kBase), 0.25);  // max |b| = 3 is above the floor 1
  const std::vector<float> small = {0.125f, -0.25f}, small_moved = {0.125f, 0.0f};
  EXPECT_EQ(MaxRelDiff(small_moved, small), 0.25);     // floor 1: absolute
  EXPECT_EQ(MaxRelDiff(small_moved, small, 0), 1.0);   // floor 0: relative to 0.25
  EXPECT_EQ(MaxRelDiff({0.5f}, {0.0f}, 0), 0.5);       // all zeros: absolute
  EXPECT_EQ(MaxRelDiff(kBase, kBase), 0.0);
}

TEST(Compare, MaxRelDiffIsInfiniteOnNanOrInfOnEitherSide) {
  for (const Planted& p : PlantEach(kBase)) {
    for (double floor : {0.0, 1.0}) {
      // An inf in the reference would otherwise scale every difference to 0 (or inf/inf, NaN).
      EXPECT_EQ(MaxRelDiff(p.bad, kBase, floor), INFINITY) << p.what << " in a";
      EXPECT_EQ(MaxRelDiff(kBase, p.bad, floor), INFINITY) << p.what << " in b";
      EXPECT_EQ(MaxRelDiff(p.bad, p.bad, floor), INFINITY) << p.what << " in both";
    }
  }
  EXPECT_EQ(MaxRelDiff(kBase, {1.0f}), INFINITY);
}

TEST(Compare, WorstKeepsTheLargestAndTurnsNanIntoInfinity) {
  EXPECT_EQ(Worst(0.5, 0.25), 0.5);
  EXPECT_EQ(Worst(0.25, 0.5), 0.5);
  EXPECT_EQ(Worst(0.5, INFINITY), INFINITY);
  EXPECT_EQ(Worst(0.5, NAN), INFINITY);  // std::max(0.5, NaN) is 0.5
  EXPECT_EQ(Worst(NAN, 0.5), INFINITY);
  // A fold over per-element differences where one element is NaN, wherever it is.
  for (const Planted& p : PlantEach(kBase)) {
    double worst = 0;
    for (size_t i = 0; i < kBase.size(); ++i) worst = Worst(worst, std::fabs(p.bad[i] - kBase[i]));
    EXPECT_EQ(worst, INFINITY) << p.what;
  }
}

// equivalence.h's state-dict distance, which the strategies' equivalence tests compare with 0 or
// a tolerance, reports infinity and names the tensor that holds the NaN or inf.
TEST(Compare, MaxRelativeDifferenceOfStateDictsIsInfiniteOnNanOrInf) {
  const std::map<std::string, Tensor> want = {
      {"a.weight", Tensor::FromVector(kBase, {5})},
      {"b.weight", Tensor::FromVector(std::vector<float>{1.0f, 2.0f}, {2})}};
  std::string worst;
  EXPECT_EQ(MaxRelativeDifference(want, want, &worst), 0.0);
  for (float v : {kNaN, kInf}) {
    std::map<std::string, Tensor> bad = want;
    bad["b.weight"] = Tensor::FromVector(std::vector<float>{1.0f, v}, {2});
    worst.clear();
    EXPECT_EQ(MaxRelativeDifference(bad, want, &worst), INFINITY) << v << " in got";
    EXPECT_EQ(worst, "b.weight");
    worst.clear();
    EXPECT_EQ(MaxRelativeDifference(want, bad, &worst), INFINITY) << v << " in want";
    EXPECT_EQ(worst, "b.weight");
  }
}

}  // namespace
}  // namespace braid::testing
