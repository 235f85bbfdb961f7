// The Llama-family kernels (RMSNorm, SiLU/SwiGLU, rotary embedding) against the reference
// kernels, the backward kernels against finite differences of the forward ones, and the same
// bits for any thread count.
#include <cmath>
#include <limits>
#include <string>
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

// (rows, cols): single elements, odd widths around the vector width of 8, and a model's width.
const std::vector<std::pair<int64_t, int64_t>> kRowShapes = {
    {1, 1}, {1, 7}, {3, 8}, {5, 9}, {2, 17}, {13, 33}, {64, 256}, {7, 1000}};

class LlamaKernelsTest : public KernelTest {};

TEST_P(LlamaKernelsTest, RmsNormForwardMatchesReference) {
  for (auto [rows, cols] : kRowShapes) {
    Tensor x = RandomTensor({rows, cols}, rng_, -2.0f, 3.0f), w = RandomTensor({cols}, rng_);
    Tensor out = Tensor::Empty({rows, cols}), rstd = Tensor::Empty({rows});
    Tensor rout = Tensor::Empty({rows, cols}), rrstd = Tensor::Empty({rows});
    kernels::rmsnorm_forward.Get(kCpu)(x, w, 1e-6f, out, rstd);
    reference::rmsnorm_forward(x, w, 1e-6f, rout, rrstd);
    const std::string what = std::to_string(rows) + "x" + std::to_string(cols);
    EXPECT_TRUE(AllClose(rstd, rrstd, 1e-6f, 1e-5f)) << what;
    EXPECT_TRUE(AllClose(out, rout, 1e-6f, 1e-5f)) << what;
  }
}

TEST_P(LlamaKernelsTest, RmsNormOfZerosIsZerosWithRstdFromEps) {
  Tensor x = Tensor::Zeros({2, 5}), w = RandomTensor({5}, rng_);
  Tensor out = Tensor::Empty({2, 5}), rstd = Tensor::Empty({2});
  kernels::rmsnorm_forward.Get(kCpu)(x, w, 0.25f, out, rstd);
  EXPECT_EQ(out.ToFloatVector(), std::vector<float>(10, 0.0f));
  EXPECT_EQ(rstd.ToFloatVector(), std::vector<float>(2, 2.0f));  // 1 / sqrt(0.25)
}

TEST_P(LlamaKernelsTest, RmsNormBackwardMatchesReference) {
  for (auto [rows, cols] : kRowShapes) {
    Tensor x = RandomTensor({rows, cols}, rng_, -2.0f, 3.0f), w = RandomTensor({cols}, rng_);
    Tensor g = RandomTensor({rows, cols}, rng_);
    Tensor out = Tensor::Empty({rows, cols}), rstd = Tensor::Empty({rows});
    reference::rmsnorm_forward(x, w, 1e-6f, out, rstd);
    // dweight is added into: start both from the same non-zero values.
    Tensor dw0 = RandomTensor({cols}, rng_);
    Tensor dx = Tensor::Empty({rows, cols}), dw = dw0.Clone();
    Tensor rdx = Tensor::Empty({rows, cols}), rdw = dw0.Clone();
    kernels::rmsnorm_backward.Get(kCpu)(g, x, w, rstd, dx, dw);
    reference::rmsnorm_backward(g, x, w, rstd, rdx, rdw);
    const std::string what = std::to_string(rows) + "x" + std::to_string(cols);
    EXPECT_TRUE(AllClose(dx, rdx, 2e-5f, 2e-5f)) << what;
    // dweight sums `rows` terms in f32: the reference sums them in double.
    EXPECT_TRUE(AllClose(dw, rdw, 1e-5f, 2e-6f * float(rows))) << what;
  }
}

TEST_P(LlamaKernelsTest, RmsNormBackwardMatchesFiniteDifferences) {
  const int64_t rows = 3, cols = 11;
  Tensor x = RandomTensor({rows, cols}, rng_, -1.0f, 2.0f), w = RandomTensor({cols}, rng_);
  Tensor g = RandomTensor({rows, cols}, rng_);
  Tensor out = Tensor::Empty({rows, cols}), rstd = Tensor::Empty({rows});
  auto loss = [&] {
    kernels::rmsnorm_forward.Get(kCpu)(x, w, 1e-6f, out, rstd);
    return testing::WeightedSum(out, g);
  };
  std::vector<double> nx = testing::NumericGrad(x, loss);
  std::vector<double> nw = testing::NumericGrad(w, loss);
  loss();  // rstd of the unperturbed input
  Tensor dx = Tensor::Empty({rows, cols}), dw = Tensor::Zeros({cols});
  kernels::rmsnorm_backward.Get(kCpu)(g, x, w, rstd, dx, dw);
  EXPECT_TRUE(testing::GradClose(dx, nx, 5e-3, 1e-2));
  EXPECT_TRUE(testing::GradClose(dw, nw, 5e-3, 1e-2));
}

TEST_P(LlamaKernelsTest, RmsNormBackwardIsTheSameForAnyThreadCount) {
  Tensor x = RandomTensor({300, 96}, rng_), w = RandomTensor({96}, rng_);
  Tensor g = RandomTensor({300, 96}, rng_);
  Tensor out = Tensor::Empty({300, 96}), rstd = Tensor::Empty({300});
  reference::rmsnorm_forward(x, w, 1e-6f, out, rstd);
  auto run = [&] {
    Tensor dx = Tensor::Empty({300, 96}), dw = Tensor::Zeros({96});
    kernels::rmsnorm_backward.Get(kCpu)(g, x, w, rstd, dx, dw);
    return std::vector<Tensor>{dx, dw};
  };
  auto [one, many] = testing::RunWithThreads(run, 2);
  EXPECT_TRUE(BitEqual(one[0], many[0]));
  EXPECT_TRUE(BitEqual(one[1], many[1]));
}

TEST_P(LlamaKernelsTest, SwiGluAndSiluMatchReference) {
  for (int64_t n : {1, 7, 64, 1000, 70000}) {
    Tensor gate = RandomTensor({n}, rng_, -12.0f, 12.0f), up = RandomTensor({n}, rng_);
    Tensor dout = RandomTensor({n}, rng_);
    for (bool with_up : {true, false}) {
      const Tensor u = with_up ? up : Tensor();
      Tensor out = Tensor::Empty({n}), rout = Tensor::Empty({n});
      kernels::swiglu_forward.Get(kCpu)(gate, u, out);
      reference::swiglu_forward(gate, u, rout);
      const std::string what = std::to_string(n) + (with_up ? " swiglu" : " silu");
      EXPECT_TRUE(AllClose(out, rout, 1e-6f, 1e-5f)) << what;
      Tensor dg = Tensor::Empty({n}), rdg = Tensor::Empty({n});
      Tensor du = with_up ? Tensor::Empty({n}) : Tensor();
      Tensor rdu = with_up ? Tensor::Empty({n}) : Tensor();
      kernels::swiglu_backward.Get(kCpu)(dout, gate, u, dg, du);
      reference::swiglu_backward(dout, gate, u, rdg, rdu);
      EXPECT_TRUE(AllClose(dg, rdg, 1e-6f, 1e-5f)) << what;
      if (with_up) {
        EXPECT_TRUE(AllClose(du, rdu, 1e-6f, 1e-5f)) << what;
      }
    }
  }
}

TEST_P(LlamaKernelsTest, SiluOfLargeMagnitudesIsFinite) {
  // e^-g overflows f32 for g < -88: silu must give -0 there, not NaN; large g gives g.
  std::vector<float> v = {-1000.0f, -100.0f, -89.0f, 0.0f, 89.0f, 1000.0f};
  Tensor g = Tensor::FromVector(v, {int64_t(v.size())});
  Tensor out = Tensor::Empty(g.shape()), rout = Tensor::Empty(g.shape());
  kernels::swiglu_forward.Get(kCpu)(g, Tensor(), out);
  reference::swiglu_forward(g, Tensor(), rout);
  EXPECT_TRUE(AllClose(out, rout, 1e-6f, 1e-6f));
  Tensor dg = Tensor::Empty(g.shape()), rdg = Tensor::Empty(g.shape()), none;
  Tensor ones = Tensor::FromVector(std::vector<float>(v.size(), 1.0f), g.shape());
  kernels::swiglu_backward.Get(kCpu)(ones, g, Tensor(), dg, none);
  reference::swiglu_backward(ones, g, Tensor(), rdg, none);
  EXPECT_TRUE(AllClose(dg, rdg, 1e-6f, 1e-6f));
  for (float y : out.ToFloatVector()) EXPECT_TRUE(std::isfinite(y)) << y;
}

TEST_P(LlamaKernelsTest, SwiGluBackwardMatchesFiniteDifferences) {
  Tensor gate = RandomTensor({13}, rng_, -4.0f, 4.0f), up = RandomTensor({13}, rng_);
  Tensor w = RandomTensor({13}, rng_), out = Tensor::Empty({13});
  auto loss = [&] {
    kernels::swiglu_forward.Get(kCpu)(gate, up, out);
    return testing::WeightedSum(out, w);
  };
  std::vector<double> ng = testing::NumericGrad(gate, loss, 1e-3f);
  std::vector<double> nu = testing::NumericGrad(up, loss, 1e-3f);
  Tensor dg = Tensor::Empty({13}), du = Tensor::Empty({13});
  kernels::swiglu_backward.Get(kCpu)(w, gate, up, dg, du);
  EXPECT_TRUE(testing::GradClose(dg, ng, 1e-3, 1e-2));
  EXPECT_TRUE(testing::GradClose(du, nu, 1e-3, 1e-2));
}

struct RopeCase {
  Shape shape;
  kernels::RopeParams p;
};

TEST_P(LlamaKernelsTest, RopeMatchesReference) {
  std::vector<RopeCase> cases = {
      {{1, 1, 1, 2}, {}},
      {{2, 5, 3, 8}, {}},
      {{2, 7, 4, 16}, {500000.0f, 1.0f, 0, false}},
      {{1, 9, 2, 64}, {10000.0f, 4.0f, 3, false}},
      {{3, 4, 2, 6}, {10000.0f, 1.0f, 1000, true}},
      // Long positions: angles in the thousands of radians.
      {{1, 3, 1, 32}, {10000.0f, 1.0f, 8190, false}},
  };
  for (const RopeCase& c : cases) {
    Tensor x = RandomTensor(c.shape, rng_);
    Tensor out = Tensor::Empty(c.shape), rout = Tensor::Empty(c.shape);
    kernels::rope.Get(kCpu)(x, c.p, out);
    reference::rope(x, c.p, rout);
    // cos and sin are rounded to f32 once, and each output sums two products.
    EXPECT_TRUE(AllClose(out, rout, 1e-6f, 1e-5f))
        << c.shape.size() << "-D, offset " << c.p.position_offset << ", D " << c.shape[3];
  }
}

// The kernel keeps the cos/sin tables of its last calls: a call whose shape or parameters differ
// in any one field from a kept table's must not get that table. Keys differing in one field
// each, each called twice in a row (the second finds its table kept: the same bits) and again
// after the others (by then pushed out and formed anew), every time against the reference.
TEST_P(LlamaKernelsTest, RopeTablesAreKeptPerShapeAndParameters) {
  const Shape base = {2, 6, 2, 8};
  const kernels::RopeParams p0{10000.0f, 1.0f, 0, false};
  std::vector<RopeCase> cases = {{base, p0}};
  auto vary = [&](auto edit) {
    RopeCase c{base, p0};
    edit(c);
    cases.push_back(c);
  };
  vary([](RopeCase& c) { c.p.theta = 500000.0f; });
  vary([](RopeCase& c) { c.p.position_scale = 4.0f; });
  vary([](RopeCase& c) { c.p.position_offset = 7; });
  vary([](RopeCase& c) { c.p.inverse = true; });
  vary([](RopeCase& c) { c.shape[1] = 5; });   // T
  vary([](RopeCase& c) { c.shape[3] = 12; });  // D
  vary([](RopeCase& c) { c.shape[0] = 3; });   // the same table: only B differs
  std::vector<Tensor> xs, first;
  for (const RopeCase& c : cases) xs.push_back(RandomTensor(c.shape, rng_));
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < cases.size(); ++i) {
      const RopeCase& c = cases[i];
      Tensor out = Tensor::Empty(c.shape), again = Tensor::Empty(c.shape);
      Tensor rout = Tensor::Empty(c.shape);
      kernels::rope.Get(kCpu)(xs[i], c.p, out);
      kernels::rope.Get(kCpu)(xs[i], c.p, again);
      reference::rope(xs[i], c.p, rout);
      EXPECT_TRUE(AllClose(out, rout, 1e-6f, 1e-5f)) << "case " << i << ", pass " << pass;
      EXPECT_TRUE(BitEqual(out, again)) << "case " << i << ", pass " << pass;
      if (pass == 0) first.push_back(out);
      if (pass == 1) {
        EXPECT_TRUE(BitEqual(out, first[i])) << "case " << i;
      }
    }
  }
}

TEST_P(LlamaKernelsTest, RopeInverseUndoesRope) {
  Tensor x = RandomTensor({2, 6, 3, 10}, rng_);
  kernels::RopeParams p{10000.0f, 2.0f, 5, false};
  Tensor y = Tensor::Empty(x.shape()), back = Tensor::Empty(x.shape());
  kernels::rope.Get(kCpu)(x, p, y);
  p.inverse = true;
  kernels::rope.Get(kCpu)(y, p, back);
  EXPECT_TRUE(AllClose(back, x, 1e-6f, 1e-6f));
  // ... and y really moved (position 5 / 2 rotates the lowest frequency by 2.5 rad).
  EXPECT_FALSE(AllClose(y, x, 1e-3f, 0.0f));
}

TEST_P(LlamaKernelsTest, RopeIsTheSameForAnyThreadCount) {
  Tensor x = RandomTensor({4, 64, 4, 32}, rng_);
  auto run = [&] {
    Tensor y = Tensor::Empty(x.shape());
    kernels::rope.Get(kCpu)(x, kernels::RopeParams{}, y);
    return std::vector<Tensor>{y};
  };
  auto [one, many] = testing::RunWithThreads(run, 2);
  EXPECT_TRUE(BitEqual(one[0], many[0]));
}

// ---- Grouped-query attention --------------------------------------------------------------

struct GqaCase {
  int64_t b, t, h, hkv, d;
};
// Multi-head (hkv = h), grouped, multi-query (hkv = 1), odd sizes around the vector width.
const std::vector<GqaCase> kGqaCases = {
    {1, 1, 1, 1, 1}, {2, 5, 4, 4, 8}, {2, 7, 6, 2, 9}, {1, 9, 4, 1, 16}, {3, 17, 8, 2, 32}};

TEST_P(LlamaKernelsTest, GqaMatchesReference) {
  for (const GqaCase& c : kGqaCases) {
    Tensor q = RandomTensor({c.b, c.t, c.h, c.d}, rng_, -2.0f, 2.0f);
    Tensor k = RandomTensor({c.b, c.t, c.hkv, c.d}, rng_, -2.0f, 2.0f);
    Tensor v = RandomTensor({c.b, c.t, c.hkv, c.d}, rng_);
    Tensor g = RandomTensor({c.b, c.t, c.h, c.d}, rng_);
    Tensor out = Tensor::Empty(q.shape()), att = Tensor::Empty({c.b, c.h, c.t, c.t});
    Tensor rout = Tensor::Empty(q.shape()), ratt = Tensor::Empty({c.b, c.h, c.t, c.t});
    kernels::gqa_forward.Get(kCpu)(q, k, v, out, att);
    reference::gqa_forward(q, k, v, rout, ratt);
    const std::string what = "b" + std::to_string(c.b) + " t" + std::to_string(c.t) + " h" +
                             std::to_string(c.h) + " hkv" + std::to_string(c.hkv) + " d" +
                             std::to_string(c.d);
    EXPECT_TRUE(AllClose(att, ratt, 1e-6f, 1e-5f)) << what;
    EXPECT_TRUE(AllClose(out, rout, 1e-6f, 1e-5f)) << what;
    // dk and dv are written, not added: start them from garbage.
    Tensor dq = Tensor::Full(q.shape(), 7.0f), dk = Tensor::Full(k.shape(), 7.0f),
           dv = Tensor::Full(v.shape(), 7.0f);
    Tensor rdq = Tensor::Empty(q.shape()), rdk = Tensor::Empty(k.shape()),
           rdv = Tensor::Empty(v.shape());
    kernels::gqa_backward.Get(kCpu)(g, q, k, v, ratt, dq, dk, dv);
    reference::gqa_backward(g, q, k, v, ratt, rdq, rdk, rdv);
    EXPECT_TRUE(AllClose(dq, rdq, 2e-5f, 1e-4f)) << what;
    EXPECT_TRUE(AllClose(dk, rdk, 2e-5f, 1e-4f)) << what;
    EXPECT_TRUE(AllClose(dv, rdv, 2e-5f, 1e-4f)) << what;
  }
}

TEST_P(LlamaKernelsTest, GqaBackwardMatchesFiniteDifferences) {
  Tensor q = RandomTensor({1, 4, 4, 3}, rng_), k = RandomTensor({1, 4, 2, 3}, rng_);
  Tensor v = RandomTensor({1, 4, 2, 3}, rng_), w = RandomTensor({1, 4, 4, 3}, rng_);
  Tensor out = Tensor::Empty(q.shape()), att = Tensor::Empty({1, 4, 4, 4});
  auto loss = [&] {
    kernels::gqa_forward.Get(kCpu)(q, k, v, out, att);
    return testing::WeightedSum(out, w);
  };
  std::vector<double> nq = testing::NumericGrad(q, loss, 1e-3f);
  std::vector<double> nk = testing::NumericGrad(k, loss, 1e-3f);
  std::vector<double> nv = testing::NumericGrad(v, loss, 1e-3f);
  loss();
  Tensor dq = Tensor::Empty(q.shape()), dk = Tensor::Empty(k.shape()), dv = Tensor::Empty(v.shape());
  kernels::gqa_backward.Get(kCpu)(w, q, k, v, att, dq, dk, dv);
  EXPECT_TRUE(testing::GradClose(dq, nq, 1e-3, 1e-2));
  EXPECT_TRUE(testing::GradClose(dk, nk, 1e-3, 1e-2));
  EXPECT_TRUE(testing::GradClose(dv, nv, 1e-3, 1e-2));
}

TEST_P(LlamaKernelsTest, GqaIsTheSameForAnyThreadCount) {
  Tensor q = RandomTensor({2, 33, 8, 16}, rng_), k = RandomTensor({2, 33, 2, 16}, rng_);
  Tensor v = RandomTensor({2, 33, 2, 16}, rng_), g = RandomTensor({2, 33, 8, 16}, rng_);
  auto run = [&] {
    Tensor out = Tensor::Empty(q.shape()), att = Tensor::Empty({2, 8, 33, 33});
    kernels::gqa_forward.Get(kCpu)(q, k, v, out, att);
    Tensor dq = Tensor::Empty(q.shape()), dk = Tensor::Empty(k.shape()),
           dv = Tensor::Empty(v.shape());
    kernels::gqa_backward.Get(kCpu)(g, q, k, v, att, dq, dk, dv);
    return std::vector<Tensor>{out, att, dq, dk, dv};
  };
  auto [one, many] = testing::RunWithThreads(run, 2);
  for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(BitEqual(one[i], many[i])) << i;
}

// ---- Dropout ----------------------------------------------------------------------------------

TEST_P(LlamaKernelsTest, DropoutIsTheReferenceMaskOnAnyThreadCount) {
  Tensor x = RandomTensor({100003}, rng_);
  for (float p : {0.0f, 0.1f, 0.5f, 1.0f}) {
    Tensor ref = Tensor::Empty(x.shape());
    reference::dropout(x, p, 99, ref);
    auto run = [&] {
      Tensor out = Tensor::Empty(x.shape());
      kernels::dropout.Get(kCpu)(x, p, 99, out);
      return std::vector<Tensor>{out};
    };
    auto [one, many] = testing::RunWithThreads(run, 2);
    EXPECT_TRUE(BitEqual(one[0], ref)) << p;
    EXPECT_TRUE(BitEqual(many[0], ref)) << p;
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, LlamaKernelsTest, ::testing::ValuesIn(testing::AllConfigs()),
                         testing::ConfigName);

}  // namespace
}  // namespace braid::cpu
