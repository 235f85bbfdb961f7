// The step helpers of activation_checkpointing_test_util.h: one training step's results, and
// bitwise comparisons of two of them.
#include "launcher/activation_checkpointing/activation_checkpointing_test_util.h"

#include <cstring>

#include "gtest/gtest.h"

namespace braid::checkpointing_test {

Batch MakeBatch(const Shape4& s, int64_t b, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(size_t(b * s.t)), targets(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = int32_t(rng() % uint32_t(s.vocab));
    targets[i] = int32_t(rng() % uint32_t(s.vocab));
  }
  return {Tensor::FromVector(ids, {b, s.t}), Tensor::FromVector(targets, {b, s.t})};
}

StepResult Step(Module& model, const Batch& batch, int backwards) {
  model.ZeroGrad();
  StepResult r;
  Tensor logits = model(batch.ids);
  Tensor loss = ops::CrossEntropy(logits, batch.targets);
  for (int i = 0; i < backwards; ++i) loss.Backward(Tensor(), /*retain_graph=*/i + 1 < backwards);
  r.logits = logits.ToFloatVector();
  r.loss = loss.item();
  for (auto& [name, p] : model.NamedParameters()) {
    r.grads[name] = p.grad().defined() ? p.grad().ToFloatVector() : std::vector<float>();
  }
  return r;
}

bool Bitwise(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void ExpectIdentical(const StepResult& plain, const StepResult& ckpt, const std::string& what) {
  EXPECT_TRUE(Bitwise(plain.logits, ckpt.logits)) << what << ": forward output differs";
  EXPECT_EQ(std::memcmp(&plain.loss, &ckpt.loss, sizeof(float)), 0) << what;
  ASSERT_EQ(plain.grads.size(), ckpt.grads.size());
  for (auto& [name, g] : plain.grads) {
    EXPECT_FALSE(g.empty()) << what << ": " << name << " got no gradient";
    EXPECT_TRUE(Bitwise(g, ckpt.grads.at(name))) << what << ": gradient of " << name << " differs";
  }
}

CheckpointPolicy Policy(CheckpointPolicy::Kind kind, int k) { return CheckpointPolicy{kind, k}; }

CheckpointPolicy All(CheckpointPolicy::Kind kind, int k) {
  CheckpointPolicy p{kind, k};
  p.checkpoint_last_segment = true;
  return p;
}

}  // namespace braid::checkpointing_test
