#include "core/optimizer.h"

#include <cmath>
#include <functional>
#include <memory>
#include <vector>

#include "core/testing/reference_kernels.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace braid {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

class OptimizerTest : public ::testing::Test {
 protected:
  void SetUp() override { reference::RegisterReferenceKernels(); }
};

Tensor Param(const std::vector<float>& v, const Shape& shape, const std::string& name = "") {
  Tensor t = Tensor::FromVector(v, shape);
  t.set_requires_grad(true);
  if (!name.empty()) t.set_name(name);
  return t;
}

// Gradient of step `step` for a parameter of n elements (varied signs and sizes).
std::vector<float> Grad(int step, int n, int salt) {
  std::vector<float> g(n);
  for (int i = 0; i < n; ++i) g[i] = 0.3f * float((i * 5 + step * 3 + salt) % 7) - 0.8f;
  return g;
}

void SetGrad(Tensor& p, int step, int salt) {
  p.set_grad(Tensor::FromVector(Grad(step, int(p.numel()), salt), p.shape()));
}

void ExpectNear(const std::vector<float>& got, const std::vector<double>& want, double tol,
                const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], tol) << what << " element " << i;
  }
}

// PyTorch's AdamW for one parameter, in double.
struct AdamWRef {
  std::vector<double> w, m, v;
  void Step(const std::vector<float>& g, double lr, double wd, int t, double b1 = 0.9,
            double b2 = 0.999, double eps = 1e-8) {
    for (size_t i = 0; i < w.size(); ++i) {
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * double(g[i]) * g[i];
      double mhat = m[i] / (1 - std::pow(b1, t)), vhat = v[i] / (1 - std::pow(b2, t));
      w[i] = w[i] - lr * wd * w[i] - lr * mhat / (std::sqrt(vhat) + eps);
    }
  }
};

TEST_F(OptimizerTest, AdamWMatchesHandComputedStepsPerGroup) {
  std::vector<float> a0 = {0.5f, -1.0f, 2.0f, 0.25f}, b0 = {1, 2, 3, -4, -5, 6};
  Tensor a = Param(a0, {4}, "a"), b = Param(b0, {2, 3}, "b");
  Tensor frozen = Param({7.0f, 8.0f}, {2}, "frozen");  // never gets a gradient
  auto opt = MakeAdamW({ParamGroup{{a, frozen}, 0.01f, 0.1f}, ParamGroup{{b}, 0.05f, 0.0f}},
                       AdamWOptions{0.8f, 0.95f, 1e-6f});
  AdamWRef ra{{a0.begin(), a0.end()}, std::vector<double>(4), std::vector<double>(4)};
  AdamWRef rb{{b0.begin(), b0.end()}, std::vector<double>(6), std::vector<double>(6)};
  for (int t = 1; t <= 3; ++t) {
    SetGrad(a, t, 0);
    SetGrad(b, t, 1);
    opt->Step();
    ra.Step(Grad(t, 4, 0), 0.01, 0.1, t, 0.8, 0.95, 1e-6);
    rb.Step(Grad(t, 6, 1), 0.05, 0.0, t, 0.8, 0.95, 1e-6);
    ExpectNear(a.ToFloatVector(), ra.w, 1e-5, "a after step " + std::to_string(t));
    ExpectNear(b.ToFloatVector(), rb.w, 1e-5, "b after step " + std::to_string(t));
  }
  EXPECT_EQ(frozen.ToFloatVector(), (std::vector<float>{7.0f, 8.0f}));
  auto state = opt->StateDict();
  EXPECT_EQ(state.count("frozen.exp_avg"), 0u);
  ASSERT_EQ(state.count("a.exp_avg_sq"), 1u);
  ExpectNear(state["a.exp_avg_sq"].ToFloatVector(), ra.v, 1e-6, "a's exp_avg_sq");
  ExpectNear(state["b.exp_avg"].ToFloatVector(), rb.m, 1e-6, "b's exp_avg");
  EXPECT_EQ(state["step"].ToVector<int64_t>(), std::vector<int64_t>{3});
}

// PyTorch 1.13's results after 5 steps on w0 = {0.5, -1, 2, 0.25} with Grad(t, 4, 0) for
// t = 1..5, from (f32 gradients, f64 arithmetic):
//   Adam(L2):  torch.optim.Adam([w], lr=0.01, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.5)
//   AdamW:     torch.optim.AdamW(... the same ...)
//   SGD damp:  torch.optim.SGD([w], lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.5)
//   SGD nest.: torch.optim.SGD([w], lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.5)
// The weight decay is large on purpose: L2 and decoupled decay then differ by up to 3e-2 after
// 5 steps, and a missing bias correction changes the first steps by a factor 1 / (1 - 0.8^t).
const std::vector<double> kTorchAdamL2 = {0.460346028, -0.962070729, 1.95459637, 0.233169393};
const std::vector<double> kTorchAdamW = {0.45597984, -0.95905393, 1.92337687, 0.234497805};
const std::vector<double> kTorchSgdDampening = {0.177836117, -0.634660378, 1.20553488,
                                                0.132522369};
const std::vector<double> kTorchSgdNesterov = {0.0982839726, -0.576067941, 0.998706828,
                                               0.0937022845};
const std::vector<float> kW0 = {0.5f, -1.0f, 2.0f, 0.25f};

// Adam with L2 weight decay (PyTorch's Adam), in double: the decay joins the gradient before
// the moments.
struct AdamL2Ref {
  std::vector<double> w, m, v;
  void Step(const std::vector<float>& g, double lr, double wd, int t, double b1, double b2,
            double eps) {
    for (size_t i = 0; i < w.size(); ++i) {
      const double d = g[i] + wd * w[i];
      m[i] = b1 * m[i] + (1 - b1) * d;
      v[i] = b2 * v[i] + (1 - b2) * d * d;
      const double mhat = m[i] / (1 - std::pow(b1, t)), vhat = v[i] / (1 - std::pow(b2, t));
      w[i] -= lr * mhat / (std::sqrt(vhat) + eps);
    }
  }
};

// Runs 5 steps of `opt` over a parameter starting at kW0 and returns it.
std::vector<float> FiveSteps(const std::function<std::unique_ptr<Optimizer>(Tensor)>& make) {
  Tensor w = Param(kW0, {4}, "w");
  std::unique_ptr<Optimizer> opt = make(w);
  for (int t = 1; t <= 5; ++t) {
    SetGrad(w, t, 0);
    opt->Step();
  }
  return w.ToFloatVector();
}

TEST_F(OptimizerTest, AdamWithoutAdamWModeIsL2LikePyTorchAdam) {
  Tensor w = Param(kW0, {4}, "w");
  AdamOptions o{0.8f, 0.95f, 1e-6f, /*adam_w_mode=*/false};
  auto opt = MakeAdam({ParamGroup{{w}, 0.01f, 0.5f}}, o);
  EXPECT_EQ(opt->name(), "Adam");
  AdamL2Ref ref{{kW0.begin(), kW0.end()}, std::vector<double>(4), std::vector<double>(4)};
  for (int t = 1; t <= 5; ++t) {
    SetGrad(w, t, 0);
    const std::vector<float> grad_before = w.grad().ToFloatVector();
    opt->Step();
    ref.Step(Grad(t, 4, 0), 0.01, 0.5, t, 0.8, 0.95, 1e-6);
    ExpectNear(w.ToFloatVector(), ref.w, 2e-6, "w after step " + std::to_string(t));
    // The decay went into a scratch gradient, not into the parameter's own .grad.
    EXPECT_EQ(w.grad().ToFloatVector(), grad_before);
  }
  ExpectNear(w.ToFloatVector(), kTorchAdamL2, 2e-6, "against torch.optim.Adam");
  // The two decays really differ here (so the comparisons above can tell them apart).
  EXPECT_GT(std::abs(kTorchAdamL2[2] - kTorchAdamW[2]), 1e-2);
}

TEST_F(OptimizerTest, AdamDefaultsToDecoupledDecayLikePyTorchAdamW) {
  auto adam = [](Tensor w) {
    return MakeAdam({ParamGroup{{w}, 0.01f, 0.5f}}, AdamOptions{0.8f, 0.95f, 1e-6f});
  };
  auto adamw = [](Tensor w) {
    return MakeAdamW({ParamGroup{{w}, 0.01f, 0.5f}}, AdamWOptions{0.8f, 0.95f, 1e-6f});
  };
  ExpectNear(FiveSteps(adam), kTorchAdamW, 2e-6, "Adam (adam_w_mode) against torch AdamW");
  ExpectNear(FiveSteps(adamw), kTorchAdamW, 2e-6, "AdamW against torch AdamW");
}

TEST_F(OptimizerTest, SgdDampeningAndNesterovMatchPyTorch) {
  auto damp = [](Tensor w) {
    return MakeSgd({ParamGroup{{w}, 0.05f, 0.5f}}, SgdOptions{0.9f, 0.1f, false});
  };
  auto nesterov = [](Tensor w) {
    return MakeSgd({ParamGroup{{w}, 0.05f, 0.5f}}, SgdOptions{0.9f, 0.0f, true});
  };
  ExpectNear(FiveSteps(damp), kTorchSgdDampening, 2e-6, "SGD dampening against torch");
  ExpectNear(FiveSteps(nesterov), kTorchSgdNesterov, 2e-6, "SGD Nesterov against torch");
}

// PyTorch's SGD for one parameter, in double.
struct SgdRef {
  std::vector<double> w, buf;
  bool first = true;
  void Step(const std::vector<float>& g, double lr, double mom, double damp, double wd, bool nest) {
    for (size_t i = 0; i < w.size(); ++i) {
      double d = g[i] + wd * w[i];
      if (mom != 0) {
        buf[i] = first ? d : mom * buf[i] + (1 - damp) * d;
        d = nest ? d + mom * buf[i] : buf[i];
      }
      w[i] -= lr * d;
    }
    first = false;
  }
};

TEST_F(OptimizerTest, SgdVariantsMatchHandComputedSteps) {
  struct Case {
    const char* name;
    SgdOptions opts;
    float weight_decay;
  };
  const Case cases[] = {
      {"plain", SgdOptions{0.0f, 0.0f, false}, 0.0f},
      {"weight decay", SgdOptions{0.0f, 0.0f, false}, 0.05f},
      {"momentum", SgdOptions{0.9f, 0.0f, false}, 0.0f},
      {"momentum+dampening+decay", SgdOptions{0.8f, 0.3f, false}, 0.02f},
      {"nesterov", SgdOptions{0.9f, 0.0f, true}, 0.01f},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<float> w0 = {1.5f, -0.5f, 0.75f, 2.0f, -3.0f};
    Tensor w = Param(w0, {5});
    auto opt = MakeSgd({ParamGroup{{w}, 0.1f, c.weight_decay}}, c.opts);
    SgdRef ref{{w0.begin(), w0.end()}, std::vector<double>(5)};
    for (int t = 1; t <= 3; ++t) {
      SetGrad(w, t, 2);
      opt->Step();
      ref.Step(Grad(t, 5, 2), 0.1, c.opts.momentum, c.opts.dampening, c.weight_decay,
               c.opts.nesterov);
      ExpectNear(w.ToFloatVector(), ref.w, 1e-5, "step " + std::to_string(t));
    }
    EXPECT_EQ(opt->StateDict().count("0.0.momentum_buffer"), c.opts.momentum != 0 ? 1u : 0u);
  }
}

// ZeRO steps flat shards of a flat buffer: per element, the same update as the full tensors.
TEST_F(OptimizerTest, SteppingFlatShardsEqualsSteppingFullTensors) {
  std::vector<float> a0 = {0.5f, -1.0f, 2.0f, 0.25f, 1.0f, -2.0f}, b0 = {3, -1, 0.5f, 4};
  for (bool adam : {true, false}) {
    SCOPED_TRACE(adam ? "AdamW" : "SGD");
    auto make = [adam](std::vector<Tensor> params) {
      std::vector<ParamGroup> groups = {ParamGroup{std::move(params), 0.05f, 0.1f}};
      return adam ? MakeAdamW(std::move(groups)) : MakeSgd(std::move(groups), {0.9f, 0.0f, true});
    };
    Tensor a = Param(a0, {2, 3}), b = Param(b0, {4});
    auto full = make({a, b});

    std::vector<float> flat0 = a0;
    flat0.insert(flat0.end(), b0.begin(), b0.end());
    Tensor flat = Tensor::FromVector(flat0, {10});
    Tensor flat_grad = Tensor::Zeros({10});
    // Two "ranks", the boundary cutting through a: [0, 4) and [4, 10).
    Tensor s0 = flat.FlatRange(0, 4), s1 = flat.FlatRange(4, 6);
    s0.set_grad(flat_grad.FlatRange(0, 4));
    s1.set_grad(flat_grad.FlatRange(4, 6));
    auto shard0 = make({s0});
    auto shard1 = make({s1});
    for (int t = 1; t <= 3; ++t) {
      SetGrad(a, t, 3);
      SetGrad(b, t, 4);
      flat_grad.FlatRange(0, 6).CopyFrom(a.grad());
      flat_grad.FlatRange(6, 4).CopyFrom(b.grad());
      full->Step();
      shard0->Step();
      shard1->Step();
      std::vector<float> want = a.ToFloatVector(), bv = b.ToFloatVector();
      want.insert(want.end(), bv.begin(), bv.end());
      EXPECT_EQ(flat.ToFloatVector(), want) << "step " << t;
    }
  }
}

TEST_F(OptimizerTest, StateDictRoundTripContinuesIdentically) {
  std::vector<float> w0 = {1, -2, 3, 0.5f}, u0 = {0.1f, 0.2f};
  for (bool adam : {true, false}) {
    SCOPED_TRACE(adam ? "AdamW" : "SGD");
    auto make = [adam](Tensor w, Tensor u) {
      std::vector<ParamGroup> groups = {ParamGroup{{w}, 0.02f, 0.01f}, ParamGroup{{u}, 0.1f, 0.0f}};
      return adam ? MakeAdamW(std::move(groups)) : MakeSgd(std::move(groups), {0.9f, 0.1f, false});
    };
    Tensor w = Param(w0, {2, 2}, "layer.weight"), u = Param(u0, {2});  // u has no name
    auto a = make(w, u);
    for (int t = 1; t <= 2; ++t) {
      SetGrad(w, t, 5);
      SetGrad(u, t, 6);
      a->Step();
    }
    // A checkpoint: copies of the state and the parameters.
    std::map<std::string, Tensor> saved;
    for (auto& [k, v] : a->StateDict()) saved[k] = v.Clone();
    EXPECT_EQ(saved.count(adam ? "layer.weight.exp_avg" : "layer.weight.momentum_buffer"), 1u);
    EXPECT_EQ(saved.count(adam ? "1.0.exp_avg_sq" : "1.0.momentum_buffer"), 1u);
    Tensor w2 = Param(w.ToFloatVector(), {2, 2}, "layer.weight"),
           u2 = Param(u.ToFloatVector(), {2});
    auto b = make(w2, u2);
    ASSERT_TRUE(b->LoadStateDict(saved).ok());
    for (int t = 3; t <= 4; ++t) {
      SetGrad(w, t, 5);
      SetGrad(u, t, 6);
      SetGrad(w2, t, 5);
      SetGrad(u2, t, 6);
      a->Step();
      b->Step();
      EXPECT_EQ(w2.ToFloatVector(), w.ToFloatVector()) << "step " << t;
      EXPECT_EQ(u2.ToFloatVector(), u.ToFloatVector()) << "step " << t;
    }
    EXPECT_EQ(b->StateDict()["step"].ToVector<int64_t>(), std::vector<int64_t>{4});
  }
}

TEST_F(OptimizerTest, LoadStateDictNamesMissingUnexpectedAndMismatchedKeys) {
  Tensor w = Param({1, 2, 3}, {3}, "w");
  auto opt = MakeAdamW({ParamGroup{{w}, 0.1f, 0.0f}});
  SetGrad(w, 1, 0);
  opt->Step();
  std::map<std::string, Tensor> good = opt->StateDict();

  auto missing = good;
  missing.erase("w.exp_avg_sq");
  missing.erase("step");
  absl::Status s = opt->LoadStateDict(missing);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("missing keys"), HasSubstr("w.exp_avg_sq"), HasSubstr("step")));

  auto extra = good;
  extra["v.exp_avg"] = Tensor::Zeros({3});
  extra["w.exp_avg"] = Tensor::Zeros({4});
  s = opt->LoadStateDict(extra);
  EXPECT_THAT(std::string(s.message()), AllOf(HasSubstr("unexpected keys: v.exp_avg"),
                                              HasSubstr("w.exp_avg (parameter [3], given [4])")));
  // A failed load changes nothing.
  EXPECT_EQ(opt->StateDict()["w.exp_avg"].ToFloatVector(), good["w.exp_avg"].ToFloatVector());
}

TEST_F(OptimizerTest, DuplicateNamesFallBackToGroupIndexKeys) {
  Tensor p = Param({1}, {1}, "weight"), q = Param({2}, {1}, "weight");
  auto opt = MakeSgd({ParamGroup{{p}, 0.1f}, ParamGroup{{q}, 0.1f}}, {0.5f});
  SetGrad(p, 1, 0);
  SetGrad(q, 1, 0);
  opt->Step();
  auto state = opt->StateDict();
  EXPECT_EQ(state.count("0.0.momentum_buffer"), 1u);
  EXPECT_EQ(state.count("1.0.momentum_buffer"), 1u);
}

// A schedule's betas (OneCycle's momentum) replace the options' from the step they are set,
// bias correction included, as PyTorch's Adam reads param_group['betas'] at each step.
TEST_F(OptimizerTest, SetBetasChangesAdamsBetasStepByStep) {
  Tensor w = Param({0.5f, -1.0f, 2.0f}, {3});
  auto opt = MakeAdamW({ParamGroup{{w}, 0.01f, 0.1f}}, AdamWOptions{0.9f, 0.999f, 1e-8f});
  AdamWRef ref{{0.5, -1.0, 2.0}, {0, 0, 0}, {0, 0, 0}};
  const float beta1[] = {0.85f, 0.8f, 0.875f};
  for (int t = 1; t <= 3; ++t) {
    SetGrad(w, t, 0);
    opt->SetBetas(beta1[t - 1], 0.99f);
    opt->Step();
    ref.Step(Grad(t, 3, 0), 0.01, 0.1, t, beta1[t - 1], 0.99);
    ExpectNear(w.ToFloatVector(), ref.w, 1e-6, "step " + std::to_string(t));
  }
}

TEST_F(OptimizerTest, ZeroGradAndSetLearningRate) {
  Tensor p = Param({1, 2}, {2}), q = Param({3}, {1});
  auto opt = MakeSgd({ParamGroup{{p}, 0.1f}, ParamGroup{{q}, 0.2f}});
  SetGrad(p, 1, 0);
  SetGrad(q, 1, 0);
  opt->ZeroGrad();
  EXPECT_FALSE(p.grad().defined());
  EXPECT_FALSE(q.grad().defined());
  opt->Step();  // no gradients: nothing moves
  EXPECT_EQ(p.ToFloatVector(), (std::vector<float>{1, 2}));
  opt->SetLearningRate(0.5f);
  for (const ParamGroup& g : opt->param_groups()) EXPECT_EQ(g.lr, 0.5f);
  q.set_grad(Tensor::FromVector(std::vector<float>{2.0f}, {1}));
  opt->Step();
  EXPECT_FLOAT_EQ(q.item(), 3.0f - 0.5f * 2.0f);
}

TEST(LrScheduleTest, ConstantAndWarmupCosineAtKeySteps) {
  auto c = ConstantLr(3e-4f);
  EXPECT_EQ(c->At(0), 3e-4f);
  EXPECT_EQ(c->At(123456), 3e-4f);

  const double max = 1e-3, min = 1e-4;
  auto s = WarmupCosineLr(float(max), float(min), 10, 110);
  EXPECT_FLOAT_EQ(s->At(0), 0.0f);
  EXPECT_FLOAT_EQ(s->At(5), float(max / 2));           // halfway up the ramp
  EXPECT_FLOAT_EQ(s->At(10), float(max));              // top of the ramp, start of the decay
  EXPECT_FLOAT_EQ(s->At(60), float((max + min) / 2));  // cosine at a quarter turn
  EXPECT_FLOAT_EQ(s->At(35), float(min + (max - min) * (1 + std::sqrt(0.5)) / 2));  // pi/4
  EXPECT_FLOAT_EQ(s->At(110), float(min));
  EXPECT_FLOAT_EQ(s->At(1000), float(min));
  for (int64_t t = 11; t < 110; ++t) EXPECT_LT(s->At(t), s->At(t - 1)) << "step " << t;

  auto no_warmup = WarmupCosineLr(float(max), 0.0f, 0, 4);
  EXPECT_FLOAT_EQ(no_warmup->At(0), float(max));
  EXPECT_FLOAT_EQ(no_warmup->At(2), float(max / 2));
}

}  // namespace
}  // namespace braid
