#include "models/nn/layers.h"

#include "core/deferred_init.h"
#include "core/ops.h"

namespace braid::nn {

Tensor Normal(const Shape& shape, float stddev, std::mt19937_64& rng, Device device) {
  const int64_t n = NumElements(shape);
  if (InDeferredInit()) {
    // Replays the model's one random stream from where this tensor starts: any range of it gets
    // the values a full initialisation gives. The stream still moves past the whole tensor, so
    // the tensors after it start where they would.
    std::mt19937_64 start = rng;
    std::normal_distribution<float> skip(0.0f, stddev);
    for (int64_t i = 0; i < n; ++i) (void)skip(rng);
    return MakeParameter(
        shape,
        [start, stddev](float* out, int64_t begin, int64_t end) {
          std::mt19937_64 r = start;
          std::normal_distribution<float> dist(0.0f, stddev);
          for (int64_t i = 0; i < end; ++i) {
            float x = dist(r);
            if (i >= begin) out[i - begin] = x;
          }
        },
        device);
  }
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return Tensor::FromVector(v, shape, device);
}

Linear::Linear(int64_t in, int64_t out, bool bias, float init_std, std::mt19937_64& rng,
               Device device, Activation activation)
    : Module("Linear"), activation_(activation) {
  weight_ = RegisterParameter("weight", Normal({out, in}, init_std, rng, device));
  if (bias) {
    bias_ = RegisterParameter("bias", MakeConstantParameter({out}, 0.0f, device));
    bias_.set_weight_decay(false);  // as GPT training does: no decay on biases
  }
}

Tensor Linear::Forward(const Tensor& x) {
  if (activation_ == Activation::kGeluTanh) return ops::LinearGeluTanh(x, weight_, bias_);
  return ops::Linear(x, weight_, bias_);
}

Embedding::Embedding(int64_t num, int64_t dim, float init_std, std::mt19937_64& rng,
                     Device device)
    : Module("Embedding") {
  weight_ = RegisterParameter("weight", Normal({num, dim}, init_std, rng, device));
}

Tensor Embedding::Forward(const Tensor& ids) { return ops::Embedding(weight_, ids); }

Tensor TiedLinear::Forward(const Tensor& x) { return ops::Linear(x, weight_, Tensor()); }

LayerNorm::LayerNorm(int64_t dim, float eps, Device device) : Module("LayerNorm"), eps_(eps) {
  // Norm parameters take no weight decay.
  weight_ = RegisterParameter("weight", MakeConstantParameter({dim}, 1.0f, device));
  weight_.set_weight_decay(false);
  bias_ = RegisterParameter("bias", MakeConstantParameter({dim}, 0.0f, device));
  bias_.set_weight_decay(false);
}

Tensor LayerNorm::Forward(const Tensor& x) { return ops::LayerNorm(x, weight_, bias_, eps_); }

RmsNorm::RmsNorm(int64_t dim, float eps, Device device) : Module("RMSNorm"), eps_(eps) {
  weight_ = RegisterParameter("weight", MakeConstantParameter({dim}, 1.0f, device));
  weight_.set_weight_decay(false);
}

Tensor RmsNorm::Forward(const Tensor& x) { return ops::RmsNorm(x, weight_, eps_); }

}  // namespace braid::nn
