// "llama" and "llama-mini" as config validation sees them through the registry: the options
// they declare, the shape validation writes back, and the messages for a bad shape.
#include <memory>
#include <string>

#include "launcher/config/config.h"
#include "core/registry.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/llama/llama.h"

namespace braid::config {
namespace {

using ::testing::HasSubstr;

TrainConfig Validated(const std::string& text, std::string* error) {
  auto cfg = ParseTextConfig(text, "test.pbtxt");
  EXPECT_TRUE(cfg.ok()) << cfg.status();
  if (!cfg.ok()) return TrainConfig();
  absl::Status st = ValidateConfig(&*cfg, 1, {});
  *error = st.ok() ? "" : std::string(st.message());
  return *cfg;
}

std::string Opt(const std::string& key, const std::string& value) {
  return "options { key: \"" + key + "\" value: \"" + value + "\" } ";
}

TEST(LlamaConfig, ValidationWritesTheWholeShapeBack) {
  std::string error;
  TrainConfig cfg = Validated("model { name: \"llama-mini\" }", &error);
  ASSERT_EQ(error, "");
  const ModelConfig& m = cfg.model();
  EXPECT_EQ(m.n_layer(), 4);
  EXPECT_EQ(m.n_head(), 4);
  EXPECT_EQ(m.n_embd(), 256);
  EXPECT_EQ(m.block_size(), 128);
  EXPECT_EQ(m.vocab_size(), 256);
  EXPECT_EQ(m.options().at("n_kv_head"), "2");
  EXPECT_EQ(m.options().at("intermediate_size"), "768");
  EXPECT_EQ(m.options().at("rope_theta"), "10000");
  EXPECT_EQ(m.options().at("rms_norm_eps"), "1e-05");
  EXPECT_EQ(m.options().at("tie_embeddings"), "false");
  EXPECT_EQ(m.options().at("rope_scaling"), "none");

  cfg = Validated("model { name: \"llama\" n_layer: 2 n_embd: 64 " + Opt("n_kv_head", "1") +
                      Opt("tie_embeddings", "true") + Opt("rope_theta", "500000") + "}",
                  &error);
  ASSERT_EQ(error, "");
  absl::StatusOr<std::unique_ptr<Module>> built =
      Registry::Get().MakeModel("llama", cfg.model(), 1, Device::CPU());
  ASSERT_TRUE(built.ok()) << built.status();
  auto* llama = dynamic_cast<models::Llama*>(built->get());
  ASSERT_NE(llama, nullptr);
  EXPECT_EQ(llama->config().n_layer, 2);
  EXPECT_EQ(llama->config().n_embd, 64);
  EXPECT_EQ(llama->config().n_kv_head, 1);
  EXPECT_TRUE(llama->config().tie_embeddings);
  EXPECT_FLOAT_EQ(llama->config().rope_theta, 500000.0f);
  EXPECT_EQ(llama->StateDict().count("lm_head.weight"), 0u);
}

TEST(LlamaConfig, BadShapesAndOptionsAreNamed) {
  std::string error;
  Validated("model { name: \"llama\" " + Opt("n_kv_head", "3") + "}", &error);
  EXPECT_EQ(error,
            "model \"llama\": n_head (4) is not a multiple of n_kv_head (3): each K/V head serves "
            "a whole group of query heads");
  Validated("model { name: \"llama\" " + Opt("n_kv_heads", "2") + "}", &error);
  EXPECT_THAT(error, HasSubstr("model.options \"n_kv_heads\" does not apply to model \"llama\" "
                               "(it takes n_kv_head, intermediate_size, rope_theta"));
  Validated("model { name: \"llama\" vocab_size: 100 }", &error);
  EXPECT_EQ(error, "model.vocab_size (100) < 256: data.dataset \"moby-dick\" has 256 token values");
  Validated("model { name: \"llama\" " + Opt("rope_scaling", "yarn") + "}", &error);
  EXPECT_THAT(error, HasSubstr("rope_scaling \"yarn\" is not supported"));
  Validated("model { name: \"llama\" " + Opt("hf_config", "no/such/config.json") + "}", &error);
  EXPECT_THAT(error, HasSubstr("model.options \"hf_config\": cannot read Hugging Face config "
                               "'no/such/config.json'"));
  Validated("model { name: \"llama\" stable_embedding: true }", &error);
  EXPECT_THAT(error, HasSubstr("model.stable_embedding does not apply to model \"llama\""));
}

}  // namespace
}  // namespace braid::config
