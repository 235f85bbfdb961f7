// AdamW and SGD updates against the reference kernels (PyTorch's semantics).
#include <cmath>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <vector>

#include "backends/cpu/test_util.h"
#include "core/kernels.h"
#include "core/testing/reference_kernels.h"
#include "gtest/gtest.h"

namespace braid::cpu {
namespace {

using kernels::AdamWParams;
using kernels::SgdParams;
using testing::AllClose;
using testing::BitEqual;
using testing::KernelTest;
using testing::RandomTensor;

const Device kCpu = Device::CPU();

class OptimizerTest : public KernelTest {};

TEST_P(OptimizerTest, AdamWMatchesReferenceOverSeveralSteps) {
  for (int64_t n : {1, 7, 8, 9, 1001, 70001}) {
    for (float wd : {0.0f, 0.1f}) {
      Tensor w = RandomTensor({n}, rng_), rw = w.Clone();
      Tensor m = Tensor::Zeros({n}), v = Tensor::Zeros({n}), rm = m.Clone(), rv = v.Clone();
      for (int64_t step = 1; step <= 5; ++step) {
        Tensor g = RandomTensor({n}, rng_, -2.0f, 2.0f);
        AdamWParams p{1e-2f, 0.9f, 0.95f, 1e-8f, wd, step};
        kernels::adamw.Get(kCpu)(w, g, m, v, p);
        reference::adamw(rw, g, rm, rv, p);
      }
      EXPECT_TRUE(AllClose(m, rm, 1e-6f, 1e-5f)) << "n=" << n << " wd=" << wd;
      EXPECT_TRUE(AllClose(v, rv, 1e-6f, 1e-5f)) << "n=" << n << " wd=" << wd;
      // Each step moves w by ~lr; float vs double arithmetic differs by ~1e-7 per step.
      EXPECT_TRUE(AllClose(w, rw, 2e-6f, 1e-5f)) << "n=" << n << " wd=" << wd;
    }
  }
}

TEST_P(OptimizerTest, AdamWFirstStepIsSignedLearningRate) {
  // After bias correction the first update is lr * g / (|g| + eps) = +-lr (PyTorch's behaviour),
  // whatever the betas: an independent check of the bias correction.
  Tensor w = Tensor::Zeros({5});
  Tensor g = Tensor::FromVector<float>({1.0f, -3.0f, 0.5f, -0.25f, 100.0f}, {5});
  Tensor m = Tensor::Zeros({5}), v = Tensor::Zeros({5});
  kernels::adamw.Get(kCpu)(w, g, m, v, AdamWParams{0.1f, 0.8f, 0.99f, 1e-12f, 0.0f, 1});
  Tensor want = Tensor::FromVector<float>({-0.1f, 0.1f, -0.1f, 0.1f, -0.1f}, {5});
  EXPECT_TRUE(AllClose(w, want, 1e-6f, 1e-5f));
}

TEST_P(OptimizerTest, SubnormalStateIsFlushedAndControlStateRestored) {
#if defined(__x86_64__)
  const unsigned csr = _mm_getcsr();
  // m of a parameter whose gradient has been zero for ~800 steps: subnormal.
  Tensor w = Tensor::Full({9}, 0.5f), g = Tensor::Zeros({9});
  Tensor m = Tensor::Full({9}, 1e-39f), v = Tensor::Full({9}, 1e-6f);
  Tensor rw = w.Clone(), rm = m.Clone(), rv = v.Clone();
  kernels::adamw.Get(kCpu)(w, g, m, v, AdamWParams{1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 900});
  // Control bits (rounding, FTZ, DAZ, masks) restored; the low 6 are sticky exception flags.
  EXPECT_EQ(_mm_getcsr() & ~0x3fu, csr & ~0x3fu) << "the kernel must restore MXCSR";
  reference::adamw(rw, g, rm, rv, AdamWParams{1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 900});
  EXPECT_TRUE(BitEqual(m, Tensor::Zeros({9})));  // 0.9e-39 flushed
  EXPECT_TRUE(AllClose(m, rm, 1e-38f, 0.0f));
  EXPECT_TRUE(AllClose(w, rw, 1e-7f, 1e-6f));
#else
  // Runs in optimizer_kernels_test_x86_64 only, which Bazel skips on other CPUs.
  FAIL() << "MXCSR is x86's; this target requires x86-64";
#endif
}

TEST_P(OptimizerTest, SgdMatchesReferenceInEveryMode) {
  struct Mode {
    float momentum, dampening, wd;
    bool nesterov;
  };
  for (const Mode& mode : {Mode{0, 0, 0, false}, Mode{0, 0, 0.01f, false}, Mode{0.9f, 0, 0, false},
                           Mode{0.9f, 0.1f, 0.01f, false}, Mode{0.9f, 0, 0.01f, true}}) {
    for (int64_t n : {1, 9, 1001, 70001}) {
      Tensor w = RandomTensor({n}, rng_), rw = w.Clone();
      Tensor buf = Tensor::Empty({n}), rbuf = Tensor::Empty({n});
      if (mode.momentum == 0.0f) buf = rbuf = Tensor();  // no buffer without momentum
      for (int step = 0; step < 4; ++step) {
        Tensor g = RandomTensor({n}, rng_);
        SgdParams p{0.05f, mode.momentum, mode.dampening, mode.wd, mode.nesterov, step == 0};
        kernels::sgd.Get(kCpu)(w, g, buf, p);
        reference::sgd(rw, g, rbuf, p);
      }
      std::string what = "momentum=" + std::to_string(mode.momentum) +
                         " nesterov=" + std::to_string(mode.nesterov) + " n=" + std::to_string(n);
      EXPECT_TRUE(AllClose(w, rw, 1e-6f, 1e-5f)) << what;
      if (mode.momentum != 0.0f) {
        EXPECT_TRUE(AllClose(buf, rbuf, 1e-6f, 1e-5f)) << what;
      }
    }
  }
}

TEST_P(OptimizerTest, ThreadCountIndependent) {
  const int64_t n = 200003;
  Tensor w0 = RandomTensor({n}, rng_), g = RandomTensor({n}, rng_);
  auto [one, two] = testing::RunWithThreads([&] {
    Tensor w = w0.Clone(), m = Tensor::Zeros({n}), v = Tensor::Zeros({n});
    kernels::adamw.Get(kCpu)(w, g, m, v, AdamWParams{1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, 3});
    Tensor w2 = w0.Clone(), buf = Tensor::Empty({n});
    kernels::sgd.Get(kCpu)(w2, g, buf, SgdParams{0.1f, 0.9f, 0.0f, 0.0f, true, true});
    return std::vector<Tensor>{w, m, v, w2, buf};
  });
  for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(BitEqual(one[i], two[i])) << "output " << i;
}

INSTANTIATE_TEST_SUITE_P(Configs, OptimizerTest, ::testing::ValuesIn(testing::AllConfigs()),
                         testing::ConfigName);

// Optimizer updates stay f32 (master weights): a half parameter is refused with the reason, and
// no half kernel is registered for them.
TEST(OptimizerHalfTest, HalfParametersAreRefused) {
  EXPECT_EQ(kernels::adamw.Find(DeviceType::kCPU, DType::kBF16), nullptr);
  EXPECT_EQ(kernels::sgd.Find(DeviceType::kCPU, DType::kF16), nullptr);
  Tensor p = Tensor::Zeros({4}, DType::kBF16), g = Tensor::Zeros({4});
  Tensor m = Tensor::Zeros({4}), v = Tensor::Zeros({4});
  AdamWParams ap{1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 1};
  EXPECT_DEATH(kernels::adamw.Get(Device::CPU())(p, g, m, v, ap),
               "is not f32: optimizer updates run on f32 only.*master weights");
}

}  // namespace
}  // namespace braid::cpu
