// The Llama-family CUDA kernels (f32; bf16/f16 go through the table's up-cast fallbacks):
// RMSNorm, SiLU/SwiGLU, the rotary embedding, dropout (grouped-query attention is attention.cu's
// reference kernels, which serve multi-head attention as the case of one query head per K/V
// head). The per-element math is backends/cuda/math/llama.h's, the source llama_math_test.cc
// checks on the CPU against the CPU backend. Every sum has a fixed order and no atomics, so
// results are deterministic: RMSNorm's row sums in reduce.h's tree, its weight gradient one thread
// per column adding rows in order (as sum_rows).
#include "backends/cuda/kernels/geometry.h"
#include "backends/cuda/kernels/llama_launch.h"
#include "backends/cuda/kernels/reduce.h"
#include "backends/cuda/math/llama.h"

namespace braid::cuda {
namespace {

#define BRAID_GRID_STRIDE(i, n)                                              \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += int64_t(gridDim.x) * blockDim.x)

// ---- RMSNorm ---------------------------------------------------------------------------------

__global__ void RmsNormForwardKernel(const float* x, const float* w, float eps, int64_t rows,
                                     int64_t c, float* out, float* rstd) {
  __shared__ float shared[64];
  const int64_t r = ThisRow(rows);
  if (r < 0) return;
  const float* xr = x + r * c;
  float q = 0;
  for (int64_t i = threadIdx.x; i < c; i += blockDim.x) q += xr[i] * xr[i];
  const float rs = math::RmsNormRstd(RowSum(q, shared), c, eps);
  for (int64_t i = threadIdx.x; i < c; i += blockDim.x) {
    out[r * c + i] = math::RmsNormOut(xr[i], rs, w[i]);
  }
  if (threadIdx.x == 0) rstd[r] = rs;
}

__global__ void RmsNormDxKernel(const float* g, const float* x, const float* w, const float* rstd,
                                int64_t rows, int64_t c, float* dx) {
  __shared__ float shared[64];
  const int64_t r = ThisRow(rows);
  if (r < 0) return;
  const float* gr = g + r * c;
  const float* xr = x + r * c;
  const float rs = rstd[r];
  float dot = 0;
  for (int64_t i = threadIdx.x; i < c; i += blockDim.x) dot += (gr[i] * w[i]) * xr[i];
  const float k = math::RmsNormK(rs, RowSum(dot, shared), c);
  for (int64_t i = threadIdx.x; i < c; i += blockDim.x) {
    dx[r * c + i] = math::RmsNormDx(gr[i] * w[i], xr[i], rs, k);
  }
}

// dweight[i] += sum over rows, in order, of g x rstd: one thread per column.
__global__ void RmsNormDwKernel(const float* g, const float* x, const float* rstd, int64_t rows,
                                int64_t c, float* dw) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= c) return;
  float acc = 0;
  for (int64_t r = 0; r < rows; ++r) {
    acc += math::RmsNormDwTerm(g[r * c + i], x[r * c + i], rstd[r]);
  }
  dw[i] += acc;
}

// ---- SiLU / SwiGLU, dropout -----------------------------------------------------------------

__global__ void SwiGluForwardKernel(const float* gate, const float* up, float* out, int64_t n) {
  BRAID_GRID_STRIDE(i, n) out[i] = math::SwiGlu(gate[i], up != nullptr ? up + i : nullptr);
}

__global__ void SwiGluBackwardKernel(const float* dout, const float* gate, const float* up,
                                     float* dgate, float* dup, int64_t n) {
  BRAID_GRID_STRIDE(i, n) {
    const float u = up != nullptr ? up[i] : 1.0f;
    dgate[i] = math::SwiGluDgate(dout[i], gate[i], u);
    if (dup != nullptr) dup[i] = math::SwiGluDup(dout[i], gate[i]);
  }
}

__global__ void DropoutKernel(const float* x, float p, uint64_t seed, float* out, int64_t n) {
  const float scale = math::DropoutScale(p);
  BRAID_GRID_STRIDE(i, n) out[i] = math::DropoutKeep(seed, uint64_t(i), p) ? x[i] * scale : 0.0f;
}

// ---- Rotary embedding ------------------------------------------------------------------------

// cos and sin per (time step, frequency), formed in double once per call (T * D/2 of them)
// and shared by every batch entry and head, as the CPU's table.
__global__ void RopeTableKernel(int64_t steps, int64_t dim, double theta, double position_scale,
                                int64_t position_offset, bool inverse, float* cs, float* sn) {
  const int64_t half = dim / 2;
  BRAID_GRID_STRIDE(j, steps * half) {
    const int64_t t = j / half, i = j % half;
    const double pos = double(position_offset + t) / position_scale;
    math::RopeCosSin(pos, i, dim, theta, inverse, &cs[j], &sn[j]);
  }
}

// x, out: [B, T, H, D]; one thread per (row, frequency) pair.
__global__ void RopeKernel(const float* x, const float* cs, const float* sn, int64_t t_steps,
                           int64_t heads, int64_t dim, int64_t pairs, float* out) {
  const int64_t half = dim / 2;
  BRAID_GRID_STRIDE(j, pairs) {
    const int64_t r = j / half, i = j % half;
    const int64_t t = (r / heads) % t_steps;
    const float* xr = x + r * dim;
    float* o = out + r * dim;
    // Both reads before either write: out may alias x.
    const float a = xr[i], b = xr[i + half];
    math::RopeRotate(a, b, cs[t * half + i], sn[t * half + i], &o[i], &o[i + half]);
  }
}

}  // namespace

cudaError_t LaunchRmsNormForward(const float* x, const float* w, float eps, int64_t rows,
                                 int64_t cols, float* out, float* rstd, cudaStream_t s) {
  const RowGeometry g = RowwiseGeometry(rows, cols);
  if (g.grid == 0 || cols == 0) return cudaSuccess;
  RmsNormForwardKernel<<<g.grid, Block(g), 0, s>>>(x, w, eps, rows, cols, out, rstd);
  return cudaGetLastError();
}

cudaError_t LaunchRmsNormBackward(const float* dout, const float* x, const float* w,
                                  const float* rstd, int64_t rows, int64_t cols, float* dx,
                                  float* dw, cudaStream_t s) {
  const RowGeometry g = RowwiseGeometry(rows, cols);
  if (g.grid == 0 || cols == 0) return cudaSuccess;
  RmsNormDxKernel<<<g.grid, Block(g), 0, s>>>(dout, x, w, rstd, rows, cols, dx);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  const Launch1D c = ColumnGeometry(cols);
  RmsNormDwKernel<<<c.grid, c.block, 0, s>>>(dout, x, rstd, rows, cols, dw);
  return cudaGetLastError();
}

cudaError_t LaunchSwiGluForward(const float* gate, const float* up, float* out, int64_t n,
                                cudaStream_t s) {
  const Launch1D g = ElementwiseGeometry(n);
  if (g.grid == 0) return cudaSuccess;
  SwiGluForwardKernel<<<g.grid, g.block, 0, s>>>(gate, up, out, n);
  return cudaGetLastError();
}

cudaError_t LaunchSwiGluBackward(const float* dout, const float* gate, const float* up,
                                 float* dgate, float* dup, int64_t n, cudaStream_t s) {
  const Launch1D g = ElementwiseGeometry(n);
  if (g.grid == 0) return cudaSuccess;
  SwiGluBackwardKernel<<<g.grid, g.block, 0, s>>>(dout, gate, up, dgate, dup, n);
  return cudaGetLastError();
}

cudaError_t LaunchDropout(const float* x, float p, uint64_t seed, float* out, int64_t n,
                          cudaStream_t s) {
  const Launch1D g = ElementwiseGeometry(n);
  if (g.grid == 0) return cudaSuccess;
  DropoutKernel<<<g.grid, g.block, 0, s>>>(x, p, seed, out, n);
  return cudaGetLastError();
}

cudaError_t LaunchRope(const float* x, const RopeLaunch& p, float* table, float* out,
                       cudaStream_t s) {
  const int64_t half = p.d / 2, rows = p.b * p.t * p.h;
  if (rows == 0 || half == 0) return cudaSuccess;
  float* cs = table;
  float* sn = table + p.t * half;
  const Launch1D tg = ElementwiseGeometry(p.t * half);
  RopeTableKernel<<<tg.grid, tg.block, 0, s>>>(p.t, p.d, p.theta, p.position_scale,
                                               p.position_offset, p.inverse, cs, sn);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  const Launch1D g = ElementwiseGeometry(rows * half);
  RopeKernel<<<g.grid, g.block, 0, s>>>(x, cs, sn, p.t, p.h, p.d, rows * half, out);
  return cudaGetLastError();
}

}  // namespace braid::cuda
