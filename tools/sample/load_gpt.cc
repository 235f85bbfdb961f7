#include "tools/sample/load_gpt.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/safetensors.h"
#include "plugins/checkpoint/checkpoint_index.h"

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

}  // namespace

absl::StatusOr<LoadedWeights> LoadWeights(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    return absl::NotFoundError(
        absl::StrCat(path, ": no such file or folder; name a .safetensors file (save_to) or a "
                           "checkpoint folder (checkpoint.dir)"));
  }
  if (fs::is_directory(path, ec)) return LoadCheckpoint(path);
  BRAID_ASSIGN_OR_RETURN(SafetensorsContents c, ReadSafetensors(path));
  LoadedWeights out;
  out.tensors = std::move(c.tensors);
  out.metadata = std::move(c.metadata);
  out.source = path;
  // PyTorch's nanoGPT state dict carries the tied head under its own name too; it is wte.
  out.tensors.erase("lm_head.weight");
  return out;
}

absl::StatusOr<models::GptConfig> GptConfigFromWeights(const LoadedWeights& w, int n_head) {
  auto shape = [&](const std::string& name) -> const Shape* {
    auto f = w.tensors.find(name);
    return f == w.tensors.end() ? nullptr : &f->second.shape();
  };
  const Shape* wte = shape("wte.weight");
  const Shape* wpe = shape("wpe.weight");
  if (wte == nullptr || wpe == nullptr || wte->size() != 2 || wpe->size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        w.source, " holds no GPT weights (wte.weight and wpe.weight, 2-D); is it a GPT's?"));
  }
  models::GptConfig c;
  c.padded_vocab_size = (*wte)[0];
  c.vocab_size = c.padded_vocab_size;  // the tokenizer says how many of the rows are real
  c.n_embd = (*wte)[1];
  c.block_size = (*wpe)[0];
  c.n_layer = 0;
  while (shape(absl::StrCat("h.", c.n_layer, ".ln_1.weight")) != nullptr) ++c.n_layer;
  c.stable_embedding = shape("wte_norm.weight") != nullptr;
  if (n_head <= 0) {
    auto meta = w.metadata.find("n_head");
    if (meta != w.metadata.end() && !absl::SimpleAtoi(meta->second, &n_head)) n_head = 0;
  }
  if (n_head <= 0) {
    for (const models::GptConfig& p : {models::GptConfig::Mini(), models::GptConfig::Gpt2_124M()}) {
      if (p.n_embd == c.n_embd) n_head = int(p.n_head);
    }
  }
  if (n_head <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        w.source, ": width ", c.n_embd, " matches no preset and the file names no n_head; pass --n_head"));
  }
  if (c.n_embd % n_head != 0) {
    return absl::InvalidArgumentError(absl::StrCat(w.source, ": n_head ", n_head,
                                                   " does not divide the width ", c.n_embd));
  }
  c.n_head = n_head;
  return c;
}

absl::StatusOr<std::unique_ptr<models::Gpt>> LoadGpt(const std::string& path, int n_head) {
  BRAID_ASSIGN_OR_RETURN(LoadedWeights w, LoadWeights(path));
  BRAID_ASSIGN_OR_RETURN(models::GptConfig c, GptConfigFromWeights(w, n_head));
  auto gpt = std::make_unique<models::Gpt>(c);
  absl::Status st = gpt->LoadStateDict(w.tensors, /*strict=*/true);
  if (!st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(w.source, " does not fit a GPT of ", c.n_layer,
                                                   " layers x ", c.n_embd, ": ", st.message()));
  }
  gpt->Eval();
  return gpt;
}

}  // namespace braid::tools
