// Standard layers as Modules, with PyTorch's parameter names and layouts ("weight" [out, in],
// "bias"), so state dicts move between Braid and PyTorch unchanged.
#ifndef BRAID_MODELS_NN_LAYERS_H_
#define BRAID_MODELS_NN_LAYERS_H_

#include <cstdint>
#include <random>

#include "core/module.h"
#include "core/tensor.h"

namespace braid::nn {

// Deterministic initialisers (the generator is the caller's, so a model's init is one stream).
Tensor Normal(const Shape& shape, float stddev, std::mt19937_64& rng, Device device);

// What a Linear applies to its output. kGeluTanh makes the layer GPT-2's MLP up-projection
// with its activation, one op (ops::LinearGeluTanh) that a device can fuse into the GEMM; the
// layer's parameters, names and the result are those of a plain Linear followed by GeluTanh.
// A strategy that rewrites the layer's forward by calling Forward on its shard (tensor
// parallelism's column split) keeps the activation, which is elementwise on each column.
enum class Activation { kNone, kGeluTanh };

class Linear : public Module {
 public:
  Linear(int64_t in, int64_t out, bool bias, float init_std, std::mt19937_64& rng, Device device,
         Activation activation = Activation::kNone);
  Tensor Forward(const Tensor& x) override;
  Tensor weight() const { return weight_; }
  Tensor bias() const { return bias_; }
  Activation activation() const { return activation_; }

 private:
  Tensor weight_, bias_;
  Activation activation_;
};

// A lookup table: "weight" [num, dim]; ids (i32, any shape) -> [..., dim].
class Embedding : public Module {
 public:
  Embedding(int64_t num, int64_t dim, float init_std, std::mt19937_64& rng, Device device);
  Tensor Forward(const Tensor& ids) override;
  Tensor weight() const { return weight_; }

 private:
  Tensor weight_;
};

// A Linear without a bias whose weight belongs to another module (GPT's LM head uses the token
// embedding's weight). It registers no parameter, so the weight is named, stored and updated
// once, under its owner's name; a strategy that splits the owner's weight (vocabulary-parallel)
// splits this layer's with it, because both hold the same tensor.
class TiedLinear : public Module {
 public:
  explicit TiedLinear(Tensor weight) : Module("TiedLinear"), weight_(std::move(weight)) {}
  Tensor Forward(const Tensor& x) override;

 private:
  Tensor weight_;
};

class LayerNorm : public Module {
 public:
  LayerNorm(int64_t dim, float eps, Device device);
  Tensor Forward(const Tensor& x) override;

 private:
  Tensor weight_, bias_;
  float eps_;
};

// Root-mean-square norm (Llama's): "weight" [dim], no bias, no weight decay.
class RmsNorm : public Module {
 public:
  RmsNorm(int64_t dim, float eps, Device device);
  Tensor Forward(const Tensor& x) override;

 private:
  Tensor weight_;
  float eps_;
};

}  // namespace braid::nn

#endif  // BRAID_MODELS_NN_LAYERS_H_
