// GPT with stable_embedding (bitsandbytes' StableEmbedding: a LayerNorm on the token embedding's
// output): its parameters and their names, that it changes nothing else, the pipeline layers,
// forward against a double-precision reference, backward against finite differences, and that
// it trains.
#include <cmath>
#include <map>
#include <random>
#include <set>

#include "core/autograd.h"
#include "core/ops.h"
#include "core/optimizer.h"
#include "core/testing/compare.h"
#include "gtest/gtest.h"
#include "models/gpt/gpt.h"

namespace braid::models {
namespace {

GptConfig Tiny() {
  GptConfig c;
  c.vocab_size = c.padded_vocab_size = 16;
  c.block_size = 6;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_embd = 8;
  c.stable_embedding = true;
  return c;
}

Tensor Param(const Module& m, const std::string& name) {
  for (auto& [n, p] : m.NamedParameters()) {
    if (n == name) return p;
  }
  ADD_FAILURE() << "no parameter " << name;
  return Tensor();
}

// Values away from LayerNorm's defaults (ones, zeros), so a norm that ignored them would show.
void Randomize(Tensor p, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, 0.5f);
  float* d = p.data<float>();
  for (int64_t i = 0; i < p.numel(); ++i) d[i] += n(rng);
}

TEST(StableEmbedding, AddsANormWithoutWeightDecayAndNamesTheEmbedding) {
  GptConfig c = GptConfig::Mini();
  c.stable_embedding = true;
  Gpt on(c);
  EXPECT_EQ(on.NumParameters(), 3257856 + 2 * 256);
  auto sd = on.StateDict();
  ASSERT_TRUE(sd.count("wte_norm.weight") && sd.count("wte_norm.bias"));
  EXPECT_EQ(sd["wte_norm.weight"].shape(), Shape({256}));
  for (float x : sd["wte_norm.weight"].ToFloatVector()) ASSERT_EQ(x, 1.0f);
  for (float x : sd["wte_norm.bias"].ToFloatVector()) ASSERT_EQ(x, 0.0f);
  EXPECT_FALSE(Param(on, "wte_norm.weight").weight_decay());
  EXPECT_FALSE(Param(on, "wte_norm.bias").weight_decay());
  EXPECT_TRUE(Param(on, "wte.weight").weight_decay());
  // The name plugins/adam8bit keeps 32-bit states for.
  EXPECT_EQ(Param(on, "wte.weight").name(), "wte.weight");

  Gpt off(GptConfig::Mini());
  EXPECT_EQ(off.NumParameters(), 3257856);
  EXPECT_EQ(off.StateDict().count("wte_norm.weight"), 0u);
  EXPECT_EQ(Param(off, "wte.weight").name(), "weight");  // unchanged without it
}

TEST(StableEmbedding, LeavesEveryOtherParameterAsItWas) {
  GptConfig c = GptConfig::Mini();
  c.n_layer = 2;
  Gpt off(c);
  c.stable_embedding = true;
  Gpt on(c);
  auto a = off.StateDict(), b = on.StateDict();
  EXPECT_EQ(b.size(), a.size() + 2);
  for (auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    EXPECT_EQ(t.ToFloatVector(), b[name].ToFloatVector()) << name << " changed";
  }
}

TEST(StableEmbedding, NormIsInTheEmbeddingLayerAndLayersComposeToForward) {
  Gpt g(Tiny());
  std::vector<PipelineLayer> layers = g.PipelineLayers();
  ASSERT_EQ(layers.size(), 3u);
  EXPECT_EQ(layers[0].name, "embedding");
  EXPECT_EQ(layers[0].parameters, (std::vector<std::string>{"wte.weight", "wte_norm.weight",
                                                            "wte_norm.bias", "wpe.weight"}));
  std::set<std::string> listed;
  for (const PipelineLayer& l : layers) listed.insert(l.parameters.begin(), l.parameters.end());
  std::set<std::string> all;
  for (auto& [n, p] : g.NamedParameters()) all.insert(n);
  EXPECT_EQ(listed, all);  // every parameter belongs to a layer (a pipeline stage)

  Randomize(Param(g, "wte_norm.weight"), 1);
  Tensor ids = Tensor::FromVector(std::vector<int32_t>{3, 1, 4, 1, 5, 9, 2, 6}, {2, 4});
  Tensor x = ids;
  for (const PipelineLayer& l : layers) x = l.forward(x);
  EXPECT_EQ(x.ToFloatVector(), g(ids).ToFloatVector());
}

// The embedding layer's output, LayerNorm(wte[id]) * w + b + wpe[t], against the same in double.
// Tolerance 1e-5 x (1 + |reference|): f32 arithmetic on values of order 1 over 8 features.
TEST(StableEmbedding, ForwardMatchesADoubleReference) {
  GptConfig c = Tiny();
  Gpt g(c);
  Randomize(Param(g, "wte_norm.weight"), 1);
  Randomize(Param(g, "wte_norm.bias"), 2);
  Randomize(Param(g, "wte.weight"), 3);  // wte's 0.02 init would make the norm's input tiny
  const std::vector<int32_t> id = {3, 1, 4, 1, 5, 9, 2, 6, 15, 0, 7, 7};
  Tensor out = g.PipelineLayers()[0].forward(Tensor::FromVector(id, {2, 6}));
  ASSERT_EQ(out.shape(), Shape({2, 6, 8}));
  std::vector<float> y = out.ToFloatVector();
  std::vector<float> wte = Param(g, "wte.weight").ToFloatVector();
  std::vector<float> wpe = Param(g, "wpe.weight").ToFloatVector();
  std::vector<float> w = Param(g, "wte_norm.weight").ToFloatVector();
  std::vector<float> b = Param(g, "wte_norm.bias").ToFloatVector();
  const int C = 8;
  double worst = 0;
  for (int i = 0; i < 12; ++i) {
    double mean = 0, var = 0;
    for (int j = 0; j < C; ++j) mean += wte[id[i] * C + j];
    mean /= C;
    for (int j = 0; j < C; ++j) var += std::pow(wte[id[i] * C + j] - mean, 2);
    var /= C;  // biased, as PyTorch's LayerNorm
    for (int j = 0; j < C; ++j) {
      double ref = (wte[id[i] * C + j] - mean) / std::sqrt(var + double(c.ln_eps)) * w[j] + b[j] +
                   wpe[(i % 6) * C + j];
      double err = std::fabs(y[i * C + j] - ref) / (1 + std::fabs(ref));
      worst = testing::Worst(worst, err);  // std::max would record a NaN err as nothing
      ASSERT_LE(err, 1e-5) << "token " << i << " feature " << j << ": " << y[i * C + j]
                           << " vs " << ref;
    }
  }
  RecordProperty("worst_relative_error", std::to_string(worst));
}

// The whole model's loss against central differences, for the norm's weight and bias and for
// wte rows reached through the norm (inputs) and through the tied head only. Step 1e-2 in f32;
// tolerance 2e-4 + 1% of the derivative (the f32 loss's rounding over the step is ~1e-5; the
// worst error measured was 2.3e-5, printed by the test).
TEST(StableEmbedding, BackwardMatchesFiniteDifferences) {
  Gpt g(Tiny());
  Randomize(Param(g, "wte_norm.weight"), 4);
  Randomize(Param(g, "wte_norm.bias"), 5);
  Randomize(Param(g, "wte.weight"), 6);
  Tensor ids = Tensor::FromVector(std::vector<int32_t>{3, 1, 4, 1, 5, 9, 2, 6}, {2, 4});
  Tensor targets = Tensor::FromVector(std::vector<int32_t>{1, 4, 1, 5, 9, 2, 6, 5}, {2, 4});
  auto loss = [&] { return ops::CrossEntropy(g(ids), targets); };
  loss().Backward();
  // (parameter, flat index): every norm feature; wte row 3 (an input) and row 12 (head only).
  std::vector<std::pair<std::string, int>> probes;
  for (int j = 0; j < 8; ++j) probes.push_back({"wte_norm.weight", j});
  for (int j = 0; j < 8; ++j) probes.push_back({"wte_norm.bias", j});
  for (int j = 0; j < 8; j += 3) probes.push_back({"wte.weight", 3 * 8 + j});
  for (int j = 0; j < 8; j += 3) probes.push_back({"wte.weight", 12 * 8 + j});
  autograd::NoGradGuard no_grad;
  const float h = 1e-2f;
  double worst = 0;
  for (auto& [name, i] : probes) {
    Tensor p = Param(g, name);
    float analytic = p.grad().ToFloatVector()[i];
    float* v = p.data<float>() + i;
    const float keep = *v;
    *v = keep + h;
    double up = loss().ToFloatVector()[0];
    *v = keep - h;
    double down = loss().ToFloatVector()[0];
    *v = keep;
    double fd = (up - down) / (2 * h);
    worst = testing::Worst(worst, std::fabs(analytic - fd));
    // The tolerance grows with |fd|: an infinite fd would make it infinite and pass anything.
    EXPECT_TRUE(std::isfinite(fd)) << name << "[" << i << "]: finite difference " << fd;
    EXPECT_NEAR(analytic, fd, 2e-4 + 0.01 * std::fabs(fd)) << name << "[" << i << "]";
  }
  std::printf("worst |analytic - finite difference| = %.3g\n", worst);
}

// Trains: a tiny GPT with stable_embedding learns a fixed cyclic sequence with AdamW (the loss
// falls from ln 16 = 2.77 to under 0.5 in 150 steps; deterministic).
TEST(StableEmbedding, Trains) {
  Gpt g(Tiny());
  std::vector<int32_t> seq = {0, 5, 3, 9, 12, 7, 1};
  std::vector<int32_t> in, tg;
  for (int b = 0; b < 4; ++b) {
    for (int t = 0; t < 6; ++t) {
      in.push_back(seq[(b + t) % 7]);
      tg.push_back(seq[(b + t + 1) % 7]);
    }
  }
  Tensor ids = Tensor::FromVector(in, {4, 6}), targets = Tensor::FromVector(tg, {4, 6});
  ParamGroup group;
  group.lr = 1e-2f;
  group.params = g.Parameters();
  std::unique_ptr<Optimizer> opt = MakeAdamW({group});
  float first = 0, last = 0;
  for (int step = 0; step < 150; ++step) {
    opt->ZeroGrad();
    Tensor loss = ops::CrossEntropy(g(ids), targets);
    loss.Backward();
    opt->Step();
    last = loss.ToFloatVector()[0];
    if (step == 0) first = last;
  }
  EXPECT_NEAR(first, std::log(16.0f), 0.3f);
  EXPECT_LT(last, 0.5f) << "first loss " << first;
  // The norm's parameters were trained too (they got gradients and moved).
  std::vector<float> w = Param(g, "wte_norm.weight").ToFloatVector();
  double moved = 0;
  for (float x : w) moved += std::fabs(x - 1.0f);
  EXPECT_GT(moved, 1e-3);
}

}  // namespace
}  // namespace braid::models
