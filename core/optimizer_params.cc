#include "core/optimizer_params.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/config/sections.pb.h"

namespace braid {

void CheckUnitInterval(const std::string& field, double v, ConfigProblems* problems) {
  if (!(v >= 0 && v < 1)) problems->push_back(absl::StrCat(field, " (", v, ") must be in [0, 1)"));
}

void CheckAdamLikeParams(config::OptimizerConfig* opt, const AdamLikeDefaults& defaults,
                         ConfigProblems* problems) {
  config::OptimizerParams* p = opt->mutable_params();
  if (!p->has_weight_decay()) p->set_weight_decay(defaults.weight_decay);
  if (p->betas_size() == 0) {
    p->add_betas(defaults.beta1);
    p->add_betas(defaults.beta2);
  } else if (p->betas_size() != 2) {
    problems->push_back(absl::StrCat("optimizer.params.betas has ", p->betas_size(),
                                     " value(s) [", absl::StrJoin(p->betas(), ", "),
                                     "]; it needs exactly 2 (beta1, beta2)"));
  } else {
    CheckUnitInterval("optimizer.params.betas[0]", p->betas(0), problems);
    CheckUnitInterval("optimizer.params.betas[1]", p->betas(1), problems);
  }
  if (!p->has_eps()) p->set_eps(defaults.eps);
  if (!(std::isfinite(p->eps()) && p->eps() > 0)) {
    problems->push_back(
        absl::StrCat("optimizer.params.eps (", p->eps(), ") must be a finite number > 0"));
  }
}

}  // namespace braid
