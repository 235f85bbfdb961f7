// The MNIST classifier: 784 -> 128 (ReLU) -> 10. Names fc1.*, fc2.* as in a PyTorch nn.Module
// with attributes fc1 and fc2.
#ifndef BRAID_MODELS_MLP_MLP_H_
#define BRAID_MODELS_MLP_MLP_H_

#include <cstdint>

#include "core/module.h"
#include "models/nn/layers.h"

namespace braid::models {

struct MlpConfig {
  int64_t in = 784, hidden = 128, out = 10;
  uint64_t seed = 1234;
};

class Mlp : public Module {
 public:
  explicit Mlp(const MlpConfig& cfg = {}, Device device = Device::CPU());
  // x: [B, in] f32 -> logits [B, out].
  Tensor Forward(const Tensor& x) override;

 private:
  nn::Linear *fc1_, *fc2_;
};

// The tensor-parallel plan (plugins/tensor_parallel/plan.h), registered with the model: the
// hidden layer split, one all-reduce before the logits.
extern const char kMlpTensorPlan[];

}  // namespace braid::models

#endif  // BRAID_MODELS_MLP_MLP_H_
