#include "models/llama/hf_checkpoint.h"

#include "core/check.h"
#include "core/sharded_safetensors.h"
#include "core/weights_match.h"

namespace braid::models {

void DropTiedCopies(const LlamaConfig& config, std::map<std::string, Tensor>* weights) {
  auto head = weights->find("lm_head.weight");
  auto embed = weights->find("model.embed_tokens.weight");
  if (!config.tie_embeddings || head == weights->end() || embed == weights->end()) return;
  // Only a true copy: an untied checkpoint's own head stays, to be reported as not in the model.
  if (head->second.shape() == embed->second.shape() &&
      head->second.ToFloatVector() == embed->second.ToFloatVector()) {
    weights->erase(head);
  }
}

absl::StatusOr<std::map<std::string, Tensor>> LoadHfWeights(const std::string& path,
                                                            const Llama& model) {
  BRAID_ASSIGN_OR_RETURN(auto weights, LoadSafetensorsWeights(path));
  DropTiedCopies(model.config(), &weights);
  std::map<std::string, Shape> shapes;
  for (auto& [name, t] : model.NamedParameters()) shapes[name] = t.shape();
  BRAID_RETURN_IF_ERROR(CheckWeightsMatch(shapes, weights, path));
  return weights;
}

}  // namespace braid::models
