// Weights as Hugging Face stores them: one safetensors file, or shards
// (model-00001-of-00003.safetensors, ...) listed by model.safetensors.index.json, whose
// "weight_map" gives each tensor's shard. Loading reads every shard the index names and checks
// that each holds exactly the tensors the index gives it.
#ifndef BRAID_PLUGINS_CHECKPOINT_SHARDED_SAFETENSORS_H_
#define BRAID_PLUGINS_CHECKPOINT_SHARDED_SAFETENSORS_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace braid {

// `path` is a .safetensors file, an index (*.json), or a folder holding
// model.safetensors.index.json or model.safetensors (Hugging Face's names, in that order).
// Errors name the file and the tensor.
absl::StatusOr<std::map<std::string, Tensor>> LoadSafetensorsWeights(const std::string& path);

}  // namespace braid

#endif  // BRAID_PLUGINS_CHECKPOINT_SHARDED_SAFETENSORS_H_
