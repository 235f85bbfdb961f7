// The unary/binary/axpby math and the half conversions of backends/cuda/math, compiled for the
// host, against the CPU backend through the kernel table (and core's conversions).
//
// Exactness: the math is written as the CPU backend's portable path, operation for operation,
// and the host compiler contracts nothing into FMAs here (x86-64 baseline has no FMA), so
// against the portable path (SetSimdEnabled(false)) every result must be bit-identical. Against
// the AVX2 path (its own exp/log/tanh polynomials and FMAs) a tolerance applies, quoted below.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/test_util.h"
#include "backends/cuda/math/convert.h"
#include "backends/cuda/math/unary.h"
#include "core/dtype.h"
#include "core/kernels.h"
#include "gtest/gtest.h"

namespace braid::cuda::math {
namespace {

using cpu::testing::SameFloatBits;
using kernels::BinaryOp;
using kernels::UnaryOp;

// The math's op codes mirror core's enums (register.cc static_asserts the same).
static_assert(int(Unary::kScale) == int(UnaryOp::kScale) &&
              int(Unary::kAddScalar) == int(UnaryOp::kAddScalar) &&
              int(Unary::kRelu) == int(UnaryOp::kRelu) &&
              int(Unary::kGeluTanh) == int(UnaryOp::kGeluTanh) &&
              int(Unary::kExp) == int(UnaryOp::kExp) && int(Unary::kLog) == int(UnaryOp::kLog) &&
              int(Unary::kNeg) == int(UnaryOp::kNeg) &&
              int(Unary::kSquare) == int(UnaryOp::kSquare) &&
              int(Unary::kSqrt) == int(UnaryOp::kSqrt) && int(Unary::kTanh) == int(UnaryOp::kTanh));
static_assert(int(Binary::kAdd) == int(BinaryOp::kAdd) &&
              int(Binary::kSub) == int(BinaryOp::kSub) &&
              int(Binary::kMul) == int(BinaryOp::kMul) && int(Binary::kDiv) == int(BinaryOp::kDiv));

constexpr UnaryOp kAllUnary[] = {UnaryOp::kScale, UnaryOp::kAddScalar, UnaryOp::kRelu,
                                 UnaryOp::kGeluTanh, UnaryOp::kExp, UnaryOp::kLog, UnaryOp::kNeg,
                                 UnaryOp::kSquare, UnaryOp::kSqrt, UnaryOp::kTanh};

// Inputs covering each op's interesting range: [-12, 12] (GELU's cap and tanh's saturation),
// values near 0, the derivative zero of GELU near -0.75, and specials.
std::vector<float> Inputs() {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> wide(-12.f, 12.f), narrow(-1.f, 1.f);
  std::vector<float> v;
  for (int i = 0; i < 3000; ++i) v.push_back(wide(rng));
  for (int i = 0; i < 1000; ++i) v.push_back(narrow(rng));
  for (int i = 0; i < 200; ++i) v.push_back(-0.7518f + 1e-3f * narrow(rng));
  for (float s : {0.f, -0.f, 1e-30f, -1e-30f, 50.f, -50.f, 100.f, -100.f, 1e30f, -1e30f,
                  INFINITY, -INFINITY, NAN}) {
    v.push_back(s);
  }
  return v;
}

Tensor FromFloats(const std::vector<float>& v) {
  return Tensor::FromVector(v, {int64_t(v.size())});
}

using SimdOff = cpu::testing::PortablePathTest;

TEST_F(SimdOff, UnaryIsBitIdenticalToCpuPortablePath) {
  const std::vector<float> x = Inputs();
  const Tensor a = FromFloats(x);
  for (UnaryOp op : kAllUnary) {
    Tensor out = Tensor::Empty({a.numel()});
    kernels::unary.Get(Device::CPU())(op, a, 0.37f, out);
    const float* o = out.data<float>();
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_TRUE(SameFloatBits(ApplyUnary(Unary(int(op)), x[i], 0.37f), o[i]))
          << "op " << int(op) << " x=" << x[i];
    }
  }
}

TEST_F(SimdOff, UnaryGradIsBitIdenticalToCpuPortablePath) {
  const std::vector<float> x = Inputs();
  std::vector<float> g(x.size());
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> dist(-2.f, 2.f);
  for (float& f : g) f = dist(rng);
  const Tensor a = FromFloats(x), go = FromFloats(g);
  for (UnaryOp op : kAllUnary) {
    if (op == UnaryOp::kScale) continue;  // the slot rejects it: the derivative is the scalar
    Tensor gi = Tensor::Empty({a.numel()});
    kernels::unary_backward.Get(Device::CPU())(op, a, go, gi);
    const float* o = gi.data<float>();
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_TRUE(SameFloatBits(ApplyUnaryGrad(Unary(int(op)), x[i], g[i]), o[i]))
          << "op " << int(op) << " x=" << x[i] << " g=" << g[i];
    }
  }
}

// Against the AVX2 path: its exp/log/tanh are polynomial approximations good to a few ulp, and
// it fuses multiply-adds. Enforced: |got - want| <= 2e-6 |want| + 1e-7 for the ops and
// + 1e-6 for the derivatives (g = 1), over |x| <= 12 on finite results. The absolute terms: the
// AVX2 exp's relative error grows with its argument, which reaches ~60 in GELU's tail where the
// values are below 1e-24; and the derivatives have zeros (GELU's near x = -0.75) where a
// relative bound means nothing.
TEST(SimdOn, UnaryAndGradAgreeWithCpuAvx2PathWithinAFewUlp) {
  std::vector<float> x;
  for (float v : Inputs()) {
    if (std::isfinite(v) && std::fabs(v) <= 12.f) x.push_back(v);
  }
  const Tensor a = FromFloats(x);
  const Tensor go = Tensor::Full({a.numel()}, 1.0f);
  for (UnaryOp op : kAllUnary) {
    Tensor out = Tensor::Empty({a.numel()});
    kernels::unary.Get(Device::CPU())(op, a, 0.37f, out);
    Tensor gi = Tensor::Empty({a.numel()});
    if (op != UnaryOp::kScale) kernels::unary_backward.Get(Device::CPU())(op, a, go, gi);
    for (size_t i = 0; i < x.size(); ++i) {
      const float want = out.data<float>()[i];
      const float got = ApplyUnary(Unary(int(op)), x[i], 0.37f);
      if (std::isfinite(want)) {
        ASSERT_NEAR(got, want, 2e-6f * std::fabs(want) + 1e-7f) << "op " << int(op) << " x=" << x[i];
      }
      if (op == UnaryOp::kScale) continue;
      const float gwant = gi.data<float>()[i];
      const float ggot = ApplyUnaryGrad(Unary(int(op)), x[i], 1.0f);
      if (std::isfinite(gwant)) {
        ASSERT_NEAR(ggot, gwant, 2e-6f * std::fabs(gwant) + 1e-6f) << "grad op " << int(op)
                                                                    << " x=" << x[i];
      }
    }
  }
}

// GELU-tanh against the textbook formula in double: 0.5 x (1 + tanh(c (x + a x^3))) and its
// derivative. Enforced: 1e-6 absolute + 1e-5 relative (the logistic form's float roundings,
// a few ulp of O(x) values; the absolute term near the derivative's zero).
TEST(GeluTanh, MatchesTextbookFormulaInDouble) {
  for (float x : Inputs()) {
    if (!std::isfinite(x) || std::fabs(x) > 20.f) continue;
    const double xd = x, c = 0.7978845608028654, aa = 0.044715;
    const double u = c * (xd + aa * xd * xd * xd);
    const double y = 0.5 * xd * (1.0 + std::tanh(u));
    const double dy = 0.5 * (1.0 + std::tanh(u)) +
                      0.5 * xd * (1.0 - std::tanh(u) * std::tanh(u)) * c * (1.0 + 3 * aa * xd * xd);
    EXPECT_NEAR(GeluTanh(x), y, 1e-6 + 1e-5 * std::fabs(y)) << x;
    EXPECT_NEAR(GeluTanhGrad(x, 1.0f), dy, 1e-6 + 1e-5 * std::fabs(dy)) << x;
  }
}

TEST_F(SimdOff, BinaryAndAxpbyAreBitIdenticalToCpu) {
  std::mt19937 rng(9);
  const Tensor a = cpu::testing::RandomTensor({6, 35}, rng);
  const Tensor b_full = cpu::testing::RandomTensor({6, 35}, rng, 0.5f, 2.f);
  const Tensor b_row = cpu::testing::RandomTensor({35}, rng, 0.5f, 2.f);
  const Tensor b_one = cpu::testing::RandomTensor({1}, rng, 0.5f, 2.f);
  for (BinaryOp op : {BinaryOp::kAdd, BinaryOp::kSub, BinaryOp::kMul, BinaryOp::kDiv}) {
    for (const Tensor* b : {&b_full, &b_row, &b_one}) {
      Tensor out = Tensor::Empty({6, 35});
      kernels::binary.Get(Device::CPU())(op, a, *b, out);
      const int64_t nb = b->numel();
      for (int64_t i = 0; i < a.numel(); ++i) {
        ASSERT_TRUE(SameFloatBits(ApplyBinary(Binary(int(op)), a.data<float>()[i],
                                         b->data<float>()[i % nb]),
                             out.data<float>()[i]))
            << "op " << int(op) << " nb=" << nb << " i=" << i;
      }
    }
  }
  for (auto [alpha, beta] : {std::pair{0.5f, 0.f}, {1.f, 1.f}, {-1.5f, 0.25f}}) {
    Tensor y = b_full.Clone();
    if (beta == 0.f) std::fill(y.data<float>(), y.data<float>() + y.numel(), NAN);
    const std::vector<float> y0 = y.ToFloatVector();
    kernels::axpby.Get(Device::CPU())(alpha, a, beta, y);
    for (int64_t i = 0; i < a.numel(); ++i) {
      ASSERT_TRUE(SameFloatBits(Axpby(alpha, a.data<float>()[i], beta, y0[size_t(i)]),
                           y.data<float>()[i]))
          << "alpha=" << alpha << " beta=" << beta << " i=" << i;
    }
  }
}

// The native half kernels' per-element math (UnaryHalf, UnaryGradHalf, BinaryHalf, AxpbyMixed)
// against the CPU backend's bf16 and f16 kernels on the same half inputs: bit-identical (NaN
// matching NaN). Both load to f32, do the f32 operation and round once.
template <Format F>
void CheckHalfMathAgainstCpu(DType dt) {
  const std::vector<float> x = Inputs();
  const Tensor a = FromFloats(x).To(dt);  // rounded to the format: the kernels' real inputs
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-2.f, 2.f);
  std::vector<float> gv(x.size());
  for (float& f : gv) f = dist(rng);
  const Tensor g = FromFloats(gv).To(dt);
  const auto* pa = static_cast<const Stored<F>*>(a.raw_data());
  const auto* pg = static_cast<const Stored<F>*>(g.raw_data());
  auto same = [](Stored<F> got, Stored<F> want) {
    return SameFloatBits(Elem<F>::Get(got), Elem<F>::Get(want));
  };
  for (UnaryOp op : kAllUnary) {
    Tensor out = Tensor::Empty({a.numel()}, dt);
    kernels::unary.Get(Device::CPU(), dt)(op, a, 0.37f, out);
    const auto* po = static_cast<const Stored<F>*>(out.raw_data());
    for (int64_t i = 0; i < a.numel(); ++i) {
      ASSERT_TRUE(same(UnaryHalf<F>(Unary(int(op)), pa[i], 0.37f), po[i]))
          << DTypeName(dt) << " unary " << int(op) << " x=" << x[size_t(i)];
    }
    if (op == UnaryOp::kScale) continue;
    kernels::unary_backward.Get(Device::CPU(), dt)(op, a, g, out);
    for (int64_t i = 0; i < a.numel(); ++i) {
      ASSERT_TRUE(same(UnaryGradHalf<F>(Unary(int(op)), pa[i], pg[i]), po[i]))
          << DTypeName(dt) << " unary grad " << int(op) << " x=" << x[size_t(i)];
    }
  }
  for (BinaryOp op : {BinaryOp::kAdd, BinaryOp::kSub, BinaryOp::kMul, BinaryOp::kDiv}) {
    Tensor out = Tensor::Empty({a.numel()}, dt);
    kernels::binary.Get(Device::CPU(), dt)(op, a, g, out);
    const auto* po = static_cast<const Stored<F>*>(out.raw_data());
    for (int64_t i = 0; i < a.numel(); ++i) {
      ASSERT_TRUE(same(BinaryHalf<F>(Binary(int(op)), pa[i], pg[i]), po[i]))
          << DTypeName(dt) << " binary " << int(op) << " i=" << i;
    }
  }
  // A half gradient into an f32 accumulator, and an f32 value into a half one.
  const Tensor acc = FromFloats(gv);
  Tensor y32 = acc.Clone();
  kernels::axpby.Get(Device::CPU(), dt)(0.5f, g, 1.0f, y32);
  Tensor y16 = g.Clone();
  kernels::axpby.Get(Device::CPU(), dt)(-1.5f, acc, 0.25f, y16);
  const auto* p16 = static_cast<const Stored<F>*>(y16.raw_data());
  for (int64_t i = 0; i < a.numel(); ++i) {
    ASSERT_TRUE(SameFloatBits(AxpbyMixed<F, Format::kF32>(0.5f, pg[i], 1.0f, gv[size_t(i)]),
                         y32.data<float>()[i]))
        << DTypeName(dt) << " axpby into f32, i=" << i;
    ASSERT_TRUE(same(AxpbyMixed<Format::kF32, F>(-1.5f, gv[size_t(i)], 0.25f, pg[i]), p16[i]))
        << DTypeName(dt) << " axpby into half, i=" << i;
  }
}

TEST_F(SimdOff, HalfElementwiseMathIsBitIdenticalToCpuHalfKernels) {
  CheckHalfMathAgainstCpu<Format::kBF16>(DType::kBF16);
  CheckHalfMathAgainstCpu<Format::kF16>(DType::kF16);
}

// Conversions: bit-identical to core's for every bf16/f16 pattern (to f32) and, to half, for
// every upper-16-bit pattern of an f32 combined with low halves at and around the rounding
// ties, plus every 4099th f32 (a stride prime to everything, so all exponents and a spread of
// mantissas).
TEST(Convert, HalfToFloatIsBitIdenticalToCoreForEveryPattern) {
  for (uint32_t h = 0; h <= 0xffffu; ++h) {
    ASSERT_EQ(FloatBits(BF16ToFloat(uint16_t(h))), FloatBits(braid::BF16ToFloat(uint16_t(h)))) << h;
    ASSERT_EQ(FloatBits(F16ToFloat(uint16_t(h))), FloatBits(braid::F16ToFloat(uint16_t(h)))) << h;
  }
}

TEST(Convert, FloatToHalfIsBitIdenticalToCore) {
  auto check = [](uint32_t u) {
    const float f = BitsToFloat(u);
    ASSERT_EQ(FloatToBF16(f), braid::FloatToBF16(f)) << std::hex << u;
    ASSERT_EQ(FloatToF16(f), braid::FloatToF16(f)) << std::hex << u;
  };
  for (uint32_t hi = 0; hi <= 0xffffu; ++hi) {
    for (uint32_t lo : {0x0000u, 0x0001u, 0x0fffu, 0x1000u, 0x1001u, 0x7fffu, 0x8000u, 0x8001u,
                        0xefffu, 0xf000u, 0xf001u, 0xffffu}) {
      check((hi << 16) | lo);
    }
  }
  for (uint64_t u = 0; u <= 0xffffffffull; u += 4099) check(uint32_t(u));
  // Spot values with known answers, so that a shared mistake in both copies still shows.
  EXPECT_EQ(FloatToBF16(1.0f), 0x3f80u);
  EXPECT_EQ(FloatToF16(1.0f), 0x3c00u);
  EXPECT_EQ(FloatToF16(65504.f), 0x7bffu);
  EXPECT_EQ(FloatToF16(65520.f), 0x7c00u);  // the tie past the largest finite rounds to inf
  EXPECT_EQ(FloatToF16(5.9604645e-8f), 0x0001u);  // 2^-24, the smallest subnormal
  EXPECT_EQ(FloatToBF16(NAN) & 0x7fc0u, 0x7fc0u);
}

// The whole-element conversion the device's ConvertAsync runs (every format pair, through
// DispatchFormats as the CUDA launcher and the fake device pick it): bit-identical to core's
// Tensor::To on the CPU, for every bf16 and f16 pattern as the source and 65536 f32 patterns
// spread over every exponent (stride 65537).
TEST(Convert, EveryFormatPairIsBitIdenticalToCoreTensorTo) {
  const Format formats[] = {Format::kF32, Format::kBF16, Format::kF16};
  const DType dtypes[] = {DType::kF32, DType::kBF16, DType::kF16};
  static_assert(int(Format::kF32) == 0 && int(Format::kBF16) == 1 && int(Format::kF16) == 2);
  constexpr int64_t n = 65536;
  for (int from = 0; from < 3; ++from) {
    Tensor src = Tensor::Empty({n}, dtypes[from]);
    for (int64_t i = 0; i < n; ++i) {
      if (from == 0) {
        static_cast<uint32_t*>(src.raw_data())[i] = uint32_t(uint64_t(i) * 65537u);
      } else {
        static_cast<uint16_t*>(src.raw_data())[i] = uint16_t(i);
      }
    }
    for (int to = 0; to < 3; ++to) {
      Tensor want = src.To(dtypes[to]);
      std::vector<uint8_t> got(size_t(n * FormatSize(formats[to])));
      DispatchFormats(formats[from], formats[to], [&](auto f, auto t) {
        for (int64_t i = 0; i < n; ++i) {
          ConvertOne<decltype(f)::value, decltype(t)::value>(src.raw_data(), got.data(), i);
        }
      });
      ASSERT_EQ(std::memcmp(got.data(), want.raw_data(), got.size()), 0)
          << DTypeName(dtypes[from]) << " -> " << DTypeName(dtypes[to]);
    }
  }
  // A known answer, so that a mistake shared with core still shows: bf16 1.0 -> f16 1.0.
  uint16_t one = 0x3f80u, out = 0;
  ConvertOne<Format::kBF16, Format::kF16>(&one, &out, 0);
  EXPECT_EQ(out, 0x3c00u);
}

}  // namespace
}  // namespace braid::cuda::math
