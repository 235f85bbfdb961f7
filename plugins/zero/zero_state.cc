// Full (unsharded) state dicts of the zero strategy: gathering the standard names out of the
// shards, and loading full weights into them (--init_from).
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "plugins/zero/zero_strategy.h"

namespace braid::zero {

absl::StatusOr<std::map<std::string, Tensor>> ZeroStrategy::FullStateDict() {
  if (model_ == nullptr) return Error(absl::StatusCode::kFailedPrecondition, "FullStateDict before Setup");
  std::map<std::string, Tensor> out;
  for (Unit& u : units_) {
    if (opts_.stage == 3) Gather(u);
    for (Slot& s : u.slots) out[s.name] = s.param.Detach().Clone();
    if (opts_.stage == 3) ReleaseIfDone(u);
  }
  BRAID_RETURN_IF_ERROR(comm_status_);
  for (auto& [n, p] : model_->NamedParameters()) {
    if (!out.count(n)) out[n] = p.Detach().Clone();  // frozen parameters
  }
  for (auto& [n, b] : model_->NamedBuffers()) out[n] = b.Detach().Clone();
  return out;
}

absl::Status ZeroStrategy::LoadFullStateDict(const std::map<std::string, Tensor>& state) {
  if (model_ == nullptr) return Error(absl::StatusCode::kFailedPrecondition, "LoadFullStateDict before Setup");
  SettleHostCopies();  // no copy may still read the host shards written below
  // The optimizer's host copies follow whatever was loaded.
  auto refresh_host = [this] {
    if (opts_.offload_param) return;  // the optimizer steps the host shards themselves
    for (size_t i = 0; i < host_pieces_.size(); ++i) host_pieces_[i].CopyFrom(pieces_[i]);
  };
  if (opts_.stage < 3) {
    BRAID_RETURN_IF_ERROR(model_->LoadStateDict(state, /*strict=*/true));
    refresh_host();
    return absl::OkStatus();
  }
  // Stage 3: every name checked as the model would, then each rank keeps its shard's part.
  std::vector<std::string> problems;
  std::map<std::string, bool> seen;
  for (auto& [n, p] : model_->NamedParameters()) seen[n] = false;
  for (auto& [n, b] : model_->NamedBuffers()) seen[n] = false;
  for (auto& [n, t] : state) {
    if (!seen.count(n)) problems.push_back(absl::StrCat("unexpected '", n, "'"));
  }
  for (Unit& u : units_) {
    auto [own_b, own_e] = OwnRange(u);
    for (Slot& s : u.slots) {
      auto it = state.find(s.name);
      if (it == state.end()) continue;
      seen[s.name] = true;
      if (it->second.shape() != s.param.shape()) {
        problems.push_back(absl::StrCat("'", s.name, "' has shape ", ShapeToString(it->second.shape()),
                                        ", the model's is ", ShapeToString(s.param.shape())));
        continue;
      }
      int64_t b = std::max(own_b, s.offset), e = std::min(own_e, s.offset + s.param.numel());
      if (b >= e) continue;
      Tensor src = it->second.Detach().Reshape({-1}).FlatRange(b - s.offset, e - b);
      ShardHome(u).FlatRange(b - own_b, e - b).CopyFrom(src);
    }
  }
  for (auto& [n, p] : model_->NamedParameters()) {
    auto it = state.find(n);
    if (it != state.end() && !p.requires_grad()) {
      Tensor(p).CopyFrom(it->second);
      seen[n] = true;
    }
  }
  for (auto& [n, b] : model_->NamedBuffers()) {
    auto it = state.find(n);
    if (it != state.end()) {
      Tensor(b).CopyFrom(it->second);
      seen[n] = true;
    }
  }
  for (auto& [n, ok] : seen) {
    if (!ok) problems.push_back(absl::StrCat("missing '", n, "'"));
  }
  if (!problems.empty()) return Invalid(absl::StrCat("cannot load the weights: ", absl::StrJoin(problems, "; ")));
  // Persistent units hold gathered copies: refresh them.
  for (Unit& u : units_) {
    if (u.persistent) Regather(u, "all-gathering parameters");
  }
  refresh_host();
  return comm_status_;
}

// Each rank's chunks are its pieces: the part of each parameter in its shard (at every stage:
// ranks hold full parameters only at stages 1 and 2, and writing the shards covers each element
// once), with the optimizer's state for each piece. Frozen parameters and buffers are whole,
// written by rank 0.
absl::StatusOr<std::vector<StateChunk>> ZeroStrategy::StateChunks(bool create) {
  if (model_ == nullptr) return Error(absl::StatusCode::kFailedPrecondition, "StateChunks before Setup");
  SettleHostCopies();  // a load writes the host shards these chunks point at
  std::vector<StateChunk> out;
  std::map<std::string, size_t> by_piece;  // the optimizer's piece name -> chunk
  std::map<std::string, bool> in_units;
  for (Unit& u : units_) {
    auto [own_b, own_e] = OwnRange(u);
    for (Slot& s : u.slots) {
      in_units[s.name] = true;
      const int64_t b = std::max(own_b, s.offset), e = std::min(own_e, s.offset + s.param.numel());
      if (b >= e) continue;
      StateChunk c;
      c.name = s.name;
      c.global_shape = s.param.shape();
      c.runs = {{b - s.offset, e - s.offset}};
      c.local = opts_.stage < 3 ? u.flat.FlatRange(b, e - b) : ShardHome(u).FlatRange(b - own_b, e - b);
      by_piece[absl::StrCat(s.name, "[", b - s.offset, ":", e - s.offset, "]")] = out.size();
      out.push_back(std::move(c));
    }
  }
  for (auto& [n, p] : model_->NamedParameters()) {
    if (!in_units.count(n)) out.push_back(WholeChunk(n, p, rank_ == 0));
  }
  for (auto& [n, b] : model_->NamedBuffers()) out.push_back(WholeChunk(n, b, rank_ == 0));
  std::vector<StateChunk> opt = OptimizerStateChunks(
      *optimizer_,
      [&](const Tensor& piece) -> const StateChunk* {
        auto it = by_piece.find(piece.name());
        return it == by_piece.end() ? nullptr : &out[it->second];
      },
      create, rank_ == 0);
  out.insert(out.end(), opt.begin(), opt.end());
  return out;
}

absl::Status ZeroStrategy::AfterStateLoaded(const std::vector<StateChunk>& chunks) {
  RestoreOptimizerStep(*optimizer_, chunks);
  // Every rank loaded its shards: stages 1 and 2 (and stage 3's persistent units) gather the
  // full parameters from them, as after an optimizer step.
  for (Unit& u : units_) {
    if (opts_.stage < 3) {
      Tensor own = u.flat.FlatRange(int64_t(rank_) * u.shard, u.shard).Clone();
      (void)Wait(comm_->AllGather(own, u.flat), "all-gathering loaded parameters");
    } else if (u.persistent) {
      Regather(u, "all-gathering loaded parameters");
    }
  }
  // The optimizer's host copies follow what was loaded into the pieces (offload_param: they are
  // the loaded shards).
  if (!opts_.offload_param) {
    for (size_t i = 0; i < host_pieces_.size(); ++i) host_pieces_[i].CopyFrom(pieces_[i]);
  }
  return comm_status_;
}

}  // namespace braid::zero
