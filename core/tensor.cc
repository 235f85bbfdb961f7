#include "core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/allocator.h"
#include "core/autograd.h"
#include "core/kernels.h"

namespace braid {

std::string ShapeToString(const Shape& s) { return absl::StrCat("[", absl::StrJoin(s, ","), "]"); }

int64_t NumElements(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Storage::Storage(size_t bytes, Device device, bool allocate) : bytes_(bytes), device_(device) {
  if (allocate) {
    data_ = GetAllocator(device)->Allocate(bytes);
  } else {
    released_ = true;
  }
}

Storage::~Storage() {
  if (!released_) GetAllocator(device_)->Deallocate(data_, bytes_);
}

void Storage::Release() {
  if (released_) return;
  GetAllocator(device_)->Deallocate(data_, bytes_);
  data_ = nullptr;
  released_ = true;
}

void Storage::Reallocate() {
  if (!released_) return;
  data_ = GetAllocator(device_)->Allocate(bytes_);
  released_ = false;
}

void Tensor::FailReleased() const {
  BRAID_CHECK(false) << "tensor " << DescribeForError()
                     << " has no memory: its storage is released (a sharded parameter used "
                        "outside its gather, or a deferred one never materialised)";
  std::abort();
}

void Tensor::RebindTo(const Tensor& source) const {
  BRAID_CHECK(defined() && source.defined()) << "RebindTo of an undefined tensor";
  BRAID_CHECK(shape() == source.shape() && dtype() == source.dtype())
      << "RebindTo: " << DescribeForError() << " cannot become a view of "
      << source.DescribeForError() << " (shape and dtype must match)";
  impl_->storage = source.storage();
  impl_->offset = source.storage_offset();
  impl_->grad.reset();
}

void Tensor::RebindToPart(const Tensor& source) const {
  BRAID_CHECK(defined() && source.defined()) << "RebindToPart of an undefined tensor";
  BRAID_CHECK(dtype() == source.dtype() && device() == source.device())
      << "RebindToPart: " << DescribeForError() << " cannot become "
      << source.DescribeForError() << " (dtype and device must match)";
  impl_->storage = source.storage();
  impl_->offset = source.storage_offset();
  impl_->shape = source.shape();
  impl_->grad.reset();
}

void Tensor::ConvertTo(DType dtype) const {
  BRAID_CHECK(defined()) << "ConvertTo of an undefined tensor";
  if (this->dtype() == dtype) return;
  BRAID_CHECK(IsFloating(this->dtype()) && IsFloating(dtype))
      << "ConvertTo: " << DescribeForError() << " cannot become " << DTypeName(dtype)
      << " (only floating dtypes convert)";
  if (has_data()) {
    Tensor converted = Detach().To(dtype);
    impl_->storage = converted.storage();
    impl_->offset = converted.storage_offset();
  } else {
    impl_->storage = std::make_shared<Storage>(size_t(numel()) * SizeOf(dtype), device(),
                                               /*allocate=*/false);
    impl_->offset = 0;
  }
  impl_->dtype = dtype;
  impl_->grad.reset();
}

void Tensor::MoveTo(Device device) const {
  if (this->device() == device) return;
  RebindTo(Detach().To(device));
}

Tensor Tensor::Empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape) BRAID_CHECK(d >= 0) << "negative dimension in shape " << ShapeToString(shape);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(size_t(NumElements(shape)) * SizeOf(dtype), device);
  impl->shape = shape;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::Unallocated(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape) BRAID_CHECK(d >= 0) << "negative dimension in shape " << ShapeToString(shape);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(size_t(NumElements(shape)) * SizeOf(dtype), device,
                                            /*allocate=*/false);
  impl->shape = shape;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::Zeros(const Shape& shape, DType dtype, Device device) {
  return Full(shape, 0.0f, dtype, device);
}

Tensor Tensor::Full(const Shape& shape, float value, DType dtype, Device device) {
  Tensor t = Empty(shape, dtype, device);
  t.Fill(value);
  return t;
}

template <typename T>
Tensor Tensor::FromVector(const std::vector<T>& values, const Shape& shape, Device device) {
  BRAID_CHECK(int64_t(values.size()) == NumElements(shape))
      << values.size() << " values for shape " << ShapeToString(shape);
  Tensor host = Empty(shape, DTypeOf<T>::value, Device::CPU());
  if (!values.empty()) std::memcpy(host.raw_data(), values.data(), values.size() * sizeof(T));
  return device.type == DeviceType::kCPU && device.index == 0 ? host : host.To(device);
}
template Tensor Tensor::FromVector(const std::vector<float>&, const Shape&, Device);
template Tensor Tensor::FromVector(const std::vector<int32_t>&, const Shape&, Device);
template Tensor Tensor::FromVector(const std::vector<int64_t>&, const Shape&, Device);
template Tensor Tensor::FromVector(const std::vector<uint8_t>&, const Shape&, Device);
template Tensor Tensor::FromVector(const std::vector<int8_t>&, const Shape&, Device);

int64_t Tensor::size(int dim) const {
  int n = ndim();
  int d = dim < 0 ? dim + n : dim;
  BRAID_CHECK(d >= 0 && d < n) << "dimension " << dim << " out of range for " << DescribeForError();
  return impl_->shape[d];
}

namespace {

// A view of `base` with the same autograd meaning as `base` itself: callers attach history.
Tensor MakeAlias(const Tensor& base, int64_t offset, const Shape& shape) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.storage();
  impl->offset = offset;
  impl->shape = shape;
  impl->dtype = base.dtype();
  return Tensor(std::move(impl));
}

Shape InferShape(const Tensor& t, const Shape& shape) {
  Shape out = shape;
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      BRAID_CHECK(infer < 0) << "reshape of " << t.DescribeForError() << " to "
                             << ShapeToString(shape) << ": only one -1 allowed";
      infer = int(i);
    } else {
      known *= out[i];
    }
  }
  if (infer >= 0) {
    BRAID_CHECK(known > 0 && t.numel() % known == 0)
        << "cannot reshape " << t.DescribeForError() << " to " << ShapeToString(shape);
    out[infer] = t.numel() / known;
  }
  BRAID_CHECK(NumElements(out) == t.numel())
      << "cannot reshape " << t.DescribeForError() << " to " << ShapeToString(shape)
      << ": element counts differ";
  return out;
}

// Gradient of a view: route the view's gradient back into a zero gradient of the base.
void RecordView(const char* name, const Tensor& base, Tensor& view, int64_t rel_offset) {
  Shape base_shape = base.shape();
  autograd::RecordFunction(name, {base}, {&view},
                           [base_shape, rel_offset](const std::vector<Tensor>& g) {
                             const Tensor& gv = g[0];
                             if (NumElements(base_shape) == gv.numel()) {
                               return std::vector<Tensor>{gv.Reshape(base_shape)};
                             }
                             Tensor gb = Tensor::Zeros(base_shape, gv.dtype(), gv.device());
                             gb.FlatRange(rel_offset, gv.numel()).CopyFrom(gv);
                             return std::vector<Tensor>{gb};
                           });
}

}  // namespace

Tensor Tensor::Reshape(const Shape& shape) const {
  Tensor v = MakeAlias(*this, impl_->offset, InferShape(*this, shape));
  RecordView("Reshape", *this, v, 0);
  return v;
}

Tensor Tensor::Slice(int64_t begin, int64_t end) const {
  BRAID_CHECK(ndim() >= 1 && begin >= 0 && begin <= end && end <= impl_->shape[0])
      << "slice [" << begin << ", " << end << ") out of range for " << DescribeForError();
  Shape s = impl_->shape;
  int64_t row = s.empty() ? 1 : NumElements(s) / std::max<int64_t>(s[0], 1);
  s[0] = end - begin;
  Tensor v = MakeAlias(*this, impl_->offset + begin * row, s);
  RecordView("Slice", *this, v, begin * row);
  return v;
}

Tensor Tensor::FlatRange(int64_t offset, int64_t n, const Shape& shape) const {
  BRAID_CHECK(offset >= 0 && n >= 0 && offset + n <= numel())
      << "flat range [" << offset << ", " << offset + n << ") out of range for "
      << DescribeForError();
  Shape s = shape.empty() ? Shape{n} : shape;
  BRAID_CHECK(NumElements(s) == n) << "flat range of " << n << " elements viewed as "
                                   << ShapeToString(s);
  Tensor v = MakeAlias(*this, impl_->offset + offset, s);
  RecordView("FlatRange", *this, v, offset);
  return v;
}

Tensor Tensor::Detach() const {
  Tensor v = MakeAlias(*this, impl_->offset, impl_->shape);
  v.impl_->name = impl_->name;
  return v;
}

Tensor Tensor::Clone() const {
  Tensor t = Empty(shape(), dtype(), device());
  t.CopyFrom(*this);
  return t;
}

Tensor Tensor::To(Device d) const {
  if (d == device()) return *this;
  Tensor t = Empty(shape(), dtype(), d);
  t.CopyFrom(*this);
  return t;
}

Tensor Tensor::To(DType dt) const {
  if (dt == dtype()) return *this;
  Tensor t = Empty(shape(), dt, device());
  t.CopyFrom(*this);
  return t;
}

namespace {

float LoadAsFloat(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(p)[i];
    case DType::kBF16: return BF16ToFloat(static_cast<const uint16_t*>(p)[i]);
    case DType::kF16: return F16ToFloat(static_cast<const uint16_t*>(p)[i]);
    case DType::kI32: return float(static_cast<const int32_t*>(p)[i]);
    case DType::kI64: return float(static_cast<const int64_t*>(p)[i]);
    case DType::kU8: return float(static_cast<const uint8_t*>(p)[i]);
    case DType::kI8: return float(static_cast<const int8_t*>(p)[i]);
  }
  return 0;
}

void StoreFloat(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::kF32: static_cast<float*>(p)[i] = v; break;
    case DType::kBF16: static_cast<uint16_t*>(p)[i] = FloatToBF16(v); break;
    case DType::kF16: static_cast<uint16_t*>(p)[i] = FloatToF16(v); break;
    case DType::kI32: static_cast<int32_t*>(p)[i] = int32_t(v); break;
    case DType::kI64: static_cast<int64_t*>(p)[i] = int64_t(v); break;
    case DType::kU8: static_cast<uint8_t*>(p)[i] = uint8_t(v); break;
    case DType::kI8: static_cast<int8_t*>(p)[i] = int8_t(v); break;
  }
}

}  // namespace

void Tensor::CopyFrom(const Tensor& src) {
  BRAID_CHECK(src.numel() == numel()) << "copy from " << src.DescribeForError() << " into "
                                      << DescribeForError() << ": element counts differ";
  bool host = device().type == DeviceType::kCPU && src.device().type == DeviceType::kCPU;
  if (!host) {
    // The non-CPU side's backend owns transfers (and their streams).
    Device d = device().type != DeviceType::kCPU ? device() : src.device();
    kernels::copy.Get(d)(src, *this);
    return;
  }
  if (src.dtype() == dtype()) {
    if (raw_data() != src.raw_data()) std::memmove(raw_data(), src.raw_data(), nbytes());
    return;
  }
  if (auto* k = kernels::copy.Find(DeviceType::kCPU)) return k(src, *this);
  const void* s = src.raw_data();
  void* d = raw_data();
  for (int64_t i = 0, n = numel(); i < n; ++i) StoreFloat(d, dtype(), i, LoadAsFloat(s, src.dtype(), i));
}

void Tensor::Fill(float value) {
  if (device().type != DeviceType::kCPU) return kernels::fill.Get(device())(*this, value);
  if (value == 0.0f) {
    std::memset(raw_data(), 0, nbytes());
    return;
  }
  if (auto* k = kernels::fill.Find(DeviceType::kCPU)) return k(*this, value);
  void* d = raw_data();
  for (int64_t i = 0, n = numel(); i < n; ++i) StoreFloat(d, dtype(), i, value);
}

std::vector<float> Tensor::ToFloatVector() const {
  Tensor h = device().type == DeviceType::kCPU ? *this : To(Device::CPU());
  std::vector<float> out(size_t(h.numel()));
  const void* s = h.raw_data();
  if (h.dtype() == DType::kF32) {
    if (!out.empty()) std::memcpy(out.data(), s, out.size() * 4);
  } else {
    for (size_t i = 0; i < out.size(); ++i) out[i] = LoadAsFloat(s, h.dtype(), int64_t(i));
  }
  return out;
}

template <typename T>
std::vector<T> Tensor::ToVector() const {
  Tensor h = device().type == DeviceType::kCPU ? *this : To(Device::CPU());
  std::vector<T> out(size_t(h.numel()));
  const T* p = h.data<T>();
  std::copy(p, p + out.size(), out.begin());
  return out;
}
template std::vector<float> Tensor::ToVector() const;
template std::vector<int32_t> Tensor::ToVector() const;
template std::vector<int64_t> Tensor::ToVector() const;
template std::vector<uint8_t> Tensor::ToVector() const;
template std::vector<int8_t> Tensor::ToVector() const;

float Tensor::item() const {
  BRAID_CHECK(numel() == 1) << "item() of " << DescribeForError() << ": needs exactly one element";
  return ToFloatVector()[0];
}

Tensor& Tensor::set_requires_grad(bool r) {
  BRAID_CHECK(!r || IsFloating(dtype())) << "only floating tensors can require grad: "
                                         << DescribeForError();
  BRAID_CHECK(is_leaf()) << "requires_grad can only be set on a leaf: " << DescribeForError();
  impl_->requires_grad = r;
  return *this;
}

void Tensor::Backward(const Tensor& grad, bool retain_graph) const {
  autograd::Backward({*this}, {grad}, retain_graph);
}

namespace {
// One id space for both kinds of leaf hooks, so RemoveHook needs no kind.
uint64_t NextHookId() {
  static std::atomic<uint64_t> next_id{1};
  return next_id++;
}
}  // namespace

uint64_t Tensor::RegisterPostAccumulateGradHook(GradHook hook) {
  BRAID_CHECK(is_leaf() && requires_grad())
      << "post-accumulate-grad hooks go on leaves that require grad: " << DescribeForError();
  uint64_t id = NextHookId();
  impl_->post_accumulate_hooks.emplace_back(id, std::move(hook));
  return id;
}

uint64_t Tensor::RegisterGradTransform(std::function<Tensor(const Tensor&)> transform) {
  BRAID_CHECK(is_leaf() && requires_grad())
      << "gradient transforms go on leaves that require grad: " << DescribeForError();
  uint64_t id = NextHookId();
  impl_->grad_transforms.emplace_back(id, std::move(transform));
  return id;
}

void Tensor::RemoveHook(uint64_t id) {
  auto& hooks = impl_->post_accumulate_hooks;
  for (auto it = hooks.begin(); it != hooks.end(); ++it) {
    if (it->first == id) {
      hooks.erase(it);
      return;
    }
  }
  auto& transforms = impl_->grad_transforms;
  for (auto it = transforms.begin(); it != transforms.end(); ++it) {
    if (it->first == id) {
      transforms.erase(it);
      return;
    }
  }
}

std::string Tensor::DescribeForError() const {
  if (!defined()) return "<undefined tensor>";
  std::string s = impl_->name.empty() ? "" : absl::StrCat("'", impl_->name, "' ");
  return absl::StrCat(s, DTypeName(dtype()), ShapeToString(shape()), " on ", device().ToString());
}

std::string Tensor::ToString(int max_values) const {
  if (!defined()) return "Tensor(undefined)";
  std::vector<float> v = ToFloatVector();
  std::ostringstream os;
  os << "Tensor(" << DescribeForError() << ", [";
  for (int i = 0; i < int(v.size()) && i < max_values; ++i) os << (i ? ", " : "") << v[i];
  if (int(v.size()) > max_values) os << ", ...";
  os << "])";
  return os.str();
}

void CheckSameShape(const char* op, const Tensor& a, const Tensor& b) {
  BRAID_CHECK(a.shape() == b.shape()) << op << ": shapes differ: " << a.DescribeForError()
                                      << " vs " << b.DescribeForError();
}

}  // namespace braid
