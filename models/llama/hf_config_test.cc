// Reading Hugging Face's config.json: the shape fields, Hugging Face's defaults for the ones left
// out, and every field the model cannot honour named in one message.
#include "models/llama/hf_config.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace braid::models {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// TinyLlama-1.1B's config.json, as published.
constexpr char kTinyLlama[] = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "bos_token_id": 1,
  "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
  "intermediate_size": 5632, "max_position_embeddings": 2048, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 22, "num_key_value_heads": 4,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 10000.0,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.35.0",
  "use_cache": true, "vocab_size": 32000})";

TEST(HfConfig, ReadsTheShape) {
  absl::StatusOr<LlamaConfig> c = ParseHfLlamaConfig(kTinyLlama, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->n_embd, 2048);
  EXPECT_EQ(c->intermediate_size, 5632);
  EXPECT_EQ(c->n_head, 32);
  EXPECT_EQ(c->n_kv_head, 4);
  EXPECT_EQ(c->n_layer, 22);
  EXPECT_EQ(c->vocab_size, 32000);
  EXPECT_EQ(c->block_size, 2048);
  EXPECT_FLOAT_EQ(c->rms_norm_eps, 1e-5f);
  EXPECT_FLOAT_EQ(c->rope_theta, 10000.0f);
  EXPECT_FALSE(c->tie_embeddings);
  EXPECT_EQ(c->rope_scaling, "");
}

TEST(HfConfig, DefaultsAreHuggingFaces) {
  absl::StatusOr<LlamaConfig> c = ParseHfLlamaConfig(
      R"({"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
          "num_hidden_layers": 2, "vocab_size": 100, "tie_word_embeddings": true,
          "rope_theta": 500000.0, "rope_scaling": {"type": "linear", "factor": 4.0}})",
      "c.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->n_kv_head, 4);  // num_key_value_heads left out: plain multi-head attention
  EXPECT_FLOAT_EQ(c->rms_norm_eps, 1e-6f);
  EXPECT_EQ(c->block_size, 2048);
  EXPECT_TRUE(c->tie_embeddings);
  EXPECT_FLOAT_EQ(c->rope_theta, 500000.0f);
  EXPECT_EQ(c->rope_scaling, "linear");
  EXPECT_FLOAT_EQ(c->rope_scaling_factor, 4.0f);
}

TEST(HfConfig, UnsupportedFieldsAreNamedInOneMessage) {
  EXPECT_EQ(ParseHfLlamaConfig(
                R"({"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
                    "num_hidden_layers": 2, "vocab_size": 100,
                    "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})",
                "c.json")
                .status()
                .message(),
            "c.json: rope_scaling {\"factor\":8.0,\"rope_type\":\"llama3\"} is not supported "
            "(supported: type \"linear\", or null)");
  absl::Status st = ParseHfLlamaConfig(
                        R"({"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
                            "vocab_size": 100, "attention_bias": true, "hidden_act": "gelu",
                            "sliding_window": 4096, "qk_layernorm": true})",
                        "c.json")
                        .status();
  EXPECT_THAT(st.message(),
              AllOf(HasSubstr("c.json: 5 problems: intermediate_size is missing"),
                    HasSubstr("attention_bias true is not supported (the model has no biases)"),
                    HasSubstr("hidden_act \"gelu\" is not supported"),
                    HasSubstr("sliding_window 4096 is not supported"),
                    HasSubstr("qk_layernorm is not a field Braid's llama knows")));
  EXPECT_THAT(ParseHfLlamaConfig(R"({"hidden_size": 64, "intermediate_size": 96,
                                     "num_attention_heads": 4, "num_key_value_heads": 3,
                                     "num_hidden_layers": 2, "vocab_size": 100})",
                                 "c.json")
                  .status()
                  .message(),
              HasSubstr("n_head (4) is not a multiple of n_kv_head (3)"));
  EXPECT_THAT(ParseHfLlamaConfig("[1, 2", "c.json").status().message(),
              HasSubstr("c.json: not a JSON object"));
  EXPECT_THAT(ReadHfLlamaConfig("/nonexistent/folder").status().message(),
              HasSubstr("cannot read Hugging Face config '/nonexistent/folder'"));
}

}  // namespace
}  // namespace braid::models
