// Module: a node of the model tree with named parameters, buffers and children, and the
// forward/backward hook points strategies attach to. A model never knows which strategy trains
// it; strategies see it only through this interface.
#ifndef BRAID_CORE_MODULE_H_
#define BRAID_CORE_MODULE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "core/tensor.h"

namespace braid {

// One layer of a model that pipeline parallelism can cut into stages (Module::PipelineLayers).
struct PipelineLayer {
  std::string name;  // "embedding", "h.0", ..., "head"
  // The previous layer's output (the batch's inputs, for the first layer) to this layer's output
  // (the model's output, for the last). Composing every layer's forward in order is the model's
  // Forward.
  std::function<Tensor(const Tensor&)> forward;
  // The parameters it uses, as NamedParameters names them. A tied parameter is listed by every
  // layer that uses it (GPT's wte: the embedding and the head).
  std::vector<std::string> parameters;
};

class Module {
 public:
  using Hook = std::function<void(Module&)>;
  using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

  explicit Module(std::string type_name) : type_name_(std::move(type_name)) {}
  virtual ~Module();
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Runs hooks around Forward (or the replacement forward, when one is set). Call modules
  // through this, never Forward directly.
  Tensor operator()(const Tensor& x);
  virtual Tensor Forward(const Tensor& x) = 0;

  // Replaces what this module computes, keeping its place in the tree, its name, its parameters
  // and every hook: how a strategy rewrites a module (tensor parallelism turns a Linear into a
  // column-parallel one) without the parent, which holds a plain pointer to it, knowing. The
  // replacement may call Forward for the original computation. Null restores Forward.
  using ForwardFn = std::function<Tensor(const Tensor&)>;
  void ReplaceForward(ForwardFn fn) { replaced_forward_ = std::move(fn); }
  bool forward_replaced() const { return replaced_forward_ != nullptr; }
  // The replacement (null when none), so another rewrite can wrap it rather than drop it
  // (activation checkpointing keeps a tensor-parallel forward).
  const ForwardFn& replaced_forward() const { return replaced_forward_; }

  const std::string& type_name() const { return type_name_; }

  // Tree. Names are dotted paths from the module this is called on: "h.0.attn.c_attn.weight".
  NamedTensors NamedParameters() const;
  std::vector<Tensor> Parameters() const;
  NamedTensors NamedBuffers() const;
  std::vector<std::pair<std::string, Module*>> NamedChildren() const;
  // This module first (name ""), then every descendant depth-first in registration order.
  std::vector<std::pair<std::string, Module*>> NamedModules();
  int64_t NumParameters() const;

  // Parameters and buffers by name; the layout is the model's (PyTorch's for Braid's models).
  std::map<std::string, Tensor> StateDict() const;
  // Copies values in (converting dtype, crossing devices). With strict, missing or unexpected
  // names and shape mismatches are errors naming every offending key.
  absl::Status LoadStateDict(const std::map<std::string, Tensor>& state, bool strict = true);

  void Train(bool on = true);
  void Eval() { Train(false); }
  bool is_training() const { return training_; }
  void ZeroGrad();

  // A block is the unit strategies bucket, shard, recompute and pipeline (one transformer layer).
  bool is_block() const { return is_block_; }
  std::vector<std::pair<std::string, Module*>> NamedBlocks();

  // Hook points. Forward hooks run before/after Forward. Backward hooks: pre-backward when the
  // gradient of this module's output arrives; post-backward when every parameter of this module
  // (recursively) that got a gradient this pass has it accumulated in .grad, or at the end of the
  // backward pass when some never get one. Each returns an id for RemoveHook.
  uint64_t AddForwardPreHook(Hook h);
  uint64_t AddForwardHook(Hook h);
  uint64_t AddBackwardPreHook(Hook h);
  uint64_t AddBackwardHook(Hook h);
  void RemoveHook(uint64_t id);

  // The model as an ordered list of layers, for pipeline parallelism; empty (the default) when
  // the model cannot be cut. Layers call submodules through operator(), so hooks still run.
  virtual std::vector<PipelineLayer> PipelineLayers() { return {}; }

 protected:
  // Called from subclass constructors. The tensor becomes a leaf that requires grad.
  Tensor RegisterParameter(const std::string& name, Tensor t);
  Tensor RegisterBuffer(const std::string& name, Tensor t);
  template <typename M>
  M* RegisterModule(const std::string& name, std::unique_ptr<M> m) {
    M* raw = m.get();
    AddChild(name, std::unique_ptr<Module>(std::move(m)));
    return raw;
  }
  void set_block(bool b) { is_block_ = b; }
  // A view of part of another model (a pipeline stage's layers, handed to the strategy that
  // trains the stage): a child this module does not own, and a parameter registered as it is
  // (its flags kept), both under the names the model gives them, so state dicts, hooks and
  // checkpoints of the view are the model's own. The borrowed module must outlive this one.
  void BorrowModule(const std::string& name, Module* m);
  void ShareParameter(const std::string& name, Tensor t);
  // Direct access to a registered parameter by its local name (subclasses keep Tensor handles
  // too, but LoadStateDict may replace storage; it copies in place, so handles stay valid).
  Tensor param(const std::string& name) const;

 private:
  void AddChild(const std::string& name, std::unique_ptr<Module> m);
  void CollectParams(const std::string& prefix, NamedTensors* out, bool buffers) const;
  void InstallBackwardTracking();
  void FirePostBackward();

  std::string type_name_;
  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::pair<std::string, Module*>> children_;
  std::vector<std::unique_ptr<Module>> owned_children_;  // those registered, not borrowed
  bool training_ = true;
  bool is_block_ = false;
  ForwardFn replaced_forward_;

  struct HookEntry {
    uint64_t id;
    Hook fn;
  };
  std::vector<HookEntry> fwd_pre_, fwd_post_, bwd_pre_, bwd_post_;
  // Backward tracking state (only when backward hooks exist).
  bool tracking_installed_ = false;
  std::vector<std::pair<Tensor, uint64_t>> tracked_params_;  // param, its hook id
  int pending_params_ = 0;
  bool post_fired_ = true;
};

}  // namespace braid

#endif  // BRAID_CORE_MODULE_H_
