#include "models/mlp/mlp.h"

#include <cmath>
#include <random>

#include "core/ops.h"

namespace braid::models {

Mlp::Mlp(const MlpConfig& cfg, Device device) : Module("MLP") {
  std::mt19937_64 rng(cfg.seed);
  // He-style scale for the ReLU layer, Xavier-style for the logits.
  fc1_ = RegisterModule("fc1", std::make_unique<nn::Linear>(cfg.in, cfg.hidden, true,
                                                            std::sqrt(2.0f / float(cfg.in)), rng, device));
  fc2_ = RegisterModule("fc2", std::make_unique<nn::Linear>(cfg.hidden, cfg.out, true,
                                                            std::sqrt(1.0f / float(cfg.hidden)), rng, device));
}

Tensor Mlp::Forward(const Tensor& x) { return (*fc2_)(ops::Relu((*fc1_)(x))); }

const char kMlpTensorPlan[] = R"(# MLP (models/mlp)
fc1  colwise
fc2  rowwise
)";

}  // namespace braid::models
