// A trained GPT read back for inference: from a save_to .safetensors file, or from a training
// checkpoint folder (plugins/checkpoint's sharded format: a step_<N> folder, or the folder
// holding them, whose newest complete step is taken), assembled into full tensors in one
// process whatever layout wrote it.
//
// The shape comes from the weights themselves (layers, width, context, vocabulary rows,
// stable_embedding); only the head count is not in any tensor's shape: it is read from the
// weights' "n_head" metadata when the writer left one, else given by the caller, else taken from
// the preset of that width (gpt-mini 256 → 4, gpt2-124m 768 → 12).
#ifndef BRAID_TOOLS_SAMPLE_LOAD_GPT_H_
#define BRAID_TOOLS_SAMPLE_LOAD_GPT_H_

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "models/gpt/gpt.h"

namespace braid::tools {

struct LoadedWeights {
  std::map<std::string, Tensor> tensors;  // full tensors, on the CPU, optimizer state left out
  std::map<std::string, std::string> metadata;
  std::string source;  // the file or step folder actually read, for messages
};

// `path` is a .safetensors file or a checkpoint folder. Errors are one line naming the path.
absl::StatusOr<LoadedWeights> LoadWeights(const std::string& path);

// The GptConfig these weights fit. n_head: > 0 to force it; 0 for the metadata or the preset.
absl::StatusOr<models::GptConfig> GptConfigFromWeights(const LoadedWeights& w, int n_head);

// Builds the model and loads the weights into it (strict: every name, every shape).
absl::StatusOr<std::unique_ptr<models::Gpt>> LoadGpt(const std::string& path, int n_head);

}  // namespace braid::tools

#endif  // BRAID_TOOLS_SAMPLE_LOAD_GPT_H_
