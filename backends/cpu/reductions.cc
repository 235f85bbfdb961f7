// sum_all and sum_rows for the CPU.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "backends/cpu/simd.h"
#include "backends/cpu/thread_pool.h"
#include "core/kernel_checks.h"
#include "core/kernels.h"

namespace braid::cpu {
namespace {

// sum_all sums fixed 16K-element blocks (in parallel) and then the block sums in order, so the
// result does not depend on the thread count.
constexpr int64_t kSumBlock = 1 << 14;

#if BRAID_HAVE_X86
BRAID_AVX2 float SumAvx2(const float* a, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm256_add_ps(s0, _mm256_loadu_ps(a + i));
    s1 = _mm256_add_ps(s1, _mm256_loadu_ps(a + i + 8));
    s2 = _mm256_add_ps(s2, _mm256_loadu_ps(a + i + 16));
    s3 = _mm256_add_ps(s3, _mm256_loadu_ps(a + i + 24));
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_add_ps(s0, _mm256_loadu_ps(a + i));
  if (i < n) s1 = _mm256_add_ps(s1, _mm256_maskload_ps(a + i, TailMask(n - i)));
  return HSum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
}
#endif

double SumBlock(const float* a, int64_t n) {
#if BRAID_HAVE_X86
  if (UseAvx2()) return SumAvx2(a, n);
#endif
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i];
  return s;
}

void SumAll(const Tensor& a, Tensor& out) {
  kernels::checks::SumAll("cpu", DType::kF32, a, out);
  const int64_t n = a.numel();
  const float* pa = a.data<float>();
  const int64_t blocks = (n + kSumBlock - 1) / kSumBlock;
  double total = 0;
  if (blocks <= 1) {
    total = SumBlock(pa, n);
  } else {
    thread_local std::vector<double> partial;
    if (int64_t(partial.size()) < blocks) partial.resize(size_t(blocks));
    double* part = partial.data();
    ParallelFor(blocks, 2, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        part[b] = SumBlock(pa + b * kSumBlock, std::min(kSumBlock, n - b * kSumBlock));
      }
    });
    for (int64_t b = 0; b < blocks; ++b) total += part[b];
  }
  out.data<float>()[0] = float(total);
}

// Columns [c0, c1) of a [rows, cols] matrix, summed over rows in row order.
#if BRAID_HAVE_X86
BRAID_AVX2 void SumRowsAvx2(const float* a, int64_t rows, int64_t cols, int64_t c0, int64_t c1,
                            float* out, float beta) {
  constexpr int kV = 8;  // vectors per register block: 64 columns
  for (int64_t cb = c0; cb < c1; cb += 8 * kV) {
    const int64_t w = std::min<int64_t>(8 * kV, c1 - cb);
    const int nv = int((w + 7) / 8);
    const __m256i tail = TailMask(w - 8 * (nv - 1));
    __m256 acc[kV];
    for (int v = 0; v < kV; ++v) acc[v] = _mm256_setzero_ps();
    if (nv == kV && w == 8 * kV) {
      for (int64_t r = 0; r < rows; ++r) {
        const float* row = a + r * cols + cb;
        for (int v = 0; v < kV; ++v) acc[v] = _mm256_add_ps(acc[v], _mm256_loadu_ps(row + 8 * v));
      }
    } else {
      for (int64_t r = 0; r < rows; ++r) {
        const float* row = a + r * cols + cb;
        for (int v = 0; v < nv - 1; ++v)
          acc[v] = _mm256_add_ps(acc[v], _mm256_loadu_ps(row + 8 * v));
        acc[nv - 1] = _mm256_add_ps(acc[nv - 1], _mm256_maskload_ps(row + 8 * (nv - 1), tail));
      }
    }
    for (int v = 0; v < nv; ++v) {
      __m256i m = v == nv - 1 ? tail : _mm256_set1_epi32(-1);
      __m256 r = acc[v];
      if (beta != 0.0f) {
        r = _mm256_fmadd_ps(_mm256_set1_ps(beta), _mm256_maskload_ps(out + cb + 8 * v, m), r);
      }
      _mm256_maskstore_ps(out + cb + 8 * v, m, r);
    }
  }
}
#endif

void SumRowsScalar(const float* a, int64_t rows, int64_t cols, int64_t c0, int64_t c1, float* out,
                   float beta) {
  float acc[64];
  for (int64_t cb = c0; cb < c1; cb += 64) {
    const int64_t w = std::min<int64_t>(64, c1 - cb);
    for (int64_t j = 0; j < w; ++j) acc[j] = 0.0f;
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = a + r * cols + cb;
      for (int64_t j = 0; j < w; ++j) acc[j] += row[j];
    }
    for (int64_t j = 0; j < w; ++j) {
      out[cb + j] = beta != 0.0f ? beta * out[cb + j] + acc[j] : acc[j];
    }
  }
}

void SumRows(const Tensor& a, Tensor& out, float beta) {
  const auto dims = kernels::checks::SumRows("cpu", DType::kF32, a, out);
  const int64_t rows = dims.rows, cols = dims.cols;
  const float* pa = a.data<float>();
  float* po = out.data<float>();
  // Parallel over groups of 8 columns: each column is summed in row order by one thread.
  const int64_t groups = (cols + 7) / 8;
  const int64_t grain = std::max<int64_t>(1, kElementGrain / (8 * std::max<int64_t>(rows, 1)));
  ParallelFor(groups, grain, [&](int64_t g0, int64_t g1) {
    const int64_t c0 = g0 * 8, c1 = std::min(cols, g1 * 8);
#if BRAID_HAVE_X86
    if (UseAvx2()) return SumRowsAvx2(pa, rows, cols, c0, c1, po, beta);
#endif
    SumRowsScalar(pa, rows, cols, c0, c1, po, beta);
  });
}

}  // namespace

BRAID_REGISTER_KERNEL(kernels::sum_all, DeviceType::kCPU, &SumAll);
BRAID_REGISTER_KERNEL(kernels::sum_rows, DeviceType::kCPU, &SumRows);

}  // namespace braid::cpu
