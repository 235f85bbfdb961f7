// WrappingStrategy: a strategy layer over another, the one below it in the composer's stack
// (launcher/compose.h): tensor parallelism over the pipeline or a data-axis strategy, the pipeline
// over a data-axis strategy, a user's own layer. The layer below holds the training state, so
// whatever a layer does not change is answered by it: Wrap keeps it, and the optimizer, the full
// and sharded state, the data-parallel place, evaluation, deferred initialisation, the memory
// peaks, the summary lines and the step forward to it. A layer writes its name, Setup (what it
// does to the model, then the layer below's Setup with the context it hands down) and only the
// methods it changes. docs/WRITING_A_STRATEGY.md, "Layers over another strategy".
#ifndef BRAID_CORE_WRAPPING_STRATEGY_H_
#define BRAID_CORE_WRAPPING_STRATEGY_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/check.h"
#include "core/strategy.h"

namespace braid {

class WrappingStrategy : public Strategy {
 public:
  // Keeps the layer below; once, before Setup (BuildStack in the composer calls it).
  absl::Status Wrap(std::unique_ptr<Strategy> inner) override {
    if (inner == nullptr) {
      return absl::InvalidArgumentError("strategy '" + name() + "': Wrap was given no strategy");
    }
    if (inner_ != nullptr) {
      return absl::FailedPreconditionError("strategy '" + name() + "' wraps '" + inner_->name() +
                                           "' already; it cannot also wrap '" + inner->name() + "'");
    }
    inner_ = std::move(inner);
    return absl::OkStatus();
  }

  // --- Forwarded to the layer below, which holds the training state.
  absl::StatusOr<StepStats> TrainStep(const std::vector<Batch>& micro_batches,
                                      const LossFn& loss) override {
    if (inner_ == nullptr) return NotWrapped("TrainStep");
    return inner_->TrainStep(micro_batches, loss);
  }
  Optimizer* optimizer() override { return inner_ != nullptr ? inner_->optimizer() : nullptr; }
  absl::StatusOr<std::map<std::string, Tensor>> FullStateDict() override {
    if (inner_ == nullptr) return NotWrapped("FullStateDict");
    return inner_->FullStateDict();
  }
  absl::Status LoadFullStateDict(const std::map<std::string, Tensor>& state) override {
    if (inner_ == nullptr) return NotWrapped("LoadFullStateDict");
    return inner_->LoadFullStateDict(state);
  }
  int data_parallel_rank() const override { return below("data_parallel_rank").data_parallel_rank(); }
  int data_parallel_size() const override { return below("data_parallel_size").data_parallel_size(); }
  // (EvaluateLoss keeps Strategy's default, which runs through this layer's Evaluate: a layer
  // that holds the model differently, as the pipeline does, overrides Evaluate alone.)
  absl::Status Evaluate(const std::function<void(Module&)>& eval) override {
    if (inner_ == nullptr) return NotWrapped("Evaluate");
    return inner_->Evaluate(eval);
  }
  // Asked with the context Setup will hand down (ContextBelow): the layer below decides.
  bool wants_deferred_init(const StrategyContext& ctx) const override {
    return inner_ != nullptr && inner_->wants_deferred_init(ContextBelow(ctx));
  }
  std::vector<std::pair<std::string, int64_t>> ModelStatePeaks() const override {
    return inner_ != nullptr ? inner_->ModelStatePeaks() : std::vector<std::pair<std::string, int64_t>>{};
  }
  // The layer below's lines; a layer adding its own appends them to these.
  std::vector<std::string> SummaryLines() const override {
    return inner_ != nullptr ? inner_->SummaryLines() : std::vector<std::string>{};
  }
  absl::StatusOr<std::vector<StateChunk>> StateChunks(bool create) override {
    if (inner_ == nullptr) return NotWrapped("StateChunks");
    return inner_->StateChunks(create);
  }
  absl::Status AfterStateLoaded(const std::vector<StateChunk>& chunks) override {
    if (inner_ == nullptr) return NotWrapped("AfterStateLoaded");
    return inner_->AfterStateLoaded(chunks);
  }

 protected:
  // The layer below (null before Wrap).
  Strategy* inner() const { return inner_.get(); }
  // "own(inner)" once wrapped, else "own": a layer's name() names the stack beneath it.
  std::string NameOver(const std::string& own) const {
    return inner_ != nullptr ? own + "(" + inner_->name() + ")" : own;
  }
  // Setup's first check: FailedPrecondition, naming this layer, when nothing was wrapped.
  absl::Status RequireWrapped() const {
    if (inner_ != nullptr) return absl::OkStatus();
    return absl::FailedPreconditionError(
        "strategy '" + name() + "' is a layer over another strategy (the one below it in the " +
        "stack: single, ddp, zero, a user's); give that one with Wrap before Setup");
  }
  // The options this layer reads itself; the layer below gets the others (ContextBelow), so
  // strategy.options reach every layer of the stack and each takes its own.
  virtual bool OwnsOption(const std::string& key) const { return false; }
  // `ctx` as the layer below gets it: this layer's options removed, the composer's group for
  // the layer below (the first of groups_below) as its `comm` (null when none was handed: the
  // layer below then says it has no communicator), and this layer's group first among its
  // groups_above. A layer sets its sums and its criterion on the copy.
  StrategyContext ContextBelow(const StrategyContext& ctx) const {
    StrategyContext below = ctx;
    for (auto it = below.options.begin(); it != below.options.end();) {
      it = OwnsOption(it->first) ? below.options.erase(it) : std::next(it);
    }
    if (ctx.comm != nullptr) below.groups_above.insert(below.groups_above.begin(), ctx.comm);
    below.comm = nullptr;
    if (!below.groups_below.empty()) {
      below.comm = below.groups_below.front();
      below.groups_below.erase(below.groups_below.begin());
    }
    return below;
  }
  // "strategy 'NAME': WHAT before Wrap".
  absl::Status NotWrapped(const std::string& what) const {
    return absl::FailedPreconditionError("strategy '" + name() + "': " + what +
                                         " before Wrap gave it the layer below");
  }

 private:
  // Asked before Wrap is a broken contract (the composer wraps before anything is asked).
  const Strategy& below(const char* what) const {
    BRAID_CHECK(inner_ != nullptr) << "strategy '" << name() << "': " << what
                                   << " asked before Wrap gave it the layer below";
    return *inner_;
  }

  std::unique_ptr<Strategy> inner_;
};

}  // namespace braid

#endif  // BRAID_CORE_WRAPPING_STRATEGY_H_
