// Per-element math of the Llama-family CUDA kernels (kernels/llama.cu): SiLU/SwiGLU and their
// derivatives, RMSNorm's row statistic and outputs, the rotary embedding's pair rotation, the
// dropout mask, written as the CPU backend's portable paths (backends/cpu/llama_kernels.cc)
// operation for operation, so that compiled for the host they give its results bit for bit
// (llama_math_test.cc). On the GPU nvcc contracts multiply-adds and expf is within 2 ulp of
// glibc's, so results there agree to a few ulp (kernels_gpu_test.cc).
#ifndef BRAID_BACKENDS_CUDA_MATH_LLAMA_H_
#define BRAID_BACKENDS_CUDA_MATH_LLAMA_H_

#include <cstdint>

#include "backends/cuda/math/hd.h"

namespace braid::cuda::math {

// silu(g) = g / (1 + e^-g): for a finite g far below 0, e^-g overflows to inf and the quotient
// is -0, never the NaN of forms that multiply inf by 0.
BRAID_HD float Silu(float g) { return g / (1.0f + expf(-g)); }

// SwiGLU's output: silu(gate) * up, or silu(gate) alone (plain SiLU) when there is no `up`.
BRAID_HD float SwiGlu(float g, const float* up) { return up != nullptr ? Silu(g) * *up : Silu(g); }

// dgate = dout * up * silu'(gate), silu'(g) = sig (1 + g (1 - sig)); dup = dout * g * sig.
// `u` is 1 for plain SiLU.
BRAID_HD float SwiGluDgate(float d, float g, float u) {
  const float sig = 1.0f / (1.0f + expf(-g));
  return d * u * sig * (1.0f + g * (1.0f - sig));
}
BRAID_HD float SwiGluDup(float d, float g) {
  const float sig = 1.0f / (1.0f + expf(-g));
  return d * g * sig;
}

// RMSNorm: rstd = 1 / sqrt(sum(x^2) / C + eps) from the row's sum of squares; y = x rstd w.
BRAID_HD float RmsNormRstd(float sum_squares, int64_t c, float eps) {
  return 1.0f / sqrtf(sum_squares / float(c) + eps);
}
BRAID_HD float RmsNormOut(float x, float rs, float w) { return x * rs * w; }
// The backward's row constant k = rs^2 mean(g w x), from dot = sum(g w x); then
// dx = rs (g w - x k) and the weight gradient's term g x rs.
BRAID_HD float RmsNormK(float rs, float dot, int64_t c) { return rs * rs * dot / float(c); }
BRAID_HD float RmsNormDx(float gw, float x, float rs, float k) { return rs * (gw - x * k); }
BRAID_HD float RmsNormDwTerm(float g, float x, float rs) { return g * x * rs; }

// The rotary embedding's angle for sequence position `pos` (already offset and scaled) and
// frequency i of a head of `dim`, in double, as the CPU forms its cos/sin table: an f32 angle at
// position 10^4 is off by ~1e-3 rad. `inverse` rotates the other way (the backward).
BRAID_HD void RopeCosSin(double pos, int64_t i, int64_t dim, double theta, bool inverse,
                         float* c, float* s) {
  const double a = pos * pow(theta, -2.0 * double(i) / double(dim));
  *c = float(cos(a));
  *s = float((inverse ? -1.0 : 1.0) * sin(a));
}
// The pair (x[i], x[i + D/2]) rotated: out[i] = a c - b s, out[i + D/2] = b c + a s.
BRAID_HD void RopeRotate(float a, float b, float c, float s, float* o1, float* o2) {
  *o1 = a * c - b * s;
  *o2 = b * c + a * s;
}

// Dropout's mask, kernels::DropoutKeep (core/kernels.h) for both sides: SplitMix64's finaliser
// of seed + (i + 1) * golden ratio, its top 24 bits as u in [0, 1), kept when u >= p. A copy
// because this header must not include core; llama_math_test.cc checks the two agree.
BRAID_HD bool DropoutKeep(uint64_t seed, uint64_t i, float p) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return float(z >> 40) * (1.0f / 16777216.0f) >= p;
}
BRAID_HD float DropoutScale(float p) { return p < 1.0f ? 1.0f / (1.0f - p) : 0.0f; }

}  // namespace braid::cuda::math

#endif  // BRAID_BACKENDS_CUDA_MATH_LLAMA_H_
