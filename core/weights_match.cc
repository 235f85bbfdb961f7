#include "core/weights_match.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/edit_distance.h"

namespace braid {
namespace {

// The name of `candidates` nearest to `name` ("" when there are none); ties go to the first.
std::string Nearest(const std::string& name, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = std::numeric_limits<size_t>::max();
  for (const std::string& c : candidates) {
    const size_t d = EditDistance(name, c, /*ignore_case=*/false, best_distance);
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  return best;
}

}  // namespace

absl::Status CheckWeightsMatch(const std::map<std::string, Shape>& model,
                               const std::map<std::string, Tensor>& weights,
                               const std::string& origin) {
  std::vector<std::string> missing, unexpected, shapes;
  for (auto& [name, shape] : model) {
    auto it = weights.find(name);
    if (it == weights.end()) {
      missing.push_back(name);
    } else if (it->second.shape() != shape) {
      shapes.push_back(absl::StrCat(name, " is ", ShapeToString(it->second.shape()),
                                    ", the model's ", ShapeToString(shape)));
    }
  }
  for (auto& [name, t] : weights) {
    if (!model.count(name)) unexpected.push_back(name);
  }
  if (missing.empty() && unexpected.empty() && shapes.empty()) return absl::OkStatus();
  // A missing name is most likely one of the unexpected ones misspelt, and the other way round;
  // with nothing on the other side, the nearest of all its names.
  std::vector<std::string> all_model, all_file;
  for (auto& [name, shape] : model) all_model.push_back(name);
  for (auto& [name, t] : weights) all_file.push_back(name);
  std::vector<std::string> problems;
  for (const std::string& name : missing) {
    const std::string near = Nearest(name, unexpected.empty() ? all_file : unexpected);
    problems.push_back(absl::StrCat("missing ", name,
                                    near.empty() ? "" : absl::StrCat(" (nearest in the file: ", near, ")")));
  }
  for (const std::string& name : unexpected) {
    const std::string near = Nearest(name, missing.empty() ? all_model : missing);
    problems.push_back(absl::StrCat("not in the model: ", name,
                                    near.empty() ? "" : absl::StrCat(" (nearest in the model: ", near, ")")));
  }
  for (std::string& s : shapes) problems.push_back(std::move(s));
  return absl::InvalidArgumentError(absl::StrCat(
      origin, " does not match the model (", problems.size(), " problem",
      problems.size() == 1 ? "" : "s", "): ", absl::StrJoin(problems, "; ")));
}

}  // namespace braid
