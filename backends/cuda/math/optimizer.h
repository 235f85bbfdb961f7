// Per-element AdamW and SGD updates with PyTorch's semantics, the formulas (and operation
// order) of backends/cpu/optimizer_kernels.cc's portable path.
#ifndef BRAID_BACKENDS_CUDA_MATH_OPTIMIZER_H_
#define BRAID_BACKENDS_CUDA_MATH_OPTIMIZER_H_

#include "backends/cuda/math/hd.h"

namespace braid::cuda::math {

// AdamW with bias correction folded into two scalars (computed once per step on the host):
//   w <- w (1 - lr wd) - step_size * m / (sqrt(v) * inv_sqrt_bc2 + eps),
//   step_size = lr / (1 - beta1^t), inv_sqrt_bc2 = 1 / sqrt(1 - beta2^t).
struct AdamWConsts {
  float b1, one_minus_b1, b2, one_minus_b2, decay, step_size, inv_sqrt_bc2, eps;
};

// Host only: the per-step constants, in double as the CPU backend computes them. `step` is
// 1-based (the caller checks).
inline AdamWConsts MakeAdamWConsts(float lr, float beta1, float beta2, float eps,
                                   float weight_decay, int64_t step) {
  const double bc1 = 1.0 - std::pow(double(beta1), double(step));
  const double bc2 = 1.0 - std::pow(double(beta2), double(step));
  AdamWConsts k;
  k.b1 = beta1;
  k.one_minus_b1 = float(1.0 - double(beta1));
  k.b2 = beta2;
  k.one_minus_b2 = float(1.0 - double(beta2));
  k.decay = float(1.0 - double(lr) * double(weight_decay));
  k.step_size = float(double(lr) / bc1);
  k.inv_sqrt_bc2 = float(1.0 / std::sqrt(bc2));
  k.eps = eps;
  return k;
}

BRAID_HD void AdamWStep(const AdamWConsts& k, float g, float& m, float& v, float& w) {
  const float mi = k.b1 * m + k.one_minus_b1 * g;
  const float vi = k.b2 * v + k.one_minus_b2 * g * g;
  m = mi;
  v = vi;
  w = w * k.decay - k.step_size * mi / (sqrtf(vi) * k.inv_sqrt_bc2 + k.eps);
}

struct SgdConsts {
  float lr, momentum, one_minus_dampening, weight_decay;
  bool use_momentum, nesterov, first_step;
};

// torch.optim.SGD: d = g + wd w; with momentum, buf = d on the first step, else
// buf = momentum buf + (1 - dampening) d; d = nesterov ? d + momentum buf : buf; w -= lr d.
// `buf` is untouched without momentum.
BRAID_HD void SgdStep(const SgdConsts& k, float g, float& buf, float& w) {
  float d = g + k.weight_decay * w;
  if (k.use_momentum) {
    const float b = k.first_step ? d : k.momentum * buf + k.one_minus_dampening * d;
    buf = b;
    d = k.nesterov ? d + k.momentum * b : b;
  }
  w = w - k.lr * d;
}

}  // namespace braid::cuda::math

#endif  // BRAID_BACKENDS_CUDA_MATH_OPTIMIZER_H_
