// Tensor: a typed, shaped, contiguous view of device storage, with autograd state.
//
// Tensors are handles: copying one aliases the same data. Every tensor is contiguous, so a view
// is (storage, offset, shape); views exist for reshape, a range along the first dimension and a
// flat range of a flat buffer (the last is what ZeRO-style flat parameter buffers are built on).
#ifndef BRAID_CORE_TENSOR_H_
#define BRAID_CORE_TENSOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/device.h"
#include "core/dtype.h"

namespace braid {

namespace autograd {
class Node;
}

using Shape = std::vector<int64_t>;
std::string ShapeToString(const Shape& s);
int64_t NumElements(const Shape& s);

// Raw device memory owned by one allocator. Shared by all views of it.
//
// The memory can be given back while the Storage object lives on, and allocated again later:
// strategies that shard parameters (ZeRO-3) release a layer's gathered parameters after its
// forward and refill them before its backward, and every view of the storage (the model's
// parameters, the autograd graph's saved tensors) sees the refilled values. A storage can also
// be created released (deferred initialisation). Reading a released storage is a fatal error.
class Storage {
 public:
  // `allocate` false: created released (no memory until Reallocate).
  Storage(size_t bytes, Device device, bool allocate = true);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

  bool released() const { return released_; }
  // Gives the memory back to the device's allocator (a no-op when already released).
  void Release();
  // Allocates the memory again; the contents are uninitialised (a no-op when not released).
  void Reallocate();

 private:
  void* data_ = nullptr;
  size_t bytes_;
  Device device_;
  bool released_ = false;
};

class Tensor;
using GradHook = std::function<void(Tensor& param)>;

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;  // in elements
  Shape shape;
  DType dtype = DType::kF32;
  // Autograd state.
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;  // accumulated gradient of a leaf
  std::shared_ptr<autograd::Node> grad_fn;
  int output_nr = 0;
  std::shared_ptr<autograd::Node> grad_accumulator;  // leaves only, made on first use
  std::vector<std::pair<uint64_t, GradHook>> post_accumulate_hooks;
  // Applied, in order, to each gradient arriving for this leaf before it is accumulated.
  std::vector<std::pair<uint64_t, std::function<Tensor(const Tensor&)>>> grad_transforms;
  std::string name;  // parameters carry their state-dict name, for error messages
  // Optimizer grouping: false for parameters that take no weight decay (biases, norms). Set by
  // the model, so it survives flattening and sharding (a strategy copies it to its shards).
  bool weight_decay = true;
  // Deferred initialisation (core/deferred_init.h): how to produce the initial values.
  std::shared_ptr<const std::function<void(float*, int64_t, int64_t)>> initializer;
  // The share of this parameter's squared gradient norm that this rank counts towards the
  // global norm: 1/t for a parameter that t tensor-parallel ranks each hold whole, so that the
  // sum over those ranks counts it once (ClipGradNormSharded).
  float grad_norm_share = 1.0f;
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // Creation. Memory comes from the device's allocator; Empty leaves it uninitialised.
  static Tensor Empty(const Shape& shape, DType dtype = DType::kF32, Device device = Device::CPU());
  static Tensor Zeros(const Shape& shape, DType dtype = DType::kF32, Device device = Device::CPU());
  static Tensor Full(const Shape& shape, float value, DType dtype = DType::kF32,
                     Device device = Device::CPU());
  template <typename T>
  static Tensor FromVector(const std::vector<T>& values, const Shape& shape,
                           Device device = Device::CPU());
  static Tensor Scalar(float v, Device device = Device::CPU()) { return Full({}, v, DType::kF32, device); }
  // A tensor whose storage is created released: shape and dtype only, no memory yet.
  static Tensor Unallocated(const Shape& shape, DType dtype = DType::kF32,
                            Device device = Device::CPU());

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl_->shape; }
  int ndim() const { return int(impl_->shape.size()); }
  int64_t size(int dim) const;  // negative counts from the end
  int64_t numel() const { return NumElements(impl_->shape); }
  size_t nbytes() const { return size_t(numel()) * SizeOf(impl_->dtype); }
  DType dtype() const { return impl_->dtype; }
  Device device() const { return impl_->storage->device(); }
  void* raw_data() const {
    if (impl_->storage->released()) FailReleased();
    return static_cast<char*>(impl_->storage->data()) + impl_->offset * SizeOf(impl_->dtype);
  }
  // False while the storage's memory is released (a sharded or not yet initialised parameter).
  bool has_data() const { return !impl_->storage->released(); }
  template <typename T>
  T* data() const {
    BRAID_CHECK(impl_->dtype == DTypeOf<T>::value)
        << "tensor " << DescribeForError() << " accessed as " << DTypeName(DTypeOf<T>::value);
    return static_cast<T*>(raw_data());
  }
  const std::shared_ptr<Storage>& storage() const { return impl_->storage; }
  int64_t storage_offset() const { return impl_->offset; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool SameAs(const Tensor& o) const { return impl_ == o.impl_; }

  // Views, sharing storage. Differentiable when autograd is recording.
  Tensor Reshape(const Shape& shape) const;  // one -1 is inferred
  Tensor Slice(int64_t begin, int64_t end) const;  // rows [begin, end) of dimension 0
  Tensor FlatRange(int64_t offset, int64_t numel, const Shape& shape = {}) const;
  // Same storage, no autograd history: never differentiable.
  Tensor Detach() const;

  // Re-homing, for strategies (plugins never write a tensor's internals): this tensor becomes a
  // view of `source`'s storage at `source`'s offset, keeping its identity, so every handle to it
  // (the model's, the optimizer's) follows. Same shape and dtype required; the values are now
  // `source`'s; its gradient is dropped. This is how a strategy puts parameters into one flat
  // buffer, or onto another device.
  // (const: it changes the tensor every handle shares, not this handle.)
  void RebindTo(const Tensor& source) const;
  // The same, except that the tensor takes `source`'s shape: it keeps its name and identity but
  // now holds a part of what it was. How tensor parallelism keeps this rank's slice of a
  // parameter under the parameter's own name, for every module that holds a handle to it.
  void RebindToPart(const Tensor& source) const;
  // Moves the values to `device` the same way (a no-op when already there).
  void MoveTo(Device device) const;
  // Converts the values to the floating dtype `dtype` (rounding to nearest even) in new storage,
  // keeping identity the same way, and drops the gradient: how mixed precision turns a model's
  // parameters into bf16/f16 before a strategy lays them out. A tensor without memory yet
  // (deferred initialisation) only changes dtype; it is initialised in the new one.
  void ConvertTo(DType dtype) const;

  // Copies (new storage).
  Tensor Clone() const;
  Tensor To(Device device) const;
  Tensor To(DType dtype) const;
  // In-place: copies src's values (converting dtype, crossing devices) into this tensor.
  void CopyFrom(const Tensor& src);
  void Fill(float value);
  void Zero() { Fill(0.0f); }

  // Host copies of the values, converted; for tests, I/O and small reads.
  std::vector<float> ToFloatVector() const;
  template <typename T>
  std::vector<T> ToVector() const;
  float item() const;  // one element, as float

  // Autograd.
  bool requires_grad() const { return impl_->requires_grad; }
  Tensor& set_requires_grad(bool r);
  bool is_leaf() const { return impl_->grad_fn == nullptr; }
  Tensor grad() const { return Tensor(impl_->grad); }
  void set_grad(const Tensor& g) { impl_->grad = g.impl_; }
  void ZeroGrad() { impl_->grad.reset(); }
  const std::shared_ptr<autograd::Node>& grad_fn() const { return impl_->grad_fn; }
  int output_nr() const { return impl_->output_nr; }
  // Reverse-mode from this tensor; a scalar needs no gradient argument.
  void Backward(const Tensor& grad = Tensor(), bool retain_graph = false) const;
  // Called after a backward pass has added into this leaf's .grad (once per backward pass).
  // Returns an id for RemoveHook.
  uint64_t RegisterPostAccumulateGradHook(GradHook hook);
  // Maps each gradient that arrives for this leaf before it is added into .grad (PyTorch's
  // Tensor.register_hook): sequence parallelism sums a replicated weight's per-rank partial
  // gradient over its group here, so .grad always holds the whole gradient, whatever strategy
  // reads it and however many micro-batches accumulate. Returns an id for RemoveHook.
  uint64_t RegisterGradTransform(std::function<Tensor(const Tensor&)> transform);
  void RemoveHook(uint64_t id);

  bool weight_decay() const { return impl_->weight_decay; }
  Tensor& set_weight_decay(bool on) {
    impl_->weight_decay = on;
    return *this;
  }

  float grad_norm_share() const { return impl_->grad_norm_share; }
  Tensor& set_grad_norm_share(float share) {
    impl_->grad_norm_share = share;
    return *this;
  }

  const std::string& name() const { return impl_->name; }
  Tensor& set_name(const std::string& n) {
    impl_->name = n;
    return *this;
  }
  std::string DescribeForError() const;  // "'h.0.attn.c_attn.weight' f32[768,256] on cpu:0"
  std::string ToString(int max_values = 8) const;

 private:
  [[noreturn]] void FailReleased() const;
  std::shared_ptr<TensorImpl> impl_;
};

// Checks a shape at an API boundary (user-facing shape errors are fatal with the op's name).
void CheckSameShape(const char* op, const Tensor& a, const Tensor& b);

}  // namespace braid

#endif  // BRAID_CORE_TENSOR_H_
