// StageView: the part of a model one pipeline stage holds, as a Module of its own, so that the
// strategy serving the data axis under the pipeline (ddp, zero 1-3, a user's) trains the stage
// as it would train a whole model: it sees only the stage's parameters (named as the model
// names them), hooks the stage's blocks, and runs the stage's layers through the view's
// operator(), so its forward and backward hooks fire around each chunk.
#ifndef BRAID_PLUGINS_PIPELINE_STAGE_VIEW_H_
#define BRAID_PLUGINS_PIPELINE_STAGE_VIEW_H_

#include <functional>
#include <set>
#include <string>

#include "core/module.h"
#include "core/tensor.h"

namespace braid::pipeline {

class StageView final : public Module {
 public:
  // The outermost modules of `model` all of whose parameters are in `names` are borrowed whole
  // (blocks stay blocks: ZeRO's units); a parameter of `names` outside them is shared alone.
  StageView(Module& model, const std::set<std::string>& names);

  // What Forward runs: the chunk the executor is about to compute.
  void set_forward(std::function<Tensor(const Tensor&)> fn) { forward_ = std::move(fn); }
  Tensor Forward(const Tensor& x) override { return forward_(x); }

 private:
  std::function<Tensor(const Tensor&)> forward_;
};

}  // namespace braid::pipeline

#endif  // BRAID_PLUGINS_PIPELINE_STAGE_VIEW_H_
