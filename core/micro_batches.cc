#include "core/micro_batches.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/ops.h"

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
  double loss_sum = 0;
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
    loss_sum += loss.item();
    if (events.before_backward) events.before_backward(i, last, loss);
    start = absl::Now();
    // Exactly the loss when k = 1: no extra node, and bit-identical to an unscaled backward.
    (k > 1 ? ops::Scale(loss, 1.0f / float(k)) : loss).Backward();
    stats->backward_s += absl::ToDoubleSeconds(absl::Now() - start);
    if (events.after_backward) events.after_backward(i, last);
  }
  stats->loss = float(loss_sum / double(k));
  return absl::OkStatus();
}

}  // namespace braid
