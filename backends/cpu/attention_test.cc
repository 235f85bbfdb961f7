// Causal attention forward/backward against the reference kernels and finite differences.
#include <cmath>
#include <tuple>
#include <vector>

#include "backends/cpu/test_util.h"
#include "core/kernels.h"
#include "core/testing/reference_kernels.h"
#include "gtest/gtest.h"

namespace braid::cpu {
namespace {

using testing::AllClose;
using testing::BitEqual;
using testing::KernelTest;
using testing::RandomTensor;

const Device kCpu = Device::CPU();

struct AttnShape {
  int64_t b, t, c;
  int n_head;
};

// T around the kernel's 6-row blocks and 16-column tiles; head sizes 1, odd, and gpt-mini's 64.
const std::vector<AttnShape> kShapes = {
    {1, 1, 4, 1},  {2, 1, 6, 3},   {1, 5, 6, 2},   {2, 6, 12, 3},  {1, 7, 9, 3},
    {2, 13, 8, 2}, {1, 16, 16, 1}, {2, 17, 10, 5}, {1, 33, 40, 2}, {2, 128, 256, 4}};

std::string Name(const AttnShape& s) {
  return "B" + std::to_string(s.b) + " T" + std::to_string(s.t) + " C" + std::to_string(s.c) +
         " H" + std::to_string(s.n_head);
}

class AttentionTest : public KernelTest {};

TEST_P(AttentionTest, ForwardMatchesReference) {
  for (const AttnShape& s : kShapes) {
    // Scores of a few units: softmax rows that are neither uniform nor one-hot.
    Tensor qkv = RandomTensor({s.b, s.t, 3 * s.c}, rng_, -1.5f, 1.5f);
    Tensor out = Tensor::Empty({s.b, s.t, s.c}), att = Tensor::Empty({s.b, s.n_head, s.t, s.t});
    Tensor rout = Tensor::Empty(out.shape()), ratt = Tensor::Empty(att.shape());
    kernels::attention_forward.Get(kCpu)(qkv, s.n_head, out, att);
    reference::attention_forward(qkv, s.n_head, rout, ratt);
    EXPECT_TRUE(AllClose(att, ratt, 1e-6f, 1e-5f)) << Name(s);
    EXPECT_TRUE(AllClose(out, rout, 2e-6f, 1e-5f)) << Name(s);
    // The upper triangle must be exactly zero (backward relies on it).
    std::vector<float> a = att.ToFloatVector();
    for (int64_t m = 0; m < s.b * s.n_head; ++m) {
      for (int64_t i = 0; i < s.t; ++i) {
        for (int64_t j = i + 1; j < s.t; ++j) {
          ASSERT_EQ(a[size_t((m * s.t + i) * s.t + j)], 0.0f) << Name(s);
        }
      }
    }
  }
}

TEST_P(AttentionTest, BackwardMatchesReference) {
  for (const AttnShape& s : kShapes) {
    Tensor qkv = RandomTensor({s.b, s.t, 3 * s.c}, rng_, -1.5f, 1.5f);
    Tensor dout = RandomTensor({s.b, s.t, s.c}, rng_);
    Tensor out = Tensor::Empty({s.b, s.t, s.c}), att = Tensor::Empty({s.b, s.n_head, s.t, s.t});
    reference::attention_forward(qkv, s.n_head, out, att);
    Tensor dqkv = Tensor::Full(qkv.shape(), 123.0f);  // must be overwritten, not added to
    Tensor rdqkv = Tensor::Empty(qkv.shape());
    kernels::attention_backward.Get(kCpu)(dout, qkv, att, s.n_head, dqkv);
    reference::attention_backward(dout, qkv, att, s.n_head, rdqkv);
    // Sums over up to T keys/queries of O(1) terms.
    EXPECT_TRUE(AllClose(dqkv, rdqkv, 1e-6f * float(s.t + 4), 1e-4f)) << Name(s);
  }
}

TEST_P(AttentionTest, BackwardMatchesFiniteDifferences) {
  const AttnShape s{2, 7, 6, 2};
  Tensor qkv = RandomTensor({s.b, s.t, 3 * s.c}, rng_);
  Tensor w = RandomTensor({s.b, s.t, s.c}, rng_);
  Tensor out = Tensor::Empty({s.b, s.t, s.c}), att = Tensor::Empty({s.b, s.n_head, s.t, s.t});
  auto loss = [&] {
    kernels::attention_forward.Get(kCpu)(qkv, s.n_head, out, att);
    return testing::WeightedSum(out, w);
  };
  std::vector<double> numeric = testing::NumericGrad(qkv, loss, 1e-2f);
  loss();
  Tensor dqkv = Tensor::Empty(qkv.shape());
  kernels::attention_backward.Get(kCpu)(w, qkv, att, s.n_head, dqkv);
  EXPECT_TRUE(testing::GradClose(dqkv, numeric, 2e-3, 1e-2));
}

TEST_P(AttentionTest, ThreadCountIndependent) {
  const AttnShape s{3, 40, 48, 4};
  Tensor qkv = RandomTensor({s.b, s.t, 3 * s.c}, rng_);
  Tensor dout = RandomTensor({s.b, s.t, s.c}, rng_);
  auto [one, two] = testing::RunWithThreads([&] {
    Tensor out = Tensor::Empty({s.b, s.t, s.c}), att = Tensor::Empty({s.b, s.n_head, s.t, s.t});
    kernels::attention_forward.Get(kCpu)(qkv, s.n_head, out, att);
    Tensor dqkv = Tensor::Empty(qkv.shape());
    kernels::attention_backward.Get(kCpu)(dout, qkv, att, s.n_head, dqkv);
    return std::vector<Tensor>{out, att, dqkv};
  });
  for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(BitEqual(one[i], two[i])) << "output " << i;
}

INSTANTIATE_TEST_SUITE_P(Configs, AttentionTest, ::testing::ValuesIn(testing::AllConfigs()),
                         testing::ConfigName);

}  // namespace
}  // namespace braid::cpu
