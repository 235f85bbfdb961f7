// DeepSpeed configs as people write them: DeepSpeed's optimizer and scheduler names with their
// params and defaults, the names Braid refuses with the nearest equivalent, and JSON "auto"
// values resolved as Hugging Face's integration does, each reported by ConfigNotes.
#include <string>
#include <vector>

#include "launcher/config/config.h"
#include "launcher/config/config_test_util.h"
#include "core/registry.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace braid::config {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using test_util::Text;

absl::Status Validate(TrainConfig* cfg, int dp = 1) {
  StrategyCatalog catalog;
  catalog.features_of = [](const std::string&) { return std::vector<std::string>{}; };
  catalog.compose = [](int, int, int d, const std::string& named, const std::vector<std::string>&) -> absl::StatusOr<std::string> {
    return named.empty() ? std::string(d > 1 ? "ddp" : "single") : named;
  };
  return ValidateConfigWith(cfg, dp, catalog);
}

std::string ValidationError(const std::string& text) {
  TrainConfig cfg = Text(text);
  absl::Status st = Validate(&cfg);
  return st.ok() ? "" : std::string(st.message());
}

TrainConfig Json(const std::string& json) {
  absl::StatusOr<TrainConfig> cfg = ParseJsonConfig(json, "ds.json");
  EXPECT_TRUE(cfg.ok()) << cfg.status();
  return cfg.ok() ? *cfg : TrainConfig();
}

// ---- Optimizers ------------------------------------------------------------------------------

TEST(DeepSpeedOptimizer, AdamTakesDeepSpeedsDefaults) {
  TrainConfig cfg = Text("optimizer { type: \"adam\" }");
  ASSERT_TRUE(Validate(&cfg).ok());
  const OptimizerParams& p = cfg.optimizer().params();
  EXPECT_EQ(cfg.optimizer().type(), "Adam");
  EXPECT_THAT(p.betas(), ElementsAre(0.9, 0.999));
  EXPECT_DOUBLE_EQ(p.eps(), 1e-8);
  EXPECT_DOUBLE_EQ(p.weight_decay(), 0.0);
  EXPECT_TRUE(p.adam_w_mode());
  // AdamW keeps Braid's (GPT training's) defaults.
  cfg = Text("optimizer { type: \"AdamW\" params { torch_adam: true } }");
  ASSERT_TRUE(Validate(&cfg).ok());
  EXPECT_THAT(cfg.optimizer().params().betas(), ElementsAre(0.9, 0.95));
  EXPECT_DOUBLE_EQ(cfg.optimizer().params().weight_decay(), 0.1);
}

TEST(DeepSpeedOptimizer, AdamSwitchesThatWouldTrainAnotherJobAreRefused) {
  EXPECT_THAT(ValidationError("optimizer { type: \"AdamW\" params { adam_w_mode: false } }"),
              AllOf(HasSubstr("optimizer.params.adam_w_mode false contradicts"),
                    HasSubstr("optimizer.type \"Adam\" with adam_w_mode false")));
  EXPECT_THAT(ValidationError("optimizer { type: \"Adam\" params { bias_correction: false } }"),
              HasSubstr("optimizer.params.bias_correction false"));
  EXPECT_EQ(ValidationError("optimizer { type: \"Adam\" params { adam_w_mode: false "
                            "bias_correction: true torch_adam: false } }"),
            "");
  EXPECT_THAT(ValidationError("optimizer { type: \"SGD\" params { adam_w_mode: true } }"),
              HasSubstr("optimizer.params.adam_w_mode applies to Adam and AdamW only"));
}

TEST(DeepSpeedOptimizer, SgdDampeningAndNesterov) {
  TrainConfig cfg = Text("optimizer { type: \"sgd\" params { momentum: 0.9 dampening: 0.1 } }");
  ASSERT_TRUE(Validate(&cfg).ok());
  EXPECT_DOUBLE_EQ(cfg.optimizer().params().dampening(), 0.1);
  EXPECT_THAT(ValidationError("optimizer { type: \"SGD\" params { momentum: 0.9 dampening: 0.1 "
                              "nesterov: true } }"),
              HasSubstr("optimizer.params.nesterov needs optimizer.params.dampening 0"));
  EXPECT_THAT(ValidationError("optimizer { type: \"SGD\" params { dampening: 1.5 } }"),
              HasSubstr("optimizer.params.dampening (1.5)"));
}

TEST(DeepSpeedOptimizer, NamesBraidLacksAreRefusedWithTheNearest) {
  const std::pair<const char*, const char*> cases[] = {
      {"Lamb", "\"AdamW\""},        {"lamb", "\"AdamW\""},     {"OneBitAdam", "\"Adam\""},
      {"ZeroOneAdam", "\"Adam\""},  {"OneBitLamb", "\"AdamW\""}, {"Lion", "\"AdamW\""},
      {"MuSGD", "\"SGD\""},         {"Adagrad", "\"Adam\""},
  };
  for (const auto& [name, nearest] : cases) {
    EXPECT_THAT(ValidationError(absl::StrCat("optimizer { type: \"", name, "\" }")),
                AllOf(HasSubstr(absl::StrCat("optimizer.type \"", name,
                                             "\" is a DeepSpeed optimizer Braid does not have")),
                      HasSubstr(absl::StrCat("use ", nearest, ", the nearest"))))
        << name;
  }
}

TEST(DeepSpeedOptimizer, TheTrainingProgramCanTellDeepSpeedNamesFromTypos) {
  EXPECT_TRUE(IsDeepSpeedOptimizerBraidLacks("Lamb"));
  EXPECT_TRUE(IsDeepSpeedOptimizerBraidLacks("onebitadam"));
  EXPECT_FALSE(IsDeepSpeedOptimizerBraidLacks("Adam"));
  EXPECT_FALSE(IsDeepSpeedOptimizerBraidLacks("Lamb2"));
}

// ---- Schedulers ------------------------------------------------------------------------------

TEST(DeepSpeedScheduler, WarmupLRDefaultsAreDeepSpeedsAndThePeakIsTheOptimizersRate) {
  TrainConfig cfg = Text(R"pb(optimizer { params { lr: 3e-4 } }
                              scheduler { type: "warmuplr" })pb");
  ASSERT_TRUE(Validate(&cfg).ok());
  const SchedulerParams& p = cfg.scheduler().params();
  EXPECT_EQ(cfg.scheduler().type(), "WarmupLR");
  EXPECT_EQ(p.warmup_num_steps(), 1000);
  EXPECT_EQ(p.warmup_type(), "log");
  EXPECT_DOUBLE_EQ(p.warmup_min_lr(), 0.0);
  EXPECT_DOUBLE_EQ(p.warmup_max_lr(), 3e-4);
  // The peak alone sets the optimizer's rate; two different numbers are refused.
  cfg = Text("scheduler { type: \"WarmupDecayLR\" params { warmup_max_lr: 5e-4 "
             "warmup_num_steps: 10 } }");
  ASSERT_TRUE(Validate(&cfg).ok());
  EXPECT_DOUBLE_EQ(cfg.optimizer().params().lr(), 5e-4);
  EXPECT_EQ(cfg.scheduler().params().total_num_steps(), 200);  // steps
  EXPECT_THAT(ValidationError("optimizer { params { lr: 1e-3 } } scheduler { type: \"WarmupLR\" "
                              "params { warmup_max_lr: 3e-4 } }"),
              HasSubstr("scheduler.params.warmup_max_lr (0.0003) != optimizer.params.lr (0.001)"));
}

TEST(DeepSpeedScheduler, WrongOrMissingParamsNameTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {"scheduler { type: \"WarmupLR\" params { warmup_type: \"cosine\" } }",
       "scheduler.params.warmup_type \"cosine\" is unknown; known: log, linear"},
      {"scheduler { type: \"WarmupLR\" params { warmup_num_steps: -1 } }",
       "scheduler.params.warmup_num_steps (-1) must be >= 0"},
      {"scheduler { type: \"WarmupLR\" params { warmup_min_lr: 0.5 } }",
       "scheduler.params.warmup_min_lr (0.5) > the peak rate"},
      {"steps: 100 scheduler { type: \"WarmupDecayLR\" params { warmup_num_steps: 100 } }",
       "scheduler.params.total_num_steps (100) must be > the warm-up's 100 steps"},
      {"scheduler { type: \"WarmupCosineLR\" params { warmup_num_steps: 10 total_num_steps: 2 "
       "} }",
       "scheduler.params.total_num_steps (2) must be > the warm-up's 10 steps"},
      {"scheduler { type: \"WarmupCosineLR\" params { warmup_num_steps: 10 cos_min_ratio: 2 } }",
       "scheduler.params.cos_min_ratio (2) must be in [0, 1]"},
      {"scheduler { type: \"OneCycle\" params { cycle_max_lr: 1e-3 cycle_momentum: false } }",
       "scheduler.params.cycle_min_lr is required by OneCycle"},
      {"scheduler { type: \"OneCycle\" params { cycle_min_lr: 1e-4 cycle_max_lr: 1e-3 "
       "cycle_min_mom: 0.9 cycle_max_mom: 0.8 } }",
       "scheduler.params.cycle_min_mom (0.9) and cycle_max_mom (0.8) must satisfy 0 <= "
       "cycle_min_mom <= cycle_max_mom < 1"},
      {"steps: 100 scheduler { type: \"OneCycle\" params { cycle_min_lr: 1e-4 cycle_max_lr: 1e-3 "
       "cycle_first_step_size: 10 decay_step_size: 10 decay_mom_rate: 0.2 } }",
       "scheduler.params.decay_mom_rate (0.2) grows beta1 to 2.34 by step 100; Adam needs "
       "beta1 < 1"},
      {"scheduler { type: \"OneCycle\" params { cycle_min_lr: 1e-4 cycle_max_lr: 1e-3 "
       "cycle_momentum: false cycle_first_step_size: 0 } }",
       "scheduler.params.cycle_first_step_size (0) must be >= 1"},
      {"scheduler { type: \"LRRangeTest\" params { lr_range_test_step_size: 0 } }",
       "scheduler.params.lr_range_test_step_size (0) must be >= 1"},
      {"scheduler { type: \"LRRangeTest\" params { warmup_num_steps: 5 } }",
       "scheduler.params.warmup_num_steps applies to scheduler.type"},
      {"scheduler { type: \"WarmupLR\" params { total_num_steps: 5 } }",
       "scheduler.params.total_num_steps applies to scheduler.type \"WarmupCosine\", "
       "\"WarmupDecayLR\" and \"WarmupCosineLR\" only (the type is \"WarmupLR\")"},
  };
  for (const auto& [text, expected] : cases) {
    EXPECT_THAT(ValidationError(text), HasSubstr(expected)) << text;
  }
}

TEST(DeepSpeedScheduler, OneCycleAndLRRangeTestDefaults) {
  TrainConfig cfg = Text(R"pb(scheduler {
                                type: "OneCycle"
                                params {
                                  cycle_min_lr: 1e-4
                                  cycle_max_lr: 1e-3
                                  cycle_first_step_size: 50
                                  cycle_momentum: false
                                }
                              })pb");
  ASSERT_TRUE(Validate(&cfg).ok());
  const SchedulerParams& p = cfg.scheduler().params();
  EXPECT_EQ(p.cycle_second_step_size(), 50);  // DeepSpeed: the first's
  EXPECT_FALSE(p.cycle_momentum());            // as the config says
  EXPECT_DOUBLE_EQ(p.cycle_min_mom(), 0.8);    // DeepSpeed's defaults
  EXPECT_DOUBLE_EQ(p.cycle_max_mom(), 0.9);
  EXPECT_EQ(p.decay_step_size(), 0);
  EXPECT_DOUBLE_EQ(p.decay_lr_rate(), 0.0);
  cfg = Text("scheduler { type: \"lrrangetest\" }");
  ASSERT_TRUE(Validate(&cfg).ok());
  EXPECT_EQ(cfg.scheduler().type(), "LRRangeTest");
  EXPECT_DOUBLE_EQ(cfg.scheduler().params().lr_range_test_min_lr(), 1e-3);
  EXPECT_EQ(cfg.scheduler().params().lr_range_test_step_size(), 2000);
  EXPECT_DOUBLE_EQ(cfg.scheduler().params().lr_range_test_step_rate(), 1.0);
}

// ---- "auto" ----------------------------------------------------------------------------------

// The shape of Hugging Face's ZeRO-2 test config: "auto" nearly everywhere.
constexpr char kHuggingFaceJson[] = R"({
  "fp16": {"enabled": "auto"},
  "bf16": {"enabled": "auto"},
  "optimizer": {
    "type": "AdamW",
    "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}
  },
  "scheduler": {
    "type": "WarmupDecayLR",
    "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
               "warmup_num_steps": "auto", "total_num_steps": "auto"}
  },
  "gradient_accumulation_steps": "auto",
  "gradient_clipping": "auto",
  "train_batch_size": "auto",
  "train_micro_batch_size_per_gpu": 4,
  "steps": 50
})";

TEST(AutoValues, ResolvedAsHuggingFaceDoesAndEachNoted) {
  TrainConfig cfg = Json(kHuggingFaceJson);
  EXPECT_THAT(cfg.auto_fields(),
              ElementsAre("bf16.enabled", "fp16.enabled", "gradient_accumulation_steps",
                          "gradient_clipping", "optimizer.params.betas", "optimizer.params.eps",
                          "optimizer.params.lr", "optimizer.params.weight_decay",
                          "scheduler.params.total_num_steps", "scheduler.params.warmup_max_lr",
                          "scheduler.params.warmup_min_lr", "scheduler.params.warmup_num_steps",
                          "train_batch_size"));
  ASSERT_TRUE(Validate(&cfg, 2).ok());
  EXPECT_EQ(cfg.gradient_accumulation_steps(), 1);
  EXPECT_EQ(cfg.train_batch_size(), 8);  // 4 × 1 × 2 ranks
  EXPECT_DOUBLE_EQ(cfg.gradient_clipping(), 1.0);
  EXPECT_DOUBLE_EQ(cfg.optimizer().params().lr(), 1e-3);
  EXPECT_THAT(cfg.optimizer().params().betas(), ElementsAre(0.9, 0.95));
  const SchedulerParams& s = cfg.scheduler().params();
  EXPECT_EQ(s.warmup_num_steps(), 0);
  EXPECT_EQ(s.total_num_steps(), 50);
  EXPECT_DOUBLE_EQ(s.warmup_max_lr(), 1e-3);
  EXPECT_FALSE(cfg.fp16().enabled());

  const std::vector<std::string> notes = ConfigNotes(cfg);
  ASSERT_EQ(notes.size(), 13u);
  EXPECT_THAT(notes, testing::Contains("gradient_clipping = 1 (\"auto\": 1.0, Hugging Face's "
                                       "max_grad_norm default)"));
  EXPECT_THAT(notes, testing::Contains(
                         "train_batch_size = 8 (\"auto\": train_micro_batch_size_per_gpu × "
                         "gradient_accumulation_steps × data-parallel size)"));
  EXPECT_THAT(notes, testing::Contains("optimizer.params.betas = [0.9, 0.95] (\"auto\": AdamW's "
                                       "default)"));
  EXPECT_THAT(notes, testing::Contains("scheduler.params.total_num_steps = 50 (\"auto\": steps)"));
  EXPECT_THAT(notes, testing::Contains(HasSubstr("scheduler.params.warmup_num_steps = 0")));
  // The printed config holds the resolved values (what --print_config shows).
  EXPECT_THAT(ConfigToText(cfg), AllOf(HasSubstr("gradient_clipping: 1"),
                                       HasSubstr("total_num_steps: 50")));
}

// fp16/bf16 "auto": Hugging Face's rule from the device's answer, which the training program
// gets from the device's backend (backends/cuda/device_check.h) and a test injects.
struct HalfAuto {
  TrainConfig cfg;
  std::string asked;  // the device the answer was asked for
};
HalfAuto ResolveHalf(const std::string& json, const HalfSupport* support) {
  HalfAuto out{Json(json), ""};
  StrategyCatalog catalog;
  catalog.features_of = [](const std::string&) {
    return std::vector<std::string>{kFeatureFp16, kFeatureBf16};
  };
  if (support != nullptr) {
    catalog.half_support = [&out, support](const std::string& device) {
      out.asked = device;
      return *support;
    };
  }
  absl::Status st = ValidateConfigWith(&out.cfg, 1, catalog);
  EXPECT_TRUE(st.ok()) << st;
  return out;
}

TEST(AutoValues, HalfPrecisionFollowsTheDevicesBackend) {
  constexpr char kBoth[] = R"({"fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"}})";
  // The CPU: off, whether or not a backend answers (the program's answer for a CPU is neither).
  const HalfSupport cpu{false, false};
  for (const HalfSupport* s : {static_cast<const HalfSupport*>(nullptr), &cpu}) {
    HalfAuto r = ResolveHalf(kBoth, s);
    EXPECT_FALSE(r.cfg.fp16().enabled());
    EXPECT_FALSE(r.cfg.bf16().enabled());
    EXPECT_THAT(ConfigNotes(r.cfg),
                testing::IsSupersetOf(
                    {"bf16.enabled = false (\"auto\": off on the CPU, as in Hugging Face's "
                     "integration (half precision only on a GPU))",
                     "fp16.enabled = false (\"auto\": off on the CPU, as in Hugging Face's "
                     "integration (half precision only on a GPU))"}));
    if (s != nullptr) {
      EXPECT_EQ(r.asked, "cpu");
    }
  }
  // A GPU with bf16 (Ampere and later): bf16, and fp16 stays off.
  const HalfSupport ampere{true, true};  // compute capability 8.0 and later
  HalfAuto r = ResolveHalf(R"({"device": "cuda:0", "fp16": {"enabled": "auto"},
                               "bf16": {"enabled": "auto"}})",
                           &ampere);
  EXPECT_EQ(r.asked, "cuda:0");
  EXPECT_TRUE(r.cfg.bf16().enabled());
  EXPECT_FALSE(r.cfg.fp16().enabled());
  EXPECT_THAT(ConfigNotes(r.cfg),
              testing::IsSupersetOf({"bf16.enabled = true (\"auto\": cuda:0 computes in bf16 (its "
                                     "backend's answer), preferred as in Hugging Face's "
                                     "integration)",
                                     "fp16.enabled = false (\"auto\": off: bf16 is on)"}));
  // --print_config prints the resolved config.
  EXPECT_THAT(ConfigToText(r.cfg), HasSubstr("bf16 {\n  enabled: true\n}"));
  // A GPU without bf16 (Turing): fp16 ("cuda" is asked as validation spells it, cuda:0).
  const HalfSupport turing{false, true};  // 7.5
  r = ResolveHalf(R"({"device": "cuda", "fp16": {"enabled": "auto"},
                      "bf16": {"enabled": "auto"}})",
                  &turing);
  EXPECT_TRUE(r.cfg.fp16().enabled());
  EXPECT_FALSE(r.cfg.bf16().enabled());
  EXPECT_THAT(ConfigNotes(r.cfg),
              testing::Contains("fp16.enabled = true (\"auto\": cuda:0 computes in fp16 but not bf16 "
                                "(its backend's answer), as Hugging Face's integration on such a "
                                "GPU)"));
  // A section given explicitly wins: "auto" yields to it.
  r = ResolveHalf(R"({"device": "cuda:1", "fp16": {"enabled": true},
                      "bf16": {"enabled": "auto"}})",
                  &ampere);
  EXPECT_TRUE(r.cfg.fp16().enabled());
  EXPECT_FALSE(r.cfg.bf16().enabled());
  r = ResolveHalf(R"({"device": "cuda:1", "fp16": {"enabled": "auto"}})", &ampere);
  EXPECT_TRUE(r.cfg.fp16().enabled());  // bf16 is not on offer in this config
}

TEST(AutoValues, ExplicitValuesWinAndStringsKeepAuto) {
  TrainConfig cfg = Json(R"({"optimizer": {"type": "Adam", "params": {"lr": "auto"}},
                             "scheduler": {"type": "WarmupLR",
                                           "params": {"warmup_max_lr": 2e-4}}})");
  ASSERT_TRUE(Validate(&cfg).ok());
  EXPECT_DOUBLE_EQ(cfg.optimizer().params().lr(), 2e-4);
  EXPECT_THAT(ConfigNotes(cfg),
              ElementsAre("optimizer.params.lr = 0.0002 (\"auto\": "
                          "scheduler.params.warmup_max_lr)"));
  // In a string field "auto" is a name like any other (and here an unknown one).
  cfg = Json(R"({"device": "auto", "steps": "auto"})");
  EXPECT_THAT(cfg.auto_fields(), ElementsAre("steps"));
  absl::Status st = Validate(&cfg);
  EXPECT_THAT(std::string(st.message()), HasSubstr("device \"auto\" is unknown"));
  // Without "auto" nothing is noted, and a config without it is read as it always was.
  cfg = Json(R"({"steps": 3})");
  ASSERT_TRUE(Validate(&cfg).ok());
  EXPECT_TRUE(ConfigNotes(cfg).empty());
}

TEST(AutoValues, ErrorsStillNameTheFileAndPosition) {
  absl::StatusOr<TrainConfig> cfg =
      ParseJsonConfig("{\n  \"steps\": \"auto\",\n  \"bogus\": 1\n}", "ds.json");
  ASSERT_FALSE(cfg.ok());
  EXPECT_THAT(std::string(cfg.status().message()),
              AllOf(HasSubstr("ds.json:3:3:"), HasSubstr("unknown field \"bogus\"")));
  cfg = ParseJsonConfig(R"({"optimizer": {"params": {"lr": "fast", "eps": "auto"}}})", "ds.json");
  ASSERT_FALSE(cfg.ok());
  EXPECT_THAT(std::string(cfg.status().message()),
              AllOf(HasSubstr("optimizer.params.lr"), Not(HasSubstr("eps"))));
}


// ---- DeepSpeed's own keys, and every problem at once -----------------------------------------

TEST(DeepSpeedKeys, TuningKeysAreAcceptedWithANoteAndLegacySpellingsMapped) {
  TrainConfig cfg = Json(R"({
    "wall_clock_breakdown": false,
    "steps_per_print": 25,
    "zero_allow_untested_optimizer": true,
    "fp16": {"enabled": false, "fp16_master_weights_and_grads": false},
    "zero_optimization": {"stage": 0, "sub_group_size": 1e9, "round_robin_gradients": true,
                          "stage3_max_live_parameters": 1e9, "cpu_offload": true}
  })");
  EXPECT_EQ(cfg.log().print_every(), 25);
  EXPECT_EQ(cfg.zero_optimization().offload_optimizer().device(), "cpu");
  EXPECT_FALSE(cfg.wall_clock_breakdown());  // a field of its own, no note
  const std::vector<std::string> notes = ConfigNotes(cfg);
  EXPECT_EQ(notes.size(), 7u);
  EXPECT_THAT(notes, testing::Contains(HasSubstr(
                         "zero_optimization.sub_group_size: accepted, no effect in Braid (")));
  EXPECT_THAT(notes, testing::Contains("steps_per_print: read as log.print_every"));
  EXPECT_THAT(notes, testing::Contains(HasSubstr("zero_optimization.cpu_offload: read as "
                                                 "zero_optimization.offload_optimizer.device")));
  EXPECT_THAT(notes, testing::Contains("fp16.fp16_master_weights_and_grads: false, Braid's "
                                       "behaviour"));
  // An explicit log.print_every wins over steps_per_print.
  cfg = Json(R"({"steps_per_print": 25, "log": {"print_every": 5}})");
  EXPECT_EQ(cfg.log().print_every(), 5);
}

// data_types.grad_accum_dtype against what Braid does (it accumulates micro-batch gradients in
// the parameters' dtype and up-casts them into the f32 masters once per step): the parameters'
// dtype is accepted, "fp32" over one micro-batch too (nothing is accumulated), and every value
// asking for another accumulation is refused at its position, naming the nearest setting.
TEST(DeepSpeedKeys, GradAccumDtypeIsCheckedAgainstTheDtypeBraidAccumulatesIn) {
  struct Case {
    const char* sections;  // besides data_types
    const char* dtype;
    const char* want;  // the note's text when accepted, else the problem's
    bool accepted;
  };
  const Case cases[] = {
      {R"("bf16": {"enabled": true}, "gradient_accumulation_steps": 4)", "bf16",
       "data_types.grad_accum_dtype: \"bf16\", the parameters' dtype, which Braid accumulates "
       "micro-batch gradients in",
       true},
      {R"("gradient_accumulation_steps": 4)", "fp32",
       "data_types.grad_accum_dtype: \"fp32\", the parameters' dtype", true},
      {R"("fp16": {"enabled": true}, "gradient_accumulation_steps": 1)", "fp32",
       "data_types.grad_accum_dtype: \"fp32\", one micro-batch per step, so nothing is "
       "accumulated; its fp16 gradients are up-cast into the f32 masters once",
       true},
      {R"("bf16": {"enabled": true}, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4)",
       "fp32",
       "ds.json:1:17: data_types.grad_accum_dtype \"fp32\": Braid accumulates the bf16 gradients of "
       "the 4 micro-batches of a step in bf16 (the parameters' dtype) and up-casts them into the "
       "f32 masters once per step, not in an f32 buffer; nearest: gradient_accumulation_steps 1 "
       "with a 4x larger train_micro_batch_size_per_gpu (nothing accumulated), or "
       "data_types.grad_accum_dtype \"bf16\"",
       false},
      {R"("gradient_accumulation_steps": 2)", "bf16",
       "ds.json:1:17: data_types.grad_accum_dtype \"bf16\": the parameters are fp32 and Braid "
       "accumulates gradients in the parameters' dtype; nearest: bf16 { enabled: true } (bf16 "
       "parameters and gradients, f32 masters)",
       false},
      {R"("fp16": {"enabled": true})", "bf16",
       "ds.json:1:17: data_types.grad_accum_dtype \"bf16\": the parameters are fp16 and Braid "
       "accumulates gradients in the parameters' dtype; nearest: data_types.grad_accum_dtype "
       "\"fp16\"",
       false},
      {"", "fp8",
       "ds.json:1:17: data_types.grad_accum_dtype \"fp8\" is not a dtype gradients are accumulated "
       "in; use \"fp32\", \"bf16\" or \"fp16\" (Braid accumulates in the parameters' dtype, "
       "here \"fp32\")",
       false},
  };
  ReadOptions defer;
  defer.defer_to_validation = true;
  for (const Case& k : cases) {
    const std::string json = absl::StrCat(R"({"data_types": {"grad_accum_dtype": ")", k.dtype, "\"}",
                                          *k.sections ? ", " : "", k.sections, "}");
    SCOPED_TRACE(json);
    absl::StatusOr<TrainConfig> cfg = ParseJsonConfig(json, "ds.json", defer);
    ASSERT_TRUE(cfg.ok()) << cfg.status();
    StrategyCatalog catalog;  // a strategy that keeps half parameters
    catalog.features_of = [](const std::string&) {
      return std::vector<std::string>{kFeatureBf16, kFeatureFp16};
    };
    absl::Status st = ValidateConfigWith(&*cfg, 1, catalog);
    if (k.accepted) {
      ASSERT_TRUE(st.ok()) << st;
      EXPECT_THAT(ConfigNotes(*cfg), testing::Contains(HasSubstr(k.want)));
    } else {
      EXPECT_EQ(std::string(st.message()), k.want);
    }
  }
  // Not a string: the reader's problem, with the values it takes.
  absl::StatusOr<TrainConfig> number =
      ParseJsonConfig(R"({"data_types": {"grad_accum_dtype": 32}})", "ds.json");
  ASSERT_FALSE(number.ok());
  EXPECT_THAT(std::string(number.status().message()),
              HasSubstr("ds.json:1:17: field \"data_types.grad_accum_dtype\": invalid value 32 "
                        "(expected a string: \"fp32\", \"bf16\" or \"fp16\")"));
}

TEST(DeepSpeedKeys, EveryProblemAtOnceWithPositions) {
  absl::StatusOr<TrainConfig> cfg = ParseJsonConfig(R"({
  "stepz": 3,
  "fp16": {"enabled": true, "fp16_master_weights_and_grads": true},
  "zero_optimization": {"stage": 2, "cpu_offload": true, "offload_optimizer": {"device": "cpu"},
                        "overlap_com": true},
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decy": 0.1}}
})",
                                                    "ds.json");
  ASSERT_FALSE(cfg.ok());
  const std::string message(cfg.status().message());
  EXPECT_THAT(message,
              AllOf(HasSubstr("5 problems in ds.json: ds.json:2:3: "),  // in the file's order
                    HasSubstr("ds.json:2:3: unknown field \"stepz\" (did you mean \"steps\"?)"),
                    HasSubstr("ds.json:3:29: fp16.fp16_master_weights_and_grads is accepted only "
                              "as false"),
                    HasSubstr("zero_optimization.cpu_offload and "
                              "zero_optimization.offload_optimizer are one setting"),
                    HasSubstr("unknown field \"zero_optimization.overlap_com\" (did you mean "
                              "\"zero_optimization.overlap_comm\"?)"),
                    HasSubstr("ds.json:6:57: unknown field \"optimizer.params.weight_decy\" (did "
                              "you mean \"optimizer.params.weight_decay\"?)")));
  // A key given twice is named, not a DeepSpeed key beside it.
  cfg = ParseJsonConfig(R"({"steps": 1, "steps": 2, "wall_clock_breakdown": false})", "ds.json");
  ASSERT_FALSE(cfg.ok());
  EXPECT_THAT(std::string(cfg.status().message()),
              AllOf(HasSubstr("\"steps\" is given more than once"),
                    Not(HasSubstr("wall_clock_breakdown"))));
  // A name far from every known one gets no guess.
  cfg = ParseJsonConfig(R"({"frobnicate": {"enabled": false}})", "ds.json");
  ASSERT_FALSE(cfg.ok());
  EXPECT_THAT(std::string(cfg.status().message()),
              AllOf(HasSubstr("unknown field \"frobnicate\""), Not(HasSubstr("did you mean"))));
}

// The training program's way (ReadOptions.defer_to_validation): the reader keeps the problems of
// the keys and validation reports them with the problems of the values, every one at its
// line:column, in one message, in the file's order.
TEST(DeepSpeedKeys, KeyAndValueProblemsInOneRunEachAtItsPosition) {
  ReadOptions defer;
  defer.defer_to_validation = true;
  absl::StatusOr<TrainConfig> cfg = ParseJsonConfig(R"({
  "train_batch_size": 30,
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": 2,
  "stepz": 10,
  "gradient_clipping": true,
  "optimizer": {"type": "AdamW", "params": {"lr": -0.001, "weight_decy": 0.1}},
  "scheduler": {"type": "WarmupFoo"},
  "zero_optimization": {"stage": 5, "overlap_com": true},
  "wall_clock_breakdown": false
})",
                                                    "ds.json", defer);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->reader_problems_size(), 4);
  absl::Status st = Validate(&*cfg);
  ASSERT_FALSE(st.ok());
  const std::string message(st.message());
  const std::vector<std::string> expected = {
      // the batch-size triple that does not multiply out: 4 x 2 x 1 != 30
      "ds.json:2:3: train_batch_size (30) != train_micro_batch_size_per_gpu (4)",
      "ds.json:5:3: unknown field \"stepz\" (did you mean \"steps\"?)",
      "ds.json:6:3: field \"gradient_clipping\": invalid value true (expected a number)",
      "ds.json:7:45: optimizer.params.lr (-0.001) must be a finite number > 0",
      "ds.json:7:59: unknown field \"optimizer.params.weight_decy\"",
      "ds.json:8:17: scheduler.type \"WarmupFoo\" is unknown; known: ",
      "ds.json:9:25: zero_optimization.stage (5) must be 0, 1, 2 or 3",
      "ds.json:9:37: unknown field \"zero_optimization.overlap_com\" (did you mean "
      "\"zero_optimization.overlap_comm\"?)",
  };
  size_t previous = 0;
  for (const std::string& problem : expected) {
    const size_t at = message.find(problem);
    EXPECT_NE(at, std::string::npos) << problem << "\nnot in: " << message;
    if (at == std::string::npos) continue;
    EXPECT_GE(at, previous) << problem << " out of the file's order in: " << message;
    previous = at;
  }
  EXPECT_THAT(message, HasSubstr(absl::StrCat(expected.size(), " problems in the training config: "
                                              "ds.json:2:3: ")));
  // Validation consumed them: the config holds neither the problems nor the positions.
  EXPECT_EQ(cfg->reader_problems_size(), 0);
  EXPECT_EQ(cfg->key_positions_size(), 0);

  // Read without deferring (the default), the reader reports its own problems at once, the
  // mistyped value among them.
  absl::StatusOr<TrainConfig> strict = ParseJsonConfig(R"({
  "stepz": 10,
  "gradient_clipping": true,
  "optimizer": {"params": {"weight_decy": 0.1}}
})",
                                                       "ds.json");
  ASSERT_FALSE(strict.ok());
  EXPECT_THAT(std::string(strict.status().message()),
              AllOf(HasSubstr("3 problems in ds.json: ds.json:2:3: unknown field \"stepz\""),
                    HasSubstr("ds.json:3:3: field \"gradient_clipping\": invalid value true "
                              "(expected a number)"),
                    HasSubstr("ds.json:4:28: unknown field \"optimizer.params.weight_decy\"")));

  // A key whose name occurs twice in the file (fp16's and bf16's "enabled") still gets its own
  // position; a valid config read this way validates as before.
  strict = ParseJsonConfig(
      R"({"bf16": {"enabled": false}, "fp16": {"enabled": false, "enabeld": 1}})", "ds.json");
  ASSERT_FALSE(strict.ok());
  EXPECT_THAT(std::string(strict.status().message()),
              HasSubstr("ds.json:1:57: unknown field \"fp16.enabeld\""));
  cfg = ParseJsonConfig(R"({"steps": 3, "optimizer": {"params": {"lr": 0.01}}})", "ds.json",
                        defer);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_TRUE(Validate(&*cfg).ok());
  EXPECT_EQ(cfg->key_positions_size(), 0);
}

// DeepSpeed's features Braid does not have: refused, each naming the feature and the nearest
// thing Braid has, all in one message; switched off, they are noted and the config loads.
TEST(DeepSpeedKeys, FeaturesBraidLacksAreRefusedNamingTheNearestUnlessOff) {
  absl::StatusOr<TrainConfig> refused = ParseJsonConfig(R"({
  "sparse_attention": {"mode": "fixed", "block": 16},
  "flops_profiler": {"enabled": true, "profile_step": 1},
  "amp": {"enabled": true, "opt_level": "O1"},
  "zero_optimization": {"stage": 2, "zero_quantized_gradients": true}
})",
                                                        "ds.json");
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()),
              AllOf(HasSubstr("ds.json:2:3: sparse_attention: a DeepSpeed feature Braid does not "
                              "have (block-sparse attention kernels); nearest in Braid: Braid's "
                              "attention is dense"),
                    HasSubstr("ds.json:3:3: flops_profiler: a DeepSpeed feature Braid does not have "
                              "(the FLOPs profiler)"),
                    HasSubstr("the MFU from the model's FLOPs formula"),
                    HasSubstr("ds.json:4:3: amp: a DeepSpeed feature Braid does not have (NVIDIA "
                              "Apex AMP); nearest in Braid: fp16 or bf16"),
                    HasSubstr("zero_optimization.zero_quantized_gradients: a DeepSpeed feature "
                              "Braid does not have (ZeRO++'s quantized gradient reduce-scatter)")));
  TrainConfig off = Json(R"({
    "flops_profiler": {"enabled": false, "profile_step": 1},
    "autotuning": {},
    "amp": {"enabled": false},
    "zero_optimization": {"stage": 0, "zero_quantized_weights": false, "zero_hpz_partition_size": 1,
                          "mics_shard_size": -1}
  })");
  EXPECT_THAT(ConfigNotes(off), testing::IsSupersetOf({"flops_profiler: not enabled, nothing to do",
                                                       "autotuning: not enabled, nothing to do",
                                                       "amp: not enabled, nothing to do"}));
}


// ---- Monitoring ----------------------------------------------------------------------------

TEST(DeepSpeedMonitors, TensorBoardAndCsvAreReadWandbAndCometRefusedWhenEnabled) {
  TrainConfig cfg = Json(R"({
    "tensorboard": {"enabled": true, "output_path": "out/tb", "job_name": "bert"},
    "csv_monitor": {"enabled": true, "output_path": "out/csv"},
    "wandb": {"enabled": false, "project": "p"},
    "comet": {}
  })");
  EXPECT_TRUE(cfg.tensorboard().enabled());
  EXPECT_EQ(cfg.tensorboard().output_path(), "out/tb");
  EXPECT_EQ(cfg.tensorboard().job_name(), "bert");
  EXPECT_EQ(cfg.csv_monitor().output_path(), "out/csv");
  EXPECT_THAT(ConfigNotes(cfg), testing::IsSupersetOf({"wandb: not enabled, nothing to do",
                                                       "comet: not enabled, nothing to do"}));
  absl::StatusOr<TrainConfig> refused = ParseJsonConfig(R"({
  "wandb": {"enabled": true, "team": "t"},
  "comet": {"enabled": true}
})",
                                                        "ds.json");
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()),
              AllOf(HasSubstr("ds.json:2:3: wandb: Braid does not log to Weights & Biases (wandb) "
                              "(it sends the metrics over the network"),
                    HasSubstr("ds.json:3:3: comet: Braid does not log to Comet (comet)"),
                    HasSubstr("use csv_monitor or tensorboard, which write files")));
}

}  // namespace
}  // namespace braid::config
