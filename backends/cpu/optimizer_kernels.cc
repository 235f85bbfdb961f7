// In-place optimizer updates for the CPU, with PyTorch's semantics.
#include <cmath>

#include "backends/cpu/simd.h"
#include "backends/cpu/thread_pool.h"
#include "core/kernel_checks.h"
#include "core/kernels.h"

namespace braid::cpu {
namespace {

using kernels::AdamWParams;
using kernels::SgdParams;

// AdamW with bias correction folded into two scalars:
//   w <- w (1 - lr wd) - step_size * m / (sqrt(v) * inv_sqrt_bc2 + eps),
//   step_size = lr / (1 - beta1^t), inv_sqrt_bc2 = 1 / sqrt(1 - beta2^t).
struct AdamWConsts {
  float b1, one_minus_b1, b2, one_minus_b2, decay, step_size, inv_sqrt_bc2, eps;
};

#if BRAID_HAVE_X86
struct AdamWVecConsts {
  __m256 b1, omb1, b2, omb2, decay, step, isb, eps;
};

BRAID_AVX2_INLINE void AdamWVec(const AdamWVecConsts& k, __m256 g, __m256& m, __m256& v,
                                __m256& w) {
  m = _mm256_fmadd_ps(k.b1, m, _mm256_mul_ps(k.omb1, g));
  v = _mm256_fmadd_ps(k.b2, v, _mm256_mul_ps(k.omb2, _mm256_mul_ps(g, g)));
  const __m256 denom = _mm256_fmadd_ps(_mm256_sqrt_ps(v), k.isb, k.eps);
  w = _mm256_fnmadd_ps(k.step, _mm256_div_ps(m, denom), _mm256_mul_ps(w, k.decay));
}

BRAID_AVX2 void AdamWAvx2(const AdamWConsts& c, float* w, const float* g, float* m, float* v,
                          int64_t n) {
  AdamWVecConsts k;
  k.b1 = _mm256_set1_ps(c.b1);
  k.omb1 = _mm256_set1_ps(c.one_minus_b1);
  k.b2 = _mm256_set1_ps(c.b2);
  k.omb2 = _mm256_set1_ps(c.one_minus_b2);
  k.decay = _mm256_set1_ps(c.decay);
  k.step = _mm256_set1_ps(c.step_size);
  k.isb = _mm256_set1_ps(c.inv_sqrt_bc2);
  k.eps = _mm256_set1_ps(c.eps);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 mi = _mm256_loadu_ps(m + i), vi = _mm256_loadu_ps(v + i), wi = _mm256_loadu_ps(w + i);
    AdamWVec(k, _mm256_loadu_ps(g + i), mi, vi, wi);
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
    _mm256_storeu_ps(w + i, wi);
  }
  if (i < n) {
    const __m256i t = TailMask(n - i);
    __m256 mi = _mm256_maskload_ps(m + i, t), vi = _mm256_maskload_ps(v + i, t);
    __m256 wi = _mm256_maskload_ps(w + i, t);
    AdamWVec(k, _mm256_maskload_ps(g + i, t), mi, vi, wi);
    _mm256_maskstore_ps(m + i, t, mi);
    _mm256_maskstore_ps(v + i, t, vi);
    _mm256_maskstore_ps(w + i, t, wi);
  }
}
#endif

void AdamWScalar(const AdamWConsts& k, float* w, const float* g, float* m, float* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float mi = k.b1 * m[i] + k.one_minus_b1 * g[i];
    const float vi = k.b2 * v[i] + k.one_minus_b2 * g[i] * g[i];
    m[i] = mi;
    v[i] = vi;
    w[i] = w[i] * k.decay - k.step_size * mi / (std::sqrt(vi) * k.inv_sqrt_bc2 + k.eps);
  }
}

void AdamW(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& p) {
  kernels::checks::AdamW("cpu", param, grad, m, v, p);
  const int64_t n = param.numel();
  const double bc1 = 1.0 - std::pow(double(p.beta1), double(p.step));
  const double bc2 = 1.0 - std::pow(double(p.beta2), double(p.step));
  AdamWConsts k;
  k.b1 = p.beta1;
  k.one_minus_b1 = float(1.0 - double(p.beta1));
  k.b2 = p.beta2;
  k.one_minus_b2 = float(1.0 - double(p.beta2));
  k.decay = float(1.0 - double(p.lr) * double(p.weight_decay));
  k.step_size = float(double(p.lr) / bc1);
  k.inv_sqrt_bc2 = float(1.0 / std::sqrt(bc2));
  k.eps = p.eps;
  float* pw = param.data<float>();
  const float* pg = grad.data<float>();
  float* pm = m.data<float>();
  float* pv = v.data<float>();
  ParallelFor(n, kElementGrain / 2, [&](int64_t b, int64_t e) {
#if BRAID_HAVE_X86
    ScopedFlushDenormals ftz;
    if (UseAvx2()) return AdamWAvx2(k, pw + b, pg + b, pm + b, pv + b, e - b);
#endif
    AdamWScalar(k, pw + b, pg + b, pm + b, pv + b, e - b);
  });
}

// SGD as torch.optim.SGD: d = g + wd w; with momentum, buf = d on the first step, else
// buf = momentum buf + (1 - dampening) d; d = nesterov ? d + momentum buf : buf; w -= lr d.
template <bool kMomentum, bool kNesterov>
void SgdScalar(const SgdParams& p, float* w, const float* g, float* buf, int64_t n) {
  const float wd = p.weight_decay, mom = p.momentum, damp = 1.0f - p.dampening, lr = p.lr;
  for (int64_t i = 0; i < n; ++i) {
    float d = g[i] + wd * w[i];
    if (kMomentum) {
      const float b = p.first_step ? d : mom * buf[i] + damp * d;
      buf[i] = b;
      d = kNesterov ? d + mom * b : b;
    }
    w[i] = w[i] - lr * d;
  }
}

#if BRAID_HAVE_X86
template <bool kMomentum, bool kNesterov>
BRAID_AVX2 void SgdAvx2(const SgdParams& p, float* w, const float* g, float* buf, int64_t n) {
  const __m256 wd = _mm256_set1_ps(p.weight_decay), mom = _mm256_set1_ps(p.momentum);
  const __m256 damp = _mm256_set1_ps(1.0f - p.dampening), lr = _mm256_set1_ps(p.lr);
  const bool first = p.first_step;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 wi = _mm256_loadu_ps(w + i);
    __m256 d = _mm256_fmadd_ps(wd, wi, _mm256_loadu_ps(g + i));
    if (kMomentum) {
      __m256 b = first ? d : _mm256_fmadd_ps(mom, _mm256_loadu_ps(buf + i), _mm256_mul_ps(damp, d));
      _mm256_storeu_ps(buf + i, b);
      d = kNesterov ? _mm256_fmadd_ps(mom, b, d) : b;
    }
    _mm256_storeu_ps(w + i, _mm256_fnmadd_ps(lr, d, wi));
  }
  SgdScalar<kMomentum, kNesterov>(p, w + i, g + i, kMomentum ? buf + i : nullptr, n - i);
}
#endif

template <bool kMomentum, bool kNesterov>
void SgdTyped(const SgdParams& p, float* w, const float* g, float* buf, int64_t n) {
  ParallelFor(n, kElementGrain / 2, [&](int64_t b, int64_t e) {
    float* bb = kMomentum ? buf + b : nullptr;
#if BRAID_HAVE_X86
    ScopedFlushDenormals ftz;
    if (UseAvx2()) return SgdAvx2<kMomentum, kNesterov>(p, w + b, g + b, bb, e - b);
#endif
    SgdScalar<kMomentum, kNesterov>(p, w + b, g + b, bb, e - b);
  });
}

void Sgd(Tensor& param, const Tensor& grad, Tensor& momentum_buf, const SgdParams& p) {
  kernels::checks::Sgd("cpu", param, grad, momentum_buf, p);
  const int64_t n = param.numel();
  float* pw = param.data<float>();
  const float* pg = grad.data<float>();
  if (p.momentum == 0.0f) return SgdTyped<false, false>(p, pw, pg, nullptr, n);
  float* pb = momentum_buf.data<float>();
  if (p.nesterov) return SgdTyped<true, true>(p, pw, pg, pb, n);
  SgdTyped<true, false>(p, pw, pg, pb, n);
}

}  // namespace

BRAID_REGISTER_KERNEL(kernels::adamw, DeviceType::kCPU, &AdamW);
BRAID_REGISTER_KERNEL(kernels::sgd, DeviceType::kCPU, &Sgd);

}  // namespace braid::cpu
