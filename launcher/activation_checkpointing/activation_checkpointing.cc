#include "launcher/activation_checkpointing/activation_checkpointing.h"

#include <algorithm>
#include <mutex>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/autograd.h"
#include "launcher/config/train_config.pb.h"
#include "launcher/activation_checkpointing/kept_inputs.h"

namespace braid {
namespace {

thread_local ActivationCheckpointStats g_stats;
// > 0 while this thread recomputes a segment: a checkpointed forward called then runs plainly, its
// saved tensors going to the recompute's recording scope.
thread_local int g_recompute_depth = 0;
// The checkpointed forward running on this thread (not recomputing), to refuse nesting.
thread_local const std::string* g_running = nullptr;

std::mutex g_rng_mu;
CheckpointRngState& RngStateLocked() {
  static CheckpointRngState* s = new CheckpointRngState();  // never destroyed: used at exit too
  return *s;
}
CheckpointRngState CurrentRngState() {
  std::lock_guard<std::mutex> lock(g_rng_mu);
  return RngStateLocked();
}

// Modules checkpointed together, and what each computed before it was checkpointed.
struct Segment {
  std::vector<std::string> names;
  std::vector<Module*> modules;
  std::vector<Module::ForwardFn> previous;  // the replaced forward before; null: Forward
  std::shared_ptr<KeptInputs> kept;         // where the input waits; null: kept as it is

  Tensor Inner(size_t k, const Tensor& x) const {
    return previous[k] ? previous[k](x) : modules[k]->Forward(x);
  }
  std::string Describe(size_t first, size_t end) const {
    if (end - first == 1) return absl::StrCat("'", names[first], "'");
    return absl::StrCat("segment '", names[first], "'..'", names[end - 1], "'");
  }
};

struct SavedMeta {
  Shape shape;
  DType dtype;
};

// One forward of a segment's modules [first, end): the input kept, a placeholder per tensor its
// ops saved and, during backward, what the recompute recorded for them.
class Run {
 public:
  Run(std::shared_ptr<const Segment> seg, size_t first, Tensor input, std::shared_ptr<void> rng)
      : seg_(std::move(seg)), first_(first), end_(first), rng_(std::move(rng)) {
    if (seg_->kept != nullptr && input.defined()) {
      kept_ = seg_->kept->Keep(input);
    } else {
      input_ = std::move(input);
    }
  }

  const Segment* segment() const { return seg_.get(); }
  size_t end() const { return end_; }

  size_t AddPlaceholder(const Tensor& t) {
    metas_.push_back({t.shape(), t.dtype()});
    ++g_stats.placeholders;
    return metas_.size() - 1;
  }

  // Module `index` ran and returned `out`.
  void Ran(size_t index, const Tensor& out) {
    end_ = index + 1;
    last_storage_ = out.defined() ? out.storage() : nullptr;
    last_offset_ = out.defined() ? out.storage_offset() : 0;
    last_shape_ = out.defined() ? out.shape() : Shape();
  }

  // Whether `x` is the last output (same memory, offset and shape): the next module may then
  // join this run, since recomputing the run reproduces `x` exactly. A weak pointer, so memory
  // freed and reused since never passes for it.
  bool Produced(const Tensor& x) const {
    std::shared_ptr<Storage> s = last_storage_.lock();
    return s != nullptr && x.defined() && s == x.storage() && x.storage_offset() == last_offset_ &&
           x.shape() == last_shape_;
  }

  // The i-th saved tensor, handed over: the run keeps no reference, so the activation is freed
  // once backward is done with it. A slot asked for again (a second backward through a graph
  // kept with retain_graph) recomputes again, a kept segment too.
  Tensor Take(size_t i) {
    if (recomputed_.empty() || !recomputed_[i].defined()) Recompute();
    Tensor t = recomputed_[i];
    recomputed_[i] = Tensor();
    return t;
  }

 private:
  void Recompute() {
    BRAID_CHECK(g_recompute_depth == 0)
        << "activation checkpointing: " << seg_->Describe(first_, end_)
        << " was asked for a saved tensor while another checkpoint was recomputing";
    std::vector<Tensor> got;
    got.reserve(metas_.size());
    // The input back on the device, whole (a collective of the tensor group when partitioned:
    // every rank recomputes this segment at the same point of its backward).
    const Tensor input = kept_ != nullptr ? seg_->kept->Restore(*kept_) : input_;
    CheckpointRngState rng = CurrentRngState();
    std::shared_ptr<void> resume;
    if (rng_ && rng.save && rng.restore) {
      resume = rng.save();
      rng.restore(rng_);  // replay the forward's draws
    }
    {
      // The recomputed graph is never run backward: record no nodes, only what ops save.
      autograd::NoGradGuard no_grad;
      ++g_recompute_depth;
      autograd::SavedTensorHooksScope record(autograd::SavedTensorHooks{
          [&got](const Tensor& t) {
            got.push_back(t);
            return std::shared_ptr<void>();
          },
          [](const std::shared_ptr<void>&) -> Tensor {
            BRAID_CHECK(false) << "activation checkpointing: a recomputed graph was run backward";
            return Tensor();
          }});
      Tensor h = input;
      for (size_t k = first_; k < end_; ++k) {
        // The segment's last module is the one backward is in: its forward hooks ran in the
        // forward and its pre-backward hook has just run (ZeRO-3 gathered its parameters
        // there), so only its forward is repeated. The earlier ones run through operator(): their
        // forward hooks fire again (ZeRO-3 gathers them: their pre-backward has not run yet).
        // Submodules are called through operator() by the forwards themselves, so their hooks
        // fire in every case.
        h = k + 1 < end_ ? (*seg_->modules[k])(h) : seg_->Inner(k, h);
      }
      --g_recompute_depth;
    }
    if (resume) rng.restore(resume);
    BRAID_CHECK(got.size() == metas_.size())
        << "activation checkpointing: recomputing " << seg_->Describe(first_, end_) << " saved "
        << got.size() << " tensors for backward where its forward saved " << metas_.size()
        << ": a checkpointed forward must save the same tensors when run again (an op that saves "
           "only in grad mode, or a forward that depends on state changed since)";
    for (size_t i = 0; i < got.size(); ++i) {
      BRAID_CHECK(got[i].shape() == metas_[i].shape && got[i].dtype() == metas_[i].dtype)
          << "activation checkpointing: recomputing " << seg_->Describe(first_, end_)
          << " saved " << got[i].DescribeForError() << " as tensor " << i << " where its forward saved "
          << DTypeName(metas_[i].dtype) << ShapeToString(metas_[i].shape)
          << ": the forward must run the same ops when run again";
    }
    recomputed_ = std::move(got);
    ++g_stats.recomputes;
  }

  std::shared_ptr<const Segment> seg_;
  size_t first_, end_;
  Tensor input_;  // detached: the graph into it is the caller's; or, with a store:
  std::shared_ptr<KeptInputs::Kept> kept_;
  std::shared_ptr<void> rng_;
  std::vector<SavedMeta> metas_;
  std::vector<Tensor> recomputed_;
  std::weak_ptr<Storage> last_storage_;
  int64_t last_offset_ = 0;
  Shape last_shape_;
};

// The packed form of a saved tensor: its run and its number there.
struct Placeholder {
  std::shared_ptr<Run> run;
  size_t index;
};

// The run the last checkpointed forward on this thread belonged to, which the segment's next
// module continues when fed its output.
thread_local std::weak_ptr<Run> g_open_run;

// What a checkpointed module's forward is replaced by. A named type, so that
// IsActivationCheckpointed can recognise it inside Module::replaced_forward().
struct CheckpointedForward {
  std::shared_ptr<const Segment> seg;
  size_t index;

  Tensor operator()(const Tensor& x) const {
    // Recomputing, or nothing will be run backward (evaluation): the forward as it was.
    if (g_recompute_depth > 0 || !autograd::GradEnabled()) return seg->Inner(index, x);
    BRAID_CHECK(g_running == nullptr)
        << "activation checkpointing: '" << seg->names[index] << "' runs inside the forward of '"
        << *g_running << "', also checkpointed: checkpoints cannot nest";
    std::shared_ptr<Run> run;
    if (index > 0) {
      std::shared_ptr<Run> open = g_open_run.lock();
      if (open && open->segment() == seg.get() && open->end() == index && open->Produced(x)) {
        run = std::move(open);
      }
    }
    if (run == nullptr) {
      CheckpointRngState rng = CurrentRngState();
      run = std::make_shared<Run>(seg, index, x.defined() ? x.Detach() : x,
                                  rng.save ? rng.save() : nullptr);
      ++g_stats.forwards;
    }
    Tensor out;
    {
      g_running = &seg->names[index];
      autograd::SavedTensorHooksScope placeholders(autograd::SavedTensorHooks{
          [run](const Tensor& t) -> std::shared_ptr<void> {
            return std::make_shared<Placeholder>(Placeholder{run, run->AddPlaceholder(t)});
          },
          [](const std::shared_ptr<void>& packed) {
            const auto* p = static_cast<const Placeholder*>(packed.get());
            return p->run->Take(p->index);
          }});
      out = seg->Inner(index, x);
      g_running = nullptr;
    }
    run->Ran(index, out);
    g_open_run = run;
    return out;
  }
};

const CheckpointedForward* Checkpointed(const Module& m) {
  return m.replaced_forward() ? m.replaced_forward().target<CheckpointedForward>() : nullptr;
}

bool Contains(Module& outer, const Module* inner) {
  for (auto& [n, m] : outer.NamedModules()) {
    if (m == inner) return true;
  }
  return false;
}

std::string KindName(CheckpointPolicy::Kind kind) {
  return CheckpointPolicyNames()[size_t(kind)];
}

}  // namespace

std::string CheckpointPolicy::ToString() const {
  std::string name = KindName(kind);
  return kind == Kind::kEveryK ? absl::StrCat(name, ", k=", every_k) : name;
}

const std::vector<std::string>& CheckpointPolicyNames() {
  // In the order of CheckpointPolicy::Kind.
  static const auto* names =
      new std::vector<std::string>{"sqrt", "every_block", "every_k", "attention"};
  return *names;
}

absl::StatusOr<CheckpointPolicy> ParseCheckpointPolicy(const std::string& name,
                                                       std::optional<int> every_k) {
  CheckpointPolicy p;
  const std::string lower = absl::AsciiStrToLower(name);
  const std::vector<std::string>& names = CheckpointPolicyNames();
  size_t i = lower.empty() ? 0 : names.size();
  for (size_t j = 0; j < names.size() && i == names.size(); ++j) {
    if (names[j] == lower) i = j;
  }
  if (i == names.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("activation_checkpointing.policy \"", name, "\" is unknown; known: ",
                     absl::StrJoin(names, ", "), " (docs/CONFIG.md says what each keeps)"));
  }
  p.kind = CheckpointPolicy::Kind(i);
  if (p.kind == CheckpointPolicy::Kind::kEveryK) {
    if (!every_k.has_value()) {
      return absl::InvalidArgumentError(
          "activation_checkpointing.policy \"every_k\" needs activation_checkpointing.every_k "
          "(>= 1): every_k: 2 checkpoints blocks 0, 2, 4, ...");
    }
    if (*every_k < 1) {
      return absl::InvalidArgumentError(absl::StrCat("activation_checkpointing.every_k (", *every_k,
                                                     ") must be >= 1"));
    }
    p.every_k = *every_k;
  } else if (every_k.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "activation_checkpointing.every_k (", *every_k, ") applies to policy \"every_k\" only, "
        "and the policy is \"", names[i], "\"; remove every_k or set policy: \"every_k\""));
  }
  return p;
}

absl::StatusOr<CheckpointPolicy> CheckpointPolicyFromConfig(
    const config::ActivationCheckpointingConfig& section) {
  return ParseCheckpointPolicy(section.policy(), section.has_every_k()
                                                     ? std::optional<int>(section.every_k())
                                                     : std::nullopt);
}

std::vector<std::vector<int>> PlanCheckpointSegments(int num_blocks,
                                                     const CheckpointPolicy& policy) {
  std::vector<std::vector<int>> plan;
  if (num_blocks <= 0) return plan;
  switch (policy.kind) {
    case CheckpointPolicy::Kind::kSqrt: {
      int s = 1;  // ⌈√n⌉, in integers
      while (s * s < num_blocks) ++s;
      const int base = num_blocks / s, longer = num_blocks % s;
      int next = 0;
      for (int j = 0; j < s; ++j) {
        std::vector<int> seg;
        for (int k = 0; k < base + (j < longer ? 1 : 0); ++k) seg.push_back(next++);
        if (!seg.empty()) plan.push_back(std::move(seg));
      }
      break;
    }
    case CheckpointPolicy::Kind::kEveryK:
      for (int i = 0; i < num_blocks; i += std::max(1, policy.every_k)) plan.push_back({i});
      break;
    case CheckpointPolicy::Kind::kEveryBlock:
    case CheckpointPolicy::Kind::kAttention:
      for (int i = 0; i < num_blocks; ++i) plan.push_back({i});
      break;
  }
  // Backward begins in the last block, right after the forward: a segment ending there would be
  // recomputed at once, rebuilding what its forward had just dropped, so recomputing it lowers no
  // peak and costs a forward of its blocks (EnableActivationCheckpointing leaves it as it is). (every_k's last segment may end earlier: blocks after
  // it keep their activations until backward passes them, and its recompute comes later, when
  // those are freed, so it still lowers the peak and stays.)
  if (!policy.checkpoint_last_segment && !plan.empty() && plan.back().back() == num_blocks - 1) {
    plan.pop_back();
  }
  return plan;
}

std::string CheckpointingSummary::ToString() const {
  std::string kept;
  if (last_kept > 0) {
    kept = policy.kind == CheckpointPolicy::Kind::kAttention
               ? "; the last block's kept, not recomputed: backward starts there"
               : last_kept == 1 ? "; the last block kept, not recomputed: backward starts there"
                                : absl::StrCat("; the last ", last_kept,
                                               " blocks kept, not recomputed: backward starts there");
  }
  if (policy.kind == CheckpointPolicy::Kind::kAttention) {
    return absl::StrCat("the attention of ", covered, " of ", blocks, " blocks (policy ",
                        policy.ToString(), kept, ")");
  }
  return absl::StrCat(covered, " of ", blocks, " blocks in ", segments,
                      segments == 1 ? " segment" : " segments", " (policy ", policy.ToString(),
                      kept, ")");
}

bool IsActivationCheckpointed(const Module& m) { return Checkpointed(m) != nullptr; }

absl::Status CheckpointSegment(const std::vector<std::pair<std::string, Module*>>& modules,
                               std::shared_ptr<KeptInputs> kept_inputs) {
  if (modules.empty()) return absl::InvalidArgumentError("CheckpointSegment: no modules given");
  auto seg = std::make_shared<Segment>();
  seg->kept = std::move(kept_inputs);
  for (const auto& [name, m] : modules) {
    if (m == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("CheckpointSegment: module '", name, "' is null"));
    }
    if (IsActivationCheckpointed(*m)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "activation checkpointing: module '", name, "' (", m->type_name(),
          ") is already checkpointed; checkpoint each module once"));
    }
    for (Module* other : seg->modules) {
      if (other == m) {
        return absl::InvalidArgumentError(absl::StrCat(
            "CheckpointSegment: module '", name, "' is listed twice in one segment"));
      }
    }
    seg->names.push_back(name);
    seg->modules.push_back(m);
    seg->previous.push_back(m->replaced_forward());  // kept: e.g. a tensor-parallel forward
  }
  std::shared_ptr<const Segment> shared = seg;
  for (size_t k = 0; k < seg->modules.size(); ++k) {
    seg->modules[k]->ReplaceForward(CheckpointedForward{shared, k});
  }
  return absl::OkStatus();
}

absl::StatusOr<CheckpointingSummary> EnableActivationCheckpointing(Module& model,
                                                                   const CheckpointPolicy& policy) {
  std::vector<std::pair<std::string, Module*>> blocks = model.NamedBlocks();
  if (blocks.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "activation_checkpointing: the model (", model.type_name(),
        ") has no blocks (Module::NamedBlocks is empty), so there is nothing to checkpoint; remove "
        "the activation_checkpointing section"));
  }
  if (policy.kind == CheckpointPolicy::Kind::kEveryK && policy.every_k < 1) {
    return absl::InvalidArgumentError(absl::StrCat("activation_checkpointing.every_k (",
                                                   policy.every_k, ") must be >= 1"));
  }
  // Every segment of the policy; the last one is left as it is (its saved tensors kept, each
  // freed by the engine once its node ran) when PlanCheckpointSegments leaves it out.
  CheckpointPolicy all = policy;
  all.checkpoint_last_segment = true;
  const std::vector<std::vector<int>> plan = PlanCheckpointSegments(int(blocks.size()), all);
  const bool keep_last =
      PlanCheckpointSegments(int(blocks.size()), policy).size() < plan.size();
  std::vector<std::vector<std::pair<std::string, Module*>>> segments;
  for (const std::vector<int>& indices : plan) {
    std::vector<std::pair<std::string, Module*>> seg;
    for (int i : indices) {
      auto [name, block] = blocks[size_t(i)];
      if (policy.kind != CheckpointPolicy::Kind::kAttention) {
        seg.emplace_back(name, block);
        continue;
      }
      Module* attn = nullptr;
      std::vector<std::string> children;
      for (auto& [cname, child] : block->NamedChildren()) {
        children.push_back(cname);
        if (cname == "attn") attn = child;
      }
      if (attn == nullptr) {
        return absl::FailedPreconditionError(absl::StrCat(
            "activation_checkpointing.policy \"attention\" checkpoints each block's 'attn' "
            "submodule, but block '", name, "' (", block->type_name(), ") has none (its children: ",
            children.empty() ? "none" : absl::StrJoin(children, ", "),
            "); use policy \"every_block\""));
      }
      seg.emplace_back(absl::StrCat(name, ".attn"), attn);
    }
    segments.push_back(std::move(seg));
  }
  // Checkpoints cannot nest: refuse a target inside another (blocks within blocks), and one
  // inside, around or equal to a module already checkpointed.
  for (const auto& seg : segments) {
    for (const auto& [name, m] : seg) {
      for (const auto& other : segments) {
        for (const auto& [oname, o] : other) {
          if (o != m && Contains(*m, o)) {
            return absl::FailedPreconditionError(absl::StrCat(
                "activation checkpointing: block '", oname, "' lies inside block '", name,
                "', and checkpoints cannot nest; mark only the outer or the inner modules as "
                "blocks (Module::set_block)"));
          }
        }
      }
    }
  }
  for (auto& [cname, done] : model.NamedModules()) {
    if (!IsActivationCheckpointed(*done)) continue;
    for (const auto& seg : segments) {
      for (const auto& [name, m] : seg) {
        if (m == done || Contains(*done, m) || Contains(*m, done)) {
          return absl::FailedPreconditionError(absl::StrCat(
              "activation checkpointing: '", name, "' cannot be checkpointed: '",
              cname.empty() ? model.type_name() : cname,
              "' is already (activation checkpointing was enabled twice?); checkpoints cannot nest"));
        }
      }
    }
  }
  CheckpointingSummary summary;
  summary.policy = policy;
  summary.blocks = int(blocks.size());
  for (size_t i = 0; i < segments.size(); ++i) {
    const bool keep = keep_last && i + 1 == segments.size();
    if (!keep) BRAID_RETURN_IF_ERROR(CheckpointSegment(segments[i], policy.kept_inputs));
    summary.modules += int(segments[i].size());
    if (keep) {
      summary.last_kept = int(segments[i].size());
    } else {
      summary.covered += int(segments[i].size());  // one module per block, blocks or their attn
      ++summary.segments;
    }
  }
  return summary;
}

int DisableActivationCheckpointing(Module& model) {
  int restored = 0;
  for (auto& [name, m] : model.NamedModules()) {
    if (const CheckpointedForward* f = Checkpointed(*m)) {
      Module::ForwardFn previous = f->seg->previous[f->index];  // copy: ReplaceForward frees *f
      m->ReplaceForward(std::move(previous));
      ++restored;
    }
  }
  return restored;
}

ActivationCheckpointStats GetActivationCheckpointStats() { return g_stats; }
void ResetActivationCheckpointStats() { g_stats = ActivationCheckpointStats(); }

void SetCheckpointRngState(CheckpointRngState state) {
  std::lock_guard<std::mutex> lock(g_rng_mu);
  RngStateLocked() = std::move(state);
}

}  // namespace braid
