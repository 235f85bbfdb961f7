// Internal to backends/cpu: vectorised helpers over one contiguous row, each with an AVX2
// form and a portable one, dispatched at run time.
#ifndef BRAID_BACKENDS_CPU_ROW_OPS_H_
#define BRAID_BACKENDS_CPU_ROW_OPS_H_

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backends/cpu/simd.h"

namespace braid::cpu {

#if BRAID_HAVE_X86
static inline BRAID_AVX2 float RowMaxAvx2(const float* x, int64_t c) {
  __m256 m = _mm256_set1_ps(-__builtin_inff());
  int64_t i = 0;
  for (; i + 8 <= c; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + i));
  float mx = HMax(m);
  for (; i < c; ++i) mx = std::max(mx, x[i]);
  return mx;
}

// out = exp(x - mx); returns the sum.
static inline BRAID_AVX2 float ExpShiftAvx2(const float* x, float mx, int64_t c, float* out) {
  const __m256 vm = _mm256_set1_ps(mx);
  __m256 s0 = _mm256_setzero_ps(), s1 = s0;
  int64_t i = 0;
  for (; i + 16 <= c; i += 16) {
    __m256 e0 = Exp(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
    __m256 e1 = Exp(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8), vm));
    _mm256_storeu_ps(out + i, e0);
    _mm256_storeu_ps(out + i + 8, e1);
    s0 = _mm256_add_ps(s0, e0);
    s1 = _mm256_add_ps(s1, e1);
  }
  for (; i + 8 <= c; i += 8) {
    __m256 e = Exp(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
    _mm256_storeu_ps(out + i, e);
    s0 = _mm256_add_ps(s0, e);
  }
  if (i < c) {
    __m256i m = TailMask(c - i);
    __m256 e =
        _mm256_and_ps(Exp(_mm256_sub_ps(_mm256_maskload_ps(x + i, m), vm)), _mm256_castsi256_ps(m));
    _mm256_maskstore_ps(out + i, m, e);
    s1 = _mm256_add_ps(s1, e);
  }
  return HSum(_mm256_add_ps(s0, s1));
}

static inline BRAID_AVX2 void ScaleAvx2(float* x, float s, int64_t c) {
  const __m256 vs = _mm256_set1_ps(s);
  int64_t i = 0;
  for (; i + 8 <= c; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), vs));
  for (; i < c; ++i) x[i] *= s;
}

static inline BRAID_AVX2 float DotAvx2(const float* a, const float* b, int64_t c) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0;
  int64_t i = 0;
  for (; i + 16 <= c; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  for (; i + 8 <= c; i += 8)
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  if (i < c) {
    __m256i m = TailMask(c - i);
    s1 = _mm256_fmadd_ps(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m), s1);
  }
  return HSum(_mm256_add_ps(s0, s1));
}

// dx = y * (dy - dot)
static inline BRAID_AVX2 void SoftmaxBwdRowAvx2(const float* y, const float* dy, float dot,
                                                int64_t c, float* dx) {
  const __m256 vd = _mm256_set1_ps(dot);
  int64_t i = 0;
  for (; i + 8 <= c; i += 8) {
    __m256 yi = _mm256_loadu_ps(y + i);
    _mm256_storeu_ps(dx + i, _mm256_mul_ps(yi, _mm256_sub_ps(_mm256_loadu_ps(dy + i), vd)));
  }
  for (; i < c; ++i) dx[i] = y[i] * (dy[i] - dot);
}

// out = (p - onehot) * s, the one-hot term applied by the caller.
static inline BRAID_AVX2 void ScaleCopyAvx2(const float* p, float s, int64_t c, float* out) {
  const __m256 vs = _mm256_set1_ps(s);
  int64_t i = 0;
  for (; i + 8 <= c; i += 8) _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(p + i), vs));
  for (; i < c; ++i) out[i] = p[i] * s;
}
#endif

static inline float RowMax(const float* x, int64_t c) {
#if BRAID_HAVE_X86
  if (UseAvx2()) return RowMaxAvx2(x, c);
#endif
  float mx = -INFINITY;
  for (int64_t i = 0; i < c; ++i) mx = std::max(mx, x[i]);
  return mx;
}

static inline float ExpShift(const float* x, float mx, int64_t c, float* out) {
#if BRAID_HAVE_X86
  if (UseAvx2()) return ExpShiftAvx2(x, mx, c, out);
#endif
  float s = 0;
  for (int64_t i = 0; i < c; ++i) {
    out[i] = std::exp(x[i] - mx);
    s += out[i];
  }
  return s;
}

static inline void ScaleRow(float* x, float s, int64_t c) {
#if BRAID_HAVE_X86
  if (UseAvx2()) return ScaleAvx2(x, s, c);
#endif
  for (int64_t i = 0; i < c; ++i) x[i] *= s;
}

static inline float Dot(const float* a, const float* b, int64_t c) {
#if BRAID_HAVE_X86
  if (UseAvx2()) return DotAvx2(a, b, c);
#endif
  float s = 0;
  for (int64_t i = 0; i < c; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace braid::cpu

#endif  // BRAID_BACKENDS_CPU_ROW_OPS_H_
