// A model read back by its config for sampling: a Llama (and a GPT) built through the registry
// from the config's model section, loaded with the weights a run saved, computing what the saved
// model computed, with the model's own cached decoder; and the errors of each bad input.
#include "tools/sample/load_model.h"

#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/autograd.h"
#include "gtest/gtest.h"
#include "launcher/config/config.h"
#include "plugins/checkpoint/safetensors.h"
#include "tools/sample/test_gpt.h"
#include "tools/sample/test_llama.h"

namespace braid::tools {
namespace {

std::string Tmp(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

std::vector<float> Logits(Module& m) {
  autograd::NoGradGuard no_grad;
  return m.Forward(Tensor::FromVector(std::vector<int32_t>{1, 5, 9, 2}, {1, 4})).ToFloatVector();
}

config::TrainConfig Config(const std::string& text) {
  absl::StatusOr<config::TrainConfig> c = config::ParseTextConfig(text, "test");
  BRAID_CHECK(c.ok()) << c.status().ToString();
  return *c;
}

// The tiny Llama of test_llama.h with the byte vocabulary the default dataset has.
const char kLlamaConfig[] = R"(
  model { name: "llama" n_layer: 2 n_head: 4 n_embd: 32 block_size: 24 vocab_size: 256
          options { key: "n_kv_head" value: "2" }
          options { key: "intermediate_size" value: "64" } })";

TEST(LoadModel, ALlamaByItsConfigComputesWhatWasSaved) {
  auto saved = TestLlama(3, 256);
  const std::string path = Tmp("llama.safetensors");
  ASSERT_TRUE(SaveSafetensors(path, saved->StateDict()).ok());
  absl::StatusOr<LoadedModel> got = LoadModel(Config(kLlamaConfig), path, {});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->cached);  // Llama's registration supplies its key/value cache
  EXPECT_EQ(got->model->type_name(), "Llama");
  EXPECT_EQ(got->section.options().at("n_kv_head"), "2");
  EXPECT_EQ(Logits(*got->model), Logits(*saved));  // the same weights and computation: bitwise
  EXPECT_EQ(got->decoder->capacity(), 24);
  EXPECT_EQ(got->decoder->vocab_rows(), 256);
}

TEST(LoadModel, AHuggingFaceCheckpointFolder) {
  auto saved = TestLlama(4, 256);
  const std::string dir = Tmp("hf");
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(SaveSafetensors(dir + "/model.safetensors", saved->StateDict()).ok());
  absl::StatusOr<LoadedModel> got = LoadModel(Config(kLlamaConfig), dir, {});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(Logits(*got->model), Logits(*saved));
}

TEST(LoadModel, AGptByItsConfig) {
  auto saved = TestGpt(2, 256);
  const std::string path = Tmp("gpt.safetensors");
  ASSERT_TRUE(SaveSafetensors(path, saved->StateDict()).ok());
  absl::StatusOr<LoadedModel> got = LoadModel(
      Config(R"(model { name: "gpt-mini" n_layer: 2 n_head: 4 n_embd: 32 block_size: 24 })"), path,
      {});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->cached);
  EXPECT_EQ(Logits(*got->model), Logits(*saved));
}

TEST(LoadModel, WeightsOfAnotherShapeListEveryMismatch) {
  auto saved = TestLlama(3, 256);
  const std::string path = Tmp("llama2.safetensors");
  ASSERT_TRUE(SaveSafetensors(path, saved->StateDict()).ok());
  std::string three_layers = kLlamaConfig;
  three_layers.replace(three_layers.find("n_layer: 2"), 10, "n_layer: 3");
  absl::StatusOr<LoadedModel> got = LoadModel(Config(three_layers), path, {});
  ASSERT_FALSE(got.ok());
  const std::string msg(got.status().message());
  EXPECT_NE(msg.find("model.layers.2.self_attn.q_proj.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.layers.2.mlp.down_proj.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("llama2.safetensors"), std::string::npos) << msg;
}

TEST(LoadModel, AnUnknownModelNamesTheKnownOnes) {
  absl::StatusOr<LoadedModel> got =
      LoadModel(Config(R"(model { name: "mistral-7b" })"), Tmp("none.safetensors"), {});
  ASSERT_FALSE(got.ok());
  const std::string msg(got.status().message());
  EXPECT_NE(msg.find("mistral-7b"), std::string::npos) << msg;
  EXPECT_NE(msg.find("llama"), std::string::npos) << msg;
}

}  // namespace
}  // namespace braid::tools
