// The plugin's entry point: registers optimizer "Adam8bit" (core/registry.h's optimizer table).
// optimizer.type "Adam8bit" (any case) makes the training program load this plugin by name
// (EnsureOptimizer in core/plugin.h) before it validates the config.
#include <utility>

#include "core/config/sections.pb.h"
#include "core/optimizer_params.h"
#include "core/plugin_api.h"
#include "core/registry.h"
#include "plugins/adam8bit/adam8bit.h"

namespace braid::adam8bit {
namespace {

// The defaults of core's AdamW (core/optimizer.cc), so that switching optimizer.type between
// "AdamW" and "Adam8bit" changes nothing but how the moments are stored.
constexpr double kDefaultBeta1 = 0.9, kDefaultBeta2 = 0.95;
constexpr double kDefaultEps = 1e-8;
constexpr double kDefaultWeightDecay = 0.1;

// AdamW's checks and defaults, field for field (core/optimizer_params.h). Block size (2048) and
// the 8-bit threshold (4096 elements) are constants of blockwise.h: OptimizerParams has no
// fields for them.
void Validate(config::OptimizerConfig* opt, ConfigProblems* problems) {
  CheckAdamLikeParams(opt, {kDefaultBeta1, kDefaultBeta2, kDefaultEps, kDefaultWeightDecay},
                      problems);
}

std::unique_ptr<Optimizer> Make(std::vector<ParamGroup> groups,
                                const config::OptimizerConfig& opt) {
  const config::OptimizerParams& p = opt.params();
  Adam8bitOptions o;
  if (p.betas_size() == 2) {
    o.beta1 = float(p.betas(0));
    o.beta2 = float(p.betas(1));
  }
  if (p.has_eps()) o.eps = float(p.eps());
  return MakeAdam8bit(std::move(groups), o);
}

}  // namespace
}  // namespace braid::adam8bit

BRAID_PLUGIN(registry) {
  braid::OptimizerSpec spec;
  spec.params = {"betas", "eps"};  // besides lr and weight_decay, as AdamW
  spec.validate = braid::adam8bit::Validate;
  spec.make = braid::adam8bit::Make;
  absl::Status s = registry->AddOptimizer("Adam8bit", std::move(spec));
  return s.ok() ? 0 : 1;
}
