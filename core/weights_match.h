// Checking weights read from a file against the model they are for, before anything is copied:
// every missing name, every name the model lacks and every shape that differs, in one message,
// each unmatched name with the nearest one on the other side (a renamed or misspelt tensor shows
// as the pair it is).
#ifndef BRAID_CORE_WEIGHTS_MATCH_H_
#define BRAID_CORE_WEIGHTS_MATCH_H_

#include <map>
#include <string>

#include "absl/status/status.h"
#include "core/tensor.h"

namespace braid {

// `model`: the model's parameter names and full shapes (Module::NamedParameters); `weights`: the
// file's tensors; `origin` names the file in the message. OK when the names and shapes are the
// same.
absl::Status CheckWeightsMatch(const std::map<std::string, Shape>& model,
                               const std::map<std::string, Tensor>& weights,
                               const std::string& origin);

}  // namespace braid

#endif  // BRAID_CORE_WEIGHTS_MATCH_H_
