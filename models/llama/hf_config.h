// Reading a Hugging Face config.json (LlamaForCausalLM and the models of its shape: Mistral
// without a sliding window, SmolLM, TinyLlama) into a LlamaConfig: hidden_size,
// intermediate_size, num_attention_heads, num_key_value_heads, num_hidden_layers, rms_norm_eps,
// rope_theta, rope_scaling (linear), vocab_size, max_position_embeddings, tie_word_embeddings.
// What the model cannot honour (a rope_scaling type it lacks, biases, an activation other than
// SiLU, a field it does not know) is refused, every such field named in one message.
#ifndef BRAID_MODELS_LLAMA_HF_CONFIG_H_
#define BRAID_MODELS_LLAMA_HF_CONFIG_H_

#include <string>

#include "absl/status/statusor.h"
#include "models/llama/llama.h"

namespace braid::models {

// `path` is config.json itself or the folder that holds it. The fields config.json leaves out
// keep Hugging Face's LlamaConfig defaults (num_key_value_heads = num_attention_heads,
// rope_theta 10000, rms_norm_eps 1e-6, tie_word_embeddings false).
absl::StatusOr<LlamaConfig> ReadHfLlamaConfig(const std::string& path);

// The same from the text of a config.json; `origin` names it in messages.
absl::StatusOr<LlamaConfig> ParseHfLlamaConfig(const std::string& json, const std::string& origin);

}  // namespace braid::models

#endif  // BRAID_MODELS_LLAMA_HF_CONFIG_H_
