// The strategy side of validation (launcher/config/config_strategy.cc): feature sections against the
// strategies that provide them, the parallel layout against the processes, the composer's answer
// (a double of launcher/compose.h here) as a problem of the config. The rest of validation is in
// config_validate_test.cc, parsing in config_test.cc.
#include "launcher/config/config.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "launcher/config/config_test_util.h"
#include "core/registry.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace braid::config {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using test_util::ComposeDouble;
using test_util::Text;
using test_util::Validate;
using test_util::ValidationError;

TEST(ConfigValidate, FeatureSectionsNeedAStrategyThatProvidesThem) {
  // No registered strategy provides these: the message says so, in one problem.
  const std::pair<const char*, const char*> cases[] = {
      {"fp16 { enabled: true }", "fp16 needs a strategy that provides \"fp16\""},
      {"bf16 { enabled: true }", "bf16 needs a strategy that provides \"bf16\""},
      {"zero_optimization { stage: 1 }",
       "zero_optimization (stage 1) needs a strategy that provides \"zero1\""},
  };
  for (const auto& [text, expected] : cases) {
    EXPECT_THAT(ValidationError(text),
                AllOf(HasSubstr(expected), HasSubstr("strategy \"single\" does not"),
                      HasSubstr("and no registered strategy does: it is not available yet"),
                      Not(HasSubstr("problems"))))
        << text;
    // Another feature does not help.
    EXPECT_THAT(ValidationError(text, 1, {"something_else"}), HasSubstr(expected)) << text;
  }
  EXPECT_EQ(ValidationError("fp16 { enabled: true }", 1, {kFeatureFp16}), "");
  EXPECT_EQ(ValidationError("bf16 { enabled: true }", 1, {kFeatureBf16}), "");
  EXPECT_EQ(ValidationError("zero_optimization { stage: 2 } strategy { name: \"zero\" }", 2,
                            {ZeroFeatureName(2)}),
            "");
  // One stage does not imply another. A registered strategy that provides the feature is named,
  // with its plugin's file.
  EXPECT_EQ(ValidationError("zero_optimization { stage: 3 }", 1, {ZeroFeatureName(2)}),
            "zero_optimization (stage 3) needs a strategy that provides \"zero3\"; strategy "
            "\"single\" does not; use strategy.name \"test_zero\" (plugin libbraid_test_zero.so)");
  EXPECT_THAT(ValidationError("zero_optimization { stage: 2 }", 2),
              HasSubstr("strategy \"ddp\" does not; use strategy.name \"test_zero\""));
  // Disabled or stage 0 sections need nothing.
  EXPECT_EQ(ValidationError("fp16 { enabled: false loss_scale: 128 } bf16 { enabled: false } "
                            "zero_optimization { stage: 0 }"),
            "");
  EXPECT_THAT(ValidationError("zero_optimization { stage: 4 }"),
              HasSubstr("zero_optimization.stage (4) must be 0, 1, 2 or 3"));
  EXPECT_THAT(ValidationError("fp16 { enabled: true } bf16 { enabled: true }", 1,
                              {kFeatureFp16, kFeatureBf16}),
              HasSubstr("enable at most one"));

  TrainConfig cfg = Text("fp16 { enabled: true initial_scale_power: 12 }");
  ASSERT_TRUE(Validate(&cfg, 1, {kFeatureFp16}).ok());
  EXPECT_EQ(cfg.fp16().initial_scale_power(), 12);
  EXPECT_DOUBLE_EQ(cfg.fp16().loss_scale(), 0.0);  // dynamic, DeepSpeed's default
  EXPECT_EQ(cfg.fp16().hysteresis(), 2);
  EXPECT_TRUE(cfg.fp16().has_consecutive_hysteresis());  // filled in: false, DeepSpeed's default
  EXPECT_FALSE(cfg.fp16().consecutive_hysteresis());
  auto json = ParseJsonConfig(R"({"fp16": {"enabled": true, "loss_scale": 0, "hysteresis": 3,
      "consecutive_hysteresis": true, "min_loss_scale": 1}})", "ds.json");
  ASSERT_TRUE(json.ok()) << json.status();
  ASSERT_TRUE(Validate(&*json, 1, {kFeatureFp16}).ok());
  EXPECT_TRUE(json->fp16().consecutive_hysteresis());
  EXPECT_EQ(json->fp16().hysteresis(), 3);
}

TEST(ConfigValidate, RequestedFeatures) {
  EXPECT_TRUE(RequestedFeatures(Text("fp16 { enabled: false } zero_optimization { stage: 0 }"))
                  .empty());
  // activation_checkpointing is not a strategy feature (the training program applies it).
  EXPECT_EQ(RequestedFeatures(Text("fp16 { enabled: true } bf16 { enabled: true } "
                                   "zero_optimization { stage: 3 } activation_checkpointing {}")),
            (std::vector<std::string>{"fp16", "bf16", "zero3"}));
  EXPECT_TRUE(RequestedFeatures(Text("activation_checkpointing { policy: \"every_block\" }")).empty());
}

// The training program's way: the catalog loads the chosen strategy, and every plugin when a
// feature is missing.
TEST(ConfigValidate, CatalogIsAskedOnlyForFeaturesWithTheFinalStrategyName) {
  std::vector<std::string> asked_features_of, asked_providers_of;
  StrategyCatalog catalog;
  catalog.features_of = [&](const std::string& name) -> absl::StatusOr<std::vector<std::string>> {
    asked_features_of.push_back(name);
    if (name == "broken") return absl::NotFoundError("plugin 'broken' not found: looked for ...");
    return std::vector<std::string>{"fp16"};
  };
  catalog.providers_of = [&](const std::string& feature) {
    asked_providers_of.push_back(feature);
    FeatureProviders found;
    if (feature == "zero2") {
      found.strategies = {{"zero", "/p/libbraid_zero.so"}, {"fsdp", "built-in"}};
    }
    found.unloadable = {"cannot load plugin /p/libbraid_junk.so: dlopen failed: not an ELF file"};
    return found;
  };
  catalog.searched = "strategy in the plugins on the search path";
  catalog.compose = [](int t, int p, int d, const std::string& named, const std::vector<std::string>&) -> absl::StatusOr<std::string> {
    return ComposeDouble(t, p, d, named);
  };
  auto validate = [&](const std::string& text, int dp) {
    TrainConfig cfg = Text(text);
    absl::Status st = ValidateConfigWith(&cfg, dp, catalog);
    return st.ok() ? "" : std::string(st.message());
  };

  // No feature section: nothing is loaded (so --print_config needs no plugin).
  EXPECT_EQ(validate("steps: 3", 1), "");
  EXPECT_TRUE(asked_features_of.empty());

  // Asked once, with the default name filled in.
  EXPECT_EQ(validate("fp16 { enabled: true }", 2), "");
  EXPECT_EQ(asked_features_of, std::vector<std::string>{"ddp"});
  EXPECT_TRUE(asked_providers_of.empty());

  // Two providers, and the files that could not be loaded while looking, on one line.
  std::string zero = validate("zero_optimization { stage: 2 } fp16 { enabled: true }", 1);
  EXPECT_EQ(zero,
            "zero_optimization (stage 2) needs a strategy that provides \"zero2\"; strategy "
            "\"single\" does not; use strategy.name \"zero\" (plugin libbraid_zero.so) or "
            "\"fsdp\" (built-in) (plugin files that could not be loaded while looking: cannot "
            "load plugin /p/libbraid_junk.so: dlopen failed: not an ELF file)");
  EXPECT_EQ(asked_providers_of, std::vector<std::string>{"zero2"});

  EXPECT_THAT(validate("bf16 { enabled: true }", 1),
              HasSubstr("bf16 needs a strategy that provides \"bf16\"; strategy \"single\" does "
                        "not, and no strategy in the plugins on the search path does: it is not "
                        "available yet"));

  // A strategy that cannot be loaded is one problem, whatever the number of sections.
  EXPECT_EQ(validate("strategy { name: \"broken\" } fp16 { enabled: true } "
                     "activation_checkpointing {}",
                     1),
            "strategy.name \"broken\" (needed to check fp16): plugin 'broken' not found: looked "
            "for ...");
}

TEST(ConfigValidate, Strategy) {
  // No strategy named: one process trains alone, several data-parallel with ddp.
  for (auto [dp, want] : {std::pair<int, const char*>{1, "single"}, {2, "ddp"}, {3, "ddp"}}) {
    TrainConfig cfg;
    ASSERT_TRUE(Validate(&cfg, dp, {}).ok());
    EXPECT_EQ(cfg.strategy().name(), want) << "data-parallel size " << dp;
  }
  EXPECT_EQ(ValidationError("strategy { name: \"ddp\" }", 2), "");
  EXPECT_THAT(ValidationError("strategy { path: \"/p/libx.so\" }"),
              AllOf(HasSubstr("strategy.path (\"/p/libx.so\")"), HasSubstr("strategy.name")));
  EXPECT_EQ(ValidationError("strategy { name: \"mine\" path: \"/p/libx.so\" }"), "");
}

// The parallel section against the number of processes: data derived, the data-parallel size
// it gives used for the batch, pipeline > 1 choosing the pipeline strategy with its stage count,
// and every impossible layout one line naming the sizes.
TEST(ConfigValidate, ParallelLayout) {
  TrainConfig cfg = Text("parallel { tensor: 2 pipeline: 2 } train_micro_batch_size_per_gpu: 4 "
                         "gradient_accumulation_steps: 2");
  ASSERT_TRUE(Validate(&cfg, 8, {}).ok());
  EXPECT_EQ(cfg.parallel().data(), 2);
  EXPECT_EQ(cfg.train_batch_size(), 4 * 2 * 2);  // data-parallel size 2, not 8 processes
  // The data-axis layer under the pipeline: the default for 2 data-parallel ranks.
  EXPECT_EQ(cfg.strategy().name(), "ddp");
  // The strategy's options pass on as written: the stage count is the mesh's, not an option.
  EXPECT_TRUE(cfg.strategy().options().empty());

  TrainConfig tp = Text("parallel { tensor: 2 }");
  ASSERT_TRUE(Validate(&tp, 2, {}).ok());
  EXPECT_EQ(tp.strategy().name(), "single");  // one data-parallel replica
  EXPECT_EQ(tp.parallel().pipeline(), 1);

  EXPECT_THAT(ValidationError("parallel { tensor: 2 pipeline: 2 data: 2 }", 2),
              HasSubstr("parallel layout tensor 2 x pipeline 2 x data 2 = 8 ranks, but there are "
                        "2 processes"));
  EXPECT_THAT(ValidationError("parallel { tensor: 3 }", 4),
              HasSubstr("parallel.tensor (3) x parallel.pipeline (1) = 3 does not divide the 4 "
                        "processes"));
  EXPECT_THAT(ValidationError("parallel { tensor: 0 }", 2), HasSubstr("parallel.tensor (0)"));
  EXPECT_THAT(ValidationError("parallel { sequence_parallel: true }", 2),
              HasSubstr("parallel.sequence_parallel splits activations"));
  // Which layers serve the layout is the composer's answer, reported as a problem of the config.
  TrainConfig refused = Text("parallel { pipeline: 2 } strategy { name: \"mine\" }");
  StrategyCatalog catalog;
  catalog.compose = [](int t, int p, int d, const std::string& named, const std::vector<std::string>&) -> absl::StatusOr<std::string> {
    return absl::InvalidArgumentError(absl::StrCat("layers \"pipeline\" and \"", named, "\" do not stack (",
                                                   t, "x", p, "x", d, ")"));
  };
  EXPECT_EQ(ValidateConfigWith(&refused, 4, catalog).message(),
            "layers \"pipeline\" and \"mine\" do not stack (1x2x2)");
  // ZeRO-3 under tensor parallelism: the slices are sharded over the data axis.
  EXPECT_EQ(ValidationError("parallel { tensor: 2 } strategy { name: \"zero\" } "
                            "zero_optimization { stage: 3 }", 2, {"zero3"}),
            "");
  EXPECT_THAT(ValidationError("parallel { tensor: 2 } bf16 { enabled: true }", 2, {kFeatureBf16}),
              HasSubstr("bf16.enabled with parallel.tensor > 1 is not supported yet"));
  // ZeRO-3 under the pipeline (its data axis is the zero layer's), and half precision: the
  // stages exchange activations in the model's dtype.
  EXPECT_EQ(ValidationError("parallel { pipeline: 2 } zero_optimization { stage: 3 }", 4, {"zero3"}), "");
  EXPECT_EQ(ValidationError("parallel { pipeline: 2 } fp16 { enabled: true }", 2, {kFeatureFp16}), "");
  EXPECT_EQ(ValidationError("parallel { pipeline: 2 } bf16 { enabled: true }", 2, {kFeatureBf16}), "");
}

// DeepSpeed's communication_data_type: "fp32" or the precision's own name, under fp16/bf16, and
// f32 reduction by DDP only.
TEST(ConfigValidate, CommunicationDataType) {
  EXPECT_EQ(ValidationError("bf16 { enabled: true } communication_data_type: \"fp32\" "
                            "strategy { name: \"ddp\" }", 2, {kFeatureBf16, kFeatureCommFp32}),
            "");
  EXPECT_EQ(ValidationError("fp16 { enabled: true } communication_data_type: \"fp16\"", 1,
                            {kFeatureFp16}),
            "");
  EXPECT_THAT(ValidationError("bf16 { enabled: true } communication_data_type: \"fp8\"", 1,
                              {kFeatureBf16}),
              HasSubstr("communication_data_type \"fp8\" is unknown; known: \"fp32\", \"bf16\""));
  EXPECT_THAT(ValidationError("communication_data_type: \"fp32\""),
              HasSubstr("applies under fp16 or bf16 only"));
  EXPECT_THAT(ValidationError("bf16 { enabled: true } communication_data_type: \"fp32\" "
                              "strategy { name: \"zero\" } zero_optimization { stage: 1 }",
                              2, {kFeatureBf16, "zero1"}),
              HasSubstr("communication_data_type \"fp32\" needs a strategy that provides "
                        "\"communication_data_type\"; strategy \"zero\" does not"));
}

// DeepSpeed's offload sections: the devices Braid has; pin_memory accepted with a note on a CPU
// run (it only speeds host-GPU copies) and honoured on a GPU (the zero strategy pins there);
// offload_param only at stage 3.
TEST(ConfigValidate, ZeroOffload) {
  for (const char* field : {"offload_optimizer", "offload_param"}) {
    const std::string stage = std::string(field) == "offload_param" ? "stage: 3 " : "";
    const std::vector<std::string> features = stage.empty() ? std::vector<std::string>{}
                                                             : std::vector<std::string>{"zero3"};
    EXPECT_EQ(ValidationError(absl::StrCat("zero_optimization { ", stage, field, " { device: \"cpu\" "
                                           "pin_memory: false } }"), 1, features),
              "")
        << field;
    TrainConfig pinned = Text(absl::StrCat("zero_optimization { ", stage, field, " { device: \"cpu\" "
                                           "pin_memory: true } }"));
    ASSERT_TRUE(Validate(&pinned, 1, features).ok()) << field;
    EXPECT_THAT(ConfigNotes(pinned),
                ::testing::Contains(absl::StrCat("zero_optimization.", field,
                                                 ".pin_memory: no effect on a CPU run (page-locked "
                                                 "memory only speeds copies between the host and a GPU)")));
    TrainConfig on_gpu = Text(absl::StrCat("device: \"cuda\" zero_optimization { ", stage, field,
                                           " { device: \"cpu\" pin_memory: true } }"));
    ASSERT_TRUE(Validate(&on_gpu, 1, features).ok()) << field;
    for (const std::string& note : ConfigNotes(on_gpu)) {
      EXPECT_THAT(note, ::testing::Not(HasSubstr("pin_memory"))) << "honoured on a GPU: no note";
    }
    EXPECT_THAT(ValidationError(absl::StrCat("zero_optimization { ", field, " { device: \"nvme\" } }")),
                HasSubstr("(Braid has no NVMe offload)"));
  }
  EXPECT_THAT(ValidationError("zero_optimization { stage: 2 offload_param { device: \"cpu\" } }", 1,
                              {"zero2"}),
              HasSubstr("zero_optimization.offload_param needs stage 3 (stage 2 keeps full "
                        "parameters on every rank)"));
  TrainConfig alone = Text("zero_optimization { stage: 3 offload_param { device: \"cpu\" } }");
  ASSERT_TRUE(Validate(&alone, 1, {"zero3"}).ok());
  EXPECT_THAT(ConfigNotes(alone),
              ::testing::Contains(HasSubstr("zero_optimization.offload_param: the optimizer steps "
                                            "the offloaded shards on the host")));
  auto json = ParseJsonConfig(R"({"zero_optimization": {"stage": 0,
      "offload_optimizer": {"device": "cpu", "pin_memory": true}}})", "ds.json");
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_TRUE(Validate(&*json, 1, {}).ok());
  EXPECT_THAT(json->ignored_fields(), ::testing::Contains("zero_optimization.offload_optimizer.pin_memory"));
}

}  // namespace
}  // namespace braid::config
