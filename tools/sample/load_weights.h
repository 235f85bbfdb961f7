// A trained model's weights read back for inference, whole, in one process, whatever layout
// wrote them: a save_to .safetensors file; a training checkpoint folder (plugins/checkpoint's
// sharded format: a step_<N> folder, or the folder holding them, whose newest complete step is
// taken); or a Hugging Face checkpoint (a folder with model.safetensors.index.json and its
// shards, or model.safetensors; or the index file itself).
#ifndef BRAID_TOOLS_SAMPLE_LOAD_WEIGHTS_H_
#define BRAID_TOOLS_SAMPLE_LOAD_WEIGHTS_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace braid::tools {

struct LoadedWeights {
  std::map<std::string, Tensor> tensors;  // full tensors, on the CPU, optimizer state left out
  std::map<std::string, std::string> metadata;  // a save_to file's or rank 0's notes
  std::string source;  // the file or step folder actually read, for messages
};

// Errors are one line naming the path.
absl::StatusOr<LoadedWeights> LoadWeights(const std::string& path);

}  // namespace braid::tools

#endif  // BRAID_TOOLS_SAMPLE_LOAD_WEIGHTS_H_
