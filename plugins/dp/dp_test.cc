// Loads libbraid_dp.so the way the trainer does and checks the single-process data-parallel
// strategy against training on one device: both loss modes, 2 and 3 devices (cpu:N devices,
// each with its own allocator), gradient accumulation, clipping, uneven and idle shards, and
// replica consistency. The first device's peak memory in each mode and the errors a user can meet
// are checked in dp_memory_and_errors_test.cc; the helpers both use are in test_util.h.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/module.h"
#include "core/optimizer.h"
#include "core/strategy.h"
#include "core/tensor.h"
#include "core/testing/compare.h"
#include "gtest/gtest.h"
#include "plugins/dp/test_util.h"

namespace braid::dp_test {
namespace {

// ---- Data -----------------------------------------------------------------------------------

// Micro-batch m of k equal parts of `full` (views of its rows).
std::vector<Batch> Split(const Batch& full, int k) {
  const int64_t rows = full.inputs.size(0) / k;
  std::vector<Batch> parts;
  for (int m = 0; m < k; ++m) {
    parts.push_back(Batch{full.inputs.Slice(m * rows, (m + 1) * rows),
                          full.targets.Slice(m * rows, (m + 1) * rows)});
  }
  return parts;
}

// ---- Comparisons ----------------------------------------------------------------------------

// The worst deviation seen over several comparisons, and where. A NaN deviation counts as +inf:
// compared as it is, it would fail `>=` and be dropped.
struct Deviation {
  double worst = 0;
  std::string where;
  void Add(const std::pair<double, std::string>& d, const std::string& when) {
    const double v = std::isnan(d.first) ? INFINITY : d.first;
    if (v >= worst) {
      worst = v;
      where = d.second + " at " + when;
    }
  }
};

// max |got - want| / max |want| over each parameter's gradient (a scale-free rounding measure);
// +inf on a NaN or inf in either.
std::pair<double, std::string> CompareGrads(const Module& got, const Module& want) {
  Module::NamedTensors g = got.NamedParameters(), w = want.NamedParameters();
  BRAID_CHECK(g.size() == w.size());
  std::pair<double, std::string> worst{0, ""};
  for (size_t j = 0; j < g.size(); ++j) {
    BRAID_CHECK(g[j].first == w[j].first);
    BRAID_CHECK(g[j].second.grad().defined() && w[j].second.grad().defined()) << g[j].first;
    std::vector<float> a = g[j].second.grad().ToFloatVector();
    std::vector<float> b = w[j].second.grad().ToFloatVector();
    const double d = testing::MaxRelDiff(a, b, /*floor=*/0);  // absolute where b is all zeros
    if (d >= worst.first) worst = {d, "grad of " + g[j].first};
  }
  return worst;
}

// max over elements of |got - want| beyond rtol * |want|, over every tensor of the state; +inf
// on a NaN or inf in either (a NaN excess would fail `>` and be skipped).
std::pair<double, std::string> CompareValues(const Module& got, const Module& want, float rtol) {
  std::map<std::string, Tensor> g = got.StateDict();
  std::pair<double, std::string> worst{0, ""};
  for (const auto& [name, w] : want.StateDict()) {
    BRAID_CHECK(g.count(name)) << name;
    std::vector<float> a = g.at(name).ToFloatVector(), b = w.ToFloatVector();
    BRAID_CHECK(a.size() == b.size()) << name;
    for (size_t i = 0; i < a.size(); ++i) {
      const double d = std::isfinite(a[i]) && std::isfinite(b[i])
                           ? std::fabs(a[i] - b[i]) - rtol * std::fabs(b[i])
                           : INFINITY;
      if (d > worst.first) {
        worst = {d, name + "[" + std::to_string(i) + "] " + std::to_string(a[i]) + " vs " +
                        std::to_string(b[i])};
      }
    }
  }
  return worst;
}

void ExpectClose(const Module& got, const Module& want, double atol, float rtol,
                 const std::string& where) {
  std::pair<double, std::string> d = CompareValues(got, want, rtol);
  EXPECT_LE(d.first, atol) << where << ": " << d.second;
}

void CopyValues(const Module& from, Module* to) {
  absl::Status s = to->LoadStateDict(from.StateDict());
  BRAID_CHECK(s.ok()) << s;
}

// The comparisons above, which the tests below hold to tolerances, fail on a NaN or inf planted
// in either model's values or gradients, and a NaN deviation is the worst one.
TEST(DpComparisons, NanOrInfIsTheWorstDeviation) {
  for (float v : {NAN, INFINITY}) {
    std::unique_ptr<Module> good = MakeModel(Kind::kMlp, Device::CPU(0), 1);
    std::unique_ptr<Module> bad = MakeModel(Kind::kMlp, Device::CPU(0), 1);
    for (Module* m : {good.get(), bad.get()}) {
      CrossEntropyLoss(*m, MakeBatch(Kind::kMlp, 0, 4)).Backward();
    }
    EXPECT_EQ(CompareValues(*good, *bad, 1e-3f).first, 0.0);
    EXPECT_EQ(CompareGrads(*good, *bad).first, 0.0);
    Tensor p = bad->Parameters()[0];
    p.data<float>()[1] = v;
    p.grad().data<float>()[1] = v;
    EXPECT_EQ(CompareValues(*bad, *good, 1e-3f).first, INFINITY) << v << " in got";
    EXPECT_EQ(CompareValues(*good, *bad, 1e-3f).first, INFINITY) << v << " in want";
    EXPECT_EQ(CompareGrads(*bad, *good).first, INFINITY) << v << " in got";
    EXPECT_EQ(CompareGrads(*good, *bad).first, INFINITY) << v << " in want";
  }
  Deviation d;
  d.Add({1.0, "one"}, "step 0");
  d.Add({NAN, "nan"}, "step 1");
  d.Add({2.0, "two"}, "step 2");
  EXPECT_EQ(d.worst, INFINITY);
  EXPECT_EQ(d.where, "nan at step 1");
}

// ---- Equivalence with single-device training ------------------------------------------------

struct Case {
  Kind kind;
  const char* mode;
  int devices;
  int accumulation;
  int64_t rows;  // per micro-batch: uneven shards on purpose
};

class DpEquivalenceTest : public DpTest, public ::testing::WithParamInterface<Case> {};

TEST_P(DpEquivalenceTest, FiveAdamWStepsEqualSingleDeviceTraining) {
  const Case c = GetParam();
  std::unique_ptr<Strategy> dp = MakeDp();
  EXPECT_EQ(dp->name(), "dp");
  std::unique_ptr<Module> model = MakeModel(c.kind, Device::CPU(0), 1);
  Made made;
  ASSERT_TRUE(dp->Setup(*model, AdamW, Context(c.devices, c.mode, Factory(c.kind, &made))).ok());
  ASSERT_EQ(made.modules.size(), size_t(c.devices - 1));
  for (int i = 1; i < c.devices; ++i) EXPECT_EQ(made.devices[size_t(i - 1)], Device::CPU(i));
  for (int i = 1; i < c.devices; ++i) {
    // Built from another seed, so equal only because Setup copied the master in.
    ExpectIdentical(*made.modules[size_t(i - 1)], *model, "replica " + std::to_string(i));
    for (const Tensor& p : made.modules[size_t(i - 1)]->Parameters()) {
      EXPECT_EQ(p.device(), Device::CPU(i));
    }
  }

  // The reference trajectory: the same initial values and optimizer, each step's whole batch on
  // one device. The probe checks each step's gradient on its own: it takes the strategy's
  // parameters before the step and computes the whole batch's gradient, which the gradient the
  // strategy reduced onto the master must equal.
  std::unique_ptr<Module> reference = MakeModel(c.kind, Device::CPU(0), 1);
  std::unique_ptr<Optimizer> reference_opt = AdamW(reference->NamedParameters());
  std::unique_ptr<Module> probe = MakeModel(c.kind, Device::CPU(0), 1);
  std::map<std::string, std::vector<float>> initial;  // copies: StateDict hands out the tensors
  for (const auto& [name, t] : model->StateDict()) {
    if (t.dtype() == DType::kF32 && name.find("weight") != std::string::npos) {
      initial[name] = t.ToFloatVector();
    }
  }

  Deviation grads, params, norm;
  for (int step = 0; step < 5; ++step) {
    Batch full = MakeBatch(c.kind, step, c.rows * c.accumulation);
    CopyValues(*model, probe.get());
    probe->ZeroGrad();
    Tensor probe_loss = CrossEntropyLoss(*probe, full);
    probe_loss.Backward();
    const float probe_norm = ClipGradNorm(probe->Parameters(), 0.0f);  // measures only

    absl::StatusOr<StepStats> stats = dp->TrainStep(Split(full, c.accumulation), CrossEntropyLoss);
    ASSERT_TRUE(stats.ok()) << stats.status();

    reference_opt->ZeroGrad();
    CrossEntropyLoss(*reference, full).Backward();
    reference_opt->Step();

    const std::string where = "step " + std::to_string(step);
    ASSERT_TRUE(std::isfinite(probe_loss.item())) << where;  // a scaled tolerance needs a finite reference
    EXPECT_NEAR(stats->loss, probe_loss.item(), 1e-5 * std::fabs(probe_loss.item())) << where;
    // Clipping is off, yet the reduced gradient's norm is reported.
    ASSERT_GT(probe_norm, 0.0f);
    norm.Add({std::fabs(stats->grad_norm - probe_norm) / probe_norm, "grad_norm"}, where);
    EXPECT_GE(stats->forward_s, 0.0);
    EXPECT_GE(stats->backward_s, 0.0);
    // f32 rounding of sums taken in another order: ~1e-7 of a tensor's largest gradient.
    grads.Add(CompareGrads(*model, *probe), where);
    // AdamW divides each gradient by its own running magnitude, which turns the rounding of the
    // smallest gradients into visible parameter differences (see AdamW above): looser.
    params.Add(CompareValues(*model, *reference, 2e-4f), where);
    for (int i = 1; i < c.devices; ++i) {
      ExpectIdentical(*made.modules[size_t(i - 1)], *model,
                      "replica " + std::to_string(i) + " after " + where);
    }
  }
  std::printf("[dp vs one device] %s: worst gradient deviation %.3g of the tensor's largest "
              "(%s), worst parameter deviation %.3g (%s)\n",
              ::testing::UnitTest::GetInstance()->current_test_info()->name(), grads.worst,
              grads.where.c_str(), params.worst, params.where.c_str());
  std::printf("[dp vs one device] worst relative grad_norm deviation %.3g (%s)\n", norm.worst,
              norm.where.c_str());
  EXPECT_LE(grads.worst, 5e-6) << grads.where;
  EXPECT_LE(params.worst, 3e-5) << params.where;
  // The probe's norm is of the same gradient summed in one pass: measured up to 1.03e-7.
  EXPECT_LE(norm.worst, 5e-7) << norm.where;

  // Training moved the parameters, so the comparisons above were not between untouched models.
  std::map<std::string, Tensor> now = model->StateDict();
  for (const auto& [name, values] : initial) {
    EXPECT_NE(now.at(name).ToFloatVector(), values) << name;
  }
  absl::StatusOr<std::map<std::string, Tensor>> full = dp->FullStateDict();
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(full->size(), now.size());
}

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return std::string(c.kind == Kind::kMlp ? "Mlp" : "Gpt") + "_" + c.mode + "_" +
         std::to_string(c.devices) + "dev_accum" + std::to_string(c.accumulation);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, DpEquivalenceTest,
    ::testing::Values(Case{Kind::kMlp, "balanced", 2, 1, 7}, Case{Kind::kMlp, "gather", 2, 1, 7},
                      Case{Kind::kMlp, "balanced", 3, 1, 8}, Case{Kind::kMlp, "gather", 3, 1, 8},
                      Case{Kind::kMlp, "balanced", 2, 3, 5}, Case{Kind::kMlp, "gather", 2, 3, 5},
                      Case{Kind::kMlp, "balanced", 3, 2, 7}, Case{Kind::kMlp, "gather", 3, 2, 7},
                      Case{Kind::kGpt, "balanced", 2, 1, 5}, Case{Kind::kGpt, "gather", 2, 1, 5},
                      Case{Kind::kGpt, "balanced", 3, 1, 4}, Case{Kind::kGpt, "gather", 3, 1, 4},
                      Case{Kind::kGpt, "balanced", 2, 2, 3}, Case{Kind::kGpt, "gather", 2, 2, 3},
                      Case{Kind::kGpt, "balanced", 3, 2, 4}, Case{Kind::kGpt, "gather", 3, 2, 4}),
    CaseName);

TEST_F(DpTest, MicroBatchSmallerThanTheDeviceCountLeavesDevicesIdle) {
  for (const char* mode : {"balanced", "gather"}) {
    std::unique_ptr<Strategy> dp = MakeDp();
    std::unique_ptr<Module> model = MakeModel(Kind::kMlp, Device::CPU(0), 1);
    Made made;
    ASSERT_TRUE(dp->Setup(*model, AdamW, Context(3, mode, Factory(Kind::kMlp, &made))).ok());
    std::unique_ptr<Module> reference = MakeModel(Kind::kMlp, Device::CPU(0), 1);
    std::unique_ptr<Optimizer> reference_opt = AdamW(reference->NamedParameters());
    for (int step = 0; step < 3; ++step) {
      Batch batch = MakeBatch(Kind::kMlp, step, 2);  // cpu:2 gets no rows
      ASSERT_TRUE(dp->TrainStep({batch}, CrossEntropyLoss).ok());
      reference_opt->ZeroGrad();
      CrossEntropyLoss(*reference, batch).Backward();
      reference_opt->Step();
      ExpectClose(*model, *reference, 2e-6f, 2e-4f, std::string(mode) + " step " +
                                                        std::to_string(step));
      ExpectIdentical(*made.modules[1], *model, std::string(mode) + " idle replica");
    }
  }
}

TEST_F(DpTest, EachDeviceRunsForwardAndBackwardOnItsOwnThread) {
  for (const char* mode : {"balanced", "gather"}) {
    std::unique_ptr<Strategy> dp = MakeDp();
    std::unique_ptr<Module> model = MakeModel(Kind::kMlp, Device::CPU(0), 1);
    Made made;
    ASSERT_TRUE(dp->Setup(*model, AdamW, Context(3, mode, Factory(Kind::kMlp, &made))).ok());
    std::vector<Module*> replicas = {model.get(), made.modules[0], made.modules[1]};
    std::mutex mu;
    std::vector<std::thread::id> forward(3), backward(3);
    for (size_t i = 0; i < 3; ++i) {
      replicas[i]->AddForwardPreHook([&, i](Module&) {
        std::lock_guard<std::mutex> lock(mu);
        forward[i] = std::this_thread::get_id();
      });
      replicas[i]->AddBackwardHook([&, i](Module&) {
        std::lock_guard<std::mutex> lock(mu);
        backward[i] = std::this_thread::get_id();
      });
    }
    ASSERT_TRUE(dp->TrainStep({MakeBatch(Kind::kMlp, 0, 6)}, CrossEntropyLoss).ok());
    EXPECT_EQ(forward[0], std::this_thread::get_id()) << mode;
    EXPECT_EQ(backward[0], std::this_thread::get_id()) << mode;
    for (size_t i = 1; i < 3; ++i) {
      EXPECT_NE(forward[i], std::thread::id()) << mode << " replica " << i << " never ran";
      EXPECT_NE(backward[i], std::thread::id()) << mode << " replica " << i;
      for (size_t k = 0; k < i; ++k) {
        EXPECT_NE(forward[i], forward[k]) << mode << ": replicas " << k << " and " << i;
        EXPECT_NE(backward[i], backward[k]) << mode << ": replicas " << k << " and " << i;
      }
    }
  }
}

TEST_F(DpTest, ClipsTheReducedGradient) {
  std::unique_ptr<Strategy> dp = MakeDp();
  std::unique_ptr<Module> model = MakeModel(Kind::kMlp, Device::CPU(0), 1);
  Made made;
  StrategyContext ctx = Context(3, "balanced", Factory(Kind::kMlp, &made));
  ctx.max_grad_norm = 0.05f;
  ASSERT_TRUE(dp->Setup(*model, AdamW, ctx).ok());
  std::unique_ptr<Module> reference = MakeModel(Kind::kMlp, Device::CPU(0), 1);
  std::unique_ptr<Optimizer> reference_opt = AdamW(reference->NamedParameters());
  for (int step = 0; step < 3; ++step) {
    Batch batch = MakeBatch(Kind::kMlp, step, 9);
    absl::StatusOr<StepStats> stats = dp->TrainStep({batch}, CrossEntropyLoss);
    ASSERT_TRUE(stats.ok()) << stats.status();
    reference_opt->ZeroGrad();
    CrossEntropyLoss(*reference, batch).Backward();
    float norm = ClipGradNorm(reference->Parameters(), 0.05f);
    reference_opt->Step();
    ASSERT_TRUE(std::isfinite(norm)) << "the reference norm is " << norm;  // else any norm passes
    EXPECT_GT(norm, 0.05f);  // clipping took effect
    EXPECT_NEAR(stats->grad_norm, norm, 1e-4f * norm);
    ExpectClose(*model, *reference, 2e-6f, 2e-4f, "step " + std::to_string(step));
  }
}

TEST_F(DpTest, OneDeviceNeedsNoReplicaFactory) {
  std::unique_ptr<Strategy> dp = MakeDp();
  std::unique_ptr<Module> model = MakeModel(Kind::kMlp, Device::CPU(0), 1);
  StrategyContext ctx;
  ctx.options["devices"] = "cpu:0";
  ASSERT_TRUE(dp->Setup(*model, AdamW, ctx).ok());
  std::unique_ptr<Module> reference = MakeModel(Kind::kMlp, Device::CPU(0), 1);
  std::unique_ptr<Optimizer> reference_opt = AdamW(reference->NamedParameters());
  Batch batch = MakeBatch(Kind::kMlp, 0, 6);
  ASSERT_TRUE(dp->TrainStep({batch}, CrossEntropyLoss).ok());
  CrossEntropyLoss(*reference, batch).Backward();
  reference_opt->Step();
  ExpectClose(*model, *reference, 0.0f, 0.0f, "one device");
}

}  // namespace
}  // namespace braid::dp_test
