#include "core/micro_batches.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/check.h"
#include "core/kernels.h"
#include "core/ops.h"
#include "core/scalar_reads.h"

namespace braid {

absl::Status CheckLoss(const std::string& who, int i, const Tensor& loss) {
  if (loss.defined() && loss.numel() == 1 && loss.requires_grad()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "strategy '", who, "': the loss of micro-batch ", i, " is ", loss.DescribeForError(),
      loss.defined() && !loss.requires_grad() ? " and depends on no trainable parameter" : "",
      "; the loss function must return a scalar computed from the model's parameters"));
}

absl::Status RunMicroBatches(const std::string& who, Module& model,
                             const std::vector<Batch>& micro_batches, const LossFn& loss_fn,
                             StepStats* stats, const MicroBatchEvents& events) {
  const int k = int(micro_batches.size());
  if (k == 0) {
    return absl::InvalidArgumentError(absl::StrCat("strategy '", who, "': TrainStep got no micro-batches"));
  }
  // The losses are summed where they are (on a GPU: no host synchronisation per micro-batch)
  // and read once, here or, when the strategy asks, with the step's other scalars.
  Tensor loss_sum;
  for (int i = 0; i < k; ++i) {
    const bool last = i == k - 1;
    if (events.before_forward) events.before_forward(i, last);
    absl::Time start = absl::Now();
    Tensor loss = loss_fn(model, micro_batches[size_t(i)]);
    stats->forward_s += absl::ToDoubleSeconds(absl::Now() - start);
    if (absl::Status st = CheckLoss(who, i, loss); !st.ok()) {
      if (events.on_bad_loss) events.on_bad_loss(i);
      return st;
    }
    if (i == 0) loss_sum = Tensor::Empty({}, DType::kF32, loss.device());
    kernels::axpby.Get(loss.device(), kernels::AxpbyKey(loss, loss_sum))(
        1.0f, loss.Detach(), i == 0 ? 0.0f : 1.0f, loss_sum);
    if (events.before_backward) events.before_backward(i, last, loss);
    start = absl::Now();
    // Exactly the loss when k = 1: no extra node, and bit-identical to an unscaled backward.
    (k > 1 ? ops::Scale(loss, 1.0f / float(k)) : loss).Backward();
    stats->backward_s += absl::ToDoubleSeconds(absl::Now() - start);
    if (events.after_backward) events.after_backward(i, last);
  }
  if (k > 1) {
    kernels::unary.Get(loss_sum.device())(kernels::UnaryOp::kScale, loss_sum, 1.0f / float(k),
                                         loss_sum);
  }
  stats->device_loss = loss_sum;
  if (!events.read_loss_later) stats->loss = ReadScalars({loss_sum})[0];
  return absl::OkStatus();
}

namespace {

// Everything the host needs from the device this step, in one read: the mean loss, the
// squared gradient norm, the optimizer's own checks (mixed precision's inf/NaN), and what the
// strategy adds (`extra`, handed to `decide` before anything else happens).
absl::Status ReadAndClip(Optimizer& optimizer, const Tensor& squared_norm, float max_norm,
                         const std::function<double(double)>& global_sum,
                         const std::vector<Tensor>& extra,
                         const std::function<absl::Status(const std::vector<float>&)>& decide,
                         StepStats* stats) {
  std::vector<Tensor> scalars = {stats->device_loss, squared_norm};
  const std::vector<Tensor> checks = optimizer.PreStepChecks();
  scalars.insert(scalars.end(), checks.begin(), checks.end());
  const size_t n = scalars.size();
  // Each scalar one value (an undefined one reads as 0), then the extra tensors' elements.
  for (Tensor& s : scalars) {
    if (!s.defined()) s = Tensor::Zeros({}, DType::kF32, Device::CPU());
  }
  scalars.insert(scalars.end(), extra.begin(), extra.end());
  const std::vector<float> values = ReadValues(scalars);
  if (decide) {
    BRAID_RETURN_IF_ERROR(decide(std::vector<float>(values.begin() + long(n), values.end())));
  }
  if (stats->device_loss.defined()) stats->loss = values[0];
  optimizer.SetPreStepCheckResults(std::vector<float>(values.begin() + 2, values.begin() + long(n)));
  stats->grad_norm = ClipGradNormFromSquared(
      optimizer, double(values[1]), max_norm,
      global_sum ? global_sum : std::function<double(double)>([](double x) { return x; }));
  return absl::OkStatus();
}

}  // namespace

void ReadStepScalarsAndClip(Optimizer& optimizer, const std::vector<Tensor>& params,
                            float max_norm, const std::function<double(double)>& global_sum,
                            StepStats* stats) {
  BRAID_CHECK_OK(ReadAndClip(optimizer, SquaredGradNormOnDevice(params), max_norm, global_sum, {},
                             nullptr, stats));
}

absl::Status ReadStepScalarsAndClip(Optimizer& optimizer, const std::vector<Tensor>& params,
                                    float max_norm, Device device,
                                    const std::function<void(Tensor&)>& sum_over_ranks,
                                    const std::function<double(double)>& global_sum,
                                    const std::vector<Tensor>& extra,
                                    const std::function<absl::Status(const std::vector<float>&)>& decide,
                                    StepStats* stats) {
  Tensor squared = SquaredGradNormOnDevice(params);
  if (!squared.defined()) squared = Tensor::Zeros({}, DType::kF32, device);
  BRAID_CHECK(squared.device() == device)
      << "ReadStepScalarsAndClip: the gradients of " << squared.DescribeForError()
      << " are not on " << device.ToString();
  if (sum_over_ranks) sum_over_ranks(squared);
  return ReadAndClip(optimizer, squared, max_norm, global_sum, extra, decide, stats);
}

void ReadStepScalarsAndClip(Optimizer& optimizer, const std::vector<Tensor>& params,
                            float max_norm, Device device,
                            const std::function<void(Tensor&)>& sum_over_ranks,
                            const std::function<double(double)>& global_sum, StepStats* stats) {
  BRAID_CHECK_OK(ReadStepScalarsAndClip(optimizer, params, max_norm, device, sum_over_ranks,
                                        global_sum, {}, nullptr, stats));
}

}  // namespace braid
