#include "models/llama/hf_checkpoint.h"

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

}  // namespace braid::models
