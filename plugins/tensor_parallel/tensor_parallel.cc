// The "tensor_parallel" strategy: Megatron-style tensor parallelism around another strategy.
// Setup splits the model's layers by a plan (plan.h) over the tensor group the composer hands it
// (StrategyContext::comm), then hands the model, now this rank's slices, to the wrapped strategy
// (single, DDP, ZeRO 1/2/3 or the pipeline), which works over its own group. That one drives the steps and
// owns the optimizer; this one adds the vocabulary-parallel loss, the gradient norm's sum over
// the tensor group, and turns slices back into full tensors for FullStateDict (and full weights
// into slices for LoadFullStateDict). A model never knows: the same seed gives the same full
// weights, each rank keeps its slice.
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/config/sections.pb.h"
#include "core/plugin_api.h"
#include "core/registry.h"
#include "core/strategy.h"
#include "core/wrapping_strategy.h"
#include "plugins/tensor_parallel/parallel_ops.h"
#include "plugins/tensor_parallel/plan.h"

namespace braid::tensor_parallel {
namespace {

constexpr char kName[] = "tensor_parallel";

absl::Status Error(absl::StatusCode code, const std::string& msg) {
  return absl::Status(code, absl::StrCat(kName, ": ", msg));
}

// The model's own plan: its registration's ModelSpec::tensor_plan (this plugin has none of its
// own; parallel.tensor_plan may name another model's or a file instead).
absl::StatusOr<Plan> PlanFor(const StrategyContext& ctx) {
  if (ctx.config == nullptr || ctx.config->model().name().empty()) {
    return absl::InvalidArgumentError(
        "no model name to take the tensor-parallel plan from; give parallel.tensor_plan (a "
        "registered model's name or a plan file)");
  }
  return RegisteredPlan(ctx.config->model().name());
}

// A layer over the strategy below it (WrappingStrategy): the optimizer, the data-parallel place,
// the memory peaks, reloading checkpoint chunks and deferred initialisation are that strategy's
// (under ZeRO-3 the plan materialises each parameter it splits just before slicing it).
class TensorParallelStrategy : public WrappingStrategy {
 public:
  std::string name() const override { return NameOver(kName); }

  absl::Status Setup(Module& model, const OptimizerFactory& make_optimizer,
                     const StrategyContext& ctx) override {
    BRAID_RETURN_IF_ERROR(RequireWrapped());
    if (ctx.comm == nullptr) {
      return Error(absl::StatusCode::kInvalidArgument,
                   "no tensor-parallel group in the strategy context: give the layout as "
                   "`parallel { tensor: N }` (the composer hands the layer its group)");
    }
    // From the config's parallel section; tests without a config give strategy options.
    for (auto& [k, v] : ctx.options) {
      if (k == "plan") plan_spec_ = v;
      if (k == "sequence_parallel") sequence_parallel_ = v == "true";
    }
    if (ctx.config != nullptr && ctx.config->has_parallel()) {
      if (!ctx.config->parallel().tensor_plan().empty()) plan_spec_ = ctx.config->parallel().tensor_plan();
      sequence_parallel_ = ctx.config->parallel().sequence_parallel();
    }
    absl::StatusOr<Plan> plan = plan_spec_.empty() ? PlanFor(ctx) : LoadPlan(plan_spec_);
    if (!plan.ok()) return Error(plan.status().code(), std::string(plan.status().message()));
    plan_ = std::move(*plan);
    group_ = ctx.comm;  // the tensor group the composer handed this layer
    if (ctx.config != nullptr) {
      const auto& m = ctx.config->model();
      // The vocabulary-parallel cross-entropy takes the place of the model's loss; a model that
      // registers a loss of its own (label smoothing, a classification loss) would silently train
      // on another objective, so it is refused (every rank sees the same config: no rank waits).
      if (plan_.output_vocab_sharded) {
        absl::StatusOr<ModelSpec> spec = Registry::Get().GetModel(m.name());
        if (spec.ok() && spec->loss) {
          return Error(absl::StatusCode::kInvalidArgument,
                       absl::StrCat("model \"", m.name(), "\" has a loss of its own (ModelSpec::loss), but plan ",
                                    plan_.name, " says 'output vocab_sharded', which would replace it by "
                                    "the vocabulary-parallel cross-entropy; give parallel.tensor_plan a plan "
                                    "without that line (its head unsplit), or leave ModelSpec::loss unset if "
                                    "the loss is a cross-entropy over the output"));
        }
      }
      for (const std::string& field : plan_.divides) {
        // A shape field of the config, or one of the model's own options (n_kv_head).
        int64_t v = 0;
        std::string what = absl::StrCat("model.", field);
        if (field == "n_head" || field == "n_embd" || field == "n_layer") {
          v = field == "n_head" ? m.n_head() : field == "n_embd" ? m.n_embd() : m.n_layer();
        } else if (auto it = m.options().find(field); it != m.options().end()) {
          what = absl::StrCat("model.options \"", field, "\"");
          if (!absl::SimpleAtoi(it->second, &v)) v = 0;
        } else {
          return Error(absl::StatusCode::kInvalidArgument,
                       absl::StrCat("plan ", plan_.name, " splits by '", field, "', which model \"",
                                    m.name(), "\" has neither as a field nor as an option"));
        }
        if (v > 0 && v % group_->size() != 0) {
          return Error(absl::StatusCode::kInvalidArgument,
                       absl::StrCat(what, " (", v, ") is not a multiple of parallel.tensor (",
                                    group_->size(), "): plan ", plan_.name,
                                    " splits by it; choose a tensor size that divides it"));
        }
      }
    }
    full_parameters_ = model.NumParameters();
    absl::StatusOr<ShardMap> shards = ApplyPlan(model, plan_, *group_, &counters_, sequence_parallel_);
    if (!shards.ok()) return Error(shards.status().code(), std::string(shards.status().message()));
    shards_ = std::move(*shards);
    local_parameters_ = model.NumParameters();

    // Without plan and sequence_parallel; the layer below works over its own group (a
    // pipeline's stages, a data-axis strategy's replicas), handed by the composer.
    StrategyContext inner_ctx = ContextBelow(ctx);
    Communicator* g = group_;
    // The gradient norm's squares of the other slices added on the device, where NCCL moves
    // them, before the inner strategy's one read (every rank of the group computes the same
    // loss: nothing to add to it); then what a layer above adds.
    std::function<void(Tensor&, Tensor&)> outer = ctx.model_parallel_sum_on_device;
    inner_ctx.model_parallel_sum_on_device = [g, outer](Tensor& squared, Tensor& loss) {
      absl::Status st = g->AllReduce(squared, ReduceOp::kSum)->WaitOnDevice();
      BRAID_CHECK(st.ok()) << "tensor parallel: all-reducing the gradient norm: " << st.message();
      if (outer) outer(squared, loss);
    };
    // Replicas of the whole model cannot be made: its layers are split.
    inner_ctx.make_replica = nullptr;
    if (plan_.output_vocab_sharded) {
      CommCounters* counters = &counters_;
      criterion_ = [g, counters](const Tensor& logits, const Batch& b) {
        return VocabParallelCrossEntropy(logits, b.targets, *g, counters);
      };
      inner_ctx.criterion = criterion_;
    }
    return inner()->Setup(model, make_optimizer, inner_ctx);
  }

  absl::StatusOr<StepStats> TrainStep(const std::vector<Batch>& micro_batches,
                                      const LossFn& loss) override {
    const int64_t fwd0 = counters_.forward_bytes, bwd0 = counters_.backward_bytes;
    absl::StatusOr<StepStats> stats;
    if (criterion_) {
      CriterionFn crit = criterion_;
      stats = inner()->TrainStep(micro_batches, [crit](Module& m, const Batch& b) {
        return crit(m(b.inputs), b);
      });
    } else {
      stats = inner()->TrainStep(micro_batches, loss);
    }
    if (stats.ok()) {
      ++steps_;
      last_forward_bytes_ = counters_.forward_bytes - fwd0;
      last_backward_bytes_ = counters_.backward_bytes - bwd0;
    }
    return stats;
  }

  absl::StatusOr<std::map<std::string, Tensor>> FullStateDict() override {
    BRAID_ASSIGN_OR_RETURN(auto state, inner()->FullStateDict());
    // Every rank of the group gathers every split tensor, in the same (sorted) order.
    for (auto& [name, spec] : shards_) {
      auto it = state.find(name);
      if (it == state.end()) {
        return Error(absl::StatusCode::kInternal,
                     absl::StrCat("the wrapped strategy's state has no '", name, "'"));
      }
      BRAID_ASSIGN_OR_RETURN(it->second, GatherFromGroup(it->second, spec, *group_));
    }
    return state;
  }

  absl::Status LoadFullStateDict(const std::map<std::string, Tensor>& state) override {
    std::map<std::string, Tensor> local = state;
    for (auto& [name, spec] : shards_) {
      auto it = local.find(name);
      if (it == local.end()) continue;  // the wrapped strategy names what is missing
      if (it->second.shape() != spec.full_shape) {
        return Error(absl::StatusCode::kInvalidArgument,
                     absl::StrCat("'", name, "' is ", ShapeToString(it->second.shape()),
                                  " but the model's is ", ShapeToString(spec.full_shape)));
      }
      it->second = SliceForRank(it->second, spec, group_->rank(), group_->size());
    }
    return inner()->LoadFullStateDict(local);
  }

  // The wrapped strategy's chunks are of this rank's slices: each is placed in the full tensor
  // (its runs mapped through the slice), and a replicated tensor is written by tensor rank 0 only.
  absl::StatusOr<std::vector<StateChunk>> StateChunks(bool create) override {
    BRAID_ASSIGN_OR_RETURN(std::vector<StateChunk> chunks, inner()->StateChunks(create));
    const int rank = group_->rank(), size = group_->size();
    for (StateChunk& c : chunks) {
      // "optimizer/<param>/<slot>" is placed like <param>.
      std::string param = c.name;
      if (param.rfind("optimizer/", 0) == 0) {
        param = param.substr(10, param.rfind('/') - 10);
      }
      auto it = shards_.find(param);
      if (it == shards_.end()) {
        c.write = c.write && rank == 0;
        continue;
      }
      const ShardSpec& spec = it->second;
      c.runs = MapRuns(c.runs, [&](int64_t b, int64_t e) { return PartToFull(spec, rank, size, b, e); });
      c.global_shape = spec.full_shape;
    }
    return chunks;
  }
  absl::Status Evaluate(const std::function<void(Module&)>& eval) override {
    if (plan_.output_vocab_sharded) {
      return Error(absl::StatusCode::kUnimplemented,
                   "evaluation of a model whose output is split over the vocabulary is not "
                   "supported yet beyond its loss (EvaluateLoss); evaluate the saved weights "
                   "with one process");
    }
    return inner()->Evaluate(eval);
  }
  // The loss from this rank's vocabulary columns, as in training: the full logits are never
  // gathered (a GPT-2 batch's would be gigabytes).
  absl::StatusOr<double> EvaluateLoss(const std::vector<Batch>& batches,
                                      const LossFn& loss) override {
    if (!criterion_) return inner()->EvaluateLoss(batches, loss);
    CriterionFn crit = criterion_;
    return inner()->EvaluateLoss(batches, [crit](Module& m, const Batch& b) { return crit(m(b.inputs), b); });
  }

  std::vector<std::string> SummaryLines() const override {
    std::vector<std::string> lines = WrappingStrategy::SummaryLines();
    const double mib = 1.0 / (1 << 20);
    lines.push_back(absl::StrFormat(
        "tensor parallel: %d ranks%s, plan %s: %d of %d parameters on this rank (%d tensors "
        "split); last step all-reduced %.2f MiB of activations forward, %.2f MiB of their "
        "gradients backward",
        group_ ? group_->size() : 1, sequence_parallel_ ? " with sequence parallelism" : "",
        plan_.name, local_parameters_, full_parameters_,
        int(shards_.size()), double(last_forward_bytes_) * mib,
        double(last_backward_bytes_) * mib));
    return lines;
  }

 private:
  // From the config's parallel section; tests without a config give them as options.
  bool OwnsOption(const std::string& key) const override {
    return key == "plan" || key == "sequence_parallel";
  }

  std::string plan_spec_;
  bool sequence_parallel_ = false;
  Plan plan_;
  Communicator* group_ = nullptr;
  ShardMap shards_;
  CommCounters counters_;
  CriterionFn criterion_;
  int64_t full_parameters_ = 0, local_parameters_ = 0;
  int64_t steps_ = 0, last_forward_bytes_ = 0, last_backward_bytes_ = 0;
};

}  // namespace
}  // namespace braid::tensor_parallel

BRAID_PLUGIN(registry) {
  absl::Status s = registry->AddStrategy(
      braid::tensor_parallel::kName,
      [] { return std::make_unique<braid::tensor_parallel::TensorParallelStrategy>(); },
      // The tensor axis: splits layers, then wraps the layer below (Strategy::Wrap).
      braid::StrategyTraits{{"tensor_parallel"}, {braid::kAxisTensor}});
  return s.ok() ? 0 : 1;
}
