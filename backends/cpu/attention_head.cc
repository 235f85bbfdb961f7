// The products and the per-head passes of attention.cc and gqa_attention.cc (attention_head.h).
#include "backends/cpu/attention_head.h"

#include <algorithm>
#include <cstring>

#include "backends/cpu/row_ops.h"
#include "backends/cpu/simd.h"

namespace braid::cpu::attention {
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

}  // namespace

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

void CopyRows(const float* src, int64_t ld_src, int64_t rows, int64_t cols, float* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(dst + r * cols, src + r * ld_src, size_t(cols) * sizeof(float));
  }
}

void HeadForward(int64_t T, int64_t D, float scale, const float* q, int64_t ldq, const float* kt,
                 const float* vc, float* att, float* out, int64_t ldo) {
  for (int64_t i0 = 0; i0 < T; i0 += kMr) {
    const int64_t mr = std::min<int64_t>(kMr, T - i0), jend = i0 + mr;
    // Scores for columns [0, jend): everything a row of this block can attend to.
    RunPanel(Panel{mr, 0, D, jend, scale, q + i0 * ldq, ldq, 1, kt, T, att + i0 * T, T});
    for (int64_t i = i0; i < i0 + mr; ++i) {
      float* row = att + i * T;
      const float sum = ExpShift(row, RowMax(row, i + 1), i + 1, row);
      ScaleRow(row, 1.0f / sum, i + 1);
      std::memset(row + i + 1, 0, size_t(T - i - 1) * sizeof(float));
    }
    RunPanel(Panel{mr, 0, jend, D, 1.0f, att + i0 * T, T, 1, vc, D, out + i0 * ldo, ldo});
  }
}

void HeadBackward(int64_t T, int64_t D, float scale, const float* qc, const float* kc,
                  const float* vt, const float* gc, const float* att, float* ds, float* dq,
                  int64_t ldq, float* dk, float* dv, int64_t ldkv) {
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
    RunPanel(Panel{mr, 0, jend, D, 1.0f, ds + i0 * T, T, 1, kc, D, dq + i0 * ldq, ldq});
  }
  for (int64_t j0 = 0; j0 < T; j0 += kMr) {
    const int64_t mr = std::min<int64_t>(kMr, T - j0);
    // dK = dSᵀ Q and dV = Pᵀ dO: key j gets contributions from queries i >= j.
    RunPanel(Panel{mr, j0, T, D, 1.0f, ds + j0, 1, T, qc, D, dk + j0 * ldkv, ldkv});
    RunPanel(Panel{mr, j0, T, D, 1.0f, att + j0, 1, T, gc, D, dv + j0 * ldkv, ldkv});
  }
}

}  // namespace braid::cpu::attention
