// Dropout under activation checkpointing: the recompute runs the block's forward again with the
// same seed, so it draws the same mask and the gradients are bitwise those of the plain model.
// A Llama-shaped block (RmsNorm, GQA with RoPE, SwiGLU MLP, dropout after each) on the reference
// kernels.
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/module.h"
#include "core/ops.h"
#include "core/testing/test_util.h"
#include "gtest/gtest.h"
#include "launcher/activation_checkpointing/activation_checkpointing.h"

namespace braid {
namespace {

constexpr int64_t kC = 8, kHeads = 4, kKvHeads = 2, kHeadDim = 2, kHidden = 12;

class LlamaBlock : public Module {
 public:
  LlamaBlock(uint64_t seed, std::mt19937& rng) : Module("LlamaBlock"), seed_(seed) {
    auto p = [&](const char* name, const Shape& s, float lo, float hi) {
      return RegisterParameter(name, test::RandomTensor(s, rng, lo, hi));
    };
    norm1 = p("norm1", {kC}, 0.8f, 1.2f);
    wq = p("wq", {kHeads * kHeadDim, kC}, -0.4f, 0.4f);
    wk = p("wk", {kKvHeads * kHeadDim, kC}, -0.4f, 0.4f);
    wv = p("wv", {kKvHeads * kHeadDim, kC}, -0.4f, 0.4f);
    wo = p("wo", {kC, kHeads * kHeadDim}, -0.4f, 0.4f);
    norm2 = p("norm2", {kC}, 0.8f, 1.2f);
    wg = p("wg", {kHidden, kC}, -0.4f, 0.4f);
    wu = p("wu", {kHidden, kC}, -0.4f, 0.4f);
    wd = p("wd", {kC, kHidden}, -0.4f, 0.4f);
  }
  Tensor Forward(const Tensor& x) override {
    const int64_t b = x.size(0), t = x.size(1);
    Tensor h = ops::RmsNorm(x, norm1);
    Tensor q = ops::RotaryEmbedding(ops::Linear(h, wq, Tensor()).Reshape({b, t, kHeads, kHeadDim}));
    Tensor k =
        ops::RotaryEmbedding(ops::Linear(h, wk, Tensor()).Reshape({b, t, kKvHeads, kHeadDim}));
    Tensor v = ops::Linear(h, wv, Tensor()).Reshape({b, t, kKvHeads, kHeadDim});
    Tensor a = ops::GroupedQueryAttention(q, k, v).Reshape({b, t, kHeads * kHeadDim});
    Tensor x1 = ops::Add(x, ops::Dropout(ops::Linear(a, wo, Tensor()), 0.3f, seed_));
    Tensor h2 = ops::RmsNorm(x1, norm2);
    Tensor m = ops::Linear(ops::SwiGlu(ops::Linear(h2, wg, Tensor()), ops::Linear(h2, wu, Tensor())),
                           wd, Tensor());
    return ops::Add(x1, ops::Dropout(m, 0.3f, seed_ + 1));
  }
  Tensor norm1, wq, wk, wv, wo, norm2, wg, wu, wd;

 private:
  uint64_t seed_;
};

class Stack : public Module {
 public:
  explicit Stack(std::mt19937& rng) : Module("Stack") {
    for (int i = 0; i < 3; ++i) {
      blocks.push_back(RegisterModule("h." + std::to_string(i),
                                      std::make_unique<LlamaBlock>(100 + 10 * i, rng)));
    }
  }
  Tensor Forward(const Tensor& x) override {
    Tensor y = x;
    for (LlamaBlock* b : blocks) y = (*b)(y);
    return y;
  }
  std::vector<LlamaBlock*> blocks;
};

// Every parameter's gradient after one backward of sum(model(x) * r).
std::vector<std::vector<float>> Grads(Stack& model, const Tensor& x, const Tensor& r) {
  for (Tensor& p : model.Parameters()) p.ZeroGrad();
  ops::Sum(ops::Mul(model(x), r)).Backward();
  std::vector<std::vector<float>> g;
  for (const Tensor& p : model.Parameters()) g.push_back(p.grad().ToFloatVector());
  return g;
}

TEST(LlamaCheckpointTest, DropoutReplaysItsMaskWhenRecomputed) {
  std::mt19937 rng(3);
  Stack model(rng);
  Tensor x = test::RandomTensor({2, 5, kC}, rng), r = test::RandomTensor({2, 5, kC}, rng);
  const std::vector<std::vector<float>> plain = Grads(model, x, r);

  std::vector<std::pair<std::string, Module*>> segment;
  for (size_t i = 0; i < model.blocks.size(); ++i) {
    segment.emplace_back("h." + std::to_string(i), model.blocks[i]);
  }
  ASSERT_TRUE(CheckpointSegment(segment).ok());
  ResetActivationCheckpointStats();
  const std::vector<std::vector<float>> checkpointed = Grads(model, x, r);
  EXPECT_GT(GetActivationCheckpointStats().recomputes, 0) << "nothing was recomputed";
  ASSERT_EQ(plain.size(), checkpointed.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    bool nonzero = false;
    for (float v : plain[i]) nonzero = nonzero || v != 0.0f;
    EXPECT_TRUE(nonzero) << "parameter " << i << ": an all-zero gradient proves nothing";
    EXPECT_EQ(checkpointed[i], plain[i]) << "parameter " << i;
  }
}

}  // namespace
}  // namespace braid
