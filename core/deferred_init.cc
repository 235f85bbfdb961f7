#include "core/deferred_init.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "core/check.h"

namespace braid {
namespace {
thread_local bool g_deferred = false;
}  // namespace

DeferredInitScope::DeferredInitScope() : previous_(g_deferred) { g_deferred = true; }
DeferredInitScope::~DeferredInitScope() { g_deferred = previous_; }
bool InDeferredInit() { return g_deferred; }

Tensor MakeParameter(const Shape& shape, Initializer init, Device device) {
  if (g_deferred) {
    Tensor t = Tensor::Unallocated(shape, DType::kF32, device);
    t.impl()->initializer = std::make_shared<const Initializer>(std::move(init));
    return t;
  }
  std::vector<float> v(size_t(NumElements(shape)));
  init(v.data(), 0, int64_t(v.size()));
  return Tensor::FromVector(v, shape, device);
}

Tensor MakeConstantParameter(const Shape& shape, float value, Device device) {
  if (g_deferred) {
    return MakeParameter(
        shape, [value](float* out, int64_t b, int64_t e) { std::fill(out, out + (e - b), value); },
        device);
  }
  return Tensor::Full(shape, value, DType::kF32, device);
}

bool IsDeferred(const Tensor& t) { return t.impl()->initializer != nullptr && !t.has_data(); }

void InitialValues(const Tensor& t, int64_t begin, int64_t end, float* out) {
  BRAID_CHECK(t.impl()->initializer != nullptr)
      << "InitialValues of " << t.DescribeForError() << ", which was not made deferred";
  BRAID_CHECK(0 <= begin && begin <= end && end <= t.numel())
      << "InitialValues range [" << begin << ", " << end << ") outside " << t.DescribeForError();
  if (begin < end) (*t.impl()->initializer)(out, begin, end);
}

void Materialize(const Tensor& t) {
  if (!IsDeferred(t)) return;
  std::vector<float> v(size_t(t.numel()));
  InitialValues(t, 0, t.numel(), v.data());
  t.storage()->Reallocate();
  Tensor(t).CopyFrom(Tensor::FromVector(v, t.shape(), Device::CPU()));  // a handle: same tensor
}

}  // namespace braid
