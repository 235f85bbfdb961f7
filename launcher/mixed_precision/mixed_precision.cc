#include "launcher/mixed_precision/mixed_precision.h"

#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/kernels.h"
#include "core/ops.h"
#include "core/scalar_reads.h"

namespace braid {
namespace {

// Steps f32 masters of the half tensors a strategy hands it, through an inner optimizer that
// never sees anything but f32. Its param_groups() are the half tensors, so a strategy (and
// OptimizerStateChunks) sees the parameters it laid out; the masters are state, saved under the
// slot "master".
class MixedPrecisionOptimizer : public Optimizer {
 public:
  MixedPrecisionOptimizer(std::vector<ParamGroup> half_groups, std::vector<std::vector<Tensor>> masters,
                          std::unique_ptr<Optimizer> inner, MixedPrecision* mp)
      : Optimizer(std::move(half_groups)), masters_(std::move(masters)), inner_(std::move(inner)), mp_(mp) {
    master_grads_.resize(masters_.size());
    for (size_t g = 0; g < masters_.size(); ++g) master_grads_[g].resize(masters_[g].size());
  }

  std::string name() const override { return inner_->name(); }

  float gradient_scale() const override { return mp_->scaler.scale(); }
  void MultiplyGradients(float factor) override { pending_factor_ *= factor; }

  // The up-cast f32 gradients' sum, a device scalar: inf or NaN anywhere makes it non-finite
  // (finite gradients cannot overflow an f32 sum of this size: half values are at most 65504).
  // Already summed over the ranks (sum_over_ranks), so the value read is every rank's answer.
  std::vector<Tensor> PreStepChecks() override {
    checked_ = false;
    return {AgreedCheck()};
  }
  void SetPreStepCheckResults(const std::vector<float>& values) override {
    BRAID_CHECK(values.size() == 1) << "mixed precision: expected one pre-step check value";
    checked_ = true;
    checked_bad_ = !std::isfinite(values[0]);
  }

  void Step() override {
    const float scale = mp_->scaler.scale();
    const float multiplier = pending_factor_ / scale;
    pending_factor_ = 1.0f;
    // Asked before (PreStepChecks): the gradients are up-cast and the ranks' agreed check value
    // is known. Otherwise up-cast, agree and check now, with one host synchronisation.
    const bool bad = checked_ ? checked_bad_ : !std::isfinite(ReadScalars({AgreedCheck()})[0]);
    checked_ = false;
    for (size_t g = 0; g < groups_.size(); ++g) {
      ParamGroup& inner_group = inner_->param_groups()[g];
      inner_group.lr = groups_[g].lr;  // schedules set the rate on this optimizer's groups
      inner_group.beta1 = groups_[g].beta1;  // and the betas (OneCycle's momentum)
      inner_group.beta2 = groups_[g].beta2;
      inner_group.weight_decay = groups_[g].weight_decay;
      for (size_t i = 0; i < groups_[g].params.size(); ++i) {
        Tensor& master = masters_[g][i];
        if (!groups_[g].params[i].grad().defined()) {
          master.ZeroGrad();  // the inner optimizer skips it, as it would the parameter
          continue;
        }
        Tensor& mg = master_grads_[g][i];
        if (multiplier != 1.0f) {
          kernels::unary.Get(mg.device())(kernels::UnaryOp::kScale, mg, multiplier, mg);
        }
        master.set_grad(mg);
      }
    }
    mp_->last_step_scale = scale;
    mp_->last_step_skipped = !mp_->scaler.Update(bad);
    if (mp_->last_step_skipped) return;
    inner_->Step();
    for (size_t g = 0; g < groups_.size(); ++g) {
      for (size_t i = 0; i < groups_[g].params.size(); ++i) {
        if (!groups_[g].params[i].grad().defined()) continue;
        Tensor(groups_[g].params[i]).CopyFrom(masters_[g][i]);  // round once, to nearest even
      }
    }
  }

  std::map<std::string, Tensor> StateDict() const override {
    std::map<std::string, Tensor> state = inner_->StateDict();
    const auto keys = Keys();
    for (size_t g = 0; g < masters_.size(); ++g) {
      for (size_t i = 0; i < masters_[g].size(); ++i) {
        state[absl::StrCat(keys[g][i], ".master")] = masters_[g][i].Detach();
      }
    }
    return state;
  }

  absl::Status LoadStateDict(const std::map<std::string, Tensor>& state) override {
    std::map<std::string, Tensor> inner_state;
    std::map<std::string, Tensor> master_state;
    for (const auto& [k, v] : state) {
      if (k.size() > 7 && k.compare(k.size() - 7, 7, ".master") == 0) {
        master_state[k] = v;
      } else {
        inner_state[k] = v;
      }
    }
    const auto keys = Keys();
    for (size_t g = 0; g < masters_.size(); ++g) {
      for (size_t i = 0; i < masters_[g].size(); ++i) {
        const std::string key = absl::StrCat(keys[g][i], ".master");
        auto it = master_state.find(key);
        if (it == master_state.end()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "optimizer state has no f32 master weights '", key,
              "': it was saved without mixed precision; load it into a run without fp16/bf16"));
        }
        if (it->second.shape() != masters_[g][i].shape()) {
          return absl::InvalidArgumentError(absl::StrCat("optimizer state '", key, "' is ",
                                                         it->second.DescribeForError(), ", expected ",
                                                         masters_[g][i].DescribeForError()));
        }
        masters_[g][i].CopyFrom(it->second);
        Tensor(groups_[g].params[i]).CopyFrom(masters_[g][i]);
      }
    }
    return inner_->LoadStateDict(inner_state);
  }

  std::vector<std::map<std::string, Tensor>> ParameterStates(bool create) override {
    std::vector<std::map<std::string, Tensor>> states = inner_->ParameterStates(create);
    size_t k = 0;
    for (size_t g = 0; g < masters_.size(); ++g) {
      for (size_t i = 0; i < masters_[g].size(); ++i, ++k) {
        if (k >= states.size()) states.emplace_back();
        states[k]["master"] = masters_[g][i];
      }
    }
    return states;
  }

  void ReloadMasters() {
    for (size_t g = 0; g < masters_.size(); ++g) {
      for (size_t i = 0; i < masters_[g].size(); ++i) masters_[g][i].CopyFrom(groups_[g].params[i]);
    }
  }

  int64_t steps_taken() const override { return inner_->steps_taken(); }
  void set_steps_taken(int64_t steps) override { inner_->set_steps_taken(steps); }

 private:
  std::vector<std::vector<Tensor>> masters_;       // [group][index], as the inner optimizer's
  std::vector<std::vector<Tensor>> master_grads_;  // f32 gradients, kept between steps
  std::unique_ptr<Optimizer> inner_;
  MixedPrecision* mp_;
  float pending_factor_ = 1.0f;  // clipping's factor for the next Step
  bool checked_ = false;      // PreStepChecks' value was handed in for the next Step
  bool checked_bad_ = false;  // ... and it was not finite

  // Each gradient up-cast into its f32 master gradient (the one rounding already happened in
  // backward; on a GPU a conversion kernel), and the sum of all of them as a device scalar
  // (undefined when no parameter has a gradient): no host synchronisation.
  // This rank's check value (0 without gradients), summed over the ranks on the device.
  Tensor AgreedCheck() {
    Tensor check = UpCastGradients();
    if (!check.defined()) check = Tensor::Zeros({}, DType::kF32, mp_->device);
    if (mp_->sum_over_ranks) mp_->sum_over_ranks(check);
    return check;
  }

  Tensor UpCastGradients() {
    Tensor total;
    for (size_t g = 0; g < groups_.size(); ++g) {
      for (size_t i = 0; i < groups_[g].params.size(); ++i) {
        Tensor grad = groups_[g].params[i].grad();
        if (!grad.defined()) continue;
        const Tensor& master = masters_[g][i];
        Tensor& mg = master_grads_[g][i];
        if (!mg.defined()) mg = Tensor::Empty(master.shape(), DType::kF32, master.device());
        mg.CopyFrom(grad);
        Tensor sum = Tensor::Empty({}, DType::kF32, mg.device());
        kernels::sum_all.Get(mg.device())(mg, sum);
        const bool first = !total.defined();
        if (first) total = Tensor::Empty({}, DType::kF32, mg.device());
        kernels::axpby.Get(mg.device())(1.0f, sum, first ? 0.0f : 1.0f, total);
      }
    }
    return total;
  }
};

}  // namespace

void CastParameters(Module& model, DType dtype) {
  BRAID_CHECK(dtype == DType::kBF16 || dtype == DType::kF16 || dtype == DType::kF32)
      << "CastParameters: " << DTypeName(dtype) << " is not a training precision";
  for (auto& [name, p] : model.NamedParameters()) {
    if (IsFloating(p.dtype())) p.ConvertTo(dtype);
  }
}

OptimizerFactory MixedPrecisionOptimizerFactory(OptimizerFactory make_inner, MixedPrecision* mp) {
  return [make_inner = std::move(make_inner), mp](
             const std::vector<std::pair<std::string, Tensor>>& named) -> std::unique_ptr<Optimizer> {
    // One f32 master per tensor, carrying what optimizers read from it (name, weight decay,
    // norm share), so the inner optimizer groups and keys the masters as it would the tensors.
    std::map<const TensorImpl*, Tensor> half_of;
    std::vector<std::pair<std::string, Tensor>> masters;
    for (const auto& [n, t] : named) {
      BRAID_CHECK(IsFloating(t.dtype())) << "mixed precision: " << t.DescribeForError()
                                         << " is not a floating tensor";
      Tensor m = t.Detach().To(DType::kF32);
      m.set_name(t.name()).set_weight_decay(t.weight_decay()).set_grad_norm_share(t.grad_norm_share());
      m.set_requires_grad(true);
      half_of.emplace(m.impl(), t);
      masters.emplace_back(n, m);
    }
    std::unique_ptr<Optimizer> inner = make_inner(masters);
    if (inner == nullptr) return nullptr;
    std::vector<ParamGroup> half_groups;
    std::vector<std::vector<Tensor>> master_groups;
    for (const ParamGroup& g : inner->param_groups()) {
      ParamGroup hg;
      hg.lr = g.lr;
      hg.weight_decay = g.weight_decay;
      hg.beta1 = g.beta1;
      hg.beta2 = g.beta2;
      std::vector<Tensor> ms;
      for (const Tensor& m : g.params) {
        auto it = half_of.find(m.impl());
        BRAID_CHECK(it != half_of.end()) << "the optimizer factory grouped a tensor it was not given: "
                                         << m.DescribeForError();
        hg.params.push_back(it->second);
        ms.push_back(m);
      }
      half_groups.push_back(std::move(hg));
      master_groups.push_back(std::move(ms));
    }
    return std::make_unique<MixedPrecisionOptimizer>(std::move(half_groups), std::move(master_groups),
                                                     std::move(inner), mp);
  };
}

void ReloadMasterWeights(Optimizer& optimizer) {
  if (auto* mp = dynamic_cast<MixedPrecisionOptimizer*>(&optimizer)) mp->ReloadMasters();
}

Tensor ScaledLoss(const Tensor& loss, const MixedPrecision& mp) {
  const float s = mp.scaler.scale();
  return s == 1.0f ? loss : ops::ScaleGrad(loss, s);
}

Batch CastInputs(const Batch& batch, DType dtype) {
  Batch out = batch;
  if (out.inputs.defined() && IsFloating(out.inputs.dtype()) && out.inputs.dtype() != dtype) {
    out.inputs = out.inputs.To(dtype);
  }
  return out;
}

}  // namespace braid
