#include "plugins/lamb/lamb.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/check.h"
#include "core/optimizer_state.h"

namespace braid::lamb {
namespace {

constexpr char kStepKey[] = "step";
constexpr const char* kSlots[2] = {"exp_avg", "exp_avg_sq"};  // PyTorch's and DeepSpeed's names

// `t` as a host f32 tensor: itself on a CPU device, a copy otherwise (the rule runs on the host;
// the state stays where the parameter is).
Tensor OnHost(const Tensor& t) {
  if (t.device().type == DeviceType::kCPU) return t;
  return t.To(Device::CPU());
}

class Lamb final : public Optimizer {
 public:
  Lamb(std::vector<ParamGroup> groups, LambOptions opts) : Optimizer(std::move(groups)), opts_(opts) {}

  std::string name() const override { return "Lamb"; }

  void Step() override {
    SyncState();
    ++step_;
    for (size_t g = 0; g < groups_.size(); ++g) {
      const ParamGroup& group = groups_[g];
      // A schedule's betas (OneCycle's momentum) when it set them.
      const double b1 = group.beta1 >= 0.0f ? group.beta1 : opts_.beta1;
      const double b2 = group.beta2 >= 0.0f ? group.beta2 : opts_.beta2;
      double step_size = group.lr;
      if (opts_.bias_correction) {
        step_size = group.lr * std::sqrt(1.0 - std::pow(b2, double(step_))) /
                    (1.0 - std::pow(b1, double(step_)));
      }
      for (size_t i = 0; i < group.params.size(); ++i) {
        Tensor p = group.params[i];
        Tensor grad = p.grad();
        if (!grad.defined()) continue;
        BRAID_CHECK(p.dtype() == DType::kF32 && grad.dtype() == DType::kF32)
            << "Lamb steps f32 parameters with f32 gradients (mixed precision hands it f32 "
               "masters); got parameter " << p.DescribeForError() << " with gradient "
            << grad.DescribeForError();
        BRAID_CHECK(grad.shape() == p.shape() && grad.device() == p.device())
            << "Lamb: gradient " << grad.DescribeForError() << " does not match parameter "
            << p.DescribeForError();
        StepOne(p, grad, Slot(g, i, 0), Slot(g, i, 1), float(b1), float(b2), step_size,
                group.weight_decay);
      }
    }
  }

  std::map<std::string, Tensor> StateDict() const override {
    std::map<std::string, Tensor> out;
    out[kStepKey] = Tensor::FromVector(std::vector<int64_t>{step_}, {});
    const auto keys = Keys();
    for (size_t g = 0; g < state_.size(); ++g) {
      for (size_t i = 0; i < state_[g].size(); ++i) {
        for (int s = 0; s < 2; ++s) {
          if (state_[g][i][s].defined()) out[absl::StrCat(keys[g][i], ".", kSlots[s])] = state_[g][i][s];
        }
      }
    }
    return out;
  }

  absl::Status LoadStateDict(const std::map<std::string, Tensor>& state) override {
    SyncState();
    const auto keys = Keys();
    std::vector<std::string> problems;
    std::map<std::string, bool> known;
    auto step_it = state.find(kStepKey);
    if (step_it == state.end() || !step_it->second.defined() || step_it->second.numel() != 1) {
      problems.push_back("'step' missing or not one number");
    }
    for (size_t g = 0; g < groups_.size(); ++g) {
      for (size_t i = 0; i < groups_[g].params.size(); ++i) {
        int present = 0;
        for (int s = 0; s < 2; ++s) {
          const std::string key = absl::StrCat(keys[g][i], ".", kSlots[s]);
          known[key] = true;
          auto it = state.find(key);
          if (it == state.end()) continue;
          ++present;
          if (!it->second.defined() || it->second.shape() != groups_[g].params[i].shape()) {
            problems.push_back(absl::StrCat("'", key, "' does not have the parameter's shape ",
                                            ShapeToString(groups_[g].params[i].shape())));
          }
        }
        if (present == 1) problems.push_back(absl::StrCat("'", keys[g][i], "' has one moment of two"));
      }
    }
    for (const auto& [key, t] : state) {
      if (key != kStepKey && !known.count(key)) problems.push_back(absl::StrCat("unexpected '", key, "'"));
    }
    if (!problems.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot load Lamb state: ", absl::StrJoin(problems, "; "),
          " (keys are '<parameter name or group.index>.<exp_avg|exp_avg_sq>' and 'step')"));
    }
    const Tensor& step = step_it->second;
    step_ = step.dtype() == DType::kI64 ? step.To(Device::CPU()).ToVector<int64_t>()[0]
                                        : int64_t(step.item());
    for (size_t g = 0; g < groups_.size(); ++g) {
      for (size_t i = 0; i < groups_[g].params.size(); ++i) {
        for (int s = 0; s < 2; ++s) {
          auto it = state.find(absl::StrCat(keys[g][i], ".", kSlots[s]));
          if (it == state.end()) {
            state_[g][i][s] = Tensor();
          } else {
            Slot(g, i, size_t(s)).CopyFrom(it->second);
          }
        }
      }
    }
    return absl::OkStatus();
  }

  std::vector<std::map<std::string, Tensor>> ParameterStates(bool create) override {
    SyncState();
    return PerParameterStates(groups_, [&](size_t g, size_t i) {
      std::map<std::string, Tensor> slots;
      if (create || state_[g][i][0].defined()) {
        for (int s = 0; s < 2; ++s) slots[kSlots[s]] = Slot(g, i, size_t(s));
      }
      return slots;
    });
  }
  int64_t steps_taken() const override { return step_; }
  void set_steps_taken(int64_t steps) override { step_ = steps; }

 private:
  void SyncState() {
    state_.resize(groups_.size());
    for (size_t g = 0; g < groups_.size(); ++g) state_[g].resize(groups_[g].params.size());
  }
  Tensor& Slot(size_t g, size_t i, size_t s) {
    return SlotOnFirstUse(state_[g][i][s], groups_[g].params[i]);
  }

  // DeepSpeed's fused kernel, in two passes over the tensor: the moments, the update and both
  // norms (summed in double), then the step scaled by the clamped trust ratio.
  void StepOne(Tensor& p, const Tensor& grad, Tensor& m_state, Tensor& v_state, float b1, float b2,
               double step_size, float weight_decay) const {
    Tensor w = OnHost(p), g = OnHost(grad), m = OnHost(m_state), v = OnHost(v_state);
    float* wd = w.data<float>();
    const float* gd = g.data<float>();
    float* md = m.data<float>();
    float* vd = v.data<float>();
    const int64_t n = p.numel();
    std::vector<float> u(size_t(n), 0.0f);
    double w2 = 0, u2 = 0;
    for (int64_t j = 0; j < n; ++j) {
      md[j] = b1 * md[j] + (1 - b1) * gd[j];
      vd[j] = b2 * vd[j] + (1 - b2) * gd[j] * gd[j];
      const float denom = opts_.eps_inside_sqrt ? std::sqrt(vd[j] + opts_.eps) : std::sqrt(vd[j]) + opts_.eps;
      u[size_t(j)] = md[j] / denom + weight_decay * wd[j];
      w2 += double(wd[j]) * wd[j];
      u2 += double(u[size_t(j)]) * u[size_t(j)];
    }
    double ratio = 1.0;
    const double wn = std::sqrt(w2), un = std::sqrt(u2);
    if (wn != 0 && un != 0) {
      ratio = std::min(double(opts_.max_coeff), std::max(double(opts_.min_coeff), wn / un));
    }
    const float scale = float(step_size * ratio);
    for (int64_t j = 0; j < n; ++j) wd[j] -= scale * u[size_t(j)];
    // Back where they live when the rule ran on copies.
    if (w.raw_data() != p.raw_data()) p.CopyFrom(w);
    if (m.raw_data() != m_state.raw_data()) m_state.CopyFrom(m);
    if (v.raw_data() != v_state.raw_data()) v_state.CopyFrom(v);
  }

  LambOptions opts_;
  int64_t step_ = 0;
  std::vector<std::vector<std::array<Tensor, 2>>> state_;  // [group][param][exp_avg, exp_avg_sq]
};

}  // namespace

std::unique_ptr<Optimizer> MakeLamb(std::vector<ParamGroup> groups, LambOptions opts) {
  return std::make_unique<Lamb>(std::move(groups), opts);
}

}  // namespace braid::lamb
