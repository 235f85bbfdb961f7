// The "single" strategy: the whole model on one device in one process, no communication.
// Gradient accumulation scales each micro-batch's loss by 1/k, so with equal micro-batches the
// step equals one step on their concatenation.
#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "core/autograd.h"
#include "core/check.h"
#include "core/micro_batches.h"
#include "core/ops.h"
#include "core/optimizer.h"
#include "core/plugin_api.h"
#include "core/registry.h"
#include "core/strategy.h"

namespace braid {
namespace {

double Seconds(absl::Time from) { return absl::ToDoubleSeconds(absl::Now() - from); }

class SingleStrategy final : public Strategy {
 public:
  std::string name() const override { return "single"; }

  absl::Status Setup(Module& model, const OptimizerFactory& make_optimizer,
                     const StrategyContext& ctx) override {
    if (ctx.comm != nullptr && ctx.comm->size() != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("strategy 'single' trains on one rank but the world has ", ctx.comm->size(),
                       " ranks; use a data-parallel strategy (e.g. ddp) or launch one process"));
    }
    if (!ctx.options.empty()) {
      std::vector<std::string> keys;
      for (const auto& [k, v] : ctx.options) keys.push_back(k);
      return absl::InvalidArgumentError(absl::StrCat("strategy 'single' takes no options; remove ",
                                                     absl::StrJoin(keys, ", "),
                                                     " from the strategy section"));
    }
    if (!make_optimizer) {
      return absl::InvalidArgumentError("strategy 'single': no optimizer factory given");
    }
    for (const auto& [n, p] : model.NamedParameters()) p.MoveTo(ctx.device);
    for (const auto& [n, b] : model.NamedBuffers()) b.MoveTo(ctx.device);
    BRAID_RETURN_IF_ERROR(Adopt(model, make_optimizer(model.NamedParameters()), /*data=*/nullptr));
    max_grad_norm_ = ctx.max_grad_norm;
    model_parallel_sum_on_device_ = ctx.model_parallel_sum_on_device;
    device_ = ctx.device;
    return absl::OkStatus();
  }

  absl::StatusOr<StepStats> TrainStep(const std::vector<Batch>& micro_batches,
                                      const LossFn& loss_fn) override {
    if (model() == nullptr) {
      return absl::FailedPreconditionError("strategy 'single': TrainStep before Setup");
    }
    if (micro_batches.empty()) {
      return absl::InvalidArgumentError("strategy 'single': TrainStep got no micro-batches");
    }
    StepStats stats;
    optimizer()->ZeroGrad();
    MicroBatchEvents events;
    events.read_loss_later = true;
    BRAID_RETURN_IF_ERROR(RunMicroBatches(name(), *model(), micro_batches, loss_fn, &stats, events));
    absl::Time start = absl::Now();
    // The step's one host synchronisation: the loss, the gradient norm (always measured;
    // max_grad_norm_ <= 0 only measures) and the optimizer's checks, read together; then clipped
    // when clipping is on.
    ReadStepScalarsAndClip(
        *optimizer(), model()->Parameters(), max_grad_norm_, device_,
        [this, &stats](Tensor& squared) {
          if (model_parallel_sum_on_device_) model_parallel_sum_on_device_(squared, stats.device_loss);
        },
        /*global_sum=*/nullptr,
        &stats);
    optimizer()->Step();
    stats.optimizer_s = Seconds(start);
    RecordPeaks();  // gradients are still held; the optimizer's state exists after its first step
    return stats;
  }

  // What this process held of the model's state, for the summary (mixed precision's f32 masters
  // count as optimizer state: they are the optimizer's).
  std::vector<std::pair<std::string, int64_t>> ModelStatePeaks() const override {
    if (model() == nullptr) return {};
    return {{"parameters", peak_params_}, {"gradients", peak_grads_}, {"optimizer state", peak_state_}};
  }

 private:
  void RecordPeaks() {
    int64_t params = 0, grads = 0, state = 0;
    for (const Tensor& p : model()->Parameters()) {
      params += int64_t(p.nbytes());
      if (p.grad().defined()) grads += int64_t(p.grad().nbytes());
    }
    for (const auto& [k, t] : optimizer()->StateDict()) {
      if (k != "step" && t.defined()) state += int64_t(t.nbytes());
    }
    peak_params_ = std::max(peak_params_, params);
    peak_grads_ = std::max(peak_grads_, grads);
    peak_state_ = std::max(peak_state_, state);
  }

  int64_t peak_params_ = 0, peak_grads_ = 0, peak_state_ = 0;
  float max_grad_norm_ = 0;
  // The layers above's sums (the pipeline's stages, tensor parallelism's group), or null.
  std::function<void(Tensor&, Tensor&)> model_parallel_sum_on_device_;
  Device device_ = Device::CPU();
};

}  // namespace
}  // namespace braid

BRAID_PLUGIN(registry) {
  absl::Status s =
      registry->AddStrategy("single", [] { return std::make_unique<braid::SingleStrategy>(); },
                            // Half parameters (launcher/mixed_precision/mixed_precision.h); one data-parallel rank; what a
                            // one-rank config that names no strategy trains with.
                            braid::StrategyTraits{{"fp16", "bf16"}, {}, "", 1,
                                                  braid::StrategyTraits::DefaultFor::kOneDataRank});
  return s.ok() ? 0 : 1;
}
