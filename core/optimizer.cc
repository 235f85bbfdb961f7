#include "core/optimizer.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/kernels.h"
#include "core/scalar_reads.h"
#include "core/optimizer_state.h"

namespace braid {

std::vector<std::vector<std::string>> Optimizer::Keys() const {
  std::map<std::string, int> uses;
  for (const ParamGroup& g : groups_) {
    for (const Tensor& p : g.params) uses[p.name()]++;
  }
  std::vector<std::vector<std::string>> keys(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      const std::string& n = groups_[g].params[i].name();
      keys[g].push_back(!n.empty() && uses[n] == 1 ? n : absl::StrCat(g, ".", i));
    }
  }
  return keys;
}

void Optimizer::ZeroGrad() {
  for (ParamGroup& g : groups_) {
    for (Tensor& p : g.params) p.ZeroGrad();
  }
}

void Optimizer::SetLearningRate(float lr) {
  for (ParamGroup& g : groups_) g.lr = lr;
}

void Optimizer::SetBetas(float beta1, float beta2) {
  for (ParamGroup& g : groups_) {
    g.beta1 = beta1;
    g.beta2 = beta2;
  }
}

namespace {

constexpr char kStepKey[] = "step";

// Per-parameter state tensors ("slots", named as PyTorch names them), allocated on a parameter's
// device the first time it is stepped, and the state dict built from them. One step counter for
// the whole optimizer: every parameter of a training step has a gradient in Braid's strategies.
class SlottedOptimizer : public Optimizer {
 protected:
  SlottedOptimizer(std::vector<ParamGroup> groups, std::vector<std::string> slot_names)
      : Optimizer(std::move(groups)), slot_names_(std::move(slot_names)) {}

  // Grows the state to match param_groups() (callers may add parameters after construction).
  void SyncState() {
    state_.resize(groups_.size());
    for (size_t g = 0; g < groups_.size(); ++g) {
      state_[g].resize(groups_[g].params.size(), std::vector<Tensor>(slot_names_.size()));
    }
  }

  bool HasState(size_t g, size_t i) const {
    return !slot_names_.empty() && state_[g][i][0].defined();
  }

  Tensor& Slot(size_t g, size_t i, size_t slot) {
    return SlotOnFirstUse(state_[g][i][slot], groups_[g].params[i]);
  }

  // The parameter's gradient, checked against it; undefined when it has none this step.
  static Tensor GradOf(const Tensor& p, const char* optimizer) {
    Tensor grad = p.grad();
    if (!grad.defined()) return grad;
    BRAID_CHECK(p.dtype() == DType::kF32 && grad.dtype() == DType::kF32)
        << optimizer << " steps f32 parameters with f32 gradients; got parameter "
        << p.DescribeForError() << " with gradient " << grad.DescribeForError();
    BRAID_CHECK(grad.shape() == p.shape() && grad.device() == p.device())
        << optimizer << ": gradient " << grad.DescribeForError() << " does not match parameter "
        << p.DescribeForError();
    return grad;
  }


 public:
  std::map<std::string, Tensor> StateDict() const override {
    std::map<std::string, Tensor> out;
    out[kStepKey] = Tensor::FromVector(std::vector<int64_t>{step_}, {});
    auto keys = Keys();
    for (size_t g = 0; g < state_.size(); ++g) {
      for (size_t i = 0; i < state_[g].size(); ++i) {
        for (size_t s = 0; s < slot_names_.size(); ++s) {
          if (state_[g][i][s].defined()) {
            out[absl::StrCat(keys[g][i], ".", slot_names_[s])] = state_[g][i][s];
          }
        }
      }
    }
    return out;
  }

  std::vector<std::map<std::string, Tensor>> ParameterStates(bool create) override {
    SyncState();
    return PerParameterStates(groups_, [&](size_t g, size_t i) {
      std::map<std::string, Tensor> slots;
      if (create || HasState(g, i)) {
        for (size_t s = 0; s < slot_names_.size(); ++s) slots[slot_names_[s]] = Slot(g, i, s);
      }
      return slots;
    });
  }
  int64_t steps_taken() const override { return step_; }
  void set_steps_taken(int64_t steps) override { step_ = steps; }

  absl::Status LoadStateDict(const std::map<std::string, Tensor>& state) override {
    SyncState();
    auto keys = Keys();
    std::vector<std::string> missing, unexpected, mismatched;
    std::map<std::string, bool> known;  // every key this optimizer could have
    auto step_it = state.find(kStepKey);
    if (step_it == state.end()) {
      missing.push_back(kStepKey);
    } else if (!step_it->second.defined() || step_it->second.numel() != 1) {
      mismatched.push_back(absl::StrCat(kStepKey, " (must hold one number)"));
    }
    for (size_t g = 0; g < groups_.size(); ++g) {
      for (size_t i = 0; i < groups_[g].params.size(); ++i) {
        const Tensor& p = groups_[g].params[i];
        std::vector<std::string> absent;
        for (const std::string& slot : slot_names_) {
          std::string key = absl::StrCat(keys[g][i], ".", slot);
          known[key] = true;
          auto it = state.find(key);
          if (it == state.end()) {
            absent.push_back(key);
          } else if (!it->second.defined() || it->second.shape() != p.shape()) {
            mismatched.push_back(absl::StrCat(
                key, " (parameter ", ShapeToString(p.shape()), ", given ",
                it->second.defined() ? ShapeToString(it->second.shape()) : "undefined", ")"));
          }
        }
        // A parameter never stepped has no state at all; partial state is a broken dict.
        if (absent.size() != slot_names_.size()) {
          missing.insert(missing.end(), absent.begin(), absent.end());
        }
      }
    }
    for (const auto& [key, t] : state) {
      if (key != kStepKey && !known.count(key)) unexpected.push_back(key);
    }
    absl::Status fits = StateLoadError(
        name(), missing, unexpected, mismatched,
        absl::StrCat(" keys are '<parameter name or group.index>.<",
                     absl::StrJoin(slot_names_, "|"),
                     ">' and 'step', for the same parameters in the same groups"));
    if (!fits.ok()) return fits;
    const Tensor& step = step_it->second;
    step_ = step.dtype() == DType::kI64 ? step.To(Device::CPU()).ToVector<int64_t>()[0]
                                        : int64_t(step.item());
    for (size_t g = 0; g < groups_.size(); ++g) {
      for (size_t i = 0; i < groups_[g].params.size(); ++i) {
        for (size_t s = 0; s < slot_names_.size(); ++s) {
          auto it = state.find(absl::StrCat(keys[g][i], ".", slot_names_[s]));
          if (it == state.end()) {
            state_[g][i][s] = Tensor();
          } else {
            Slot(g, i, s).CopyFrom(it->second);
          }
        }
      }
    }
    return absl::OkStatus();
  }

 protected:
  int64_t step_ = 0;

 private:
  std::vector<std::string> slot_names_;
  std::vector<std::vector<std::vector<Tensor>>> state_;  // [group][param][slot]
};

// AdamW, and Adam with L2 weight decay (`decoupled` false). One class: the moments, the bias
// correction and the state dict are the same; only where weight decay enters differs.
class AdamW final : public SlottedOptimizer {
 public:
  AdamW(std::vector<ParamGroup> groups, AdamWOptions opts, std::string name, bool decoupled)
      : SlottedOptimizer(std::move(groups), {"exp_avg", "exp_avg_sq"}),
        opts_(opts),
        name_(std::move(name)),
        decoupled_(decoupled) {}

  std::string name() const override { return name_; }

  void Step() override {
    SyncState();
    ++step_;
    for (size_t g = 0; g < groups_.size(); ++g) {
      const ParamGroup& group = groups_[g];
      const bool l2 = !decoupled_ && group.weight_decay != 0.0f;
      kernels::AdamWParams params{group.lr,
                                  group.beta1 >= 0.0f ? group.beta1 : opts_.beta1,
                                  group.beta2 >= 0.0f ? group.beta2 : opts_.beta2,
                                  opts_.eps,
                                  decoupled_ ? group.weight_decay : 0.0f,
                                  step_};
      for (size_t i = 0; i < group.params.size(); ++i) {
        Tensor p = group.params[i];
        Tensor grad = GradOf(p, name_.c_str());
        if (!grad.defined()) continue;
        if (l2) {
          // grad + weight_decay × param into a scratch tensor: the parameter's own .grad stays
          // what backward produced (clipping and logging read it).
          Tensor decayed = Tensor::Empty(p.shape(), DType::kF32, p.device());
          kernels::unary.Get(p.device())(kernels::UnaryOp::kScale, p, group.weight_decay, decayed);
          kernels::binary.Get(p.device())(kernels::BinaryOp::kAdd, grad, decayed, decayed);
          grad = decayed;
        }
        kernels::adamw.Get(p.device())(p, grad, Slot(g, i, 0), Slot(g, i, 1), params);
      }
    }
  }

 private:
  AdamWOptions opts_;
  std::string name_;
  bool decoupled_;
};

class Sgd final : public SlottedOptimizer {
 public:
  Sgd(std::vector<ParamGroup> groups, SgdOptions opts)
      // Without momentum SGD keeps no state at all: no buffer is saved, so none may be expected
      // (or created) when a checkpoint is loaded.
      : SlottedOptimizer(std::move(groups), opts.momentum != 0.0f
                                                ? std::vector<std::string>{"momentum_buffer"}
                                                : std::vector<std::string>{}),
        opts_(opts) {}

  std::string name() const override { return "SGD"; }

  void Step() override {
    SyncState();
    ++step_;
    const bool momentum = opts_.momentum != 0.0f;
    for (size_t g = 0; g < groups_.size(); ++g) {
      const ParamGroup& group = groups_[g];
      for (size_t i = 0; i < group.params.size(); ++i) {
        Tensor p = group.params[i];
        Tensor grad = GradOf(p, "SGD");
        if (!grad.defined()) continue;
        kernels::SgdParams params{group.lr,
                                  opts_.momentum,
                                  opts_.dampening,
                                  group.weight_decay,
                                  opts_.nesterov,
                                  /*first_step=*/momentum && !HasState(g, i)};
        Tensor none;
        kernels::sgd.Get(p.device())(p, grad, momentum ? Slot(g, i, 0) : none, params);
      }
    }
  }

 private:
  SgdOptions opts_;
};

class Constant final : public LrSchedule {
 public:
  explicit Constant(float lr) : lr_(lr) {}
  float At(int64_t) const override { return lr_; }

 private:
  float lr_;
};

class WarmupCosine final : public LrSchedule {
 public:
  WarmupCosine(float max_lr, float min_lr, int64_t warmup, int64_t total, float warmup_start)
      : max_(max_lr), min_(min_lr), start_(warmup_start), warmup_(warmup), total_(total) {}

  float At(int64_t step) const override {
    if (step < warmup_) {
      return float(start_ + (double(max_) - start_) * double(step) / double(warmup_));
    }
    if (step >= total_) return min_;
    double progress = double(step - warmup_) / double(total_ - warmup_);
    return float(min_ + 0.5 * (double(max_) - min_) * (1.0 + std::cos(M_PI * progress)));
  }

 private:
  float max_, min_, start_;
  int64_t warmup_, total_;
};

}  // namespace

std::unique_ptr<Optimizer> MakeAdamW(std::vector<ParamGroup> groups, AdamWOptions opts) {
  BRAID_CHECK(opts.beta1 >= 0 && opts.beta1 < 1 && opts.beta2 >= 0 && opts.beta2 < 1)
      << "AdamW betas must be in [0, 1): got " << opts.beta1 << ", " << opts.beta2;
  return std::make_unique<AdamW>(std::move(groups), opts, "AdamW", /*decoupled=*/true);
}

std::unique_ptr<Optimizer> MakeAdam(std::vector<ParamGroup> groups, AdamOptions opts) {
  BRAID_CHECK(opts.beta1 >= 0 && opts.beta1 < 1 && opts.beta2 >= 0 && opts.beta2 < 1)
      << "Adam betas must be in [0, 1): got " << opts.beta1 << ", " << opts.beta2;
  return std::make_unique<AdamW>(std::move(groups), AdamWOptions{opts.beta1, opts.beta2, opts.eps},
                                 "Adam", opts.adam_w_mode);
}

std::unique_ptr<Optimizer> MakeSgd(std::vector<ParamGroup> groups, SgdOptions opts) {
  BRAID_CHECK(!opts.nesterov || (opts.momentum > 0 && opts.dampening == 0))
      << "SGD with Nesterov momentum needs momentum > 0 and dampening 0 (got momentum "
      << opts.momentum << ", dampening " << opts.dampening << ")";
  return std::make_unique<Sgd>(std::move(groups), opts);
}

std::unique_ptr<LrSchedule> ConstantLr(float lr) { return std::make_unique<Constant>(lr); }

std::unique_ptr<LrSchedule> WarmupCosineLr(float max_lr, float min_lr, int64_t warmup,
                                           int64_t total, float warmup_start_lr) {
  BRAID_CHECK(warmup >= 0 && total >= warmup)
      << "WarmupCosineLr needs 0 <= warmup <= total, got warmup " << warmup << ", total " << total;
  return std::make_unique<WarmupCosine>(max_lr, min_lr, warmup, total, warmup_start_lr);
}

float ClipGradNorm(const std::vector<Tensor>& params, float max_norm) {
  return ClipGradNormSharded(params, max_norm, [](double local) { return local; });
}

Tensor SquaredGradNormOnDevice(const std::vector<Tensor>& params) {
  Tensor total;
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    // f32 squares of half gradients: they would overflow f16 (up-cast on the device).
    if (g.dtype() != DType::kF32) g = g.To(DType::kF32);
    Tensor sq = Tensor::Empty(g.shape(), DType::kF32, g.device());
    kernels::unary.Get(g.device())(kernels::UnaryOp::kSquare, g, 0.0f, sq);
    Tensor s = Tensor::Empty({}, DType::kF32, g.device());
    kernels::sum_all.Get(g.device())(sq, s);
    const bool first = !total.defined();
    if (first) total = Tensor::Empty({}, DType::kF32, g.device());
    kernels::axpby.Get(g.device())(p.grad_norm_share(), s, first ? 0.0f : 1.0f, total);
  }
  return total;
}

namespace {

// This rank's share of the squared norm of `params`' gradients, read with one synchronisation.
double LocalSquaredGradNorm(const std::vector<Tensor>& params) {
  return double(ReadScalars({SquaredGradNormOnDevice(params)})[0]);
}

}  // namespace

void Optimizer::MultiplyGradients(float factor) {
  for (ParamGroup& group : groups_) {
    for (Tensor& p : group.params) {
      Tensor g = p.grad();
      if (g.defined()) kernels::unary.Get(g.device(), g.dtype())(kernels::UnaryOp::kScale, g, factor, g);
    }
  }
}

float ClipGradNormSharded(const std::vector<Tensor>& params, float max_norm,
                          const std::function<double(double)>& global_sum) {
  double norm = std::sqrt(global_sum(LocalSquaredGradNorm(params)));
  if (max_norm > 0 && norm > max_norm) {
    float scale = float(max_norm / (norm + 1e-6));
    for (const Tensor& p : params) {
      Tensor g = p.grad();
      if (g.defined()) kernels::unary.Get(g.device(), g.dtype())(kernels::UnaryOp::kScale, g, scale, g);
    }
  }
  return float(norm);
}

float ClipGradNormSharded(Optimizer& optimizer, const std::vector<Tensor>& params, float max_norm,
                          const std::function<double(double)>& global_sum) {
  return ClipGradNormFromSquared(optimizer, LocalSquaredGradNorm(params), max_norm, global_sum);
}

float ClipGradNormFromSquared(Optimizer& optimizer, double local_squared, float max_norm,
                              const std::function<double(double)>& global_sum) {
  const double norm = std::sqrt(global_sum(local_squared)) / double(optimizer.gradient_scale());
  if (max_norm > 0 && std::isfinite(norm) && norm > max_norm) {
    optimizer.MultiplyGradients(float(max_norm / (norm + 1e-6)));
  }
  return float(norm);
}

}  // namespace braid

// ---------------------------------------------------------------------------------------------
// Registration of the built-in optimizers (core/registry.h): config validation and the training
// program find "AdamW", "Adam" and "SGD" by name in the registry, as they will find plugins' optimizers.
// (Kept apart, with its own includes, from the optimizers above.)

#include "core/config/sections.pb.h"
#include "core/optimizer_params.h"
#include "core/registry.h"

namespace braid {
namespace {

constexpr double kAdamWDefaultBeta1 = 0.9, kAdamWDefaultBeta2 = 0.95;  // GPT training's
constexpr double kAdamWDefaultWeightDecay = 0.1;
// DeepSpeed's "Adam" takes FusedAdam's (and PyTorch's) defaults, so that a DeepSpeed config that
// leaves them out trains as it did there.
constexpr double kAdamDefaultBeta1 = 0.9, kAdamDefaultBeta2 = 0.999;
constexpr double kAdamDefaultWeightDecay = 0.0;
constexpr double kDefaultEps = 1e-8;

// betas, eps and weight_decay of Adam and AdamW, with the given defaults; DeepSpeed's Adam
// switches (adam_w_mode, torch_adam, bias_correction).
void ValidateAdamFamily(config::OptimizerConfig* opt, double beta1, double beta2,
                        double weight_decay, ConfigProblems* problems) {
  CheckAdamLikeParams(opt, {beta1, beta2, kDefaultEps, weight_decay}, problems);
  const config::OptimizerParams* p = &opt->params();
  if (p->has_bias_correction() && !p->bias_correction()) {
    problems->push_back(
        "optimizer.params.bias_correction false: Braid's Adam and AdamW always correct the "
        "moments' bias; remove it or set it true");
  }
}

void ValidateAdamW(config::OptimizerConfig* opt, ConfigProblems* problems) {
  ValidateAdamFamily(opt, kAdamWDefaultBeta1, kAdamWDefaultBeta2, kAdamWDefaultWeightDecay,
                     problems);
  // DeepSpeed's "AdamW" forces decoupled decay whatever adam_w_mode says; a config saying
  // false asked for L2, which this type would not give.
  config::OptimizerParams* p = opt->mutable_params();
  if (p->has_adam_w_mode() && !p->adam_w_mode()) {
    problems->push_back(
        "optimizer.params.adam_w_mode false contradicts optimizer.type \"AdamW\" (decoupled "
        "weight decay); for L2 weight decay use optimizer.type \"Adam\" with adam_w_mode false");
  }
}

void ValidateAdam(config::OptimizerConfig* opt, ConfigProblems* problems) {
  ValidateAdamFamily(opt, kAdamDefaultBeta1, kAdamDefaultBeta2, kAdamDefaultWeightDecay, problems);
  config::OptimizerParams* p = opt->mutable_params();
  if (!p->has_adam_w_mode()) p->set_adam_w_mode(true);  // DeepSpeed's default
}

void ValidateSgd(config::OptimizerConfig* opt, ConfigProblems* problems) {
  config::OptimizerParams* p = opt->mutable_params();
  if (!p->has_weight_decay()) p->set_weight_decay(0.0);
  if (!p->has_momentum()) p->set_momentum(0.0);
  if (!p->has_dampening()) p->set_dampening(0.0);
  if (!p->has_nesterov()) p->set_nesterov(false);
  CheckUnitInterval("optimizer.params.momentum", p->momentum(), problems);
  CheckUnitInterval("optimizer.params.dampening", p->dampening(), problems);
  if (p->nesterov() && !(p->momentum() > 0)) {
    problems->push_back(absl::StrCat(
        "optimizer.params.nesterov needs optimizer.params.momentum > 0 (it is ", p->momentum(),
        ")"));
  }
  if (p->nesterov() && p->dampening() != 0) {
    problems->push_back(absl::StrCat("optimizer.params.nesterov needs optimizer.params.dampening 0 "
                                     "(it is ",
                                     p->dampening(), "), as in PyTorch"));
  }
}

AdamWOptions AdamWOptionsOf(const config::OptimizerParams& p) {
  AdamWOptions o;
  if (p.betas_size() == 2) {
    o.beta1 = float(p.betas(0));
    o.beta2 = float(p.betas(1));
  }
  if (p.has_eps()) o.eps = float(p.eps());
  return o;
}

const bool kBuiltInOptimizersRegistered = [] {
  // DeepSpeed's switches are taken by both Adam types, so that a DeepSpeed section moves between
  // them unchanged.
  const std::vector<std::string> adam_params = {"betas", "eps", "adam_w_mode", "torch_adam",
                                                "bias_correction"};
  OptimizerSpec adamw;
  adamw.params = adam_params;
  adamw.validate = ValidateAdamW;
  adamw.is_default = true;  // the reference run's
  adamw.make = [](std::vector<ParamGroup> groups, const config::OptimizerConfig& opt) {
    return MakeAdamW(std::move(groups), AdamWOptionsOf(opt.params()));
  };
  OptimizerSpec adam;
  adam.params = adam_params;
  adam.validate = ValidateAdam;
  adam.make = [](std::vector<ParamGroup> groups, const config::OptimizerConfig& opt) {
    AdamWOptions w = AdamWOptionsOf(opt.params());
    AdamOptions o{w.beta1, w.beta2, w.eps, /*adam_w_mode=*/true};
    if (opt.params().has_adam_w_mode()) o.adam_w_mode = opt.params().adam_w_mode();
    return MakeAdam(std::move(groups), o);
  };
  OptimizerSpec sgd;
  sgd.params = {"momentum", "nesterov", "dampening"};
  sgd.validate = ValidateSgd;
  sgd.make = [](std::vector<ParamGroup> groups, const config::OptimizerConfig& opt) {
    SgdOptions o;
    o.momentum = float(opt.params().momentum());
    o.dampening = float(opt.params().dampening());
    o.nesterov = opt.params().nesterov();
    return MakeSgd(std::move(groups), o);
  };
  BRAID_CHECK_OK(Registry::Get().AddOptimizer("AdamW", std::move(adamw)));
  BRAID_CHECK_OK(Registry::Get().AddOptimizer("Adam", std::move(adam)));
  BRAID_CHECK_OK(Registry::Get().AddOptimizer("SGD", std::move(sgd)));
  return true;
}();

}  // namespace
}  // namespace braid
