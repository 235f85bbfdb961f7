// Launch geometry of the CUDA kernels, as pure host functions (tested on the CPU).
#ifndef BRAID_BACKENDS_CUDA_KERNELS_GEOMETRY_H_
#define BRAID_BACKENDS_CUDA_KERNELS_GEOMETRY_H_

#include <cstdint>

namespace braid::cuda {

struct Launch1D {
  int64_t grid = 0;  // 0: nothing to launch
  int block = 0;
};

inline constexpr int kElementwiseBlock = 256;
// Grid-stride loops: enough blocks to fill an H100 (132 SMs x 2048 threads = 1056 blocks of 256)
// several times over, and a cap so that a huge n does not mean a huge grid. A constant, not
// the device's SM count, so a kernel's work split never depends on which GPU runs it.
inline constexpr int64_t kMaxElementwiseGrid = 4096;

// Elementwise kernels over n items (grid-stride).
Launch1D ElementwiseGeometry(int64_t n);

// Row-wise kernels (LayerNorm, softmax, cross-entropy, embedding rows): `threads_per_row`
// threads share one row and reduce over it. Rows of up to 1024 columns get one warp each, 8 rows
// per block (a warp reduction, no shared memory); wider rows one block each, of 256..1024
// threads as the width grows (about 8+ columns per thread, so the reduction is amortised).
struct RowGeometry {
  int64_t grid = 0;
  int threads_per_row = 0;  // blockDim.x
  int rows_per_block = 0;   // blockDim.y
};
RowGeometry RowwiseGeometry(int64_t rows, int64_t cols);

// sum_all: a fixed number of blocks (independent of the GPU, so the result's summation order,
// hence its bits, is the same everywhere) each writing one partial, then one block over them.
inline constexpr int kReduceBlock = 256;
inline constexpr int64_t kMaxReduceGrid = 1024;
Launch1D ReductionGeometry(int64_t n);

// Column sums (sum_rows, embedding backward): one thread per column, adding the rows in order,
// as the CPU backend does (deterministic, no atomics). LayerNorm's dweight/dbias has its own
// blocked geometry (nn.cu).
Launch1D ColumnGeometry(int64_t cols);

}  // namespace braid::cuda

#endif  // BRAID_BACKENDS_CUDA_KERNELS_GEOMETRY_H_
