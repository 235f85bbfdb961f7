#include "backends/gloo/reduce_kernels.h"

#include <cstring>

namespace braid::gloo_backend {
namespace {

template <typename T>
void Sum(void* out, const void* a, const void* b, size_t n) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = T(x[i] + y[i]);
}

// NaN-propagating for floats (a NaN on any rank poisons the result, as in PyTorch); the
// comparisons compile to blends, so the loops still vectorise.
template <typename T>
void Max(void* out, const void* a, const void* b, size_t n) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) {
    T u = x[i], v = y[i];
    o[i] = (v > u || v != v) ? v : u;
  }
}

template <typename T>
void Min(void* out, const void* a, const void* b, size_t n) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) {
    T u = x[i], v = y[i];
    o[i] = (v < u || v != v) ? v : u;
  }
}

template <typename T>
ReduceFn For(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return &Sum<T>;
    case ReduceOp::kMax:
      return &Max<T>;
    case ReduceOp::kMin:
      return &Min<T>;
  }
  return nullptr;
}

inline float Bf16ToF32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t F32ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

}  // namespace

ReduceFn NativeReduceFn(DType t, ReduceOp op) {
  switch (t) {
    case DType::kF32:
      return For<float>(op);
    case DType::kI32:
      return For<int32_t>(op);
    case DType::kI64:
      return For<int64_t>(op);
    case DType::kU8:
      return For<uint8_t>(op);
    case DType::kI8:
      return For<int8_t>(op);
    case DType::kBF16:
    case DType::kF16:
      return nullptr;
  }
  return nullptr;
}

void UpcastToF32(DType t, const void* in, float* out, size_t n) {
  const uint16_t* h = static_cast<const uint16_t*>(in);
  if (t == DType::kBF16) {
    for (size_t i = 0; i < n; ++i) out[i] = Bf16ToF32(h[i]);
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = F16ToFloat(h[i]);
  }
}

void DowncastFromF32(DType t, const float* in, void* out, size_t n) {
  uint16_t* h = static_cast<uint16_t*>(out);
  if (t == DType::kBF16) {
    for (size_t i = 0; i < n; ++i) h[i] = F32ToBf16(in[i]);
  } else {
    for (size_t i = 0; i < n; ++i) h[i] = FloatToF16(in[i]);
  }
}

void DivideInPlace(float* x, size_t n, float d) {
  for (size_t i = 0; i < n; ++i) x[i] /= d;
}

}  // namespace braid::gloo_backend
