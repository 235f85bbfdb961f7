// Fused causal self-attention for the CPU, one (batch, head) per task.
//
// Forward, per block of query rows: scores = scale * Q Kᵀ for the causal columns only, a
// row-wise causal softmax written straight into `att`, then out = P V over the causal range.
// Backward: dP = dO Vᵀ, dS = P * (dP - rowsum(P * dP)) * scale, dQ = dS K, dK = dSᵀ Q, dV = Pᵀ dO,
// each restricted to the lower triangle. The products use a small register-blocked kernel
// (6 rows x 16 columns of FMA accumulators) that reads Q, K, V and dO in place in their strided
// [B, T, 3C] / [B, T, C] layouts; only Kᵀ and Vᵀ are copied (D x T) so that the kernel's
// right-hand side is contiguous.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backends/cpu/row_ops.h"
#include "backends/cpu/simd.h"
#include "backends/cpu/thread_pool.h"
#include "core/check.h"
#include "core/kernel_checks.h"
#include "core/kernels.h"

namespace braid::cpu {
namespace {

// C[r][j] = alpha * sum_{p in [k0, k1)} A(r, p) * B[p * ldb + j] for r < mr, j < n, where
// A(r, p) = A[r * a_rs + p * a_ks] (so A may be read transposed) and p indexes B absolutely.
struct Panel {
  int64_t mr, k0, k1, n;
  float alpha;
  const float* a;
  int64_t a_rs, a_ks;
  const float* b;
  int64_t ldb;
  float* c;
  int64_t ldc;
};

constexpr int kMr = 6;  // rows per register block

#if BRAID_HAVE_X86
template <int MR>
BRAID_AVX2 void PanelAvx2(const Panel& q) {
  const __m256 valpha = _mm256_set1_ps(q.alpha);
  // Locals, so the compiler need not reload them from q after every store.
  const int64_t k0 = q.k0, k1 = q.k1, ldb = q.ldb, a_ks = q.a_ks, a_rs = q.a_rs;
  for (int64_t j = 0; j < q.n; j += 16) {
    const int64_t w = std::min<int64_t>(16, q.n - j);
    __m256 c0[MR], c1[MR];
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) c0[r] = c1[r] = _mm256_setzero_ps();
    const float* bp = q.b + q.k0 * q.ldb + j;
    const float* ap = q.a + q.k0 * q.a_ks;
    if (w == 16) {
      for (int64_t p = k0; p < k1; ++p, bp += ldb, ap += a_ks) {
        const __m256 b0 = _mm256_loadu_ps(bp), b1 = _mm256_loadu_ps(bp + 8);
#pragma GCC unroll 6
        for (int r = 0; r < MR; ++r) {
          const __m256 av = _mm256_broadcast_ss(ap + r * a_rs);
          c0[r] = _mm256_fmadd_ps(av, b0, c0[r]);
          c1[r] = _mm256_fmadd_ps(av, b1, c1[r]);
        }
      }
#pragma GCC unroll 6
      for (int r = 0; r < MR; ++r) {
        float* cp = q.c + r * q.ldc + j;
        _mm256_storeu_ps(cp, _mm256_mul_ps(valpha, c0[r]));
        _mm256_storeu_ps(cp + 8, _mm256_mul_ps(valpha, c1[r]));
      }
    } else {
      const __m256i m0 = TailMask(w), m1 = TailMask(w - 8);
      for (int64_t p = k0; p < k1; ++p, bp += ldb, ap += a_ks) {
        const __m256 b0 = _mm256_maskload_ps(bp, m0), b1 = _mm256_maskload_ps(bp + 8, m1);
#pragma GCC unroll 6
        for (int r = 0; r < MR; ++r) {
          const __m256 av = _mm256_broadcast_ss(ap + r * a_rs);
          c0[r] = _mm256_fmadd_ps(av, b0, c0[r]);
          c1[r] = _mm256_fmadd_ps(av, b1, c1[r]);
        }
      }
#pragma GCC unroll 6
      for (int r = 0; r < MR; ++r) {
        float* cp = q.c + r * q.ldc + j;
        _mm256_maskstore_ps(cp, m0, _mm256_mul_ps(valpha, c0[r]));
        _mm256_maskstore_ps(cp + 8, m1, _mm256_mul_ps(valpha, c1[r]));
      }
    }
  }
}
#endif

void PanelScalar(const Panel& q) {
  for (int64_t r = 0; r < q.mr; ++r) {
    float* cr = q.c + r * q.ldc;
    std::fill(cr, cr + q.n, 0.0f);
    for (int64_t p = q.k0; p < q.k1; ++p) {
      const float a = q.a[r * q.a_rs + p * q.a_ks];
      const float* br = q.b + p * q.ldb;
      for (int64_t j = 0; j < q.n; ++j) cr[j] += a * br[j];
    }
    for (int64_t j = 0; j < q.n; ++j) cr[j] *= q.alpha;
  }
}

void RunPanel(const Panel& q) {
#if BRAID_HAVE_X86
  if (UseAvx2()) {
    switch (q.mr) {
      case 1:
        return PanelAvx2<1>(q);
      case 2:
        return PanelAvx2<2>(q);
      case 3:
        return PanelAvx2<3>(q);
      case 4:
        return PanelAvx2<4>(q);
      case 5:
        return PanelAvx2<5>(q);
      case 6:
        return PanelAvx2<6>(q);
    }
  }
#endif
  PanelScalar(q);
}

// dst[j * ld_dst + i] = src[i * ld_src + j] for i < rows, j < cols.
void Transpose(const float* src, int64_t ld_src, int64_t rows, int64_t cols, float* dst,
               int64_t ld_dst) {
  constexpr int64_t kB = 16;  // tile, for cache-friendly strided writes
  for (int64_t i0 = 0; i0 < rows; i0 += kB) {
    for (int64_t j0 = 0; j0 < cols; j0 += kB) {
      const int64_t i1 = std::min(rows, i0 + kB), j1 = std::min(cols, j0 + kB);
      for (int64_t i = i0; i < i1; ++i) {
        for (int64_t j = j0; j < j1; ++j) dst[j * ld_dst + i] = src[i * ld_src + j];
      }
    }
  }
}

using AttnDims = kernels::checks::AttentionDims;

// Grows a per-thread buffer; kernels keep no heap traffic after the first step.
float* Scratch(std::vector<float>& v, int64_t n) {
  if (int64_t(v.size()) < n) v.resize(size_t(n));
  return v.data();
}

// rows x cols of a strided matrix into a contiguous one. The products read their right-hand
// side row by row; rows of q/k/v lie 3C floats apart (3 KiB at gpt-mini's width), a stride that
// maps every row onto the same few L1 sets, so a contiguous copy keeps the operand in L1.
void CopyRows(const float* src, int64_t ld_src, int64_t rows, int64_t cols, float* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(dst + r * cols, src + r * ld_src, size_t(cols) * sizeof(float));
  }
}

void AttentionHeadForward(const AttnDims& s, float scale, const float* q, const float* k,
                          const float* v, float* att, float* out) {
  const int64_t T = s.t, D = s.d, ld = 3 * s.c;
  thread_local std::vector<float> buf;
  float* kt = Scratch(buf, 2 * D * T);  // Kᵀ [D, T], then V [T, D]
  float* vc = kt + D * T;
  Transpose(k, ld, T, D, kt, T);
  CopyRows(v, ld, T, D, vc);
  for (int64_t i0 = 0; i0 < T; i0 += kMr) {
    const int64_t mr = std::min<int64_t>(kMr, T - i0), jend = i0 + mr;
    // Scores for columns [0, jend): everything a row of this block can attend to.
    RunPanel(Panel{mr, 0, D, jend, scale, q + i0 * ld, ld, 1, kt, T, att + i0 * T, T});
    for (int64_t i = i0; i < i0 + mr; ++i) {
      float* row = att + i * T;
      const float sum = ExpShift(row, RowMax(row, i + 1), i + 1, row);
      ScaleRow(row, 1.0f / sum, i + 1);
      std::memset(row + i + 1, 0, size_t(T - i - 1) * sizeof(float));
    }
    RunPanel(Panel{mr, 0, jend, D, 1.0f, att + i0 * T, T, 1, vc, D, out + i0 * s.c, s.c});
  }
}

void AttentionHeadBackward(const AttnDims& s, float scale, const float* q, const float* k,
                           const float* v, const float* att, const float* dout, float* dq,
                           float* dk, float* dv) {
  const int64_t T = s.t, D = s.d, ld = 3 * s.c;
  thread_local std::vector<float> buf;
  float* ds = Scratch(buf, T * T + 4 * T * D);  // dS [T, T], Vᵀ [D, T], Q, K, dO [T, D]
  float* vt = ds + T * T;
  float* qc = vt + T * D;
  float* kc = qc + T * D;
  float* gc = kc + T * D;
  Transpose(v, ld, T, D, vt, T);
  CopyRows(q, ld, T, D, qc);
  CopyRows(k, ld, T, D, kc);
  CopyRows(dout, s.c, T, D, gc);
  for (int64_t i0 = 0; i0 < T; i0 += kMr) {
    const int64_t mr = std::min<int64_t>(kMr, T - i0), jend = i0 + mr;
    // dP = dO Vᵀ over the causal columns, into ds.
    RunPanel(Panel{mr, 0, D, jend, 1.0f, gc + i0 * D, D, 1, vt, T, ds + i0 * T, T});
    for (int64_t i = i0; i < i0 + mr; ++i) {
      const float* p = att + i * T;
      float* row = ds + i * T;
      const float dot = Dot(p, row, i + 1);
      for (int64_t j = 0; j <= i; ++j) row[j] = p[j] * (row[j] - dot) * scale;
      std::memset(row + i + 1, 0, size_t(T - i - 1) * sizeof(float));
    }
    // dQ = dS K: row i needs keys j <= i.
    RunPanel(Panel{mr, 0, jend, D, 1.0f, ds + i0 * T, T, 1, kc, D, dq + i0 * ld, ld});
  }
  for (int64_t j0 = 0; j0 < T; j0 += kMr) {
    const int64_t mr = std::min<int64_t>(kMr, T - j0);
    // dK = dSᵀ Q and dV = Pᵀ dO: key j gets contributions from queries i >= j.
    RunPanel(Panel{mr, j0, T, D, 1.0f, ds + j0, 1, T, qc, D, dk + j0 * ld, ld});
    RunPanel(Panel{mr, j0, T, D, 1.0f, att + j0, 1, T, gc, D, dv + j0 * ld, ld});
  }
}

void AttentionForward(const Tensor& qkv, int n_head, Tensor& out, Tensor& att) {
  const AttnDims s = kernels::checks::AttentionForward("cpu", DType::kF32, qkv, n_head, out, att);
  const float* pq = qkv.data<float>();
  float* po = out.data<float>();
  float* pa = att.data<float>();
  const float scale = float(1.0 / std::sqrt(double(s.d)));
  ParallelFor(s.b * s.h, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t b = task / s.h, h = task % s.h;
      const float* q = pq + b * s.t * 3 * s.c + h * s.d;
      AttentionHeadForward(s, scale, q, q + s.c, q + 2 * s.c, pa + task * s.t * s.t,
                           po + b * s.t * s.c + h * s.d);
    }
  });
}

void AttentionBackward(const Tensor& dout, const Tensor& qkv, const Tensor& att, int n_head,
                       Tensor& dqkv) {
  const AttnDims s =
      kernels::checks::AttentionBackward("cpu", DType::kF32, dout, qkv, att, n_head, dqkv);
  const float* pq = qkv.data<float>();
  const float* pg = dout.data<float>();
  const float* pa = att.data<float>();
  float* pd = dqkv.data<float>();
  const float scale = float(1.0 / std::sqrt(double(s.d)));
  ParallelFor(s.b * s.h, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t b = task / s.h, h = task % s.h;
      const int64_t off = b * s.t * 3 * s.c + h * s.d;
      const float* q = pq + off;
      float* dq = pd + off;
      AttentionHeadBackward(s, scale, q, q + s.c, q + 2 * s.c, pa + task * s.t * s.t,
                            pg + b * s.t * s.c + h * s.d, dq, dq + s.c, dq + 2 * s.c);
    }
  });
}

}  // namespace

BRAID_REGISTER_KERNEL(kernels::attention_forward, DeviceType::kCPU, &AttentionForward);
BRAID_REGISTER_KERNEL(kernels::attention_backward, DeviceType::kCPU, &AttentionBackward);

}  // namespace braid::cpu
