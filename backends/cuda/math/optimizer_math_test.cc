// AdamW and SGD per-element updates of backends/cuda/math/optimizer.h, host-compiled, against
// the CPU backend's kernels through the kernel table, over several steps so that the moment
// buffers carry state. Bit-identical to the portable path (same operations in the same order,
// no FMA contraction on the host); within a tolerance of the AVX2 path (FMAs), quoted below.
#include <cmath>
#include <random>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/test_util.h"
#include "backends/cuda/math/optimizer.h"
#include "core/kernels.h"
#include "gtest/gtest.h"

namespace braid::cuda::math {
namespace {

using cpu::testing::AllClose;
using cpu::testing::BitEqual;
using cpu::testing::RandomTensor;

struct State {
  Tensor w, m, v;
};

// Five AdamW steps on the CPU backend and on the math, from the same start and gradients.
void RunAdamW(bool simd, State& cpu_state, State& math_state) {
  cpu::SetSimdEnabled(simd);
  std::mt19937 rng(21);
  // 1037 elements: whole AVX2 vectors and a tail. Values far from the subnormal range, which
  // the CPU kernel flushes to zero and the math does not.
  cpu_state = {RandomTensor({1037}, rng), Tensor::Zeros({1037}), Tensor::Zeros({1037})};
  math_state = {cpu_state.w.Clone(), cpu_state.m.Clone(), cpu_state.v.Clone()};
  for (int64_t step = 1; step <= 5; ++step) {
    const Tensor g = RandomTensor({1037}, rng, -3.f, 3.f);
    const kernels::AdamWParams p{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step};
    kernels::adamw.Get(Device::CPU())(cpu_state.w, g, cpu_state.m, cpu_state.v, p);
    const AdamWConsts k = MakeAdamWConsts(p.lr, p.beta1, p.beta2, p.eps, p.weight_decay, step);
    for (int64_t i = 0; i < g.numel(); ++i) {
      AdamWStep(k, g.data<float>()[i], math_state.m.data<float>()[i],
                math_state.v.data<float>()[i], math_state.w.data<float>()[i]);
    }
  }
  cpu::SetSimdEnabled(true);
}

TEST(AdamWMath, BitIdenticalToCpuPortablePath) {
  State c, m;
  RunAdamW(false, c, m);
  EXPECT_TRUE(BitEqual(m.w, c.w));
  EXPECT_TRUE(BitEqual(m.m, c.m));
  EXPECT_TRUE(BitEqual(m.v, c.v));
}

// The AVX2 path fuses b1 m + (1 - b1) g and the update into FMAs: one rounding less per
// operation, so a few ulp over five steps. Enforced: 1e-6 relative + 1e-7 absolute on w, m, v
// (|w| ~ 1, |m|, |v| ~ 1; 1e-6 is ~8 ulp of 1).
TEST(AdamWMath, AgreesWithCpuAvx2PathToAFewUlp) {
  State c, m;
  RunAdamW(true, c, m);
  EXPECT_TRUE(AllClose(m.w, c.w, 1e-7f, 1e-6f));
  EXPECT_TRUE(AllClose(m.m, c.m, 1e-7f, 1e-6f));
  EXPECT_TRUE(AllClose(m.v, c.v, 1e-7f, 1e-6f));
}

TEST(SgdMath, BitIdenticalToCpuPortablePathForEveryVariant) {
  cpu::SetSimdEnabled(false);
  for (float momentum : {0.f, 0.9f}) {
    for (bool nesterov : {false, true}) {
      if (nesterov && momentum == 0.f) continue;
      std::mt19937 rng(22);
      Tensor w = RandomTensor({515}, rng), buf = Tensor::Zeros({515});
      Tensor mw = w.Clone(), mbuf = buf.Clone();
      for (int step = 0; step < 4; ++step) {
        const Tensor g = RandomTensor({515}, rng, -2.f, 2.f);
        const kernels::SgdParams p{0.05f, momentum, 0.1f, 0.01f, nesterov, step == 0};
        kernels::sgd.Get(Device::CPU())(w, g, buf, p);
        const SgdConsts k{p.lr, p.momentum, 1.0f - p.dampening, p.weight_decay,
                          p.momentum != 0.0f, p.nesterov, p.first_step};
        for (int64_t i = 0; i < g.numel(); ++i) {
          SgdStep(k, g.data<float>()[i], mbuf.data<float>()[i], mw.data<float>()[i]);
        }
      }
      EXPECT_TRUE(BitEqual(mw, w)) << "momentum=" << momentum << " nesterov=" << nesterov;
      if (momentum != 0.f) {
        EXPECT_TRUE(BitEqual(mbuf, buf)) << "nesterov=" << nesterov;
      }
    }
  }
  cpu::SetSimdEnabled(true);
}

// A hand-computed first AdamW step, so that a mistake shared by both implementations shows:
// m = 0.1 g, v = 0.05 g^2, mhat = g, vhat = g^2, so w' = w (1 - lr wd) - lr g / (|g| + eps).
TEST(AdamWMath, FirstStepIsSignDescent) {
  const AdamWConsts k = MakeAdamWConsts(0.1f, 0.9f, 0.95f, 0.0f, 0.5f, 1);
  float m = 0, v = 0, w = 2.0f;
  AdamWStep(k, -4.0f, m, v, w);
  // 2 (1 - 0.05) + 0.1: float roundings of step_size and inv_sqrt_bc2 only, 1e-6 relative.
  EXPECT_NEAR(w, 2.0f, 2e-6f);
  EXPECT_NEAR(m, -0.4f, 1e-6f);
  EXPECT_NEAR(v, 0.8f, 1e-6f);
}

}  // namespace
}  // namespace braid::cuda::math
