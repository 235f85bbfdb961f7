// The dynamic quantization maps and blockwise (de)quantization (blockwise.h).
//
// Error bound checked here, from the maps' resolution: a value x of a block with absmax A is
// stored as the code nearest to x / A, so |dequantize(quantize(x)) - x| <= A * (gap around x)/2,
// where the gap is between the two codes that bracket x / A. The widest gap of each map is that
// of its top decade, (1 - 0.1) / 2^F with F fraction bits there: 0.9/64 for the signed map
// (m) and 0.9/128 for the unsigned one (v). Hence, per block:
//   signed:   |error| <= 0.9/128 * A = 0.70% of the block's absmax,
//   unsigned: |error| <= 0.9/256 * A = 0.35% of the block's absmax,
// and for the values in the top decade (|x| >= A/10) a relative error <= 7.0% resp. 3.5% of the
// value itself. Values far below A lose relative precision (a value under ~1e-6 A becomes 0):
// that is the dynamic map's trade-off, and why blocks are small.
#include "plugins/adam8bit/blockwise.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "core/testing/compare.h"
#include "gtest/gtest.h"

namespace braid::adam8bit {
namespace {

// Float rounding of x / A and of code * A, relative to A: far below any gap.
constexpr double kSlack = 1e-6;

TEST(QuantMap, SignedIsSortedSymmetricWithZeroAndOne) {
  const QuantMap& m = SignedMap();
  EXPECT_TRUE(m.is_signed);
  ASSERT_EQ(m.code.size(), 256u);
  EXPECT_TRUE(std::is_sorted(m.code.begin(), m.code.end()));
  for (int i = 0; i < 256; ++i) EXPECT_EQ(m.code[i], -m.code[255 - i]) << i;
  EXPECT_EQ(m.code.front(), -1.0f);
  EXPECT_EQ(m.code.back(), 1.0f);
  // +0 and -0 (the all-zero magnitude with either sign): 255 distinct values.
  EXPECT_EQ(m.code[127], 0.0f);
  EXPECT_EQ(m.code[128], 0.0f);
  EXPECT_EQ(std::set<float>(m.code.begin(), m.code.end()).size(), 255u);
  // The smallest non-zero magnitude: exponent 6, no fraction bit left.
  EXPECT_FLOAT_EQ(m.code[129], 1e-6f);
  // Seven decades, 64, 32, ..., 1 codes each: 64 codes in (0.1, 1].
  EXPECT_EQ(std::count_if(m.code.begin(), m.code.end(), [](float c) { return c > 0.1f; }), 64);
}

TEST(QuantMap, UnsignedIsSortedInUnitInterval) {
  const QuantMap& m = UnsignedMap();
  EXPECT_FALSE(m.is_signed);
  ASSERT_EQ(m.code.size(), 256u);
  for (int i = 0; i + 1 < 256; ++i) EXPECT_LT(m.code[i], m.code[i + 1]) << i;  // all distinct
  EXPECT_EQ(m.code.front(), 0.0f);
  EXPECT_EQ(m.code.back(), 1.0f);
  EXPECT_FLOAT_EQ(m.code[1], 1e-7f);
  EXPECT_EQ(std::count_if(m.code.begin(), m.code.end(), [](float c) { return c > 0.1f; }), 128);
}

double WidestGap(const QuantMap& m) {
  double gap = 0;
  for (int i = 0; i + 1 < 256; ++i) gap = std::max(gap, double(m.code[i + 1]) - m.code[i]);
  return gap;
}

TEST(QuantMap, WidestGapIsTheTopDecades) {
  EXPECT_NEAR(WidestGap(SignedMap()), 0.9 / 64, 1e-7);
  EXPECT_NEAR(WidestGap(UnsignedMap()), 0.9 / 128, 1e-7);
}

// The bisection over midpoints finds a nearest code, as a linear scan does.
TEST(QuantMap, NearestCodeIsNearest) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), e(-8.0f, 0.0f);
  for (const QuantMap* m : {&SignedMap(), &UnsignedMap()}) {
    std::vector<float> xs = {0.0f, 1.0f, 1e-6f, 1e-7f, 0.1f, 0.55f};
    if (m->is_signed) xs.insert(xs.end(), {-1.0f, -1e-6f, -0.1f});
    for (int i = 0; i < 20000; ++i) {
      float x = i % 2 ? u(rng) : std::pow(10.0f, e(rng));  // uniform, and log-uniform small
      if (!m->is_signed) x = std::fabs(x);
      xs.push_back(x);
    }
    for (int i = 0; i < 256; ++i) xs.push_back(m->code[i]);  // every code maps to itself
    for (float x : xs) {
      double best = std::numeric_limits<double>::infinity();
      for (float c : m->code) best = std::min(best, std::fabs(double(c) - x));
      const uint8_t q = NearestCode(*m, x);
      EXPECT_EQ(std::fabs(double(m->code[q]) - x), best) << "x " << x << " code " << int(q);
    }
  }
}

// The vectorised search (AVX2, where the CPU has it) picks the same codes as the scalar one,
// midpoints (ties), codes, zeros, NaN and a tail shorter than a vector included.
TEST(QuantMap, QuantizeBlockMatchesScalarSearch) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const QuantMap* m : {&SignedMap(), &UnsignedMap()}) {
    std::vector<float> x;
    for (int i = 0; i < 255; ++i) x.push_back(m->mid[i]);  // absmax will be 1: exact ties
    for (int i = 0; i < 256; ++i) x.push_back(m->code[i]);
    for (int i = 0; i < 1500; ++i) x.push_back(normal(rng) * std::pow(10.0f, float(i % 7) - 6));
    x.push_back(-0.0f);
    if (!m->is_signed) {
      for (float& v : x) v = std::fabs(v);
    }
    x.push_back(1.0f);
    ASSERT_LE(int64_t(x.size()), kBlockSize);
    std::vector<uint8_t> fast(x.size()), slow(x.size());
    for (int64_t n : {int64_t(x.size()), int64_t(x.size()) - 3, int64_t(7)}) {
      EXPECT_EQ(QuantizeBlock(*m, x.data(), n, fast.data()),
                QuantizeBlockScalar(*m, x.data(), n, slow.data()));
      EXPECT_EQ(fast, slow) << "n " << n;
    }
    x[100] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_TRUE(std::isnan(QuantizeBlock(*m, x.data(), int64_t(x.size()), fast.data())));
    QuantizeBlockScalar(*m, x.data(), int64_t(x.size()), slow.data());
    EXPECT_EQ(fast, slow) << "with a NaN";
  }
}

// Random blocks shaped like Adam's moments: m ~ normal with outliers, v = m^2-like (spanning
// many decades), in several blocks of different scales and a short last block.
std::vector<float> Moments(bool second, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> decade(-6.0f, 0.0f);
  std::vector<float> x(static_cast<size_t>(n));
  float scale = 1.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (i % kBlockSize == 0) scale = std::pow(10.0f, decade(rng));  // blocks differ in scale
    float g = normal(rng) * scale;
    if (i % 997 == 0) g *= 30.0f;  // outliers set the absmax
    x[size_t(i)] = second ? g * g : g;
  }
  return x;
}

TEST(Blockwise, ErrorWithinHalfTheLocalGapOfTheBlockAbsmax) {
  const int64_t n = 5 * kBlockSize + 777;  // a partial last block
  for (bool second : {false, true}) {
    const QuantMap& map = second ? UnsignedMap() : SignedMap();
    const double widest = WidestGap(map) / 2;  // 0.9/128 (signed) or 0.9/256 (unsigned)
    std::vector<float> x = Moments(second, n, second ? 7 : 3);
    std::vector<uint8_t> codes(static_cast<size_t>(n));
    std::vector<float> absmax(static_cast<size_t>(NumBlocks(n))), back(static_cast<size_t>(n));
    Quantize(map, x.data(), n, codes.data(), absmax.data());
    Dequantize(map, codes.data(), absmax.data(), n, back.data());
    ASSERT_EQ(absmax.size(), 6u);
    double worst_block = 0, worst_top_relative = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double a = absmax[size_t(i / kBlockSize)], v = x[size_t(i)];
      const double err = std::fabs(double(back[size_t(i)]) - v);
      // The codes bracketing v / a, and half their gap: this element's own bound.
      const double r = v / a;
      const auto hi = std::lower_bound(map.code.begin(), map.code.end(), float(r));
      const double upper = hi == map.code.end() ? 1.0 : *hi;
      const double lower = hi == map.code.begin() ? upper : *(hi - 1);
      EXPECT_LE(err, a * ((upper - lower) / 2 + kSlack)) << "element " << i << " value " << v;
      // testing::Worst: a NaN err would be dropped by std::max (the EXPECT_LE above fails on it
      // too, but the summary bounds below must not read it as 0).
      worst_block = testing::Worst(worst_block, err / a);
      if (std::fabs(v) >= a / 10)
        worst_top_relative = testing::Worst(worst_top_relative, err / std::fabs(v));
    }
    EXPECT_LE(worst_block, widest + kSlack) << (second ? "unsigned" : "signed");
    EXPECT_LE(worst_top_relative, 10 * widest + kSlack) << (second ? "unsigned" : "signed");
    // Each block's largest magnitude is stored exactly (±1 are codes).
    for (int64_t b = 0; b < NumBlocks(n); ++b) {
      float amax = 0, got = 0;
      for (int64_t i = b * kBlockSize; i < std::min(n, (b + 1) * kBlockSize); ++i) {
        if (std::fabs(x[size_t(i)]) > amax) {
          amax = std::fabs(x[size_t(i)]);
          got = std::fabs(back[size_t(i)]);
        }
      }
      EXPECT_EQ(got, amax) << "block " << b;
      EXPECT_EQ(absmax[size_t(b)], amax) << "block " << b;
    }
  }
}

// quantize(dequantize(q)) == q: f32 states saved and loaded again, or handed out to a
// checkpoint and taken back, are bit-identical to what the optimizer held.
TEST(Blockwise, RequantizingDequantizedValuesIsIdentity) {
  const int64_t n = 3 * kBlockSize + 5;
  for (bool second : {false, true}) {
    const QuantMap& map = second ? UnsignedMap() : SignedMap();
    std::vector<float> x = Moments(second, n, 11);
    std::vector<uint8_t> codes(static_cast<size_t>(n)), codes2(static_cast<size_t>(n));
    std::vector<float> absmax(static_cast<size_t>(NumBlocks(n))), absmax2(absmax.size()),
        back(static_cast<size_t>(n));
    Quantize(map, x.data(), n, codes.data(), absmax.data());
    Dequantize(map, codes.data(), absmax.data(), n, back.data());
    Quantize(map, back.data(), n, codes2.data(), absmax2.data());
    EXPECT_EQ(absmax, absmax2);
    // Codes may differ only between +0 and -0 (the same value).
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_EQ(map.code[codes[size_t(i)]], map.code[codes2[size_t(i)]]) << i;
    }
  }
}

TEST(Blockwise, ZeroBlockAndNaN) {
  std::vector<float> zeros(100, 0.0f), out(100, 1.0f);
  std::vector<uint8_t> codes(100);
  EXPECT_EQ(QuantizeBlock(SignedMap(), zeros.data(), 100, codes.data()), 0.0f);
  DequantizeBlock(SignedMap(), codes.data(), 0.0f, 100, out.data());
  for (float v : out) EXPECT_EQ(v, 0.0f);
  // A NaN makes the whole block NaN, so a diverged state stays visible.
  std::vector<float> x(100, 0.5f);
  x[42] = std::numeric_limits<float>::quiet_NaN();
  const float a = QuantizeBlock(SignedMap(), x.data(), 100, codes.data());
  EXPECT_TRUE(std::isnan(a));
  DequantizeBlock(SignedMap(), codes.data(), a, 100, out.data());
  EXPECT_TRUE(std::isnan(out[0]));
}

}  // namespace
}  // namespace braid::adam8bit
