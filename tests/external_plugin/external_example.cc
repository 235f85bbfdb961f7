// A data-parallel strategy plugin built outside plugins/, written only against the documented
// API (docs/WRITING_A_STRATEGY.md, whose code blocks are regions of this file, checked by
// //tests/external_plugin:guide_code_test). Each rank runs the shared micro-batch loop, the
// gradients are averaged over the data-parallel group after backward, clipped by the global norm
// and stepped: DDP without buckets or overlap. It declares no traits, so it serves the data axis
// and composes with tensor parallelism unchanged. It announces itself on stdout at Setup, so
// that a test of the training program can tell that this plugin's code ran.
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/autograd.h"
#include "core/broadcast.h"
#include "core/micro_batches.h"
#include "core/ops.h"
#include "core/optimizer.h"
#include "core/plugin_api.h"
#include "core/registry.h"
#include "core/strategy.h"

namespace braid::external_example {
namespace {

absl::Status Error(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("strategy 'external_example': ", what));
}

// Every rank holds the whole model: Setup ends with Adopt, and Strategy's defaults answer the
// full state, loading it, evaluation, checkpoint chunks and the data shard (core/strategy.h).
// What is left is what every strategy decides: name, Setup and TrainStep.
class ExternalExampleStrategy final : public Strategy {
 public:
  std::string name() const override { return "external_example"; }

  // [START setup]
  absl::Status Setup(Module& model, const OptimizerFactory& make_optimizer,
                     const StrategyContext& ctx) override {
    if (!ctx.options.empty()) return Error("takes no options");
    if (!make_optimizer) return Error("no optimizer factory");
    max_grad_norm_ = ctx.max_grad_norm;
    model_parallel_sum_on_device_ = ctx.model_parallel_sum_on_device;
    device_ = ctx.device;
    for (const auto& [n, p] : model.NamedParameters()) p.MoveTo(ctx.device);
    for (const auto& [n, b] : model.NamedBuffers()) b.MoveTo(ctx.device);
    // Rank 0's initial values everywhere, so replicas start equal whatever their seeds. The
    // group is the one the composer hands this layer: the world alone, or under tensor
    // parallelism or the pipeline the replicas of this rank's slices or stage.
    if (ctx.comm != nullptr) BRAID_RETURN_IF_ERROR(BroadcastModuleState(model, *ctx.comm, /*root=*/0));
    BRAID_RETURN_IF_ERROR(Adopt(model, make_optimizer(model.NamedParameters()), ctx.comm));
    std::printf("external_example: set up on %lld parameters, %d data-parallel rank(s)\n",
                static_cast<long long>(model.NumParameters()), data_parallel_size());
    std::fflush(stdout);
    return absl::OkStatus();
  }
  // [END setup]

  // [START train_step]
  absl::StatusOr<StepStats> TrainStep(const std::vector<Batch>& micro_batches,
                                      const LossFn& loss_fn) override {
    if (model() == nullptr) return NotSetUp("TrainStep");
    StepStats stats;
    optimizer()->ZeroGrad();
    // The loop every strategy shares: forward, loss check, backward of loss / k. The mean loss
    // stays on the device, to be read with the norm below.
    MicroBatchEvents events;
    events.read_loss_later = true;
    BRAID_RETURN_IF_ERROR(RunMicroBatches(name(), *model(), micro_batches, loss_fn, &stats, events));
    const absl::Time reduce_start = absl::Now();
    std::vector<Tensor> params = model()->Parameters();
    BRAID_RETURN_IF_ERROR(AverageGradients(params, &stats));
    stats.comm_exposed_s = absl::ToDoubleSeconds(absl::Now() - reduce_start);
    const absl::Time step_start = absl::Now();
    // Every rank holds the averaged gradient: the global norm is this rank's, with the squares of
    // the other parts of its model (a layer above: tensor parallelism's slices, a pipeline's
    // stages) added on the device, and the loss scale of mixed precision divided out. The loss,
    // this norm and the optimizer's checks reach the host in one read (on a GPU the step's one
    // wait for the device); clipping goes through the optimizer.
    ReadStepScalarsAndClip(
        *optimizer(), params, max_grad_norm_, device_,
        [this, &stats](Tensor& squared) {
          if (model_parallel_sum_on_device_) model_parallel_sum_on_device_(squared, stats.device_loss);
        },
        /*global_sum=*/nullptr, &stats);
    optimizer()->Step();
    stats.optimizer_s = absl::ToDoubleSeconds(absl::Now() - step_start);
    return stats;
  }
  // [END train_step]

 private:
  // The mean of every rank's gradient, in place: one all-reduce per parameter (a production
  // strategy would bucket them and overlap with backward, as plugins/ddp does).
  absl::Status AverageGradients(const std::vector<Tensor>& params, StepStats* stats) {
    if (data_group() == nullptr || data_group()->size() == 1) return absl::OkStatus();
    autograd::NoGradGuard no_grad;
    for (const Tensor& p : params) {
      Tensor g = p.grad();
      if (!g.defined()) continue;  // unused this step on every rank (same model, same graph)
      BRAID_RETURN_IF_ERROR(data_group()->AllReduce(g, ReduceOp::kAvg)->Wait());
      stats->comm_bytes += int64_t(g.nbytes());
      stats->comm_what = "gradients all-reduced";
    }
    return absl::OkStatus();
  }

  float max_grad_norm_ = 0;
  std::function<void(Tensor&, Tensor&)> model_parallel_sum_on_device_;  // the layers above's
  Device device_ = Device::CPU();
};

}  // namespace
}  // namespace braid::external_example

// [START register]
BRAID_PLUGIN(registry) {
  // No traits: it serves the data axis (launcher/compose.h), under any layer that wraps it.
  absl::Status s = registry->AddStrategy("external_example", [] {
    return std::make_unique<braid::external_example::ExternalExampleStrategy>();
  });
  return s.ok() ? 0 : 1;
}
// [END register]
