// The parameters as one flat vector (FlatLayout), the form in which the "paramserver" strategy
// sends gradients and parameters, and the hash of their names and shapes that ranks compare
// before they exchange any. Internal to the plugin.
#ifndef BRAID_PLUGINS_PARAMSERVER_FLAT_LAYOUT_H_
#define BRAID_PLUGINS_PARAMSERVER_FLAT_LAYOUT_H_

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/module.h"
#include "core/tensor.h"

namespace braid::paramserver {

// The parameters in NamedParameters order, laid end to end: the form in which gradients and
// parameters travel (one message each instead of one per tensor).
class FlatLayout {
 public:
  FlatLayout() = default;
  explicit FlatLayout(std::vector<Tensor> params) : params_(std::move(params)) {
    for (const Tensor& p : params_) {
      offsets_.push_back(numel_);
      numel_ += p.numel();
    }
  }
  int64_t numel() const { return numel_; }

  void CopyParamsTo(const Tensor& flat) const {
    for (size_t i = 0; i < params_.size(); ++i) Slot(flat, i).CopyFrom(params_[i]);
  }
  void CopyParamsFrom(const Tensor& flat) const {
    for (size_t i = 0; i < params_.size(); ++i) {
      Tensor p = params_[i];
      p.CopyFrom(Slot(flat, i));
    }
  }
  // A parameter that got no gradient travels as zeros.
  void CopyGradsTo(const Tensor& flat) const {
    for (size_t i = 0; i < params_.size(); ++i) {
      Tensor slot = Slot(flat, i);
      Tensor g = params_[i].grad();
      if (g.defined()) {
        slot.CopyFrom(g);
      } else {
        slot.Zero();
      }
    }
  }
  // Makes every parameter's .grad a view of its slot in `flat` (no copy): the optimizer then
  // steps straight from a received buffer.
  void UseAsGrads(const Tensor& flat) const {
    for (size_t i = 0; i < params_.size(); ++i) {
      Tensor p = params_[i];
      p.set_grad(Slot(flat, i));
    }
  }

 private:
  Tensor Slot(const Tensor& flat, size_t i) const {
    return flat.FlatRange(offsets_[i], params_[i].numel()).Reshape(params_[i].shape());
  }

  std::vector<Tensor> params_;
  std::vector<int64_t> offsets_;
  int64_t numel_ = 0;
};

// FNV-1a of the parameters' names and shapes: ranks must agree on the layout of every message.
int64_t LayoutHash(const Module::NamedTensors& named);

}  // namespace braid::paramserver

#endif  // BRAID_PLUGINS_PARAMSERVER_FLAT_LAYOUT_H_
