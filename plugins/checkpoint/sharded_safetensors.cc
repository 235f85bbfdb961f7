#include "plugins/checkpoint/sharded_safetensors.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/check.h"
#include "plugins/checkpoint/safetensors.h"
#include "plugins/checkpoint/safetensors_internal.h"

namespace braid {
namespace {

namespace fs = std::filesystem;
using safetensors_internal::Json;

constexpr char kIndex[] = "model.safetensors.index.json";
constexpr char kSingle[] = "model.safetensors";

absl::StatusOr<std::map<std::string, Tensor>> LoadIndexed(const std::string& index) {
  std::ifstream in(index);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read '", index, "'"));
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<Json> j = safetensors_internal::ParseJson(text.str());
  if (!j.ok()) return absl::InvalidArgumentError(absl::StrCat(index, ": ", j.status().message()));
  if (!j->is_object() || !j->contains("weight_map") || !(*j)["weight_map"].is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        index, ": no \"weight_map\" object (a Hugging Face index maps each tensor to its shard)"));
  }
  // Shard file -> the tensors the index puts there.
  std::map<std::string, std::set<std::string>> shards;
  for (auto& [name, file] : (*j)["weight_map"].items()) {
    if (!file.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index, ": weight_map[\"", name, "\"] is not a file name"));
    }
    const std::string f = file.get<std::string>();
    if (f.find('/') != std::string::npos || f == "." || f == "..") {
      return absl::InvalidArgumentError(absl::StrCat(
          index, ": weight_map[\"", name, "\"] is '", f, "', not a file beside the index"));
    }
    shards[f].insert(name);
  }
  const fs::path dir = fs::path(index).parent_path();
  std::map<std::string, Tensor> all;
  for (auto& [file, names] : shards) {
    const std::string path = (dir / file).string();
    BRAID_ASSIGN_OR_RETURN(auto tensors, LoadSafetensors(path));
    std::vector<std::string> absent, extra;
    for (const std::string& n : names) {
      if (!tensors.count(n)) absent.push_back(n);
    }
    for (auto& [n, t] : tensors) {
      if (!names.count(n)) extra.push_back(n);
    }
    if (!absent.empty() || !extra.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, " does not hold what ", index, " says:",
          absent.empty() ? "" : absl::StrCat(" missing ", absl::StrJoin(absent, ", "), ";"),
          extra.empty() ? "" : absl::StrCat(" not in the index: ", absl::StrJoin(extra, ", "))));
    }
    for (auto& [n, t] : tensors) all.emplace(n, std::move(t));
  }
  return all;
}

}  // namespace

absl::StatusOr<std::map<std::string, Tensor>> LoadSafetensorsWeights(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path dir(path);
    if (fs::exists(dir / kIndex, ec)) return LoadIndexed((dir / kIndex).string());
    if (fs::exists(dir / kSingle, ec)) return LoadSafetensors((dir / kSingle).string());
    return absl::NotFoundError(absl::StrCat("folder '", path, "' holds neither ", kIndex,
                                            " nor ", kSingle));
  }
  if (absl::EndsWith(path, ".json")) return LoadIndexed(path);
  return LoadSafetensors(path);
}

}  // namespace braid
