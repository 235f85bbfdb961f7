// Elementwise CUDA kernels: fill, binary, unary and its backward, axpby, AdamW and SGD. Grid-
// stride loops over ElementwiseGeometry; the per-element math is backends/cuda/math's, the same
// source the CPU tests check against the CPU backend.
#include "backends/cuda/kernels/geometry.h"
#include "backends/cuda/kernels/launchers.h"

namespace braid::cuda {
namespace {

#define BRAID_GRID_STRIDE(i, n)                                                      \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n);         \
       i += int64_t(gridDim.x) * blockDim.x)

template <typename T>
__global__ void FillKernel(T* dst, int64_t n, T value) {
  BRAID_GRID_STRIDE(i, n) dst[i] = value;
}

__global__ void BinaryKernel(math::Binary op, const float* a, const float* b, int64_t nb,
                             float* out, int64_t n) {
  BRAID_GRID_STRIDE(i, n) out[i] = math::ApplyBinary(op, a[i], b[nb == n ? i : i % nb]);
}

__global__ void UnaryKernel(math::Unary op, const float* a, float scalar, float* out, int64_t n) {
  BRAID_GRID_STRIDE(i, n) out[i] = math::ApplyUnary(op, a[i], scalar);
}

__global__ void UnaryGradKernel(math::Unary op, const float* a, const float* g, float* out,
                                int64_t n) {
  BRAID_GRID_STRIDE(i, n) out[i] = math::ApplyUnaryGrad(op, a[i], g[i]);
}

__global__ void AxpbyKernel(float alpha, const float* x, float beta, float* y, int64_t n) {
  // beta == 0 never reads y (math::Axpby), so uninitialised y is fine.
  BRAID_GRID_STRIDE(i, n) y[i] = math::Axpby(alpha, x[i], beta, beta == 0.0f ? 0.0f : y[i]);
}

__global__ void AdamWKernel(math::AdamWConsts k, float* w, const float* g, float* m, float* v,
                            int64_t n) {
  BRAID_GRID_STRIDE(i, n) {
    float mi = m[i], vi = v[i], wi = w[i];
    math::AdamWStep(k, g[i], mi, vi, wi);
    m[i] = mi;
    v[i] = vi;
    w[i] = wi;
  }
}

__global__ void SgdKernel(math::SgdConsts k, float* w, const float* g, float* buf, int64_t n) {
  BRAID_GRID_STRIDE(i, n) {
    float b = k.use_momentum ? buf[i] : 0.0f, wi = w[i];
    math::SgdStep(k, g[i], b, wi);
    if (k.use_momentum) buf[i] = b;
    w[i] = wi;
  }
}

// Half storage, f32 arithmetic (math/unary.h's *Half): one load and one rounding per element.
template <math::Format F>
__global__ void BinaryHalfKernel(math::Binary op, const math::Stored<F>* a,
                                 const math::Stored<F>* b, int64_t nb, math::Stored<F>* out,
                                 int64_t n) {
  BRAID_GRID_STRIDE(i, n) out[i] = math::BinaryHalf<F>(op, a[i], b[nb == n ? i : i % nb]);
}

template <math::Format F>
__global__ void UnaryHalfKernel(math::Unary op, const math::Stored<F>* a, float scalar,
                                math::Stored<F>* out, int64_t n) {
  BRAID_GRID_STRIDE(i, n) out[i] = math::UnaryHalf<F>(op, a[i], scalar);
}

template <math::Format F>
__global__ void UnaryGradHalfKernel(math::Unary op, const math::Stored<F>* a,
                                    const math::Stored<F>* g, math::Stored<F>* out, int64_t n) {
  BRAID_GRID_STRIDE(i, n) out[i] = math::UnaryGradHalf<F>(op, a[i], g[i]);
}

template <math::Format X, math::Format Y>
__global__ void AxpbyMixedKernel(float alpha, const math::Stored<X>* x, float beta,
                                 math::Stored<Y>* y, int64_t n) {
  BRAID_GRID_STRIDE(i, n) {
    y[i] = math::AxpbyMixed<X, Y>(alpha, x[i], beta, beta == 0.0f ? math::Stored<Y>(0) : y[i]);
  }
}

// The half kernels for a runtime format code: bf16 or f16 only (f32 has its own kernels).
template <typename Fn>
cudaError_t WithHalfFormat(int fmt, Fn&& launch) {
  switch (math::Format(fmt)) {
    case math::Format::kBF16: launch(math::FormatTag<math::Format::kBF16>{}); break;
    case math::Format::kF16: launch(math::FormatTag<math::Format::kF16>{}); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchBinaryHalf(int fmt, math::Binary op, const void* a, const void* b, int64_t nb,
                             void* out, int64_t n, cudaStream_t s) {
  const Launch1D g = ElementwiseGeometry(n);
  if (g.grid == 0) return cudaSuccess;
  return WithHalfFormat(fmt, [&](auto f) {
    constexpr math::Format F = decltype(f)::value;
    using T = math::Stored<F>;
    BinaryHalfKernel<F><<<g.grid, g.block, 0, s>>>(op, static_cast<const T*>(a),
                                                   static_cast<const T*>(b), nb,
                                                   static_cast<T*>(out), n);
  });
}

cudaError_t LaunchUnaryHalf(int fmt, math::Unary op, const void* a, float scalar, void* out,
                            int64_t n, cudaStream_t s) {
  const Launch1D g = ElementwiseGeometry(n);
  if (g.grid == 0) return cudaSuccess;
  return WithHalfFormat(fmt, [&](auto f) {
    constexpr math::Format F = decltype(f)::value;
    using T = math::Stored<F>;
    UnaryHalfKernel<F><<<g.grid, g.block, 0, s>>>(op, static_cast<const T*>(a), scalar,
                                                  static_cast<T*>(out), n);
  });
}

cudaError_t LaunchUnaryGradHalf(int fmt, math::Unary op, const void* a, const void* gr,
                                void* out, int64_t n, cudaStream_t s) {
  const Launch1D g = ElementwiseGeometry(n);
  if (g.grid == 0) return cudaSuccess;
  return WithHalfFormat(fmt, [&](auto f) {
    constexpr math::Format F = decltype(f)::value;
    using T = math::Stored<F>;
    UnaryGradHalfKernel<F><<<g.grid, g.block, 0, s>>>(op, static_cast<const T*>(a),
                                                      static_cast<const T*>(gr),
                                                      static_cast<T*>(out), n);
  });
}

cudaError_t LaunchAxpbyMixed(int x_fmt, int y_fmt, float alpha, const void* x, float beta,
                             void* y, int64_t n, cudaStream_t s) {
  const Launch1D g = ElementwiseGeometry(n);
  if (g.grid == 0) return cudaSuccess;
  if (x_fmt < 0 || x_fmt > 2 || y_fmt < 0 || y_fmt > 2) return cudaErrorInvalidValue;
  math::DispatchFormats(math::Format(x_fmt), math::Format(y_fmt), [&](auto xf, auto yf) {
    constexpr math::Format X = decltype(xf)::value, Y = decltype(yf)::value;
    AxpbyMixedKernel<X, Y><<<g.grid, g.block, 0, s>>>(
        alpha, static_cast<const math::Stored<X>*>(x), beta, static_cast<math::Stored<Y>*>(y), n);
  });
  return cudaGetLastError();
}

cudaError_t LaunchFill(void* dst, int64_t n, int elem_size, uint64_t bits, cudaStream_t s) {
  const Launch1D g = ElementwiseGeometry(n);
  if (g.grid == 0) return cudaSuccess;
  switch (elem_size) {
    case 1: FillKernel<<<g.grid, g.block, 0, s>>>(static_cast<uint8_t*>(dst), n, uint8_t(bits)); break;
    case 2: FillKernel<<<g.grid, g.block, 0, s>>>(static_cast<uint16_t*>(dst), n, uint16_t(bits)); break;
    case 4: FillKernel<<<g.grid, g.block, 0, s>>>(static_cast<uint32_t*>(dst), n, uint32_t(bits)); break;
    case 8: FillKernel<<<g.grid, g.block, 0, s>>>(static_cast<uint64_t*>(dst), n, uint64_t(bits)); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t LaunchBinary(math::Binary op, const float* a, const float* b, int64_t nb, float* out,
                         int64_t n, cudaStream_t s) {
  const Launch1D g = ElementwiseGeometry(n);
  if (g.grid == 0) return cudaSuccess;
  BinaryKernel<<<g.grid, g.block, 0, s>>>(op, a, b, nb, out, n);
  return cudaGetLastError();
}

cudaError_t LaunchUnary(math::Unary op, const float* a, float scalar, float* out, int64_t n,
                        cudaStream_t s) {
  const Launch1D g = ElementwiseGeometry(n);
  if (g.grid == 0) return cudaSuccess;
  UnaryKernel<<<g.grid, g.block, 0, s>>>(op, a, scalar, out, n);
  return cudaGetLastError();
}

cudaError_t LaunchUnaryGrad(math::Unary op, const float* a, const float* gr, float* out, int64_t n,
                            cudaStream_t s) {
  const Launch1D g = ElementwiseGeometry(n);
  if (g.grid == 0) return cudaSuccess;
  UnaryGradKernel<<<g.grid, g.block, 0, s>>>(op, a, gr, out, n);
  return cudaGetLastError();
}

cudaError_t LaunchAxpby(float alpha, const float* x, float beta, float* y, int64_t n,
                        cudaStream_t s) {
  const Launch1D g = ElementwiseGeometry(n);
  if (g.grid == 0) return cudaSuccess;
  AxpbyKernel<<<g.grid, g.block, 0, s>>>(alpha, x, beta, y, n);
  return cudaGetLastError();
}

cudaError_t LaunchAdamW(const math::AdamWConsts& k, float* w, const float* gr, float* m, float* v,
                        int64_t n, cudaStream_t s) {
  const Launch1D g = ElementwiseGeometry(n);
  if (g.grid == 0) return cudaSuccess;
  AdamWKernel<<<g.grid, g.block, 0, s>>>(k, w, gr, m, v, n);
  return cudaGetLastError();
}

cudaError_t LaunchSgd(const math::SgdConsts& k, float* w, const float* gr, float* buf, int64_t n,
                      cudaStream_t s) {
  const Launch1D g = ElementwiseGeometry(n);
  if (g.grid == 0) return cudaSuccess;
  SgdKernel<<<g.grid, g.block, 0, s>>>(k, w, gr, buf, n);
  return cudaGetLastError();
}

}  // namespace braid::cuda
