// A trained GPT read back for inference from its weights alone (load_weights.h), when no config
// says which model they are (load_model.h reads any model by its config).
//
// The shape comes from the weights themselves (layers, width, context, vocabulary rows,
// stable_embedding); only the head count is not in any tensor's shape: it is read from the
// weights' "n_head" metadata when the writer left one, else given by the caller, else taken from
// the preset of that width (gpt-mini 256 → 4, gpt2-124m 768 → 12).
#ifndef BRAID_TOOLS_SAMPLE_LOAD_GPT_H_
#define BRAID_TOOLS_SAMPLE_LOAD_GPT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "models/gpt/gpt.h"
#include "tools/sample/load_weights.h"

namespace braid::tools {

// The GptConfig these weights fit. n_head: > 0 to force it; 0 for the metadata or the preset.
absl::StatusOr<models::GptConfig> GptConfigFromWeights(const LoadedWeights& w, int n_head);

// Builds the model and loads the weights into it (strict: every name, every shape; a nanoGPT
// state dict's copy of the tied head, lm_head.weight, is dropped).
absl::StatusOr<std::unique_ptr<models::Gpt>> LoadGpt(const std::string& path, int n_head);

}  // namespace braid::tools

#endif  // BRAID_TOOLS_SAMPLE_LOAD_GPT_H_
