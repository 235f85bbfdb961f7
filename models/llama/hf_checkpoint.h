// What a Hugging Face Llama checkpoint holds beside a Braid Llama's own parameters, whose names
// are Hugging Face's: a tied model's checkpoint may carry lm_head.weight, a copy of the
// embedding. Reading the files is the training program's (plugins/checkpoint/safetensors.h);
// the model only adapts the names it is handed (its registration's adapt_weights).
#ifndef BRAID_MODELS_LLAMA_HF_CHECKPOINT_H_
#define BRAID_MODELS_LLAMA_HF_CHECKPOINT_H_

#include <map>
#include <string>

#include "core/tensor.h"
#include "models/llama/llama.h"

namespace braid::models {

// Drops what a checkpoint of a model of `config`'s shape may hold beside the model's own
// parameters: a tied head's copy, lm_head.weight, when it equals the embedding.
void DropTiedCopies(const LlamaConfig& config, std::map<std::string, Tensor>* weights);

}  // namespace braid::models

#endif  // BRAID_MODELS_LLAMA_HF_CHECKPOINT_H_
