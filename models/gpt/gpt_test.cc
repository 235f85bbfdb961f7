// The GPT model's contract with PyTorch users: names, shapes, parameter count, tying, init
// statistics, causality and the shape errors a user sees.
#include "models/gpt/gpt.h"

#include <cmath>
#include <map>

#include "core/ops.h"
#include "gtest/gtest.h"

namespace braid::models {
namespace {

TEST(Gpt, MiniHasTheReferenceParameterCountAndNanoGptNames) {
  Gpt g(GptConfig::Mini());
  EXPECT_EQ(g.NumParameters(), 3257856);
  std::map<std::string, Shape> want = {
      {"wte.weight", {256, 256}},           {"wpe.weight", {128, 256}},
      {"ln_f.weight", {256}},               {"ln_f.bias", {256}},
  };
  for (int i = 0; i < 4; ++i) {
    std::string p = "h." + std::to_string(i) + ".";
    want[p + "ln_1.weight"] = {256};
    want[p + "ln_1.bias"] = {256};
    want[p + "attn.c_attn.weight"] = {768, 256};
    want[p + "attn.c_attn.bias"] = {768};
    want[p + "attn.c_proj.weight"] = {256, 256};
    want[p + "attn.c_proj.bias"] = {256};
    want[p + "ln_2.weight"] = {256};
    want[p + "ln_2.bias"] = {256};
    want[p + "mlp.c_fc.weight"] = {1024, 256};
    want[p + "mlp.c_fc.bias"] = {1024};
    want[p + "mlp.c_proj.weight"] = {256, 1024};
    want[p + "mlp.c_proj.bias"] = {256};
  }
  auto sd = g.StateDict();
  ASSERT_EQ(sd.size(), want.size());
  for (auto& [name, shape] : want) {
    ASSERT_TRUE(sd.count(name)) << name;
    EXPECT_EQ(sd[name].shape(), shape) << name;
  }
  EXPECT_EQ(g.NamedBlocks().size(), 4u);
  EXPECT_EQ(g.NamedBlocks()[0].first, "h.0");
}

TEST(Gpt, Gpt2SmallHas124MParameters) {
  GptConfig c = GptConfig::Gpt2_124M();
  c.n_layer = 1;  // building all 12 layers takes seconds; count one and extrapolate exactly
  Gpt one(c);
  int64_t per_layer = 7087872;
  EXPECT_EQ(one.NumParameters(), 50304 * 768 + 1024 * 768 + 2 * 768 + per_layer);
  EXPECT_EQ(50304 * 768 + 1024 * 768 + 2 * 768 + 12 * per_layer, 124475904);
}

TEST(Gpt, InitStatisticsFollowGpt2) {
  Gpt g(GptConfig::Mini());
  auto sd = g.StateDict();
  auto stddev = [](const Tensor& t) {
    std::vector<float> v = t.ToFloatVector();
    double s = 0, s2 = 0;
    for (float x : v) s += x, s2 += double(x) * x;
    double m = s / v.size();
    return std::sqrt(s2 / v.size() - m * m);
  };
  EXPECT_NEAR(stddev(sd["wte.weight"]), 0.02, 0.001);
  EXPECT_NEAR(stddev(sd["h.0.attn.c_attn.weight"]), 0.02, 0.001);
  EXPECT_NEAR(stddev(sd["h.0.mlp.c_proj.weight"]), 0.02 / std::sqrt(8.0), 0.0005);
  EXPECT_NEAR(stddev(sd["h.3.attn.c_proj.weight"]), 0.02 / std::sqrt(8.0), 0.0005);
  for (float x : sd["h.1.ln_1.weight"].ToFloatVector()) ASSERT_EQ(x, 1.0f);
  for (float x : sd["h.1.mlp.c_fc.bias"].ToFloatVector()) ASSERT_EQ(x, 0.0f);
}

TEST(Gpt, HeadIsTiedToTheTokenEmbedding) {
  GptConfig c = GptConfig::Mini();
  c.n_layer = 1;
  Gpt g(c);
  Tensor ids = Tensor::FromVector(std::vector<int32_t>{1, 2, 3, 4}, {1, 4});
  Tensor loss = ops::CrossEntropy(g(ids), Tensor::FromVector(std::vector<int32_t>{2, 3, 4, 5}, {1, 4}));
  loss.Backward();
  Tensor wte = g.StateDict()["wte.weight"];
  // Row 200 is never an input token, so its gradient comes from the head alone: non-zero only
  // if the head really is wte.
  Tensor grad;
  for (auto& [n, p] : g.NamedParameters()) {
    if (n == "wte.weight") grad = p.grad();
  }
  ASSERT_TRUE(grad.defined());
  std::vector<float> gv = grad.ToFloatVector();
  double row200 = 0;
  for (int j = 0; j < 256; ++j) row200 += std::fabs(gv[200 * 256 + j]);
  EXPECT_GT(row200, 0.0);
}

TEST(Gpt, IsCausal) {
  GptConfig c = GptConfig::Mini();
  c.n_layer = 2;
  Gpt g(c);
  Tensor a = g(Tensor::FromVector(std::vector<int32_t>{5, 6, 7, 8, 9}, {1, 5}));
  Tensor b = g(Tensor::FromVector(std::vector<int32_t>{5, 6, 7, 99, 42}, {1, 5}));
  std::vector<float> av = a.ToFloatVector(), bv = b.ToFloatVector();
  for (int i = 0; i < 3 * 256; ++i) ASSERT_FLOAT_EQ(av[i], bv[i]) << "position " << i / 256;
  double diff = 0;
  for (int i = 3 * 256; i < 5 * 256; ++i) diff += std::fabs(av[i] - bv[i]);
  EXPECT_GT(diff, 0.0);
}

TEST(GptDeathTest, RejectsTooLongOrWrongTypedInput) {
  GptConfig c = GptConfig::Mini();
  c.n_layer = 1;
  c.block_size = 4;
  Gpt g(c);
  EXPECT_DEATH(g(Tensor::Zeros({1, 5}, DType::kI32)), "T <= block_size 4");
  EXPECT_DEATH(g(Tensor::Zeros({1, 3}, DType::kF32)), "must be i32 token ids");
}

TEST(Gpt, ConfigByName) {
  EXPECT_TRUE(GptConfig::ByName("gpt-mini").ok());
  EXPECT_TRUE(GptConfig::ByName("gpt2-124m").ok());
  auto bad = GptConfig::ByName("gpt-huge");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("known: gpt-mini, gpt2-124m"), std::string::npos);
}

}  // namespace
}  // namespace braid::models
