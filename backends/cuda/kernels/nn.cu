// Row-wise CUDA kernels: LayerNorm, softmax, cross-entropy, embedding, on f32, bf16 or f16
// storage: templates on math::Format, with f32 sums and row statistics and one rounding per
// stored output (rows.h, the math rows_math_test.cc and rows_half_math_test.cc check against the
// CPU backend). One row per warp or per block (RowwiseGeometry), reductions in the fixed order of
// reduce.h. Column sums over rows are deterministic, with no atomics: LayerNorm's dweight/dbias
// give each (row slice, column) one thread, the slices then added in the CPU's order; the f32
// embedding backward one thread per column adding positions in order; the half one sorts the positions by id
// (cub's stable radix sort) and gives each id's run one row of threads with an f32 accumulator,
// as the CPU's half kernel.
#include <cub/device/device_radix_sort.cuh>

#include "backends/cuda/kernels/geometry.h"
#include "backends/cuda/kernels/launchers.h"
#include "backends/cuda/kernels/reduce.h"
#include "backends/cuda/kernels/rows_half_launch.h"

namespace braid::cuda {
namespace {

using namespace braid::cuda::math;  // NOLINT: the per-element functions

template <Format F>
__global__ void LayerNormForwardKernel(const Stored<F>* x, const Stored<F>* w,
                                       const Stored<F>* b, float eps, int64_t rows, int64_t c,
                                       Stored<F>* out, float* mean, float* rstd) {
  __shared__ float shared[64];
  const int64_t r = ThisRow(rows);
  if (r < 0) return;
  const Stored<F>* xr = x + r * c;
  float s = 0;
  for (int64_t i = threadIdx.x; i < c; i += blockDim.x) s += LoadF32<F>(xr[i]);
  const float mu = LayerNormMean(RowSum(s, shared), c);
  float q = 0;
  for (int64_t i = threadIdx.x; i < c; i += blockDim.x) {
    q += LayerNormCentredSquare(LoadF32<F>(xr[i]), mu);
  }
  const float rs = LayerNormRstd(RowSum(q, shared), c, eps);
  for (int64_t i = threadIdx.x; i < c; i += blockDim.x) {
    out[r * c + i] = LayerNormOutStored<F>(xr[i], mu, rs, w[i], b[i]);
  }
  if (threadIdx.x == 0) {
    mean[r] = mu;
    rstd[r] = rs;
  }
}

template <Format F>
__global__ void LayerNormDxKernel(const Stored<F>* g, const Stored<F>* x, const Stored<F>* w,
                                  const float* mean, const float* rstd, int64_t rows, int64_t c,
                                  Stored<F>* dx) {
  __shared__ float shared[64];
  const int64_t r = ThisRow(rows);
  if (r < 0) return;
  const Stored<F>* gr = g + r * c;
  const Stored<F>* xr = x + r * c;
  const float mu = mean[r], rs = rstd[r];
  float sdn = 0, sdnx = 0;
  for (int64_t i = threadIdx.x; i < c; i += blockDim.x) {
    sdn += LayerNormDn<F>(gr[i], w[i]);
    sdnx += LayerNormDnXhat<F>(gr[i], w[i], xr[i], mu, rs);
  }
  sdn = RowSum(sdn, shared);
  sdnx = RowSum(sdnx, shared);
  const float mdn = sdn / float(c), mdnx = sdnx / float(c);
  for (int64_t i = threadIdx.x; i < c; i += blockDim.x) {
    dx[r * c + i] = LayerNormDxStored<F>(gr[i], w[i], xr[i], mu, rs, mdn, mdnx);
  }
}

// dweight[i] += sum_r g[r, i] xhat[r, i]; dbias[i] += sum_r g[r, i], in the CPU's order
// (rows.h): a blocked two-pass column reduction. A block holds 32 columns (a warp's lanes, so
// each row's loads are coalesced) by kLayerNormSlices warps, warp s summing row slice s of its
// lane's column into shared memory (pass 1); then warp 0 adds the slices in order to the stored
// value and rounds once (pass 2). 16 threads per column instead of one (at GPT-2's 768 columns:
// 12,288 threads, not 768), each running 1/16 of the rows, and no scratch in device memory.
constexpr int kDwDbColumns = 32;
constexpr int kDwDbThreads = kDwDbColumns * int(kLayerNormSlices);

template <Format F>
__global__ void LayerNormDwDbKernel(const Stored<F>* g, const Stored<F>* x, const float* mean,
                                    const float* rstd, int64_t rows, int64_t c, Stored<F>* dw,
                                    Stored<F>* db) {
  __shared__ float pw[kLayerNormSlices][kDwDbColumns], pb[kLayerNormSlices][kDwDbColumns];
  const int lane = int(threadIdx.x) % kDwDbColumns, s = int(threadIdx.x) / kDwDbColumns;
  const int64_t i = int64_t(blockIdx.x) * kDwDbColumns + lane;
  const int64_t slices = LayerNormSliceCount(rows);
  if (i < c && s < slices) {
    LayerNormDwDbSlice<F>(g, x, mean, rstd, rows, c, i, s, slices, &pw[s][lane], &pb[s][lane]);
  }
  __syncthreads();
  if (s != 0 || i >= c) return;
  dw[i] = AddSlicesStored<F>(dw[i], &pw[0][lane], slices, kDwDbColumns);
  db[i] = AddSlicesStored<F>(db[i], &pb[0][lane], slices, kDwDbColumns);
}

// Softmax rows (probabilities stored as O: the input's format), and cross-entropy's when
// targets != nullptr (then O is f32, and losses are written too).
template <Format F, Format O>
__global__ void SoftmaxKernel(const Stored<F>* x, int64_t rows, int64_t c, Stored<O>* out,
                              const int32_t* targets, float* losses) {
  __shared__ float shared[64];
  const int64_t r = ThisRow(rows);
  if (r < 0) return;
  const Stored<F>* xr = x + r * c;
  MaxSum st = MaxSumEmpty();
  for (int64_t i = threadIdx.x; i < c; i += blockDim.x) st = MaxSumPush(st, LoadF32<F>(xr[i]));
  st = RowMaxSum(st, shared);
  const float inv_s = 1.0f / st.s;
  for (int64_t i = threadIdx.x; i < c; i += blockDim.x) {
    out[r * c + i] = StoreAs<O>(SoftmaxProb(LoadF32<F>(xr[i]), st, inv_s));
  }
  if (targets != nullptr && threadIdx.x == 0) {
    const int32_t t = targets[r];
    losses[r] = CrossEntropyLoss(st, t < 0 ? 0.0f : LoadF32<F>(xr[t]), t);
  }
}

template <Format F>
__global__ void SoftmaxBackwardKernel(const Stored<F>* y, const Stored<F>* dy, int64_t rows,
                                      int64_t c, Stored<F>* dx) {
  __shared__ float shared[64];
  const int64_t r = ThisRow(rows);
  if (r < 0) return;
  const Stored<F>* yr = y + r * c;
  const Stored<F>* gr = dy + r * c;
  float dot = 0;
  for (int64_t i = threadIdx.x; i < c; i += blockDim.x) dot += SoftmaxDotTerm<F>(yr[i], gr[i]);
  dot = RowSum(dot, shared);
  for (int64_t i = threadIdx.x; i < c; i += blockDim.x) {
    dx[r * c + i] = SoftmaxGradStored<F>(yr[i], gr[i], dot);
  }
}

template <Format F>
__global__ void CrossEntropyBackwardKernel(const float* probs, const int32_t* targets,
                                           const float* dloss, int64_t rows, int64_t v,
                                           Stored<F>* dlogits) {
  const int64_t r = ThisRow(rows);
  if (r < 0) return;
  const int32_t t = targets[r];
  const float g = dloss[r];
  for (int64_t i = threadIdx.x; i < v; i += blockDim.x) {
    dlogits[r * v + i] = CrossEntropyGradStored<F>(probs[r * v + i], i, t, g);
  }
}

// A gather of whole rows: T is float or the 16 bits of a bf16/f16 (no arithmetic).
template <typename T>
__global__ void EmbeddingForwardKernel(const T* weight, const int32_t* ids, int64_t n, int64_t c,
                                       T* out) {
  const int64_t r = ThisRow(n);
  if (r < 0) return;
  const T* src = weight + int64_t(ids[r]) * c;
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

__global__ void IotaKernel(int32_t* v, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    v[i] = int32_t(i);
  }
}

// Half embedding backward over the positions sorted by id (`order`, with their ids in
// `sorted_ids`): one row of threads per sorted position; the first of each id's run adds the run
// into the table row, column by column, in an f32 accumulator (rows.h's EmbeddingGradColumn).
// Distinct ids own distinct table rows: no two rows of threads write the same element.
template <Format F>
__global__ void EmbeddingBackwardSortedKernel(const Stored<F>* dout, const int32_t* sorted_ids,
                                              const int32_t* order, int64_t n, int64_t c,
                                              Stored<F>* dweight) {
  const int64_t k = ThisRow(n);
  if (k < 0) return;
  const int32_t id = sorted_ids[k];
  if (k > 0 && sorted_ids[k - 1] == id) return;
  int64_t end = k + 1;
  while (end < n && sorted_ids[end] == id) ++end;
  for (int64_t i = threadIdx.x; i < c; i += blockDim.x) {
    Stored<F>& w = dweight[int64_t(id) * c + i];
    w = EmbeddingGradColumn<F>(w, dout, order, k, end, c, i);
  }
}

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

// ---- f32 ----------------------------------------------------------------------------------
constexpr Format kF32 = Format::kF32;

cudaError_t LaunchLayerNormForward(const float* x, const float* w, const float* b, float eps,
                                   int64_t rows, int64_t cols, float* out, float* mean,
                                   float* rstd, cudaStream_t s) {
  return LaunchLayerNormForwardHalf(int(kF32), x, w, b, eps, rows, cols, out, mean, rstd, s);
}

cudaError_t LaunchLayerNormBackward(const float* dout, const float* x, const float* w,
                                    const float* mean, const float* rstd, int64_t rows,
                                    int64_t cols, float* dx, float* dw, float* db, cudaStream_t s) {
  return LaunchLayerNormBackwardHalf(int(kF32), dout, x, w, mean, rstd, rows, cols, dx, dw, db, s);
}

cudaError_t LaunchSoftmaxForward(const float* x, int64_t rows, int64_t cols, float* out,
                                 cudaStream_t s) {
  return LaunchSoftmaxForwardHalf(int(kF32), x, rows, cols, out, s);
}

cudaError_t LaunchSoftmaxBackward(const float* y, const float* dy, int64_t rows, int64_t cols,
                                  float* dx, cudaStream_t s) {
  return LaunchSoftmaxBackwardHalf(int(kF32), y, dy, rows, cols, dx, s);
}

cudaError_t LaunchCrossEntropyForward(const float* logits, const int32_t* targets, int64_t rows,
                                      int64_t vocab, float* losses, float* probs, cudaStream_t s) {
  return LaunchCrossEntropyForwardHalf(int(kF32), logits, targets, rows, vocab, losses, probs, s);
}

cudaError_t LaunchCrossEntropyBackward(const float* probs, const int32_t* targets,
                                       const float* dloss, int64_t rows, int64_t vocab,
                                       float* dlogits, cudaStream_t s) {
  return LaunchCrossEntropyBackwardHalf(int(kF32), probs, targets, dloss, rows, vocab, dlogits, s);
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

// ---- Any storage format (rows_half_launch.h) -------------------------------------------------
namespace {

// Calls launch(FormatTag<F>{}) for the format code; cudaErrorInvalidValue for another code.
template <typename Fn>
cudaError_t WithFormat(int fmt, Fn&& launch) {
  switch (Format(fmt)) {
    case Format::kF32: launch(FormatTag<Format::kF32>{}); break;
    case Format::kBF16: launch(FormatTag<Format::kBF16>{}); break;
    case Format::kF16: launch(FormatTag<Format::kF16>{}); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

template <Format F>
const Stored<F>* As(const void* p) {
  return static_cast<const Stored<F>*>(p);
}
template <Format F>
Stored<F>* As(void* p) {
  return static_cast<Stored<F>*>(p);
}

// The sort's key bits: ids lie in [0, vocab).
int IdBits(int64_t vocab) {
  int bits = 1;
  while (bits < 31 && (int64_t(1) << bits) < vocab) ++bits;
  return bits;
}

size_t Aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

// cub's temporary storage for sorting n (id, position) pairs.
cudaError_t SortTempBytes(int64_t n, int64_t vocab, size_t* bytes) {
  return cub::DeviceRadixSort::SortPairs(nullptr, *bytes, static_cast<const int32_t*>(nullptr),
                                         static_cast<int32_t*>(nullptr),
                                         static_cast<const int32_t*>(nullptr),
                                         static_cast<int32_t*>(nullptr), int(n), 0,
                                         IdBits(vocab));
}

}  // namespace

cudaError_t LaunchLayerNormForwardHalf(int fmt, const void* x, const void* w, const void* b,
                                       float eps, int64_t rows, int64_t cols, void* out,
                                       float* mean, float* rstd, cudaStream_t s) {
  const RowGeometry g = RowwiseGeometry(rows, cols);
  if (g.grid == 0 || cols == 0) return cudaSuccess;
  return WithFormat(fmt, [&](auto f) {
    constexpr Format F = decltype(f)::value;
    LayerNormForwardKernel<F><<<g.grid, Block(g), 0, s>>>(As<F>(x), As<F>(w), As<F>(b), eps, rows,
                                                          cols, As<F>(out), mean, rstd);
  });
}

cudaError_t LaunchLayerNormBackwardHalf(int fmt, const void* dout, const void* x, const void* w,
                                        const float* mean, const float* rstd, int64_t rows,
                                        int64_t cols, void* dx, void* dw, void* db,
                                        cudaStream_t s) {
  const RowGeometry g = RowwiseGeometry(rows, cols);
  if (g.grid == 0 || cols == 0) return cudaSuccess;
  const unsigned column_blocks = unsigned((cols + kDwDbColumns - 1) / kDwDbColumns);
  return WithFormat(fmt, [&](auto f) {
    constexpr Format F = decltype(f)::value;
    LayerNormDxKernel<F><<<g.grid, Block(g), 0, s>>>(As<F>(dout), As<F>(x), As<F>(w), mean, rstd,
                                                     rows, cols, As<F>(dx));
    LayerNormDwDbKernel<F><<<column_blocks, kDwDbThreads, 0, s>>>(
        As<F>(dout), As<F>(x), mean, rstd, rows, cols, As<F>(dw), As<F>(db));
  });
}

cudaError_t LaunchSoftmaxForwardHalf(int fmt, const void* x, int64_t rows, int64_t cols,
                                     void* out, cudaStream_t s) {
  const RowGeometry g = RowwiseGeometry(rows, cols);
  if (g.grid == 0 || cols == 0) return cudaSuccess;
  return WithFormat(fmt, [&](auto f) {
    constexpr Format F = decltype(f)::value;
    SoftmaxKernel<F, F><<<g.grid, Block(g), 0, s>>>(As<F>(x), rows, cols, As<F>(out), nullptr,
                                                    nullptr);
  });
}

cudaError_t LaunchSoftmaxBackwardHalf(int fmt, const void* y, const void* dy, int64_t rows,
                                      int64_t cols, void* dx, cudaStream_t s) {
  const RowGeometry g = RowwiseGeometry(rows, cols);
  if (g.grid == 0 || cols == 0) return cudaSuccess;
  return WithFormat(fmt, [&](auto f) {
    constexpr Format F = decltype(f)::value;
    SoftmaxBackwardKernel<F><<<g.grid, Block(g), 0, s>>>(As<F>(y), As<F>(dy), rows, cols,
                                                         As<F>(dx));
  });
}

cudaError_t LaunchCrossEntropyForwardHalf(int fmt, const void* logits, const int32_t* targets,
                                          int64_t rows, int64_t vocab, float* losses,
                                          float* probs, cudaStream_t s) {
  const RowGeometry g = RowwiseGeometry(rows, vocab);
  if (g.grid == 0 || vocab == 0) return cudaSuccess;
  return WithFormat(fmt, [&](auto f) {
    constexpr Format F = decltype(f)::value;
    SoftmaxKernel<F, kF32><<<g.grid, Block(g), 0, s>>>(As<F>(logits), rows, vocab, probs, targets,
                                                       losses);
  });
}

cudaError_t LaunchCrossEntropyBackwardHalf(int fmt, const float* probs, const int32_t* targets,
                                           const float* dloss, int64_t rows, int64_t vocab,
                                           void* dlogits, cudaStream_t s) {
  const RowGeometry g = RowwiseGeometry(rows, vocab);
  if (g.grid == 0 || vocab == 0) return cudaSuccess;
  return WithFormat(fmt, [&](auto f) {
    constexpr Format F = decltype(f)::value;
    CrossEntropyBackwardKernel<F><<<g.grid, Block(g), 0, s>>>(probs, targets, dloss, rows, vocab,
                                                              As<F>(dlogits));
  });
}

cudaError_t LaunchEmbeddingForwardHalf(const void* weight, const int32_t* ids, int64_t n,
                                       int64_t cols, void* out, cudaStream_t s) {
  const RowGeometry g = RowwiseGeometry(n, cols);
  if (g.grid == 0 || cols == 0) return cudaSuccess;
  EmbeddingForwardKernel<<<g.grid, Block(g), 0, s>>>(static_cast<const uint16_t*>(weight), ids, n,
                                                     cols, static_cast<uint16_t*>(out));
  return cudaGetLastError();
}

cudaError_t EmbeddingBackwardHalfScratchBytes(int64_t n, int64_t vocab, size_t* bytes) {
  *bytes = 0;
  if (n <= 0) return cudaSuccess;
  if (n > INT32_MAX) return cudaErrorInvalidValue;
  size_t temp = 0;
  const cudaError_t e = SortTempBytes(n, vocab, &temp);
  if (e != cudaSuccess) return e;
  *bytes = 3 * Aligned(size_t(n) * sizeof(int32_t)) + Aligned(temp);
  return cudaSuccess;
}

cudaError_t LaunchEmbeddingBackwardHalf(int fmt, const void* dout, const int32_t* ids, int64_t n,
                                        int64_t cols, int64_t vocab, void* dweight, void* scratch,
                                        size_t scratch_bytes, cudaStream_t s) {
  if (n <= 0 || cols <= 0) return cudaSuccess;
  if (n > INT32_MAX || (fmt != int(Format::kBF16) && fmt != int(Format::kF16))) {
    return cudaErrorInvalidValue;
  }
  size_t temp = 0, need = 0;
  cudaError_t e = SortTempBytes(n, vocab, &temp);
  if (e == cudaSuccess) e = EmbeddingBackwardHalfScratchBytes(n, vocab, &need);
  if (e != cudaSuccess) return e;
  if (scratch_bytes < need) return cudaErrorInvalidValue;
  char* p = static_cast<char*>(scratch);
  const size_t ids_bytes = Aligned(size_t(n) * sizeof(int32_t));
  int32_t* sorted_ids = reinterpret_cast<int32_t*>(p);
  int32_t* positions = reinterpret_cast<int32_t*>(p + ids_bytes);
  int32_t* order = reinterpret_cast<int32_t*>(p + 2 * ids_bytes);
  void* temp_storage = p + 3 * ids_bytes;
  const Launch1D eg = ElementwiseGeometry(n);
  IotaKernel<<<eg.grid, eg.block, 0, s>>>(positions, n);
  // A radix sort is stable: equal ids keep their positions' order, the CPU's summation order.
  e = cub::DeviceRadixSort::SortPairs(temp_storage, temp, ids, sorted_ids, positions, order,
                                      int(n), 0, IdBits(vocab), s);
  if (e != cudaSuccess) return e;
  const RowGeometry g = RowwiseGeometry(n, cols);
  return WithFormat(fmt, [&](auto f) {
    constexpr Format F = decltype(f)::value;
    EmbeddingBackwardSortedKernel<F><<<g.grid, Block(g), 0, s>>>(
        As<F>(dout), sorted_ids, order, n, cols, As<F>(dweight));
  });
}

}  // namespace braid::cuda
