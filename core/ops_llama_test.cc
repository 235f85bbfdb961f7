// The Llama-family ops of core/ops.h (RmsNorm, Silu, SwiGlu, RotaryEmbedding): forward against
// naive double-precision formulas written here, backward against central differences
// (test_util's GradCheck). Runs on the reference kernels, like ops_test.
#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "core/autograd.h"
#include "core/ops.h"
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

class LlamaOpsTest : public ::testing::Test {
 protected:
  Tensor Param(const Shape& shape, float lo = -1.0f, float hi = 1.0f) {
    Tensor t = test::RandomTensor(shape, rng_, lo, hi);
    t.set_requires_grad(true);
    return t;
  }
  std::mt19937 rng_{24};
};

// Forward tolerance for f32 results of double-precision formulas.
constexpr double kRtol = 1e-5, kAtol = 1e-6;

// As ops_test's Tight: a gradient off by a few tenths of a percent fails.
test::GradCheckOptions Tight(double atol = 2e-4) {
  test::GradCheckOptions o;
  o.rtol = 2e-3;
  o.atol = atol;
  return o;
}

// ---- RmsNorm --------------------------------------------------------------------------------

std::vector<double> NaiveRmsNorm(const Tensor& x, const Tensor& w, double eps) {
  std::vector<double> X = ToDoubles(x), W = ToDoubles(w), y;
  const size_t c = W.size();
  for (size_t r = 0; r < X.size() / c; ++r) {
    double ms = 0;
    for (size_t i = 0; i < c; ++i) ms += X[r * c + i] * X[r * c + i] / double(c);
    for (size_t i = 0; i < c; ++i) y.push_back(X[r * c + i] / std::sqrt(ms + eps) * W[i]);
  }
  return y;
}

TEST_F(LlamaOpsTest, RmsNorm) {
  Tensor x = Param({2, 3, 6}, -2.0f, 2.0f), w = Param({6}, 0.5f, 1.5f);
  EXPECT_TRUE(AllClose(RmsNorm(x, w), NaiveRmsNorm(x, w, 1e-6), kRtol, kAtol));
  EXPECT_TRUE(AllClose(RmsNorm(x, w, 0.5f), NaiveRmsNorm(x, w, 0.5), kRtol, kAtol));
  EXPECT_TRUE(GradCheck([](const Inputs& in) { return RmsNorm(in[0], in[1]); }, {x, w}, Tight()));
  EXPECT_TRUE(
      GradCheck([](const Inputs& in) { return RmsNorm(in[0], in[1], 0.5f); }, {x, w}, Tight()));
}

TEST_F(LlamaOpsTest, RmsNormIsScaleInvariantUnlikeLayerNormItDoesNotCenter) {
  // rms(a x) = |a| rms(x): scaling a row leaves the output (eps aside) unchanged; adding a
  // constant does change it (LayerNorm would remove the constant).
  Tensor x = Param({2, 8}), w = Param({8}, 0.5f, 1.5f);
  std::vector<double> base = ToDoubles(RmsNorm(x, w, 0.0f));
  EXPECT_TRUE(AllClose(RmsNorm(Scale(x, 7.0f), w, 0.0f), base, 1e-5, 1e-6));
  EXPECT_FALSE(AllClose(RmsNorm(Add(x, Tensor::Full({8}, 3.0f)), w, 0.0f), base, 1e-2, 1e-2));
}

// ---- Silu and SwiGlu ------------------------------------------------------------------------

double NaiveSilu(double g) { return g / (1.0 + std::exp(-g)); }

TEST_F(LlamaOpsTest, Silu) {
  Tensor a = Param({3, 7}, -6.0f, 6.0f);
  std::vector<double> want;
  for (double v : ToDoubles(a)) want.push_back(NaiveSilu(v));
  EXPECT_TRUE(AllClose(Silu(a), want, kRtol, kAtol));
  EXPECT_TRUE(GradCheck([](const Inputs& in) { return Silu(in[0]); }, {a}, Tight()));
}

TEST_F(LlamaOpsTest, SwiGlu) {
  Tensor gate = Param({2, 3, 5}, -4.0f, 4.0f), up = Param({2, 3, 5}, -2.0f, 2.0f);
  std::vector<double> g = ToDoubles(gate), u = ToDoubles(up), want;
  for (size_t i = 0; i < g.size(); ++i) want.push_back(NaiveSilu(g[i]) * u[i]);
  EXPECT_TRUE(AllClose(SwiGlu(gate, up), want, kRtol, kAtol));
  EXPECT_TRUE(GradCheck([](const Inputs& in) { return SwiGlu(in[0], in[1]); }, {gate, up},
                        Tight()));
}

TEST_F(LlamaOpsTest, SwiGluEqualsMulOfSilu) {
  // The fused op against its two-op composition, forward and both gradients.
  Tensor gate = Param({4, 6}, -3.0f, 3.0f), up = Param({4, 6});
  Tensor r = test::RandomTensor({4, 6}, rng_);
  Sum(Mul(SwiGlu(gate, up), r)).Backward();
  std::vector<double> fused_dg = ToDoubles(gate.grad()), fused_du = ToDoubles(up.grad());
  std::vector<double> fused = ToDoubles(SwiGlu(gate, up));
  gate.ZeroGrad();
  up.ZeroGrad();
  Tensor composed = Mul(Silu(gate), up);
  EXPECT_TRUE(AllClose(composed, fused, 1e-6, 1e-7));
  Sum(Mul(composed, r)).Backward();
  EXPECT_TRUE(AllClose(gate.grad(), fused_dg, 1e-5, 1e-6));
  EXPECT_TRUE(AllClose(up.grad(), fused_du, 1e-5, 1e-6));
}

// ---- RotaryEmbedding ------------------------------------------------------------------------

// Hugging Face's formulation, written independently of the kernels' pair loop:
// out = x * cos(emb) + rotate_half(x) * sin(emb), emb = cat(freqs, freqs),
// rotate_half(x) = cat(-x2, x1), freqs[i] = pos / theta^(2i/D).
std::vector<double> NaiveRope(const Tensor& x, const RopeOptions& o) {
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), D = x.size(3), half = D / 2;
  std::vector<double> X = ToDoubles(x), y(X.size());
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const double pos = double(o.position_offset + t) / double(o.position_scale);
      for (int64_t h = 0; h < H; ++h) {
        const size_t base = size_t(((b * T + t) * H + h) * D);
        for (int64_t j = 0; j < D; ++j) {
          const int64_t i = j % half;
          const double emb = pos / std::pow(double(o.theta), double(2 * i) / double(D));
          const double rot = j < half ? -X[base + size_t(j + half)] : X[base + size_t(j - half)];
          y[base + size_t(j)] = X[base + size_t(j)] * std::cos(emb) + rot * std::sin(emb);
        }
      }
    }
  }
  return y;
}

TEST_F(LlamaOpsTest, RotaryEmbeddingForward) {
  const std::vector<RopeOptions> options = {
      {}, {500000.0f, 1.0f, 0}, {10000.0f, 4.0f, 0}, {10000.0f, 2.0f, 37}, {1e6f, 8.0f, 4000}};
  // NaiveRope reads o.theta only: the NTK case is checked below against the adjusted theta.
  for (const RopeOptions& o : options) {
    Tensor x = Param({2, 5, 3, 8});
    EXPECT_TRUE(AllClose(RotaryEmbedding(x, o), NaiveRope(x, o), kRtol, kAtol))
        << "theta " << o.theta << " scale " << o.position_scale << " offset "
        << o.position_offset;
  }
}

TEST_F(LlamaOpsTest, RotaryEmbeddingNtkScalingIsTheAdjustedTheta) {
  Tensor x = Param({1, 6, 2, 8});
  RopeOptions ntk{10000.0f, 1.0f, 100, 4.0f};
  RopeOptions plain{float(10000.0 * std::pow(4.0, 8.0 / 6.0)), 1.0f, 100};
  EXPECT_TRUE(AllClose(RotaryEmbedding(x, ntk), NaiveRope(x, plain), kRtol, kAtol));
  // ... and it is not the unscaled rotation.
  RopeOptions unscaled{10000.0f, 1.0f, 100};
  EXPECT_FALSE(AllClose(RotaryEmbedding(x, ntk), NaiveRope(x, unscaled), 1e-3, 1e-3));
}

TEST_F(LlamaOpsTest, RotaryEmbeddingBackward) {
  Tensor x = Param({2, 4, 2, 6});
  RopeOptions o{10000.0f, 2.0f, 3};
  EXPECT_TRUE(GradCheck([o](const Inputs& in) { return RotaryEmbedding(in[0], o); }, {x},
                        Tight()));
  EXPECT_TRUE(GradCheck([](const Inputs& in) { return RotaryEmbedding(in[0]); }, {x}, Tight()));
}

TEST_F(LlamaOpsTest, RotaryEmbeddingScoresDependOnRelativePositionOnly) {
  // What RoPE is for: <rope(q, m), rope(k, n)> depends on m - n only. q at t = 0 and k at
  // t = 1 of a 2-step sequence, shifted together by the offset, give the same score.
  Tensor q = test::RandomTensor({1, 1, 1, 16}, rng_), k = test::RandomTensor({1, 1, 1, 16}, rng_);
  std::vector<float> qk = q.ToFloatVector(), kv = k.ToFloatVector();
  // Sequence [q, k]: q sits at offset, k at offset + 1.
  std::vector<float> both = qk;
  both.insert(both.end(), kv.begin(), kv.end());
  Tensor seq = Tensor::FromVector(both, {1, 2, 1, 16});
  auto score = [&](int64_t offset) {
    std::vector<double> r = ToDoubles(RotaryEmbedding(seq, {10000.0f, 1.0f, offset}));
    double s = 0;
    for (size_t i = 0; i < 16; ++i) s += r[i] * r[16 + i];
    return s;
  };
  const double s0 = score(0);
  for (int64_t offset : {1, 10, 1000}) EXPECT_NEAR(score(offset), s0, 1e-4) << offset;
  // ... and the rotation did something: the score at distance 1 is not the unrotated dot.
  double plain = 0;
  for (size_t i = 0; i < 16; ++i) plain += double(qk[i]) * kv[i];
  EXPECT_GT(std::fabs(s0 - plain), 1e-3);
}

// ---- GroupedQueryAttention ------------------------------------------------------------------

// softmax(q k^T / sqrt(D) + causal mask) v per query head, head h reading K/V head
// h / (H / Hkv), in double.
std::vector<double> NaiveGqa(const Tensor& q, const Tensor& k, const Tensor& v) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), D = q.size(3), Hkv = k.size(2);
  std::vector<double> Q = ToDoubles(q), K = ToDoubles(k), V = ToDoubles(v);
  std::vector<double> out(Q.size(), 0.0);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / Hkv);
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> w(size_t(t + 1));
        double z = 0;
        for (int64_t u = 0; u <= t; ++u) {
          double s = 0;
          for (int64_t i = 0; i < D; ++i) {
            s += Q[size_t(((b * T + t) * H + h) * D + i)] * K[size_t(((b * T + u) * Hkv + g) * D + i)];
          }
          w[size_t(u)] = std::exp(s / std::sqrt(double(D)));
          z += w[size_t(u)];
        }
        for (int64_t u = 0; u <= t; ++u) {
          for (int64_t i = 0; i < D; ++i) {
            out[size_t(((b * T + t) * H + h) * D + i)] +=
                w[size_t(u)] / z * V[size_t(((b * T + u) * Hkv + g) * D + i)];
          }
        }
      }
    }
  }
  return out;
}

TEST_F(LlamaOpsTest, GroupedQueryAttention) {
  for (int64_t hkv : {4, 2, 1}) {
    Tensor q = Param({2, 5, 4, 3}, -2.0f, 2.0f), k = Param({2, 5, hkv, 3}, -2.0f, 2.0f);
    Tensor v = Param({2, 5, hkv, 3});
    EXPECT_TRUE(AllClose(GroupedQueryAttention(q, k, v), NaiveGqa(q, k, v), kRtol, kAtol))
        << hkv << " K/V heads";
    EXPECT_TRUE(GradCheck(
        [](const Inputs& in) { return GroupedQueryAttention(in[0], in[1], in[2]); }, {q, k, v},
        Tight()))
        << hkv << " K/V heads";
  }
}

TEST_F(LlamaOpsTest, GroupedQueryAttentionWithAllHeadsIsCausalSelfAttention) {
  // Hkv = H is multi-head attention: the same numbers as CausalSelfAttention on the fused qkv.
  const int64_t B = 2, T = 6, H = 2, D = 4, C = H * D;
  Tensor qkv = test::RandomTensor({B, T, 3 * C}, rng_);
  std::vector<float> all = qkv.ToFloatVector(), q, k, v;
  for (int64_t r = 0; r < B * T; ++r) {
    for (int64_t j = 0; j < C; ++j) {
      q.push_back(all[size_t(r * 3 * C + j)]);
      k.push_back(all[size_t(r * 3 * C + C + j)]);
      v.push_back(all[size_t(r * 3 * C + 2 * C + j)]);
    }
  }
  Tensor gqa = GroupedQueryAttention(Tensor::FromVector(q, {B, T, H, D}),
                                     Tensor::FromVector(k, {B, T, H, D}),
                                     Tensor::FromVector(v, {B, T, H, D}));
  EXPECT_TRUE(AllClose(gqa, ToDoubles(CausalSelfAttention(qkv, int(H))), 1e-5, 1e-6));
}

// ---- Dropout ----------------------------------------------------------------------------------

TEST_F(LlamaOpsTest, DropoutKeepsAboutOneMinusPAndScalesTheRest) {
  const int64_t n = 200000;
  Tensor x = test::RandomTensorAwayFromZero({n}, rng_, 0.1f);
  for (float p : {0.1f, 0.5f, 0.9f}) {
    std::vector<double> X = ToDoubles(x), Y = ToDoubles(Dropout(x, p, 1234));
    int64_t kept = 0;
    std::vector<double> want(X.size());
    for (size_t i = 0; i < X.size(); ++i) {
      // x is never 0, so a 0 output is a dropped element.
      const bool keep = Y[i] != 0.0;
      kept += keep;
      want[i] = keep ? X[i] / (1.0 - double(p)) : 0.0;
    }
    EXPECT_TRUE(AllClose(Tensor::FromVector(std::vector<float>(Y.begin(), Y.end()), {n}), want,
                         1e-6, 0.0))
        << p;
    // The kept fraction of 200000 Bernoulli(1 - p) draws: 5 standard deviations is <= 0.0034.
    EXPECT_NEAR(double(kept) / double(n), 1.0 - double(p), 0.005) << p;
  }
}

TEST_F(LlamaOpsTest, DropoutIsReproducibleFromItsSeed) {
  Tensor x = test::RandomTensor({4, 257}, rng_);
  const std::vector<float> a = Dropout(x, 0.3f, 7).ToFloatVector();
  EXPECT_EQ(Dropout(x, 0.3f, 7).ToFloatVector(), a);
  EXPECT_NE(Dropout(x, 0.3f, 8).ToFloatVector(), a);
  // p = 0 is the identity (x itself), p = 1 zeroes everything.
  EXPECT_EQ(Dropout(x, 0.0f, 7).ToFloatVector(), x.ToFloatVector());
  EXPECT_EQ(Dropout(x, 1.0f, 7).ToFloatVector(), std::vector<float>(size_t(x.numel()), 0.0f));
}

TEST_F(LlamaOpsTest, DropoutBackwardUsesTheSameMask) {
  Tensor x = Param({3, 11});
  EXPECT_TRUE(
      GradCheck([](const Inputs& in) { return Dropout(in[0], 0.4f, 5); }, {x}, Tight()));
  // The gradient of sum(Dropout(x)) is the mask times 1 / (1 - p): zero exactly where the
  // output is.
  x.ZeroGrad();
  Tensor y = Dropout(x, 0.4f, 5);
  Sum(y).Backward();
  std::vector<float> Y = y.ToFloatVector(), G = x.grad().ToFloatVector();
  ASSERT_EQ(Y.size(), G.size());
  for (size_t i = 0; i < Y.size(); ++i) {
    EXPECT_EQ(G[i] == 0.0f, Y[i] == 0.0f) << i;
    if (G[i] != 0.0f) {
      EXPECT_FLOAT_EQ(G[i], 1.0f / 0.6f) << i;
    }
  }
}

// ---- Shape errors -----------------------------------------------------------------------------

TEST(LlamaOpsDeathTest, ShapeErrorsNameTheOpAndShapes) {
  Tensor x = Tensor::Zeros({2, 6});
  EXPECT_DEATH(RmsNorm(x, Tensor::Zeros({5})), "RmsNorm: weight .*5.* must be \\[6\\]");
  EXPECT_DEATH(SwiGlu(x, Tensor::Zeros({2, 5})), "SwiGlu: gate .* and up .* same shape");
  EXPECT_DEATH(RotaryEmbedding(Tensor::Zeros({1, 2, 1, 5})), "head_dim even");
  EXPECT_DEATH(RotaryEmbedding(x), "RotaryEmbedding wants x \\[B, T, n_head, head_dim\\]");
  EXPECT_DEATH(RotaryEmbedding(Tensor::Zeros({1, 2, 1, 4}), {10000.0f, 0.0f, 0}),
               "position_scale 0 and ntk_factor 1 must be positive");
  EXPECT_DEATH(GroupedQueryAttention(Tensor::Zeros({1, 2, 3, 4}), Tensor::Zeros({1, 2, 2, 4}),
                                     Tensor::Zeros({1, 2, 2, 4})),
               "n_head a multiple of n_kv_head");
  EXPECT_DEATH(Dropout(x, 1.5f, 1), "Dropout: p 1.5 is not in \\[0, 1\\]");
}

}  // namespace
}  // namespace braid::ops
