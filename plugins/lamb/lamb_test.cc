// Lamb (plugins/lamb) against DeepSpeed's FusedLamb rule evaluated independently: in double by
// this file (LambTest), and by a PyTorch reference written beside it, lamb_torch_reference.py
// (LambTorchTest, in target lamb_test_torch). The real plugin .so is loaded by its config name,
// into a program linked like the trainer.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/config/sections.pb.h"
#include "core/optimizer.h"
#include "core/plugin.h"
#include "core/registry.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "third_party/runfiles.h"

namespace braid {
namespace {

using ::bazel::tools::cpp::runfiles::Runfiles;
using ::testing::HasSubstr;

std::string PluginsDir() {
  std::string error;
  std::unique_ptr<Runfiles> rf(Runfiles::CreateForTest(&error));
  EXPECT_NE(rf, nullptr) << error;
  std::string so = rf->Rlocation("braid/plugins/lamb/libbraid_lamb.so");
  return so.substr(0, so.rfind("/lamb/"));
}

// One tensor of a case: initial values, its group's weight decay and a gradient per step.
struct TensorCase {
  std::vector<float> w0;
  float weight_decay = 0;
  std::vector<std::vector<float>> grads;  // [step][element]
};

struct Case {
  std::string what;
  double lr = 1e-2;
  std::vector<double> betas = {0.9, 0.999};
  double eps = 1e-8;
  bool bias_correction = true, eps_inside_sqrt = false;
  double max_coeff = 10, min_coeff = 0.01;
  std::vector<TensorCase> tensors;
};

std::vector<float> Random(std::mt19937& rng, int n, float scale) {
  std::normal_distribution<float> d(0, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

// Gradients for `steps` steps, from `rng`.
TensorCase MakeTensorCase(std::mt19937& rng, std::vector<float> w0, float wd, int steps, float gscale) {
  TensorCase t;
  t.w0 = std::move(w0);
  t.weight_decay = wd;
  for (int s = 0; s < steps; ++s) t.grads.push_back(Random(rng, int(t.w0.size()), gscale));
  return t;
}

// The cases: every branch of the rule. Unclamped ratios (weights ~0.5, updates ~1), the ceiling
// (large weights, max_coeff 2), the floor (tiny weights, min_coeff 0.5), a zero tensor (ratio
// 1), weight decay on one group only, no bias correction, eps inside the square root.
std::vector<Case> Cases() {
  std::mt19937 rng(26);
  std::vector<Case> cases;
  Case plain;
  plain.what = "DeepSpeed's defaults, a decayed matrix and an undecayed bias";
  plain.tensors = {MakeTensorCase(rng, Random(rng, 20, 0.5f), 0.01f, 6, 1.0f),
                   MakeTensorCase(rng, Random(rng, 5, 0.5f), 0.0f, 6, 1.0f)};
  cases.push_back(plain);
  Case clamps;
  clamps.what = "the trust ratio clamped at both ends, and a zero tensor";
  clamps.max_coeff = 2;
  clamps.min_coeff = 0.5;
  clamps.tensors = {MakeTensorCase(rng, Random(rng, 12, 50.0f), 0.0f, 5, 1.0f),
                    MakeTensorCase(rng, Random(rng, 12, 1e-3f), 0.0f, 5, 1.0f),
                    MakeTensorCase(rng, std::vector<float>(7, 0.0f), 0.0f, 5, 1.0f)};
  cases.push_back(clamps);
  Case variants;
  variants.what = "no bias correction, eps inside the square root, other betas";
  variants.lr = 3e-3;
  variants.betas = {0.8, 0.99};
  variants.eps = 1e-3;
  variants.bias_correction = false;
  variants.eps_inside_sqrt = true;
  variants.tensors = {MakeTensorCase(rng, Random(rng, 16, 0.3f), 0.1f, 6, 0.01f)};
  cases.push_back(variants);
  return cases;
}

// The rule, in double, from lamb.h's formulas. Returns the weights after each step
// ([step][tensor][element]) and the unclamped ratio ||w|| / ||u|| of each ([step][tensor]).
void Reference(const Case& c, std::vector<std::vector<std::vector<double>>>* weights,
               std::vector<std::vector<double>>* ratios) {
  const size_t k = c.tensors.size();
  std::vector<std::vector<double>> w(k), m(k), v(k);
  for (size_t t = 0; t < k; ++t) {
    w[t].assign(c.tensors[t].w0.begin(), c.tensors[t].w0.end());
    m[t].assign(w[t].size(), 0.0);
    v[t].assign(w[t].size(), 0.0);
  }
  const size_t steps = c.tensors[0].grads.size();
  for (size_t s = 0; s < steps; ++s) {
    const double step = double(s + 1);
    const double b1 = c.betas[0], b2 = c.betas[1];
    const double step_size =
        c.bias_correction ? c.lr * std::sqrt(1 - std::pow(b2, step)) / (1 - std::pow(b1, step)) : c.lr;
    ratios->emplace_back();
    for (size_t t = 0; t < k; ++t) {
      const std::vector<float>& g = c.tensors[t].grads[s];
      std::vector<double> u(w[t].size());
      double w2 = 0, u2 = 0;
      for (size_t j = 0; j < u.size(); ++j) {
        m[t][j] = b1 * m[t][j] + (1 - b1) * g[j];
        v[t][j] = b2 * v[t][j] + (1 - b2) * double(g[j]) * g[j];
        const double denom = c.eps_inside_sqrt ? std::sqrt(v[t][j] + c.eps) : std::sqrt(v[t][j]) + c.eps;
        u[j] = m[t][j] / denom + c.tensors[t].weight_decay * w[t][j];
        w2 += w[t][j] * w[t][j];
        u2 += u[j] * u[j];
      }
      double ratio = 1;
      if (w2 > 0 && u2 > 0) ratio = std::sqrt(w2) / std::sqrt(u2);
      ratios->back().push_back(w2 > 0 && u2 > 0 ? ratio : -1);
      const double clamped = ratio < 0 ? 1 : std::min(c.max_coeff, std::max(c.min_coeff, ratio));
      for (size_t j = 0; j < u.size(); ++j) w[t][j] -= step_size * (w2 > 0 && u2 > 0 ? clamped : 1.0) * u[j];
    }
    weights->push_back(w);
  }
}

class LambTest : public ::testing::Test {
 public:
  // Loaded by its config name, as the training program does: "LAMB" finds plugin "lamb".
  static void SetUpTestSuite() {
    absl::Status st = EnsureOptimizer("LAMB", {PluginsDir()});
    ASSERT_TRUE(st.ok()) << st;
  }

  static std::vector<std::string> Validate(config::OptimizerConfig* section) {
    absl::StatusOr<OptimizerSpec> spec = Registry::Get().GetOptimizer(section->type());
    EXPECT_TRUE(spec.ok()) << spec.status();
    std::vector<std::string> problems;
    if (spec.ok() && spec->validate) spec->validate(section, &problems);
    return problems;
  }

  // The case's tensors, one group each (so each has its own weight decay), and the optimizer.
  static std::unique_ptr<Optimizer> Make(const Case& c, std::vector<braid::Tensor>* params) {
    config::OptimizerConfig section;
    section.set_type("Lamb");
    config::OptimizerParams* p = section.mutable_params();
    p->set_lr(c.lr);
    p->add_betas(c.betas[0]);
    p->add_betas(c.betas[1]);
    p->set_eps(c.eps);
    p->set_bias_correction(c.bias_correction);
    p->set_eps_inside_sqrt(c.eps_inside_sqrt);
    p->set_max_coeff(c.max_coeff);
    p->set_min_coeff(c.min_coeff);
    std::vector<std::string> problems = Validate(&section);
    EXPECT_TRUE(problems.empty()) << absl::StrJoin(problems, "; ");
    std::vector<ParamGroup> groups;
    params->clear();
    for (const TensorCase& t : c.tensors) {
      braid::Tensor w = braid::Tensor::FromVector(t.w0, {int64_t(t.w0.size())});
      params->push_back(w);
      ParamGroup g;
      g.params = {w};
      g.lr = float(c.lr);
      g.weight_decay = t.weight_decay;
      groups.push_back(g);
    }
    auto made = Registry::Get().MakeOptimizer("Lamb", std::move(groups), section);
    EXPECT_TRUE(made.ok()) << made.status();
    return made.ok() ? std::move(*made) : nullptr;
  }

  // Runs the case through the plugin: the weights after each step, [step][tensor][element].
  static std::vector<std::vector<std::vector<float>>> RunPlugin(const Case& c) {
    std::vector<braid::Tensor> params;
    std::unique_ptr<Optimizer> opt = Make(c, &params);
    std::vector<std::vector<std::vector<float>>> out;
    if (opt == nullptr) return out;
    for (size_t s = 0; s < c.tensors[0].grads.size(); ++s) {
      for (size_t t = 0; t < params.size(); ++t) {
        params[t].set_grad(braid::Tensor::FromVector(c.tensors[t].grads[s], params[t].shape()));
      }
      opt->Step();
      out.emplace_back();
      for (braid::Tensor& p : params) out.back().push_back(p.ToVector<float>());
    }
    return out;
  }

  // |got - want| <= tol (1 + |want|) everywhere; the comparison fails on NaN.
  static void ExpectClose(const std::vector<std::vector<std::vector<float>>>& got,
                          const std::vector<std::vector<std::vector<double>>>& want, double tol,
                          const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t s = 0; s < want.size(); ++s) {
      ASSERT_EQ(got[s].size(), want[s].size());
      for (size_t t = 0; t < want[s].size(); ++t) {
        ASSERT_EQ(got[s][t].size(), want[s][t].size());
        for (size_t j = 0; j < want[s][t].size(); ++j) {
          const double d = std::fabs(double(got[s][t][j]) - want[s][t][j]);
          ASSERT_TRUE(d <= tol * (1 + std::fabs(want[s][t][j])))
              << what << ": step " << s + 1 << ", tensor " << t << ", element " << j << ": Lamb "
              << got[s][t][j] << ", reference " << want[s][t][j];
        }
      }
    }
  }
};

TEST_F(LambTest, RegisteredWithDeepSpeedsDefaultsAndChecks) {
  config::OptimizerConfig section;
  section.set_type("Lamb");
  ASSERT_THAT(Validate(&section), ::testing::IsEmpty());
  const config::OptimizerParams& p = section.params();
  EXPECT_THAT(p.betas(), ::testing::ElementsAre(0.9, ::testing::DoubleEq(0.999)));
  EXPECT_DOUBLE_EQ(p.eps(), 1e-8);
  EXPECT_EQ(p.weight_decay(), 0.0);
  EXPECT_DOUBLE_EQ(p.max_coeff(), 10.0);
  EXPECT_DOUBLE_EQ(p.min_coeff(), 0.01);
  EXPECT_TRUE(p.bias_correction());
  EXPECT_FALSE(p.eps_inside_sqrt());
  // Every problem at once, each naming its field.
  config::OptimizerConfig bad;
  bad.set_type("Lamb");
  config::OptimizerParams* b = bad.mutable_params();
  for (double beta : {0.9, 0.99, 0.999}) b->add_betas(beta);
  b->set_max_coeff(0.1);
  b->set_min_coeff(0.2);
  b->set_max_grad_norm(1.0);
  b->set_amsgrad(true);
  b->set_eps(0);
  std::string all = absl::StrJoin(Validate(&bad), "\n");
  EXPECT_THAT(all, HasSubstr("optimizer.params.betas has 3 value(s)"));
  EXPECT_THAT(all, HasSubstr("optimizer.params.eps (0) must be a finite number > 0"));
  EXPECT_THAT(all, HasSubstr("optimizer.params.min_coeff (0.2) > optimizer.params.max_coeff (0.1)"));
  EXPECT_THAT(all, HasSubstr("set gradient_clipping instead"));
  EXPECT_THAT(all, HasSubstr("optimizer.params.amsgrad true: Lamb has no AMSGrad variant"));
}

// Relative 1e-5: the plugin computes in f32 (norms summed in double) what the reference computes
// in double, over 5-6 steps; measured below 1e-6. A missing bias correction, clamp or weight
// decay moves weights by a share of lr (1e-2 .. 3e-3) per step.
TEST_F(LambTest, MatchesTheRuleEvaluatedInDouble) {
  for (const Case& c : Cases()) {
    std::vector<std::vector<std::vector<double>>> want;
    std::vector<std::vector<double>> ratios;
    Reference(c, &want, &ratios);
    ExpectClose(RunPlugin(c), want, 1e-5, c.what);
    if (c.max_coeff == 2) {  // the case is what it says: each clamp taken at every step
      for (const std::vector<double>& r : ratios) {
        EXPECT_GT(r[0], c.max_coeff);
        EXPECT_GE(r[1], 0);
        EXPECT_LT(r[1], c.min_coeff);
      }
      EXPECT_EQ(ratios[0][2], -1) << "the zero tensor: no ratio (1) at the first step";
    }
  }
}

// Checkpointed with the run: the state dict (and ParameterStates, what sharded checkpoints
// write) carries both moments and the step, so 3 steps, a save, a load into a fresh optimizer
// and 3 more steps give bit for bit what 6 uninterrupted steps give.
TEST_F(LambTest, StateRoundTripsAndResumesBitForBit) {
  const Case c = Cases()[0];
  std::vector<braid::Tensor> straight_params, first_params, resumed_params;
  std::unique_ptr<Optimizer> straight = Make(c, &straight_params);
  std::unique_ptr<Optimizer> first = Make(c, &first_params);
  auto step = [&](Optimizer& o, std::vector<braid::Tensor>& params, size_t s) {
    for (size_t t = 0; t < params.size(); ++t) {
      params[t].set_grad(braid::Tensor::FromVector(c.tensors[t].grads[s], params[t].shape()));
    }
    o.Step();
  };
  for (size_t s = 0; s < 3; ++s) {
    step(*straight, straight_params, s);
    step(*first, first_params, s);
  }
  std::map<std::string, braid::Tensor> saved = first->StateDict();
  EXPECT_EQ(saved.size(), 1 + 2 * c.tensors.size());  // step + exp_avg, exp_avg_sq each
  std::unique_ptr<Optimizer> resumed = Make(c, &resumed_params);
  for (size_t t = 0; t < resumed_params.size(); ++t) resumed_params[t].CopyFrom(first_params[t]);
  ASSERT_TRUE(resumed->LoadStateDict(saved).ok());
  EXPECT_EQ(resumed->steps_taken(), 3);
  std::vector<std::map<std::string, braid::Tensor>> slots = resumed->ParameterStates(false);
  ASSERT_EQ(slots.size(), c.tensors.size());
  EXPECT_EQ(slots[0].count("exp_avg") + slots[0].count("exp_avg_sq"), 2u);
  for (size_t s = 3; s < 6; ++s) {
    step(*straight, straight_params, s);
    step(*resumed, resumed_params, s);
  }
  for (size_t t = 0; t < straight_params.size(); ++t) {
    EXPECT_EQ(resumed_params[t].ToVector<float>(), straight_params[t].ToVector<float>()) << t;
  }
  // A broken dict is refused, naming the key.
  saved.erase(saved.begin()->first == "step" ? std::next(saved.begin())->first : saved.begin()->first);
  absl::Status st = Make(c, &resumed_params)->LoadStateDict(saved);
  EXPECT_THAT(std::string(st.message()), HasSubstr("has one moment of two"));
}

// The PyTorch reference (lamb_torch_reference.py: DeepSpeed's FusedLamb rule written with torch
// ops in float64) on the same cases; the same bound as the double reference above.
TEST_F(LambTest, LambTorchMatchesAPyTorchReference) {
  std::string error;
  std::unique_ptr<Runfiles> rf(Runfiles::CreateForTest(&error));
  ASSERT_NE(rf, nullptr) << error;
  const std::string script = rf->Rlocation("braid/plugins/lamb/lamb_torch_reference.py");
  const std::string dir = std::getenv("TEST_TMPDIR") != nullptr ? std::getenv("TEST_TMPDIR") : "/tmp";
  nlohmann::json in = nlohmann::json::array();
  std::vector<Case> cases = Cases();
  for (const Case& c : cases) {
    nlohmann::json j;
    j["lr"] = c.lr;
    j["betas"] = c.betas;
    j["eps"] = c.eps;
    j["bias_correction"] = c.bias_correction;
    j["eps_inside_sqrt"] = c.eps_inside_sqrt;
    j["max_coeff"] = c.max_coeff;
    j["min_coeff"] = c.min_coeff;
    for (const TensorCase& t : c.tensors) {
      j["tensors"].push_back({{"w0", t.w0}, {"weight_decay", t.weight_decay}, {"grads", t.grads}});
    }
    in.push_back(j);
  }
  const std::string in_path = dir + "/lamb_in.json", out_path = dir + "/lamb_out.json";
  std::ofstream(in_path) << in.dump();
  const std::string cmd = absl::StrCat("/usr/bin/python3 '", script, "' '", in_path, "' '", out_path, "'");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream out_file(out_path);
  nlohmann::json out = nlohmann::json::parse(out_file);
  ASSERT_EQ(out.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    auto want = out[i].get<std::vector<std::vector<std::vector<double>>>>();
    ExpectClose(RunPlugin(cases[i]), want, 1e-5, cases[i].what + " (PyTorch)");
  }
}

}  // namespace
}  // namespace braid
