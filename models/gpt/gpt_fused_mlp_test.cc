// GPT's MLP takes the fused Linear + GELU op (ops::LinearGeluTanh) where the device has the
// optional linear_gelu_forward slot, as CUDA does, once per block per forward, and trains to the
// same outputs and gradients as the unfused ops the CPU backend runs. Checked on the CPU with a
// host implementation of the slot registered for kCPU (GELU evaluated in double, as another
// implementation than the CPU's f32 GeluTanh). The model never names a backend.
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "core/kernels.h"
#include "core/ops.h"
#include "core/testing/compare.h"
#include "gtest/gtest.h"
#include "models/gpt/gpt.h"

namespace braid::models {
namespace {

int g_calls = 0;

void HostLinearGelu(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& pre,
                    Tensor& out) {
  ++g_calls;
  kernels::matmul.Get(Device::CPU())(x, weight, pre, false, true, 1.0f, 0.0f);
  kernels::binary.Get(Device::CPU())(kernels::BinaryOp::kAdd, pre, bias, pre);
  const float* p = pre.data<float>();
  float* o = out.data<float>();
  for (int64_t i = 0; i < pre.numel(); ++i) {
    const double v = p[i];
    o[i] = float(0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))));
  }
}

struct Outcome {
  std::vector<float> logits, loss;
  std::map<std::string, std::vector<float>> grads;
};

Outcome ForwardBackward(const GptConfig& c) {
  Gpt model(c);
  std::vector<int32_t> ids, targets;
  for (int i = 0; i < 2 * 16; ++i) {
    ids.push_back(int32_t((i * 37 + 11) % c.vocab_size));
    targets.push_back(int32_t((i * 53 + 5) % c.vocab_size));
  }
  Tensor logits = model(Tensor::FromVector(ids, {2, 16}));
  Tensor loss = ops::CrossEntropy(logits, Tensor::FromVector(targets, {2, 16}));
  loss.Backward();
  Outcome r;
  r.logits = logits.ToFloatVector();
  r.loss = loss.ToFloatVector();
  for (const auto& [name, p] : model.NamedParameters()) r.grads[name] = p.grad().ToFloatVector();
  return r;
}

TEST(GptFusedMlp, TheMlpCallsTheFusedSlotOncePerBlockWithTheUnfusedResults) {
  GptConfig c = GptConfig::Mini();
  c.n_layer = 3;
  c.n_embd = 64;
  c.n_head = 4;
  c.block_size = 16;
  ASSERT_EQ(kernels::linear_gelu_forward.Find(DeviceType::kCPU), nullptr);
  const Outcome want = ForwardBackward(c);  // the CPU backend: Linear then GeluTanh
  EXPECT_EQ(g_calls, 0);
  kernels::linear_gelu_forward.Register(DeviceType::kCPU, &HostLinearGelu);
  const Outcome got = ForwardBackward(c);
  kernels::linear_gelu_forward.Register(DeviceType::kCPU, nullptr);
  EXPECT_EQ(g_calls, c.n_layer);  // one forward: once per block's MLP
  // The host GELU differs from the CPU's f32 GeluTanh by an ulp or so, which propagates through
  // the later blocks. Measured: logits 1.8e-7 apart, gradients 5.4e-7 (MaxRelDiff, relative to
  // each tensor's largest magnitude, floor 1e-3), the loss 0. Bounds: logits 1e-6, gradients 5e-6
  // (and the loss 1e-6): about 5 and 10 times that, and under what a GELU of another kind moves
  // them (the erf GELU in the slot: logits 9.1e-6, gradients 5.8e-5). NaN or infinity fails.
  EXPECT_LE(testing::MaxAbsDiff(got.logits, want.logits), 1e-6);
  EXPECT_LE(testing::MaxAbsDiff(got.loss, want.loss), 1e-6);
  ASSERT_EQ(got.grads.size(), want.grads.size());
  for (const auto& [name, g] : want.grads) {
    EXPECT_LE(testing::MaxRelDiff(got.grads.at(name), g, 1e-3), 5e-6) << name;
  }
  // The gradients really flowed through the fused op's backward: c_fc's are not zero.
  double norm = 0;
  for (float v : got.grads.at("h.0.mlp.c_fc.weight")) norm += double(v) * v;
  EXPECT_GT(norm, 0.0);
}

}  // namespace
}  // namespace braid::models
