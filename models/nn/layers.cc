#include "models/nn/layers.h"

#include "core/ops.h"

namespace braid::nn {

Tensor Normal(const Shape& shape, float stddev, std::mt19937_64& rng, Device device) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(size_t(NumElements(shape)));
  for (float& x : v) x = dist(rng);
  return Tensor::FromVector(v, shape, device);
}

Linear::Linear(int64_t in, int64_t out, bool bias, float init_std, std::mt19937_64& rng,
               Device device)
    : Module("Linear") {
  weight_ = RegisterParameter("weight", Normal({out, in}, init_std, rng, device));
  if (bias) bias_ = RegisterParameter("bias", Tensor::Zeros({out}, DType::kF32, device));
}

Tensor Linear::Forward(const Tensor& x) { return ops::Linear(x, weight_, bias_); }

LayerNorm::LayerNorm(int64_t dim, float eps, Device device) : Module("LayerNorm"), eps_(eps) {
  weight_ = RegisterParameter("weight", Tensor::Full({dim}, 1.0f, DType::kF32, device));
  bias_ = RegisterParameter("bias", Tensor::Zeros({dim}, DType::kF32, device));
}

Tensor LayerNorm::Forward(const Tensor& x) { return ops::LayerNorm(x, weight_, bias_, eps_); }

}  // namespace braid::nn
