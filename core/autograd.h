// Define-by-run reverse-mode autograd, and the engine-owned hook points strategies attach to.
//
// Hook order within one backward pass (docs/ARCHITECTURE.md has the full picture):
//   1. module pre-backward   (the gradient of a module's output has arrived; see module.h)
//   2. per-parameter post-accumulate-grad hooks (a leaf's .grad now holds this pass's sum)
//   3. module post-backward  (every parameter of the module has its gradient; see module.h)
//   4. end-of-backward callbacks, in registration order, after the last node ran.
// Nodes run in reverse creation order among those ready, so the last layer's gradients are
// produced (and can be communicated) first; a leaf's gradient accumulator runs as soon as it is
// ready.
#ifndef BRAID_CORE_AUTOGRAD_H_
#define BRAID_CORE_AUTOGRAD_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace braid::autograd {

// Whether ops record history on this thread.
bool GradEnabled();
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

class Node;
struct Edge {
  std::shared_ptr<Node> node;  // null: no gradient flows along this edge
  int input_nr = 0;            // which of node's outputs' gradients this edge feeds
};

class Node {
 public:
  Node();
  virtual ~Node() = default;
  // grads[i]: gradient of output i (undefined when none flowed to it). Returns one gradient per
  // next_edges entry, undefined where the input gets none.
  virtual std::vector<Tensor> Apply(std::vector<Tensor>&& grads) = 0;
  virtual std::string name() const = 0;
  // Frees what the node saved for backward once the graph will not be run again.
  virtual void ReleaseSaved() {}

  std::vector<Edge> next_edges;
  int num_outputs = 1;
  uint64_t sequence_nr;  // creation order; later nodes run first
};

// What a leaf's gradient flows into: adds into tensor.grad, then runs its post-accumulate hooks.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::weak_ptr<TensorImpl> var) : var_(std::move(var)) {}
  std::vector<Tensor> Apply(std::vector<Tensor>&& grads) override;
  std::string name() const override { return "AccumulateGrad"; }

 private:
  std::weak_ptr<TensorImpl> var_;
};

// The edge a gradient for `t` must travel along (its grad_fn, or its accumulator if a leaf).
Edge GradientEdge(const Tensor& t);

// A tensor kept for backward. Saving always detaches (so an op may save its own output without
// a reference cycle) and goes through the innermost active SavedTensorHooks, which is how
// activation checkpointing and offload replace what is kept.
struct SavedTensorHooks {
  std::function<std::shared_ptr<void>(const Tensor&)> pack;
  std::function<Tensor(const std::shared_ptr<void>&)> unpack;
};
class SavedTensorHooksScope {
 public:
  explicit SavedTensorHooksScope(SavedTensorHooks hooks);
  ~SavedTensorHooksScope();
  SavedTensorHooksScope(const SavedTensorHooksScope&) = delete;
  SavedTensorHooksScope& operator=(const SavedTensorHooksScope&) = delete;
};
class SavedTensor {
 public:
  SavedTensor() = default;
  explicit SavedTensor(const Tensor& t);
  Tensor Get() const;
  void Reset();

 private:
  Tensor plain_;
  std::shared_ptr<void> packed_;
  std::function<Tensor(const std::shared_ptr<void>&)> unpack_;
  bool released_ = false;
};

// A node whose backward is a closure: how every op in core/ops.h records itself, and how users
// write their own differentiable functions (forward computed by the caller, backward given).
using BackwardFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& grad_outputs)>;
class FunctionNode final : public Node {
 public:
  FunctionNode(std::string name, BackwardFn backward)
      : name_(std::move(name)), backward_(std::move(backward)) {}
  std::vector<Tensor> Apply(std::vector<Tensor>&& grads) override;
  std::string name() const override { return name_; }
  void ReleaseSaved() override { backward_ = nullptr; }

 private:
  std::string name_;
  BackwardFn backward_;
};

// Makes `outputs` the results of a differentiable function of `inputs`. No-op (returns false)
// when grad mode is off or no input requires grad. `backward` gets one gradient per output
// (undefined outputs' gradients are passed as zeros) and returns one per input.
bool RecordFunction(const std::string& name, const std::vector<Tensor>& inputs,
                    const std::vector<Tensor*>& outputs, BackwardFn backward);

// A user-defined differentiable function: `forward` computes outputs from inputs without
// recording (as under no_grad); `backward` maps output gradients to input gradients.
std::vector<Tensor> ApplyFunction(
    const std::string& name, const std::vector<Tensor>& inputs,
    const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& forward,
    BackwardFn backward);

// Runs reverse mode from `roots` (gradient seeds `grads`; undefined seeds mean ones for
// scalars). Gradients add into leaves' .grad until cleared.
void Backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
              bool retain_graph = false);

// Callbacks that run at the end of every backward pass run by this thread (strategies wait for
// their reductions here; per thread because tests run one rank per thread). Returns an id for RemoveEndOfBackwardHook.
uint64_t AddEndOfBackwardHook(std::function<void()> fn);
void RemoveEndOfBackwardHook(uint64_t id);
// A callback for the end of the backward pass now running only (called from inside a hook).
void QueueEndOfBackwardCallback(std::function<void()> fn);

// Weight gradients put off. A pipeline stage's backward has two parts: its input's gradient,
// which the previous stage waits for, and its weights' gradients, which nobody waits for until
// the optimizer step. Zero-bubble pipeline schedules send the first before computing the
// second. While a queue is active on this thread (ActiveScope), an op that can split its
// backward (Linear, when its weight and bias are leaves) computes only its input's gradient
// during Backward and queues the rest; Run() computes the queued gradients and adds them into
// the leaves' .grad exactly as Backward would have (transforms and post-accumulate hooks too).
class WeightGradQueue {
 public:
  WeightGradQueue() = default;
  ~WeightGradQueue();  // a queue dropped with work left is a bug: fails fast
  WeightGradQueue(const WeightGradQueue&) = delete;
  WeightGradQueue& operator=(const WeightGradQueue&) = delete;

  // Makes `q` the queue ops on this thread defer into, for the scope's lifetime.
  class ActiveScope {
   public:
    explicit ActiveScope(WeightGradQueue* q);
    ~ActiveScope();
    ActiveScope(const ActiveScope&) = delete;
    ActiveScope& operator=(const ActiveScope&) = delete;

   private:
    WeightGradQueue* prev_;
  };

  void Run();
  bool empty() const { return work_.empty(); }
  // The weight gradients put off and not run yet: one per op that put its weights' off.
  size_t size() const { return work_.size(); }

  // For ops: this thread's active queue, or nullptr.
  static WeightGradQueue* Active();
  void Push(std::function<void()> fn) { work_.push_back(std::move(fn)); }

 private:
  std::vector<std::function<void()>> work_;
};
// For Module's post-backward hooks (step 3 above) when a parameter got no gradient: runs `fn`
// after the last node of the backward pass now running and before the end-of-backward
// callbacks, latest queued first (a child module's before its parent's).
void QueuePostBackwardCallback(std::function<void()> fn);
bool InBackward();

// Adds `g` into `acc` (allocating it if undefined): the engine's and optimisers' accumulation.
void AccumulateInto(Tensor& acc, const Tensor& g);

}  // namespace braid::autograd

#endif  // BRAID_CORE_AUTOGRAD_H_
