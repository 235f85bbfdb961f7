// The smallest useful strategy plugin, built outside plugins/: one process, plain gradient
// accumulation and the optimizer's step. It announces itself on stdout at Setup, so that a test
// of the training program can tell that this plugin's code ran.
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/autograd.h"
#include "core/micro_batches.h"
#include "core/ops.h"
#include "core/optimizer.h"
#include "core/plugin_api.h"
#include "core/registry.h"
#include "core/strategy.h"

namespace braid::external_example {
namespace {

class ExternalExampleStrategy final : public Strategy {
 public:
  std::string name() const override { return "external_example"; }

  absl::Status Setup(Module& model, const OptimizerFactory& make_optimizer,
                     const StrategyContext& ctx) override {
    if (ctx.comm != nullptr && ctx.comm->size() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "strategy 'external_example' trains one process; the world has ", ctx.comm->size()));
    }
    if (!ctx.options.empty()) {
      return absl::InvalidArgumentError("strategy 'external_example' takes no options");
    }
    optimizer_ = make_optimizer(model.NamedParameters());
    if (optimizer_ == nullptr) {
      return absl::InvalidArgumentError("strategy 'external_example': no optimizer");
    }
    model_ = &model;
    std::printf("external_example: set up on %lld parameters\n",
                static_cast<long long>(model.NumParameters()));
    std::fflush(stdout);
    return absl::OkStatus();
  }

  absl::StatusOr<StepStats> TrainStep(const std::vector<Batch>& micro_batches,
                                      const LossFn& loss_fn) override {
    if (model_ == nullptr || micro_batches.empty()) {
      return absl::FailedPreconditionError(
          "strategy 'external_example': TrainStep needs Setup and at least one micro-batch");
    }
    optimizer_->ZeroGrad();
    StepStats stats;
    // The loop every strategy shares: forward, loss check, backward of loss / k.
    absl::Status st = RunMicroBatches(name(), *model_, micro_batches, loss_fn, &stats);
    if (!st.ok()) return st;
    optimizer_->Step();
    return stats;
  }

  Optimizer* optimizer() override { return optimizer_.get(); }

  absl::StatusOr<std::map<std::string, Tensor>> FullStateDict() override {
    if (model_ == nullptr) {
      return absl::FailedPreconditionError("strategy 'external_example': not set up");
    }
    return model_->StateDict();
  }
  absl::Status LoadFullStateDict(const std::map<std::string, Tensor>& state) override {
    if (model_ == nullptr) return absl::FailedPreconditionError("strategy 'external_example': not set up");
    return model_->LoadStateDict(state, /*strict=*/true);
  }
  int data_parallel_rank() const override { return 0; }
  int data_parallel_size() const override { return 1; }
  absl::Status Evaluate(const std::function<void(Module&)>& eval) override {
    if (model_ == nullptr) return absl::FailedPreconditionError("strategy 'external_example': not set up");
    autograd::NoGradGuard no_grad;
    eval(*model_);
    return absl::OkStatus();
  }

 private:
  Module* model_ = nullptr;
  std::unique_ptr<Optimizer> optimizer_;
};

}  // namespace
}  // namespace braid::external_example

BRAID_PLUGIN(registry) {
  absl::Status s = registry->AddStrategy("external_example", [] {
    return std::make_unique<braid::external_example::ExternalExampleStrategy>();
  });
  return s.ok() ? 0 : 1;
}
