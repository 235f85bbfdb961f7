// The models, datasets and optimizers the training program links, as config validation sees them
// through the registry (they register themselves: models/gpt, models/mlp, models/data and core's
// optimizers), and the models built from a validated config.
#include <map>
#include <memory>
#include <string>

#include "launcher/config/config.h"
#include "core/registry.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/gpt/gpt.h"

namespace braid::config {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TrainConfig Text(const std::string& text) {
  auto cfg = ParseTextConfig(text, "test.pbtxt");
  EXPECT_TRUE(cfg.ok()) << cfg.status();
  return cfg.ok() ? *cfg : TrainConfig();
}

std::string ValidationError(const std::string& text) {
  TrainConfig cfg = Text(text);
  absl::Status st = ValidateConfig(&cfg, 1, {});
  return st.ok() ? "" : std::string(st.message());
}

TEST(RegisteredModels, NamesAndDefaults) {
  Registry& r = Registry::Get();
  EXPECT_EQ(r.ModelNames(), (std::vector<std::string>{"gpt-mini", "gpt2-124m", "mlp"}));
  EXPECT_EQ(r.DatasetNames(), (std::vector<std::string>{"mnist", "moby-dick", "tokens"}));
  EXPECT_EQ(r.OptimizerNames(), (std::vector<std::string>{"Adam", "AdamW", "SGD"}));
  EXPECT_EQ(r.DefaultModel(), "gpt-mini");
  EXPECT_EQ(r.DefaultDataset(), "moby-dick");
  EXPECT_EQ(r.DefaultOptimizer(), "AdamW");
  EXPECT_THAT(ValidationError("model { name: \"gpt3\" }"),
              AllOf(HasSubstr("model.name \"gpt3\" is unknown"),
                    HasSubstr("known: gpt-mini, gpt2-124m, mlp")));
  EXPECT_THAT(ValidationError("data { dataset: \"cifar\" }"),
              AllOf(HasSubstr("data.dataset \"cifar\" is unknown"),
                    HasSubstr("known: mnist, moby-dick, tokens")));
}

// docs/REFERENCE_RUN.md: gpt-mini (4 x 4 x 256, context 128, vocabulary 256) on Moby Dick's
// bytes. Validation fills the preset's shape in.
TEST(RegisteredModels, EmptyConfigIsTheReferenceRun) {
  TrainConfig cfg;
  ASSERT_TRUE(ValidateConfig(&cfg, 1, {}).ok());
  EXPECT_EQ(cfg.model().name(), "gpt-mini");
  EXPECT_EQ(cfg.model().n_layer(), 4);
  EXPECT_EQ(cfg.model().n_head(), 4);
  EXPECT_EQ(cfg.model().n_embd(), 256);
  EXPECT_EQ(cfg.model().block_size(), 128);
  EXPECT_EQ(cfg.model().vocab_size(), 256);
  EXPECT_EQ(cfg.data().dataset(), "moby-dick");
  EXPECT_EQ(cfg.data().token_dtype(), "u8");
  EXPECT_EQ(cfg.optimizer().type(), "AdamW");

  cfg = Text("model { name: \"GPT2-124M\" n_layer: 2 } data { dataset: \"tokens\" path: \"x\" }");
  ASSERT_TRUE(ValidateConfig(&cfg, 1, {}).ok());
  EXPECT_EQ(cfg.model().name(), "gpt2-124m");
  EXPECT_EQ(cfg.model().n_layer(), 2);  // an override stays
  EXPECT_EQ(cfg.model().n_embd(), 768);
  EXPECT_EQ(cfg.model().block_size(), 1024);
  EXPECT_EQ(cfg.model().vocab_size(), 50257);
  EXPECT_EQ(cfg.data().token_dtype(), "u16");

  cfg = Text("model { name: \"mlp\" } data { dataset: \"mnist\" }");
  ASSERT_TRUE(ValidateConfig(&cfg, 1, {}).ok());
  EXPECT_EQ(cfg.model().n_layer(), 1);
  EXPECT_EQ(cfg.model().n_embd(), 128);
  EXPECT_TRUE(cfg.data().token_dtype().empty());
}

// The messages of each model's and dataset's rules.
TEST(RegisteredModels, ModelAndDataRules) {
  EXPECT_EQ(ValidationError("model { n_embd: 250 }"),
            "model.n_embd (250) is not a multiple of model.n_head (4) for model \"gpt-mini\"");
  EXPECT_THAT(ValidationError("model { n_head: 5 }"),
              AllOf(HasSubstr("model.n_embd (256)"), HasSubstr("model.n_head (5)")));
  EXPECT_THAT(ValidationError("model { name: \"gpt2-124m\" n_head: 10 } "
                              "data { dataset: \"tokens\" path: \"x\" }"),
              AllOf(HasSubstr("model.n_embd (768)"), HasSubstr("model.n_head (10)"),
                    HasSubstr("\"gpt2-124m\"")));
  EXPECT_EQ(ValidationError("model { n_head: 8 n_layer: 2 }"), "");
  EXPECT_EQ(ValidationError("model { name: \"mlp\" }"),
            "model.name \"mlp\" cannot train on data.dataset \"moby-dick\": \"mlp\" takes "
            "labelled 28x28 images (data.dataset \"mnist\"), \"moby-dick\" yields tokens");
  EXPECT_EQ(ValidationError("data { dataset: \"mnist\" }"),
            "model.name \"gpt-mini\" cannot train on data.dataset \"mnist\": \"gpt-mini\" takes "
            "tokens (data.dataset \"moby-dick\" or \"tokens\"), \"mnist\" yields labelled 28x28 "
            "images");
  EXPECT_EQ(ValidationError("model { name: \"mlp\" n_layer: 1 n_embd: 64 } "
                            "data { dataset: \"mnist\" }"),
            "");
  // Braid's mlp has one hidden layer: another n_layer is refused when validating, not building.
  EXPECT_THAT(ValidationError("model { name: \"mlp\" n_layer: 2 } data { dataset: \"mnist\" }"),
              HasSubstr("model.n_layer (2) does not apply to model \"mlp\": it has exactly one "
                        "hidden layer"));
  EXPECT_EQ(ValidationError("model { name: \"mlp\" block_size: 8 } data { dataset: \"mnist\" }"),
            "model.block_size does not apply to model \"mlp\" (it takes n_layer and n_embd only)");
  EXPECT_EQ(ValidationError("model { vocab_size: 100 }"),
            "model.vocab_size (100) < 256: data.dataset \"moby-dick\" has 256 token values");
  EXPECT_EQ(ValidationError("model { vocab_size: 100 } data { dataset: \"tokens\" path: \"x\" }"),
            "");
  EXPECT_EQ(ValidationError("data { token_dtype: \"u16\" }"),
            "data.token_dtype (\"u16\") must be \"u8\" for data.dataset \"moby-dick\"");
  EXPECT_EQ(ValidationError("data { dataset: \"tokens\" }"),
            "data.path is empty: data.dataset \"tokens\" needs a prepared data set's folder or "
            "manifest.json (bazel run //tools:prepare_data), or a flat token file");
  EXPECT_THAT(ValidationError("data { dataset: \"tokens\" path: \"x\" token_dtype: \"u64\" }"),
              HasSubstr("data.token_dtype \"u64\" is unknown; known: u8, u16, u32"));
  EXPECT_EQ(
      ValidationError("model { name: \"mlp\" } data { dataset: \"mnist\" token_dtype: \"u8\" }"),
      "data.token_dtype (\"u8\") does not apply to data.dataset \"mnist\" (it has no tokens)");
}

std::map<std::string, std::vector<int64_t>> Shapes(Module& m) {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (auto& [name, t] : m.NamedParameters()) shapes[name] = t.shape();
  return shapes;
}

TEST(RegisteredModels, BuiltFromTheValidatedConfig) {
  TrainConfig cfg = Text("model { n_layer: 1 n_embd: 64 n_head: 2 block_size: 16 }");
  ASSERT_TRUE(ValidateConfig(&cfg, 1, {}).ok());
  auto model = Registry::Get().MakeModel(cfg.model().name(), cfg.model(), 7, Device::CPU());
  ASSERT_TRUE(model.ok()) << model.status();
  auto* gpt = dynamic_cast<models::Gpt*>(model->get());
  ASSERT_NE(gpt, nullptr);
  EXPECT_EQ(gpt->config().n_layer, 1);
  EXPECT_EQ(gpt->config().n_embd, 64);
  EXPECT_EQ(gpt->config().block_size, 16);
  EXPECT_EQ(gpt->config().padded_vocab_size, 256);
  EXPECT_EQ(gpt->config().seed, 7u);

  // The preset, built through the registry, is the preset.
  cfg = TrainConfig();
  ASSERT_TRUE(ValidateConfig(&cfg, 1, {}).ok());
  model = Registry::Get().MakeModel(cfg.model().name(), cfg.model(), 1234, Device::CPU());
  ASSERT_TRUE(model.ok()) << model.status();
  models::Gpt reference(models::GptConfig::Mini());
  EXPECT_EQ(Shapes(**model), Shapes(reference));

  cfg = Text("model { name: \"mlp\" n_embd: 32 } data { dataset: \"mnist\" }");
  ASSERT_TRUE(ValidateConfig(&cfg, 1, {}).ok());
  model = Registry::Get().MakeModel("mlp", cfg.model(), 1, Device::CPU());
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(Shapes(**model)["fc1.weight"], (std::vector<int64_t>{32, 784}));
}

TEST(RegisteredOptimizers, BuiltFromTheValidatedConfig) {
  TrainConfig cfg = Text("optimizer { type: \"sgd\" params { momentum: 0.5 } }");
  ASSERT_TRUE(ValidateConfig(&cfg, 1, {}).ok());
  auto sgd = Registry::Get().MakeOptimizer(cfg.optimizer().type(), {}, cfg.optimizer());
  ASSERT_TRUE(sgd.ok()) << sgd.status();
  EXPECT_NE(*sgd, nullptr);
  cfg = TrainConfig();
  ASSERT_TRUE(ValidateConfig(&cfg, 1, {}).ok());
  auto adamw = Registry::Get().MakeOptimizer(cfg.optimizer().type(), {}, cfg.optimizer());
  ASSERT_TRUE(adamw.ok()) << adamw.status();
  EXPECT_NE((*adamw)->name(), (*sgd)->name());
}

}  // namespace
}  // namespace braid::config
