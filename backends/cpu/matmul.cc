// matmul for the CPU: OpenBLAS sgemm, one call per batch entry.
#include <cblas.h>

#include <cstring>
#include <limits>
#include <vector>

#include "core/check.h"
#include "core/kernel_checks.h"
#include "core/kernels.h"

namespace braid::cpu {
namespace {

bool Overlaps(const Tensor& x, const Tensor& y) {
  const char* xb = static_cast<const char*>(x.raw_data());
  const char* yb = static_cast<const char*>(y.raw_data());
  return xb < yb + y.nbytes() && yb < xb + x.nbytes();
}

void Matmul(const Tensor& a, const Tensor& b, Tensor& out, bool trans_a, bool trans_b, float alpha,
            float beta) {
  const auto dims = kernels::checks::Matmul("cpu", DType::kF32, a, b, out, trans_a, trans_b);
  const int64_t batch = dims.batch, m = dims.m, n = dims.n, k = dims.k;
  // Stored shapes of one batch entry: a is [ar, ac], b is [br, bc].
  const int64_t ar = dims.a_rows, ac = dims.a_cols, br = dims.b_rows, bc = dims.b_cols;
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  BRAID_CHECK(m <= kIntMax && n <= kIntMax && k <= kIntMax && ac <= kIntMax && bc <= kIntMax)
      << "cpu matmul: " << a.DescribeForError() << " @ " << b.DescribeForError()
      << " has a dimension beyond BLAS's 32-bit int; split the product";
  if (m == 0 || n == 0 || batch == 0) return;
  float* po = out.data<float>();
  if (k == 0) {
    // An empty sum: out = beta * out (and beta == 0 must not read out).
    for (int64_t i = 0, e = out.numel(); i < e; ++i) po[i] = beta == 0.0f ? 0.0f : beta * po[i];
    return;
  }
  // BLAS forbids the output aliasing an input; compute such a product aside (rare).
  thread_local std::vector<float> aside;
  float* dst = po;
  const bool alias = Overlaps(out, a) || Overlaps(out, b);
  if (alias) {
    aside.assign(po, po + out.numel());
    dst = aside.data();
  }
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  for (int64_t i = 0; i < batch; ++i) {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, int(m), int(n), int(k), alpha,
                pa + i * ar * ac, int(ac), pb + i * br * bc, int(bc), beta, dst + i * m * n,
                int(n));
  }
  if (alias) std::memcpy(po, dst, size_t(out.numel()) * sizeof(float));
}

}  // namespace

BRAID_REGISTER_KERNEL(kernels::matmul, DeviceType::kCPU, &Matmul);

}  // namespace braid::cpu
