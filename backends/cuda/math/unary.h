// Per-element unary ops and their derivatives (kernels::UnaryOp), written as the CPU backend's
// portable scalar paths are (backends/cpu/elementwise.cc), operation for operation: compiled by
// the host compiler they give the CPU backend's portable results bit for bit, which
// unary_test.cc checks. On the GPU, nvcc contracts a * b + c into one FMA and its expf/tanhf are
// within 2 ulp of glibc's, so results there agree to a few ulp (kernels_gpu_test.cc).
#ifndef BRAID_BACKENDS_CUDA_MATH_UNARY_H_
#define BRAID_BACKENDS_CUDA_MATH_UNARY_H_

#include "backends/cuda/math/convert.h"
#include "backends/cuda/math/hd.h"

namespace braid::cuda::math {

// The same order as kernels::UnaryOp: the registration code static_asserts each value, so the
// two cannot drift apart. A copy because this header must not include core (nvcc builds it in
// kernels that see no absl).
enum class Unary : int {
  kScale,
  kAddScalar,
  kRelu,
  kGeluTanh,
  kExp,
  kLog,
  kNeg,
  kSquare,
  kSqrt,
  kTanh,
};

inline constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
inline constexpr float kGeluA = 0.044715f;

// GELU-tanh through the logistic function: 0.5 x (1 + tanh(u)) = x s, s = 1 / (1 + e^{-2u}),
// u = sqrt(2/pi) (x + 0.044715 x^3). One exp and one division, relative accuracy for negative
// x. -2u is capped at 80 so that e and s (s e) stay finite; past that s < 2e-35. `ds` (if not
// null) gets s (1 - s) = s (s e), the derivative's term; s e ~ 1 first, s s could underflow.
BRAID_HD float GeluSigmoid(float x, float* ds) {
  const float m2u_raw = -2.0f * kGeluC * x * (1.0f + kGeluA * x * x);
  // As std::min(80.0f, m2u_raw): NaN gives 80, then x * s is NaN anyway.
  const float m2u = m2u_raw < 80.0f ? m2u_raw : 80.0f;
  const float e = expf(m2u);
  const float s = 1.0f / (1.0f + e);
  if (ds != nullptr) *ds = s * (s * e);
  return s;
}

BRAID_HD float GeluTanh(float x) { return x * GeluSigmoid(x, nullptr); }

// d/dx [x s] = s + 2 (x du/dx) s (1 - s), x du/dx = c x (1 + 3 a x^2).
BRAID_HD float GeluTanhGrad(float x, float g) {
  float ds;
  const float s = GeluSigmoid(x, &ds);
  const float xdu = kGeluC * x * (1.0f + 3.0f * kGeluA * x * x);
  return g * (s + 2.0f * xdu * ds);
}

// sech^2(x) = 4 e / (1 + e)^2, e = exp(-2|x|): keeps its relative accuracy where tanh saturates
// (1 - tanh^2 would round to 0).
BRAID_HD float Sech2(float x) {
  const float e = expf(-2.0f * fabsf(x));
  return 4.0f * e / ((1.0f + e) * (1.0f + e));
}

BRAID_HD float ApplyUnary(Unary op, float x, float scalar) {
  switch (op) {
    case Unary::kScale: return x * scalar;
    case Unary::kAddScalar: return x + scalar;
    case Unary::kRelu: return x > 0.0f ? x : 0.0f;
    case Unary::kGeluTanh: return GeluTanh(x);
    case Unary::kExp: return expf(x);
    case Unary::kLog: return logf(x);
    case Unary::kNeg: return -x;
    case Unary::kSquare: return x * x;
    case Unary::kSqrt: return sqrtf(x);
    case Unary::kTanh: return tanhf(x);
  }
  return x;
}

// grad_in for grad_out g at input x. kScale has no entry: its derivative is the scalar, which
// the unary_backward slot does not receive (the caller rejects it before launching).
BRAID_HD float ApplyUnaryGrad(Unary op, float x, float g) {
  switch (op) {
    case Unary::kScale: return g;  // never launched, see above
    case Unary::kAddScalar: return g * 1.0f;
    case Unary::kNeg: return g * -1.0f;
    case Unary::kRelu: return x > 0.0f ? g : 0.0f;
    case Unary::kGeluTanh: return GeluTanhGrad(x, g);
    case Unary::kExp: return g * expf(x);
    case Unary::kLog: return g / x;
    case Unary::kSquare: return g * (2.0f * x);
    case Unary::kSqrt: return g * (0.5f / sqrtf(x));
    case Unary::kTanh: return g * Sech2(x);
  }
  return g;
}

// Elementwise binary ops, the order of kernels::BinaryOp.
enum class Binary : int { kAdd, kSub, kMul, kDiv };

BRAID_HD float ApplyBinary(Binary op, float a, float b) {
  switch (op) {
    case Binary::kAdd: return a + b;
    case Binary::kSub: return a - b;
    case Binary::kMul: return a * b;
    case Binary::kDiv: return a / b;
  }
  return a;
}

// y = alpha x + beta y, BLAS style: beta == 0 never reads y (it may hold garbage or NaN).
BRAID_HD float Axpby(float alpha, float x, float beta, float y) {
  return beta == 0.0f ? x * alpha : alpha * x + beta * y;
}

// ---- Half storage (bf16, f16; math::Format), f32 arithmetic ----------------------------------
// The native half kernels: each operand loaded to f32, the f32 math above, the result rounded
// once to the output's format. The same result as the up-cast fallback around the f32 kernel
// (core/kernels.h, RegisterHalfFallbacks), without its conversion passes. Stored<F> is
// convert.h's.
template <Format F>
BRAID_HD Stored<F> UnaryHalf(Unary op, Stored<F> x, float scalar) {
  return Elem<F>::Put(ApplyUnary(op, Elem<F>::Get(x), scalar));
}

template <Format F>
BRAID_HD Stored<F> UnaryGradHalf(Unary op, Stored<F> x, Stored<F> g) {
  return Elem<F>::Put(ApplyUnaryGrad(op, Elem<F>::Get(x), Elem<F>::Get(g)));
}

template <Format F>
BRAID_HD Stored<F> BinaryHalf(Binary op, Stored<F> a, Stored<F> b) {
  return Elem<F>::Put(ApplyBinary(op, Elem<F>::Get(a), Elem<F>::Get(b)));
}

// x and y in their own formats (a half gradient into an f32 accumulator, or the reverse).
template <Format X, Format Y>
BRAID_HD Stored<Y> AxpbyMixed(float alpha, Stored<X> x, float beta, Stored<Y> y) {
  return Elem<Y>::Put(Axpby(alpha, Elem<X>::Get(x), beta, beta == 0.0f ? 0.0f : Elem<Y>::Get(y)));
}

}  // namespace braid::cuda::math

#endif  // BRAID_BACKENDS_CUDA_MATH_UNARY_H_
