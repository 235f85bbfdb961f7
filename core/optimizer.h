// Optimizer interface and Braid's two built-in optimizers. An optimizer steps whatever tensors
// it is given, including flat shards of a flat parameter buffer (ZeRO): all it needs of each is
// the tensor and its .grad of the same shape.
#ifndef BRAID_CORE_OPTIMIZER_H_
#define BRAID_CORE_OPTIMIZER_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace braid {

struct ParamGroup {
  std::vector<Tensor> params;
  float lr = 1e-3f;
  float weight_decay = 0.0f;
  // Adam's betas when a schedule sets them (DeepSpeed's OneCycle cycles beta1 with the rate);
  // < 0: the optimizer's own options. Optimizers without betas ignore them.
  float beta1 = -1.0f, beta2 = -1.0f;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual std::string name() const = 0;
  // One update of every parameter that has a gradient; parameters without one are skipped.
  virtual void Step() = 0;
  void ZeroGrad();
  // Sets every group's learning rate (LR schedules call this before Step).
  void SetLearningRate(float lr);
  // Sets every group's Adam betas (momentum schedules call this before Step).
  void SetBetas(float beta1, float beta2);
  std::vector<ParamGroup>& param_groups() { return groups_; }

  // State keyed "<param name or index>.<slot>" plus "step"; moves between processes with the
  // same parameter layout.
  virtual std::map<std::string, Tensor> StateDict() const = 0;
  virtual absl::Status LoadStateDict(const std::map<std::string, Tensor>& state) = 0;

  // For checkpoints that place each parameter's state where the parameter goes (a sharded
  // checkpoint, resharded on load): the state of every parameter, in param_groups() order, by
  // slot name ("exp_avg" -> the optimizer's own tensor, so writing into it loads it). With
  // `create`, a parameter never stepped gets its (zero) state first, so that a checkpoint can be
  // loaded before the first step. Empty maps for an optimizer without per-parameter state.
  virtual std::vector<std::map<std::string, Tensor>> ParameterStates(bool create) = 0;
  // The number of steps taken (AdamW's bias correction depends on it).
  virtual int64_t steps_taken() const = 0;
  virtual void set_steps_taken(int64_t steps) = 0;

  // The factor the gradients handed to this optimizer carry: mixed precision's loss scale, 1
  // otherwise. A gradient norm divides it out (ClipGradNormSharded with an optimizer).
  virtual float gradient_scale() const { return 1.0f; }
  // Multiplies the gradients the next Step uses by `factor` (clipping). The default scales each
  // .grad in place; mixed precision folds the factor into its own unscaling instead, so that
  // half-precision gradients are not rounded a second time.
  virtual void MultiplyGradients(float factor);

  // Checks this optimizer makes on the gradients before its next Step that the host must see
  // (mixed precision: whether any is inf/NaN), as one-element tensors computed where the
  // gradients are, without synchronising: the step reads them together with its loss and
  // gradient norm (ReadStepScalarsAndClip, core/micro_batches.h), then hands their values to
  // SetPreStepCheckResults before Step. An optimizer not asked computes them in Step. Default:
  // none.
  virtual std::vector<Tensor> PreStepChecks() { return {}; }
  virtual void SetPreStepCheckResults(const std::vector<float>& values) {}

 protected:
  explicit Optimizer(std::vector<ParamGroup> groups) : groups_(std::move(groups)) {}
  // Each parameter's state-dict key, [group][index]: its name when that names it alone among
  // this optimizer's parameters, otherwise "<group>.<index>" (flat shards, unnamed tensors).
  // One rule for every optimizer, so their state dicts key parameters alike.
  std::vector<std::vector<std::string>> Keys() const;
  std::vector<ParamGroup> groups_;
};

struct AdamWOptions {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
};
std::unique_ptr<Optimizer> MakeAdamW(std::vector<ParamGroup> groups, AdamWOptions opts = {});

// DeepSpeed's "Adam": with adam_w_mode (DeepSpeed's default) it is AdamW (decoupled weight
// decay); without, PyTorch's Adam, whose weight decay is L2 regularisation: weight_decay × param
// is added to the gradient before the moments, so it is scaled by the adaptive denominator.
struct AdamOptions {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  bool adam_w_mode = true;
};
std::unique_ptr<Optimizer> MakeAdam(std::vector<ParamGroup> groups, AdamOptions opts = {});

struct SgdOptions {
  float momentum = 0.0f, dampening = 0.0f;
  bool nesterov = false;
};
std::unique_ptr<Optimizer> MakeSgd(std::vector<ParamGroup> groups, SgdOptions opts = {});

// Learning-rate schedules: the rate for a 0-based step.
class LrSchedule {
 public:
  virtual ~LrSchedule() = default;
  virtual float At(int64_t step) const = 0;
};
std::unique_ptr<LrSchedule> ConstantLr(float lr);
// Linear warm-up from warmup_start_lr to max_lr over `warmup` steps, then cosine decay to min_lr
// at `total` steps, min_lr after.
std::unique_ptr<LrSchedule> WarmupCosineLr(float max_lr, float min_lr, int64_t warmup, int64_t total,
                                           float warmup_start_lr = 0.0f);

// Scales the gradients of `params` so that their global L2 norm is at most max_norm (as
// PyTorch's clip_grad_norm_); returns the norm before clipping. max_norm <= 0: measure only.
float ClipGradNorm(const std::vector<Tensor>& params, float max_norm);
// The same for gradients sharded across ranks (ZeRO): `global_sum` turns this rank's sum of
// squares into the sum over every rank (an all-reduce), so every rank gets the same norm and
// scales its shard by the same factor. Each parameter's sum of squares counts with its
// grad_norm_share() (1 unless tensor parallelism replicates it across its group).
float ClipGradNormSharded(const std::vector<Tensor>& params, float max_norm,
                          const std::function<double(double)>& global_sum);
// What strategies call: the same for the gradients `optimizer` is about to step, which carry its
// gradient_scale() (the loss scale). Returns the norm of the unscaled gradients; clipping goes
// through optimizer.MultiplyGradients. Gradients of any floating dtype; f32 squares, summed per
// parameter by sum_all and across parameters in f32 on the device, read with one host
// synchronisation. A non-finite norm (an overflow the optimizer will skip) clips nothing.
float ClipGradNormSharded(Optimizer& optimizer, const std::vector<Tensor>& params, float max_norm,
                          const std::function<double(double)>& global_sum);
// This rank's share of the squared gradient norm of `params` (each with its grad_norm_share()),
// as a one-element f32 tensor on the gradients' device (undefined when none has a gradient),
// enqueued there with no host synchronisation: per parameter, f32 squares summed (sum_all), the
// sums added into one f32 scalar. ClipGradNormSharded reads it; a step that reads several
// scalars at once passes it to ReadScalars (core/scalar_reads.h).
Tensor SquaredGradNormOnDevice(const std::vector<Tensor>& params);
// ClipGradNormSharded(optimizer, ...) once this rank's squared norm has been read.
float ClipGradNormFromSquared(Optimizer& optimizer, double local_squared, float max_norm,
                              const std::function<double(double)>& global_sum);

}  // namespace braid

#endif  // BRAID_CORE_OPTIMIZER_H_
