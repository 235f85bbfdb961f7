// Checks the reference kernels on the parts core's op tests do not reach (optimizer updates,
// alpha/beta arguments, the unary ops no op uses), against hand-worked values and formulas
// written differently from the kernels'.
#include "core/testing/reference_kernels.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace braid::reference {
namespace {

Tensor Vec(const std::vector<float>& v, const Shape& shape) {
  return Tensor::FromVector(v, shape);
}

void ExpectNear(const std::vector<float>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "at " << i;
}

TEST(ReferenceKernelsTest, RegistersOnlyEmptySlots) {
  static bool called = false;
  auto* mine = +[](const Tensor&, Tensor&) { called = true; };
  kernels::sum_all.Register(DeviceType::kCPU, mine);
  RegisterReferenceKernels();
  EXPECT_EQ(kernels::sum_all.Find(DeviceType::kCPU), mine);
  EXPECT_EQ(kernels::matmul.Find(DeviceType::kCPU), &matmul);
  EXPECT_EQ(kernels::matmul.Find(DeviceType::kCUDA), nullptr);
  kernels::sum_all.Register(DeviceType::kCPU, nullptr);
  RegisterReferenceKernels();
  EXPECT_EQ(kernels::sum_all.Find(DeviceType::kCPU), &sum_all);
  EXPECT_FALSE(called);
}

TEST(ReferenceKernelsTest, CopyAndFillConvert) {
  Tensor src = Vec({1.0f, -2.5f, 1.00390625f, 65504.0f}, {4});
  Tensor bf = Tensor::Empty({4}, DType::kBF16);
  copy(src, bf);
  const uint16_t* h = static_cast<const uint16_t*>(bf.raw_data());
  EXPECT_EQ(h[0], 0x3f80);  // 1.0
  EXPECT_EQ(h[1], 0xc020);  // -2.5
  EXPECT_EQ(h[2], 0x3f80);  // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: even mantissa wins
  Tensor half = Tensor::Empty({4}, DType::kF16);
  copy(src, half);
  EXPECT_EQ(static_cast<const uint16_t*>(half.raw_data())[3], 0x7bff);  // f16 max
  Tensor back = Tensor::Empty({4});
  copy(half, back);
  EXPECT_EQ(back.ToFloatVector()[1], -2.5f);
  fill(half, 3.0f);
  EXPECT_EQ(static_cast<const uint16_t*>(half.raw_data())[0], 0x4200);
  Tensor ints = Tensor::Empty({3}, DType::kI32);
  fill(ints, 7.0f);
  EXPECT_EQ(ints.ToVector<int32_t>(), (std::vector<int32_t>{7, 7, 7}));
}

TEST(ReferenceKernelsTest, BinaryBroadcastsRowsAndDivides) {
  Tensor a = Vec({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = Vec({10, 20, 30}, {3});
  Tensor out = Tensor::Empty({2, 3});
  binary(BinaryOp::kSub, a, b, out);
  ExpectNear(out.ToFloatVector(), {-9, -18, -27, -6, -15, -24}, 0);
  binary(BinaryOp::kDiv, a, b, out);
  ExpectNear(out.ToFloatVector(), {0.1, 0.1, 0.1, 0.4, 0.25, 0.2}, 1e-7);
  binary(BinaryOp::kMul, a, a, a);  // out aliases both inputs
  ExpectNear(a.ToFloatVector(), {1, 4, 9, 16, 25, 36}, 0);
}

TEST(ReferenceKernelsTest, UnaryOpsAndDerivatives) {
  std::vector<float> xs = {0.25f, 1.0f, 2.0f, 4.0f};
  Tensor a = Vec(xs, {4});
  Tensor out = Tensor::Empty({4}), gin = Tensor::Empty({4});
  Tensor ones = Tensor::Full({4}, 1.0f);
  unary(UnaryOp::kSqrt, a, 0, out);
  ExpectNear(out.ToFloatVector(), {0.5, 1, std::sqrt(2.0), 2}, 1e-7);
  unary_backward(UnaryOp::kSqrt, a, ones, gin);
  ExpectNear(gin.ToFloatVector(), {1, 0.5, 0.5 / std::sqrt(2.0), 0.25}, 1e-7);
  unary(UnaryOp::kSquare, a, 0, out);
  ExpectNear(out.ToFloatVector(), {0.0625, 1, 4, 16}, 0);
  unary_backward(UnaryOp::kSquare, a, Tensor::Full({4}, 3.0f), gin);
  ExpectNear(gin.ToFloatVector(), {1.5, 6, 12, 24}, 0);
  unary(UnaryOp::kNeg, a, 0, out);
  ExpectNear(out.ToFloatVector(), {-0.25, -1, -2, -4}, 0);
  unary(UnaryOp::kAddScalar, a, 1.5f, out);
  ExpectNear(out.ToFloatVector(), {1.75, 2.5, 3.5, 5.5}, 0);
  unary(UnaryOp::kScale, a, -2.0f, a);  // in place
  ExpectNear(a.ToFloatVector(), {-0.5, -2, -4, -8}, 0);
  Tensor r = Vec({-1.0f, 0.0f, 2.0f, -0.0f}, {4});
  unary(UnaryOp::kRelu, r, 0, out);
  ExpectNear(out.ToFloatVector(), {0, 0, 2, 0}, 0);
  unary_backward(UnaryOp::kRelu, r, ones, gin);
  ExpectNear(gin.ToFloatVector(), {0, 0, 1, 0}, 0);
}

TEST(ReferenceKernelsTest, AxpbyAndBetaZeroIgnoresGarbage) {
  Tensor x = Vec({1, 2}, {2});
  Tensor y = Vec({10, 20}, {2});
  axpby(2.0f, x, 0.5f, y);
  ExpectNear(y.ToFloatVector(), {7, 14}, 0);
  Tensor nan = Tensor::Full({2}, NAN);
  axpby(3.0f, x, 0.0f, nan);
  ExpectNear(nan.ToFloatVector(), {3, 6}, 0);
}

TEST(ReferenceKernelsTest, SumRowsWithBeta) {
  Tensor a = Vec({1, 2, 3, 4, 5, 6}, {3, 2});
  Tensor out = Vec({100, 200}, {2});
  sum_rows(a, out, 1.0f);
  ExpectNear(out.ToFloatVector(), {109, 212}, 0);
  Tensor garbage = Tensor::Full({2}, NAN);
  sum_rows(a, garbage, 0.0f);
  ExpectNear(garbage.ToFloatVector(), {9, 12}, 0);
  Tensor s = Tensor::Empty({});
  sum_all(a, s);
  EXPECT_EQ(s.item(), 21.0f);
}

TEST(ReferenceKernelsTest, MatmulAlphaBetaTransposeAndBatch) {
  // a = [[1,2],[3,4]], b = [[5,6],[7,8]]: a@b = [[19,22],[43,50]], a^T@b = [[26,30],[38,44]],
  // a@b^T = [[17,23],[39,53]], a^T@b^T = [[23,31],[34,46]].
  Tensor a = Vec({1, 2, 3, 4}, {2, 2}), b = Vec({5, 6, 7, 8}, {2, 2});
  Tensor out = Tensor::Empty({2, 2});
  matmul(a, b, out, false, false, 1, 0);
  ExpectNear(out.ToFloatVector(), {19, 22, 43, 50}, 0);
  matmul(a, b, out, true, false, 1, 0);
  ExpectNear(out.ToFloatVector(), {26, 30, 38, 44}, 0);
  matmul(a, b, out, false, true, 1, 0);
  ExpectNear(out.ToFloatVector(), {17, 23, 39, 53}, 0);
  matmul(a, b, out, true, true, 1, 0);
  ExpectNear(out.ToFloatVector(), {23, 31, 34, 46}, 0);
  matmul(a, b, out, false, false, 2, -1);  // 2 * a@b - (a^T@b^T)
  ExpectNear(out.ToFloatVector(), {38 - 23, 44 - 31, 86 - 34, 100 - 46}, 0);
  // Batched, non-square: [2, 1, 3] @ [2, 3, 2].
  Tensor ba = Vec({1, 2, 3, 1, 0, -1}, {2, 1, 3});
  Tensor bb = Vec({1, 0, 0, 1, 1, 1, 2, 2, 3, 3, 4, 4}, {2, 3, 2});
  Tensor bo = Tensor::Full({2, 1, 2}, NAN);
  matmul(ba, bb, bo, false, false, 1, 0);
  ExpectNear(bo.ToFloatVector(), {4, 5, -2, -2}, 0);
}

TEST(ReferenceKernelsTest, CrossEntropyIgnoresNegativeTargets) {
  Tensor logits = Vec({0, 0, 0, 0, 1, 2, 3, 4}, {2, 4});
  Tensor targets = Tensor::FromVector<int32_t>({2, -1}, {2});
  Tensor losses = Tensor::Empty({2}), probs = Tensor::Empty({2, 4});
  cross_entropy_forward(logits, targets, losses, probs);
  ExpectNear(losses.ToFloatVector(), {std::log(4.0), 0.0}, 1e-6);
  Tensor dl = Tensor::Empty({2, 4});
  cross_entropy_backward(probs, targets, Vec({2, 2}, {2}), dl);
  ExpectNear(dl.ToFloatVector(), {0.5, 0.5, -1.5, 0.5, 0, 0, 0, 0}, 1e-6);
}

TEST(ReferenceKernelsTest, AdamWFirstStepMovesByLrTimesSign) {
  // With bias correction, step 1 has mhat = g and vhat = g^2: the update is lr * g / (|g| + eps).
  Tensor p = Vec({1.0f, -1.0f, 0.5f}, {3});
  Tensor g = Vec({0.3f, -2.0f, 1e-3f}, {3});
  Tensor m = Tensor::Zeros({3}), v = Tensor::Zeros({3});
  AdamWParams hp{/*lr=*/0.1f, 0.9f, 0.999f, /*eps=*/1e-8f, /*weight_decay=*/0.0f, /*step=*/1};
  adamw(p, g, m, v, hp);
  ExpectNear(p.ToFloatVector(), {0.9, -0.9, 0.4}, 1e-5);
  // The betas arrive as floats: 1 - 0.999f is not exactly 0.001.
  const double c1 = 1 - double(0.9f), c2 = 1 - double(0.999f);
  ExpectNear(m.ToFloatVector(), {c1 * 0.3f, c1 * -2.0f, c1 * 1e-3f}, 1e-8);
  ExpectNear(v.ToFloatVector(), {c2 * 0.3f * 0.3f, c2 * 4, c2 * 1e-3f * 1e-3f}, 1e-10);
}

TEST(ReferenceKernelsTest, AdamWMatchesPyTorchFormOverSteps) {
  // PyTorch's own arrangement: p *= 1 - lr*wd; p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps).
  std::vector<float> p0 = {0.5f, -1.5f, 2.0f, 0.0f};
  Tensor p = Vec(p0, {4}), m = Tensor::Zeros({4}), v = Tensor::Zeros({4});
  std::vector<double> P(p0.begin(), p0.end()), M(4, 0.0), V(4, 0.0);
  const double lr = 0.01, b1 = 0.8, b2 = 0.95, eps = 1e-6, wd = 0.1;
  for (int step = 1; step <= 4; ++step) {
    std::vector<float> gv = {0.1f * step, -0.2f, 0.05f * step * step, 1.0f / step};
    adamw(p, Vec(gv, {4}), m, v, AdamWParams{float(lr), float(b1), float(b2), float(eps),
                                             float(wd), step});
    double bc1 = 1 - std::pow(b1, step), bc2 = 1 - std::pow(b2, step);
    for (int i = 0; i < 4; ++i) {
      P[i] *= 1 - lr * wd;
      M[i] = M[i] + (1 - b1) * (gv[i] - M[i]);  // lerp
      V[i] = b2 * V[i] + (1 - b2) * gv[i] * gv[i];
      P[i] -= (lr / bc1) * M[i] / (std::sqrt(V[i]) / std::sqrt(bc2) + eps);
    }
  }
  ExpectNear(p.ToFloatVector(), P, 1e-6);
  ExpectNear(m.ToFloatVector(), M, 1e-6);
}

TEST(ReferenceKernelsTest, SgdFollowsPyTorch) {
  // Constant gradient 1, lr 0.1, momentum 0.9: buffer 1 then 1.9; p = -0.1 then -0.29.
  Tensor p = Tensor::Zeros({1}), g = Tensor::Full({1}, 1.0f), buf = Tensor::Full({1}, NAN);
  SgdParams hp{/*lr=*/0.1f, /*momentum=*/0.9f, /*dampening=*/0.0f, /*weight_decay=*/0.0f,
               /*nesterov=*/false, /*first_step=*/true};
  sgd(p, g, buf, hp);
  EXPECT_NEAR(buf.item(), 1.0, 1e-7);
  EXPECT_NEAR(p.item(), -0.1, 1e-7);
  hp.first_step = false;
  sgd(p, g, buf, hp);
  EXPECT_NEAR(buf.item(), 1.9, 1e-6);
  EXPECT_NEAR(p.item(), -0.29, 1e-6);
  // Dampening applies from the second step: 0.9 * 1 + 0.5 * 1.
  Tensor p2 = Tensor::Zeros({1}), buf2 = Tensor::Zeros({1});
  hp.dampening = 0.5f;
  hp.first_step = true;
  sgd(p2, g, buf2, hp);
  hp.first_step = false;
  sgd(p2, g, buf2, hp);
  EXPECT_NEAR(buf2.item(), 1.4, 1e-6);
  EXPECT_NEAR(p2.item(), -0.1 - 0.14, 1e-6);
  // Nesterov: the step uses g + momentum * buf = 1 + 0.9 on the first step.
  Tensor p3 = Tensor::Zeros({1}), buf3 = Tensor::Zeros({1});
  SgdParams nh{0.1f, 0.9f, 0.0f, 0.0f, /*nesterov=*/true, /*first_step=*/true};
  sgd(p3, g, buf3, nh);
  EXPECT_NEAR(p3.item(), -0.19, 1e-6);
  // Weight decay is added to the gradient (coupled): d = g + wd * p = 1 + 0.5 * 2.
  Tensor p4 = Tensor::Full({1}, 2.0f);
  Tensor unused;
  SgdParams wh{0.1f, /*momentum=*/0.0f, 0.0f, /*weight_decay=*/0.5f, false, true};
  sgd(p4, g, unused, wh);
  EXPECT_NEAR(p4.item(), 2.0 - 0.2, 1e-6);
}

}  // namespace
}  // namespace braid::reference
