// Mixed-precision training (the config's bf16 / fp16 sections), for every strategy that lays
// out parameters in their own dtype: the model's parameters, activations and gradients are
// bf16 or f16; the optimizer steps f32 master copies.
//
// It is built from three pieces the training program puts around any strategy, so strategies
// need no precision code of their own:
//  1. CastParameters turns the model's floating parameters into the half dtype before Setup
//     (the strategy then buckets, flattens or shards half tensors; DDP and ZeRO reduce half
//     gradients, half the bytes of f32).
//  2. MixedPrecisionOptimizerFactory wraps the optimizer factory the strategy is given: whatever
//     tensors the strategy decides to step (whole parameters, ZeRO's flat shards) get an f32
//     master each, and the real optimizer (AdamW, SGD, a plugin's) steps the masters.
//  3. ScaledLoss multiplies the backward pass by the loss scale (ops::ScaleGrad) while the loss
//     value, and so every reported loss, stays unscaled.
// At each Step the wrapper up-casts the gradients into f32, divides the loss scale out (and any
// clipping factor: MultiplyGradients), and checks them for inf/NaN; the ranks agree on whether
// any found one (`sum_over_ranks`, on the device), every rank skips the step if so, and the
// LossScaler adjusts.
//
// DeepSpeed's FP16_Optimizer / BF16_Optimizer and PyTorch's GradScaler are the models; unlike
// AMP's autocast, the parameters themselves are half, so their memory halves too.
#ifndef BRAID_LAUNCHER_MIXED_PRECISION_MIXED_PRECISION_H_
#define BRAID_LAUNCHER_MIXED_PRECISION_MIXED_PRECISION_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "core/dtype.h"
#include "launcher/mixed_precision/loss_scaler.h"
#include "core/module.h"
#include "core/optimizer.h"
#include "core/strategy.h"

namespace braid {

// The state the optimizer wrapper and the training program share for one run.
struct MixedPrecision {
  DType dtype = DType::kBF16;  // kBF16 or kF16
  LossScaler scaler{LossScalerOptions{/*dynamic=*/false, /*initial_scale=*/1.0f}};
  // How the ranks agree on a non-finite gradient: adds every rank's check value (the sum of its
  // up-cast gradients, a one-element f32 tensor) into the tensor it is given, in place, before
  // the step's one read: an all-reduce (sum) on `device`, where NCCL takes it, waited for. One
  // rank's inf/NaN makes the sum non-finite on every rank (finite half gradients cannot
  // overflow an f32 sum), so every rank skips that step. Every rank calls it once per step, in
  // step order. Null: this process alone decides.
  std::function<void(Tensor&)> sum_over_ranks;
  // The model's device: where a rank without gradients makes its check value (0).
  Device device = Device::CPU();
  // What the last step did (for the metrics file).
  bool last_step_skipped = false;
  float last_step_scale = 1.0f;  // the scale the last step's gradients carried
};

// Converts every floating parameter of `model` to `dtype`, in place (identity kept: modules'
// handles follow). Buffers and integer tensors are left alone.
void CastParameters(Module& model, DType dtype);

// Wraps `make_inner` so that the optimizer it builds steps f32 masters of the (half) tensors a
// strategy passes. `mp` must outlive the optimizer.
OptimizerFactory MixedPrecisionOptimizerFactory(OptimizerFactory make_inner, MixedPrecision* mp);

// After parameters were overwritten outside the optimizer (--init_from weights loaded after
// Setup): the f32 masters take their values again. A no-op for any other optimizer.
void ReloadMasterWeights(Optimizer& optimizer);

// `loss` scaled for backward by the current loss scale, its value unchanged.
Tensor ScaledLoss(const Tensor& loss, const MixedPrecision& mp);

// A batch's floating inputs in the model's dtype (images for the MLP; token ids stay i32).
Batch CastInputs(const Batch& batch, DType dtype);

}  // namespace braid

#endif  // BRAID_LAUNCHER_MIXED_PRECISION_MIXED_PRECISION_H_
