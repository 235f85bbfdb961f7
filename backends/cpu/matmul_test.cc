// matmul (OpenBLAS) against the reference kernel.
#include <cmath>
#include <limits>
#include <vector>

#include "backends/cpu/test_util.h"
#include "core/kernels.h"
#include "core/testing/reference_kernels.h"
#include "gtest/gtest.h"

namespace braid::cpu {
namespace {

using testing::AllClose;
using testing::KernelTest;
using testing::RandomTensor;

const Device kCpu = Device::CPU();

Shape Stored(int64_t batch, int64_t rows, int64_t cols, bool trans) {
  Shape s = trans ? Shape{cols, rows} : Shape{rows, cols};
  if (batch > 0) s.insert(s.begin(), batch);
  return s;
}

class MatmulTest : public KernelTest {
 protected:
  // out = alpha op(a) op(b) + beta out, for op(a) [m, k] and op(b) [k, n]; batch 0 means 2-D.
  void Check(int64_t batch, int64_t m, int64_t n, int64_t k, bool ta, bool tb, float alpha,
             float beta) {
    Tensor a = RandomTensor(Stored(batch, m, k, ta), rng_);
    Tensor b = RandomTensor(Stored(batch, k, n, tb), rng_);
    Shape os = batch > 0 ? Shape{batch, m, n} : Shape{m, n};
    Tensor out0 = RandomTensor(os, rng_);
    // beta == 0 must not read the output: NaN there would otherwise leak into the result.
    if (beta == 0.0f) out0.Fill(std::numeric_limits<float>::quiet_NaN());
    Tensor got = out0.Clone(), want = out0.Clone();
    kernels::matmul.Get(kCpu)(a, b, got, ta, tb, alpha, beta);
    reference::matmul(a, b, want, ta, tb, alpha, beta);
    // Inputs in [-1, 1]: each output is a k-term dot product; float accumulation error grows
    // at most ~k eps, so the tolerance scales with k.
    const float atol = 2e-7f * float(k + 1) * std::fabs(alpha) + 1e-6f;
    EXPECT_TRUE(AllClose(got, want, atol, 1e-5f))
        << "batch=" << batch << " m=" << m << " n=" << n << " k=" << k << " ta=" << ta
        << " tb=" << tb << " alpha=" << alpha << " beta=" << beta;
  }
};

TEST_P(MatmulTest, AllTransposeCombinationsAndAwkwardSizes) {
  const std::vector<std::vector<int64_t>> shapes = {
      {1, 1, 1}, {1, 7, 3}, {5, 1, 9}, {3, 5, 1}, {17, 9, 33}, {64, 48, 32}, {65, 63, 130}};
  for (const auto& s : shapes) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) Check(0, s[0], s[1], s[2], ta, tb, 1.0f, 0.0f);
    }
  }
}

TEST_P(MatmulTest, AlphaAndBeta) {
  Check(0, 13, 11, 7, false, true, 0.5f, 0.0f);
  Check(0, 13, 11, 7, true, false, -2.0f, 1.0f);
  Check(0, 13, 11, 7, false, false, 1.0f, 0.25f);
}

TEST_P(MatmulTest, BatchedThreeD) {
  Check(3, 5, 7, 9, false, false, 1.0f, 0.0f);
  Check(2, 8, 3, 16, true, true, 1.0f, 0.5f);
  Check(4, 16, 16, 8, false, true, 0.125f, 0.0f);
}

TEST_P(MatmulTest, GptMiniLinearShapes) {
  // The three products of a Linear layer: x Wᵀ, dY W, dYᵀ X (rows = B*T, reduced here).
  Check(0, 256, 96, 32, false, true, 1.0f, 0.0f);
  Check(0, 256, 32, 96, false, false, 1.0f, 0.0f);
  Check(0, 96, 32, 256, true, false, 1.0f, 0.0f);
}

TEST_P(MatmulTest, EmptyInnerDimension) {
  Tensor a = Tensor::Empty({3, 0}), b = Tensor::Empty({0, 4});
  Tensor out = Tensor::Full({3, 4}, 2.0f);
  kernels::matmul.Get(kCpu)(a, b, out, false, false, 1.0f, 0.5f);
  EXPECT_TRUE(AllClose(out, Tensor::Full({3, 4}, 1.0f), 0, 0));
  out.Fill(std::numeric_limits<float>::quiet_NaN());
  kernels::matmul.Get(kCpu)(a, b, out, false, false, 1.0f, 0.0f);
  EXPECT_TRUE(AllClose(out, Tensor::Zeros({3, 4}), 0, 0));
}

TEST_P(MatmulTest, OutputAliasingAnInput) {
  // BLAS may not write where it reads; the kernel must compute such products aside.
  Tensor a = RandomTensor({6, 6}, rng_), b = RandomTensor({6, 6}, rng_);
  Tensor want = Tensor::Empty({6, 6});
  reference::matmul(a, b, want, false, true, 1.0f, 0.0f);
  kernels::matmul.Get(kCpu)(a, b, a, false, true, 1.0f, 0.0f);
  EXPECT_TRUE(AllClose(a, want, 1e-5f, 1e-5f));
}

TEST_P(MatmulTest, OneAndTwoThreadsAgree) {
  Tensor a = RandomTensor({300, 200}, rng_), b = RandomTensor({250, 200}, rng_);
  auto [one, two] = testing::RunWithThreads([&] {
    Tensor o = Tensor::Empty({300, 250});
    kernels::matmul.Get(kCpu)(a, b, o, false, true, 1.0f, 0.0f);
    return std::vector<Tensor>{o};
  });
  // OpenBLAS may block differently per thread count: equal within rounding.
  EXPECT_TRUE(AllClose(one[0], two[0], 1e-4f, 1e-5f));
}

INSTANTIATE_TEST_SUITE_P(Configs, MatmulTest, ::testing::ValuesIn(testing::AllConfigs()),
                         testing::ConfigName);

}  // namespace
}  // namespace braid::cpu
