// Row-wise CUDA kernels: LayerNorm, softmax, cross-entropy, embedding. One row per warp or per
// block (RowwiseGeometry), reductions in the fixed order of reduce.h, per-element math from
// backends/cuda/math/rows.h. Column sums over rows (LayerNorm's dweight/dbias, embedding
// backward) give each column one thread adding rows in order: deterministic, no atomics.
#include "backends/cuda/kernels/geometry.h"
#include "backends/cuda/kernels/launchers.h"
#include "backends/cuda/kernels/reduce.h"

namespace braid::cuda {
namespace {

using namespace braid::cuda::math;  // NOLINT: the per-element functions

// The row this thread works on, or -1 past the end (a whole warp at once: warp-per-row only).
__device__ __forceinline__ int64_t ThisRow(int64_t rows) {
  const int64_t r = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  return r < rows ? r : -1;
}

__global__ void LayerNormForwardKernel(const float* x, const float* w, const float* b, float eps,
                                       int64_t rows, int64_t c, float* out, float* mean,
                                       float* rstd) {
  __shared__ float shared[64];
  const int64_t r = ThisRow(rows);
  if (r < 0) return;
  const float* xr = x + r * c;
  float s = 0;
  for (int64_t i = threadIdx.x; i < c; i += blockDim.x) s += xr[i];
  const float mu = LayerNormMean(RowSum(s, shared), c);
  float q = 0;
  for (int64_t i = threadIdx.x; i < c; i += blockDim.x) q += LayerNormCentredSquare(xr[i], mu);
  const float rs = LayerNormRstd(RowSum(q, shared), c, eps);
  for (int64_t i = threadIdx.x; i < c; i += blockDim.x) {
    out[r * c + i] = LayerNormOut(xr[i], mu, rs, w[i], b[i]);
  }
  if (threadIdx.x == 0) {
    mean[r] = mu;
    rstd[r] = rs;
  }
}

__global__ void LayerNormDxKernel(const float* g, const float* x, const float* w,
                                  const float* mean, const float* rstd, int64_t rows, int64_t c,
                                  float* dx) {
  __shared__ float shared[64];
  const int64_t r = ThisRow(rows);
  if (r < 0) return;
  const float* gr = g + r * c;
  const float* xr = x + r * c;
  const float mu = mean[r], rs = rstd[r];
  float sdn = 0, sdnx = 0;
  for (int64_t i = threadIdx.x; i < c; i += blockDim.x) {
    const float dn = gr[i] * w[i];
    sdn += dn;
    sdnx += dn * LayerNormXhat(xr[i], mu, rs);
  }
  sdn = RowSum(sdn, shared);
  sdnx = RowSum(sdnx, shared);
  const float mdn = sdn / float(c), mdnx = sdnx / float(c);
  for (int64_t i = threadIdx.x; i < c; i += blockDim.x) {
    dx[r * c + i] = LayerNormDx(gr[i], w[i], LayerNormXhat(xr[i], mu, rs), mdn, mdnx, rs);
  }
}

// dweight[i] += sum_r g[r, i] xhat[r, i]; dbias[i] += sum_r g[r, i], rows in order.
__global__ void LayerNormDwDbKernel(const float* g, const float* x, const float* mean,
                                    const float* rstd, int64_t rows, int64_t c, float* dw,
                                    float* db) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= c) return;
  float sw = 0, sb = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float gi = g[r * c + i];
    sw += gi * LayerNormXhat(x[r * c + i], mean[r], rstd[r]);
    sb += gi;
  }
  dw[i] += sw;
  db[i] += sb;
}

// Softmax rows, and cross-entropy's when targets != nullptr (then losses too).
__global__ void SoftmaxKernel(const float* x, int64_t rows, int64_t c, float* out,
                              const int32_t* targets, float* losses) {
  __shared__ float shared[64];
  const int64_t r = ThisRow(rows);
  if (r < 0) return;
  const float* xr = x + r * c;
  MaxSum st = MaxSumEmpty();
  for (int64_t i = threadIdx.x; i < c; i += blockDim.x) st = MaxSumPush(st, xr[i]);
  st = RowMaxSum(st, shared);
  const float inv_s = 1.0f / st.s;
  for (int64_t i = threadIdx.x; i < c; i += blockDim.x) out[r * c + i] = SoftmaxProb(xr[i], st, inv_s);
  if (targets != nullptr && threadIdx.x == 0) {
    const int32_t t = targets[r];
    losses[r] = CrossEntropyLoss(st, t < 0 ? 0.0f : xr[t], t);
  }
}

__global__ void SoftmaxBackwardKernel(const float* y, const float* dy, int64_t rows, int64_t c,
                                      float* dx) {
  __shared__ float shared[64];
  const int64_t r = ThisRow(rows);
  if (r < 0) return;
  const float* yr = y + r * c;
  const float* gr = dy + r * c;
  float dot = 0;
  for (int64_t i = threadIdx.x; i < c; i += blockDim.x) dot += gr[i] * yr[i];
  dot = RowSum(dot, shared);
  for (int64_t i = threadIdx.x; i < c; i += blockDim.x) dx[r * c + i] = SoftmaxGrad(yr[i], gr[i], dot);
}

__global__ void CrossEntropyBackwardKernel(const float* probs, const int32_t* targets,
                                           const float* dloss, int64_t rows, int64_t v,
                                           float* dlogits) {
  const int64_t r = ThisRow(rows);
  if (r < 0) return;
  const int32_t t = targets[r];
  const float g = dloss[r];
  for (int64_t i = threadIdx.x; i < v; i += blockDim.x) {
    dlogits[r * v + i] = CrossEntropyGrad(probs[r * v + i], i, t, g);
  }
}

__global__ void EmbeddingForwardKernel(const float* weight, const int32_t* ids, int64_t n,
                                       int64_t c, float* out) {
  const int64_t r = ThisRow(n);
  if (r < 0) return;
  const float* src = weight + int64_t(ids[r]) * c;
  for (int64_t i = threadIdx.x; i < c; i += blockDim.x) out[r * c + i] = src[i];
}

// Column i of every row: positions in order, as the CPU backend (repeated ids collide in rows,
// never in columns).
__global__ void EmbeddingBackwardKernel(const float* dout, const int32_t* ids, int64_t n,
                                        int64_t c, float* dweight) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= c) return;
  for (int64_t r = 0; r < n; ++r) dweight[int64_t(ids[r]) * c + i] += dout[r * c + i];
}

dim3 Block(const RowGeometry& g) { return dim3(unsigned(g.threads_per_row), unsigned(g.rows_per_block)); }

// One block: each thread counts a strided share, the block adds the counts (integers: exact in
// any order), thread 0 writes 1 / count.
__global__ void InverseCountNonnegativeKernel(const int32_t* ids, int64_t n, float* out) {
  __shared__ unsigned long long total;
  if (threadIdx.x == 0) total = 0;
  __syncthreads();
  unsigned long long mine = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) mine += ids[i] >= 0;
  atomicAdd(&total, mine);
  __syncthreads();
  if (threadIdx.x == 0) out[0] = total > 0 ? 1.0f / float(total) : 0.0f;
}

}  // namespace

cudaError_t LaunchInverseCountNonnegative(const int32_t* ids, int64_t n, float* out,
                                          cudaStream_t s) {
  InverseCountNonnegativeKernel<<<1, 1024, 0, s>>>(ids, n, out);
  return cudaGetLastError();
}

cudaError_t LaunchLayerNormForward(const float* x, const float* w, const float* b, float eps,
                                   int64_t rows, int64_t cols, float* out, float* mean,
                                   float* rstd, cudaStream_t s) {
  const RowGeometry g = RowwiseGeometry(rows, cols);
  if (g.grid == 0 || cols == 0) return cudaSuccess;
  LayerNormForwardKernel<<<g.grid, Block(g), 0, s>>>(x, w, b, eps, rows, cols, out, mean, rstd);
  return cudaGetLastError();
}

cudaError_t LaunchLayerNormBackward(const float* dout, const float* x, const float* w,
                                    const float* mean, const float* rstd, int64_t rows,
                                    int64_t cols, float* dx, float* dw, float* db, cudaStream_t s) {
  const RowGeometry g = RowwiseGeometry(rows, cols);
  if (g.grid == 0 || cols == 0) return cudaSuccess;
  LayerNormDxKernel<<<g.grid, Block(g), 0, s>>>(dout, x, w, mean, rstd, rows, cols, dx);
  const Launch1D cg = ColumnGeometry(cols);
  LayerNormDwDbKernel<<<cg.grid, cg.block, 0, s>>>(dout, x, mean, rstd, rows, cols, dw, db);
  return cudaGetLastError();
}

cudaError_t LaunchSoftmaxForward(const float* x, int64_t rows, int64_t cols, float* out,
                                 cudaStream_t s) {
  const RowGeometry g = RowwiseGeometry(rows, cols);
  if (g.grid == 0 || cols == 0) return cudaSuccess;
  SoftmaxKernel<<<g.grid, Block(g), 0, s>>>(x, rows, cols, out, nullptr, nullptr);
  return cudaGetLastError();
}

cudaError_t LaunchSoftmaxBackward(const float* y, const float* dy, int64_t rows, int64_t cols,
                                  float* dx, cudaStream_t s) {
  const RowGeometry g = RowwiseGeometry(rows, cols);
  if (g.grid == 0 || cols == 0) return cudaSuccess;
  SoftmaxBackwardKernel<<<g.grid, Block(g), 0, s>>>(y, dy, rows, cols, dx);
  return cudaGetLastError();
}

cudaError_t LaunchCrossEntropyForward(const float* logits, const int32_t* targets, int64_t rows,
                                      int64_t vocab, float* losses, float* probs, cudaStream_t s) {
  const RowGeometry g = RowwiseGeometry(rows, vocab);
  if (g.grid == 0 || vocab == 0) return cudaSuccess;
  SoftmaxKernel<<<g.grid, Block(g), 0, s>>>(logits, rows, vocab, probs, targets, losses);
  return cudaGetLastError();
}

cudaError_t LaunchCrossEntropyBackward(const float* probs, const int32_t* targets,
                                       const float* dloss, int64_t rows, int64_t vocab,
                                       float* dlogits, cudaStream_t s) {
  const RowGeometry g = RowwiseGeometry(rows, vocab);
  if (g.grid == 0 || vocab == 0) return cudaSuccess;
  CrossEntropyBackwardKernel<<<g.grid, Block(g), 0, s>>>(probs, targets, dloss, rows, vocab, dlogits);
  return cudaGetLastError();
}

cudaError_t LaunchEmbeddingForward(const float* weight, const int32_t* ids, int64_t n,
                                   int64_t cols, float* out, cudaStream_t s) {
  const RowGeometry g = RowwiseGeometry(n, cols);
  if (g.grid == 0 || cols == 0) return cudaSuccess;
  EmbeddingForwardKernel<<<g.grid, Block(g), 0, s>>>(weight, ids, n, cols, out);
  return cudaGetLastError();
}

cudaError_t LaunchEmbeddingBackward(const float* dout, const int32_t* ids, int64_t n,
                                    int64_t cols, float* dweight, cudaStream_t s) {
  const Launch1D g = ColumnGeometry(cols);
  if (g.grid == 0 || n == 0) return cudaSuccess;
  EmbeddingBackwardKernel<<<g.grid, g.block, 0, s>>>(dout, ids, n, cols, dweight);
  return cudaGetLastError();
}

}  // namespace braid::cuda
