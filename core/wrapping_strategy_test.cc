// WrappingStrategy: a layer that writes only what it changes gets the rest from the layer below,
// and refuses to run without one. The layer in the guide's region (docs/WRITING_A_STRATEGY.md,
// checked by //tests/external_plugin:guide_code_test) is the one tested here.
#include "core/wrapping_strategy.h"

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/micro_batches.h"
#include "core/ops.h"
#include "core/optimizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace braid {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// [START wrapping_layer]
// A layer over any strategy that counts the steps it passes down and reports them in the
// run's summary: its name, Setup and the two methods it changes; WrappingStrategy forwards the
// others (optimizer, state, data shard, evaluation, checkpoint chunks) to the layer below.
class CountingLayer final : public WrappingStrategy {
 public:
  std::string name() const override { return NameOver("counting"); }

  absl::Status Setup(Module& model, const OptimizerFactory& make_optimizer,
                     const StrategyContext& ctx) override {
    BRAID_RETURN_IF_ERROR(RequireWrapped());
    if (auto it = ctx.options.find("counting_label"); it != ctx.options.end()) label_ = it->second;
    // The layer below gets the context without this layer's own option.
    return inner()->Setup(model, make_optimizer, ContextBelow(ctx));
  }

  absl::StatusOr<StepStats> TrainStep(const std::vector<Batch>& micro_batches,
                                      const LossFn& loss) override {
    absl::StatusOr<StepStats> stats = WrappingStrategy::TrainStep(micro_batches, loss);
    if (stats.ok()) ++steps_;
    return stats;
  }

  std::vector<std::string> SummaryLines() const override {
    std::vector<std::string> lines = WrappingStrategy::SummaryLines();  // the layer below's
    lines.push_back(label_ + ": " + std::to_string(steps_) + " step(s)");
    return lines;
  }

 private:
  bool OwnsOption(const std::string& key) const override { return key == "counting_label"; }

  std::string label_ = "counting";
  int steps_ = 0;
};
// [END wrapping_layer]

// y = w * x with one weight, loss = mean((y - t)^2).
class Scalar : public Module {
 public:
  Scalar() : Module("Scalar") { w = RegisterParameter("w", Tensor::Full({1, 1}, 2.0f)); }
  Tensor Forward(const Tensor& x) override { return ops::Linear(x, w, Tensor()); }
  Tensor w;
};

LossFn Mse() {
  return [](Module& m, const Batch& b) {
    Tensor d = ops::Sub(m(b.inputs), b.targets);
    return ops::Mean(ops::Mul(d, d));
  };
}

// The layer below: the whole model, SGD, and answers of its own where the defaults would be
// indistinguishable from a layer's (replica 1 of 2, a peak, a summary line).
class Replica final : public Strategy {
 public:
  std::string name() const override { return "replica"; }
  absl::Status Setup(Module& model, const OptimizerFactory& make_optimizer,
                     const StrategyContext& ctx) override {
    options = ctx.options;
    return Adopt(model, make_optimizer(model.NamedParameters()), nullptr);
  }
  absl::StatusOr<StepStats> TrainStep(const std::vector<Batch>& micro_batches,
                                      const LossFn& loss) override {
    StepStats stats;
    optimizer()->ZeroGrad();
    BRAID_RETURN_IF_ERROR(RunMicroBatches(name(), *model(), micro_batches, loss, &stats));
    optimizer()->Step();
    return stats;
  }
  int data_parallel_rank() const override { return 1; }
  int data_parallel_size() const override { return 2; }
  // Any option left in the context it is asked with: what a layer above forgot to remove.
  bool wants_deferred_init(const StrategyContext& ctx) const override { return !ctx.options.empty(); }
  std::vector<std::pair<std::string, int64_t>> ModelStatePeaks() const override {
    return {{"parameters", 4}};
  }
  std::vector<std::string> SummaryLines() const override { return {"replica line"}; }

  std::map<std::string, std::string> options;  // what Setup was given
};

OptimizerFactory Sgd(float lr) {
  return [lr](const std::vector<std::pair<std::string, Tensor>>& named) {
    ParamGroup g;
    g.lr = lr;
    for (const auto& [n, p] : named) g.params.push_back(p);
    return MakeSgd({g});
  };
}

TEST(WrappingStrategy, ALayerWritesOnlyWhatItChanges) {
  Scalar model;
  auto replica = std::make_unique<Replica>();
  Replica* below = replica.get();
  CountingLayer layer;
  EXPECT_EQ(layer.name(), "counting");
  ASSERT_TRUE(layer.Wrap(std::move(replica)).ok());
  EXPECT_EQ(layer.name(), "counting(replica)");

  StrategyContext ctx;
  ctx.options = {{"counting_label", "steps seen"}, {"theirs", "1"}};
  // Deferred initialisation is the layer below's call, asked without this layer's option.
  EXPECT_TRUE(layer.wants_deferred_init(ctx));
  StrategyContext own_only;
  own_only.options = {{"counting_label", "x"}};
  EXPECT_FALSE(layer.wants_deferred_init(own_only));

  ASSERT_TRUE(layer.Setup(model, Sgd(0.25f), ctx).ok());
  EXPECT_THAT(below->options, ElementsAre(std::make_pair(std::string("theirs"), std::string("1"))));
  EXPECT_EQ(layer.optimizer(), below->optimizer());
  EXPECT_EQ(layer.data_parallel_rank(), 1);
  EXPECT_EQ(layer.data_parallel_size(), 2);
  EXPECT_THAT(layer.ModelStatePeaks(), ElementsAre(std::make_pair(std::string("parameters"), int64_t{4})));

  // One step through the layer is the layer below's: x = 1, t = 0, w = 2: loss 4, dL/dw = 4,
  // w = 2 - 0.25 * 4 = 1.
  const Batch batch{Tensor::Full({1, 1}, 1.0f), Tensor::Full({1, 1}, 0.0f)};
  absl::StatusOr<StepStats> stats = layer.TrainStep({batch}, Mse());
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_FLOAT_EQ(stats->loss, 4.0f);
  EXPECT_FLOAT_EQ(model.w.item(), 1.0f);
  EXPECT_THAT(layer.SummaryLines(), ElementsAre("replica line", "steps seen: 1 step(s)"));

  // State and evaluation: the adopted model's.
  absl::StatusOr<std::map<std::string, Tensor>> state = layer.FullStateDict();
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_EQ(state->count("w"), 1u);
  EXPECT_FLOAT_EQ(state->at("w").item(), 1.0f);
  ASSERT_TRUE(layer.LoadFullStateDict({{"w", Tensor::Full({1, 1}, 3.0f)}}).ok());
  EXPECT_FLOAT_EQ(model.w.item(), 3.0f);
  absl::StatusOr<double> eval = layer.EvaluateLoss({batch}, Mse());
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_DOUBLE_EQ(*eval, 9.0);
  absl::StatusOr<std::vector<StateChunk>> chunks = layer.StateChunks(/*create=*/true);
  ASSERT_TRUE(chunks.ok()) << chunks.status();
  absl::StatusOr<std::vector<StateChunk>> their_chunks = below->StateChunks(/*create=*/true);
  ASSERT_TRUE(their_chunks.ok()) << their_chunks.status();
  ASSERT_EQ(chunks->size(), their_chunks->size());
  for (size_t i = 0; i < chunks->size(); ++i) EXPECT_EQ((*chunks)[i].name, (*their_chunks)[i].name);
  EXPECT_TRUE(layer.AfterStateLoaded(*chunks).ok());
}

TEST(WrappingStrategy, WithoutALayerBelowItSaysSo) {
  CountingLayer layer;
  Scalar model;
  absl::Status setup = layer.Setup(model, Sgd(0.1f), StrategyContext());
  EXPECT_TRUE(absl::IsFailedPrecondition(setup)) << setup;
  EXPECT_THAT(setup.message(), HasSubstr("strategy 'counting' is a layer over another strategy"));
  EXPECT_THAT(setup.message(), HasSubstr("give that one with Wrap before Setup"));
  EXPECT_THAT(layer.FullStateDict().status().message(),
              HasSubstr("strategy 'counting': FullStateDict before Wrap"));
  EXPECT_THAT(layer.TrainStep({}, Mse()).status().message(), HasSubstr("TrainStep before Wrap"));
  EXPECT_EQ(layer.optimizer(), nullptr);
  EXPECT_FALSE(layer.wants_deferred_init(StrategyContext()));
  EXPECT_THAT(layer.SummaryLines(), ElementsAre("counting: 0 step(s)"));  // its own only
  EXPECT_DEATH((void)layer.data_parallel_rank(), "data_parallel_rank asked before Wrap");
}

TEST(WrappingStrategy, WrapsOneLayerOnly) {
  CountingLayer layer;
  ASSERT_TRUE(layer.Wrap(std::make_unique<Replica>()).ok());
  absl::Status again = layer.Wrap(std::make_unique<Replica>());
  EXPECT_TRUE(absl::IsFailedPrecondition(again)) << again;
  EXPECT_EQ(again.message(),
            "strategy 'counting(replica)' wraps 'replica' already; it cannot also wrap 'replica'");
  EXPECT_THAT(layer.Wrap(nullptr).message(), HasSubstr("Wrap was given no strategy"));
}

}  // namespace
}  // namespace braid
