// Checks of an optimizer section's `params` that several optimizers share, so that a plugin's
// optimizer (Adam8bit, Lamb, a user's) fills defaults and words its problems exactly as core's
// Adam and AdamW do instead of writing them again.
#ifndef BRAID_CORE_OPTIMIZER_PARAMS_H_
#define BRAID_CORE_OPTIMIZER_PARAMS_H_

#include <string>

#include "core/registry.h"  // ConfigProblems

namespace braid {

namespace config {
class OptimizerConfig;
}  // namespace config

// Adds a problem naming `field` unless 0 <= v < 1 (betas, momentum, dampening).
void CheckUnitInterval(const std::string& field, double v, ConfigProblems* problems);

// What an Adam-like optimizer takes when its section leaves a value out.
struct AdamLikeDefaults {
  double beta1;
  double beta2;
  double eps;
  double weight_decay;
};

// optimizer.params.betas, eps and weight_decay of an Adam-like optimizer: what the section
// leaves out is filled from `defaults`, and every bad value is a problem (exactly two betas, each
// in [0, 1); eps finite and > 0). All problems are reported, not the first.
void CheckAdamLikeParams(config::OptimizerConfig* opt, const AdamLikeDefaults& defaults,
                         ConfigProblems* problems);

}  // namespace braid

#endif  // BRAID_CORE_OPTIMIZER_PARAMS_H_
