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
  // The optimizer's host copies follow whatever was loaded.
  auto refresh_host = [this] {
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
      u.param_shard.FlatRange(b - own_b, e - b).CopyFrom(src);
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
    if (u.persistent) {
      (void)Wait(comm_->AllGather(u.param_shard, u.flat), "all-gathering parameters");
    }
  }
  refresh_host();
  return comm_status_;
}

}  // namespace braid::zero
