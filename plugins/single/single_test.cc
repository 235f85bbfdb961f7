// Loads libbraid_single.so the way the trainer does and checks that gradient accumulation over
// micro-batches gives the step of one batch holding them all.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/ops.h"
#include "core/optimizer.h"
#include "core/plugin.h"
#include "core/registry.h"
#include "core/strategy.h"
#include "core/testing/compare.h"
#include "core/testing/reference_kernels.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "third_party/runfiles.h"

namespace braid {
namespace {

using ::bazel::tools::cpp::runfiles::Runfiles;
using ::testing::HasSubstr;

// y = x W^T + b, W: [2, 3].
class TinyLinear : public Module {
 public:
  TinyLinear() : Module("TinyLinear") {
    weight_ = RegisterParameter(
        "weight",
        Tensor::FromVector(std::vector<float>{0.2f, -0.4f, 0.1f, 0.5f, 0.3f, -0.2f}, {2, 3}));
    bias_ = RegisterParameter("bias", Tensor::FromVector(std::vector<float>{0.05f, -0.1f}, {2}));
  }
  Tensor Forward(const Tensor& x) override { return ops::Linear(x, weight_, bias_); }

 private:
  Tensor weight_, bias_;
};

Tensor MseLoss(Module& model, const Batch& batch) {
  Tensor d = ops::Sub(model(batch.inputs), batch.targets);
  return ops::Mean(ops::Mul(d, d));
}

// Rows [first, first + rows) of step `step`'s data.
Batch Rows(int step, int first, int rows) {
  std::vector<float> x, y;
  for (int r = first; r < first + rows; ++r) {
    for (int c = 0; c < 3; ++c) x.push_back(std::sin(0.7f * float(step * 11 + r * 3 + c)));
    for (int c = 0; c < 2; ++c) y.push_back(std::cos(0.3f * float(step * 5 + r * 2 + c)));
  }
  return Batch{Tensor::FromVector(x, {rows, 3}), Tensor::FromVector(y, {rows, 2})};
}

std::unique_ptr<Optimizer> MakeOptimizer(const std::vector<std::pair<std::string, Tensor>>& named) {
  std::vector<Tensor> params;
  for (const auto& [n, p] : named) params.push_back(p);
  return MakeAdamW({ParamGroup{params, 0.05f, 0.01f}});
}

class SingleStrategyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    reference::RegisterReferenceKernels();
    std::string error;
    std::unique_ptr<Runfiles> runfiles(Runfiles::CreateForTest(&error));
    ASSERT_NE(runfiles, nullptr) << error;
    plugin_ = runfiles->Rlocation("braid/plugins/single/libbraid_single.so");
    absl::Status s = LoadPlugin(plugin_, {});
    ASSERT_TRUE(s.ok()) << s;
  }
  std::string plugin_;
};

TEST_F(SingleStrategyTest, AccumulatedMicroBatchesEqualOneStepOnTheirConcatenation) {
  absl::StatusOr<std::unique_ptr<Strategy>> made = Registry::Get().MakeStrategy("single");
  ASSERT_TRUE(made.ok()) << made.status();
  Strategy& strategy = **made;
  EXPECT_EQ(strategy.name(), "single");

  TinyLinear model;
  std::vector<std::string> names;
  auto factory = [&names](const std::vector<std::pair<std::string, Tensor>>& named) {
    for (const auto& [n, p] : named) names.push_back(n);
    return MakeOptimizer(named);
  };
  ASSERT_TRUE(strategy.Setup(model, factory, StrategyContext{}).ok());
  EXPECT_EQ(names, (std::vector<std::string>{"weight", "bias"}));
  ASSERT_NE(strategy.optimizer(), nullptr);

  // The same model and optimizer driven by hand on the 4-row batch.
  TinyLinear reference_model;
  auto reference_opt = MakeOptimizer(reference_model.NamedParameters());

  for (int step = 0; step < 3; ++step) {
    absl::StatusOr<StepStats> stats =
        strategy.TrainStep({Rows(step, 0, 2), Rows(step, 2, 2)}, MseLoss);
    ASSERT_TRUE(stats.ok()) << stats.status();

    reference_opt->ZeroGrad();
    Tensor loss = MseLoss(reference_model, Rows(step, 0, 4));
    loss.Backward();
    reference_opt->Step();

    EXPECT_NEAR(stats->loss, loss.item(), 1e-6) << "step " << step;
    EXPECT_GE(stats->forward_s, 0.0);
    EXPECT_GE(stats->backward_s, 0.0);
    EXPECT_GE(stats->optimizer_s, 0.0);
    auto mine = model.StateDict();
    for (const auto& [name, want] : reference_model.StateDict()) {
      std::vector<float> got = mine.at(name).ToFloatVector(), expected = want.ToFloatVector();
      ASSERT_EQ(got.size(), expected.size());
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_NEAR(got[i], expected[i], 1e-5) << name << "[" << i << "] after step " << step;
      }
    }
  }
  // The parameters moved (the comparison above is not between two untouched models).
  EXPECT_NE(model.StateDict().at("bias").ToFloatVector(), (std::vector<float>{0.05f, -0.1f}));

  absl::StatusOr<std::map<std::string, Tensor>> full = strategy.FullStateDict();
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(full->size(), 2u);
  EXPECT_EQ(full->at("weight").ToFloatVector(), model.StateDict().at("weight").ToFloatVector());
}

// AdamW ignores a constant factor on the gradient, so the test above cannot see the 1/k scaling
// of accumulation. Plain SGD (no momentum, no weight decay) steps by lr * gradient: the
// accumulated gradient itself, and the parameters, must equal one step on the concatenation.
TEST_F(SingleStrategyTest, AccumulationWithSgdEqualsOneStepOnTheConcatenation) {
  auto sgd = [](const std::vector<std::pair<std::string, Tensor>>& named) {
    std::vector<Tensor> params;
    for (const auto& [n, p] : named) params.push_back(p);
    return MakeSgd({ParamGroup{params, 0.1f, 0.0f}});
  };
  double worst_grad = 0, worst_param = 0, worst_norm = 0;
  for (int k : {2, 3, 4}) {
    SCOPED_TRACE("accumulation " + std::to_string(k));
    std::unique_ptr<Strategy> strategy = *Registry::Get().MakeStrategy("single");
    TinyLinear model;
    ASSERT_TRUE(strategy->Setup(model, sgd, StrategyContext{}).ok());  // clipping off
    TinyLinear reference_model;
    std::unique_ptr<Optimizer> reference_opt = sgd(reference_model.NamedParameters());
    for (int step = 0; step < 3; ++step) {
      std::vector<Batch> micro;
      for (int j = 0; j < k; ++j) micro.push_back(Rows(step, 2 * j, 2));
      absl::StatusOr<StepStats> stats = strategy->TrainStep(micro, MseLoss);
      ASSERT_TRUE(stats.ok()) << stats.status();

      reference_opt->ZeroGrad();
      MseLoss(reference_model, Rows(step, 0, 2 * k)).Backward();
      // Clipping is off, yet the norm of the gradient that was stepped is reported.
      const float norm = ClipGradNorm(reference_model.Parameters(), 0.0f);
      ASSERT_GT(norm, 0.1f);
      worst_norm = testing::Worst(worst_norm, std::abs(double(stats->grad_norm) - norm) / norm);
      reference_opt->Step();

      // The strategy leaves the step's gradient in .grad (zeroed at the next step's start).
      auto mine = model.NamedParameters();
      auto want = reference_model.NamedParameters();
      ASSERT_EQ(mine.size(), want.size());
      for (size_t t = 0; t < want.size(); ++t) {
        std::vector<float> g = mine[t].second.grad().ToFloatVector();
        std::vector<float> w = want[t].second.grad().ToFloatVector();
        std::vector<float> p = mine[t].second.ToFloatVector();
        std::vector<float> q = want[t].second.ToFloatVector();
        ASSERT_EQ(g.size(), w.size());
        // +inf on a NaN or inf on either side (std::max over elements would drop a NaN).
        worst_grad = testing::Worst(worst_grad, testing::MaxAbsDiff(g, w));
        worst_param = testing::Worst(worst_param, testing::MaxAbsDiff(p, q));
      }
    }
  }
  std::printf("sgd accumulation: worst |gradient diff| %.3g, |parameter diff| %.3g, "
              "relative grad_norm diff %.3g\n",
              worst_grad, worst_param, worst_norm);
  // Gradients are O(0.1..1) and differ only by f32 rounding of sums taken in another order:
  // measured 6e-8 (gradient), 1.5e-8 (parameters), 1.1e-7 relative (norm), i.e. about one ulp;
  // the bounds leave 3-7x for other CPUs' summation orders. Without the 1/k scaling the gradient
  // would be k times too large (differences ~0.1).
  EXPECT_LT(worst_grad, 3e-7);
  EXPECT_LT(worst_param, 1e-7);
  EXPECT_LT(worst_norm, 5e-7);
}

TEST_F(SingleStrategyTest, ReportsMisuse) {
  // Loading again is a no-op, and the strategy is found by name too.
  EXPECT_TRUE(LoadPlugin(plugin_, {}).ok());
  EXPECT_TRUE(EnsureStrategy("single", {}).ok());

  auto strategy = *Registry::Get().MakeStrategy("single");
  absl::StatusOr<StepStats> early = strategy->TrainStep({Rows(0, 0, 2)}, MseLoss);
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition);

  TinyLinear model;
  StrategyContext with_options;
  with_options.options["bucket_cap_mb"] = "25";
  absl::Status s = strategy->Setup(model, MakeOptimizer, with_options);
  EXPECT_THAT(std::string(s.message()), HasSubstr("bucket_cap_mb"));

  ASSERT_TRUE(strategy->Setup(model, MakeOptimizer, StrategyContext{}).ok());
  EXPECT_EQ(strategy->TrainStep({}, MseLoss).status().code(), absl::StatusCode::kInvalidArgument);
  auto constant_loss = [](Module&, const Batch&) { return Tensor::Scalar(1.0f); };
  absl::StatusOr<StepStats> bad = strategy->TrainStep({Rows(0, 0, 2)}, constant_loss);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("depends on no trainable parameter"));
}

}  // namespace
}  // namespace braid
