// The registry's tables for models, datasets and optimizers, and strategies' declared features.
// Core knows no model or dataset by name: the entries here are test doubles.
#include "core/registry.h"

#include <memory>
#include <string>
#include <vector>

#include "core/config/sections.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace braid {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

class Empty : public Module {
 public:
  explicit Empty(int64_t width) : Module("Empty"), width(width) {}
  Tensor Forward(const Tensor& x) override { return x; }
  int64_t width;
};

ModelSpec EmptyModel() {
  ModelSpec spec;
  spec.build = [](const config::ModelConfig& m, uint64_t seed,
                  Device) -> absl::StatusOr<std::unique_ptr<Module>> {
    if (m.n_embd() == 13) return absl::InvalidArgumentError("13 is unlucky");
    return std::unique_ptr<Module>(std::make_unique<Empty>(m.n_embd() + int64_t(seed)));
  };
  spec.fields = {"n_embd"};
  spec.takes = "rows";
  return spec;
}

TEST(RegistryModels, AddGetMakeAndList) {
  Registry& r = Registry::Get();
  ASSERT_TRUE(r.AddModel("registry_test_model", EmptyModel(), "registry_test").ok());
  absl::StatusOr<ModelSpec> spec = r.GetModel("registry_test_model");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->fields, std::vector<std::string>{"n_embd"});
  EXPECT_EQ(spec->takes, "rows");

  config::ModelConfig m;
  m.set_n_embd(5);
  absl::StatusOr<std::unique_ptr<Module>> made =
      r.MakeModel("registry_test_model", m, /*seed=*/100, Device::CPU());
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_EQ(dynamic_cast<Empty&>(**made).width, 105);
  // The build function's error is handed back.
  m.set_n_embd(13);
  EXPECT_THAT(Message(r.MakeModel("registry_test_model", m, 0, Device::CPU()).status()),
              HasSubstr("13 is unlucky"));

  std::vector<std::string> names = r.ModelNames();
  EXPECT_NE(std::find(names.begin(), names.end(), "registry_test_model"), names.end());
  // Unknown names list the known ones and say where models come from.
  absl::Status unknown = r.GetModel("registry_test_nope").status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(unknown), AllOf(HasSubstr("unknown model 'registry_test_nope'"),
                                      HasSubstr("registry_test_model"),
                                      HasSubstr("link that library into the program")));
}

TEST(RegistryModels, RejectsDuplicatesIncompleteSpecsAndASecondDefault) {
  Registry& r = Registry::Get();
  ASSERT_TRUE(r.AddModel("registry_test_dup", EmptyModel(), "first").ok());
  absl::Status dup = r.AddModel("registry_test_dup", EmptyModel(), "second");
  EXPECT_EQ(dup.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(Message(dup), AllOf(HasSubstr("model 'registry_test_dup'"), HasSubstr("first"),
                                  HasSubstr("second")));
  EXPECT_THAT(Message(r.AddModel("registry_test_nobuild", ModelSpec{}, "here")),
              HasSubstr("model 'registry_test_nobuild' from here has no build function"));
  EXPECT_FALSE(r.AddModel("", EmptyModel()).ok());

  ModelSpec first = EmptyModel(), second = EmptyModel();
  first.is_default = second.is_default = true;
  ASSERT_TRUE(r.AddModel("registry_test_default", first, "the first").ok());
  EXPECT_EQ(r.DefaultModel(), "registry_test_default");
  absl::Status two = r.AddModel("registry_test_default2", second, "the second");
  EXPECT_EQ(two.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(Message(two), AllOf(HasSubstr("'registry_test_default2' from the second claims to "
                                            "be the default model"),
                                  HasSubstr("'registry_test_default' (from the first)")));
  EXPECT_EQ(r.DefaultModel(), "registry_test_default");
  EXPECT_FALSE(r.GetModel("registry_test_default2").ok());  // not half-registered
}

TEST(RegistryDatasets, AddGetListAndDefault) {
  Registry& r = Registry::Get();
  EXPECT_EQ(r.DefaultDataset(), "");  // nothing in core claims it
  DatasetSpec spec;
  spec.yields = "rows";
  spec.token_dtypes = {"u8"};
  spec.vocab_size = 256;
  spec.is_default = true;
  ASSERT_TRUE(r.AddDataset("registry_test_rows", spec, "registry_test").ok());
  absl::StatusOr<DatasetSpec> got = r.GetDataset("registry_test_rows");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->vocab_size, 256);
  EXPECT_EQ(r.DefaultDataset(), "registry_test_rows");
  EXPECT_THAT(Message(r.AddDataset("registry_test_blank", DatasetSpec{}, "here")),
              HasSubstr("does not say what it yields"));
  EXPECT_THAT(Message(r.GetDataset("registry_test_none").status()),
              AllOf(HasSubstr("unknown dataset"), HasSubstr("registry_test_rows")));
}

TEST(RegistryOptimizers, CoreRegistersAdamWAndSgd) {
  Registry& r = Registry::Get();
  std::vector<std::string> names = r.OptimizerNames();
  EXPECT_NE(std::find(names.begin(), names.end(), "AdamW"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "SGD"), names.end());
  EXPECT_EQ(r.DefaultOptimizer(), "AdamW");

  config::OptimizerConfig cfg;
  cfg.set_type("SGD");
  cfg.mutable_params()->set_momentum(0.9);
  absl::StatusOr<std::unique_ptr<Optimizer>> sgd = r.MakeOptimizer("SGD", {}, cfg);
  ASSERT_TRUE(sgd.ok()) << sgd.status();
  absl::StatusOr<std::unique_ptr<Optimizer>> adamw = r.MakeOptimizer("AdamW", {}, cfg);
  ASSERT_TRUE(adamw.ok()) << adamw.status();
  EXPECT_NE((*sgd)->name(), (*adamw)->name());
  EXPECT_THAT(Message(r.MakeOptimizer("Lamb", {}, cfg).status()),
              AllOf(HasSubstr("unknown optimizer 'Lamb'"), HasSubstr("AdamW, SGD")));

  // The validation hooks fill each optimizer's defaults and check its params.
  absl::StatusOr<OptimizerSpec> spec = r.GetOptimizer("AdamW");
  ASSERT_TRUE(spec.ok());
  config::OptimizerConfig a;
  ConfigProblems problems;
  spec->validate(&a, &problems);
  EXPECT_TRUE(problems.empty());
  EXPECT_EQ(a.params().betas_size(), 2);
  EXPECT_DOUBLE_EQ(a.params().weight_decay(), 0.1);
  a.mutable_params()->set_eps(0);
  spec->validate(&a, &problems);
  EXPECT_THAT(problems, testing::ElementsAre(HasSubstr("optimizer.params.eps (0)")));

  // A plugin's optimizer goes in the same table.
  OptimizerSpec plain;
  plain.make = [](std::vector<ParamGroup> groups, const config::OptimizerConfig&) {
    return MakeSgd(std::move(groups));
  };
  ASSERT_TRUE(r.AddOptimizer("registry_test_plain", plain, "a plugin").ok());
  EXPECT_TRUE(r.MakeOptimizer("registry_test_plain", {}, cfg).ok());
  EXPECT_THAT(Message(r.AddOptimizer("SGD", plain, "a plugin")),
              AllOf(HasSubstr("optimizer 'SGD' is registered twice"), HasSubstr("built-in")));
}

std::unique_ptr<Strategy> NoStrategy() { return nullptr; }

TEST(RegistryStrategies, DeclareFeatures) {
  Registry& r = Registry::Get();
  // Without traits (every existing plugin's call), with traits and an origin, with traits alone.
  ASSERT_TRUE(r.AddStrategy("registry_test_plain", NoStrategy).ok());
  ASSERT_TRUE(r.AddStrategy("registry_test_zero", NoStrategy, "/p/libbraid_registry_test_zero.so",
                            StrategyTraits{{"zero1", "zero2"}})
                  .ok());
  ASSERT_TRUE(
      r.AddStrategy("registry_test_half", NoStrategy, StrategyTraits{{"zero2", "fp16"}}).ok());

  absl::StatusOr<StrategyTraits> plain = r.GetStrategyTraits("registry_test_plain");
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->features.empty());
  absl::StatusOr<StrategyTraits> zero = r.GetStrategyTraits("registry_test_zero");
  ASSERT_TRUE(zero.ok());
  EXPECT_EQ(zero->features, (std::vector<std::string>{"zero1", "zero2"}));
  EXPECT_THAT(Message(r.GetStrategyTraits("registry_test_absent").status()),
              HasSubstr("unknown strategy 'registry_test_absent'"));

  using Pairs = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(r.StrategiesProviding("zero2"),
            (Pairs{{"registry_test_half", "built-in"},
                   {"registry_test_zero", "/p/libbraid_registry_test_zero.so"}}));
  EXPECT_EQ(r.StrategiesProviding("zero1"),
            (Pairs{{"registry_test_zero", "/p/libbraid_registry_test_zero.so"}}));
  EXPECT_TRUE(r.StrategiesProviding("registry_test_no_such_feature").empty());

  // A failed registration declares nothing: the first one's traits stay.
  EXPECT_FALSE(r.AddStrategy("registry_test_zero", NoStrategy, "elsewhere",
                             StrategyTraits{{"zero3"}})
                   .ok());
  EXPECT_TRUE(r.StrategiesProviding("zero3").empty());
}

// Inside a plugin's register call, traits given without an origin are attributed to the plugin.
TEST(RegistryStrategies, TraitsWithoutOriginAreThePlugins) {
  Registry& r = Registry::Get();
  r.BeginPluginRegistration("/q/libbraid_registry_test_scoped.so");
  absl::Status s =
      r.AddStrategy("registry_test_scoped", NoStrategy, StrategyTraits{{"registry_test_f"}});
  EXPECT_TRUE(r.EndPluginRegistration().empty());
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(r.StrategiesProviding("registry_test_f"),
            (std::vector<std::pair<std::string, std::string>>{
                {"registry_test_scoped", "/q/libbraid_registry_test_scoped.so"}}));
}

}  // namespace
}  // namespace braid
