// The plugin's entry point: registers optimizer "Lamb" (core/registry.h's optimizer table), so
// that a DeepSpeed config's optimizer { "type": "Lamb" } loads this plugin by name (EnsureOptimizer
// in core/plugin.h) and trains with DeepSpeed's FusedLamb rule (lamb.h).
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/config/sections.pb.h"
#include "core/optimizer_params.h"
#include "core/plugin_api.h"
#include "core/registry.h"
#include "plugins/lamb/lamb.h"

namespace braid::lamb {
namespace {

// DeepSpeed's FusedLamb defaults (deepspeed/ops/lamb/fused_lamb.py), so that a config naming
// only the type trains as it did there. In double, as the config holds them (LambOptions' float
// defaults would print as 0.899999976).
struct Defaults {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, max_coeff = 10.0, min_coeff = 0.01;
  bool bias_correction = true, eps_inside_sqrt = false;
};
constexpr Defaults kDefaults;
constexpr double kDefaultWeightDecay = 0.0;

// Fills DeepSpeed's defaults and checks each value; every problem is reported, not the first.
void Validate(config::OptimizerConfig* opt, ConfigProblems* problems) {
  CheckAdamLikeParams(opt, {kDefaults.beta1, kDefaults.beta2, kDefaults.eps, kDefaultWeightDecay},
                      problems);
  config::OptimizerParams* p = opt->mutable_params();
  if (!p->has_bias_correction()) p->set_bias_correction(kDefaults.bias_correction);
  if (!p->has_eps_inside_sqrt()) p->set_eps_inside_sqrt(kDefaults.eps_inside_sqrt);
  if (!p->has_max_coeff()) p->set_max_coeff(kDefaults.max_coeff);
  if (!p->has_min_coeff()) p->set_min_coeff(kDefaults.min_coeff);
  const bool max_ok = std::isfinite(p->max_coeff()) && p->max_coeff() > 0;
  const bool min_ok = std::isfinite(p->min_coeff()) && p->min_coeff() >= 0;
  if (!max_ok) {
    problems->push_back(absl::StrCat("optimizer.params.max_coeff (", p->max_coeff(),
                                     ") must be a finite number > 0 (the trust ratio's ceiling)"));
  }
  if (!min_ok) {
    problems->push_back(absl::StrCat("optimizer.params.min_coeff (", p->min_coeff(),
                                     ") must be a finite number >= 0 (the trust ratio's floor)"));
  }
  if (max_ok && min_ok && p->min_coeff() > p->max_coeff()) {
    problems->push_back(absl::StrCat("optimizer.params.min_coeff (", p->min_coeff(),
                                     ") > optimizer.params.max_coeff (", p->max_coeff(),
                                     "): the trust ratio is clamped to [min_coeff, max_coeff]"));
  }
  if (p->has_max_grad_norm() && p->max_grad_norm() != 0) {
    problems->push_back(absl::StrCat("optimizer.params.max_grad_norm (", p->max_grad_norm(),
                                     "): Lamb does not clip inside the optimizer; set "
                                     "gradient_clipping instead (the strategy clips the global "
                                     "norm) and remove it or set 0"));
  }
  if (p->has_amsgrad() && p->amsgrad()) {
    problems->push_back("optimizer.params.amsgrad true: Lamb has no AMSGrad variant (nor has "
                        "DeepSpeed's FusedLamb); remove it or set false");
  }
}

std::unique_ptr<Optimizer> Make(std::vector<ParamGroup> groups, const config::OptimizerConfig& opt) {
  const config::OptimizerParams& p = opt.params();
  LambOptions o;
  if (p.betas_size() == 2) {
    o.beta1 = float(p.betas(0));
    o.beta2 = float(p.betas(1));
  }
  if (p.has_eps()) o.eps = float(p.eps());
  if (p.has_bias_correction()) o.bias_correction = p.bias_correction();
  if (p.has_eps_inside_sqrt()) o.eps_inside_sqrt = p.eps_inside_sqrt();
  if (p.has_max_coeff()) o.max_coeff = float(p.max_coeff());
  if (p.has_min_coeff()) o.min_coeff = float(p.min_coeff());
  return MakeLamb(std::move(groups), o);
}

}  // namespace
}  // namespace braid::lamb

BRAID_PLUGIN(registry) {
  braid::OptimizerSpec spec;
  // Besides lr and weight_decay: DeepSpeed's FusedLamb parameters.
  spec.params = {"betas",     "eps",       "bias_correction", "eps_inside_sqrt",
                 "max_coeff", "min_coeff", "max_grad_norm",   "amsgrad"};
  spec.validate = braid::lamb::Validate;
  spec.make = braid::lamb::Make;
  absl::Status s = registry->AddOptimizer("Lamb", std::move(spec));
  return s.ok() ? 0 : 1;
}
