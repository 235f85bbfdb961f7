// Every op in core/ops.h: forward against a naive double-precision formula written here, and
// backward against central differences (test_util's GradCheck). Runs on the reference kernels.
#include "core/ops.h"

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "core/autograd.h"
#include "core/testing/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace braid::ops {
namespace {

using ::testing::HasSubstr;
using test::AllClose;
using test::GradCheck;
using test::ToDoubles;
using Inputs = std::vector<Tensor>;

class OpsTest : public ::testing::Test {
 protected:
  // A leaf that requires grad, uniform in [lo, hi).
  Tensor Param(const Shape& shape, float lo = -1.0f, float hi = 1.0f) {
    Tensor t = test::RandomTensor(shape, rng_, lo, hi);
    t.set_requires_grad(true);
    return t;
  }
  Tensor ParamAwayFromZero(const Shape& shape, float min_abs) {
    Tensor t = test::RandomTensorAwayFromZero(shape, rng_, min_abs);
    t.set_requires_grad(true);
    return t;
  }
  std::mt19937 rng_{42};
};

// Forward tolerance for f32 results of double-precision formulas.
constexpr double kRtol = 1e-5, kAtol = 1e-6;

// Tighter than GradCheck's defaults (which leave room for optimised kernels' rounding): on the
// reference kernels a gradient off by a few tenths of a percent fails.
test::GradCheckOptions Tight(double atol = 2e-4) {
  test::GradCheckOptions o;
  o.rtol = 2e-3;
  o.atol = atol;
  return o;
}

::testing::AssertionResult Check(const std::function<Tensor(const Inputs&)>& fn,
                                 const Inputs& inputs,
                                 const test::GradCheckOptions& opts = Tight()) {
  return GradCheck(fn, inputs, opts);
}

// ---- Elementwise ----------------------------------------------------------------------------

using Scalar2 = std::function<double(double, double)>;

std::vector<double> Elementwise(const Tensor& a, const Tensor& b, const Scalar2& f) {
  std::vector<double> x = ToDoubles(a), y = ToDoubles(b), out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = f(x[i], y[i % y.size()]);
  return out;
}

TEST_F(OpsTest, AddSubMulSameShape) {
  Tensor a = Param({2, 3}), b = Param({2, 3});
  EXPECT_TRUE(AllClose(Add(a, b), Elementwise(a, b, std::plus<double>()), kRtol, kAtol));
  EXPECT_TRUE(AllClose(Sub(a, b), Elementwise(a, b, std::minus<double>()), kRtol, kAtol));
  EXPECT_TRUE(AllClose(Mul(a, b), Elementwise(a, b, std::multiplies<double>()), kRtol, kAtol));
  EXPECT_TRUE(Check([](const Inputs& in) { return Add(in[0], in[1]); }, {a, b}));
  EXPECT_TRUE(Check([](const Inputs& in) { return Sub(in[0], in[1]); }, {a, b}));
  EXPECT_TRUE(Check([](const Inputs& in) { return Mul(in[0], in[1]); }, {a, b}));
}

TEST_F(OpsTest, AddAndSubBroadcastARowVector) {
  Tensor a = Param({2, 3, 4}), bias = Param({4});
  EXPECT_TRUE(AllClose(Add(a, bias), Elementwise(a, bias, std::plus<double>()), kRtol, kAtol));
  EXPECT_TRUE(AllClose(Sub(a, bias), Elementwise(a, bias, std::minus<double>()), kRtol, kAtol));
  EXPECT_TRUE(Check([](const Inputs& in) { return Add(in[0], in[1]); }, {a, bias}));
  EXPECT_TRUE(Check([](const Inputs& in) { return Sub(in[0], in[1]); }, {a, bias}));
  // A [3, 4] trailing block broadcasts too.
  Tensor block = Param({3, 4});
  EXPECT_TRUE(AllClose(Add(a, block), Elementwise(a, block, std::plus<double>()), kRtol, kAtol));
  EXPECT_TRUE(Check([](const Inputs& in) { return Sub(in[0], in[1]); }, {a, block}));
}

TEST_F(OpsTest, MulOfATensorWithItself) {
  // Both edges of the node lead to the same leaf: the gradients must add (2x).
  Tensor a = Param({5});
  Tensor y = Mul(a, a);
  y.Backward(Tensor::Full({5}, 1.0f));
  std::vector<double> want = ToDoubles(a);
  for (double& v : want) v *= 2;
  EXPECT_TRUE(AllClose(a.grad(), want, kRtol, kAtol));
}

TEST_F(OpsTest, Scale) {
  Tensor a = Param({3, 2});
  std::vector<double> want = ToDoubles(a);
  for (double& v : want) v *= -2.5;
  EXPECT_TRUE(AllClose(Scale(a, -2.5f), want, kRtol, kAtol));
  EXPECT_TRUE(Check([](const Inputs& in) { return Scale(in[0], -2.5f); }, {a}));
}

struct UnaryCase {
  const char* name;
  Tensor (*op)(const Tensor&);
  double (*formula)(double);
};

double GeluTanhFormula(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

TEST_F(OpsTest, UnaryOps) {
  const UnaryCase cases[] = {
      {"Relu", &Relu, [](double x) { return x > 0 ? x : 0.0; }},
      {"GeluTanh", &GeluTanh, &GeluTanhFormula},
      {"Tanh", &Tanh, [](double x) { return std::tanh(x); }},
      {"Exp", &Exp, [](double x) { return std::exp(x); }},
      {"Log", &Log, [](double x) { return std::log(x); }},
  };
  for (const UnaryCase& c : cases) {
    SCOPED_TRACE(c.name);
    const bool is_log = std::string(c.name) == "Log";
    // Relu's kink at 0 would make finite differences meaningless: stay 0.05 away from it.
    Tensor a = is_log ? Param({3, 4}, 0.3f, 2.0f) : ParamAwayFromZero({3, 4}, 0.05f);
    std::vector<double> want = ToDoubles(a);
    for (double& v : want) v = c.formula(v);
    EXPECT_TRUE(AllClose(c.op(a), want, kRtol, kAtol));
    auto op = c.op;
    EXPECT_TRUE(Check([op](const Inputs& in) { return op(in[0]); }, {a}));
  }
}

TEST_F(OpsTest, GeluTanhApproximatesExactGelu) {
  // Guards the constants: the tanh form stays within 1e-3 of x * Phi(x).
  std::vector<float> xs;
  for (int i = -40; i <= 40; ++i) xs.push_back(0.1f * float(i));
  Tensor y = GeluTanh(Tensor::FromVector(xs, {int64_t(xs.size())}));
  std::vector<double> exact;
  for (float x : xs) exact.push_back(0.5 * x * (1 + std::erf(x / std::sqrt(2.0))));
  EXPECT_TRUE(AllClose(y, exact, 0, 1e-3));
}

TEST_F(OpsTest, SumAndMean) {
  Tensor a = Param({3, 5});
  double s = 0;
  for (double v : ToDoubles(a)) s += v;
  Tensor sum = Sum(a), mean = Mean(a);
  EXPECT_EQ(sum.ndim(), 0);
  EXPECT_NEAR(sum.item(), s, 1e-5);
  EXPECT_NEAR(mean.item(), s / 15, 1e-6);
  EXPECT_TRUE(Check([](const Inputs& in) { return Sum(in[0]); }, {a}));
  EXPECT_TRUE(Check([](const Inputs& in) { return Mean(in[0]); }, {a}));
  // d(mean)/da = 1/15 everywhere, exactly.
  a.ZeroGrad();
  Mean(a).Backward();
  EXPECT_TRUE(AllClose(a.grad(), std::vector<double>(15, 1.0 / 15), 1e-6, 0));
}

// ---- Matrix products ------------------------------------------------------------------------

// out[b] = op(a[b]) @ op(b[b]) for stored [.., r, c] operands, in double.
std::vector<double> NaiveMatMul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  std::vector<double> A = ToDoubles(a), B = ToDoubles(b);
  const int64_t batch = a.ndim() == 3 ? a.size(0) : 1;
  const int64_t ar = a.size(-2), ac = a.size(-1), br = b.size(-2), bc = b.size(-1);
  const int64_t m = ta ? ac : ar, k = ta ? ar : ac, n = tb ? br : bc;
  auto opa = [&](int64_t bi, int64_t i, int64_t p) {
    return ta ? A[size_t(bi * ar * ac + p * ac + i)] : A[size_t(bi * ar * ac + i * ac + p)];
  };
  auto opb = [&](int64_t bi, int64_t p, int64_t j) {
    return tb ? B[size_t(bi * br * bc + j * bc + p)] : B[size_t(bi * br * bc + p * bc + j)];
  };
  std::vector<double> out;
  for (int64_t bi = 0; bi < batch; ++bi) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p) s += opa(bi, i, p) * opb(bi, p, j);
        out.push_back(s);
      }
    }
  }
  return out;
}

TEST_F(OpsTest, MatMulAllTransposeFlags2D) {
  const int64_t m = 3, k = 4, n = 2;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "trans_a=" << ta << " trans_b=" << tb);
      Tensor a = Param(ta ? Shape{k, m} : Shape{m, k});
      Tensor b = Param(tb ? Shape{n, k} : Shape{k, n});
      Tensor c = MatMul(a, b, ta, tb);
      EXPECT_EQ(c.shape(), (Shape{m, n}));
      EXPECT_TRUE(AllClose(c, NaiveMatMul(a, b, ta, tb), kRtol, kAtol));
      EXPECT_TRUE(Check(
          [ta, tb](const Inputs& in) { return MatMul(in[0], in[1], ta, tb); }, {a, b}));
    }
  }
}

TEST_F(OpsTest, MatMulBatched3D) {
  const int64_t bs = 2, m = 2, k = 3, n = 4;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "trans_a=" << ta << " trans_b=" << tb);
      Tensor a = Param(ta ? Shape{bs, k, m} : Shape{bs, m, k});
      Tensor b = Param(tb ? Shape{bs, n, k} : Shape{bs, k, n});
      Tensor c = MatMul(a, b, ta, tb);
      EXPECT_EQ(c.shape(), (Shape{bs, m, n}));
      EXPECT_TRUE(AllClose(c, NaiveMatMul(a, b, ta, tb), kRtol, kAtol));
      EXPECT_TRUE(Check(
          [ta, tb](const Inputs& in) { return MatMul(in[0], in[1], ta, tb); }, {a, b}));
    }
  }
}

// y[.., o] = sum_i x[.., i] w[o, i] + bias[o].
std::vector<double> NaiveLinear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  std::vector<double> X = ToDoubles(x), W = ToDoubles(w);
  std::vector<double> B = bias.defined() ? ToDoubles(bias) : std::vector<double>();
  const int64_t in = w.size(1), out = w.size(0), rows = x.numel() / in;
  std::vector<double> y;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      double s = B.empty() ? 0.0 : B[size_t(o)];
      for (int64_t i = 0; i < in; ++i) s += X[size_t(r * in + i)] * W[size_t(o * in + i)];
      y.push_back(s);
    }
  }
  return y;
}

TEST_F(OpsTest, Linear3DWithBias) {
  Tensor x = Param({2, 3, 4}), w = Param({5, 4}), b = Param({5});
  Tensor y = Linear(x, w, b);
  EXPECT_EQ(y.shape(), (Shape{2, 3, 5}));
  EXPECT_TRUE(AllClose(y, NaiveLinear(x, w, b), kRtol, kAtol));
  EXPECT_TRUE(Check([](const Inputs& in) { return Linear(in[0], in[1], in[2]); }, {x, w, b}));
}

TEST_F(OpsTest, Linear2DWithoutBias) {
  Tensor x = Param({3, 4}), w = Param({2, 4});
  EXPECT_TRUE(AllClose(Linear(x, w, Tensor()), NaiveLinear(x, w, Tensor()), kRtol, kAtol));
  EXPECT_TRUE(Check([](const Inputs& in) { return Linear(in[0], in[1], Tensor()); }, {x, w}));
}

// ---- Normalisation and softmax --------------------------------------------------------------

std::vector<double> NaiveLayerNorm(const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  std::vector<double> X = ToDoubles(x), W = ToDoubles(w), B = ToDoubles(b), y;
  const size_t c = W.size();
  for (size_t r = 0; r < X.size() / c; ++r) {
    double mu = 0, var = 0;
    for (size_t i = 0; i < c; ++i) mu += X[r * c + i] / double(c);
    for (size_t i = 0; i < c; ++i) var += (X[r * c + i] - mu) * (X[r * c + i] - mu) / double(c);
    for (size_t i = 0; i < c; ++i) {
      y.push_back((X[r * c + i] - mu) / std::sqrt(var + eps) * W[i] + B[i]);
    }
  }
  return y;
}

TEST_F(OpsTest, LayerNorm) {
  Tensor x = Param({2, 3, 6}, -2.0f, 2.0f), w = Param({6}, 0.5f, 1.5f), b = Param({6});
  EXPECT_TRUE(AllClose(LayerNorm(x, w, b), NaiveLayerNorm(x, w, b, 1e-5), 1e-5, 1e-5));
  EXPECT_TRUE(AllClose(LayerNorm(x, w, b, 0.5f), NaiveLayerNorm(x, w, b, 0.5), 1e-5, 1e-5));
  EXPECT_TRUE(Check([](const Inputs& in) { return LayerNorm(in[0], in[1], in[2]); },
                        {x, w, b}));
}

std::vector<double> NaiveSoftmax(const std::vector<double>& x, size_t c) {
  std::vector<double> y(x.size());
  for (size_t r = 0; r < x.size() / c; ++r) {
    double z = 0;
    for (size_t i = 0; i < c; ++i) z += std::exp(x[r * c + i]);
    for (size_t i = 0; i < c; ++i) y[r * c + i] = std::exp(x[r * c + i]) / z;
  }
  return y;
}

TEST_F(OpsTest, Softmax) {
  Tensor x = Param({2, 2, 5}, -3.0f, 3.0f);
  EXPECT_TRUE(AllClose(Softmax(x), NaiveSoftmax(ToDoubles(x), 5), kRtol, kAtol));
  EXPECT_TRUE(Check([](const Inputs& in) { return Softmax(in[0]); }, {x},
                        Tight(2e-4)));
  // Large logits must not overflow.
  Tensor big = Tensor::FromVector<float>({1000, 1001, 999}, {1, 3});
  EXPECT_TRUE(AllClose(Softmax(big), NaiveSoftmax({1, 2, 0}, 3), kRtol, kAtol));
}

// ---- Embedding and loss ---------------------------------------------------------------------

TEST_F(OpsTest, EmbeddingWithRepeatedIds) {
  Tensor w = Param({5, 3});
  Tensor ids = Tensor::FromVector<int32_t>({4, 1, 4, 0, 4, 1}, {2, 3});
  Tensor y = Embedding(w, ids);
  EXPECT_EQ(y.shape(), (Shape{2, 3, 3}));
  std::vector<double> W = ToDoubles(w), want;
  for (int32_t id : ids.ToVector<int32_t>()) {
    for (int i = 0; i < 3; ++i) want.push_back(W[size_t(id * 3 + i)]);
  }
  EXPECT_TRUE(AllClose(y, want, 0, 0));
  EXPECT_TRUE(Check([ids](const Inputs& in) { return Embedding(in[0], ids); }, {w}));
  // Row 4 was used three times: its gradient is the sum of three output rows; rows 2 and 3
  // were never used and get exactly zero.
  w.ZeroGrad();
  std::vector<float> seed(18);
  for (size_t i = 0; i < seed.size(); ++i) seed[i] = float(i);
  Embedding(w, ids).Backward(Tensor::FromVector(seed, {2, 3, 3}));
  std::vector<double> g(15, 0.0);
  std::vector<int32_t> idv = ids.ToVector<int32_t>();
  for (size_t n = 0; n < idv.size(); ++n) {
    for (int i = 0; i < 3; ++i) g[size_t(idv[n] * 3 + i)] += seed[n * 3 + size_t(i)];
  }
  EXPECT_TRUE(AllClose(w.grad(), g, 0, 0));
}

TEST_F(OpsTest, CrossEntropyIgnoresNegativeTargets) {
  const int64_t v = 6;
  Tensor logits = Param({2, 3, v}, -2.0f, 2.0f);
  Tensor targets = Tensor::FromVector<int32_t>({5, -1, 0, 2, 2, -100}, {2, 3});
  std::vector<double> L = ToDoubles(logits);
  std::vector<int32_t> T = targets.ToVector<int32_t>();
  double total = 0;
  int counted = 0;
  for (size_t r = 0; r < T.size(); ++r) {
    if (T[r] < 0) continue;
    double z = 0;
    for (int64_t i = 0; i < v; ++i) z += std::exp(L[r * v + size_t(i)]);
    total += std::log(z) - L[r * v + size_t(T[r])];
    ++counted;
  }
  Tensor loss = CrossEntropy(logits, targets);
  EXPECT_EQ(loss.ndim(), 0);
  EXPECT_NEAR(loss.item(), total / counted, 1e-5);
  EXPECT_TRUE(Check([targets](const Inputs& in) { return CrossEntropy(in[0], targets); },
                        {logits}, Tight(1e-4)));
  // Ignored rows get exactly zero gradient.
  std::vector<float> g = logits.grad().ToFloatVector();
  for (size_t r : {size_t(1), size_t(5)}) {
    for (int64_t i = 0; i < v; ++i) EXPECT_EQ(g[r * v + size_t(i)], 0.0f) << r;
  }
}

// ---- Attention ------------------------------------------------------------------------------

// GPT-2's causal self-attention, head by head: q, k, v are the three C-wide thirds of each
// token's 3C features; head h owns features [h*D, (h+1)*D).
std::vector<double> NaiveAttention(const Tensor& qkv, int n_head) {
  std::vector<double> X = ToDoubles(qkv);
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, D = C / n_head;
  auto get = [&](int64_t b, int64_t t, int which, int64_t h, int64_t d) {
    return X[size_t(b * T * 3 * C + t * 3 * C + which * C + h * D + d)];
  };
  std::vector<double> out(size_t(B * T * C), 0.0);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < n_head; ++h) {
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> s(size_t(T), -INFINITY);
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += get(b, i, 0, h, d) * get(b, j, 1, h, d);
          s[size_t(j)] = dot / std::sqrt(double(D));
        }
        std::vector<double> p = NaiveSoftmax(s, size_t(T));  // exp(-inf) = 0: masked
        for (int64_t d = 0; d < D; ++d) {
          double o = 0;
          for (int64_t j = 0; j < T; ++j) o += p[size_t(j)] * get(b, j, 2, h, d);
          out[size_t(b * T * C + i * C + h * D + d)] = o;
        }
      }
    }
  }
  return out;
}

TEST_F(OpsTest, CausalSelfAttentionTwoHeads) {
  const int64_t B = 2, T = 4, C = 6;
  Tensor qkv = Param({B, T, 3 * C}, -1.5f, 1.5f);
  Tensor y = CausalSelfAttention(qkv, 2);
  EXPECT_EQ(y.shape(), (Shape{B, T, C}));
  EXPECT_TRUE(AllClose(y, NaiveAttention(qkv, 2), 1e-5, 1e-6));
  // With one head the scale is 1/sqrt(6), not 1/sqrt(3): a different result.
  EXPECT_FALSE(AllClose(CausalSelfAttention(qkv, 1), NaiveAttention(qkv, 2), 1e-3, 1e-3));
  EXPECT_TRUE(AllClose(CausalSelfAttention(qkv, 1), NaiveAttention(qkv, 1), 1e-5, 1e-6));
  EXPECT_TRUE(Check([](const Inputs& in) { return CausalSelfAttention(in[0], 2); }, {qkv},
                        Tight(2e-4)));
}

TEST_F(OpsTest, CausalSelfAttentionIsCausal) {
  const int64_t T = 5, C = 4;
  Tensor qkv = Param({1, T, 3 * C});
  std::vector<float> before = CausalSelfAttention(qkv, 2).ToFloatVector();
  // Change q, k and v of token 3: outputs of tokens 0..2 must not move; 3 (and 4) must.
  {
    autograd::NoGradGuard ng;
    float* p = qkv.data<float>();
    for (int64_t f = 0; f < 3 * C; ++f) p[3 * 3 * C + f] += 0.5f;
  }
  std::vector<float> after = CausalSelfAttention(qkv, 2).ToFloatVector();
  for (int64_t i = 0; i < 3 * C; ++i) EXPECT_EQ(after[size_t(i)], before[size_t(i)]) << i;
  for (int64_t t = 3; t < T; ++t) {
    bool moved = false;
    for (int64_t f = 0; f < C; ++f) {
      moved = moved || after[size_t(t * C + f)] != before[size_t(t * C + f)];
    }
    EXPECT_TRUE(moved) << "token " << t;
  }
  // And backward: token 1's output depends on no later token's q, k or v.
  qkv.ZeroGrad();
  std::vector<float> seed(size_t(T * C), 0.0f);
  for (int64_t f = 0; f < C; ++f) seed[size_t(C + f)] = 1.0f;
  CausalSelfAttention(qkv, 2).Backward(Tensor::FromVector(seed, {1, T, C}));
  std::vector<float> g = qkv.grad().ToFloatVector();
  for (int64_t i = 2 * 3 * C; i < T * 3 * C; ++i) EXPECT_EQ(g[size_t(i)], 0.0f) << i;
  bool any = false;
  for (int64_t i = 0; i < 2 * 3 * C; ++i) any = any || g[size_t(i)] != 0.0f;
  EXPECT_TRUE(any);
}

// ---- Views ----------------------------------------------------------------------------------

TEST_F(OpsTest, GradientsFlowThroughViews) {
  Tensor x = Param({4, 3});
  Tensor m = Param({2, 3});
  // Slice: rows 1 and 2 only.
  auto slice_fn = [](const Inputs& in) { return Mul(in[0].Slice(1, 3), in[1]); };
  EXPECT_TRUE(Check(slice_fn, {x, m}));
  std::vector<float> g = x.grad().ToFloatVector();
  for (size_t i : {0, 1, 2, 9, 10, 11}) EXPECT_EQ(g[i], 0.0f) << i;
  // Reshape with -1 feeding a matrix product.
  Tensor w = Param({2, 5});
  EXPECT_TRUE(Check(
      [](const Inputs& in) { return MatMul(in[0].Reshape({-1, 2}), in[1]); }, {x, w}));
  // FlatRange of a flat buffer, viewed with a shape (ZeRO-style shards).
  EXPECT_TRUE(Check(
      [](const Inputs& in) { return Tanh(in[0].Reshape({12}).FlatRange(4, 6, {2, 3})); }, {x}));
  g = x.grad().ToFloatVector();
  for (size_t i = 0; i < 12; ++i) EXPECT_EQ(g[i] == 0.0f, i < 4 || i >= 10) << i;
  // Two overlapping views of one base, and a view of an intermediate: gradients add.
  EXPECT_TRUE(Check(
      [](const Inputs& in) {
        Tensor t = Tanh(in[0]);
        return Add(Mul(t.Slice(0, 2), in[0].Slice(1, 3)),
                   t.Reshape({2, 6}).FlatRange(3, 6, {2, 3}));
      },
      {x}));
}

// ---- Shape errors ---------------------------------------------------------------------------

using OpsDeathTest = OpsTest;

TEST_F(OpsDeathTest, ShapeErrorsNameTheOpAndShapes) {
  Tensor a = Tensor::Zeros({2, 3}), b = Tensor::Zeros({4, 2});
  EXPECT_DEATH(MatMul(a, b), HasSubstr("MatMul: inner dimensions differ (3 vs 4)"));
  EXPECT_DEATH(Add(a, Tensor::Zeros({2})), HasSubstr("Add: shapes do not match: f32[2,3]"));
  EXPECT_DEATH(Mul(a, Tensor::Zeros({3})), HasSubstr("Mul: shapes do not match"));
  EXPECT_DEATH(Linear(a, Tensor::Zeros({5, 4}), Tensor()), HasSubstr("Linear: input f32[2,3]"));
  EXPECT_DEATH(Embedding(a, Tensor::Zeros({2}, DType::kF32)), HasSubstr("i32 ids"));
  EXPECT_DEATH(CrossEntropy(a, Tensor::Zeros({3}, DType::kI32)),
               HasSubstr("one entry per row of logits"));
  EXPECT_DEATH(CausalSelfAttention(Tensor::Zeros({1, 2, 9}), 2), HasSubstr("n_head=2"));
}

}  // namespace
}  // namespace braid::ops
