// The Llama-family CUDA kernels (f32; bf16/f16 go through the table's up-cast fallbacks):
// RMSNorm, SiLU/SwiGLU, the rotary embedding, dropout, grouped-query attention. The per-element
// math is backends/cuda/math/llama.h's, the source llama_math_test.cc checks on the CPU against
// the CPU backend. Every sum has a fixed order and no atomics, so results are deterministic:
// RMSNorm's row sums in reduce.h's tree, its weight gradient one thread per column adding rows in
// order (as sum_rows), the attention's K/V gradients one thread per (K/V head, position, channel)
// adding its group's query heads, then positions, in order.
//
// The attention is the probability-saving reference (att [B, H, T, T] is the slot's contract, as
// attention_forward's): one block per query row, quadratic in T in memory. It is what makes
// llama run on a GPU at all; a fused (flash) path for grouped K/V heads is left for later.
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

// ---- Grouped-query attention -----------------------------------------------------------------
//
// q, out, dq, dout: [B, T, H, D]; k, v, dk, dv: [B, T, Hkv, D]; att, ds: [B, H, T, T]. Query
// head h reads K/V head h / (H / Hkv).

struct GqaShape {
  int64_t b, t, h, hkv, d;
  float scale;
};

// One block per (b, h, query position): the scores of keys 0..tq into att's row, the row's max
// and sum (reduce.h's order), the probabilities (zero above the diagonal), then out's D channels.
__global__ void GqaForwardKernel(const float* q, const float* k, const float* v, GqaShape s,
                                 float* out, float* att) {
  __shared__ float shared[64];
  const int64_t row = blockIdx.x;  // (b * H + h) * T + tq
  const int64_t tq = row % s.t, bh = row / s.t, h = bh % s.h, b = bh / s.h;
  const int64_t g = h / (s.h / s.hkv);
  const float* qr = q + ((b * s.t + tq) * s.h + h) * s.d;
  float* ar = att + row * s.t;
  float m = -INFINITY;
  for (int64_t u = threadIdx.x; u < s.t; u += blockDim.x) {
    if (u > tq) {
      ar[u] = 0.0f;
      continue;
    }
    const float* kr = k + ((b * s.t + u) * s.hkv + g) * s.d;
    float dot = 0;
    for (int64_t i = 0; i < s.d; ++i) dot += qr[i] * kr[i];
    const float sc = dot * s.scale;
    ar[u] = sc;
    m = fmaxf(m, sc);
  }
  m = RowMax(m, shared);
  float sum = 0;
  for (int64_t u = threadIdx.x; u <= tq; u += blockDim.x) {
    const float e = expf(ar[u] - m);
    ar[u] = e;
    sum += e;
  }
  const float inv = 1.0f / RowSum(sum, shared);
  for (int64_t u = threadIdx.x; u <= tq; u += blockDim.x) ar[u] *= inv;
  __syncthreads();  // the row's probabilities, written by every thread, read by every thread
  float* orow = out + ((b * s.t + tq) * s.h + h) * s.d;
  for (int64_t i = threadIdx.x; i < s.d; i += blockDim.x) {
    float acc = 0;
    for (int64_t u = 0; u <= tq; ++u) acc += ar[u] * v[((b * s.t + u) * s.hkv + g) * s.d + i];
    orow[i] = acc;
  }
}

// One block per (b, h, query position): dP = dout . v, dS = att (dP - sum(att dP)) into ds's
// row, then dq = scale dS k.
__global__ void GqaDsDqKernel(const float* dout, const float* k, const float* v, const float* att,
                              GqaShape s, float* ds, float* dq) {
  __shared__ float shared[64];
  const int64_t row = blockIdx.x;
  const int64_t tq = row % s.t, bh = row / s.t, h = bh % s.h, b = bh / s.h;
  const int64_t g = h / (s.h / s.hkv);
  const float* gr = dout + ((b * s.t + tq) * s.h + h) * s.d;
  const float* ar = att + row * s.t;
  float* dr = ds + row * s.t;
  float dot = 0;
  for (int64_t u = threadIdx.x; u < s.t; u += blockDim.x) {
    if (u > tq) {
      dr[u] = 0.0f;
      continue;
    }
    const float* vr = v + ((b * s.t + u) * s.hkv + g) * s.d;
    float dp = 0;
    for (int64_t i = 0; i < s.d; ++i) dp += gr[i] * vr[i];
    dr[u] = dp;
    dot += ar[u] * dp;
  }
  dot = RowSum(dot, shared);
  for (int64_t u = threadIdx.x; u <= tq; u += blockDim.x) dr[u] = ar[u] * (dr[u] - dot);
  __syncthreads();
  float* dqr = dq + ((b * s.t + tq) * s.h + h) * s.d;
  for (int64_t i = threadIdx.x; i < s.d; i += blockDim.x) {
    float acc = 0;
    for (int64_t u = 0; u <= tq; ++u) acc += dr[u] * k[((b * s.t + u) * s.hkv + g) * s.d + i];
    dqr[i] = acc * s.scale;
  }
}

// One thread per (b, K/V head, key position, channel): dk = scale sum dS q and dv = sum att
// dout over the group's query heads (in order) and the query positions at or after the key.
__global__ void GqaDkDvKernel(const float* dout, const float* q, const float* att, const float* ds,
                             GqaShape s, float* dk, float* dv) {
  const int64_t group = s.h / s.hkv;
  BRAID_GRID_STRIDE(j, s.b * s.t * s.hkv * s.d) {
    const int64_t i = j % s.d, g = (j / s.d) % s.hkv, u = (j / (s.d * s.hkv)) % s.t;
    const int64_t b = j / (s.d * s.hkv * s.t);
    float acc_k = 0, acc_v = 0;
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      for (int64_t tq = u; tq < s.t; ++tq) {
        const int64_t a = ((b * s.h + h) * s.t + tq) * s.t + u;
        const int64_t o = ((b * s.t + tq) * s.h + h) * s.d + i;
        acc_k += ds[a] * q[o];
        acc_v += att[a] * dout[o];
      }
    }
    dk[j] = acc_k * s.scale;
    dv[j] = acc_v;
  }
}

// The block of a one-row-per-block kernel: a warp for short rows, up to 256 threads.
int RowBlock(int64_t cols) { return cols <= 32 ? 32 : cols <= 64 ? 64 : cols <= 128 ? 128 : 256; }

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

cudaError_t LaunchGqaForward(const float* q, const float* k, const float* v, int64_t b,
                             int64_t t, int64_t h, int64_t hkv, int64_t d, float* out, float* att,
                             cudaStream_t s) {
  if (b * h * t == 0) return cudaSuccess;
  const GqaShape shape{b, t, h, hkv, d, float(1.0 / sqrt(double(d)))};
  GqaForwardKernel<<<unsigned(b * h * t), RowBlock(t), 0, s>>>(q, k, v, shape, out, att);
  return cudaGetLastError();
}

cudaError_t LaunchGqaBackward(const float* dout, const float* q, const float* k, const float* v,
                              const float* att, int64_t b, int64_t t, int64_t h, int64_t hkv,
                              int64_t d, float* ds_scratch, float* dq, float* dk, float* dv,
                              cudaStream_t s) {
  if (b * h * t == 0) return cudaSuccess;
  const GqaShape shape{b, t, h, hkv, d, float(1.0 / sqrt(double(d)))};
  GqaDsDqKernel<<<unsigned(b * h * t), RowBlock(t), 0, s>>>(dout, k, v, att, shape, ds_scratch, dq);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  const Launch1D g = ElementwiseGeometry(b * t * hkv * d);
  GqaDkDvKernel<<<g.grid, g.block, 0, s>>>(dout, q, att, ds_scratch, shape, dk, dv);
  return cudaGetLastError();
}

}  // namespace braid::cuda
