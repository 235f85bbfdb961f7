// Internal to backends/cpu: run-time ISA selection and AVX2 vector helpers.
//
// Functions that use AVX2 intrinsics carry BRAID_AVX2 (a per-function target attribute), so the
// library itself compiles for the baseline ISA and only these functions use AVX2/FMA/F16C. They
// may only be called when UseAvx2() is true. Helpers are static inline in this header so each
// kernel file gets its own copies (no cross-ISA symbol merging at link time).
#ifndef BRAID_BACKENDS_CPU_SIMD_H_
#define BRAID_BACKENDS_CPU_SIMD_H_

#include <atomic>
#include <cstdint>

#if defined(__x86_64__)
#define BRAID_HAVE_X86 1
#include <immintrin.h>
#define BRAID_AVX2 __attribute__((target("avx2,fma,f16c")))
#define BRAID_AVX2_INLINE static inline __attribute__((target("avx2,fma,f16c"), always_inline))
#else
#define BRAID_HAVE_X86 0
#endif

namespace braid::cpu {

namespace internal {
extern std::atomic<bool> g_use_avx2;
}  // namespace internal

inline bool UseAvx2() { return internal::g_use_avx2.load(std::memory_order_relaxed); }

// Contiguous elements handled per parallel chunk by the memory-bound loops: big enough to
// amortise a hand-off to another thread, small enough to split the gpt-mini activations.
inline constexpr int64_t kElementGrain = 1 << 15;

#if BRAID_HAVE_X86

// Flushes subnormal results and inputs to zero (MXCSR FTZ+DAZ) on this thread for its scope.
// Optimizer state of parameters whose gradient stays zero (embedding rows of unused tokens)
// decays geometrically into the subnormal range within ~1000 steps, where every operation on
// it is a microcode assist on Intel CPUs; flushing changes only values below 1.2e-38.
class ScopedFlushDenormals {
 public:
  ScopedFlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040u); }
  ~ScopedFlushDenormals() { _mm_setcsr(saved_); }
  ScopedFlushDenormals(const ScopedFlushDenormals&) = delete;
  ScopedFlushDenormals& operator=(const ScopedFlushDenormals&) = delete;

 private:
  unsigned saved_;
};

// Lanes [0, n) set, for masked loads/stores of a tail of n < 8 elements.
BRAID_AVX2_INLINE __m256i TailMask(int64_t n) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(n)), idx);
}

BRAID_AVX2_INLINE float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

BRAID_AVX2_INLINE float HMax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// exp(x), Cephes-style: x = n ln2 + r with |r| <= ln2/2, a degree-6 polynomial for e^r, then
// scaling by 2^n through the exponent bits. Within ~2 ulp; 0 below -87.3, +inf above 88.72,
// NaN in gives NaN out. Rounding to n uses the 1.5 * 2^23 trick, which leaves n in the low
// mantissa bits of t, and the special cases use masks rather than blends (fewer uops).
BRAID_AVX2_INLINE __m256 Exp(__m256 x) {
  const __m256 hi = _mm256_set1_ps(88.7228394f), lo = _mm256_set1_ps(-87.3365448f);
  const __m256 magic = _mm256_set1_ps(12582912.0f);
  // Lanes below lo are zeroed at the end; computing them as exp(0) meanwhile keeps the
  // intermediate p * 2^n out of the subnormal range, whose arithmetic is microcoded on x86
  // (tens of times slower). min(const, x) keeps NaN.
  const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  __m256 xc = _mm256_min_ps(hi, _mm256_andnot_ps(under, x));
  __m256 t = _mm256_fmadd_ps(xc, _mm256_set1_ps(1.44269504088896341f), magic);
  __m256 fx = _mm256_sub_ps(t, magic);
  __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), xc);
  r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  __m256 r2 = _mm256_mul_ps(r, r);
  p = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // n = 128 (x just below the overflow bound) has no exponent code: use 2 * 2^127.
  __m256 top = _mm256_cmp_ps(fx, _mm256_set1_ps(127.5f), _CMP_GT_OQ);
  p = _mm256_add_ps(p, _mm256_and_ps(p, top));
  __m256i e =
      _mm256_add_epi32(_mm256_slli_epi32(_mm256_castps_si256(t), 23), _mm256_set1_epi32(127 << 23));
  e = _mm256_add_epi32(e, _mm256_and_si256(_mm256_castps_si256(top),
                                           _mm256_set1_epi32(int(0xff800000u))));  // n - 1
  __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  y = _mm256_andnot_ps(under, y);
  // max(inf or 0, y): y is never negative, and a NaN y (second operand) is kept.
  return _mm256_max_ps(
      _mm256_and_ps(_mm256_cmp_ps(x, hi, _CMP_GT_OQ), _mm256_set1_ps(__builtin_inff())), y);
}

// log(x), Cephes-style: x = m 2^e with m in [sqrt(1/2), sqrt(2)), a polynomial in m - 1.
// Subnormals are handled; log(0) = -inf, log(x < 0) = NaN, log(inf) = inf.
BRAID_AVX2_INLINE __m256 Log(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f);
  // Scale subnormals into the normal range first.
  __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(1.17549435e-38f), _CMP_LT_OQ);
  __m256 xs = _mm256_blendv_ps(x, _mm256_mul_ps(x, _mm256_set1_ps(8388608.0f)), tiny);
  __m256 eadj = _mm256_and_ps(tiny, _mm256_set1_ps(-23.0f));
  __m256i bits = _mm256_castps_si256(xs);
  __m256 e =
      _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(bits, 23), _mm256_set1_epi32(126)));
  e = _mm256_add_ps(e, eadj);
  __m256 m = _mm256_castsi256_ps(_mm256_or_si256(
      _mm256_and_si256(bits, _mm256_set1_epi32(0x007fffff)), _mm256_set1_epi32(0x3f000000)));
  // m in [0.5, 1): fold below sqrt(1/2) to keep m - 1 small.
  __m256 small = _mm256_cmp_ps(m, _mm256_set1_ps(0.707106781186547524f), _CMP_LT_OQ);
  e = _mm256_sub_ps(e, _mm256_and_ps(small, one));
  m = _mm256_sub_ps(_mm256_add_ps(m, _mm256_and_ps(small, m)), one);
  __m256 z = _mm256_mul_ps(m, m);
  __m256 p = _mm256_set1_ps(7.0376836292e-2f);
  p = _mm256_fmadd_ps(p, m, _mm256_set1_ps(-1.1514610310e-1f));
  p = _mm256_fmadd_ps(p, m, _mm256_set1_ps(1.1676998740e-1f));
  p = _mm256_fmadd_ps(p, m, _mm256_set1_ps(-1.2420140846e-1f));
  p = _mm256_fmadd_ps(p, m, _mm256_set1_ps(1.4249322787e-1f));
  p = _mm256_fmadd_ps(p, m, _mm256_set1_ps(-1.6668057665e-1f));
  p = _mm256_fmadd_ps(p, m, _mm256_set1_ps(2.0000714765e-1f));
  p = _mm256_fmadd_ps(p, m, _mm256_set1_ps(-2.4999993993e-1f));
  p = _mm256_fmadd_ps(p, m, _mm256_set1_ps(3.3333331174e-1f));
  __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, m), z);
  y = _mm256_fmadd_ps(e, _mm256_set1_ps(-2.12194440e-4f), y);
  y = _mm256_fnmadd_ps(z, _mm256_set1_ps(0.5f), y);
  __m256 r = _mm256_add_ps(m, y);
  r = _mm256_fmadd_ps(e, _mm256_set1_ps(0.693359375f), r);
  // Special values.
  r = _mm256_blendv_ps(r, _mm256_set1_ps(-__builtin_inff()),
                       _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_EQ_OQ));
  r = _mm256_blendv_ps(r, _mm256_set1_ps(__builtin_inff()),
                       _mm256_cmp_ps(x, _mm256_set1_ps(__builtin_inff()), _CMP_EQ_OQ));
  r = _mm256_blendv_ps(r, _mm256_set1_ps(__builtin_nanf("")),
                       _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_NGE_UQ));  // x < 0 or NaN
  return r;
}

// tanh(u) and sech^2(u) = 1 - tanh^2(u) from one e = exp(-2|u|), which never overflows:
// tanh = sign(u) (1 - e) / (1 + e), sech^2 = 4 e / (1 + e)^2. The sech^2 form keeps its
// relative accuracy where tanh saturates (1 - t*t would lose it all to t's rounding).
BRAID_AVX2_INLINE __m256 TanhSech2(__m256 u, __m256* sech2) {
  const __m256 one = _mm256_set1_ps(1.0f), sign_bit = _mm256_set1_ps(-0.0f);
  __m256 sign = _mm256_and_ps(u, sign_bit);
  __m256 au = _mm256_andnot_ps(sign_bit, u);
  __m256 e = Exp(_mm256_mul_ps(au, _mm256_set1_ps(-2.0f)));
  __m256 inv = _mm256_div_ps(one, _mm256_add_ps(one, e));
  if (sech2 != nullptr) {
    *sech2 = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(4.0f), e), _mm256_mul_ps(inv, inv));
  }
  return _mm256_or_ps(_mm256_mul_ps(_mm256_sub_ps(one, e), inv), sign);
}

// tanh(x) with relative accuracy near 0: an odd Taylor polynomial for |x| < 0.3 (where
// 1 - e would cancel), TanhSech2's form elsewhere.
BRAID_AVX2_INLINE __m256 Tanh(__m256 x) {
  __m256 big = TanhSech2(x, nullptr);
  __m256 x2 = _mm256_mul_ps(x, x);
  __m256 p = _mm256_set1_ps(-0.0088632355299021966f);                  // -1382/155925
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(0.021869488536155203f));   // 62/2835
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(-0.053968253968253971f));  // -17/315
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(0.13333333333333333f));    // 2/15
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(-0.33333333333333333f));
  __m256 smallv = _mm256_fmadd_ps(_mm256_mul_ps(p, x2), x, x);
  __m256 ax = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
  return _mm256_blendv_ps(big, smallv, _mm256_cmp_ps(ax, _mm256_set1_ps(0.3f), _CMP_LT_OQ));
}

#endif  // BRAID_HAVE_X86

inline constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
inline constexpr float kGeluA = 0.044715f;

}  // namespace braid::cpu

#endif  // BRAID_BACKENDS_CPU_SIMD_H_
