#include "backends/cuda/kernels/geometry.h"

#include <algorithm>

namespace braid::cuda {

namespace {
int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
}  // namespace

Launch1D ElementwiseGeometry(int64_t n) {
  if (n <= 0) return {};
  return {std::min(kMaxElementwiseGrid, CeilDiv(n, kElementwiseBlock)), kElementwiseBlock};
}

RowGeometry RowwiseGeometry(int64_t rows, int64_t cols) {
  if (rows <= 0) return {};
  if (cols <= 1024) return {CeilDiv(rows, 8), 32, 8};
  const int threads = cols <= 8192 ? 256 : cols <= 32768 ? 512 : 1024;
  return {rows, threads, 1};
}

Launch1D ReductionGeometry(int64_t n) {
  if (n <= 0) return {1, kReduceBlock};  // one block still writes the 0
  // About 4 elements per thread at least, so that small sums use few blocks.
  return {std::clamp<int64_t>(CeilDiv(n, 4 * kReduceBlock), 1, kMaxReduceGrid), kReduceBlock};
}

Launch1D ColumnGeometry(int64_t cols) {
  if (cols <= 0) return {};
  return {CeilDiv(cols, kElementwiseBlock), kElementwiseBlock};
}

}  // namespace braid::cuda
