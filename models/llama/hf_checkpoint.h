// A Hugging Face Llama checkpoint's weights for a Braid Llama: model.safetensors or the shards of
// model.safetensors.index.json (core/sharded_safetensors.h), under Hugging Face's names, which are
// the model's own. A tied model's checkpoint may carry lm_head.weight, a copy of the embedding:
// it is dropped (a head that differs from the embedding is not a copy, and is refused). Names
// and shapes are checked against the model, every mismatch named at once.
#ifndef BRAID_MODELS_LLAMA_HF_CHECKPOINT_H_
#define BRAID_MODELS_LLAMA_HF_CHECKPOINT_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "models/llama/llama.h"

namespace braid::models {

// `path`: a checkpoint folder, its index (*.json) or one .safetensors file. The result loads
// into `model` with LoadStateDict.
absl::StatusOr<std::map<std::string, Tensor>> LoadHfWeights(const std::string& path,
                                                            const Llama& model);

// Drops what a checkpoint of a model of `config`'s shape may hold beside the model's own
// parameters: a tied head's copy, lm_head.weight, when it equals the embedding.
void DropTiedCopies(const LlamaConfig& config, std::map<std::string, Tensor>* weights);

}  // namespace braid::models

#endif  // BRAID_MODELS_LLAMA_HF_CHECKPOINT_H_
