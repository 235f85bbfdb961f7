// The Lamb optimizer (You et al., "Large Batch Optimization for Deep Learning"), with DeepSpeed's
// FusedLamb rule and parameter names. Internal to the plugin: the host reaches it through the
// registry ("Lamb").
//
// Per tensor it steps, at step t (from 1), with gradient g and parameter w:
//   m = beta1 m + (1 - beta1) g;   v = beta2 v + (1 - beta2) g^2
//   u = m / (sqrt(v) + eps) + weight_decay w        (eps_inside_sqrt: m / sqrt(v + eps))
//   ratio = clamp(||w|| / ||u||, min_coeff, max_coeff), or 1 when either norm is 0
//   w -= lr sqrt(1 - beta2^t) / (1 - beta1^t) ratio u   (without bias_correction: lr ratio u)
// As in DeepSpeed's kernel, the bias correction is folded into the step size, so the trust ratio
// is that of the uncorrected update, and ||w|| is taken before the step.
#ifndef BRAID_PLUGINS_LAMB_LAMB_H_
#define BRAID_PLUGINS_LAMB_LAMB_H_

#include <memory>
#include <vector>

#include "core/optimizer.h"

namespace braid::lamb {

// DeepSpeed's FusedLamb defaults; lr and weight_decay come per group.
struct LambOptions {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  bool bias_correction = true;
  bool eps_inside_sqrt = false;
  float max_coeff = 10.0f, min_coeff = 0.01f;
};

std::unique_ptr<Optimizer> MakeLamb(std::vector<ParamGroup> groups, LambOptions opts);

}  // namespace braid::lamb

#endif  // BRAID_PLUGINS_LAMB_LAMB_H_
