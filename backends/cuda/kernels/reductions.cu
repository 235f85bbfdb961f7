// sum_all and sum_rows. Both deterministic: sum_all uses a grid fixed by n alone
// (ReductionGeometry) with per-block partials in double summed in block order by one block
// (the partials' scratch is the caller's: register.cc takes it from the caching allocator);
// sum_rows gives each column one thread that adds the rows in order, exactly the CPU backend's
// per-column order (f32, and bf16/f16 storage with f32 accumulation, rounded once).
#include "backends/cuda/kernels/geometry.h"
#include "backends/cuda/kernels/launchers.h"
#include "backends/cuda/math/rows.h"
#include "backends/cuda/math/unary.h"

namespace braid::cuda {
namespace {

__device__ double BlockSumDouble(double v) {
  __shared__ double shared[32];
  for (int off = 16; off >= 1; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < int(blockDim.x / 32) ? shared[lane] : 0.0;
  for (int off = 16; off >= 1; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// F: the storage format of a and out (f32, or half: loaded to f32, the total rounded once).
template <math::Format F>
__global__ void PartialSumsKernel(const math::Stored<F>* a, int64_t n, double* partial) {
  double s = 0;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    s += math::Elem<F>::Get(a[i]);
  }
  s = BlockSumDouble(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// One block: thread 0 adds the partials in block order (at most kMaxReduceGrid of them). The
// total is rounded to f32 first, as the f32 kernel's, then (half) to the output's format: the
// fallback's result (f32 sum, rounded once) exactly.
template <math::Format F>
__global__ void FinishSumKernel(const double* partial, int64_t blocks, math::Stored<F>* out) {
  if (threadIdx.x != 0) return;
  double s = 0;
  for (int64_t b = 0; b < blocks; ++b) s += partial[b];
  out[0] = math::Elem<F>::Put(float(s));
}

// `partial` holds ReductionGeometry(n).grid doubles (the caller's scratch, see launchers.h).
template <math::Format F>
cudaError_t SumAllAs(const void* a, int64_t n, void* out, double* partial, cudaStream_t s) {
  using T = math::Stored<F>;
  const Launch1D g = ReductionGeometry(n);
  if (partial == nullptr) return cudaErrorInvalidValue;
  PartialSumsKernel<F><<<g.grid, g.block, 0, s>>>(static_cast<const T*>(a), n, partial);
  FinishSumKernel<F><<<1, 32, 0, s>>>(partial, g.grid, static_cast<T*>(out));
  return cudaGetLastError();
}

__global__ void SumRowsKernel(const float* a, int64_t rows, int64_t cols, float* out, float beta) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float acc = 0;
  for (int64_t r = 0; r < rows; ++r) acc += a[r * cols + c];
  out[c] = beta != 0.0f ? beta * out[c] + acc : acc;
}

// bf16/f16 storage: loads up-cast, the f32 kernel's per-column order, one rounding (rows.h's
// SumRowsColumn, checked against the CPU's half kernel by rows_half_math_test).
template <math::Format F>
__global__ void SumRowsHalfKernel(const math::Stored<F>* a, int64_t rows, int64_t cols,
                                  math::Stored<F>* out, float beta) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  out[c] = math::SumRowsColumn<F>(a, rows, cols, c, out[c], beta);
}

// One column per thread: each dpre element is the elementwise kernel's (math::UnaryGradHalf's
// rounding for half), and the column's sum adds those stored values in row order, as
// SumRowsColumn does, so the pair equals unary_backward then sum_rows bit for bit.
template <math::Format F>
__global__ void GeluBiasGradKernel(const math::Stored<F>* pre, const math::Stored<F>* dout,
                                   int64_t rows, int64_t cols, math::Stored<F>* dpre,
                                   math::Stored<F>* dbias) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float acc = 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = r * cols + c;
    const math::Stored<F> d = math::StoreAs<F>(
        math::ApplyUnaryGrad(math::Unary::kGeluTanh, math::LoadF32<F>(pre[i]),
                             math::LoadF32<F>(dout[i])));
    dpre[i] = d;
    // __fadd_rn: never contracted with the derivative's last product into an FMA, which would
    // add the unrounded product and leave sum_rows' bits.
    acc = __fadd_rn(acc, math::LoadF32<F>(d));
  }
  dbias[c] = math::StoreAs<F>(acc);
}

template <math::Format F>
void GeluBiasGradAs(const void* pre, const void* dout, int64_t rows, int64_t cols, void* dpre,
                    void* dbias, const Launch1D& g, cudaStream_t s) {
  using T = math::Stored<F>;
  GeluBiasGradKernel<F><<<g.grid, g.block, 0, s>>>(static_cast<const T*>(pre),
                                                   static_cast<const T*>(dout), rows, cols,
                                                   static_cast<T*>(dpre), static_cast<T*>(dbias));
}

}  // namespace

cudaError_t LaunchGeluBiasGrad(int fmt, const void* pre, const void* dout, int64_t rows,
                               int64_t cols, void* dpre, void* dbias, cudaStream_t s) {
  const Launch1D g = ColumnGeometry(cols);
  if (g.grid == 0) return cudaSuccess;
  switch (math::Format(fmt)) {
    case math::Format::kF32:
      GeluBiasGradAs<math::Format::kF32>(pre, dout, rows, cols, dpre, dbias, g, s);
      break;
    case math::Format::kBF16:
      GeluBiasGradAs<math::Format::kBF16>(pre, dout, rows, cols, dpre, dbias, g, s);
      break;
    case math::Format::kF16:
      GeluBiasGradAs<math::Format::kF16>(pre, dout, rows, cols, dpre, dbias, g, s);
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t LaunchSumAll(const float* a, int64_t n, float* out, double* partial, cudaStream_t s) {
  return SumAllAs<math::Format::kF32>(a, n, out, partial, s);
}

cudaError_t LaunchSumAllHalf(int fmt, const void* a, int64_t n, void* out, double* partial,
                             cudaStream_t s) {
  switch (math::Format(fmt)) {
    case math::Format::kBF16: return SumAllAs<math::Format::kBF16>(a, n, out, partial, s);
    case math::Format::kF16: return SumAllAs<math::Format::kF16>(a, n, out, partial, s);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t LaunchSumRows(const float* a, int64_t rows, int64_t cols, float* out, float beta,
                          cudaStream_t s) {
  const Launch1D g = ColumnGeometry(cols);
  if (g.grid == 0) return cudaSuccess;
  SumRowsKernel<<<g.grid, g.block, 0, s>>>(a, rows, cols, out, beta);
  return cudaGetLastError();
}

cudaError_t LaunchSumRowsHalf(int fmt, const void* a, int64_t rows, int64_t cols, void* out,
                              float beta, cudaStream_t s) {
  const Launch1D g = ColumnGeometry(cols);
  if (g.grid == 0) return cudaSuccess;
  switch (math::Format(fmt)) {
    case math::Format::kBF16:
      SumRowsHalfKernel<math::Format::kBF16><<<g.grid, g.block, 0, s>>>(
          static_cast<const math::Stored<math::Format::kBF16>*>(a), rows, cols,
          static_cast<math::Stored<math::Format::kBF16>*>(out), beta);
      break;
    case math::Format::kF16:
      SumRowsHalfKernel<math::Format::kF16><<<g.grid, g.block, 0, s>>>(
          static_cast<const math::Stored<math::Format::kF16>*>(a), rows, cols,
          static_cast<math::Stored<math::Format::kF16>*>(out), beta);
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace braid::cuda
