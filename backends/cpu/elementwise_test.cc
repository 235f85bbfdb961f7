// copy/fill/binary/unary/unary_backward/axpby/sum_all/sum_rows against the reference kernels.
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/test_util.h"
#include "core/dtype.h"
#include "core/kernels.h"
#include "core/testing/reference_kernels.h"
#include "gtest/gtest.h"

namespace braid::cpu {
namespace {

using kernels::BinaryOp;
using kernels::UnaryOp;
using testing::AllClose;
using testing::BitEqual;
using testing::KernelTest;
using testing::RandomTensor;

const Device kCpu = Device::CPU();

// Sizes around the vector width, the unroll factors and the parallel grain (32768).
const std::vector<int64_t> kSizes = {1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 100, 1001, 70001};

// ---- dtype conversion: exact against core/dtype.h --------------------------------------------

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Floats that stress rounding: specials, the edges of the f16/bf16 ranges, halfway cases,
// subnormals of both formats, and random bit patterns (NaNs with payloads included).
std::vector<float> ConversionInputs(std::mt19937& rng) {
  std::vector<float> v = {0.0f,
                          -0.0f,
                          1.0f,
                          -1.0f,
                          65504.0f,
                          65519.0f,
                          65520.0f,
                          65536.0f,
                          -65520.0f,
                          1e-8f,
                          5.96e-8f,
                          2.98e-8f,
                          2.99e-8f,
                          6.1e-5f,
                          6.104e-5f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::denorm_min(),
                          std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::min(),
                          FromBits(0x7f800001u),
                          FromBits(0xffc12345u),
                          FromBits(0x7fbfffffu),
                          FromBits(0x3f808000u),
                          FromBits(0x3f818000u),
                          FromBits(0x3f807fffu),
                          FromBits(0x7f7f8000u),
                          FromBits(0x7f7fffffu)};
  // Exact halfway points for f16 rounding around 1 and in the subnormal range.
  for (uint32_t m = 0; m < 64; ++m) v.push_back(FromBits(0x3f800000u | (m << 12) | 0x1000u));
  for (uint32_t k = 0; k < 64; ++k) v.push_back(std::ldexp(float(k) + 0.5f, -24));
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) v.push_back(FromBits(bits(rng)));
  // Dense sweep through the f16 range.
  for (uint32_t u = 0x33000000u; u < 0x47800000u; u += 0x1f3u) v.push_back(FromBits(u));
  return v;
}

class CopyTest : public KernelTest {};

TEST_P(CopyTest, F32ToBF16AndF16AreExact) {
  std::vector<float> in = ConversionInputs(rng_);
  Tensor src = Tensor::FromVector(in, {int64_t(in.size())});
  for (DType dt : {DType::kBF16, DType::kF16}) {
    Tensor dst = Tensor::Empty(src.shape(), dt);
    kernels::copy.Get(kCpu)(src, dst);
    const uint16_t* d = static_cast<const uint16_t*>(dst.raw_data());
    for (size_t i = 0; i < in.size(); ++i) {
      uint16_t want = dt == DType::kBF16 ? FloatToBF16(in[i]) : FloatToF16(in[i]);
      ASSERT_EQ(d[i], want) << DTypeName(dt) << " of bits 0x" << std::hex << Bits(in[i]);
    }
  }
}

TEST_P(CopyTest, AllSixteenBitPatternsToF32AreExact) {
  std::vector<uint16_t> all(65536);
  for (int i = 0; i < 65536; ++i) all[size_t(i)] = uint16_t(i);
  for (DType st : {DType::kBF16, DType::kF16}) {
    Tensor src = Tensor::Empty({65536}, st);
    std::memcpy(src.raw_data(), all.data(), all.size() * 2);
    Tensor dst = Tensor::Empty({65536}, DType::kF32);
    kernels::copy.Get(kCpu)(src, dst);
    const float* d = dst.data<float>();
    for (int i = 0; i < 65536; ++i) {
      float want = st == DType::kBF16 ? BF16ToFloat(uint16_t(i)) : F16ToFloat(uint16_t(i));
      ASSERT_EQ(Bits(d[i]), Bits(want)) << DTypeName(st) << " 0x" << std::hex << i;
    }
  }
}

TEST_P(CopyTest, MisalignedViewsAndOddSizesMatchReference) {
  const std::vector<DType> types = {DType::kF32, DType::kBF16, DType::kF16, DType::kI32,
                                    DType::kI64, DType::kU8,   DType::kI8};
  for (int64_t n : {1, 5, 8, 13, 1001}) {
    // Non-negative and below 128 so every integer conversion is defined.
    Tensor base = RandomTensor({n + 3}, rng_, 0.0f, 127.0f);
    for (DType st : types) {
      Tensor src_full = Tensor::Empty({n + 3}, st);
      reference::copy(base, src_full);
      Tensor src = src_full.FlatRange(3, n);  // offset 3 elements: misaligned
      for (DType dt : types) {
        Tensor got_full = Tensor::Zeros({n + 1}, dt), want = Tensor::Zeros({n}, dt);
        Tensor got = got_full.FlatRange(1, n);
        kernels::copy.Get(kCpu)(src, got);
        reference::copy(src, want);
        EXPECT_TRUE(BitEqual(got, want)) << DTypeName(st) << " -> " << DTypeName(dt) << " n=" << n;
      }
    }
  }
}

TEST_P(CopyTest, LargeCopiesAreThreadCountIndependent) {
  Tensor src = RandomTensor({300007}, rng_, -70000.0f, 70000.0f);
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    auto [one, two] = testing::RunWithThreads([&] {
      Tensor d = Tensor::Empty(src.shape(), dt);
      kernels::copy.Get(kCpu)(src, d);
      Tensor back = Tensor::Empty(src.shape(), DType::kF32);
      kernels::copy.Get(kCpu)(d, back);
      return std::vector<Tensor>{d, back};
    });
    for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(BitEqual(one[i], two[i]));
    Tensor want = Tensor::Empty(src.shape(), dt);
    reference::copy(src, want);
    EXPECT_TRUE(BitEqual(one[0], want)) << DTypeName(dt);
  }
}

TEST_P(CopyTest, BF16ToF16ThroughFloat) {
  Tensor base = RandomTensor({2049}, rng_, -1000.0f, 1000.0f);
  Tensor b16 = Tensor::Empty({2049}, DType::kBF16);
  reference::copy(base, b16);
  Tensor got = Tensor::Empty({2049}, DType::kF16), want = Tensor::Empty({2049}, DType::kF16);
  kernels::copy.Get(kCpu)(b16, got);
  reference::copy(b16, want);
  EXPECT_TRUE(BitEqual(got, want));
}

TEST_P(CopyTest, FillMatchesReferenceForEveryDType) {
  for (DType dt :
       {DType::kF32, DType::kBF16, DType::kF16, DType::kI32, DType::kI64, DType::kU8, DType::kI8}) {
    for (float value : {0.0f, 1.0f, -2.5f, 3.14159f, 100.7f, 65519.0f}) {
      for (int64_t n : {1, 9, 100003}) {
        Tensor got = Tensor::Empty({n}, dt), want = Tensor::Empty({n}, dt);
        kernels::fill.Get(kCpu)(got, value);
        reference::fill(want, value);
        EXPECT_TRUE(BitEqual(got, want)) << DTypeName(dt) << " value " << value << " n=" << n;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, CopyTest, ::testing::ValuesIn(testing::AllConfigs()),
                         testing::ConfigName);

// ---- binary ----------------------------------------------------------------------------------

class BinaryTest : public KernelTest {};

TEST_P(BinaryTest, SameShapeRowAndScalarBroadcastAreExact) {
  // Float +, -, *, / are correctly rounded, as is the reference's double result rounded to
  // float: so the results must be identical.
  std::vector<std::pair<int64_t, int64_t>> cases;  // (numel of a, numel of b)
  for (int64_t n : kSizes) {
    cases.emplace_back(n, n);
    cases.emplace_back(n, 1);
  }
  // Row broadcasts, including more rows than one parallel chunk holds.
  for (auto nc : {std::pair<int64_t, int64_t>{9, 3},
                  {64, 8},
                  {17 * 5, 17},
                  {64 * 3, 64},
                  {71 * 997, 71},
                  {2048 * 256, 256}}) {
    cases.push_back(nc);
  }
  for (BinaryOp op : {BinaryOp::kAdd, BinaryOp::kSub, BinaryOp::kMul, BinaryOp::kDiv}) {
    for (auto [n, nb] : cases) {
      {
        Tensor a = RandomTensor({n}, rng_), b = RandomTensor({nb}, rng_, 0.5f, 2.0f);
        Tensor got = Tensor::Empty({n}), want = Tensor::Empty({n});
        kernels::binary.Get(kCpu)(op, a, b, got);
        reference::binary(op, a, b, want);
        EXPECT_TRUE(BitEqual(got, want)) << "op " << int(op) << " n=" << n << " nb=" << nb;
      }
    }
  }
}

TEST_P(BinaryTest, OutputMayAliasA) {
  Tensor a = RandomTensor({4, 33}, rng_), b = RandomTensor({33}, rng_);
  Tensor want = Tensor::Empty({4, 33});
  reference::binary(BinaryOp::kAdd, a, b, want);
  kernels::binary.Get(kCpu)(BinaryOp::kAdd, a, b, a);
  EXPECT_TRUE(BitEqual(a, want));
}

TEST_P(BinaryTest, ThreadCountIndependent) {
  Tensor a = RandomTensor({700, 257}, rng_), b = RandomTensor({257}, rng_);
  auto [one, two] = testing::RunWithThreads([&] {
    Tensor o1 = Tensor::Empty(a.shape()), o2 = Tensor::Empty(a.shape());
    kernels::binary.Get(kCpu)(BinaryOp::kSub, a, b, o1);
    kernels::binary.Get(kCpu)(BinaryOp::kDiv, a, a, o2);
    return std::vector<Tensor>{o1, o2};
  });
  EXPECT_TRUE(BitEqual(one[0], two[0]));
  EXPECT_TRUE(BitEqual(one[1], two[1]));
}

INSTANTIATE_TEST_SUITE_P(Configs, BinaryTest, ::testing::ValuesIn(testing::AllConfigs()),
                         testing::ConfigName);

// ---- unary and its backward ------------------------------------------------------------------

struct UnaryCase {
  UnaryOp op;
  const char* name;
  float lo, hi;        // input range
  float atol, rtol;    // forward tolerance
  float batol, brtol;  // backward tolerance
};

// The exact ops must match bit for bit (atol = rtol = 0). The transcendental ones use Braid's
// own vector exp/log/tanh (~2 ulp), hence the small relative tolerances; GELU's derivative
// multiplies tanh's absolute error (~1e-7) by x * du (up to ~20 on [-6, 6]).
const UnaryCase kUnaryCases[] = {
    {UnaryOp::kScale, "scale", -10, 10, 0, 0, 0, 0},
    {UnaryOp::kAddScalar, "add_scalar", -10, 10, 0, 0, 0, 0},
    {UnaryOp::kRelu, "relu", -2, 2, 0, 0, 0, 0},
    {UnaryOp::kNeg, "neg", -3, 3, 0, 0, 0, 0},
    {UnaryOp::kSquare, "square", -3, 3, 0, 0, 0, 0},
    {UnaryOp::kSqrt, "sqrt", 0, 100, 0, 0, 1e-7f, 1e-6f},
    {UnaryOp::kExp, "exp", -80, 80, 0, 1e-6f, 0, 1e-6f},
    {UnaryOp::kLog, "log", 1e-30f, 1e30f, 1e-6f, 1e-6f, 0, 1e-7f},
    {UnaryOp::kTanh, "tanh", -6, 6, 1e-7f, 1e-6f, 2e-7f, 1e-5f},
    {UnaryOp::kGeluTanh, "gelu", -6, 6, 1e-6f, 1e-6f, 2e-6f, 1e-5f},
    {UnaryOp::kGeluTanh, "gelu_wide", -40, 40, 1e-6f, 1e-6f, 2e-6f, 1e-5f},
    {UnaryOp::kTanh, "tanh_wide", -60, 60, 1e-7f, 1e-6f, 2e-7f, 1e-5f},
    {UnaryOp::kExp, "exp_small", -1, 1, 0, 1e-6f, 0, 1e-6f},
};

class UnaryTest : public KernelTest {};

TEST_P(UnaryTest, ForwardMatchesReference) {
  for (const UnaryCase& c : kUnaryCases) {
    for (int64_t n : kSizes) {
      Tensor a = RandomTensor({n}, rng_, c.lo, c.hi);
      Tensor got = Tensor::Empty({n}), want = Tensor::Empty({n});
      kernels::unary.Get(kCpu)(c.op, a, 1.7f, got);
      reference::unary(c.op, a, 1.7f, want);
      EXPECT_TRUE(AllClose(got, want, c.atol, c.rtol)) << c.name << " n=" << n;
    }
  }
}

TEST_P(UnaryTest, LogOverManyDecadesAndSpecialValues) {
  // Log is tested on log-uniform inputs (uniform inputs would almost never be small) plus the
  // special cases: 0, subnormals, inf, negative, NaN.
  std::vector<float> xs = {0.0f,
                           -0.0f,
                           1.0f,
                           2.0f,
                           0.5f,
                           0.70710677f,
                           0.70710683f,
                           1.4142135f,
                           std::numeric_limits<float>::denorm_min(),
                           1e-40f,
                           1e-39f,
                           std::numeric_limits<float>::min(),
                           std::numeric_limits<float>::max(),
                           std::numeric_limits<float>::infinity(),
                           -1.0f,
                           std::numeric_limits<float>::quiet_NaN()};
  std::uniform_real_distribution<float> e(-44.0f, 38.0f);
  for (int i = 0; i < 5000; ++i) xs.push_back(std::pow(10.0f, e(rng_)));
  Tensor a = Tensor::FromVector(xs, {int64_t(xs.size())});
  Tensor got = Tensor::Empty(a.shape()), want = Tensor::Empty(a.shape());
  kernels::unary.Get(kCpu)(UnaryOp::kLog, a, 0.0f, got);
  reference::unary(UnaryOp::kLog, a, 0.0f, want);
  EXPECT_TRUE(AllClose(got, want, 1e-6f, 1e-6f));
}

TEST_P(UnaryTest, ExpAndTanhSaturateAndKeepSmallValuesAccurate) {
  std::vector<float> xs = {-1000.0f, -104.0f, -87.0f, -20.0f, -1e-3f, -1e-6f, -1e-20f,
                           0.0f,     1e-20f,  1e-6f,  1e-3f,  0.29f,  0.3f,   0.31f,
                           20.0f,    88.0f,   88.5f,  88.7f,  89.0f,  1000.0f};
  Tensor a = Tensor::FromVector(xs, {int64_t(xs.size())});
  for (UnaryOp op : {UnaryOp::kExp, UnaryOp::kTanh}) {
    Tensor got = Tensor::Empty(a.shape()), want = Tensor::Empty(a.shape());
    kernels::unary.Get(kCpu)(op, a, 0.0f, got);
    reference::unary(op, a, 0.0f, want);
    // exp below -87.3 flushes to 0 instead of a float subnormal: absolute 1e-37 covers it.
    EXPECT_TRUE(AllClose(got, want, 1e-37f, 1e-6f)) << "op " << int(op);
  }
}

TEST_P(UnaryTest, BackwardMatchesReference) {
  for (const UnaryCase& c : kUnaryCases) {
    if (c.op == UnaryOp::kScale) continue;  // not a unary_backward op
    for (int64_t n : kSizes) {
      float lo = c.op == UnaryOp::kLog ? 0.01f : c.lo, hi = c.op == UnaryOp::kLog ? 100.0f : c.hi;
      if (c.op == UnaryOp::kSqrt) lo = 0.01f;
      Tensor a = RandomTensor({n}, rng_, lo, hi), g = RandomTensor({n}, rng_);
      Tensor got = Tensor::Empty({n}), want = Tensor::Empty({n});
      kernels::unary_backward.Get(kCpu)(c.op, a, g, got);
      reference::unary_backward(c.op, a, g, want);
      EXPECT_TRUE(AllClose(got, want, c.batol, c.brtol)) << c.name << " n=" << n;
    }
  }
}

TEST_P(UnaryTest, BackwardMatchesFiniteDifferences) {
  for (UnaryOp op : {UnaryOp::kGeluTanh, UnaryOp::kTanh, UnaryOp::kExp, UnaryOp::kLog,
                     UnaryOp::kSqrt, UnaryOp::kSquare, UnaryOp::kRelu}) {
    Tensor a = RandomTensor({37}, rng_, 0.2f, 2.0f);
    if (op == UnaryOp::kGeluTanh || op == UnaryOp::kTanh || op == UnaryOp::kRelu) {
      a = RandomTensor({37}, rng_, -2.0f, 2.0f);
      // Keep ReLU's inputs away from the kink, where differences are meaningless.
      float* p = a.data<float>();
      for (int64_t i = 0; i < a.numel(); ++i) {
        if (std::fabs(p[i]) < 0.05f) p[i] = 0.5f;
      }
    }
    Tensor w = RandomTensor({37}, rng_);
    Tensor out = Tensor::Empty({37});
    auto loss = [&] {
      kernels::unary.Get(kCpu)(op, a, 0.0f, out);
      return testing::WeightedSum(out, w);
    };
    std::vector<double> numeric = testing::NumericGrad(a, loss, 1e-3f);
    Tensor analytic = Tensor::Empty({37});
    kernels::unary_backward.Get(kCpu)(op, a, w, analytic);
    EXPECT_TRUE(testing::GradClose(analytic, numeric, 1e-2, 1e-2)) << "op " << int(op);
  }
}

TEST_P(UnaryTest, InPlaceAndThreadCountIndependent) {
  Tensor a = RandomTensor({100003}, rng_, -4.0f, 4.0f);
  for (UnaryOp op : {UnaryOp::kGeluTanh, UnaryOp::kTanh, UnaryOp::kExp}) {
    auto [one, two] = testing::RunWithThreads([&] {
      Tensor o = a.Clone(), gi = Tensor::Empty(a.shape());
      kernels::unary_backward.Get(kCpu)(op, a, a, gi);
      kernels::unary.Get(kCpu)(op, o, 0.0f, o);  // in place
      return std::vector<Tensor>{o, gi};
    });
    EXPECT_TRUE(BitEqual(one[0], two[0])) << "op " << int(op);
    EXPECT_TRUE(BitEqual(one[1], two[1])) << "op " << int(op);
    Tensor want = Tensor::Empty(a.shape());
    reference::unary(op, a, 0.0f, want);
    EXPECT_TRUE(AllClose(one[0], want, 1e-6f, 1e-6f));
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, UnaryTest, ::testing::ValuesIn(testing::AllConfigs()),
                         testing::ConfigName);

// ---- axpby and reductions ----------------------------------------------------------------

class ReduceTest : public KernelTest {};

TEST_P(ReduceTest, AxpbyMatchesReference) {
  for (int64_t n : kSizes) {
    for (auto [alpha, beta] : {std::pair{1.0f, 1.0f}, {0.5f, -2.0f}, {-1.5f, 0.0f}}) {
      Tensor x = RandomTensor({n}, rng_), y0 = RandomTensor({n}, rng_);
      if (beta == 0.0f) y0.Fill(std::numeric_limits<float>::quiet_NaN());  // must not be read
      Tensor got = y0.Clone(), want = y0.Clone();
      kernels::axpby.Get(kCpu)(alpha, x, beta, got);
      reference::axpby(alpha, x, beta, want);
      // fma(alpha, x, beta * y) rounds beta * y first: up to ~1.2e-7 absolute on |beta y| <= 2.
      EXPECT_TRUE(AllClose(got, want, 3e-7f, 1e-6f))
          << "n=" << n << " a=" << alpha << " b=" << beta;
    }
  }
}

TEST_P(ReduceTest, SumAllMatchesReference) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{33}, int64_t{16384}, int64_t{16385},
                    int64_t{300001}}) {
    Tensor a = RandomTensor({n}, rng_, 0.0f, 1.0f);
    Tensor got = Tensor::Empty({1}), want = Tensor::Empty({1});
    kernels::sum_all.Get(kCpu)(a, got);
    reference::sum_all(a, want);
    // Float partial sums: relative error grows like eps * sqrt(block) at worst.
    EXPECT_TRUE(AllClose(got, want, 1e-6f, 2e-6f)) << "n=" << n;
  }
}

TEST_P(ReduceTest, SumRowsMatchesReference) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1},
                            {5, 1},
                            {1, 13},
                            {7, 9},
                            {2048, 256},
                            {33, 100},
                            {129, 65},
                            {3, 1000}}) {
    for (float beta : {0.0f, 1.0f, 0.5f}) {
      Tensor a = RandomTensor({rows, cols}, rng_);
      Tensor out0 = RandomTensor({cols}, rng_);
      if (beta == 0.0f) out0.Fill(std::numeric_limits<float>::quiet_NaN());  // must not be read
      Tensor got = out0.Clone(), want = out0.Clone();
      kernels::sum_rows.Get(kCpu)(a, got, beta);
      reference::sum_rows(a, want, beta);
      EXPECT_TRUE(AllClose(got, want, 1e-6f * float(rows), 1e-6f))
          << rows << "x" << cols << " beta=" << beta;
    }
  }
}

TEST_P(ReduceTest, ReductionsAreThreadCountIndependent) {
  Tensor a = RandomTensor({2048, 257}, rng_);
  auto [one, two] = testing::RunWithThreads([&] {
    Tensor s = Tensor::Empty({1}), r = Tensor::Empty({257});
    kernels::sum_all.Get(kCpu)(a, s);
    kernels::sum_rows.Get(kCpu)(a, r, 0.0f);
    return std::vector<Tensor>{s, r};
  });
  EXPECT_TRUE(BitEqual(one[0], two[0]));
  EXPECT_TRUE(BitEqual(one[1], two[1]));
}

INSTANTIATE_TEST_SUITE_P(Configs, ReduceTest, ::testing::ValuesIn(testing::AllConfigs()),
                         testing::ConfigName);

}  // namespace
}  // namespace braid::cpu
