#include "tools/sample/load_weights.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "plugins/checkpoint/checkpoint_index.h"
#include "plugins/checkpoint/safetensors.h"
#include "plugins/checkpoint/sharded_safetensors.h"

namespace braid::tools {
namespace {

namespace fs = std::filesystem;

// The step folder to read under `dir`: `dir` itself when it has an index.json, else its
// step_<N> child with the largest N that has one (a folder without an index is unfinished).
absl::StatusOr<std::string> StepFolder(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(fs::path(dir) / "index.json", ec)) return dir;
  int64_t best = -1;
  std::string found;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    int64_t step = 0;
    if (!absl::StartsWith(name, "step_") || !absl::SimpleAtoi(name.substr(5), &step)) continue;
    if (step > best && fs::exists(e.path() / "index.json", ec)) {
      best = step;
      found = e.path().string();
    }
  }
  if (ec) return absl::NotFoundError(absl::StrCat(dir, ": cannot list it (", ec.message(), ")"));
  if (found.empty()) {
    return absl::NotFoundError(absl::StrCat(
        dir, " holds no complete checkpoint (no index.json, no step_<N>/index.json); name a "
             ".safetensors file or a checkpoint folder"));
  }
  return found;
}

// Every model tensor of checkpoint folder `dir`, whole: each chunk's elements go to the runs of
// the global flat index the index gives them.
absl::StatusOr<LoadedWeights> LoadCheckpoint(const std::string& dir) {
  BRAID_ASSIGN_OR_RETURN(std::string step, StepFolder(dir));
  const std::string index_path = step + "/index.json";
  std::ifstream in(index_path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in) return absl::NotFoundError(absl::StrCat(index_path, ": cannot read it"));
  BRAID_ASSIGN_OR_RETURN(checkpoint::CheckpointIndex index,
                         checkpoint::ParseCheckpointIndex(text.str(), index_path));
  LoadedWeights out;
  out.source = step;
  // Rank 0's notes: the trainer leaves n_head there (every rank writes the same).
  if (auto r0 = index.extra.find(0); r0 != index.extra.end()) out.metadata = r0->second;
  std::map<std::string, std::map<std::string, Tensor>> files;  // read once each, when needed
  for (const auto& [name, t] : index.tensors) {
    if (absl::StartsWith(name, "optimizer/")) continue;
    std::vector<float> whole(size_t(NumElements(t.shape)), 0.0f);
    for (const checkpoint::IndexedChunk& c : t.chunks) {
      if (!files.count(c.file)) {
        BRAID_ASSIGN_OR_RETURN(files[c.file], LoadSafetensors(step + "/" + c.file));
      }
      auto found = files[c.file].find(c.key);
      if (found == files[c.file].end()) {
        return absl::DataLossError(
            absl::StrCat(step, "/", c.file, " lacks ", c.key, ", which index.json places there"));
      }
      std::vector<float> part = found->second.ToFloatVector();
      size_t at = 0;
      for (const auto& [begin, end] : c.runs) {
        if (at + size_t(end - begin) > part.size()) {
          return absl::DataLossError(absl::StrCat(step, "/", c.file, ": ", c.key, " holds ",
                                                  part.size(), " elements, fewer than index.json places"));
        }
        std::copy(part.begin() + at, part.begin() + at + (end - begin), whole.begin() + begin);
        at += size_t(end - begin);
      }
    }
    out.tensors[name] = Tensor::FromVector(whole, t.shape);
  }
  return out;
}

// Hugging Face's layout: a folder of shards and their index, the index itself, or
// model.safetensors (plugins/checkpoint/sharded_safetensors.h).
absl::StatusOr<LoadedWeights> LoadHuggingFace(const std::string& path) {
  LoadedWeights out;
  BRAID_ASSIGN_OR_RETURN(out.tensors, LoadSafetensorsWeights(path));
  out.source = path;
  return out;
}

}  // namespace

absl::StatusOr<LoadedWeights> LoadWeights(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    return absl::NotFoundError(
        absl::StrCat(path, ": no such file or folder; name a .safetensors file (save_to) or a "
                           "checkpoint folder (checkpoint.dir)"));
  }
  if (fs::is_directory(path, ec)) {
    // A Hugging Face checkpoint folder (its shards' index, or one model.safetensors) when it is
    // not one of our training checkpoints.
    if (!fs::exists(fs::path(path) / "index.json", ec) &&
        (fs::exists(fs::path(path) / "model.safetensors.index.json", ec) ||
         fs::exists(fs::path(path) / "model.safetensors", ec))) {
      return LoadHuggingFace(path);
    }
    return LoadCheckpoint(path);
  }
  if (absl::EndsWith(path, ".json")) return LoadHuggingFace(path);  // a shard index
  BRAID_ASSIGN_OR_RETURN(SafetensorsContents c, ReadSafetensors(path));
  LoadedWeights out;
  out.tensors = std::move(c.tensors);
  out.metadata = std::move(c.metadata);
  out.source = path;
  return out;
}

}  // namespace braid::tools
