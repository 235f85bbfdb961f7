// The composer against a table of strategies standing for the shipped plugins and a user's:
// which stack each layout gets, and the one-line refusals of stacks that cannot work.
#include "launcher/compose.h"

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "backends/in_process/run_ranks.h"
#include "core/check.h"
#include "core/mesh.h"
#include "core/registry.h"
#include "core/tensor.h"
#include "core/wrapping_strategy.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace braid::launcher {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// The traits the shipped plugins register, and a user's strategy that declares nothing.
std::map<std::string, StrategyTraits> Shipped() {
  return {
      {"single", StrategyTraits{{"fp16", "bf16"}, {}, "", 1, StrategyTraits::DefaultFor::kOneDataRank}},
      {"ddp", StrategyTraits{{"fp16", "bf16", "communication_data_type"}, {}, "", 0,
                             StrategyTraits::DefaultFor::kSeveralDataRanks}},
      {"zero", StrategyTraits{{"zero1", "zero2", "zero3", "fp16", "bf16"}}},
      {"dp", StrategyTraits{{}, {kAxisData}, "it keeps whole replicas of the model, one per device"}},
      {"paramserver", StrategyTraits{{}, {kAxisData}, "its server keeps the whole model"}},
      {"pipeline", StrategyTraits{{}, {kAxisPipeline}}},
      {"tensor_parallel", StrategyTraits{{"tensor_parallel"}, {kAxisTensor}}},
      {"localsgd", StrategyTraits{}},
  };
}

LayerCatalog Catalog(std::map<std::string, StrategyTraits> table) {
  auto t = std::make_shared<std::map<std::string, StrategyTraits>>(std::move(table));
  LayerCatalog c;
  c.traits_of = [t](const std::string& name) -> absl::StatusOr<StrategyTraits> {
    auto it = t->find(name);
    if (it == t->end()) return absl::NotFoundError("no plugin registers it");
    return it->second;
  };
  c.serving = [t](const std::string& axis) {
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& [name, traits] : *t) {
      for (const std::string& a : ServedAxes(traits)) {
        if (a == axis) out.emplace_back(name, "test");
      }
    }
    return out;
  };
  return c;
}

std::vector<std::string> Names(const Stack& s) {
  std::vector<std::string> out;
  for (const Layer& l : s.layers) out.push_back(l.strategy);
  return out;
}

std::string Compose(int t, int p, int d, const std::string& named, const LayerCatalog& c) {
  absl::StatusOr<Stack> s = ComposeStack(t, p, d, named, c);
  if (!s.ok()) return std::string(s.status().message());
  return s->Describe();
}

TEST(ComposeStack, DefaultsFollowTheLayout) {
  const LayerCatalog c = Catalog(Shipped());
  EXPECT_EQ(Compose(1, 1, 1, "", c), "single [data]");
  EXPECT_EQ(Compose(1, 1, 4, "", c), "ddp [data]");
  EXPECT_EQ(Compose(1, 2, 2, "", c), "pipeline [pipeline] > ddp [data]");
  EXPECT_EQ(Compose(1, 2, 1, "", c), "pipeline [pipeline] > single [data]");
  EXPECT_EQ(Compose(2, 1, 2, "", c), "tensor_parallel [tensor] > ddp [data]");
  EXPECT_EQ(Compose(2, 1, 1, "", c), "tensor_parallel [tensor] > single [data]");
  EXPECT_EQ(Compose(2, 2, 2, "", c), "tensor_parallel [tensor] > pipeline [pipeline] > ddp [data]");
}

TEST(ComposeStack, TheNamedStrategyServesTheDataAxis) {
  const LayerCatalog c = Catalog(Shipped());
  EXPECT_EQ(Compose(2, 1, 2, "zero", c), "tensor_parallel [tensor] > zero [data]");
  // A user's strategy that declares nothing serves the data axis, and composes unchanged.
  EXPECT_EQ(Compose(2, 1, 2, "localsgd", c), "tensor_parallel [tensor] > localsgd [data]");
  EXPECT_EQ(Compose(1, 1, 4, "localsgd", c), "localsgd [data]");
  // Naming the pipeline names that layer; the data axis under it gets the default.
  EXPECT_EQ(Compose(2, 2, 1, "pipeline", c),
            "tensor_parallel [tensor] > pipeline [pipeline] > single [data]");
  // The stage count is the mesh's: a pipeline named on a layout of one stage (no parallel
  // section, a "stages" option perhaps) is refused, saying where the count goes.
  EXPECT_THAT(Compose(1, 1, 4, "pipeline", c),
              AllOf(HasSubstr("strategy.name \"pipeline\" (pipeline axis) cuts the model into stages"),
                    HasSubstr("parallel.pipeline is 1; give the stage count as parallel { pipeline: N }")));
  absl::StatusOr<Stack> s = ComposeStack(2, 1, 2, "localsgd", c);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->state_holder(), "localsgd");
  EXPECT_EQ(Names(*s), (std::vector<std::string>{"tensor_parallel", "localsgd"}));
}

// The run the issue reported: a user's strategy under parallel { pipeline: 2 data: 2 } trained
// with no pipelining at all. Now the pipeline serves its axis and the user's strategy (or ddp,
// or zero) serves each stage's data axis under it.
TEST(ComposeStack, ADataAxisStrategyServesUnderThePipeline) {
  const LayerCatalog c = Catalog(Shipped());
  for (const char* data_layer : {"localsgd", "ddp", "zero"}) {
    EXPECT_EQ(Compose(1, 2, 2, data_layer, c), absl::StrCat("pipeline [pipeline] > ", data_layer, " [data]"));
    EXPECT_EQ(Compose(2, 2, 2, data_layer, c),
              absl::StrCat("tensor_parallel [tensor] > pipeline [pipeline] > ", data_layer, " [data]"));
  }
  // A pipeline plugin that keeps its own data axis takes no data-axis layer: refused, naming both.
  std::map<std::string, StrategyTraits> own_data = Shipped();
  own_data["pipeline"] = StrategyTraits{{}, {kAxisPipeline, kAxisData}};
  EXPECT_THAT(Compose(1, 2, 2, "ddp", Catalog(own_data)),
              AllOf(HasSubstr("layers \"pipeline\" (pipeline and data axes) and \"ddp\" (data axis) "
                              "do not stack"),
                    HasSubstr("leave strategy.name empty")));
  // A data-axis strategy that keeps whole replicas cannot serve under the pipeline either.
  EXPECT_THAT(Compose(1, 2, 2, "dp", c),
              AllOf(HasSubstr("layers \"pipeline\" (pipeline axis) and \"dp\" (data axis) do not stack"),
                    HasSubstr("it keeps whole replicas of the model")));
  // Without any pipeline plugin the axis is named with what is missing.
  std::map<std::string, StrategyTraits> no_pipeline = Shipped();
  no_pipeline.erase("pipeline");
  EXPECT_THAT(Compose(1, 2, 2, "ddp", Catalog(no_pipeline)),
              AllOf(HasSubstr("parallel.pipeline is 2"),
                    HasSubstr("no strategy on the plugin search path serves the pipeline axis"),
                    HasSubstr("(\"ddp\" serves the data axis)")));
  std::map<std::string, StrategyTraits> no_tensor = Shipped();
  no_tensor.erase("tensor_parallel");
  EXPECT_THAT(Compose(2, 1, 2, "ddp", Catalog(no_tensor)),
              HasSubstr("parallel.tensor is 2, but no strategy on the plugin search path serves "
                        "the tensor axis"));
}

TEST(ComposeStack, AStrategyThatCannotBeWrappedIsRefusedUnderTensorParallelism) {
  const LayerCatalog c = Catalog(Shipped());
  EXPECT_EQ(Compose(2, 1, 2, "dp", c),
            "layers \"tensor_parallel\" (tensor axis) and \"dp\" (data axis) do not stack: \"dp\" "
            "cannot serve under a layer that splits the model: it keeps whole replicas of the "
            "model, one per device; use another data-axis strategy (or none) or parallel.tensor 1");
  EXPECT_THAT(Compose(2, 1, 2, "paramserver", c), HasSubstr("its server keeps the whole model"));
  // Alone, on the data axis, both train.
  EXPECT_EQ(Compose(1, 1, 3, "paramserver", c), "paramserver [data]");
}

std::string ComposeFor(int t, int p, int d, const std::vector<std::string>& features,
                       const LayerCatalog& c) {
  absl::StatusOr<Stack> s = ComposeStack(t, p, d, "", c, features);
  if (!s.ok()) return std::string(s.status().message());
  return s->Describe();
}

// A config that names no strategy gets one that provides what its sections ask for: a
// DeepSpeed config's zero_optimization alone picks ZeRO, under the pipeline too; fp16 keeps the
// default.
TEST(ComposeStack, WhatTheSectionsRequestPicksTheDefault) {
  const LayerCatalog c = Catalog(Shipped());
  EXPECT_EQ(ComposeFor(1, 1, 1, {"zero2"}, c), "zero [data]");
  EXPECT_EQ(ComposeFor(1, 1, 4, {"zero3", "fp16"}, c), "zero [data]");
  EXPECT_EQ(ComposeFor(2, 1, 2, {"zero1"}, c), "tensor_parallel [tensor] > zero [data]");
  EXPECT_EQ(ComposeFor(1, 1, 2, {"fp16"}, c), "ddp [data]");
  EXPECT_EQ(ComposeFor(1, 1, 1, {"bf16"}, c), "single [data]");
  EXPECT_EQ(ComposeFor(1, 2, 2, {"zero1"}, c), "pipeline [pipeline] > zero [data]");
  EXPECT_EQ(ComposeFor(2, 2, 2, {"zero3"}, c), "tensor_parallel [tensor] > pipeline [pipeline] > zero [data]");
  // Nobody provides it: the default stays, and validation names the feature.
  EXPECT_EQ(ComposeFor(1, 1, 2, {"zero9"}, c), "ddp [data]");
  // A named strategy is never replaced.
  absl::StatusOr<Stack> named = ComposeStack(1, 1, 2, "ddp", c, {"zero2"});
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(named->state_holder(), "ddp");
}

// The default is whichever registered strategy claims it (the composer names none): a user's
// plugin can take the shipped one's place, and no claimant or two are refused by name.
TEST(ComposeStack, TheDefaultIsTheStrategyThatClaimsIt) {
  std::map<std::string, StrategyTraits> table = Shipped();
  table["ddp"].default_for = StrategyTraits::DefaultFor::kNone;
  table["localsgd"].default_for = StrategyTraits::DefaultFor::kSeveralDataRanks;
  const LayerCatalog mine = Catalog(table);
  EXPECT_EQ(Compose(1, 1, 4, "", mine), "localsgd [data]");
  EXPECT_EQ(Compose(2, 2, 2, "", mine), "tensor_parallel [tensor] > pipeline [pipeline] > localsgd [data]");
  EXPECT_EQ(Compose(1, 1, 1, "", mine), "single [data]");

  table["ddp"].default_for = StrategyTraits::DefaultFor::kSeveralDataRanks;
  EXPECT_THAT(Compose(1, 1, 4, "", Catalog(table)),
              AllOf(HasSubstr("several on the plugin search path claim to be the default for 4 "
                              "data-parallel ranks: \"ddp\" (test) and \"localsgd\" (test)"),
                    HasSubstr("name one in strategy.name")));

  table["ddp"].default_for = StrategyTraits::DefaultFor::kNone;
  table["localsgd"].default_for = StrategyTraits::DefaultFor::kNone;
  table["single"].default_for = StrategyTraits::DefaultFor::kNone;
  const LayerCatalog none = Catalog(table);
  EXPECT_THAT(Compose(1, 1, 2, "", none),
              AllOf(HasSubstr("none on the plugin search path is the default for 2 data-parallel "
                              "ranks; name one in strategy.name"),
                    HasSubstr("\"ddp\""), HasSubstr("\"zero\"")));
  EXPECT_THAT(Compose(1, 1, 1, "", none), HasSubstr("is the default for one data-parallel rank"));
  // A named strategy needs no default.
  EXPECT_EQ(Compose(1, 1, 2, "ddp", none), "ddp [data]");
}

TEST(ComposeStack, AOneReplicaStrategyIsRefusedOnSeveralDataRanks) {
  const LayerCatalog c = Catalog(Shipped());
  EXPECT_THAT(Compose(1, 1, 2, "single", c),
              AllOf(HasSubstr("strategy.name \"single\" trains 1 data-parallel rank(s), but the "
                              "data-parallel size is 2"),
                    HasSubstr("\"ddp\"")));
  // Under tensor parallelism with one replica it is the data-axis layer.
  EXPECT_EQ(Compose(2, 1, 1, "single", c), "tensor_parallel [tensor] > single [data]");
}

TEST(ComposeStack, NamingALayerThatIsNotTheDataAxisIsRefused) {
  const LayerCatalog c = Catalog(Shipped());
  EXPECT_THAT(Compose(2, 1, 2, "tensor_parallel", c),
              AllOf(HasSubstr("strategy.name \"tensor_parallel\" (tensor axis) does not serve the "
                              "data axis"),
                    HasSubstr("\"ddp\""), HasSubstr("\"localsgd\"")));
  EXPECT_THAT(Compose(1, 1, 2, "no_such", c),
              HasSubstr("strategy.name \"no_such\": no plugin registers it"));
}

// Strategies registered for BuildStack: a data-axis one, a layer over it, and a strategy that
// declares the tensor axis but does not take the layer below.
class DataLayer final : public Strategy {
 public:
  std::string name() const override { return "compose_test_data"; }
  absl::Status Setup(Module&, const OptimizerFactory&, const StrategyContext&) override {
    return absl::OkStatus();
  }
  absl::StatusOr<StepStats> TrainStep(const std::vector<Batch>&, const LossFn&) override {
    return StepStats();
  }
};
class TensorLayer final : public WrappingStrategy {
 public:
  std::string name() const override { return NameOver("compose_test_tensor"); }
  absl::Status Setup(Module& model, const OptimizerFactory& make_optimizer,
                     const StrategyContext& ctx) override {
    BRAID_RETURN_IF_ERROR(RequireWrapped());
    return inner()->Setup(model, make_optimizer, ContextBelow(ctx));
  }
};
class NotALayer final : public Strategy {
 public:
  std::string name() const override { return "compose_test_alone"; }
  absl::Status Setup(Module&, const OptimizerFactory&, const StrategyContext&) override {
    return absl::OkStatus();
  }
  absl::StatusOr<StepStats> TrainStep(const std::vector<Batch>&, const LossFn&) override {
    return StepStats();
  }
};

void RegisterBuildStackStrategies() {
  static const bool done = [] {
    Registry& r = Registry::Get();
    BRAID_CHECK(r.AddStrategy("compose_test_data", [] { return std::make_unique<DataLayer>(); }).ok());
    BRAID_CHECK(r.AddStrategy("compose_test_tensor", [] { return std::make_unique<TensorLayer>(); },
                              StrategyTraits{{}, {kAxisTensor}})
                    .ok());
    BRAID_CHECK(r.AddStrategy("compose_test_alone", [] { return std::make_unique<NotALayer>(); },
                              StrategyTraits{{}, {kAxisTensor}})
                    .ok());
    return true;
  }();
  (void)done;
}

TEST(BuildStack, WrapsEachLayerInTheOneAboveIt) {
  RegisterBuildStackStrategies();
  absl::StatusOr<std::unique_ptr<Strategy>> s =
      BuildStack(Stack{{{"compose_test_tensor", {kAxisTensor}}, {"compose_test_data", {kAxisData}}}});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->name(), "compose_test_tensor(compose_test_data)");
}

// A strategy that declares the tensor axis but does not take the layer below is refused while
// the stack is built, before any model exists, in one line naming both layers.
TEST(BuildStack, ALayerThatDoesNotWrapIsRefusedNamingBothLayers) {
  RegisterBuildStackStrategies();
  absl::StatusOr<std::unique_ptr<Strategy>> s =
      BuildStack(Stack{{{"compose_test_alone", {kAxisTensor}}, {"compose_test_data", {kAxisData}}}});
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(s.status())) << s.status();
  const std::string msg(s.status().message());
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  EXPECT_EQ(msg,
            "layers \"compose_test_alone\" (tensor axis) and \"compose_test_data\" (data axis) do "
            "not stack: \"compose_test_alone\" did not take the layer below (compose_test_alone "
            "does not wrap another strategy); a strategy serving the tensor axis wraps the one below "
            "it: derive it from WrappingStrategy (core/wrapping_strategy.h)");
}

// The sum of the world ranks of `g`'s members: which ranks a group holds, seen from inside it.
float SumOfWorldRanks(Communicator& g, int world_rank) {
  Tensor t = Tensor::Full({1}, float(world_rank));
  absl::Status st = g.AllReduce(t, ReduceOp::kSum)->Wait();
  BRAID_CHECK(st.ok()) << st.ToString();
  return t.ToFloatVector()[0];
}

// A layer that only shows what it hands the layer below.
class Peek final : public WrappingStrategy {
 public:
  std::string name() const override { return "peek"; }
  absl::Status Setup(Module&, const OptimizerFactory&, const StrategyContext&) override {
    return absl::OkStatus();
  }
  StrategyContext Below(const StrategyContext& ctx) const { return ContextBelow(ctx); }
};

// On the 2 x 2 x 2 mesh (rank = (data * 2 + pipeline) * 2 + tensor) each layer of the stack
// tensor > pipeline > data is handed its axis' group: the outermost in comm, the others in
// groups_below, nearest first; ContextBelow hands the next one down as the layer below's comm.
TEST(HandGroups, EachLayerGetsTheGroupOfItsAxis) {
  const Stack stack{{{"tensor_parallel", {kAxisTensor}}, {"pipeline", {kAxisPipeline}}, {"ddp", {kAxisData}}}};
  testing::RunRanks(8, [&](int rank, Communicator* world) {
    absl::StatusOr<std::unique_ptr<DeviceMesh>> mesh = DeviceMesh::Create(*world, {2, 2, 2});
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    StrategyContext ctx;
    ASSERT_TRUE(HandGroups(stack, mesh->get(), *world, &ctx).ok());
    ASSERT_NE(ctx.comm, nullptr);
    ASSERT_EQ(ctx.groups_below.size(), 2u);
    const int t = rank % 2, p = (rank / 2) % 2, d = rank / 4;
    auto world_rank = [](int ti, int pi, int di) { return float((di * 2 + pi) * 2 + ti); };
    Communicator& tensor = *ctx.comm;
    Communicator& pipe = *ctx.groups_below[0];
    Communicator& data = *ctx.groups_below[1];
    EXPECT_EQ(tensor.rank(), t);
    EXPECT_EQ(pipe.rank(), p);
    EXPECT_EQ(data.rank(), d);
    EXPECT_EQ(SumOfWorldRanks(tensor, rank), world_rank(0, p, d) + world_rank(1, p, d));
    EXPECT_EQ(SumOfWorldRanks(pipe, rank), world_rank(t, 0, d) + world_rank(t, 1, d));
    EXPECT_EQ(SumOfWorldRanks(data, rank), world_rank(t, p, 0) + world_rank(t, p, 1));
    // What each layer hands the one below: the next group as its comm, the rest after it,
    // and the groups above, nearest first.
    EXPECT_TRUE(ctx.groups_above.empty());
    const StrategyContext below = Peek().Below(ctx);
    EXPECT_EQ(below.comm, &pipe);
    EXPECT_EQ(below.groups_below, std::vector<Communicator*>{&data});
    EXPECT_EQ(below.groups_above, std::vector<Communicator*>{&tensor});
    const StrategyContext bottom = Peek().Below(below);
    EXPECT_EQ(bottom.comm, &data);
    EXPECT_TRUE(bottom.groups_below.empty());
    EXPECT_EQ(bottom.groups_above, (std::vector<Communicator*>{&pipe, &tensor}));
  });
}

// A single layer serving every rank trains over the world itself, mesh or none; a layer
// serving axes no group spans is refused naming the stack.
TEST(HandGroups, OneLayerGetsTheWorldAndAnUnspannedSetIsRefused) {
  testing::RunRanks(2, [&](int rank, Communicator* world) {
    StrategyContext ctx;
    ASSERT_TRUE(HandGroups(Stack{{{"ddp", {kAxisData}}}}, nullptr, *world, &ctx).ok());
    EXPECT_EQ(ctx.comm, world);
    absl::StatusOr<std::unique_ptr<DeviceMesh>> mesh = DeviceMesh::Create(*world, {1, 1, 2});
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    StrategyContext ctx2;
    ASSERT_TRUE(HandGroups(Stack{{{"ddp", {kAxisData}}}}, mesh->get(), *world, &ctx2).ok());
    EXPECT_EQ(ctx2.comm, world);
    EXPECT_TRUE(ctx2.groups_below.empty());
    absl::Status st = HandGroups(Stack{{{"odd", {kAxisTensor, kAxisData}}}}, mesh->get(), *world, &ctx2);
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
    EXPECT_THAT(std::string(st.message()),
                AllOf(HasSubstr("stack odd [tensor, data]"), HasSubstr("spans the axes {tensor, data}")));
    (void)rank;
  });
}

}  // namespace
}  // namespace braid::launcher
