// The kernel tests' comparisons (test_util.h) fail on a NaN or inf on one side, wherever it is,
// and GradClose on one on either side; AllClose still matches the same NaN or inf on both sides,
// which is the right answer for a kernel given inf or NaN inputs.
#include "backends/cpu/test_util.h"

#include <cstdint>
#include <limits>
#include <vector>

#include "core/tensor.h"
#include "gtest/gtest.h"

namespace braid::cpu::testing {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
const std::vector<float> kBase = {0.5f, -2.0f, 3.0f};

Tensor Of(const std::vector<float>& v) { return Tensor::FromVector(v, {int64_t(v.size())}); }

TEST(CpuTestUtil, AllCloseFailsOnNanOrInfOnOneSide) {
  EXPECT_TRUE(AllClose(Of(kBase), Of(kBase), 1e-6f, 1e-6f));
  for (float v : {kNaN, kInf, -kInf}) {
    for (size_t i = 0; i < kBase.size(); ++i) {
      std::vector<float> bad = kBase;
      bad[i] = v;
      EXPECT_FALSE(AllClose(Of(bad), Of(kBase), 1e-6f, 1e-6f)) << v << " in got at " << i;
      EXPECT_FALSE(AllClose(Of(kBase), Of(bad), 1e-6f, 1e-6f)) << v << " in want at " << i;
      EXPECT_TRUE(AllClose(Of(bad), Of(bad), 1e-6f, 1e-6f)) << v << " on both sides at " << i;
    }
  }
  EXPECT_FALSE(AllClose(Of({kNaN}), Of({kInf}), 1e-6f, 1e-6f));
  EXPECT_FALSE(AllClose(Of({kInf}), Of({-kInf}), 1e-6f, 1e-6f));
}

TEST(CpuTestUtil, GradCloseFailsOnNanOrInfOnEitherSide) {
  const std::vector<double> numeric(kBase.begin(), kBase.end());
  EXPECT_TRUE(GradClose(Of(kBase), numeric, 1e-6, 1e-6));
  for (float v : {kNaN, kInf, -kInf}) {
    for (size_t i = 0; i < kBase.size(); ++i) {
      std::vector<float> bad = kBase;
      bad[i] = v;
      std::vector<double> bad_numeric = numeric;
      bad_numeric[i] = v;
      EXPECT_FALSE(GradClose(Of(bad), numeric, 1e-6, 1e-6)) << v << " analytic at " << i;
      // An infinite numeric gradient would make the relative tolerance infinite.
      EXPECT_FALSE(GradClose(Of(kBase), bad_numeric, 1e-6, 1e-6)) << v << " numeric at " << i;
      EXPECT_FALSE(GradClose(Of(bad), bad_numeric, 1e-6, 1e-6)) << v << " both at " << i;
    }
  }
}

}  // namespace
}  // namespace braid::cpu::testing
