// Validating a training configuration (launcher/config/config.h): defaults and derived batch sizes,
// names checked against their registrations (the model and dataset doubles of config_test_util.h),
// feature sections against the strategies that provide them, and every problem reported at once.
// Parsing is tested in config_test.cc.
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
using test_util::Text;
using test_util::Validate;
using test_util::ValidationError;

// ---- Defaults and derived values -----------------------------------------------------------

TEST(ConfigValidate, EmptyConfigIsTheReferenceRun) {
  TrainConfig cfg;
  ASSERT_TRUE(Validate(&cfg, 1, {}).ok());
  // Values from docs/REFERENCE_RUN.md.
  EXPECT_EQ(cfg.train_micro_batch_size_per_gpu(), 16);
  EXPECT_EQ(cfg.gradient_accumulation_steps(), 1);
  EXPECT_EQ(cfg.train_batch_size(), 16);
  EXPECT_EQ(cfg.optimizer().type(), "AdamW");
  const OptimizerParams& p = cfg.optimizer().params();
  EXPECT_DOUBLE_EQ(p.lr(), 1e-3);
  ASSERT_EQ(p.betas_size(), 2);
  EXPECT_DOUBLE_EQ(p.betas(0), 0.9);
  EXPECT_DOUBLE_EQ(p.betas(1), 0.95);
  EXPECT_DOUBLE_EQ(p.eps(), 1e-8);
  EXPECT_DOUBLE_EQ(p.weight_decay(), 0.1);
  EXPECT_EQ(cfg.scheduler().type(), "Constant");
  EXPECT_DOUBLE_EQ(cfg.gradient_clipping(), 0.0);
  // The registered defaults (here the doubles; gpt-mini on moby-dick in the training program).
  EXPECT_EQ(cfg.model().name(), "toy-lm");
  EXPECT_EQ(cfg.data().dataset(), "toy-bytes");
  EXPECT_EQ(cfg.data().sampler(), "random");
  EXPECT_EQ(cfg.data().seed(), 1234u);
  EXPECT_EQ(cfg.data().token_dtype(), "u8");
  EXPECT_EQ(cfg.strategy().name(), "single");
  EXPECT_EQ(cfg.device(), "cpu");
  EXPECT_EQ(cfg.threads(), 1);
  EXPECT_GT(cfg.steps(), 0);
  EXPECT_GT(cfg.log().print_every(), 0);
}

struct BatchCase {
  const char* text;
  int dp;
  int total, micro, accum;
};

TEST(ConfigValidate, DerivesBatchSizes) {
  const BatchCase cases[] = {
      {"", 2, 32, 16, 1},
      {"train_batch_size: 64", 2, 64, 32, 1},
      {"train_batch_size: 64 gradient_accumulation_steps: 2", 2, 64, 16, 2},
      {"train_batch_size: 64 train_micro_batch_size_per_gpu: 16", 1, 64, 16, 4},
      {"train_batch_size: 64 train_micro_batch_size_per_gpu: 16", 2, 64, 16, 2},
      {"train_micro_batch_size_per_gpu: 8 gradient_accumulation_steps: 4", 2, 64, 8, 4},
      {"train_micro_batch_size_per_gpu: 8", 4, 32, 8, 1},
      {"gradient_accumulation_steps: 3", 1, 48, 16, 3},
      // Consistent for dp 2 (and not for dp 1; see below).
      {"train_batch_size: 64 train_micro_batch_size_per_gpu: 16 gradient_accumulation_steps: 2", 2,
       64, 16, 2},
  };
  for (const BatchCase& c : cases) {
    SCOPED_TRACE(testing::Message() << c.text << " dp=" << c.dp);
    TrainConfig cfg = Text(c.text);
    if (c.dp > 1) cfg.mutable_strategy()->set_name("ddp");
    absl::Status st = Validate(&cfg, c.dp, {});
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_EQ(cfg.train_batch_size(), c.total);
    EXPECT_EQ(cfg.train_micro_batch_size_per_gpu(), c.micro);
    EXPECT_EQ(cfg.gradient_accumulation_steps(), c.accum);
  }
}

TEST(ConfigValidate, RejectsInconsistentBatchSizes) {
  const std::string all3 =
      "train_batch_size: 64 train_micro_batch_size_per_gpu: 16 gradient_accumulation_steps: 2 ";
  EXPECT_EQ(ValidationError(all3, 1),
            "train_batch_size (64) != train_micro_batch_size_per_gpu (16) × "
            "gradient_accumulation_steps (2) × data-parallel size (1) = 32");
  EXPECT_EQ(ValidationError("train_batch_size: 32 train_micro_batch_size_per_gpu: 16 "
                            "gradient_accumulation_steps: 2 strategy { name: \"ddp\" }",
                            2),
            "train_batch_size (32) != train_micro_batch_size_per_gpu (16) × "
            "gradient_accumulation_steps (2) × data-parallel size (2) = 64");
  EXPECT_THAT(ValidationError("train_batch_size: 48 train_micro_batch_size_per_gpu: 16 "
                              "strategy { name: \"ddp\" }",
                              2),
              AllOf(HasSubstr("train_batch_size (48)"), HasSubstr("not divisible"),
                    HasSubstr("train_micro_batch_size_per_gpu (16)"),
                    HasSubstr("data-parallel size (2) = 32")));
  EXPECT_THAT(ValidationError("train_batch_size: 30 strategy { name: \"ddp\" }", 4),
              AllOf(HasSubstr("train_batch_size (30)"), HasSubstr("data-parallel size (4)")));
  EXPECT_THAT(
      ValidationError("train_batch_size: 30 gradient_accumulation_steps: 4"),
      AllOf(HasSubstr("train_batch_size (30)"), HasSubstr("gradient_accumulation_steps (4)")));
}

TEST(ConfigValidate, RejectsNonPositiveValuesNamingTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {"optimizer { params { lr: 0 } }", "optimizer.params.lr (0)"},
      {"optimizer { params { lr: -0.1 } }", "optimizer.params.lr (-0.1)"},
      {"optimizer { params { eps: 0 } }", "optimizer.params.eps (0)"},
      {"optimizer { params { weight_decay: -1 } }", "optimizer.params.weight_decay (-1)"},
      {"train_batch_size: 0", "train_batch_size (0)"},
      {"train_micro_batch_size_per_gpu: -2", "train_micro_batch_size_per_gpu (-2)"},
      {"gradient_accumulation_steps: 0", "gradient_accumulation_steps (0)"},
      {"steps: 0", "steps (0)"},
      {"steps: -5", "steps (-5)"},
      {"threads: 0", "threads (0)"},
      {"log { print_every: 0 }", "log.print_every (0)"},
      {"gradient_clipping: -1", "gradient_clipping (-1)"},
      {"model { n_layer: 0 }", "model.n_layer (0)"},
      {"scheduler { type: \"WarmupCosine\" params { total_num_steps: 0 } }",
       "scheduler.params.total_num_steps (0)"},
      {"zero_optimization { reduce_bucket_size: -1 }", "zero_optimization.reduce_bucket_size (-1)"},
  };
  for (const auto& [text, expected] : cases) {
    EXPECT_THAT(ValidationError(text), HasSubstr(expected)) << text;
  }
}

TEST(ConfigValidate, RejectsUnknownNamesListingTheKnownOnes) {
  EXPECT_THAT(ValidationError("optimizer { type: \"Lamb2\" }"),
              AllOf(HasSubstr("optimizer.type \"Lamb2\" is unknown"),
                    HasSubstr("Adam, AdamW, SGD")));
  EXPECT_THAT(ValidationError("scheduler { type: \"StepLR\" }"),
              AllOf(HasSubstr("scheduler.type \"StepLR\""),
                    HasSubstr("Constant, WarmupCosine, WarmupLR, WarmupDecayLR, WarmupCosineLR, "
                              "OneCycle, LRRangeTest")));
  // Models and datasets: the registered names (here the doubles).
  EXPECT_THAT(ValidationError("model { name: \"gpt3\" }"),
              AllOf(HasSubstr("model.name \"gpt3\" is unknown"),
                    HasSubstr("known: toy-classifier, toy-lm")));
  EXPECT_THAT(ValidationError("data { dataset: \"cifar\" }"),
              AllOf(HasSubstr("data.dataset \"cifar\" is unknown"),
                    HasSubstr("known: toy-bytes, toy-images, toy-tokens")));
  EXPECT_THAT(ValidationError("data { sampler: \"shuffle\" }"),
              AllOf(HasSubstr("data.sampler \"shuffle\""), HasSubstr("random, sequential")));
  EXPECT_THAT(
      ValidationError("data { dataset: \"toy-tokens\" path: \"t.bin\" token_dtype: \"u32\" }"),
      AllOf(HasSubstr("data.token_dtype \"u32\""), HasSubstr("u8, u16")));
  EXPECT_THAT(ValidationError("device: \"tpu\""), HasSubstr("device \"tpu\" is unknown"));
  EXPECT_THAT(ValidationError("device: \"cuda:x\""), HasSubstr("device \"cuda:x\""));
  EXPECT_THAT(ValidationError("device: \"cuda:-1\""), HasSubstr("device \"cuda:-1\""));
}

TEST(ConfigValidate, NamesAreCaseInsensitiveAndStoredCanonical) {
  TrainConfig cfg = Text(R"pb(optimizer { type: "adamw" }
                              scheduler { type: "warmupcosine" }
                              model { name: "TOY-Lm" }
                              data { dataset: "Toy-Bytes" }
                              device: "cuda")pb");
  ASSERT_TRUE(Validate(&cfg, 1, {}).ok());
  EXPECT_EQ(cfg.optimizer().type(), "AdamW");
  EXPECT_EQ(cfg.scheduler().type(), "WarmupCosine");
  EXPECT_EQ(cfg.model().name(), "toy-lm");
  EXPECT_EQ(cfg.data().dataset(), "toy-bytes");
  EXPECT_EQ(cfg.device(), "cuda:0");
}

TEST(ConfigValidate, Betas) {
  EXPECT_THAT(ValidationError("optimizer { params { betas: [1.0, 0.9] } }"),
              AllOf(HasSubstr("optimizer.params.betas[0] (1)"), HasSubstr("[0, 1)")));
  EXPECT_THAT(ValidationError("optimizer { params { betas: [0.9, -0.1] } }"),
              HasSubstr("optimizer.params.betas[1] (-0.1)"));
  EXPECT_THAT(ValidationError("optimizer { params { betas: 0.9 } }"),
              AllOf(HasSubstr("optimizer.params.betas has 1 value"), HasSubstr("exactly 2")));
  EXPECT_THAT(ValidationError("optimizer { params { betas: [0.9, 0.99, 0.999] } }"),
              HasSubstr("betas has 3 value"));
  EXPECT_EQ(ValidationError("optimizer { params { betas: [0, 0.999] } }"), "");
}

TEST(ConfigValidate, OptimizerParamsBelongToTheirOptimizer) {
  EXPECT_THAT(ValidationError("optimizer { type: \"SGD\" params { betas: [0.9, 0.9] } }"),
              AllOf(HasSubstr("optimizer.params.betas applies to Adam and AdamW only")));
  EXPECT_THAT(ValidationError("optimizer { params { momentum: 0.9 } }"),
              HasSubstr("optimizer.params.momentum applies to SGD only"));
  EXPECT_THAT(ValidationError("optimizer { type: \"SGD\" params { nesterov: true } }"),
              HasSubstr("nesterov needs optimizer.params.momentum > 0"));
  EXPECT_THAT(ValidationError("optimizer { type: \"SGD\" params { momentum: 1.0 } }"),
              HasSubstr("optimizer.params.momentum (1)"));

  TrainConfig cfg = Text("optimizer { type: \"SGD\" params { momentum: 0.9 nesterov: true } }");
  ASSERT_TRUE(Validate(&cfg, 1, {}).ok());
  EXPECT_DOUBLE_EQ(cfg.optimizer().params().weight_decay(), 0.0);
  EXPECT_EQ(cfg.optimizer().params().betas_size(), 0);
}

TEST(ConfigValidate, Scheduler) {
  TrainConfig cfg = Text(R"pb(steps: 300
                              optimizer { params { lr: 6e-4 } }
                              scheduler {
                                type: "WarmupCosine"
                                params { warmup_num_steps: 30 }
                              })pb");
  ASSERT_TRUE(Validate(&cfg, 1, {}).ok());
  const SchedulerParams& p = cfg.scheduler().params();
  EXPECT_EQ(p.total_num_steps(), 300);
  EXPECT_DOUBLE_EQ(p.warmup_max_lr(), 6e-4);
  EXPECT_DOUBLE_EQ(p.min_lr(), 0.0);
  EXPECT_DOUBLE_EQ(p.warmup_min_lr(), 0.0);

  // The peak rate alone sets the optimizer's rate.
  cfg = Text("scheduler { type: \"WarmupCosine\" params { warmup_max_lr: 3e-4 } }");
  ASSERT_TRUE(Validate(&cfg, 1, {}).ok());
  EXPECT_DOUBLE_EQ(cfg.optimizer().params().lr(), 3e-4);

  EXPECT_THAT(
      ValidationError("optimizer { params { lr: 1e-3 } } "
                      "scheduler { type: \"WarmupCosine\" params { warmup_max_lr: 3e-4 } }"),
      AllOf(HasSubstr("scheduler.params.warmup_max_lr (0.0003)"),
            HasSubstr("optimizer.params.lr (0.001)")));
  EXPECT_THAT(ValidationError("steps: 100 scheduler { type: \"WarmupCosine\" "
                              "params { warmup_num_steps: 200 } }"),
              HasSubstr("scheduler.params.warmup_num_steps (200) > "
                        "scheduler.params.total_num_steps (100)"));
  EXPECT_THAT(ValidationError("scheduler { type: \"WarmupCosine\" params { min_lr: 0.01 } }"),
              HasSubstr("scheduler.params.min_lr (0.01) > the peak rate"));
  EXPECT_THAT(ValidationError("scheduler { params { warmup_num_steps: 10 min_lr: 0 } }"),
              AllOf(HasSubstr("scheduler.params.min_lr applies to scheduler.type "
                              "\"WarmupCosine\" only (the type is \"Constant\")"),
                    HasSubstr("scheduler.params.warmup_num_steps applies to scheduler.type "
                              "\"WarmupCosine\", \"WarmupLR\", \"WarmupDecayLR\" and "
                              "\"WarmupCosineLR\" only")));
}

// The section works with every strategy: validation asks no strategy about it, fills in the
// policy and checks the fields Braid defines.
TEST(ConfigValidate, ActivationCheckpointingNeedsNoStrategyFeature) {
  std::vector<std::string> asked;
  StrategyCatalog catalog;
  catalog.features_of = [&](const std::string& name) -> absl::StatusOr<std::vector<std::string>> {
    asked.push_back(name);
    return std::vector<std::string>{};
  };
  for (const char* strategy : {"single", "ddp", "zero", "pipeline", "some_plugin"}) {
    TrainConfig cfg = Text(absl::StrCat("strategy { name: \"", strategy, "\" } activation_checkpointing {}"));
    EXPECT_TRUE(ValidateConfigWith(&cfg, 1, catalog).ok()) << strategy;
    EXPECT_EQ(cfg.activation_checkpointing().policy(), "sqrt") << "the default, filled in";
  }
  EXPECT_TRUE(asked.empty()) << "no strategy was asked for a feature";
  EXPECT_EQ(ValidationError("activation_checkpointing { }", 2), "");

  TrainConfig cfg = Text("activation_checkpointing { policy: \"Every_Block\" }");
  ASSERT_TRUE(Validate(&cfg, 1, {}).ok());
  EXPECT_EQ(cfg.activation_checkpointing().policy(), "every_block");
  EXPECT_EQ(ValidationError("activation_checkpointing { policy: \"every_k\" every_k: 2 }"), "");
  EXPECT_EQ(ValidationError("activation_checkpointing { policy: \"attention\" }"), "");

  EXPECT_THAT(ValidationError("activation_checkpointing { policy: \"half\" }"),
              HasSubstr("activation_checkpointing.policy \"half\" is unknown; known: sqrt, "
                        "every_block, every_k, attention"));
  EXPECT_THAT(ValidationError("activation_checkpointing { policy: \"every_k\" }"),
              HasSubstr("policy \"every_k\" needs activation_checkpointing.every_k (>= 1)"));
  EXPECT_THAT(ValidationError("activation_checkpointing { policy: \"every_k\" every_k: 0 }"),
              HasSubstr("activation_checkpointing.every_k (0) must be >= 1"));
  EXPECT_THAT(ValidationError("activation_checkpointing { every_k: 2 }"),
              HasSubstr("every_k (2) applies to policy \"every_k\" only, and the policy is "
                        "\"sqrt\"; remove every_k or set policy: \"every_k\""));
  EXPECT_THAT(ValidationError("activation_checkpointing { number_checkpoints: 0 }"),
              HasSubstr("activation_checkpointing.number_checkpoints (0) must be >= 1"));
  // DeepSpeed's options about where kept inputs live: implemented where they change something
  // (the training program's kept_inputs.h), noted where they cannot; false is accepted.
  for (const char* field : {"partition_activations", "cpu_checkpointing", "contiguous_memory_optimization"}) {
    TrainConfig on = Text(absl::StrCat("activation_checkpointing { ", field, ": true }"));
    ASSERT_TRUE(Validate(&on, 1, {}).ok()) << field;
    EXPECT_THAT(ConfigNotes(on), ::testing::Contains(HasSubstr(absl::StrCat("activation_checkpointing.", field, ": "))))
        << field;
    EXPECT_EQ(ValidationError(absl::StrCat("activation_checkpointing { ", field, ": false }")), "")
        << field;
  }
  // Under tensor parallelism partition_activations splits the kept inputs (no note); under
  // sequence parallelism they are split already (a note). cpu_checkpointing on a GPU keeps
  // them in host memory (no note).
  auto notes_of = [&](const std::string& text, int world, std::vector<std::string> features) {
    TrainConfig c = Text(text);
    absl::Status st = Validate(&c, world, features);
    EXPECT_TRUE(st.ok()) << text << ": " << st;
    return ConfigNotes(c);
  };
  EXPECT_THAT(notes_of("parallel { tensor: 2 } activation_checkpointing { partition_activations: true }",
                       2, {"tensor_parallel"}),
              ::testing::Not(::testing::Contains(HasSubstr("partition_activations"))));
  EXPECT_THAT(notes_of("parallel { tensor: 2 sequence_parallel: true } "
                       "activation_checkpointing { partition_activations: true }",
                       2, {"tensor_parallel"}),
              ::testing::Contains(HasSubstr("partition_activations: no effect under "
                                            "parallel.sequence_parallel")));
  EXPECT_THAT(notes_of("device: \"cuda\" activation_checkpointing { cpu_checkpointing: true }", 1, {}),
              ::testing::Not(::testing::Contains(HasSubstr("cpu_checkpointing"))));

  // A DeepSpeed JSON's section, as DeepSpeed's documentation writes it, plus Braid's policy.
  auto json = ParseJsonConfig(R"({"activation_checkpointing": {
      "partition_activations": false, "cpu_checkpointing": false,
      "contiguous_memory_optimization": false, "number_checkpoints": 4,
      "synchronize_checkpoint_boundary": false, "profile": false, "policy": "every_k",
      "every_k": 3}})", "ds.json");
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_TRUE(Validate(&*json, 1, {}).ok());
  EXPECT_EQ(json->activation_checkpointing().every_k(), 3);
  EXPECT_EQ(json->activation_checkpointing().number_checkpoints(), 4);
}

TEST(ConfigValidate, ModelAndDataAgainstTheirRegistrations) {
  // The model's hook: its defaults and its rules.
  TrainConfig cfg;
  ASSERT_TRUE(Validate(&cfg, 1, {}).ok());
  EXPECT_EQ(cfg.model().n_head(), 4);
  EXPECT_EQ(cfg.model().n_embd(), 256);
  EXPECT_FALSE(cfg.model().has_n_layer());
  EXPECT_THAT(ValidationError("model { n_embd: 250 }"),
              AllOf(HasSubstr("model.n_embd (250)"), HasSubstr("model.n_head (4)")));
  EXPECT_EQ(ValidationError("model { n_head: 8 n_layer: 2 }"), "");
  EXPECT_THAT(ValidationError("model { vocab_size: 100 }"),
              HasSubstr("model.vocab_size (100) < 256 of toy-bytes"));
  // The hook runs only on fields that passed the generic checks (no division by n_head 0).
  EXPECT_EQ(ValidationError("model { n_head: 0 }"), "model.n_head (0) must be >= 1");

  // Fields the model does not take.
  EXPECT_EQ(ValidationError("model { name: \"toy-classifier\" block_size: 8 } "
                            "data { dataset: \"toy-images\" }"),
            "model.block_size does not apply to model \"toy-classifier\" (it takes n_layer and "
            "n_embd only)");
  EXPECT_EQ(ValidationError("model { name: \"toy-classifier\" n_layer: 2 n_embd: 128 } "
                            "data { dataset: \"toy-images\" }"),
            "");

  // What the model takes against what the dataset yields.
  EXPECT_EQ(ValidationError("model { name: \"toy-classifier\" }"),
            "model.name \"toy-classifier\" cannot train on data.dataset \"toy-bytes\": "
            "\"toy-classifier\" takes images (data.dataset \"toy-images\"), \"toy-bytes\" yields "
            "tokens");
  EXPECT_THAT(ValidationError("data { dataset: \"toy-images\" }"),
              AllOf(HasSubstr("model.name \"toy-lm\""), HasSubstr("data.dataset \"toy-images\""),
                    HasSubstr("(data.dataset \"toy-bytes\" or \"toy-tokens\")")));

  // The dataset's token widths and path.
  EXPECT_EQ(ValidationError("data { token_dtype: \"u16\" }"),
            "data.token_dtype (\"u16\") must be \"u8\" for data.dataset \"toy-bytes\"");
  EXPECT_EQ(ValidationError("model { name: \"toy-classifier\" } "
                            "data { dataset: \"toy-images\" token_dtype: \"u8\" }"),
            "data.token_dtype (\"u8\") does not apply to data.dataset \"toy-images\" (it has no "
            "tokens)");
  EXPECT_EQ(ValidationError("data { dataset: \"toy-tokens\" }"),
            "data.path is empty: data.dataset \"toy-tokens\" needs the token file's path");
  cfg = Text("data { dataset: \"toy-tokens\" path: \"x\" }");
  ASSERT_TRUE(Validate(&cfg, 1, {}).ok());
  EXPECT_EQ(cfg.data().token_dtype(), "u16");
  cfg = Text("data { dataset: \"toy-tokens\" path: \"x\" token_dtype: \"U8\" }");
  ASSERT_TRUE(Validate(&cfg, 1, {}).ok());
  EXPECT_EQ(cfg.data().token_dtype(), "u8");
}

TEST(ConfigValidate, ModelOptionsAgainstTheirDeclaration) {
  EXPECT_EQ(ValidationError("model { options { key: \"n_kv_head\" value: \"2\" } "
                            "options { key: \"rope_theta\" value: \"5e5\" } "
                            "options { key: \"tied\" value: \"false\" } "
                            "options { key: \"note\" value: \"anything\" } }"),
            "");
  EXPECT_EQ(ValidationError("model { options { key: \"n_kv_heads\" value: \"2\" } }"),
            "model.options \"n_kv_heads\" does not apply to model \"toy-lm\" (it takes "
            "n_kv_head, rope_theta, tied and note)");
  EXPECT_EQ(ValidationError("model { name: \"toy-classifier\" "
                            "options { key: \"n_kv_head\" value: \"2\" } } "
                            "data { dataset: \"toy-images\" }"),
            "model.options \"n_kv_head\" does not apply to model \"toy-classifier\" (it "
            "takes no options)");
  EXPECT_THAT(ValidationError("model { options { key: \"n_kv_head\" value: \"two\" } "
                              "options { key: \"rope_theta\" value: \"inf\" } "
                              "options { key: \"tied\" value: \"yes\" } }"),
              AllOf(HasSubstr("model.options \"n_kv_head\" (\"two\") must be an integer"),
                    HasSubstr("model.options \"rope_theta\" (\"inf\") must be a finite number"),
                    HasSubstr("model.options \"tied\" (\"yes\") must be true or false")));
}

TEST(ConfigValidate, CheckpointSection) {
  TrainConfig cfg = Text("checkpoint { dir: \"runs/x\" }");
  ASSERT_TRUE(Validate(&cfg, 1, {}).ok());
  EXPECT_EQ(cfg.checkpoint().every_steps(), 0);
  EXPECT_EQ(cfg.checkpoint().keep_last(), 2);
  EXPECT_TRUE(cfg.checkpoint().resume());
  EXPECT_THAT(ValidationError("checkpoint { every_steps: 5 }"), HasSubstr("checkpoint.dir is empty"));
  EXPECT_THAT(ValidationError("checkpoint { dir: \"d\" every_steps: -1 }"),
              HasSubstr("checkpoint.every_steps (-1) must be >= 0"));
  EXPECT_THAT(ValidationError("checkpoint { dir: \"d\" keep_last: 0 }"), HasSubstr("checkpoint.keep_last (0)"));
}

TEST(ConfigValidate, EvalSection) {
  TrainConfig cfg = Text("eval { }");
  ASSERT_TRUE(Validate(&cfg, 1, {}).ok());
  EXPECT_EQ(cfg.eval().every_steps(), 0);
  EXPECT_EQ(cfg.eval().batches(), 8);
  EXPECT_FALSE(Text("").has_eval());
  EXPECT_THAT(ValidationError("eval { every_steps: -2 }"), HasSubstr("eval.every_steps (-2) must be >= 0"));
  EXPECT_THAT(ValidationError("eval { batches: 0 }"), HasSubstr("eval.batches (0)"));
  // The dataset says when eval does not apply to it (DatasetSpec::eval_refused), by no name.
  EXPECT_THAT(ValidationError("model { name: \"toy-classifier\" } data { dataset: \"toy-images\" } eval { }"),
              HasSubstr("eval does not apply to data.dataset \"toy-images\": it has no validation "
                        "split (its test accuracy is reported instead)"));
}

TEST(ConfigValidate, ReportsEveryProblemAtOnce) {
  EXPECT_THAT(ValidationError("steps: 0 optimizer { params { lr: 0 } } threads: 0"),
              AllOf(HasSubstr("3 problems"), HasSubstr("steps (0)"),
                    HasSubstr("optimizer.params.lr (0)"), HasSubstr("threads (0)")));
}

// A text config read the training program's way (ReadOptions.defer_to_validation) gets every
// validation problem at its file:line:column, as a JSON one does, in the file's order; the
// training program's own problem (a plugin not found, "optimizer.type: ...") is placed at the key
// that named it, and validation does not refuse that key a second time in its own words.
TEST(ConfigValidate, TextConfigProblemsComeAtTheirPositions) {
  ReadOptions defer;
  defer.defer_to_validation = true;
  const std::string text =
      "steps: 0\n"
      "optimizer {\n"
      "  type: \"Sophia\"\n"
      "}\n"
      "log { print_every: 0 }\n"
      "\tthreads: 0\n"
      "model { name: \"toy-lm\" }\n"
      "zero_optimization { stage: 7 }\n";
  absl::StatusOr<TrainConfig> cfg = ParseTextConfig(text, "run.pbtxt", defer);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->key_positions().at("log.print_every"), "run.pbtxt:5:7");
  // Columns as the text parser's own errors count them: a tab to the next multiple of 8.
  EXPECT_EQ(cfg->key_positions().at("threads"), "run.pbtxt:6:9");
  // What PrepareConfig adds when no plugin registers the optimizer (launcher/train_setup.cc).
  cfg->add_reader_problems("optimizer.type: unknown optimizer 'Sophia'; looked for libbraid_sophia.so");
  absl::Status st = Validate(&*cfg, 1, {"zero1", "zero2", "zero3"});
  ASSERT_FALSE(st.ok());
  const std::string message(st.message());
  const std::vector<std::string> expected = {
      "run.pbtxt:1:1: steps (0) must be >= 1",
      "run.pbtxt:3:3: optimizer.type: unknown optimizer 'Sophia'; looked for libbraid_sophia.so",
      "run.pbtxt:5:7: log.print_every (0) must be >= 1",
      "run.pbtxt:6:9: threads (0) must be >= 1",
      "run.pbtxt:8:21: zero_optimization.stage (7) must be 0, 1, 2 or 3",
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
                                              "run.pbtxt:1:1: ")));
  EXPECT_THAT(message, Not(HasSubstr("optimizer.type \"Sophia\" is unknown")));
  EXPECT_EQ(cfg->reader_problems_size(), 0);
  EXPECT_EQ(cfg->key_positions_size(), 0);

  // Read the default way (tests, tools), a text config carries no positions and its problems
  // none either; a valid one read either way validates.
  absl::StatusOr<TrainConfig> plain = ParseTextConfig(text, "run.pbtxt");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->key_positions_size(), 0);
  EXPECT_THAT(std::string(Validate(&*plain, 1, {"zero1", "zero2", "zero3"}).message()),
              AllOf(HasSubstr("steps (0) must be >= 1"), Not(HasSubstr("run.pbtxt"))));
  absl::StatusOr<TrainConfig> good = ParseTextConfig("steps: 3\n", "good.pbtxt", defer);
  ASSERT_TRUE(good.ok());
  EXPECT_TRUE(Validate(&*good, 1, {}).ok());
  EXPECT_EQ(good->key_positions_size(), 0);
}

TEST(ConfigValidate, RejectsBadDataParallelSize) {
  TrainConfig cfg;
  EXPECT_THAT(std::string(Validate(&cfg, 0, {}).message()),
              HasSubstr("data-parallel size (0)"));
}

}  // namespace
}  // namespace braid::config
