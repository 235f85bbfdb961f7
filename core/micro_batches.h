// The micro-batch loop every strategy runs inside TrainStep: forward and loss, the loss checked,
// backward of loss / k. One copy of it, so that the 1/k scaling, the loss check and the timing
// mean the same thing under every strategy; strategies attach to it through the events below
// and through the model's hooks (DDP's reductions, ZeRO's gathers run inside backward).
#ifndef BRAID_CORE_MICRO_BATCHES_H_
#define BRAID_CORE_MICRO_BATCHES_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/module.h"
#include "core/strategy.h"
#include "core/tensor.h"

namespace braid {

// Optional callbacks; `last` is true for the final micro-batch of the step.
struct MicroBatchEvents {
  // Before micro-batch i's forward (DDP: a pass that reduces only when `last`).
  std::function<void(int i, bool last)> before_forward;
  // Its loss is checked and about to be differentiated.
  std::function<void(int i, bool last, const Tensor& loss)> before_backward;
  // Its backward has returned.
  std::function<void(int i, bool last)> after_backward;
  // Its loss failed the check: a strategy whose ranks must stay in step (collectives inside
  // backward) takes part in them here, flagged as abandoned, before the error is returned.
  std::function<void(int i)> on_bad_loss;
  // Not an event: true leaves stats->loss unset and the mean loss on the device only
  // (stats->device_loss), for the strategy to read with the step's other scalars
  // (ReadStepScalarsAndClip); false reads it at the end of the loop (one host synchronisation).
  bool read_loss_later = false;
};

// "strategy '<who>': the loss of micro-batch i is ..." unless `loss` is a defined scalar that
// requires grad (a loss that depends on no parameter would silently train nothing).
absl::Status CheckLoss(const std::string& who, int i, const Tensor& loss);

// For each of the k micro-batches: forward and loss through `loss_fn`, CheckLoss, backward of
// loss / k, so the gradients accumulated in .grad are those of the mean loss over their
// concatenation (equal micro-batches). Adds the time in forward and backward to `stats`, sets
// stats->device_loss to the mean loss (summed in f32 on the loss's device: no host
// synchronisation per micro-batch) and stats->loss to its value unless
// events.read_loss_later. Does not zero gradients, reduce, clip or step.
absl::Status RunMicroBatches(const std::string& who, Module& model,
                             const std::vector<Batch>& micro_batches, const LossFn& loss_fn,
                             StepStats* stats, const MicroBatchEvents& events = {});

// The step's one host synchronisation, for a strategy whose gradients are complete on this
// rank's device (after its reduction) and whose optimizer is about to Step: reads
// stats->device_loss (RunMicroBatches with read_loss_later), this rank's squared gradient norm
// (SquaredGradNormOnDevice) and the optimizer's PreStepChecks with one device-to-host transfer
// (ReadScalars), then clips as ClipGradNormSharded(optimizer, ...) does. Sets stats->loss and
// stats->grad_norm. `global_sum` runs on the host, on the value read (null: the value itself).
void ReadStepScalarsAndClip(Optimizer& optimizer, const std::vector<Tensor>& params,
                            float max_norm, const std::function<double(double)>& global_sum,
                            StepStats* stats);

// The same where each rank holds part of the gradients (ZeRO's shards, a pipeline's stages):
// `sum_over_ranks` adds every rank's squared norm into the one-element f32 tensor it is given, in
// place on `device` (an all-reduce on the device, waited for), before the one read, so the sum
// over ranks costs no read of its own (the layers above add theirs there too:
// StrategyContext::model_parallel_sum_on_device). `global_sum` then runs on the host on the value
// read (null: the value itself). A rank without gradients takes part with 0.
void ReadStepScalarsAndClip(Optimizer& optimizer, const std::vector<Tensor>& params,
                            float max_norm, Device device,
                            const std::function<void(Tensor&)>& sum_over_ranks,
                            const std::function<double(double)>& global_sum, StepStats* stats);

// The same, with values the strategy must see before anything is clipped or stepped, read in the
// same transfer (DDP: every bucket's flags, which decide whether the step stands and which
// parameters got no gradient on any rank): `decide` gets every element of `extra`, in order
// (ReadValues), right after the read. An error from it is returned at once, with nothing clipped
// and stats->grad_norm unset: the strategy then does not step.
absl::Status ReadStepScalarsAndClip(Optimizer& optimizer, const std::vector<Tensor>& params,
                                    float max_norm, Device device,
                                    const std::function<void(Tensor&)>& sum_over_ranks,
                                    const std::function<double(double)>& global_sum,
                                    const std::vector<Tensor>& extra,
                                    const std::function<absl::Status(const std::vector<float>&)>& decide,
                                    StepStats* stats);

}  // namespace braid

#endif  // BRAID_CORE_MICRO_BATCHES_H_
