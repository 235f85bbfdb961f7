#include "core/autograd.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <queue>
#include <unordered_map>

#include "core/kernels.h"

namespace braid::autograd {

namespace {
thread_local bool g_grad_enabled = true;
thread_local std::vector<SavedTensorHooks> g_saved_hooks;
thread_local int g_backward_depth = 0;
thread_local std::vector<std::function<void()>> g_queued_callbacks;
thread_local WeightGradQueue* g_weight_grad_queue = nullptr;
std::atomic<uint64_t> g_next_sequence{0};
constexpr uint64_t kAccumulatorPriority = uint64_t{1} << 63;
thread_local std::vector<std::function<void()>> g_post_backward_callbacks;

// Per thread: in-process tests run one rank per thread, each with its own strategy.
struct EndHooks {
  std::vector<std::pair<uint64_t, std::function<void()>>> hooks;
  uint64_t next_id = 1;
};
EndHooks& GetEndHooks() {
  thread_local EndHooks h;
  return h;
}
}  // namespace

bool GradEnabled() { return g_grad_enabled; }
NoGradGuard::NoGradGuard() : prev_(g_grad_enabled) { g_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { g_grad_enabled = prev_; }

Node::Node() : sequence_nr(g_next_sequence.fetch_add(1)) {}

namespace {
// True when `t` is the only handle to its buffer and spans all of it: no other tensor (a view, a
// saved tensor, a caller's seed, another edge's copy of the same gradient) can read or write
// that memory, so a gradient may keep it, or add into it, instead of copying it first. Storage
// always owns its memory, so its reference count sees every holder.
bool SoleOwner(const Tensor& t) {
  return t.impl_ptr().use_count() == 1 && t.storage().use_count() == 1 &&
         t.storage_offset() == 0 && t.nbytes() == t.storage()->bytes();
}
}  // namespace

void AccumulateInto(Tensor& acc, const Tensor& g) {
  if (!acc.defined()) {
    acc = g.Detach().Clone();
    return;
  }
  CheckSameShape("gradient accumulation", acc, g);
  // Keyed by the half one of the two (see kernels::AxpbyKey): half gradients add in f32 and
  // round once.
  kernels::axpby.Get(acc.device(), kernels::AxpbyKey(g, acc))(1.0f, g, 1.0f, acc);
}

std::vector<Tensor> AccumulateGrad::Apply(std::vector<Tensor>&& grads) {
  std::shared_ptr<TensorImpl> impl = var_.lock();
  if (!impl || !grads[0].defined()) return {};
  Tensor var(impl);
  Tensor incoming = std::move(grads[0]);
  {
    auto transforms = impl->grad_transforms;  // copy: a transform may remove itself
    for (auto& [id, fn] : transforms) incoming = fn(incoming);
  }
  BRAID_CHECK(incoming.shape() == var.shape())
      << "gradient " << ShapeToString(incoming.shape()) << " for " << var.DescribeForError();
  Tensor g = var.grad();
  if (!g.defined()) {
    // Own the buffer: the incoming gradient may alias memory the graph still uses, so it is
    // copied unless nothing else holds it (most weight gradients: made by their op's backward
    // for this accumulator alone), when it is kept as it is.
    g = SoleOwner(incoming) ? incoming.Detach() : incoming.Detach().Clone();
  } else {
    kernels::axpby.Get(g.device(), kernels::AxpbyKey(incoming, g))(1.0f, incoming, 1.0f, g);
  }
  var.set_grad(g);
  // Copy: a hook may remove itself.
  auto hooks = impl->post_accumulate_hooks;
  for (auto& [id, hook] : hooks) hook(var);
  return {};
}

WeightGradQueue::~WeightGradQueue() {
  BRAID_CHECK(work_.empty()) << work_.size()
                             << " weight gradient(s) were put off and never computed (Run())";
}

WeightGradQueue::ActiveScope::ActiveScope(WeightGradQueue* q) : prev_(g_weight_grad_queue) {
  g_weight_grad_queue = q;
}
WeightGradQueue::ActiveScope::~ActiveScope() { g_weight_grad_queue = prev_; }

WeightGradQueue* WeightGradQueue::Active() { return g_weight_grad_queue; }

void WeightGradQueue::Run() {
  std::vector<std::function<void()>> work;
  work.swap(work_);
  NoGradGuard no_grad;  // gradients of gradients are not wanted here
  for (auto& fn : work) fn();
}

Edge GradientEdge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return Edge{};
  if (t.grad_fn()) return Edge{t.grad_fn(), t.output_nr()};
  TensorImpl* impl = t.impl();
  if (!impl->grad_accumulator) {
    impl->grad_accumulator = std::make_shared<AccumulateGrad>(t.impl_ptr());
    // Ahead of every other node once ready: the accumulator outlives the graph it was made in,
    // so its creation order says nothing about later passes, where it would otherwise run after
    // every node of the new graph and delay the hooks that start gradient communication.
    impl->grad_accumulator->sequence_nr |= kAccumulatorPriority;
  }
  return Edge{impl->grad_accumulator, 0};
}

SavedTensorHooksScope::SavedTensorHooksScope(SavedTensorHooks hooks) {
  g_saved_hooks.push_back(std::move(hooks));
}
SavedTensorHooksScope::~SavedTensorHooksScope() { g_saved_hooks.pop_back(); }

SavedTensor::SavedTensor(const Tensor& t) {
  if (!t.defined()) return;
  Tensor d = t.Detach();
  if (!g_saved_hooks.empty() && g_saved_hooks.back().pack) {
    packed_ = g_saved_hooks.back().pack(d);
    unpack_ = g_saved_hooks.back().unpack;
  } else {
    plain_ = d;
  }
}

Tensor SavedTensor::Get() const {
  BRAID_CHECK(!released_) << "a saved tensor was used after its graph was freed: run backward "
                             "with retain_graph=true to backward through a graph twice";
  if (unpack_) return unpack_(packed_);
  return plain_;
}

void SavedTensor::Reset() {
  plain_ = Tensor();
  packed_.reset();
  released_ = true;
}

std::vector<Tensor> FunctionNode::Apply(std::vector<Tensor>&& grads) {
  BRAID_CHECK(backward_ != nullptr)
      << "backward through '" << name_
      << "' a second time: its saved tensors were freed (use retain_graph=true)";
  return backward_(grads);
}

namespace {
// Per-output metadata needed to make zero gradients for outputs that got none.
class RecordedNode final : public Node {
 public:
  struct OutputMeta {
    Shape shape;
    DType dtype;
    Device device;
  };
  RecordedNode(std::string name, BackwardFn bw, std::vector<OutputMeta> outs)
      : name_(std::move(name)), backward_(std::move(bw)), outs_(std::move(outs)) {}
  std::vector<Tensor> Apply(std::vector<Tensor>&& grads) override {
    BRAID_CHECK(backward_ != nullptr)
        << "backward through '" << name_
        << "' a second time: its saved tensors were freed (use retain_graph=true)";
    for (size_t i = 0; i < grads.size(); ++i) {
      // A gradient has its output's dtype (a half op's backward expects half gradients).
      if (!grads[i].defined()) {
        grads[i] = Tensor::Zeros(outs_[i].shape, outs_[i].dtype, outs_[i].device);
      }
    }
    std::vector<Tensor> r = backward_(grads);
    BRAID_CHECK(r.size() == next_edges.size())
        << "backward of '" << name_ << "' returned " << r.size() << " gradients for "
        << next_edges.size() << " inputs";
    return r;
  }
  std::string name() const override { return name_; }
  void ReleaseSaved() override { backward_ = nullptr; }

 private:
  std::string name_;
  BackwardFn backward_;
  std::vector<OutputMeta> outs_;
};
}  // namespace

bool RecordFunction(const std::string& name, const std::vector<Tensor>& inputs,
                    const std::vector<Tensor*>& outputs, BackwardFn backward) {
  if (!g_grad_enabled) return false;
  bool any = false;
  for (const Tensor& t : inputs) any = any || (t.defined() && t.requires_grad());
  if (!any) return false;
  std::vector<RecordedNode::OutputMeta> outs;
  for (Tensor* o : outputs) outs.push_back({o->shape(), o->dtype(), o->device()});
  auto node = std::make_shared<RecordedNode>(name, std::move(backward), std::move(outs));
  node->num_outputs = int(outputs.size());
  node->next_edges.reserve(inputs.size());
  for (const Tensor& t : inputs) node->next_edges.push_back(GradientEdge(t));
  for (size_t i = 0; i < outputs.size(); ++i) {
    TensorImpl* o = outputs[i]->impl();
    o->requires_grad = true;
    o->grad_fn = node;
    o->output_nr = int(i);
  }
  return true;
}

std::vector<Tensor> ApplyFunction(
    const std::string& name, const std::vector<Tensor>& inputs,
    const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& forward,
    BackwardFn backward) {
  std::vector<Tensor> outs;
  {
    NoGradGuard ng;
    std::vector<Tensor> detached;
    for (const Tensor& t : inputs) detached.push_back(t.defined() ? t.Detach() : t);
    outs = forward(detached);
  }
  std::vector<Tensor*> ptrs;
  for (Tensor& o : outs) ptrs.push_back(&o);
  RecordFunction(name, inputs, ptrs, std::move(backward));
  return outs;
}

uint64_t AddEndOfBackwardHook(std::function<void()> fn) {
  EndHooks& h = GetEndHooks();
  uint64_t id = h.next_id++;
  h.hooks.emplace_back(id, std::move(fn));
  return id;
}

void RemoveEndOfBackwardHook(uint64_t id) {
  EndHooks& h = GetEndHooks();
  h.hooks.erase(std::remove_if(h.hooks.begin(), h.hooks.end(),
                               [id](const auto& p) { return p.first == id; }),
                h.hooks.end());
}

void QueueEndOfBackwardCallback(std::function<void()> fn) {
  BRAID_CHECK(g_backward_depth > 0) << "QueueEndOfBackwardCallback outside a backward pass";
  g_queued_callbacks.push_back(std::move(fn));
}

void QueuePostBackwardCallback(std::function<void()> fn) {
  BRAID_CHECK(g_backward_depth > 0) << "QueuePostBackwardCallback outside a backward pass";
  g_post_backward_callbacks.push_back(std::move(fn));
}

bool InBackward() { return g_backward_depth > 0; }

void Backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
              bool retain_graph) {
  BRAID_CHECK(roots.size() == grads.size()) << "one gradient seed per root";
  NoGradGuard no_grad;  // no double backward: gradients are plain values
  struct Pending {
    std::vector<Tensor> grads;
    int deps = 0;
  };
  std::unordered_map<Node*, Pending> pending;
  std::unordered_map<Node*, std::shared_ptr<Node>> keep;  // nodes stay alive for the pass

  std::vector<Edge> root_edges;
  std::vector<Tensor> root_grads;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& r = roots[i];
    BRAID_CHECK(r.defined() && r.requires_grad())
        << "backward from " << r.DescribeForError()
        << ", which does not require grad (no parameter or input that requires grad fed it)";
    Tensor g = grads[i];
    if (!g.defined()) {
      BRAID_CHECK(r.numel() == 1) << "backward from non-scalar " << r.DescribeForError()
                                  << " needs an explicit gradient";
      g = Tensor::Full(r.shape(), 1.0f, r.dtype(), r.device());
    }
    CheckSameShape("backward seed", r, g);
    // A gradient has its tensor's dtype: a seed given in another one (an f32 vector for a half
    // output) is converted once here rather than refused.
    if (g.dtype() != r.dtype()) g = g.To(r.dtype());
    root_edges.push_back(GradientEdge(r));
    root_grads.push_back(g);
  }

  // Count dependencies: how many edges lead into each node from nodes reachable from roots.
  std::vector<Node*> stack;
  for (const Edge& e : root_edges) {
    if (e.node && !keep.count(e.node.get())) {
      keep[e.node.get()] = e.node;
      stack.push_back(e.node.get());
    }
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges) {
      if (!e.node) continue;
      pending[e.node.get()].deps++;
      if (!keep.count(e.node.get())) {
        keep[e.node.get()] = e.node;
        stack.push_back(e.node.get());
      }
    }
  }

  auto cmp = [](Node* a, Node* b) { return a->sequence_nr < b->sequence_nr; };
  std::priority_queue<Node*, std::vector<Node*>, decltype(cmp)> ready(cmp);
  auto add_grad = [&](const Edge& e, const Tensor& g) {
    Pending& p = pending[e.node.get()];
    if (p.grads.empty()) p.grads.resize(size_t(e.node->num_outputs));
    Tensor& slot = p.grads[size_t(e.input_nr)];
    if (!slot.defined()) {
      slot = g;
    } else {
      // Into the slot itself when nothing else holds its buffer (the same kernel and operands
      // as into a copy, so the same bits); a copy when someone may still read it.
      Tensor sum = SoleOwner(slot) ? slot : slot.Clone();
      kernels::axpby.Get(sum.device(), kernels::AxpbyKey(g, sum))(1.0f, g, 1.0f, sum);
      slot = sum;
    }
  };
  for (size_t i = 0; i < root_edges.size(); ++i) {
    if (root_edges[i].node) add_grad(root_edges[i], root_grads[i]);
  }
  for (const Edge& e : root_edges) {
    if (e.node && pending[e.node.get()].deps == 0) {
      pending[e.node.get()].deps = -1;  // queued
      ready.push(e.node.get());
    }
  }

  ++g_backward_depth;
  while (!ready.empty()) {
    Node* n = ready.top();
    ready.pop();
    Pending& p = pending[n];
    std::vector<Tensor> in = std::move(p.grads);
    if (in.empty()) in.resize(size_t(n->num_outputs));
    std::vector<Tensor> out = n->Apply(std::move(in));
    // What the node saved is needed by no one else: freed now, as PyTorch does, so that the
    // activations shrink as backward proceeds instead of all living to its end.
    if (!retain_graph) n->ReleaseSaved();
    for (size_t i = 0; i < n->next_edges.size(); ++i) {
      const Edge& e = n->next_edges[i];
      if (!e.node) continue;
      if (i < out.size() && out[i].defined()) add_grad(e, out[i]);
      Pending& q = pending[e.node.get()];
      if (--q.deps == 0) {
        q.deps = -1;
        ready.push(e.node.get());
      }
    }
  }
  // Modules' post-backward hooks still owed (step 3), latest queued first.
  while (!g_post_backward_callbacks.empty()) {
    std::function<void()> cb = std::move(g_post_backward_callbacks.back());
    g_post_backward_callbacks.pop_back();
    cb();
  }
  // End-of-backward: persistent hooks, then callbacks queued during this pass.
  auto hooks = GetEndHooks().hooks;  // copy: a hook may remove itself
  for (auto& [id, fn] : hooks) fn();
  while (!g_queued_callbacks.empty()) {
    auto cbs = std::move(g_queued_callbacks);
    g_queued_callbacks.clear();
    for (auto& cb : cbs) cb();
  }
  --g_backward_depth;
}

}  // namespace braid::autograd
