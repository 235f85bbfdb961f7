// The kernels that keep a training step on the GPU (issue 28), on a real device against the CPU
// backend: the count of CrossEntropy's targets (so the host never reads them) and the loss and
// gradient CrossEntropy computes with it, and the native bf16/f16 elementwise kernels (half
// storage, f32 arithmetic, no conversion passes). Every case needs a GPU: they run in
// step_kernels_test_gpu (SKIPPED without one); step_kernels_test is the binary alone.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/test_util.h"
#include "backends/cuda/gpu_test_env.h"
#include "core/kernels.h"
#include "core/ops.h"

namespace braid::cuda {
namespace {

const Device kGpu = Device::CUDA(0);

class StepKernelsGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
      const std::string why = std::string("No usable CUDA device: ") + cudaGetErrorName(e);
      if (gpu_test::MustFailWithGpus(1, 0)) FAIL() << why;
      GTEST_SKIP() << why;
    }
  }
  std::mt19937 rng_{28};
};

// An exact integer count on both sides, so the reciprocal is bit-identical.
TEST_F(StepKernelsGpuTest, InverseCountOfTargetsIsTheCpus) {
  for (int64_t n : {0, 1, 7, 1024, 1025, 70001}) {
    for (int every : {3, 1}) {  // every 3rd target ignored; then all of them
      std::vector<int32_t> ids(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) ids[size_t(i)] = i % every == 0 ? -1 : int32_t(i % 50);
      Tensor host = Tensor::FromVector(ids, {n});
      Tensor want = Tensor::Empty({}, DType::kF32), got = Tensor::Empty({}, DType::kF32, kGpu);
      kernels::inverse_count_nonnegative.Get(Device::CPU())(host, want);
      kernels::inverse_count_nonnegative.Get(kGpu)(host.To(kGpu), got);
      EXPECT_EQ(got.item(), want.item()) << "n=" << n << " every=" << every;
    }
  }
}

// ops::CrossEntropy end to end on the device (forward, the mean over counted targets, backward
// without reading the loss's gradient on the host): as the CPU within the row kernels'
// tolerance of kernels_gpu_test (1e-5 relative; 1e-6 absolute for gradients).
TEST_F(StepKernelsGpuTest, CrossEntropyOnTheDeviceMatchesTheCpu) {
  const int64_t n = 37, v = 50;
  Tensor logits = cpu::testing::RandomTensor({n, v}, rng_, -3.0f, 3.0f);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[size_t(i)] = i % 5 == 2 ? -1 : int32_t((i * 7) % v);
  Tensor targets = Tensor::FromVector(t, {n});
  Tensor lc = logits.Clone().set_requires_grad(true);
  Tensor lg = logits.To(kGpu).set_requires_grad(true);
  Tensor loss_c = ops::CrossEntropy(lc, targets);
  Tensor loss_g = ops::CrossEntropy(lg, targets.To(kGpu));
  ops::Scale(loss_c, 3.0f).Backward();
  ops::Scale(loss_g, 3.0f).Backward();
  const float want = loss_c.item(), got = loss_g.item();
  EXPECT_TRUE(std::isfinite(got));
  EXPECT_NEAR(got, want, 1e-5f * std::abs(want));
  std::vector<float> gc = lc.grad().ToFloatVector(), gg = lg.grad().ToFloatVector();
  ASSERT_EQ(gc.size(), gg.size());
  for (size_t i = 0; i < gc.size(); ++i) {
    ASSERT_NEAR(gg[i], gc[i], 1e-6f + 1e-5f * std::abs(gc[i])) << i;
  }
}

// Within one unit in the last place of the half format (2^-7 relative for bf16's 8 significant
// bits, 2^-10 for f16's 11): the GPU's expf/tanhf differ from glibc's by up to 2 f32 ulp, which
// can move a rounding to the other neighbour; NaN must match NaN.
::testing::AssertionResult WithinOneHalfUlp(DType dt, float got, float want) {
  if (std::isnan(got) && std::isnan(want)) return ::testing::AssertionSuccess();
  if (got == want) return ::testing::AssertionSuccess();
  const float rel = dt == DType::kBF16 ? 0x1p-7f : 0x1p-10f;
  if (std::isfinite(want) && std::abs(got - want) <= rel * std::abs(want) + 1e-30f) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "got " << got << ", want " << want;
}

void ExpectClose(DType dt, const Tensor& got, const Tensor& want, const std::string& what) {
  std::vector<float> g = got.ToFloatVector(), w = want.ToFloatVector();
  ASSERT_EQ(g.size(), w.size()) << what;
  for (size_t i = 0; i < g.size(); ++i) ASSERT_TRUE(WithinOneHalfUlp(dt, g[i], w[i])) << what << " [" << i << "]";
}

TEST_F(StepKernelsGpuTest, NativeHalfElementwiseKernelsMatchTheCpu) {
  using kernels::BinaryOp;
  using kernels::UnaryOp;
  for (DType dt : {DType::kBF16, DType::kF16}) {
    const std::string name = DTypeName(dt);
    Tensor a = cpu::testing::RandomTensor({100, 64}, rng_, -4.0f, 4.0f).To(dt);
    Tensor b = cpu::testing::RandomTensor({100, 64}, rng_, 0.5f, 2.0f).To(dt);
    Tensor row = cpu::testing::RandomTensor({64}, rng_, 0.5f, 2.0f).To(dt);
    Tensor ag = a.To(kGpu), bg = b.To(kGpu), rowg = row.To(kGpu);
    auto half = [&](const Tensor& like, Device d) { return Tensor::Empty(like.shape(), dt, d); };
    for (UnaryOp op : {UnaryOp::kScale, UnaryOp::kAddScalar, UnaryOp::kRelu, UnaryOp::kGeluTanh,
                       UnaryOp::kExp, UnaryOp::kLog, UnaryOp::kNeg, UnaryOp::kSquare,
                       UnaryOp::kSqrt, UnaryOp::kTanh}) {
      Tensor want = half(a, Device::CPU()), got = half(a, kGpu);
      kernels::unary.Get(Device::CPU(), dt)(op, a, 0.37f, want);
      kernels::unary.Get(kGpu, dt)(op, ag, 0.37f, got);
      ExpectClose(dt, got, want, name + " unary " + std::to_string(int(op)));
      if (op == UnaryOp::kScale) continue;
      kernels::unary_backward.Get(Device::CPU(), dt)(op, a, b, want);
      kernels::unary_backward.Get(kGpu, dt)(op, ag, bg, got);
      ExpectClose(dt, got, want, name + " unary_backward " + std::to_string(int(op)));
    }
    for (BinaryOp op : {BinaryOp::kAdd, BinaryOp::kSub, BinaryOp::kMul, BinaryOp::kDiv}) {
      for (bool bias : {false, true}) {
        Tensor want = half(a, Device::CPU()), got = half(a, kGpu);
        kernels::binary.Get(Device::CPU(), dt)(op, a, bias ? row : b, want);
        kernels::binary.Get(kGpu, dt)(op, ag, bias ? rowg : bg, got);
        ExpectClose(dt, got, want, name + " binary " + std::to_string(int(op)));
      }
    }
    // axpby: half into an f32 accumulator (gradient accumulation), f32 into half.
    Tensor acc = cpu::testing::RandomTensor({100, 64}, rng_);
    Tensor want32 = acc.Clone(), got32 = acc.To(kGpu);
    kernels::axpby.Get(Device::CPU(), dt)(0.5f, a, 1.0f, want32);
    kernels::axpby.Get(kGpu, dt)(0.5f, ag, 1.0f, got32);
    ExpectClose(dt, got32, want32, name + " axpby into f32");
    Tensor want16 = b.Clone(), got16 = bg.Clone();
    kernels::axpby.Get(Device::CPU(), dt)(-1.5f, acc, 0.25f, want16);
    kernels::axpby.Get(kGpu, dt)(-1.5f, acc.To(kGpu), 0.25f, got16);
    ExpectClose(dt, got16, want16, name + " axpby into " + name);
    // sum_all: double partials on both sides, one rounding to the format.
    Tensor sw = Tensor::Empty({1}, dt), sg = Tensor::Empty({1}, dt, kGpu);
    kernels::sum_all.Get(Device::CPU(), dt)(a, sw);
    kernels::sum_all.Get(kGpu, dt)(ag, sg);
    ExpectClose(dt, sg, sw, name + " sum_all");
  }
}

}  // namespace
}  // namespace braid::cuda
