// Fused row-wise kernels for the CPU: layernorm, softmax, cross-entropy, embedding.
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

namespace checks = kernels::checks;
constexpr DType kF32 = DType::kF32;

// Rows per parallel chunk for a row-wise kernel over rows of `cols` floats.
int64_t RowGrain(int64_t cols) {
  return std::max<int64_t>(1, kElementGrain / std::max<int64_t>(cols, 1));
}

// ---- LayerNorm -----------------------------------------------------------------------------

#if BRAID_HAVE_X86
BRAID_AVX2 void LayerNormRowsAvx2(const float* x, const float* w, const float* b, float eps,
                                  int64_t c, int64_t r0, int64_t r1, float* out, float* mean,
                                  float* rstd) {
  const int64_t cv = c & ~int64_t(7);
  const __m256i tail = TailMask(c - cv);
  const float inv_c = 1.0f / float(c);
  for (int64_t r = r0; r < r1; ++r) {
    const float* row = x + r * c;
    float* o = out + r * c;
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    int64_t i = 0;
    for (; i + 16 <= cv; i += 16) {
      s0 = _mm256_add_ps(s0, _mm256_loadu_ps(row + i));
      s1 = _mm256_add_ps(s1, _mm256_loadu_ps(row + i + 8));
    }
    for (; i < cv; i += 8) s0 = _mm256_add_ps(s0, _mm256_loadu_ps(row + i));
    if (cv < c) s1 = _mm256_add_ps(s1, _mm256_maskload_ps(row + cv, tail));
    const float mu = HSum(_mm256_add_ps(s0, s1)) * inv_c;
    const __m256 vmu = _mm256_set1_ps(mu);
    __m256 q0 = _mm256_setzero_ps(), q1 = q0;
    for (i = 0; i + 16 <= cv; i += 16) {
      __m256 d0 = _mm256_sub_ps(_mm256_loadu_ps(row + i), vmu);
      __m256 d1 = _mm256_sub_ps(_mm256_loadu_ps(row + i + 8), vmu);
      q0 = _mm256_fmadd_ps(d0, d0, q0);
      q1 = _mm256_fmadd_ps(d1, d1, q1);
    }
    for (; i < cv; i += 8) {
      __m256 d = _mm256_sub_ps(_mm256_loadu_ps(row + i), vmu);
      q0 = _mm256_fmadd_ps(d, d, q0);
    }
    if (cv < c) {
      __m256 d = _mm256_and_ps(_mm256_sub_ps(_mm256_maskload_ps(row + cv, tail), vmu),
                               _mm256_castsi256_ps(tail));
      q1 = _mm256_fmadd_ps(d, d, q1);
    }
    const float var = HSum(_mm256_add_ps(q0, q1)) * inv_c;
    const float rs = 1.0f / std::sqrt(var + eps);
    const __m256 vrs = _mm256_set1_ps(rs);
    for (i = 0; i < cv; i += 8) {
      __m256 n = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(row + i), vmu), vrs);
      _mm256_storeu_ps(o + i, _mm256_fmadd_ps(n, _mm256_loadu_ps(w + i), _mm256_loadu_ps(b + i)));
    }
    if (cv < c) {
      __m256 n = _mm256_mul_ps(_mm256_sub_ps(_mm256_maskload_ps(row + cv, tail), vmu), vrs);
      _mm256_maskstore_ps(
          o + cv, tail,
          _mm256_fmadd_ps(n, _mm256_maskload_ps(w + cv, tail), _mm256_maskload_ps(b + cv, tail)));
    }
    mean[r] = mu;
    rstd[r] = rs;
  }
}
#endif

void LayerNormRowsScalar(const float* x, const float* w, const float* b, float eps, int64_t c,
                         int64_t r0, int64_t r1, float* out, float* mean, float* rstd) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* row = x + r * c;
    float s = 0;
    for (int64_t i = 0; i < c; ++i) s += row[i];
    const float mu = s / float(c);
    float q = 0;
    for (int64_t i = 0; i < c; ++i) q += (row[i] - mu) * (row[i] - mu);
    const float rs = 1.0f / std::sqrt(q / float(c) + eps);
    for (int64_t i = 0; i < c; ++i) out[r * c + i] = (row[i] - mu) * rs * w[i] + b[i];
    mean[r] = mu;
    rstd[r] = rs;
  }
}

void LayerNormForward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                      Tensor& out, Tensor& mean, Tensor& rstd) {
  const auto dims = checks::LayerNormForward("cpu", kF32, x, weight, bias, out, mean, rstd);
  const int64_t rows = dims.rows, c = dims.cols;
  const float* px = x.data<float>();
  const float* pw = weight.data<float>();
  const float* pb = bias.data<float>();
  float* po = out.data<float>();
  float* pm = mean.data<float>();
  float* pr = rstd.data<float>();
  ParallelFor(rows, RowGrain(c), [&](int64_t r0, int64_t r1) {
#if BRAID_HAVE_X86
    if (UseAvx2()) return LayerNormRowsAvx2(px, pw, pb, eps, c, r0, r1, po, pm, pr);
#endif
    LayerNormRowsScalar(px, pw, pb, eps, c, r0, r1, po, pm, pr);
  });
}

// Rows [r0, r1): writes dx, adds this range's sums of dout * xhat and dout into dw, db.
#if BRAID_HAVE_X86
BRAID_AVX2 void LayerNormBwdRowsAvx2(const float* g, const float* x, const float* w,
                                     const float* mean, const float* rstd, int64_t c, int64_t r0,
                                     int64_t r1, float* dx, float* dw, float* db) {
  const int64_t cv = c & ~int64_t(7);
  const __m256i tail = TailMask(c - cv);
  const __m256 tailf = _mm256_castsi256_ps(tail);
  const float inv_c = 1.0f / float(c);
  for (int64_t r = r0; r < r1; ++r) {
    const float* gr = g + r * c;
    const float* xr = x + r * c;
    float* dxr = dx + r * c;
    const __m256 vmu = _mm256_set1_ps(mean[r]), vrs = _mm256_set1_ps(rstd[r]);
    __m256 sdn = _mm256_setzero_ps(), sdnx = _mm256_setzero_ps();
    for (int64_t i = 0; i < cv; i += 8) {
      __m256 gi = _mm256_loadu_ps(gr + i);
      __m256 xh = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(xr + i), vmu), vrs);
      __m256 dn = _mm256_mul_ps(gi, _mm256_loadu_ps(w + i));
      sdn = _mm256_add_ps(sdn, dn);
      sdnx = _mm256_fmadd_ps(dn, xh, sdnx);
      _mm256_storeu_ps(dw + i, _mm256_fmadd_ps(gi, xh, _mm256_loadu_ps(dw + i)));
      _mm256_storeu_ps(db + i, _mm256_add_ps(gi, _mm256_loadu_ps(db + i)));
    }
    if (cv < c) {
      __m256 gi = _mm256_maskload_ps(gr + cv, tail);
      __m256 xh = _mm256_and_ps(
          _mm256_mul_ps(_mm256_sub_ps(_mm256_maskload_ps(xr + cv, tail), vmu), vrs), tailf);
      __m256 dn = _mm256_mul_ps(gi, _mm256_maskload_ps(w + cv, tail));
      sdn = _mm256_add_ps(sdn, dn);
      sdnx = _mm256_fmadd_ps(dn, xh, sdnx);
      _mm256_maskstore_ps(dw + cv, tail,
                          _mm256_fmadd_ps(gi, xh, _mm256_maskload_ps(dw + cv, tail)));
      _mm256_maskstore_ps(db + cv, tail, _mm256_add_ps(gi, _mm256_maskload_ps(db + cv, tail)));
    }
    const __m256 mdn = _mm256_set1_ps(HSum(sdn) * inv_c);
    const __m256 mdnx = _mm256_set1_ps(HSum(sdnx) * inv_c);
    for (int64_t i = 0; i < cv; i += 8) {
      __m256 xh = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(xr + i), vmu), vrs);
      __m256 dn = _mm256_mul_ps(_mm256_loadu_ps(gr + i), _mm256_loadu_ps(w + i));
      __m256 d = _mm256_fnmadd_ps(xh, mdnx, _mm256_sub_ps(dn, mdn));
      _mm256_storeu_ps(dxr + i, _mm256_mul_ps(d, vrs));
    }
    if (cv < c) {
      __m256 xh = _mm256_mul_ps(_mm256_sub_ps(_mm256_maskload_ps(xr + cv, tail), vmu), vrs);
      __m256 dn =
          _mm256_mul_ps(_mm256_maskload_ps(gr + cv, tail), _mm256_maskload_ps(w + cv, tail));
      __m256 d = _mm256_fnmadd_ps(xh, mdnx, _mm256_sub_ps(dn, mdn));
      _mm256_maskstore_ps(dxr + cv, tail, _mm256_mul_ps(d, vrs));
    }
  }
}
#endif

void LayerNormBwdRowsScalar(const float* g, const float* x, const float* w, const float* mean,
                            const float* rstd, int64_t c, int64_t r0, int64_t r1, float* dx,
                            float* dw, float* db) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* gr = g + r * c;
    const float* xr = x + r * c;
    const float mu = mean[r], rs = rstd[r];
    float sdn = 0, sdnx = 0;
    for (int64_t i = 0; i < c; ++i) {
      float xh = (xr[i] - mu) * rs;
      float dn = gr[i] * w[i];
      sdn += dn;
      sdnx += dn * xh;
      dw[i] += gr[i] * xh;
      db[i] += gr[i];
    }
    const float mdn = sdn / float(c), mdnx = sdnx / float(c);
    for (int64_t i = 0; i < c; ++i) {
      float xh = (xr[i] - mu) * rs;
      dx[r * c + i] = (gr[i] * w[i] - mdn - xh * mdnx) * rs;
    }
  }
}

// dweight/dbias are sums over rows; rows are cut into a fixed number of slices (by row count,
// not thread count), each summed into its own buffer and the buffers added in order, so the
// result is the same for any number of threads.
constexpr int64_t kLayerNormSlices = 16;

void LayerNormBackward(const Tensor& dout, const Tensor& x, const Tensor& weight,
                       const Tensor& mean, const Tensor& rstd, Tensor& dx, Tensor& dweight,
                       Tensor& dbias) {
  const auto dims =
      checks::LayerNormBackward("cpu", kF32, dout, x, weight, mean, rstd, dx, dweight, dbias);
  const int64_t rows = dims.rows, c = dims.cols;
  if (rows == 0) return;
  const float* pg = dout.data<float>();
  const float* px = x.data<float>();
  const float* pw = weight.data<float>();
  const float* pm = mean.data<float>();
  const float* pr = rstd.data<float>();
  float* pdx = dx.data<float>();
  const int64_t slices = std::min(kLayerNormSlices, rows);
  thread_local std::vector<float> scratch;
  scratch.assign(size_t(slices * 2 * c), 0.0f);
  float* part = scratch.data();
  const int64_t rows_per_task = RowGrain(c);
  ParallelFor(slices, std::max<int64_t>(1, rows_per_task * slices / rows),
              [&](int64_t s0, int64_t s1) {
                for (int64_t s = s0; s < s1; ++s) {
                  const int64_t r0 = rows * s / slices, r1 = rows * (s + 1) / slices;
                  float* dw = part + s * 2 * c;
                  float* db = dw + c;
#if BRAID_HAVE_X86
                  if (UseAvx2()) {
                    LayerNormBwdRowsAvx2(pg, px, pw, pm, pr, c, r0, r1, pdx, dw, db);
                    continue;
                  }
#endif
                  LayerNormBwdRowsScalar(pg, px, pw, pm, pr, c, r0, r1, pdx, dw, db);
                }
              });
  float* pdw = dweight.data<float>();
  float* pdb = dbias.data<float>();
  for (int64_t s = 0; s < slices; ++s) {
    const float* dw = part + s * 2 * c;
    const float* db = dw + c;
    for (int64_t i = 0; i < c; ++i) {
      pdw[i] += dw[i];
      pdb[i] += db[i];
    }
  }
}

// ---- Softmax and cross-entropy ---------------------------------------------------------------

void SoftmaxForward(const Tensor& x, Tensor& out) {
  const auto dims = checks::SoftmaxForward("cpu", kF32, x, out);
  const int64_t rows = dims.rows, c = dims.cols;
  const float* px = x.data<float>();
  float* po = out.data<float>();
  ParallelFor(rows, RowGrain(c), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* row = px + r * c;
      float* o = po + r * c;
      float s = ExpShift(row, RowMax(row, c), c, o);
      ScaleRow(o, 1.0f / s, c);
    }
  });
}

void SoftmaxBackward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  const auto dims = checks::SoftmaxBackward("cpu", kF32, y, dy, dx);
  const int64_t rows = dims.rows, c = dims.cols;
  const float* py = y.data<float>();
  const float* pg = dy.data<float>();
  float* pd = dx.data<float>();
  ParallelFor(rows, RowGrain(c), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* yr = py + r * c;
      const float* gr = pg + r * c;
      float* dr = pd + r * c;
      const float dot = Dot(gr, yr, c);
#if BRAID_HAVE_X86
      if (UseAvx2()) {
        SoftmaxBwdRowAvx2(yr, gr, dot, c, dr);
        continue;
      }
#endif
      for (int64_t i = 0; i < c; ++i) dr[i] = yr[i] * (gr[i] - dot);
    }
  });
}

// A target indexes the vocabulary (one below 0 is ignored). It is data, so only a backend that
// reads it on the host can afford to check it.
void CheckTargets(const char* kernel, const int32_t* targets, int64_t n, int64_t v) {
  for (int64_t r = 0; r < n; ++r) {
    BRAID_CHECK(targets[r] < v) << "cpu " << kernel << ": target " << targets[r] << " at row " << r
                                << " is outside the vocabulary of " << v;
  }
}

void CrossEntropyForward(const Tensor& logits, const Tensor& targets, Tensor& losses,
                         Tensor& probs) {
  const auto dims = checks::CrossEntropyForward("cpu", kF32, logits, targets, losses, probs);
  const int64_t n = dims.rows, v = dims.cols;
  const float* pl = logits.data<float>();
  const int32_t* pt = targets.data<int32_t>();
  float* pp = probs.data<float>();
  float* ploss = losses.data<float>();
  CheckTargets("cross_entropy_forward", pt, n, v);
  ParallelFor(n, RowGrain(v), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* row = pl + r * v;
      float* p = pp + r * v;
      const float mx = RowMax(row, v);
      const float s = ExpShift(row, mx, v, p);
      ScaleRow(p, 1.0f / s, v);
      const int32_t t = pt[r];
      // -log softmax[t] = log(sum exp(x - mx)) - (x_t - mx): no log of a rounded probability.
      ploss[r] = t < 0 ? 0.0f : std::log(s) - (row[t] - mx);
    }
  });
}

void CrossEntropyBackward(const Tensor& probs, const Tensor& targets, const Tensor& dloss,
                          Tensor& dlogits) {
  const auto dims = checks::CrossEntropyBackward("cpu", kF32, probs, targets, dloss, dlogits);
  const int64_t n = dims.rows, v = dims.cols;
  const float* pp = probs.data<float>();
  const int32_t* pt = targets.data<int32_t>();
  const float* pdl = dloss.data<float>();
  float* pd = dlogits.data<float>();
  CheckTargets("cross_entropy_backward", pt, n, v);
  ParallelFor(n, RowGrain(v), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int32_t t = pt[r];
      float* d = pd + r * v;
      if (t < 0) {  // an ignored row contributed nothing to the loss
        std::memset(d, 0, size_t(v) * sizeof(float));
        continue;
      }
      const float g = pdl[r];
      const float* p = pp + r * v;
#if BRAID_HAVE_X86
      if (UseAvx2()) {
        ScaleCopyAvx2(p, g, v, d);
      } else
#endif
      {
        for (int64_t i = 0; i < v; ++i) d[i] = p[i] * g;
      }
      d[t] = (p[t] - 1.0f) * g;
    }
  });
}

// ---- Embedding -------------------------------------------------------------------------------

// Counted on the CPU like the rest of cross-entropy; on a GPU the same count runs there, which is
// the point of the slot (core/kernels.h).
void InverseCountNonnegative(const Tensor& ids, Tensor& out) {
  BRAID_CHECK(ids.dtype() == DType::kI32 && out.dtype() == kF32 && out.numel() == 1)
      << "cpu kernel 'inverse_count_nonnegative': wants i32 ids and one f32 output, got "
      << ids.DescribeForError() << " and " << out.DescribeForError();
  const int32_t* p = ids.data<int32_t>();
  int64_t counted = 0;
  for (int64_t i = 0, n = ids.numel(); i < n; ++i) counted += p[i] >= 0;
  out.data<float>()[0] = counted > 0 ? 1.0f / float(counted) : 0.0f;
}

void CheckIds(const char* kernel, const int32_t* ids, int64_t n, int64_t v) {
  for (int64_t r = 0; r < n; ++r) {
    BRAID_CHECK(ids[r] >= 0 && ids[r] < v) << "cpu " << kernel << ": id " << ids[r]
                                           << " at position " << r << " outside [0, " << v << ")";
  }
}

void EmbeddingForward(const Tensor& weight, const Tensor& ids, Tensor& out) {
  const auto dims = checks::EmbeddingForward("cpu", kF32, weight, ids, out);
  const int64_t v = dims.vocab, c = dims.cols, n = dims.n;
  const float* pw = weight.data<float>();
  const int32_t* pi = ids.data<int32_t>();
  float* po = out.data<float>();
  CheckIds("embedding_forward", pi, n, v);
  ParallelFor(n, RowGrain(c), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      std::memcpy(po + r * c, pw + int64_t(pi[r]) * c, size_t(c) * sizeof(float));
    }
  });
}

#if BRAID_HAVE_X86
BRAID_AVX2 void AddRowAvx2(const float* src, int64_t c, float* dst) {
  int64_t i = 0;
  for (; i + 8 <= c; i += 8) {
    _mm256_storeu_ps(dst + i, _mm256_add_ps(_mm256_loadu_ps(dst + i), _mm256_loadu_ps(src + i)));
  }
  for (; i < c; ++i) dst[i] += src[i];
}
#endif

void EmbeddingBackward(const Tensor& dout, const Tensor& ids, Tensor& dweight) {
  const auto dims = checks::EmbeddingBackward("cpu", kF32, dout, ids, dweight);
  const int64_t v = dims.vocab, c = dims.cols, n = dims.n;
  const float* pg = dout.data<float>();
  const int32_t* pi = ids.data<int32_t>();
  float* pw = dweight.data<float>();
  CheckIds("embedding_backward", pi, n, v);
  // Repeated ids make rows collide, so threads split the columns (in groups of 8) and each
  // adds every position in order: no races, and the same result for any thread count.
  const int64_t groups = (c + 7) / 8;
  // At least 64 columns a chunk: every thread walks all n positions, so thin slices would
  // spend their time on the walk rather than on the adds.
  ParallelFor(groups, std::max<int64_t>(8, kElementGrain / (8 * std::max<int64_t>(n, 1))),
              [&](int64_t g0, int64_t g1) {
                const int64_t c0 = g0 * 8, w = std::min(c, g1 * 8) - c0;
                for (int64_t r = 0; r < n; ++r) {
                  const float* src = pg + r * c + c0;
                  float* dst = pw + int64_t(pi[r]) * c + c0;
#if BRAID_HAVE_X86
                  if (UseAvx2()) {
                    AddRowAvx2(src, w, dst);
                    continue;
                  }
#endif
                  for (int64_t i = 0; i < w; ++i) dst[i] += src[i];
                }
              });
}

}  // namespace

BRAID_REGISTER_KERNEL(kernels::layernorm_forward, DeviceType::kCPU, &LayerNormForward);
BRAID_REGISTER_KERNEL(kernels::layernorm_backward, DeviceType::kCPU, &LayerNormBackward);
BRAID_REGISTER_KERNEL(kernels::softmax_forward, DeviceType::kCPU, &SoftmaxForward);
BRAID_REGISTER_KERNEL(kernels::softmax_backward, DeviceType::kCPU, &SoftmaxBackward);
BRAID_REGISTER_KERNEL(kernels::cross_entropy_forward, DeviceType::kCPU, &CrossEntropyForward);
BRAID_REGISTER_KERNEL(kernels::cross_entropy_backward, DeviceType::kCPU, &CrossEntropyBackward);
BRAID_REGISTER_KERNEL(kernels::inverse_count_nonnegative, DeviceType::kCPU, &InverseCountNonnegative);
BRAID_REGISTER_KERNEL(kernels::embedding_forward, DeviceType::kCPU, &EmbeddingForward);
BRAID_REGISTER_KERNEL(kernels::embedding_backward, DeviceType::kCPU, &EmbeddingBackward);

}  // namespace braid::cpu
