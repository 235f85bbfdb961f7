// Warp and block reductions shared by the row-wise kernels. The order is fixed (per-thread
// strided partials, xor butterflies over 32 lanes, then warp 0 over the warp results), so
// results are deterministic; backends/cuda/math/rows_math_test.cc runs the same order on the
// CPU (TreeSum) against the CPU backend.
#ifndef BRAID_BACKENDS_CUDA_KERNELS_REDUCE_H_
#define BRAID_BACKENDS_CUDA_KERNELS_REDUCE_H_

#include "backends/cuda/kernels/geometry.h"
#include "backends/cuda/math/rows.h"

namespace braid::cuda {

constexpr unsigned kFullMask = 0xffffffffu;

// A row-wise launch's block: threads_per_row x rows_per_block (RowwiseGeometry).
inline dim3 Block(const RowGeometry& g) {
  return dim3(unsigned(g.threads_per_row), unsigned(g.rows_per_block));
}

// The row this thread works on, or -1 past the end (a whole warp at once: warp-per-row only).
__device__ __forceinline__ int64_t ThisRow(int64_t rows) {
  const int64_t r = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  return r < rows ? r : -1;
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int off = 16; off >= 1; off >>= 1) v += __shfl_xor_sync(kFullMask, v, off);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
  for (int off = 16; off >= 1; off >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, off));
  return v;
}

__device__ __forceinline__ math::MaxSum WarpMaxSum(math::MaxSum v) {
  for (int off = 16; off >= 1; off >>= 1) {
    math::MaxSum o{__shfl_xor_sync(kFullMask, v.m, off), __shfl_xor_sync(kFullMask, v.s, off)};
    v = math::MaxSumMerge(v, o);
  }
  return v;
}

// Reductions over one row shared by blockDim.x threads (a multiple of 32). With blockDim.x ==
// 32 (several rows per block, one per threadIdx.y) a warp reduction; otherwise one row per
// block and `shared` holds 32 values. Every thread of the row gets the result.
__device__ __forceinline__ float RowSum(float v, float* shared) {
  v = WarpSum(v);
  if (blockDim.x == 32) return v;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();  // shared may still be read by a previous reduction
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < int(blockDim.x / 32) ? shared[lane] : 0.0f;
  return WarpSum(v);
}

__device__ __forceinline__ float RowMax(float v, float* shared) {
  v = WarpMax(v);
  if (blockDim.x == 32) return v;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < int(blockDim.x / 32) ? shared[lane] : -INFINITY;
  return WarpMax(v);
}

__device__ __forceinline__ math::MaxSum RowMaxSum(math::MaxSum v, float* shared) {
  v = WarpMaxSum(v);
  if (blockDim.x == 32) return v;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();
  if (lane == 0) {
    shared[2 * warp] = v.m;
    shared[2 * warp + 1] = v.s;
  }
  __syncthreads();
  v = lane < int(blockDim.x / 32) ? math::MaxSum{shared[2 * lane], shared[2 * lane + 1]}
                                  : math::MaxSumEmpty();
  return WarpMaxSum(v);
}

}  // namespace braid::cuda

#endif  // BRAID_BACKENDS_CUDA_KERNELS_REDUCE_H_
