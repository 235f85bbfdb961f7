// copy, fill, binary, unary, unary_backward, axpby for the CPU (sum_all and sum_rows are in
// reductions.cc).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backends/cpu/convert.h"
#include "backends/cpu/simd.h"
#include "backends/cpu/thread_pool.h"
#include "core/dtype.h"
#include "core/kernel_checks.h"
#include "core/kernels.h"

namespace braid::cpu {
namespace {

using kernels::BinaryOp;
using kernels::UnaryOp;

#define BRAID_AVX2_MEMBER __attribute__((target("avx2,fma,f16c"), always_inline)) inline

namespace checks = kernels::checks;
constexpr DType kF32 = DType::kF32;

// Integer and mixed conversions are rare (data loading, tests): element by element through
// double, the same rules as core's host fallback.
double LoadAsDouble(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(p)[i];
    case DType::kBF16:
      return BF16ToFloat(static_cast<const uint16_t*>(p)[i]);
    case DType::kF16:
      return F16ToFloat(static_cast<const uint16_t*>(p)[i]);
    case DType::kI32:
      return static_cast<const int32_t*>(p)[i];
    case DType::kI64:
      return double(static_cast<const int64_t*>(p)[i]);
    case DType::kU8:
      return static_cast<const uint8_t*>(p)[i];
    case DType::kI8:
      return static_cast<const int8_t*>(p)[i];
  }
  return 0;
}

void StoreDouble(void* p, DType t, int64_t i, double v) {
  switch (t) {
    case DType::kF32:
      static_cast<float*>(p)[i] = float(v);
      break;
    case DType::kBF16:
      static_cast<uint16_t*>(p)[i] = FloatToBF16(float(v));
      break;
    case DType::kF16:
      static_cast<uint16_t*>(p)[i] = FloatToF16(float(v));
      break;
    case DType::kI32:
      static_cast<int32_t*>(p)[i] = int32_t(v);
      break;
    case DType::kI64:
      static_cast<int64_t*>(p)[i] = int64_t(v);
      break;
    case DType::kU8:
      static_cast<uint8_t*>(p)[i] = uint8_t(v);
      break;
    case DType::kI8:
      static_cast<int8_t*>(p)[i] = int8_t(v);
      break;
  }
}

void Copy(const Tensor& src, Tensor& dst) {
  checks::Copy("cpu", src, dst);
  const int64_t n = src.numel();
  const DType st = src.dtype(), dt = dst.dtype();
  const char* s = static_cast<const char*>(src.raw_data());
  char* d = static_cast<char*>(dst.raw_data());
  if (st == dt) {
    if (s == d || n == 0) return;
    const size_t bytes = size_t(n) * SizeOf(st);
    if (s + bytes <= d || d + bytes <= s) {
      const int64_t esz = int64_t(SizeOf(st));
      ParallelFor(n, 4 * kElementGrain, [&](int64_t b, int64_t e) {
        std::memcpy(d + b * esz, s + b * esz, size_t(e - b) * size_t(esz));
      });
    } else {
      std::memmove(d, s, bytes);
    }
    return;
  }
  const size_t ss = SizeOf(st), ds = SizeOf(dt);
  if (IsFloating(st) && IsFloating(dt)) {
    ParallelFor(n, kElementGrain, [&](int64_t b, int64_t e) {
      if (st == DType::kF32)
        return FromF32(dt, reinterpret_cast<const float*>(s) + b, d + b * ds, e - b);
      if (dt == DType::kF32) return ToF32(st, s + b * ss, reinterpret_cast<float*>(d) + b, e - b);
      // bf16 <-> f16 through an f32 buffer on the stack.
      float buf[512];
      for (int64_t i = b; i < e; i += 512) {
        int64_t m = std::min<int64_t>(512, e - i);
        ToF32(st, s + i * ss, buf, m);
        FromF32(dt, buf, d + i * ds, m);
      }
    });
    return;
  }
  for (int64_t i = 0; i < n; ++i) StoreDouble(d, dt, i, LoadAsDouble(s, st, i));
}

template <typename T>
void FillWith(void* p, int64_t n, T v) {
  T* d = static_cast<T*>(p);
  ParallelFor(n, 4 * kElementGrain, [&](int64_t b, int64_t e) { std::fill(d + b, d + e, v); });
}

void Fill(Tensor& dst, float value) {
  const int64_t n = dst.numel();
  void* p = dst.raw_data();
  switch (dst.dtype()) {
    case DType::kF32:
      return FillWith<float>(p, n, value);
    case DType::kBF16:
      return FillWith<uint16_t>(p, n, FloatToBF16(value));
    case DType::kF16:
      return FillWith<uint16_t>(p, n, FloatToF16(value));
    case DType::kI32:
      return FillWith<int32_t>(p, n, int32_t(double(value)));
    case DType::kI64:
      return FillWith<int64_t>(p, n, int64_t(double(value)));
    case DType::kU8:
      return FillWith<uint8_t>(p, n, uint8_t(double(value)));
    case DType::kI8:
      return FillWith<int8_t>(p, n, int8_t(double(value)));
  }
}

// ---- Elementwise maps ----------------------------------------------------------------------
//
// Each op is a struct with a scalar form and, on x86, an AVX2 form; the drivers below run the
// AVX2 form over whole vectors and masked tails, so every element goes through the same code.

template <typename Op>
void MapUnaryScalar(const Op& op, const float* a, float* o, int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] = op.Scalar(a[i]);
}

template <typename Op>
void MapBinaryScalar(const Op& op, const float* a, const float* b, float* o, int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] = op.Scalar(a[i], b[i]);
}

#if BRAID_HAVE_X86
template <typename Op>
BRAID_AVX2 void MapUnaryAvx2(const Op& op, const float* a, float* o, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 x0 = _mm256_loadu_ps(a + i), x1 = _mm256_loadu_ps(a + i + 8);
    _mm256_storeu_ps(o + i, op.Vec(x0));
    _mm256_storeu_ps(o + i + 8, op.Vec(x1));
  }
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(o + i, op.Vec(_mm256_loadu_ps(a + i)));
  if (i < n) {
    __m256i m = TailMask(n - i);
    _mm256_maskstore_ps(o + i, m, op.Vec(_mm256_maskload_ps(a + i, m)));
  }
}

template <typename Op>
BRAID_AVX2 void MapBinaryAvx2(const Op& op, const float* a, const float* b, float* o, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(o + i, op.Vec(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
  }
  if (i < n) {
    __m256i m = TailMask(n - i);
    _mm256_maskstore_ps(o + i, m,
                        op.Vec(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m)));
  }
}
#endif

template <typename Op>
void MapUnary(const Op& op, const float* a, float* o, int64_t n) {
#if BRAID_HAVE_X86
  if (UseAvx2()) return MapUnaryAvx2(op, a, o, n);
#endif
  MapUnaryScalar(op, a, o, n);
}

template <typename Op>
void MapBinary(const Op& op, const float* a, const float* b, float* o, int64_t n) {
#if BRAID_HAVE_X86
  if (UseAvx2()) return MapBinaryAvx2(op, a, b, o, n);
#endif
  MapBinaryScalar(op, a, b, o, n);
}

// Binary ops, as (a, b) -> out.
struct AddOp {
  float Scalar(float x, float y) const { return x + y; }
#if BRAID_HAVE_X86
  BRAID_AVX2_MEMBER __m256 Vec(__m256 x, __m256 y) const { return _mm256_add_ps(x, y); }
#endif
};
struct SubOp {
  float Scalar(float x, float y) const { return x - y; }
#if BRAID_HAVE_X86
  BRAID_AVX2_MEMBER __m256 Vec(__m256 x, __m256 y) const { return _mm256_sub_ps(x, y); }
#endif
};
struct MulOp {
  float Scalar(float x, float y) const { return x * y; }
#if BRAID_HAVE_X86
  BRAID_AVX2_MEMBER __m256 Vec(__m256 x, __m256 y) const { return _mm256_mul_ps(x, y); }
#endif
};
struct DivOp {
  float Scalar(float x, float y) const { return x / y; }
#if BRAID_HAVE_X86
  BRAID_AVX2_MEMBER __m256 Vec(__m256 x, __m256 y) const { return _mm256_div_ps(x, y); }
#endif
};

// A binary op with a fixed right-hand side, as a unary map.
template <typename Op>
struct WithScalarRhs {
  Op op;
  float y;
  float Scalar(float x) const { return op.Scalar(x, y); }
#if BRAID_HAVE_X86
  BRAID_AVX2_MEMBER __m256 Vec(__m256 x) const { return op.Vec(x, _mm256_set1_ps(y)); }
#endif
};

template <typename Op>
void BinaryTyped(const Op& op, const float* a, const float* b, float* o, int64_t n, int64_t nb) {
  if (nb == n) {
    ParallelFor(n, kElementGrain,
                [&](int64_t s, int64_t e) { MapBinary(op, a + s, b + s, o + s, e - s); });
  } else if (nb == 1) {
    WithScalarRhs<Op> u{op, b[0]};
    ParallelFor(n, kElementGrain, [&](int64_t s, int64_t e) { MapUnary(u, a + s, o + s, e - s); });
  } else {
    const int64_t rows = n / nb;
    ParallelFor(rows, std::max<int64_t>(1, kElementGrain / nb), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) MapBinary(op, a + r * nb, b, o + r * nb, nb);
    });
  }
}

void Binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  checks::Binary("cpu", kF32, a, b, out);
  const int64_t n = a.numel(), nb = b.numel();
  if (n == 0) return;
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* po = out.data<float>();
  switch (op) {
    case BinaryOp::kAdd:
      return BinaryTyped(AddOp{}, pa, pb, po, n, nb);
    case BinaryOp::kSub:
      return BinaryTyped(SubOp{}, pa, pb, po, n, nb);
    case BinaryOp::kMul:
      return BinaryTyped(MulOp{}, pa, pb, po, n, nb);
    case BinaryOp::kDiv:
      return BinaryTyped(DivOp{}, pa, pb, po, n, nb);
  }
}

// Unary ops.
struct ReluOp {
  float Scalar(float x) const { return x > 0.0f ? x : 0.0f; }
#if BRAID_HAVE_X86
  BRAID_AVX2_MEMBER __m256 Vec(__m256 x) const { return _mm256_max_ps(x, _mm256_setzero_ps()); }
#endif
};
// GELU through the logistic function: 0.5 x (1 + tanh(u)) = x s with s = 1 / (1 + e^{-2u}),
// u = sqrt(2/pi) (x + 0.044715 x^3). One exp and one division, and relative accuracy for
// negative x too. -2u is capped at 80 so that e and s * s * e (= s (1 - s), the derivative's
// term) stay finite; past that s < 2e-35 and the cap changes nothing visible.
inline float GeluSigmoidScalar(float x, float* ds) {
  const float m2u = std::min(80.0f, -2.0f * kGeluC * x * (1.0f + kGeluA * x * x));
  const float e = std::exp(m2u);
  const float s = 1.0f / (1.0f + e);
  if (ds != nullptr) *ds = s * (s * e);  // s * e ~ 1 first: s * s could underflow
  return s;
}

#if BRAID_HAVE_X86
BRAID_AVX2_INLINE __m256 GeluSigmoid(__m256 x, __m256 x2, __m256* ds) {
  const __m256 one = _mm256_set1_ps(1.0f);
  __m256 m2u = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(-2.0f * kGeluC), x),
                             _mm256_fmadd_ps(_mm256_set1_ps(kGeluA), x2, one));
  __m256 e = Exp(_mm256_min_ps(_mm256_set1_ps(80.0f), m2u));  // (const, x) order keeps NaN
  __m256 s = _mm256_div_ps(one, _mm256_add_ps(one, e));
  // s * e ~ 1 first: s * s could underflow into (slow) subnormals.
  if (ds != nullptr) *ds = _mm256_mul_ps(s, _mm256_mul_ps(s, e));
  return s;
}
#endif

struct GeluOp {
  float Scalar(float x) const { return x * GeluSigmoidScalar(x, nullptr); }
#if BRAID_HAVE_X86
  BRAID_AVX2_MEMBER __m256 Vec(__m256 x) const {
    return _mm256_mul_ps(x, GeluSigmoid(x, _mm256_mul_ps(x, x), nullptr));
  }
#endif
};
struct ExpOp {
  float Scalar(float x) const { return std::exp(x); }
#if BRAID_HAVE_X86
  BRAID_AVX2_MEMBER __m256 Vec(__m256 x) const { return Exp(x); }
#endif
};
struct LogOp {
  float Scalar(float x) const { return std::log(x); }
#if BRAID_HAVE_X86
  BRAID_AVX2_MEMBER __m256 Vec(__m256 x) const { return Log(x); }
#endif
};
struct NegOp {
  float Scalar(float x) const { return -x; }
#if BRAID_HAVE_X86
  BRAID_AVX2_MEMBER __m256 Vec(__m256 x) const { return _mm256_xor_ps(x, _mm256_set1_ps(-0.0f)); }
#endif
};
struct SquareOp {
  float Scalar(float x) const { return x * x; }
#if BRAID_HAVE_X86
  BRAID_AVX2_MEMBER __m256 Vec(__m256 x) const { return _mm256_mul_ps(x, x); }
#endif
};
struct SqrtOp {
  float Scalar(float x) const { return std::sqrt(x); }
#if BRAID_HAVE_X86
  BRAID_AVX2_MEMBER __m256 Vec(__m256 x) const { return _mm256_sqrt_ps(x); }
#endif
};
struct TanhOp {
  float Scalar(float x) const { return std::tanh(x); }
#if BRAID_HAVE_X86
  BRAID_AVX2_MEMBER __m256 Vec(__m256 x) const { return Tanh(x); }
#endif
};

template <typename Op>
void UnaryTyped(const Op& op, const float* a, float* o, int64_t n) {
  ParallelFor(n, kElementGrain, [&](int64_t s, int64_t e) { MapUnary(op, a + s, o + s, e - s); });
}

void Unary(UnaryOp op, const Tensor& a, float scalar, Tensor& out) {
  checks::Unary("cpu", kF32, a, out);
  const int64_t n = a.numel();
  if (n == 0) return;
  const float* pa = a.data<float>();
  float* po = out.data<float>();
  switch (op) {
    case UnaryOp::kScale:
      return UnaryTyped(WithScalarRhs<MulOp>{MulOp{}, scalar}, pa, po, n);
    case UnaryOp::kAddScalar:
      return UnaryTyped(WithScalarRhs<AddOp>{AddOp{}, scalar}, pa, po, n);
    case UnaryOp::kRelu:
      return UnaryTyped(ReluOp{}, pa, po, n);
    case UnaryOp::kGeluTanh:
      return UnaryTyped(GeluOp{}, pa, po, n);
    case UnaryOp::kExp:
      return UnaryTyped(ExpOp{}, pa, po, n);
    case UnaryOp::kLog:
      return UnaryTyped(LogOp{}, pa, po, n);
    case UnaryOp::kNeg:
      return UnaryTyped(NegOp{}, pa, po, n);
    case UnaryOp::kSquare:
      return UnaryTyped(SquareOp{}, pa, po, n);
    case UnaryOp::kSqrt:
      return UnaryTyped(SqrtOp{}, pa, po, n);
    case UnaryOp::kTanh:
      return UnaryTyped(TanhOp{}, pa, po, n);
  }
}

// sech^2(x) = 4 e / (1 + e)^2 with e = exp(-2|x|): unlike 1 - tanh^2 it keeps its relative
// accuracy where tanh saturates.
float Sech2(float x) {
  const float e = std::exp(-2.0f * std::fabs(x));
  return 4.0f * e / ((1.0f + e) * (1.0f + e));
}

// Unary derivatives, as (x, grad_out) -> grad_in.
struct ReluGrad {
  float Scalar(float x, float g) const { return x > 0.0f ? g : 0.0f; }
#if BRAID_HAVE_X86
  BRAID_AVX2_MEMBER __m256 Vec(__m256 x, __m256 g) const {
    return _mm256_and_ps(_mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GT_OQ), g);
  }
#endif
};
// d/dx [x s] = s + x s (1 - s) 2 du/dx = s + 2 (x du/dx) s (1 - s), x du/dx = c x (1 + 3 a x^2).
struct GeluGrad {
  float Scalar(float x, float g) const {
    float ds;
    const float s = GeluSigmoidScalar(x, &ds);
    const float xdu = kGeluC * x * (1.0f + 3.0f * kGeluA * x * x);
    return g * (s + 2.0f * xdu * ds);
  }
#if BRAID_HAVE_X86
  BRAID_AVX2_MEMBER __m256 Vec(__m256 x, __m256 g) const {
    const __m256 one = _mm256_set1_ps(1.0f);
    __m256 x2 = _mm256_mul_ps(x, x);
    __m256 ds;
    __m256 s = GeluSigmoid(x, x2, &ds);
    __m256 xdu2 = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(2.0f * kGeluC), x),
                                _mm256_fmadd_ps(_mm256_set1_ps(3.0f * kGeluA), x2, one));
    return _mm256_mul_ps(g, _mm256_fmadd_ps(xdu2, ds, s));
  }
#endif
};
struct ExpGrad {
  float Scalar(float x, float g) const { return g * std::exp(x); }
#if BRAID_HAVE_X86
  BRAID_AVX2_MEMBER __m256 Vec(__m256 x, __m256 g) const { return _mm256_mul_ps(g, Exp(x)); }
#endif
};
struct LogGrad {
  float Scalar(float x, float g) const { return g / x; }
#if BRAID_HAVE_X86
  BRAID_AVX2_MEMBER __m256 Vec(__m256 x, __m256 g) const { return _mm256_div_ps(g, x); }
#endif
};
struct SquareGrad {
  float Scalar(float x, float g) const { return g * (2.0f * x); }
#if BRAID_HAVE_X86
  BRAID_AVX2_MEMBER __m256 Vec(__m256 x, __m256 g) const {
    return _mm256_mul_ps(g, _mm256_add_ps(x, x));
  }
#endif
};
struct SqrtGrad {
  float Scalar(float x, float g) const { return g * (0.5f / std::sqrt(x)); }
#if BRAID_HAVE_X86
  BRAID_AVX2_MEMBER __m256 Vec(__m256 x, __m256 g) const {
    return _mm256_mul_ps(g, _mm256_div_ps(_mm256_set1_ps(0.5f), _mm256_sqrt_ps(x)));
  }
#endif
};
struct TanhGrad {
  float Scalar(float x, float g) const { return g * Sech2(x); }
#if BRAID_HAVE_X86
  BRAID_AVX2_MEMBER __m256 Vec(__m256 x, __m256 g) const {
    __m256 sech2;
    TanhSech2(x, &sech2);
    return _mm256_mul_ps(g, sech2);
  }
#endif
};
// Derivatives that ignore x: grad_out times a constant.
struct ConstGrad {
  float c;
  float Scalar(float, float g) const { return g * c; }
#if BRAID_HAVE_X86
  BRAID_AVX2_MEMBER __m256 Vec(__m256, __m256 g) const {
    return _mm256_mul_ps(g, _mm256_set1_ps(c));
  }
#endif
};

template <typename Op>
void UnaryGradTyped(const Op& op, const float* x, const float* g, float* o, int64_t n) {
  ParallelFor(n, kElementGrain,
              [&](int64_t s, int64_t e) { MapBinary(op, x + s, g + s, o + s, e - s); });
}

void UnaryBackward(UnaryOp op, const Tensor& a, const Tensor& grad_out, Tensor& grad_in) {
  checks::UnaryBackward("cpu", kF32, op, a, grad_out, grad_in);
  const int64_t n = a.numel();
  if (n == 0) return;
  const float* x = a.data<float>();
  const float* g = grad_out.data<float>();
  float* o = grad_in.data<float>();
  switch (op) {
    case UnaryOp::kScale:
      return;  // rejected above
    case UnaryOp::kAddScalar:
      return UnaryGradTyped(ConstGrad{1.0f}, x, g, o, n);
    case UnaryOp::kNeg:
      return UnaryGradTyped(ConstGrad{-1.0f}, x, g, o, n);
    case UnaryOp::kRelu:
      return UnaryGradTyped(ReluGrad{}, x, g, o, n);
    case UnaryOp::kGeluTanh:
      return UnaryGradTyped(GeluGrad{}, x, g, o, n);
    case UnaryOp::kExp:
      return UnaryGradTyped(ExpGrad{}, x, g, o, n);
    case UnaryOp::kLog:
      return UnaryGradTyped(LogGrad{}, x, g, o, n);
    case UnaryOp::kSquare:
      return UnaryGradTyped(SquareGrad{}, x, g, o, n);
    case UnaryOp::kSqrt:
      return UnaryGradTyped(SqrtGrad{}, x, g, o, n);
    case UnaryOp::kTanh:
      return UnaryGradTyped(TanhGrad{}, x, g, o, n);
  }
}

// y = alpha x + beta y; beta == 0 does not read y (it may hold garbage), as in BLAS.
struct AxpbyOp {
  float alpha, beta;
  float Scalar(float x, float y) const { return alpha * x + beta * y; }
#if BRAID_HAVE_X86
  BRAID_AVX2_MEMBER __m256 Vec(__m256 x, __m256 y) const {
    return _mm256_fmadd_ps(_mm256_set1_ps(alpha), x, _mm256_mul_ps(_mm256_set1_ps(beta), y));
  }
#endif
};

void Axpby(float alpha, const Tensor& x, float beta, Tensor& y) {
  checks::Axpby("cpu", kF32, x, y);
  const int64_t n = x.numel();
  if (n == 0) return;
  const float* px = x.data<float>();
  float* py = y.data<float>();
  if (beta == 0.0f) return UnaryTyped(WithScalarRhs<MulOp>{MulOp{}, alpha}, px, py, n);
  if (alpha == 1.0f && beta == 1.0f) return UnaryGradTyped(AddOp{}, px, py, py, n);
  UnaryGradTyped(AxpbyOp{alpha, beta}, px, py, py, n);
}

}  // namespace

BRAID_REGISTER_KERNEL(kernels::copy, DeviceType::kCPU, &Copy);
BRAID_REGISTER_KERNEL(kernels::fill, DeviceType::kCPU, &Fill);
BRAID_REGISTER_KERNEL(kernels::binary, DeviceType::kCPU, &Binary);
BRAID_REGISTER_KERNEL(kernels::unary, DeviceType::kCPU, &Unary);
BRAID_REGISTER_KERNEL(kernels::unary_backward, DeviceType::kCPU, &UnaryBackward);
BRAID_REGISTER_KERNEL(kernels::axpby, DeviceType::kCPU, &Axpby);

}  // namespace braid::cpu
