// The ops that use a backend's fused kernels where one is registered, as the CUDA backend
// registers them, checked on the CPU with host implementations registered for kCPU:
//  - ops::CausalSelfAttention with the flash_attention_* slots (attention_flash.cu), here from
//    the same tile math (math/flash_attention.h): forward, gradient through autograd and the
//    memory kept, against the probability-saving path (the CPU backend's attention slots);
//  - ops::Linear with linear_forward (matmul.cc's cuBLASLt BIAS epilogue): the slot is called
//    and the result and gradients are those of matmul + add;
//  - ops::LinearGeluTanh with linear_gelu_forward (matmul.cc's GELU_AUX_BIAS epilogue): the slot
//    is called, the output is GELU's within rounding, the gradients (from the kept pre) those
//    of Linear then GeluTanh. (models/gpt's gpt_fused_mlp_test checks the model takes it.)
//  - its backward with linear_gelu_backward (matmul.cc's GELU-derivative + bias-gradient
//    kernel): the slot is called once per backward, its dpre feeds the products and its column
//    sums are the bias gradient, also when the weight gradients are put off (WeightGradQueue).
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "backends/cpu/test_util.h"
#include "backends/cuda/kernels/attention_plan.h"
#include "backends/cuda/math/flash_attention.h"
#include "core/allocator.h"
#include "core/autograd.h"
#include "core/kernel_checks.h"
#include "core/kernels.h"
#include "core/ops.h"
#include "gtest/gtest.h"

namespace braid::cuda {
namespace {

using namespace braid::cuda::math;  // NOLINT: the tile math

int g_forward_calls = 0, g_backward_calls = 0;

// The fused forward on the host, tile by tile with the same helpers as the kernel (sums in key
// order; the GPU's butterflies are the math test's business).
void HostFlashForward(const Tensor& qkv, int n_head, Tensor& out, Tensor& lse) {
  ++g_forward_calls;
  const auto s = kernels::checks::FlashAttentionForward("test", DType::kF32, qkv, n_head, out, lse);
  const float* x = qkv.data<float>();
  float* o = out.data<float>();
  const float scale = float(1.0 / std::sqrt(double(s.d)));
  for (int64_t b = 0; b < s.b; ++b) {
    for (int64_t h = 0; h < s.h; ++h) {
      for (int64_t i = 0; i < s.t; ++i) {
        FlashRow row = FlashRowStart();
        std::vector<float> acc(size_t(s.d), 0.f), sc(kFlashTile);
        for (int64_t t0 = 0; t0 <= i; t0 += kFlashTile) {
          float mx = -INFINITY;
          for (int l = 0; l < kFlashTile; ++l) {
            const int64_t j = t0 + l;
            const bool vis = FlashVisible(i, j, s.t);
            float dot = 0;
            for (int64_t d = 0; vis && d < s.d; ++d) {
              dot += x[FlashQkvIndex(b, i, 0, h, d, s.t, s.c, s.d)] *
                     x[FlashQkvIndex(b, j, 1, h, d, s.t, s.c, s.d)];
            }
            sc[size_t(l)] = FlashScore(dot, scale, vis);
            mx = std::max(mx, sc[size_t(l)]);
          }
          const float alpha = FlashRescale(&row, mx);
          float sum = 0;
          for (float& a : acc) a *= alpha;
          for (int l = 0; l < kFlashTile && t0 + l <= i; ++l) {
            const float p = FlashTileProb(sc[size_t(l)], row);
            sum += p;
            for (int64_t d = 0; d < s.d; ++d) {
              acc[size_t(d)] += p * x[FlashQkvIndex(b, t0 + l, 2, h, d, s.t, s.c, s.d)];
            }
          }
          FlashAddMass(&row, sum);
        }
        for (int64_t d = 0; d < s.d; ++d) {
          o[FlashOutIndex(b, i, h, d, s.t, s.c, s.d)] = FlashOutput(acc[size_t(d)], row);
        }
        lse.data<float>()[(b * s.h + h) * s.t + i] = FlashLogSumExp(row);
      }
    }
  }
}

void HostFlashBackward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                       int n_head, Tensor& dqkv) {
  ++g_backward_calls;
  const auto s = kernels::checks::FlashAttentionBackward("test", DType::kF32, dout, qkv, out, lse,
                                                          n_head, dqkv);
  const float *x = qkv.data<float>(), *g = dout.data<float>(), *o = out.data<float>();
  const float* L = lse.data<float>();
  float* dx = dqkv.data<float>();
  std::fill(dx, dx + dqkv.numel(), 0.f);
  const float scale = float(1.0 / std::sqrt(double(s.d)));
  auto at = [&](int64_t b, int64_t t, int64_t w, int64_t h, int64_t d) {
    return FlashQkvIndex(b, t, w, h, d, s.t, s.c, s.d);
  };
  for (int64_t b = 0; b < s.b; ++b) {
    for (int64_t h = 0; h < s.h; ++h) {
      for (int64_t i = 0; i < s.t; ++i) {
        float delta = 0;
        for (int64_t d = 0; d < s.d; ++d) {
          delta += g[FlashOutIndex(b, i, h, d, s.t, s.c, s.d)] * o[FlashOutIndex(b, i, h, d, s.t, s.c, s.d)];
        }
        const float row_lse = L[(b * s.h + h) * s.t + i];
        for (int64_t j = 0; j <= i; ++j) {
          float qk = 0, dp = 0;
          for (int64_t d = 0; d < s.d; ++d) {
            qk += x[at(b, i, 0, h, d)] * x[at(b, j, 1, h, d)];
            dp += g[FlashOutIndex(b, i, h, d, s.t, s.c, s.d)] * x[at(b, j, 2, h, d)];
          }
          const float p = FlashRecomputedProb(FlashScore(qk, scale, true), row_lse);
          const float ds = FlashDScore(p, dp, delta, scale);
          for (int64_t d = 0; d < s.d; ++d) {
            dx[at(b, i, 0, h, d)] += ds * x[at(b, j, 1, h, d)];
            dx[at(b, j, 1, h, d)] += ds * x[at(b, i, 0, h, d)];
            dx[at(b, j, 2, h, d)] += p * g[FlashOutIndex(b, i, h, d, s.t, s.c, s.d)];
          }
        }
      }
    }
  }
}

// Runs the op forward and backward; returns (out, dqkv).
std::pair<Tensor, Tensor> RunOp(const Tensor& qkv_values, const Tensor& seed, int n_head) {
  Tensor qkv = qkv_values.Clone();
  qkv.set_requires_grad(true);
  Tensor y = ops::CausalSelfAttention(qkv, n_head);
  y.Backward(seed);
  return {y.Detach(), qkv.grad()};
}

TEST(FusedOps, CausalSelfAttentionUsesTheFusedSlotsWhereRegisteredWithTheSameGradients) {
  std::mt19937 rng(7);
  const int64_t B = 2, T = 45, H = 3, C = 48;
  const Tensor qkv = cpu::testing::RandomTensor({B, T, 3 * C}, rng, -2.f, 2.f);
  const Tensor seed = cpu::testing::RandomTensor({B, T, C}, rng);
  ASSERT_EQ(kernels::flash_attention_forward.Find(DeviceType::kCPU), nullptr);
  const auto want = RunOp(qkv, seed, int(H));  // the CPU backend's probability-saving slots
  kernels::flash_attention_forward.Register(DeviceType::kCPU, &HostFlashForward);
  kernels::flash_attention_backward.Register(DeviceType::kCPU, &HostFlashBackward);
  const auto got = RunOp(qkv, seed, int(H));
  kernels::flash_attention_forward.Register(DeviceType::kCPU, nullptr);
  kernels::flash_attention_backward.Register(DeviceType::kCPU, nullptr);
  EXPECT_EQ(g_forward_calls, 1);
  EXPECT_EQ(g_backward_calls, 1);
  // f32 in two summation orders over at most 45 terms: 1e-5 absolute + 1e-4 relative.
  EXPECT_TRUE(cpu::testing::AllClose(got.first, want.first, 1e-5f, 1e-4f));
  EXPECT_TRUE(cpu::testing::AllClose(got.second, want.second, 1e-5f, 1e-4f));
}

// What the op keeps alive between forward and backward: with the fused slots, lse (B H T
// floats) beside the output; with the probability slots, the B H T T probabilities too.
TEST(FusedOps, TheFusedPathKeepsMemoryLinearInT) {
  std::mt19937 rng(8);
  const int64_t B = 1, H = 2, C = 32;
  auto held_bytes = [&](int64_t T, bool fused) {
    if (fused) {
      kernels::flash_attention_forward.Register(DeviceType::kCPU, &HostFlashForward);
      kernels::flash_attention_backward.Register(DeviceType::kCPU, &HostFlashBackward);
    }
    Tensor qkv = cpu::testing::RandomTensor({B, T, 3 * C}, rng);
    qkv.set_requires_grad(true);
    const int64_t before = GetMemoryStats(Device::CPU()).current_bytes;
    Tensor y = ops::CausalSelfAttention(qkv, int(H));
    const int64_t held = GetMemoryStats(Device::CPU()).current_bytes - before;
    kernels::flash_attention_forward.Register(DeviceType::kCPU, nullptr);
    kernels::flash_attention_backward.Register(DeviceType::kCPU, nullptr);
    return held;
  };
  for (int64_t T : {64, 256}) {
    const int64_t out_bytes = B * T * C * 4;
    EXPECT_EQ(held_bytes(T, true), out_bytes + FlashAttentionMemory(B, H, T).saved) << T;
    EXPECT_EQ(held_bytes(T, false), out_bytes + ReferenceAttentionMemory(B, H, T, 4).saved) << T;
  }
}

int g_linear_calls = 0;

// Linear's forward in one call, on the host: the reference matmul, then the bias per column.
void HostLinearForward(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& out) {
  ++g_linear_calls;
  kernels::matmul.Get(Device::CPU())(x, weight, out, false, true, 1.0f, 0.0f);
  const int64_t rows = out.size(0), cols = out.size(1);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) out.data<float>()[r * cols + c] += bias.data<float>()[c];
  }
}

TEST(FusedOps, LinearUsesTheFusedBiasSlotWhereRegistered) {
  std::mt19937 rng(9);
  const Tensor x = cpu::testing::RandomTensor({3, 5, 16}, rng);
  const Tensor w = cpu::testing::RandomTensor({24, 16}, rng), b = cpu::testing::RandomTensor({24}, rng);
  const Tensor seed = cpu::testing::RandomTensor({3, 5, 24}, rng);
  auto run = [&] {
    Tensor xp = x.Clone(), wp = w.Clone(), bp = b.Clone();
    for (Tensor* t : {&xp, &wp, &bp}) t->set_requires_grad(true);
    Tensor y = ops::Linear(xp, wp, bp);
    y.Backward(seed);
    return std::vector<Tensor>{y.Detach(), xp.grad(), wp.grad(), bp.grad()};
  };
  ASSERT_EQ(kernels::linear_forward.Find(DeviceType::kCPU), nullptr);
  const std::vector<Tensor> want = run();
  kernels::linear_forward.Register(DeviceType::kCPU, &HostLinearForward);
  const std::vector<Tensor> got = run();
  // Without a bias there is nothing to fuse: matmul alone.
  Tensor nb = ops::Linear(x, w, Tensor());
  kernels::linear_forward.Register(DeviceType::kCPU, nullptr);
  EXPECT_EQ(g_linear_calls, 1);
  EXPECT_EQ(nb.shape(), (Shape{3, 5, 24}));
  // The same products and the same additions in the same order: bit-identical.
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(cpu::testing::AllClose(got[i], want[i], 0.f, 0.f)) << i;
  }
}

int g_linear_gelu_calls = 0;

// What the GELU epilogue computes, on the host: pre = x weightᵀ + bias (the reference matmul,
// then the bias per column, as the unfused path adds it), out = tanh-GELU(pre) evaluated in
// double: another evaluation of the same function than the CPU backend's f32 GeluTanh, as
// cuBLASLt's is.
void HostLinearGelu(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& pre,
                    Tensor& out) {
  ++g_linear_gelu_calls;
  kernels::matmul.Get(Device::CPU())(x, weight, pre, false, true, 1.0f, 0.0f);
  const int64_t rows = pre.size(0), cols = pre.size(1);
  float* p = pre.data<float>();
  float* o = out.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = r * cols + c;
      p[i] += bias.data<float>()[c];
      const double v = p[i];
      o[i] = float(0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))));
    }
  }
}

TEST(FusedOps, LinearGeluTanhUsesTheFusedSlotWhereRegisteredWithTheSameGradients) {
  std::mt19937 rng(10);
  const Tensor x = cpu::testing::RandomTensor({3, 5, 16}, rng);
  const Tensor w = cpu::testing::RandomTensor({24, 16}, rng);
  const Tensor b = cpu::testing::RandomTensor({24}, rng, -3.f, 3.f);
  const Tensor seed = cpu::testing::RandomTensor({3, 5, 24}, rng);
  auto run = [&](bool fused_op) {
    Tensor xp = x.Clone(), wp = w.Clone(), bp = b.Clone();
    for (Tensor* t : {&xp, &wp, &bp}) t->set_requires_grad(true);
    Tensor y = fused_op ? ops::LinearGeluTanh(xp, wp, bp) : ops::GeluTanh(ops::Linear(xp, wp, bp));
    y.Backward(seed);
    return std::vector<Tensor>{y.Detach(), xp.grad(), wp.grad(), bp.grad()};
  };
  ASSERT_EQ(kernels::linear_gelu_forward.Find(DeviceType::kCPU), nullptr);
  const std::vector<Tensor> want = run(false);
  // No slot (the CPU backend): the op is Linear then GeluTanh, bit for bit.
  const std::vector<Tensor> unfused = run(true);
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(cpu::testing::AllClose(unfused[i], want[i], 0.f, 0.f)) << i;
  }
  kernels::linear_gelu_forward.Register(DeviceType::kCPU, &HostLinearGelu);
  const std::vector<Tensor> got = run(true);
  // Without a bias there is no GELU_AUX_BIAS epilogue to use: the unfused ops.
  Tensor nb = ops::LinearGeluTanh(x, w, Tensor());
  kernels::linear_gelu_forward.Register(DeviceType::kCPU, nullptr);
  EXPECT_EQ(g_linear_gelu_calls, 1);
  EXPECT_EQ(nb.shape(), (Shape{3, 5, 24}));
  // The output: GELU evaluated two ways in f32 differs by a few ulp: 1e-6 absolute + 1e-5
  // relative. The gradients come from the same pre (bit-identical: the same products and
  // additions) through the same kernels: exactly equal.
  EXPECT_TRUE(cpu::testing::AllClose(got[0], want[0], 1e-6f, 1e-5f));
  for (size_t i = 1; i < want.size(); ++i) {
    EXPECT_TRUE(cpu::testing::AllClose(got[i], want[i], 0.f, 0.f)) << i;
  }
}

int g_linear_gelu_bwd_calls = 0;

// What the CUDA kernel computes, on the host: the CPU's GELU derivative into dpre, then dpre's
// column sums (the CPU's sum_rows, beta 0) into dbias, the unfused path's two kernels, so any
// difference in the gradients is the op's wiring of the slot.
void HostLinearGeluBackward(const Tensor& pre, const Tensor& dout, Tensor& dpre, Tensor& dbias) {
  ++g_linear_gelu_bwd_calls;
  EXPECT_EQ(pre.ndim(), 2);
  EXPECT_EQ(dbias.numel(), pre.size(1));
  kernels::unary_backward.Get(Device::CPU())(kernels::UnaryOp::kGeluTanh, pre, dout, dpre);
  kernels::sum_rows.Get(Device::CPU())(dpre, dbias, 0.0f);
}

TEST(FusedOps, LinearGeluTanhBackwardUsesTheFusedSlotWhereRegistered) {
  std::mt19937 rng(11);
  const Tensor x = cpu::testing::RandomTensor({3, 5, 16}, rng);
  const Tensor w = cpu::testing::RandomTensor({24, 16}, rng);
  const Tensor b = cpu::testing::RandomTensor({24}, rng, -3.f, 3.f);
  const Tensor seed = cpu::testing::RandomTensor({3, 5, 24}, rng);
  auto run = [&](bool deferred) {
    Tensor xp = x.Clone(), wp = w.Clone(), bp = b.Clone();
    for (Tensor* t : {&xp, &wp, &bp}) t->set_requires_grad(true);
    Tensor y = ops::LinearGeluTanh(xp, wp, bp);
    if (deferred) {  // the weight and bias gradients put off, then run (as the pipeline does)
      autograd::WeightGradQueue q;
      {
        autograd::WeightGradQueue::ActiveScope scope(&q);
        y.Backward(seed);
      }
      EXPECT_EQ(q.size(), 1u);
      EXPECT_FALSE(wp.grad().defined());
      q.Run();
    } else {
      y.Backward(seed);
    }
    return std::vector<Tensor>{xp.grad(), wp.grad(), bp.grad()};
  };
  ASSERT_EQ(kernels::linear_gelu_backward.Find(DeviceType::kCPU), nullptr);
  const std::vector<Tensor> want = run(false);
  const int forward_calls = g_linear_gelu_calls;
  kernels::linear_gelu_forward.Register(DeviceType::kCPU, &HostLinearGelu);
  kernels::linear_gelu_backward.Register(DeviceType::kCPU, &HostLinearGeluBackward);
  const std::vector<Tensor> got = run(false), got_deferred = run(true);
  // Without a bias the slot has no bias gradient to give: unary_backward, not the slot.
  Tensor xn = x.Clone();
  xn.set_requires_grad(true);
  ops::LinearGeluTanh(xn, w, Tensor()).Backward(seed);
  kernels::linear_gelu_backward.Register(DeviceType::kCPU, nullptr);
  kernels::linear_gelu_forward.Register(DeviceType::kCPU, nullptr);
  EXPECT_EQ(g_linear_gelu_calls - forward_calls, 2);
  EXPECT_EQ(g_linear_gelu_bwd_calls, 2);
  EXPECT_TRUE(xn.grad().defined());
  // The same pre (the fused forward's bits, as the test above shows), the same kernels in the
  // same order: exactly equal, with the queue or without.
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(got[i].defined() && got_deferred[i].defined()) << i;
    EXPECT_TRUE(cpu::testing::AllClose(got[i], want[i], 0.f, 0.f)) << i;
    EXPECT_TRUE(cpu::testing::AllClose(got_deferred[i], want[i], 0.f, 0.f)) << i;
  }
}

}  // namespace
}  // namespace braid::cuda
