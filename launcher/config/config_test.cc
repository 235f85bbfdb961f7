// Reading a training configuration (launcher/config/config.h): text format and DeepSpeed-style JSON,
// round trips through both, parse errors that name the file, position and field, and loading by
// file extension. Validation is tested in config_validate_test.cc; both link the model and
// dataset doubles of config_test_util.h.
#include "launcher/config/config.h"

#include <cstdlib>
#include <fstream>
#include <string>

#include "launcher/config/config_test_util.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace braid::config {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using ::testing::AllOf;
using ::testing::HasSubstr;
using test_util::Text;

std::string TextError(const std::string& text) {
  auto cfg = ParseTextConfig(text, "my.pbtxt");
  EXPECT_FALSE(cfg.ok()) << "parsed: " << cfg->ShortDebugString();
  return cfg.ok() ? "" : std::string(cfg.status().message());
}

std::string JsonError(const std::string& json) {
  auto cfg = ParseJsonConfig(json, "ds.json");
  EXPECT_FALSE(cfg.ok()) << "parsed: " << cfg->ShortDebugString();
  return cfg.ok() ? "" : std::string(cfg.status().message());
}

// ---- Round trips ---------------------------------------------------------------------------

constexpr char kFullText[] = R"pb(
  train_micro_batch_size_per_gpu: 8
  gradient_accumulation_steps: 4
  steps: 500
  optimizer {
    type: "AdamW"
    params {
      lr: 6e-4
      betas: [ 0.9, 0.95 ]
      eps: 1e-8
      weight_decay: 0.1
    }
  }
  scheduler {
    type: "WarmupCosine"
    params { warmup_num_steps: 50 total_num_steps: 500 min_lr: 6e-5 }
  }
  gradient_clipping: 1.0
  fp16 { enabled: false loss_scale: 0 }
  zero_optimization { stage: 0 overlap_comm: true reduce_bucket_size: 500000000 }
  model { name: "gpt-mini" n_layer: 2 block_size: 64 }
  data { dataset: "tokens" path: "/data/tok.bin" sampler: "sequential" seed: 7 token_dtype: "u16" }
  strategy {
    name: "ddp"
    options { key: "bucket_cap_mb" value: "25" }
  }
  device: "cuda:1"
  threads: 2
  init_from: "in.safetensors"
  save_to: "out.safetensors"
  log { dir: "runs/a" metrics_file: "m.jsonl" print_every: 5 quiet: true }
  seed: 42
)pb";

// What plugins are handed (core/config/sections.proto) is the training config's fields of the
// same names, numbers and types, and SectionsOf copies each one given, and only those: a section
// the config leaves out stays absent (has_parallel() decides tensor parallelism's plan).
TEST(Sections, AreTheTrainConfigsFieldsOfTheSameNamesAndNumbers) {
  const auto* sections = Sections::descriptor();
  const auto* train = TrainConfig::descriptor();
  ASSERT_GT(sections->field_count(), 0);
  for (int i = 0; i < sections->field_count(); ++i) {
    const auto* f = sections->field(i);
    const auto* t = train->FindFieldByName(f->name());
    ASSERT_NE(t, nullptr) << f->name();
    EXPECT_EQ(t->number(), f->number()) << f->name();
    EXPECT_EQ(t->type(), f->type()) << f->name();
    EXPECT_EQ(t->message_type(), f->message_type()) << f->name();
  }
  absl::StatusOr<TrainConfig> cfg = ParseTextConfig(
      "model { name: \"gpt-mini\" n_layer: 2 } optimizer { type: \"SGD\" params { lr: 0.5 } } "
      "zero_optimization { stage: 2 } parallel { tensor: 2 } communication_data_type: \"fp32\" "
      "data { seed: 7 } eval { batches: 3 } steps: 9 log { quiet: true }",
      "test");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  const Sections s = SectionsOf(*cfg);
  EXPECT_TRUE(MessageDifferencer::Equals(s.model(), cfg->model()));
  EXPECT_TRUE(MessageDifferencer::Equals(s.optimizer(), cfg->optimizer()));
  EXPECT_TRUE(MessageDifferencer::Equals(s.zero_optimization(), cfg->zero_optimization()));
  EXPECT_TRUE(MessageDifferencer::Equals(s.parallel(), cfg->parallel()));
  EXPECT_TRUE(MessageDifferencer::Equals(s.data(), cfg->data()));
  EXPECT_TRUE(MessageDifferencer::Equals(s.eval(), cfg->eval()));
  EXPECT_EQ(s.communication_data_type(), "fp32");
  EXPECT_EQ(s.model().n_layer(), 2);
  EXPECT_EQ(s.eval().batches(), 3);
  const Sections none = SectionsOf(TrainConfig());
  EXPECT_FALSE(none.has_model() || none.has_optimizer() || none.has_zero_optimization() ||
               none.has_parallel() || none.has_data() || none.has_eval());
  EXPECT_EQ(none.ByteSizeLong(), 0u);
}

TEST(ConfigParse, TextRoundTrip) {
  TrainConfig cfg = Text(kFullText);
  EXPECT_EQ(cfg.train_micro_batch_size_per_gpu(), 8);
  EXPECT_FALSE(cfg.has_train_batch_size());
  EXPECT_DOUBLE_EQ(cfg.optimizer().params().lr(), 6e-4);
  ASSERT_EQ(cfg.optimizer().params().betas_size(), 2);
  EXPECT_DOUBLE_EQ(cfg.optimizer().params().betas(1), 0.95);
  EXPECT_EQ(cfg.zero_optimization().reduce_bucket_size(), 500000000);
  EXPECT_EQ(cfg.strategy().options().at("bucket_cap_mb"), "25");
  EXPECT_EQ(cfg.data().seed(), 7u);
  EXPECT_TRUE(cfg.log().quiet());
  // Explicit zeros survive (presence), so they are not mistaken for "use the default".
  EXPECT_TRUE(cfg.fp16().has_loss_scale());

  auto again = ParseTextConfig(ConfigToText(cfg), "printed");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(MessageDifferencer::Equals(cfg, *again)) << ConfigToText(*again);

  // And through JSON.
  auto via_json = ParseJsonConfig(ConfigToJson(cfg), "printed.json");
  ASSERT_TRUE(via_json.ok()) << via_json.status() << "\n" << ConfigToJson(cfg);
  EXPECT_TRUE(MessageDifferencer::Equals(cfg, *via_json)) << ConfigToJson(cfg);
}

// A DeepSpeed config as users have them.
constexpr char kDeepSpeedJson[] = R"({
  "train_batch_size": 32,
  "train_micro_batch_size_per_gpu": 16,
  "gradient_accumulation_steps": 2,
  "steps": 100,
  "optimizer": {
    "type": "AdamW",
    "params": {"lr": 0.001, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}
  },
  "scheduler": {
    "type": "WarmupCosine",
    "params": {"warmup_num_steps": 10, "total_num_steps": 100, "warmup_min_lr": 0}
  },
  "gradient_clipping": 1.0,
  "fp16": {"enabled": false},
  "bf16": {"enabled": false},
  "zero_optimization": {"stage": 0, "contiguous_gradients": true}
})";

TEST(ConfigParse, DeepSpeedJsonRoundTrip) {
  auto cfg = ParseJsonConfig(kDeepSpeedJson, "ds.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->train_batch_size(), 32);
  EXPECT_EQ(cfg->gradient_accumulation_steps(), 2);
  EXPECT_EQ(cfg->optimizer().type(), "AdamW");
  ASSERT_EQ(cfg->optimizer().params().betas_size(), 2);
  EXPECT_DOUBLE_EQ(cfg->optimizer().params().betas(0), 0.9);
  EXPECT_DOUBLE_EQ(cfg->optimizer().params().betas(1), 0.95);
  EXPECT_DOUBLE_EQ(cfg->optimizer().params().eps(), 1e-8);
  EXPECT_EQ(cfg->scheduler().params().warmup_num_steps(), 10);
  EXPECT_TRUE(cfg->scheduler().params().has_warmup_min_lr());
  EXPECT_DOUBLE_EQ(cfg->gradient_clipping(), 1.0);
  EXPECT_TRUE(cfg->zero_optimization().contiguous_gradients());

  const std::string json = ConfigToJson(*cfg);
  EXPECT_THAT(json, HasSubstr("\"train_micro_batch_size_per_gpu\""));  // DeepSpeed's spelling
  auto again = ParseJsonConfig(json, "printed.json");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(MessageDifferencer::Equals(*cfg, *again)) << json;

  // A disabled precision section and stage 0 need no plugin.
  EXPECT_TRUE(ValidateConfig(&*cfg, 1, {}).ok());
}

TEST(ConfigParse, JsonAcceptsCamelCaseNames) {
  auto cfg = ParseJsonConfig(R"({"trainMicroBatchSizePerGpu": 4, "log": {"printEvery": 3}})", "x");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->train_micro_batch_size_per_gpu(), 4);
  EXPECT_EQ(cfg->log().print_every(), 3);
}

// ---- Parse errors --------------------------------------------------------------------------

TEST(ConfigParse, TextUnknownFieldNamesFileLineAndField) {
  EXPECT_THAT(TextError("steps: 3\nfoo: 2\n"),
              AllOf(HasSubstr("my.pbtxt:2:1:"), HasSubstr("unknown field \"foo\""),
                    HasSubstr("known fields: train_batch_size")));
  EXPECT_THAT(TextError("\toptimizer {\n\t\tparams {\n\t\t}\n\t\tschedule {}\n\t}\n"),
              AllOf(HasSubstr("my.pbtxt:4:17:"), HasSubstr("\"schedule\"")));
  EXPECT_THAT(TextError("optimizer {\n  params { bogus: 1 }\n}\n"),
              AllOf(HasSubstr("my.pbtxt:2:12:"), HasSubstr("\"bogus\""),
                    HasSubstr("braid.config.OptimizerParams"), HasSubstr("lr, betas")));
}

TEST(ConfigParse, TextWrongTypeNamesField) {
  EXPECT_THAT(TextError("steps: 3\nsteps2: 1"), HasSubstr("steps2"));
  EXPECT_THAT(TextError("\nsteps: \"abc\""),
              AllOf(HasSubstr("my.pbtxt:2:8:"), HasSubstr("field \"steps\""),
                    HasSubstr("Expected integer")));
  EXPECT_THAT(TextError("model { name: 5 }"),
              AllOf(HasSubstr("my.pbtxt:1:"), HasSubstr("field \"name\""), HasSubstr("string")));
  EXPECT_THAT(TextError("optimizer {\n\tparams {\n\t\tlr: true\n\t}\n}"),
              AllOf(HasSubstr("my.pbtxt:3:"), HasSubstr("field \"lr\""), HasSubstr("double")));
  EXPECT_THAT(TextError("fp16 { enabled: maybe }"), HasSubstr("field \"enabled\""));
  EXPECT_THAT(TextError("steps: 3000000000"), HasSubstr("field \"steps\""));
  EXPECT_THAT(TextError("steps: 1\nsteps: 2"),
              AllOf(HasSubstr("my.pbtxt:2:"), HasSubstr("\"steps\"")));
  EXPECT_THAT(TextError("optimizer {"), HasSubstr("my.pbtxt:1:"));
}

// Text format's escapes can put any bytes in a string field, and a map key may come twice; JSON
// can carry neither (the config fuzzer found both: configs that parsed and then failed their JSON
// round trip). Refused, with the field.
TEST(ConfigParse, TextStringsMustBeUtf8AndMapKeysUnique) {
  EXPECT_THAT(TextError("strategy { name: \"ddp\" options { key: \"bucket_cap_mb\" value: \"\\261\" } }"),
              AllOf(HasSubstr("my.pbtxt"), HasSubstr("strategy.options.value"), HasSubstr("UTF-8")));
  EXPECT_THAT(TextError("model { name: \"gpt\\300\\257\" }"), HasSubstr("model.name"));  // overlong '/'
  EXPECT_THAT(TextError("data { path: \"\\355\\240\\200\" }"), HasSubstr("data.path"));  // a surrogate
  // A map key given twice would keep the last value and drop the other without a word.
  EXPECT_THAT(TextError("strategy { name: \"pipeline\" options { key: \"schedule\" value: \"1f1b\" }\n"
                        "options { key: \"schedule\" value: \"gpipe\" } }"),
              AllOf(HasSubstr("strategy.options"), HasSubstr("\"schedule\" twice")));
  // Real UTF-8 (here a path with an accent and an emoji) is fine.
  auto ok = ParseTextConfig("data { path: \"d\303\251j\340\244\276/\360\237\230\200.txt\" }", "my.pbtxt");
  EXPECT_TRUE(ok.ok()) << ok.status();
}

TEST(ConfigParse, JsonUnknownFieldNamesFilePositionAndPath) {
  EXPECT_THAT(JsonError("{\n  \"steps\": 3,\n  \"wall_clock_breakdwn\": false\n}"),
              AllOf(HasSubstr("ds.json:3:3:"), HasSubstr("unknown field \"wall_clock_breakdwn\""),
                    HasSubstr("did you mean \"wall_clock_breakdown\"?"),
                    HasSubstr("known fields: train_batch_size")));
  EXPECT_THAT(JsonError(R"({"optimizer": {"params": {"lr": 1, "gamma": 0.5}}})"),
              AllOf(HasSubstr("ds.json:1:"), HasSubstr("\"optimizer.params.gamma\""),
                    HasSubstr("known fields of optimizer.params: lr, betas")));
}

TEST(ConfigParse, JsonWrongTypeNamesFieldPath) {
  EXPECT_THAT(JsonError("{\n \"optimizer\": {\"params\": {\"lr\": \"fast\"}}}"),
              AllOf(HasSubstr("ds.json:2:"), HasSubstr("field \"optimizer.params.lr\""),
                    HasSubstr("\"fast\""), HasSubstr("expected a number")));
  EXPECT_THAT(
      JsonError(R"({"fp16": {"enabled": "maybe"}})"),
      AllOf(HasSubstr("ds.json"), HasSubstr("\"fp16.enabled\""), HasSubstr("true or false")));
  EXPECT_THAT(JsonError(R"({"steps": 1.5})"), AllOf(HasSubstr("\"steps\""), HasSubstr("integer")));
  EXPECT_THAT(JsonError(R"({"model": {"name": 5}})"),
              AllOf(HasSubstr("\"model.name\""), HasSubstr("expected a string")));
  EXPECT_THAT(JsonError(R"({"strategy": {"options": {"bucket_cap_mb": 25}}})"),
              AllOf(HasSubstr("\"strategy.options\""), HasSubstr("expected a string")));
  EXPECT_THAT(JsonError(R"({"steps": 3} trailing)"), HasSubstr("ds.json"));
  EXPECT_THAT(
      JsonError(R"({"log": {"print_every": 1, "print_every": 2}})"),
      AllOf(HasSubstr("ds.json"), HasSubstr("\"log.print_every\" is given more than once")));
}

// ---- Files -----------------------------------------------------------------------------------

std::string WriteTemp(const std::string& name, const std::string& contents) {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::string path = std::string(dir ? dir : "/tmp") + "/" + name;
  std::ofstream(path) << contents;
  return path;
}

TEST(ConfigFile, LoadsByExtension) {
  auto json = LoadConfigFile(WriteTemp("ds.json", kDeepSpeedJson));
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(json->train_batch_size(), 32);
  auto text = LoadConfigFile(WriteTemp("run.textproto", "steps: 7"));
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(text->steps(), 7);
  auto pbtxt = LoadConfigFile(WriteTemp("run.PBTXT", "steps: 8"));
  ASSERT_TRUE(pbtxt.ok()) << pbtxt.status();
  EXPECT_EQ(pbtxt->steps(), 8);
  // Text-format content in a .json file is parsed as JSON, and fails as such.
  EXPECT_FALSE(LoadConfigFile(WriteTemp("wrong.json", "steps: 7")).ok());
}

TEST(ConfigFile, ErrorsNameTheFile) {
  const std::string bad = WriteTemp("bad.txt", "steps: 1\noptimiser { }\n");
  auto cfg = LoadConfigFile(bad);
  ASSERT_FALSE(cfg.ok());
  EXPECT_THAT(std::string(cfg.status().message()),
              AllOf(HasSubstr(bad + ":2:1:"), HasSubstr("\"optimiser\"")));

  auto missing = LoadConfigFile("/nonexistent/run.json");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("/nonexistent/run.json"));

  auto yaml = LoadConfigFile(WriteTemp("run.yaml", "steps: 1"));
  EXPECT_THAT(std::string(yaml.status().message()),
              AllOf(HasSubstr("run.yaml"), HasSubstr(".json"), HasSubstr(".pbtxt")));
}

}  // namespace
}  // namespace braid::config
