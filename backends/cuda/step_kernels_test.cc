// The kernels that keep a training step on the GPU (issue 28), on a real device against the CPU
// backend: the count of CrossEntropy's targets (so the host never reads them) and the loss and
// gradient CrossEntropy computes with it, and the native bf16/f16 kernels (half storage, f32
// arithmetic, no conversion passes): elementwise, LayerNorm, softmax, cross-entropy, embedding. Every case needs a GPU: they run in
// step_kernels_test_gpu (SKIPPED without one); step_kernels_test is the binary alone.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
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
constexpr DType kF32 = DType::kF32;

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

// ---- Native half row kernels: LayerNorm, softmax, cross-entropy, embedding --------------------
// Against the CPU backend's bf16/f16 kernels on the same half inputs (NaN and infinities in some
// rows). backends/cuda/math/rows_half_math_test.cc proves the math bit-identical to the CPU in
// the CPU's order and bounds the GPU's tree order; on the device nvcc also contracts products
// into FMAs and its expf/logf are within 2 ulp of glibc's, so sums and statistics are held to
// kernels_gpu_test's row tolerance (1e-5 relative), and a stored half output to that plus one
// unit in the last place of its format (two f32 values that close, each rounded to nearest, end
// at most one unit apart). Cross-entropy's gradient (one product of the same f32 inputs) and
// the embedding (a gather; f32 additions in the CPU's order) must be bit-identical.

::testing::AssertionResult CloseInFormat(DType dt, const Tensor& got, const Tensor& want,
                                         float atol, float rtol) {
  const bool half = dt == DType::kBF16 || dt == DType::kF16;
  const float unit = dt == DType::kBF16 ? 0x1p-7f : dt == DType::kF16 ? 0x1p-10f : 0.0f;
  return cpu::testing::AllClose(got.To(Device::CPU()), want, atol + (half ? 0x1p-24f : 0.0f),
                                rtol + unit);
}

// Equal bits, a NaN matching a NaN only.
::testing::AssertionResult SameValues(const Tensor& got, const Tensor& want) {
  const std::vector<float> g = got.ToFloatVector(), w = want.ToFloatVector();
  if (g.size() != w.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(g[i]) && std::isnan(w[i])) continue;
    if (std::memcmp(&g[i], &w[i], sizeof(float)) != 0) {
      return ::testing::AssertionFailure() << "element " << i << ": got " << g[i] << ", want "
                                           << w[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// Logits in [-r, r] with a NaN in row 0, a +inf in row 1 (every probability NaN, as the CPU's
// sum is) and -inf among finite values in row 2 (probability 0; the first column too).
Tensor RowsWithNonFinite(int64_t rows, int64_t c, float r, std::mt19937& rng) {
  Tensor x = cpu::testing::RandomTensor({rows, c}, rng, -r, r);
  float* p = x.data<float>();
  p[3] = NAN;
  p[c + c / 2] = INFINITY;
  for (int64_t i : {int64_t(0), int64_t(7), c - 1}) p[2 * c + i] = -INFINITY;
  return x;
}

TEST_F(StepKernelsGpuTest, NativeHalfLayerNormMatchesTheCpu) {
  // 768 columns: a warp per row; 2048: a block of 256 threads per row.
  for (int64_t c : {768, 2048}) {
    const int64_t rows = 40;
    for (DType dt : {DType::kBF16, DType::kF16}) {
      const std::string name = std::string(DTypeName(dt)) + " c=" + std::to_string(c);
      Tensor xf = cpu::testing::RandomTensor({rows, c}, rng_, 1.f, 3.f);
      xf.data<float>()[5] = NAN;
      const Tensor x = xf.To(dt), w = cpu::testing::RandomTensor({c}, rng_).To(dt);
      const Tensor b = cpu::testing::RandomTensor({c}, rng_).To(dt);
      Tensor out = Tensor::Empty({rows, c}, dt), mean = Tensor::Empty({rows}),
             rstd = Tensor::Empty({rows});
      Tensor gout = Tensor::Empty({rows, c}, dt, kGpu), gmean = Tensor::Empty({rows}, kF32, kGpu),
             grstd = Tensor::Empty({rows}, kF32, kGpu);
      kernels::layernorm_forward.Get(Device::CPU(), dt)(x, w, b, 1e-5f, out, mean, rstd);
      kernels::layernorm_forward.Get(kGpu, dt)(x.To(kGpu), w.To(kGpu), b.To(kGpu), 1e-5f, gout,
                                               gmean, grstd);
      EXPECT_TRUE(CloseInFormat(kF32, gmean, mean, 0.f, 1e-5f)) << name;
      EXPECT_TRUE(CloseInFormat(kF32, grstd, rstd, 0.f, 1e-5f)) << name;
      EXPECT_TRUE(CloseInFormat(dt, gout, out, 1e-5f, 1e-5f)) << name;
      // Backward from the CPU's statistics, into dweight and dbias that already hold values.
      const Tensor g = cpu::testing::RandomTensor({rows, c}, rng_).To(dt);
      const Tensor dw0 = cpu::testing::RandomTensor({c}, rng_).To(dt);
      const Tensor db0 = cpu::testing::RandomTensor({c}, rng_).To(dt);
      Tensor dx = Tensor::Empty({rows, c}, dt), dw = dw0.Clone(), db = db0.Clone();
      Tensor gdx = Tensor::Empty({rows, c}, dt, kGpu), gdw = dw0.To(kGpu), gdb = db0.To(kGpu);
      kernels::layernorm_backward.Get(Device::CPU(), dt)(g, x, w, mean, rstd, dx, dw, db);
      kernels::layernorm_backward.Get(kGpu, dt)(g.To(kGpu), x.To(kGpu), w.To(kGpu),
                                                mean.To(kGpu), rstd.To(kGpu), gdx, gdw, gdb);
      EXPECT_TRUE(CloseInFormat(dt, gdx, dx, 1e-5f, 1e-5f)) << name;
      EXPECT_TRUE(CloseInFormat(dt, gdw, dw, 1e-5f, 1e-5f)) << name;
      EXPECT_TRUE(CloseInFormat(dt, gdb, db, 1e-5f, 1e-5f)) << name;
    }
  }
}

TEST_F(StepKernelsGpuTest, NativeHalfSoftmaxMatchesTheCpu) {
  for (int64_t c : {1000, 3000}) {  // a warp per row; a block per row
    const int64_t rows = 24;
    for (DType dt : {DType::kBF16, DType::kF16}) {
      const std::string name = std::string(DTypeName(dt)) + " c=" + std::to_string(c);
      const Tensor x = RowsWithNonFinite(rows, c, 8.f, rng_).To(dt);
      const Tensor dy = cpu::testing::RandomTensor({rows, c}, rng_).To(dt);
      Tensor y = Tensor::Empty({rows, c}, dt), gy = Tensor::Empty({rows, c}, dt, kGpu);
      kernels::softmax_forward.Get(Device::CPU(), dt)(x, y);
      kernels::softmax_forward.Get(kGpu, dt)(x.To(kGpu), gy);
      EXPECT_TRUE(CloseInFormat(dt, gy, y, 1e-12f, 1e-5f)) << name;
      // Backward from the CPU's probabilities.
      Tensor dx = Tensor::Empty({rows, c}, dt), gdx = Tensor::Empty({rows, c}, dt, kGpu);
      kernels::softmax_backward.Get(Device::CPU(), dt)(y, dy, dx);
      kernels::softmax_backward.Get(kGpu, dt)(y.To(kGpu), dy.To(kGpu), gdx);
      EXPECT_TRUE(CloseInFormat(dt, gdx, dx, 1e-6f, 1e-5f)) << name;
    }
  }
}

TEST_F(StepKernelsGpuTest, NativeHalfCrossEntropyMatchesTheCpu) {
  for (int64_t v : {777, 5000}) {
    const int64_t n = 20;
    for (DType dt : {DType::kBF16, DType::kF16}) {
      const std::string name = std::string(DTypeName(dt)) + " v=" + std::to_string(v);
      const Tensor logits = RowsWithNonFinite(n, v, 6.f, rng_).To(dt);
      Tensor targets = cpu::testing::RandomIds(n, v, rng_, 4);
      targets.data<int32_t>()[1] = 11;  // the +inf row counts: its loss is NaN on both sides
      targets.data<int32_t>()[2] = 12;  // not on a -inf logit: a finite loss
      const Tensor dloss = cpu::testing::RandomTensor({n}, rng_);
      Tensor losses = Tensor::Empty({n}), probs = Tensor::Empty({n, v});
      Tensor gl = Tensor::Empty({n}, kF32, kGpu), gp = Tensor::Empty({n, v}, kF32, kGpu);
      kernels::cross_entropy_forward.Get(Device::CPU(), dt)(logits, targets, losses, probs);
      kernels::cross_entropy_forward.Get(kGpu, dt)(logits.To(kGpu), targets.To(kGpu), gl, gp);
      EXPECT_TRUE(CloseInFormat(kF32, gl, losses, 1e-6f, 1e-5f)) << name;
      EXPECT_TRUE(CloseInFormat(kF32, gp, probs, 1e-12f, 1e-5f)) << name;
      EXPECT_TRUE(std::isnan(gl.To(Device::CPU()).data<float>()[1])) << name;
      // Backward from the CPU's probabilities: one product, rounded once, on both sides.
      Tensor dl = Tensor::Empty({n, v}, dt), gdl = Tensor::Empty({n, v}, dt, kGpu);
      kernels::cross_entropy_backward.Get(Device::CPU(), dt)(probs, targets, dloss, dl);
      kernels::cross_entropy_backward.Get(kGpu, dt)(probs.To(kGpu), targets.To(kGpu),
                                                    dloss.To(kGpu), gdl);
      EXPECT_TRUE(SameValues(gdl, dl)) << name;
    }
  }
}

TEST_F(StepKernelsGpuTest, NativeHalfEmbeddingMatchesTheCpuBitForBit) {
  const int64_t vocab = 1000, c = 96, n = 4096;  // ids repeat: the scatter-add's runs
  for (DType dt : {DType::kBF16, DType::kF16}) {
    const std::string name = DTypeName(dt);
    const Tensor weight = cpu::testing::RandomTensor({vocab, c}, rng_).To(dt);
    Tensor ids = cpu::testing::RandomIds(n, vocab, rng_);
    for (int64_t i = 0; i < 300; ++i) ids.data<int32_t>()[i * 13] = 7;  // one long run
    Tensor doutf = cpu::testing::RandomTensor({n, c}, rng_);
    doutf.data<float>()[100 * c + 3] = NAN;
    const Tensor dout = doutf.To(dt);
    Tensor out = Tensor::Empty({n, c}, dt), gout = Tensor::Empty({n, c}, dt, kGpu);
    kernels::embedding_forward.Get(Device::CPU(), dt)(weight, ids, out);
    kernels::embedding_forward.Get(kGpu, dt)(weight.To(kGpu), ids.To(kGpu), gout);
    EXPECT_TRUE(SameValues(gout, out)) << name;
    Tensor dw = weight.Clone(), gdw = weight.To(kGpu);
    kernels::embedding_backward.Get(Device::CPU(), dt)(dout, ids, dw);
    kernels::embedding_backward.Get(kGpu, dt)(dout.To(kGpu), ids.To(kGpu), gdw);
    EXPECT_TRUE(SameValues(gdw, dw)) << name;
  }
}

}  // namespace
}  // namespace braid::cuda
