// Every op in bf16 and f16 against the same op in f32 on the same (already rounded) inputs,
// forward and backward; mixed dtypes refused; Cast and ScaleGrad; the kernel table's dtype keys;
// a two-layer model in bf16 against f32.
//
// Built twice: //core:half_ops_test runs on core's reference kernels with core's generic half
// wrappers (kernels::RegisterHalfFallbacks), //backends/cpu:half_ops_cpu_test on the CPU
// backend's half kernels. The f32 path runs on the same backend, so the comparison isolates
// what the half path adds: the rounding of its results.
//
// Tolerances. A half kernel computes in f32 on the half inputs (exact in f32) and rounds its
// result once, round-to-nearest-even: |half - f32| <= u |f32| with u the unit roundoff, 2^-8
// for bf16 (8 significant bits) and 2^-11 for f16 (11 bits). Every check below allows
//   |got - want| <= k u (|want| + rms(want))
// where k counts the roundings on the path to that value (each costs at most u relative), plus
// one for a specialised kernel's different f32 summation order; the rms term covers results that
// cancel to near zero, whose rounding error is relative to the terms summed, not to the result.
// k is stated per case. A kernel that rounded per addition, or used the wrong dtype's rounding,
// misses these bounds (and the accumulation tests below catch per-addition rounding exactly).
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/kernels.h"
#include "core/ops.h"
#include "core/testing/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace braid::ops {
namespace {

using ::testing::HasSubstr;
using Inputs = std::vector<Tensor>;
using OpFn = std::function<Tensor(const Inputs&)>;

// Core's tests run on reference kernels with no half kernels: give every half slot core's
// generic wrapper. A no-op where a backend registered its own (they fill only empty slots).
const bool kFallbacks = (kernels::RegisterHalfFallbacks(DeviceType::kCPU), true);

double UnitRoundoff(DType t) { return t == DType::kBF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11); }

::testing::AssertionResult Close(const std::string& what, const std::vector<float>& got,
                                 const std::vector<float>& want, double tol) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << what << ": " << got.size() << " vs " << want.size()
                                         << " elements";
  }
  double ss = 0;
  for (float w : want) ss += double(w) * w;
  const double rms = want.empty() ? 0.0 : std::sqrt(ss / double(want.size()));
  size_t worst = 0;
  double worst_ratio = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double allowed = tol * (std::fabs(double(want[i])) + rms);
    const double err = std::fabs(double(got[i]) - double(want[i]));
    double ratio = allowed > 0 ? err / allowed : (err > 0 ? INFINITY : 0.0);
    // A NaN or inf on either side is the worst: as a NaN ratio it would be replaced by the next
    // finite one, and an inf in want makes rms, so every allowance, infinite.
    if (!std::isfinite(got[i]) || !std::isfinite(want[i])) ratio = INFINITY;
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      worst = i;
    }
  }
  if (worst_ratio <= 1.0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": element " << worst << " is " << got[worst] << ", f32 gives " << want[worst]
         << " (error " << std::fabs(double(got[worst]) - double(want[worst])) << ", "
         << worst_ratio << "x the allowed " << tol << " * (|want| + rms " << rms << "))";
}

// Close fails on a NaN or inf on either side wherever it is (a NaN ratio used to be overwritten by
// the next element's, and an inf in want made every allowance infinite).
TEST(HalfOpsClose, FailsOnNanOrInfOnEitherSide) {
  const std::vector<float> want = {0.5f, -2.0f, 3.0f};
  EXPECT_TRUE(Close("same", want, want, 1e-3));
  for (float v : {NAN, INFINITY, -INFINITY}) {
    for (size_t i = 0; i < want.size(); ++i) {
      std::vector<float> bad = want;
      bad[i] = v;
      EXPECT_FALSE(Close("got", bad, want, 1e-3)) << v << " at " << i;
      EXPECT_FALSE(Close("want", want, bad, 1e-3)) << v << " at " << i;
      EXPECT_FALSE(Close("both", bad, bad, 1e-3)) << v << " at " << i;
    }
  }
}

class HalfOpsTest : public ::testing::TestWithParam<DType> {
 protected:
  DType dt() const { return GetParam(); }
  double u() const { return UnitRoundoff(dt()); }

  // Uniform in [lo, hi), already representable in the half dtype (so both paths start from the
  // same values), as f32.
  Tensor Rounded(const Shape& shape, float lo = -1.0f, float hi = 1.0f) {
    return test::RandomTensor(shape, rng_, lo, hi).To(dt()).To(DType::kF32);
  }

  // Runs fn on f32 leaves and on half leaves holding the same values, seeds both backwards with
  // the same random projection (representable in the half dtype), and compares the outputs and
  // every floating input's gradient within k_fwd / k_bwd unit roundoffs. Integer inputs (ids,
  // targets) are passed to both as they are. `out_dtype`: the half run's expected output dtype.
  void Compare(const std::string& name, const OpFn& fn, const Inputs& f32_inputs, double k_fwd,
               double k_bwd, bool out_is_f32 = false) {
    SCOPED_TRACE(name + " in " + DTypeName(dt()));
    Inputs a, h;
    for (const Tensor& t : f32_inputs) {
      if (IsFloating(t.dtype())) {
        a.push_back(t.Clone().set_requires_grad(true));
        h.push_back(t.To(dt()).set_requires_grad(true));
      } else {
        a.push_back(t);
        h.push_back(t);
      }
    }
    Tensor out32 = fn(a);
    Tensor outh = fn(h);
    ASSERT_EQ(outh.dtype(), out_is_f32 ? DType::kF32 : dt()) << outh.DescribeForError();
    ASSERT_EQ(out32.shape(), outh.shape());
    EXPECT_TRUE(Close(name + " forward", outh.ToFloatVector(), out32.ToFloatVector(), k_fwd * u()));

    std::vector<float> r = test::RandomTensor(out32.shape(), rng_).To(dt()).ToFloatVector();
    out32.Backward(Tensor::FromVector(r, out32.shape()));
    outh.Backward(Tensor::FromVector(r, outh.shape()).To(outh.dtype()));
    for (size_t i = 0; i < a.size(); ++i) {
      if (!IsFloating(a[i].dtype())) continue;
      ASSERT_TRUE(h[i].grad().defined()) << "input " << i << " got no gradient";
      EXPECT_EQ(h[i].grad().dtype(), dt()) << "input " << i << "'s gradient";
      std::vector<float> want = a[i].grad().ToFloatVector();
      bool nonzero = false;
      for (float w : want) nonzero = nonzero || w != 0.0f;
      EXPECT_TRUE(nonzero) << "input " << i << ": an all-zero gradient proves nothing";
      EXPECT_TRUE(Close(name + " gradient of input " + std::to_string(i),
                        h[i].grad().ToFloatVector(), want, k_bwd * u()));
    }
  }

  std::mt19937 rng_{7};
};

// ---- Each op --------------------------------------------------------------------------------
// k = 2 where the value is one kernel's result on exact inputs (one rounding, plus one for
// summation order); more where the path rounds more often, as noted.

TEST_P(HalfOpsTest, Elementwise) {
  Tensor a = Rounded({4, 6}), b = Rounded({4, 6}), bias = Rounded({6});
  Compare("Add", [](const Inputs& x) { return Add(x[0], x[1]); }, {a, b}, 2, 2);
  // The row-broadcast gradient is a sum over rows (sum_rows), rounded once.
  Compare("Add row", [](const Inputs& x) { return Add(x[0], x[1]); }, {a, bias}, 2, 2);
  Compare("Sub row", [](const Inputs& x) { return Sub(x[0], x[1]); }, {a, bias}, 2, 2);
  Compare("Mul", [](const Inputs& x) { return Mul(x[0], x[1]); }, {a, b}, 2, 2);
  Compare("Scale", [](const Inputs& x) { return Scale(x[0], 0.37f); }, {a}, 2, 2);
  Compare("Relu", [](const Inputs& x) { return Relu(x[0]); }, {a}, 2, 2);
  Compare("GeluTanh", [](const Inputs& x) { return GeluTanh(x[0]); }, {a}, 2, 2);
  Compare("Tanh", [](const Inputs& x) { return Tanh(x[0]); }, {a}, 2, 2);
  Compare("Exp", [](const Inputs& x) { return Exp(x[0]); }, {a}, 2, 2);
  Compare("Log", [](const Inputs& x) { return Log(x[0]); }, {Rounded({4, 6}, 0.2f, 2.0f)}, 2, 2);
}

TEST_P(HalfOpsTest, Reductions) {
  Tensor a = Rounded({5, 7});
  Compare("Sum", [](const Inputs& x) { return Sum(x[0]); }, {a}, 2, 2);
  // Mean is Scale(Sum): two roundings forward; backward scales the gradient once.
  Compare("Mean", [](const Inputs& x) { return Mean(x[0]); }, {a}, 3, 2);
}

TEST_P(HalfOpsTest, MatMulAndLinear) {
  Compare("MatMul", [](const Inputs& x) { return MatMul(x[0], x[1]); },
          {Rounded({3, 5}), Rounded({5, 4})}, 2, 2);
  Compare("MatMul tt", [](const Inputs& x) { return MatMul(x[0], x[1], true, true); },
          {Rounded({5, 3}), Rounded({4, 5})}, 2, 2);
  Compare("MatMul batched", [](const Inputs& x) { return MatMul(x[0], x[1], false, true); },
          {Rounded({2, 3, 5}), Rounded({2, 4, 5})}, 2, 2);
  // Linear rounds the product, then the sum with the bias: k = 3 forward.
  Compare("Linear", [](const Inputs& x) { return Linear(x[0], x[1], x[2]); },
          {Rounded({2, 3, 5}), Rounded({4, 5}), Rounded({4})}, 3, 2);
}

TEST_P(HalfOpsTest, NormsAndSoftmax) {
  Compare("LayerNorm", [](const Inputs& x) { return LayerNorm(x[0], x[1], x[2]); },
          {Rounded({3, 8}), Rounded({8}, 0.5f, 1.5f), Rounded({8})}, 2, 2);
  // Softmax's backward reads its own rounded output y: dx = y (dy - sum(dy y)) carries y's
  // rounding (u) twice more, k = 4.
  Compare("Softmax", [](const Inputs& x) { return Softmax(x[0]); }, {Rounded({3, 9}, -3, 3)}, 2,
          4);
}

TEST_P(HalfOpsTest, EmbeddingAndCrossEntropy) {
  Tensor ids = Tensor::FromVector<int32_t>({3, 0, 3, 5, 1, 3}, {2, 3});
  Compare("Embedding", [](const Inputs& x) { return Embedding(x[0], x[1]); },
          {Rounded({6, 4}), ids}, 2, 2);
  // The loss is f32 and computed from the same logits: only f32 summation order differs (k = 1).
  // dlogits = probs - onehot from f32 probabilities, rounded once.
  Tensor targets = Tensor::FromVector<int32_t>({2, -1, 0, 4}, {4});
  Compare("CrossEntropy", [](const Inputs& x) { return CrossEntropy(x[0], x[1]); },
          {Rounded({4, 5}, -2, 2), targets}, 1, 2, /*out_is_f32=*/true);
}

TEST_P(HalfOpsTest, Attention) {
  // The saved probabilities are rounded to the half dtype, so backward works from P(1 + u) and
  // rounds dP-terms once more before the products with q and k: k = 6 for the gradient.
  Compare("CausalSelfAttention", [](const Inputs& x) { return CausalSelfAttention(x[0], 2); },
          {Rounded({2, 5, 12})}, 3, 6);
}

TEST_P(HalfOpsTest, LlamaOps) {
  // One kernel each on exact inputs, rounded once (k = 2). RmsNorm keeps rstd in f32 as
  // LayerNorm does, so its backward rounds only dx and the f32-summed dweight.
  Compare("RmsNorm", [](const Inputs& x) { return RmsNorm(x[0], x[1]); },
          {Rounded({3, 8}, -2, 2), Rounded({8}, 0.5f, 1.5f)}, 2, 2);
  Compare("Silu", [](const Inputs& x) { return Silu(x[0]); }, {Rounded({4, 6}, -4, 4)}, 2, 2);
  Compare("SwiGlu", [](const Inputs& x) { return SwiGlu(x[0], x[1]); },
          {Rounded({4, 6}, -4, 4), Rounded({4, 6})}, 2, 2);
  // The rotation mixes two inputs with f32 cos/sin; its backward is the inverse rotation of the
  // rounded incoming gradient, one rounding more.
  RopeOptions o{10000.0f, 2.0f, 5};
  Compare("RotaryEmbedding", [o](const Inputs& x) { return RotaryEmbedding(x[0], o); },
          {Rounded({2, 3, 2, 8})}, 2, 2);
  // As CausalSelfAttention: rounded saved probabilities, k = 6 for the gradients.
  Compare("GroupedQueryAttention",
          [](const Inputs& x) { return GroupedQueryAttention(x[0], x[1], x[2]); },
          {Rounded({2, 5, 4, 3}), Rounded({2, 5, 2, 3}), Rounded({2, 5, 2, 3})}, 3, 6);
  Compare("Dropout", [](const Inputs& x) { return Dropout(x[0], 0.25f, 3); }, {Rounded({4, 9})},
          2, 2);
}

TEST_P(HalfOpsTest, CastAndScaleGrad) {
  Tensor a = Rounded({3, 4}).set_requires_grad(true);
  Tensor h = Cast(a, dt());
  EXPECT_EQ(h.dtype(), dt());
  EXPECT_EQ(h.ToFloatVector(), a.ToFloatVector());  // representable: exact
  EXPECT_TRUE(Cast(h, dt()).SameAs(h));             // same dtype: a itself
  Tensor s = ScaleGrad(h, 8.0f);
  EXPECT_EQ(s.dtype(), dt());
  EXPECT_FALSE(s.SameAs(h));
  EXPECT_EQ(s.ToFloatVector(), h.ToFloatVector());  // the identity forward
  std::vector<float> r = test::RandomTensor({3, 4}, rng_).To(dt()).ToFloatVector();
  s.Backward(Tensor::FromVector(r, {3, 4}));
  ASSERT_TRUE(a.grad().defined());
  EXPECT_EQ(a.grad().dtype(), DType::kF32);  // Cast's backward returns a's dtype
  std::vector<float> g = a.grad().ToFloatVector();
  // r is representable and 8 a power of two: 8 r is exact in every format.
  for (size_t i = 0; i < r.size(); ++i) EXPECT_EQ(g[i], 8.0f * r[i]) << i;

  // Cast from half to f32 and back: the gradient returns in the half dtype.
  Tensor hl = Tensor::FromVector(r, {3, 4}).To(dt()).set_requires_grad(true);
  Sum(Cast(hl, DType::kF32)).Backward();
  EXPECT_EQ(hl.grad().dtype(), dt());
  for (float x : hl.grad().ToFloatVector()) EXPECT_EQ(x, 1.0f);
}

// ScaleGrad as the loss scaler uses it: the reported loss unscaled, backward from S.
TEST_P(HalfOpsTest, ScaleGradOnTheLoss) {
  Tensor w = Rounded({4, 3}).To(dt()).set_requires_grad(true);
  Tensor x = Rounded({2, 3}).To(dt());
  Tensor targets = Tensor::FromVector<int32_t>({1, 3}, {2});
  Tensor loss = CrossEntropy(Linear(x, w, Tensor()), targets);
  Tensor scaled = ScaleGrad(loss, 1024.0f);
  EXPECT_EQ(scaled.item(), loss.item());
  scaled.Backward(Tensor(), /*retain_graph=*/true);
  std::vector<float> g_scaled = w.grad().ToFloatVector();
  w.ZeroGrad();
  loss.Backward();
  std::vector<float> g = w.grad().ToFloatVector();
  // 1024 is a power of two and no value here nears overflow: scaling is exact in any format.
  for (size_t i = 0; i < g.size(); ++i) EXPECT_EQ(g_scaled[i], 1024.0f * g[i]) << i;
}

// ---- Accumulation rounds once -----------------------------------------------------------------
// 300 ones summed: 300 is representable in bf16 and f16, but 256 + 1 is not in bf16 (spacing 2
// above 256), so a kernel rounding after each addition gets stuck at 256 in bf16 (and f16 is
// exact only because its spacing at 300 is 0.25: the bf16 case is the one that catches it).
TEST_P(HalfOpsTest, AccumulatingKernelsRoundOnce) {
  const int n = 300;
  // Embedding backward into dweight: 300 lookups of the same row.
  Tensor w = Tensor::Zeros({2, 3}, dt()).set_requires_grad(true);
  Tensor ids = Tensor::Zeros({n}, DType::kI32);
  Sum(Embedding(w, ids)).Backward();
  EXPECT_EQ(w.grad().ToFloatVector(), (std::vector<float>{300, 300, 300, 0, 0, 0}));
  // Linear's bias gradient (sum_rows), LayerNorm's dbias, and Sum's forward (sum_all).
  Tensor x = Tensor::Full({n, 2}, 1.0f, dt()).set_requires_grad(true);
  Tensor b = Tensor::Zeros({2}, dt()).set_requires_grad(true);
  Sum(Add(x, b)).Backward();
  EXPECT_EQ(b.grad().ToFloatVector(), (std::vector<float>{300, 300}));
  Tensor lw = Tensor::Full({4}, 1.0f, dt()).set_requires_grad(true);
  Tensor lb = Tensor::Zeros({4}, dt()).set_requires_grad(true);
  Tensor lx = Rounded({n, 4}).To(dt());
  Sum(LayerNorm(lx, lw, lb)).Backward();
  EXPECT_EQ(lb.grad().ToFloatVector(), (std::vector<float>{300, 300, 300, 300}));
  EXPECT_EQ(Sum(Tensor::Full({n}, 1.0f, dt())).item(), 300.0f);
  // axpby (autograd's accumulation): 256 + 1.5 * 1 is 257.5 in f32, rounded once: 258 in bf16
  // (spacing 2 there, 257.5 nearer 258), exact in f16 (spacing 0.25).
  Tensor acc = Tensor::Full({1}, 256.0f, dt());
  kernels::axpby.Get(Device::CPU(), dt())(1.5f, Tensor::Full({1}, 1.0f, dt()), 1.0f, acc);
  EXPECT_EQ(acc.item(), dt() == DType::kBF16 ? 258.0f : 257.5f);
}

// A half gradient into an f32 accumulator and the reverse (kernels::AxpbyKey).
TEST_P(HalfOpsTest, AxpbyMixesWithF32) {
  Tensor acc = Tensor::Full({3}, 0.25f);
  Tensor g = Tensor::Full({3}, 1.0f, dt());
  kernels::axpby.Get(Device::CPU(), kernels::AxpbyKey(g, acc))(2.0f, g, 1.0f, acc);
  EXPECT_EQ(acc.ToFloatVector(), (std::vector<float>{2.25f, 2.25f, 2.25f}));
  Tensor hacc = Tensor::Full({3}, 0.5f, dt());
  kernels::axpby.Get(Device::CPU(), kernels::AxpbyKey(acc, hacc))(1.0f, acc, 1.0f, hacc);
  EXPECT_EQ(hacc.ToFloatVector(), (std::vector<float>{2.75f, 2.75f, 2.75f}));
}

// ---- Mixed dtypes are refused, naming both tensors -------------------------------------------
TEST_P(HalfOpsTest, MixedDTypesRefused) {
  Tensor a = Tensor::Zeros({2, 3}).set_name("a");
  Tensor b = Tensor::Zeros({2, 3}, dt()).set_name("b");
  const std::string both = std::string("'a' f32[2,3]");
  EXPECT_DEATH(Add(a, b), HasSubstr("Add: operands have different dtypes: " + both));
  EXPECT_DEATH(Mul(b, a), HasSubstr("and 'a' f32[2,3]"));
  EXPECT_DEATH(MatMul(a, Tensor::Zeros({3, 2}, dt())), HasSubstr("MatMul: operands have different dtypes"));
  EXPECT_DEATH(Linear(b, Tensor::Zeros({4, 3}), Tensor()), HasSubstr("Linear: operands have different dtypes"));
  EXPECT_DEATH(LayerNorm(b, Tensor::Zeros({3}), Tensor::Zeros({3})),
               HasSubstr("LayerNorm: operands have different dtypes"));
  EXPECT_DEATH(Relu(Tensor::Zeros({2}, DType::kI32)), HasSubstr("Relu needs f32, bf16 or f16"));
}

// ---- The whole path: a 2-layer model in bf16/f16 against f32 ----------------------------------
// Linear -> GeluTanh -> Linear -> CrossEntropy with half parameters and inputs, against the f32
// model holding the same (rounded) values. Forward rounds four times before the loss (two
// products, the bias sums, GELU); each gradient passes through up to eight rounded results on
// its way back. k = 16 for the loss and for every gradient, measured normwise (a gradient whose
// entries are mostly small is dominated by its large ones: ||g_half - g_f32|| <= k u ||g_f32||).
TEST_P(HalfOpsTest, TwoLayerModelTracksF32) {
  Tensor w1 = Rounded({16, 8}, -0.5f, 0.5f), b1 = Rounded({16}, -0.1f, 0.1f);
  Tensor w2 = Rounded({5, 16}, -0.5f, 0.5f), b2 = Rounded({5}, -0.1f, 0.1f);
  Tensor x = Rounded({12, 8});
  Tensor targets = Tensor::FromVector<int32_t>({0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, -1}, {12});
  auto run = [&](DType t, std::vector<Tensor>& params) {
    params = {w1.To(t).set_requires_grad(true), b1.To(t).set_requires_grad(true),
              w2.To(t).set_requires_grad(true), b2.To(t).set_requires_grad(true)};
    Tensor h = GeluTanh(Linear(x.To(t), params[0], params[1]));
    Tensor loss = CrossEntropy(Linear(h, params[2], params[3]), targets);
    EXPECT_EQ(loss.dtype(), DType::kF32);
    loss.Backward();
    return loss.item();
  };
  std::vector<Tensor> p32, ph;
  const float l32 = run(DType::kF32, p32);
  const float lh = run(dt(), ph);
  const double k = 16;
  // A tolerance scaled by an infinite reference would accept anything: the reference is finite.
  ASSERT_TRUE(std::isfinite(l32)) << "the f32 loss is " << l32;
  EXPECT_NEAR(lh, l32, k * u() * std::fabs(l32)) << "loss";
  for (size_t i = 0; i < p32.size(); ++i) {
    EXPECT_EQ(ph[i].grad().dtype(), dt());
    std::vector<float> g = ph[i].grad().ToFloatVector(), want = p32[i].grad().ToFloatVector();
    double diff = 0, norm = 0;
    for (size_t j = 0; j < g.size(); ++j) {
      diff += (double(g[j]) - want[j]) * (double(g[j]) - want[j]);
      norm += double(want[j]) * want[j];
    }
    EXPECT_GT(norm, 0.0) << "parameter " << i;
    EXPECT_LE(std::sqrt(diff), k * u() * std::sqrt(norm)) << "parameter " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Half, HalfOpsTest, ::testing::Values(DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

// ---- The kernel table ------------------------------------------------------------------------

int g_counted_calls = 0;
kernels::UnaryFn* g_previous_unary = nullptr;
void CountingUnary(kernels::UnaryOp op, const Tensor& a, float s, Tensor& out) {
  ++g_counted_calls;
  g_previous_unary(op, a, s, out);
}

// The table is open: a kernel registered for a dtype is the one the ops run. Register replaces,
// so the test restores what was there.
TEST(HalfKernelTable, RegisteredKernelForADTypeIsUsed) {
  Tensor a = Tensor::FromVector<float>({-1.0f, 2.0f}, {2}).To(DType::kBF16);
  g_previous_unary = kernels::unary.Find(DeviceType::kCPU, DType::kBF16);
  ASSERT_NE(g_previous_unary, nullptr);
  kernels::unary.Register(DeviceType::kCPU, DType::kBF16, &CountingUnary);
  g_counted_calls = 0;
  Tensor r = Relu(a);
  Tensor f = Relu(a.To(DType::kF32));  // the f32 kernel is another key: not counted
  kernels::unary.Register(DeviceType::kCPU, DType::kBF16, g_previous_unary);
  EXPECT_EQ(g_counted_calls, 1);
  EXPECT_EQ(r.ToFloatVector(), (std::vector<float>{0.0f, 2.0f}));
  EXPECT_EQ(f.ToFloatVector(), (std::vector<float>{0.0f, 2.0f}));
  EXPECT_EQ(kernels::unary.Find(DeviceType::kCPU, DType::kBF16), g_previous_unary);
}

TEST(HalfKernelTable, TwoArgumentRegisterIsTheF32Kernel) {
  kernels::KernelSlot<kernels::UnaryFn> slot("test_slot");
  slot.Register(DeviceType::kCPU, &CountingUnary);
  EXPECT_EQ(slot.Find(DeviceType::kCPU), &CountingUnary);
  EXPECT_EQ(slot.Find(DeviceType::kCPU, DType::kF32), &CountingUnary);
  EXPECT_EQ(slot.Get(Device::CPU()), &CountingUnary);
  EXPECT_EQ(slot.Find(DeviceType::kCPU, DType::kBF16), nullptr);
  EXPECT_DEATH(slot.Get(Device::CPU(), DType::kBF16),
               HasSubstr("no kernel 'test_slot' for dtype bf16 on cpu"));
  EXPECT_DEATH(slot.Get(Device::CPU(), DType::kBF16),
               HasSubstr("BRAID_REGISTER_KERNEL_FOR_DTYPE(kernels::test_slot, type, bf16, fn)"));
  kernels::KernelSlot<kernels::UnaryFn> empty("empty_slot");
  EXPECT_DEATH(empty.Get(Device::CPU(), DType::kF16),
               HasSubstr("link the backend for this device type"));
}

// Optimizer updates stay f32 (master weights): no half kernel is registered for them.
TEST(HalfKernelTable, OptimizerKernelsStayF32) {
  EXPECT_EQ(kernels::adamw.Find(DeviceType::kCPU, DType::kBF16), nullptr);
  EXPECT_EQ(kernels::sgd.Find(DeviceType::kCPU, DType::kF16), nullptr);
}

}  // namespace
}  // namespace braid::ops
