// The Llama-family kernels for the CPU (f32): RMSNorm, SiLU/SwiGLU, rotary embedding.
//
// Plain loops that -O3 vectorises (no intrinsics: each is memory-bound next to the matrix
// products around it), parallel over rows; SiLU/SwiGLU alone has an AVX2 path, for its exp.
// RMSNorm's weight gradient is summed in a fixed number of row slices, each into its own buffer,
// added in order: the same result for any thread count (as LayerNorm's backward).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "backends/cpu/simd.h"
#include "backends/cpu/thread_pool.h"
#include "core/check.h"
#include "core/kernel_checks.h"
#include "core/kernels.h"

namespace braid::cpu {
namespace {

namespace checks = kernels::checks;
constexpr DType kF32 = DType::kF32;

int64_t RowGrain(int64_t cols) {
  return std::max<int64_t>(1, kElementGrain / std::max<int64_t>(cols, 1));
}

// Sum of a[i] * b[i] in 8 independent f32 lanes (vectorisable without reassociating a single
// chain), then the lanes in double.
float Dot8(const float* a, const float* b, int64_t c) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= c; i += 8) {
    for (int j = 0; j < 8; ++j) lane[j] += a[i + j] * b[i + j];
  }
  double s = 0;
  for (int j = 0; j < 8; ++j) s += lane[j];
  for (; i < c; ++i) s += double(a[i]) * b[i];
  return float(s);
}

// ---- RMSNorm --------------------------------------------------------------------------------

void RmsNormForward(const Tensor& x, const Tensor& weight, float eps, Tensor& out, Tensor& rstd) {
  const auto d = checks::RmsNormForward("cpu", kF32, x, weight, out, rstd);
  const int64_t c = d.cols;
  const float* px = x.data<float>();
  const float* pw = weight.data<float>();
  float* po = out.data<float>();
  float* pr = rstd.data<float>();
  ParallelFor(d.rows, RowGrain(c), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* row = px + r * c;
      const float rs = 1.0f / std::sqrt(Dot8(row, row, c) / float(c) + eps);
      pr[r] = rs;
      float* o = po + r * c;
      for (int64_t i = 0; i < c; ++i) o[i] = row[i] * rs * pw[i];
    }
  });
}

constexpr int64_t kRmsNormSlices = 16;

void RmsNormBackward(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                     Tensor& dx, Tensor& dweight) {
  const auto d = checks::RmsNormBackward("cpu", kF32, dout, x, weight, rstd, dx, dweight);
  const int64_t rows = d.rows, c = d.cols;
  if (rows == 0) return;
  const float* pg = dout.data<float>();
  const float* px = x.data<float>();
  const float* pw = weight.data<float>();
  const float* pr = rstd.data<float>();
  float* pdx = dx.data<float>();
  const int64_t slices = std::min(kRmsNormSlices, rows);
  std::vector<float> part(size_t(slices * c), 0.0f);
  ParallelFor(slices, std::max<int64_t>(1, RowGrain(c) * slices / rows), [&](int64_t s0,
                                                                             int64_t s1) {
    std::vector<float> gw(static_cast<size_t>(c));
    for (int64_t s = s0; s < s1; ++s) {
      float* dw = part.data() + s * c;
      for (int64_t r = rows * s / slices; r < rows * (s + 1) / slices; ++r) {
        const float* g = pg + r * c;
        const float* xr = px + r * c;
        const float rs = pr[r];
        for (int64_t i = 0; i < c; ++i) gw[size_t(i)] = g[i] * pw[i];
        // y = x rs w, rs = (mean(x^2) + eps)^-1/2: dx = rs (g w - x rs^2 mean(g w x)).
        const float k = rs * rs * Dot8(gw.data(), xr, c) / float(c);
        float* o = pdx + r * c;
        for (int64_t i = 0; i < c; ++i) {
          o[i] = rs * (gw[size_t(i)] - xr[i] * k);
          dw[i] += g[i] * xr[i] * rs;
        }
      }
    }
  });
  float* pdw = dweight.data<float>();
  for (int64_t s = 0; s < slices; ++s) {
    const float* dw = part.data() + s * c;
    for (int64_t i = 0; i < c; ++i) pdw[i] += dw[i];
  }
}

// ---- SiLU and SwiGLU ------------------------------------------------------------------------
//
// The AVX2 path forms e^-g with simd.h's Exp (~2 ulp) eight lanes at a time: std::exp is a
// call per element that -O3 cannot vectorise. On llama-mini's [2048, 768] the forward went from
// 5.2 to 0.94 ms and the backward from 6.4 to 1.3 ms (llama_kernel_bench --clock=cpu), ~8% of
// the step's kernel sum. Same formulas as the scalar path, so the same special values:
// e^-g = inf for g < -88.7 gives silu = g / inf = -0 and sigmoid 0, never NaN.

#if BRAID_HAVE_X86
// g / (1 + e^-g) and, for the backward, the sigmoid 1 / (1 + e^-g).
BRAID_AVX2_INLINE __m256 SiluAvx2(__m256 g) {
  const __m256 den = _mm256_add_ps(_mm256_set1_ps(1.0f),
                                   Exp(_mm256_xor_ps(g, _mm256_set1_ps(-0.0f))));
  return _mm256_div_ps(g, den);
}

BRAID_AVX2 void SwiGluForwardAvx2(const float* pg, const float* pu, float* po, int64_t b,
                                  int64_t e) {
  int64_t i = b;
  for (; i + 8 <= e; i += 8) {
    __m256 s = SiluAvx2(_mm256_loadu_ps(pg + i));
    if (pu != nullptr) s = _mm256_mul_ps(s, _mm256_loadu_ps(pu + i));
    _mm256_storeu_ps(po + i, s);
  }
  if (i < e) {
    const __m256i m = TailMask(e - i);
    __m256 s = SiluAvx2(_mm256_maskload_ps(pg + i, m));
    if (pu != nullptr) s = _mm256_mul_ps(s, _mm256_maskload_ps(pu + i, m));
    _mm256_maskstore_ps(po + i, m, s);
  }
}

BRAID_AVX2_INLINE void SwiGluBackward8(__m256 d, __m256 g, __m256 u, bool with_up, __m256* dg,
                                       __m256* du) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 sig =
      _mm256_div_ps(one, _mm256_add_ps(one, Exp(_mm256_xor_ps(g, _mm256_set1_ps(-0.0f)))));
  // silu'(g) = sig (1 + g (1 - sig)), multiplied in the scalar path's order.
  const __m256 slope = _mm256_add_ps(one, _mm256_mul_ps(g, _mm256_sub_ps(one, sig)));
  *dg = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(d, u), sig), slope);
  if (with_up) *du = _mm256_mul_ps(_mm256_mul_ps(d, g), sig);
}

BRAID_AVX2 void SwiGluBackwardAvx2(const float* pd, const float* pg, const float* pu, float* pdg,
                                   float* pdu, int64_t b, int64_t e) {
  const __m256 one = _mm256_set1_ps(1.0f);
  __m256 dg, du;
  int64_t i = b;
  for (; i + 8 <= e; i += 8) {
    const __m256 u = pu != nullptr ? _mm256_loadu_ps(pu + i) : one;
    SwiGluBackward8(_mm256_loadu_ps(pd + i), _mm256_loadu_ps(pg + i), u, pdu != nullptr, &dg,
                    &du);
    _mm256_storeu_ps(pdg + i, dg);
    if (pdu != nullptr) _mm256_storeu_ps(pdu + i, du);
  }
  if (i < e) {
    const __m256i m = TailMask(e - i);
    const __m256 u = pu != nullptr ? _mm256_maskload_ps(pu + i, m) : one;
    SwiGluBackward8(_mm256_maskload_ps(pd + i, m), _mm256_maskload_ps(pg + i, m), u,
                    pdu != nullptr, &dg, &du);
    _mm256_maskstore_ps(pdg + i, m, dg);
    if (pdu != nullptr) _mm256_maskstore_ps(pdu + i, m, du);
  }
}
#endif  // BRAID_HAVE_X86

void SwiGluForward(const Tensor& gate, const Tensor& up, Tensor& out) {
  const int64_t n = checks::SwiGluForward("cpu", kF32, gate, up, out);
  const float* pg = gate.data<float>();
  const float* pu = up.defined() ? up.data<float>() : nullptr;
  float* po = out.data<float>();
  ParallelFor(n, kElementGrain, [&](int64_t b, int64_t e) {
#if BRAID_HAVE_X86
    if (UseAvx2()) return SwiGluForwardAvx2(pg, pu, po, b, e);
#endif
    for (int64_t i = b; i < e; ++i) {
      const float g = pg[i];
      // g / (1 + e^-g): for a finite g far below 0, e^-g overflows to inf and the quotient is
      // -0, not the NaN of g * (1 / (1 + inf)) * ... forms that multiply inf by 0.
      const float s = g / (1.0f + std::exp(-g));
      po[i] = pu != nullptr ? s * pu[i] : s;
    }
  });
}

void SwiGluBackward(const Tensor& dout, const Tensor& gate, const Tensor& up, Tensor& dgate,
                    Tensor& dup) {
  const int64_t n = checks::SwiGluBackward("cpu", kF32, dout, gate, up, dgate, dup);
  const float* pd = dout.data<float>();
  const float* pg = gate.data<float>();
  const float* pu = up.defined() ? up.data<float>() : nullptr;
  float* pdg = dgate.data<float>();
  float* pdu = dup.defined() ? dup.data<float>() : nullptr;
  ParallelFor(n, kElementGrain, [&](int64_t b, int64_t e) {
#if BRAID_HAVE_X86
    if (UseAvx2()) return SwiGluBackwardAvx2(pd, pg, pu, pdg, pdu, b, e);
#endif
    for (int64_t i = b; i < e; ++i) {
      const float g = pg[i];
      const float sig = 1.0f / (1.0f + std::exp(-g));
      const float u = pu != nullptr ? pu[i] : 1.0f;
      // silu'(g) = sig (1 + g (1 - sig)).
      pdg[i] = pd[i] * u * sig * (1.0f + g * (1.0f - sig));
      if (pdu != nullptr) pdu[i] = pd[i] * g * sig;
    }
  });
}

// ---- Rotary embedding -----------------------------------------------------------------------

// cos and sin per (time step, frequency) for T steps of a head of D, formed in double once and
// shared by every batch entry and head: T * D/2 sincos calls instead of B * T * H * D/2.
struct RopeTable {
  int64_t t, d, position_offset;
  float theta, position_scale;
  bool inverse;
  std::vector<float> cs, sn;
};

std::shared_ptr<const RopeTable> MakeRopeTable(int64_t steps, int64_t dim,
                                               const kernels::RopeParams& p) {
  auto table = std::make_shared<RopeTable>(
      RopeTable{steps, dim, p.position_offset, p.theta, p.position_scale, p.inverse, {}, {}});
  const int64_t half = dim / 2;
  std::vector<float>& cs = table->cs;
  std::vector<float>& sn = table->sn;
  cs.resize(size_t(steps * half));
  sn.resize(size_t(steps * half));
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    inv_freq[size_t(i)] = std::pow(double(p.theta), -2.0 * double(i) / double(dim));
  }
  const double sign = p.inverse ? -1.0 : 1.0;
  ParallelFor(steps, std::max<int64_t>(1, 256 / std::max<int64_t>(half, 1)), [&](int64_t t0,
                                                                                  int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const double pos = double(p.position_offset + t) / double(p.position_scale);
      for (int64_t i = 0; i < half; ++i) {
        const double a = pos * inv_freq[size_t(i)];
        cs[size_t(t * half + i)] = float(std::cos(a));
        sn[size_t(t * half + i)] = float(sign * std::sin(a));
      }
    }
  });
  return table;
}

// The tables of the last few distinct calls: a training step applies the same (T, D, theta,
// scaling) to q and k of every layer, forward and inverse, so it forms two tables once instead
// of 4 per layer per step. A few entries, not one per key ever seen: decoding with a KV cache
// asks for a new position offset at every token.
std::shared_ptr<const RopeTable> CachedRopeTable(int64_t steps, int64_t dim,
                                                 const kernels::RopeParams& p) {
  constexpr size_t kEntries = 4;
  static std::mutex mu;
  static std::vector<std::shared_ptr<const RopeTable>> cache;  // most recently used last
  auto same = [&](const RopeTable& e) {
    return e.t == steps && e.d == dim && e.position_offset == p.position_offset &&
           e.theta == p.theta && e.position_scale == p.position_scale && e.inverse == p.inverse;
  };
  {
    std::lock_guard<std::mutex> lock(mu);
    for (size_t i = 0; i < cache.size(); ++i) {
      if (same(*cache[i])) {
        std::shared_ptr<const RopeTable> hit = cache[i];
        cache.erase(cache.begin() + std::ptrdiff_t(i));
        cache.push_back(hit);
        return hit;
      }
    }
  }
  std::shared_ptr<const RopeTable> made = MakeRopeTable(steps, dim, p);  // outside the lock
  std::lock_guard<std::mutex> lock(mu);
  if (cache.size() >= kEntries) cache.erase(cache.begin());
  cache.push_back(made);
  return made;
}

void Rope(const Tensor& x, const kernels::RopeParams& p, Tensor& out) {
  const auto d = checks::Rope("cpu", kF32, x, p, out);
  const int64_t half = d.d / 2;
  if (x.numel() == 0) return;
  const std::shared_ptr<const RopeTable> table = CachedRopeTable(d.t, d.d, p);
  const std::vector<float>& cs = table->cs;
  const std::vector<float>& sn = table->sn;
  const float* px = x.data<float>();
  float* po = out.data<float>();
  const int64_t rows = d.b * d.t * d.h;
  ParallelFor(rows, RowGrain(d.d), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t t = (r / d.h) % d.t;
      const float* c = cs.data() + t * half;
      const float* s = sn.data() + t * half;
      const float* x1 = px + r * d.d;
      const float* x2 = x1 + half;
      float* o1 = po + r * d.d;
      float* o2 = o1 + half;
      for (int64_t i = 0; i < half; ++i) {
        const float a = x1[i], b = x2[i];
        o1[i] = a * c[i] - b * s[i];
        o2[i] = b * c[i] + a * s[i];
      }
    }
  });
}

}  // namespace

BRAID_REGISTER_KERNEL(kernels::rmsnorm_forward, DeviceType::kCPU, &RmsNormForward);
BRAID_REGISTER_KERNEL(kernels::rmsnorm_backward, DeviceType::kCPU, &RmsNormBackward);
BRAID_REGISTER_KERNEL(kernels::swiglu_forward, DeviceType::kCPU, &SwiGluForward);
BRAID_REGISTER_KERNEL(kernels::swiglu_backward, DeviceType::kCPU, &SwiGluBackward);
BRAID_REGISTER_KERNEL(kernels::rope, DeviceType::kCPU, &Rope);

}  // namespace braid::cpu

namespace braid::cpu {
namespace {

// The mask is kernels::DropoutKeep of each element's index: any split into ranges gives the
// same result.
void Dropout(const Tensor& x, float p, uint64_t seed, Tensor& out) {
  const int64_t n = kernels::checks::Dropout("cpu", DType::kF32, x, p, out);
  const float* px = x.data<float>();
  float* po = out.data<float>();
  const float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  ParallelFor(n, kElementGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      po[i] = kernels::DropoutKeep(seed, uint64_t(i), p) ? px[i] * scale : 0.0f;
    }
  });
}

}  // namespace

BRAID_REGISTER_KERNEL(kernels::dropout, DeviceType::kCPU, &Dropout);

}  // namespace braid::cpu
