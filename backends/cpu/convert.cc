// Vectorised conversions between f32 and bf16/f16, bit-identical to core's scalar FloatToBF16,
// BF16ToFloat, FloatToF16 and F16ToFloat (checked on every input pattern by convert_test).
#include "backends/cpu/convert.h"

#include <cstring>

#include "backends/cpu/simd.h"
#include "core/check.h"

namespace braid::cpu {
namespace {

// ---- dtype conversion ---------------------------------------------------------------------

#if BRAID_HAVE_X86
// Exactly FloatToBF16 (round to nearest even, NaN kept quiet), 8 at a time.
BRAID_AVX2_INLINE __m128i F32ToBF16x8(__m256 x) {
  __m256i u = _mm256_castps_si256(x);
  __m256i absu = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  __m256i is_nan = _mm256_cmpgt_epi32(absu, _mm256_set1_epi32(0x7f800000));
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
  __m256i nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  __m256i r = _mm256_blendv_epi8(rounded, nan, is_nan);
  // packus works within 128-bit lanes: gather the two useful quadwords afterwards.
  __m256i packed = _mm256_packus_epi32(r, r);
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}

BRAID_AVX2_INLINE __m256 BF16ToF32x8(__m128i h) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

BRAID_AVX2 void F32ToBF16Avx2(const float* s, uint16_t* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), F32ToBF16x8(_mm256_loadu_ps(s + i)));
  }
  for (; i < n; ++i) d[i] = FloatToBF16(s[i]);
}

BRAID_AVX2 void BF16ToF32Avx2(const uint16_t* s, float* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(d + i, BF16ToF32x8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
  }
  for (; i < n; ++i) d[i] = BF16ToFloat(s[i]);
}

// F16C rounds to nearest even like FloatToF16; only NaN payloads differ (core always writes
// the canonical quiet NaN), so a block holding a NaN takes the scalar path.
BRAID_AVX2 void F32ToF16Avx2(const float* s, uint16_t* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 x = _mm256_loadu_ps(s + i);
    if (_mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)) != 0) {
      for (int j = 0; j < 8; ++j) d[i + j] = FloatToF16(s[i + j]);
      continue;
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; i < n; ++i) d[i] = FloatToF16(s[i]);
}

BRAID_AVX2 void F16ToF32Avx2(const uint16_t* s, float* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    // Exponent all ones with a mantissa: a NaN, whose payload the hardware would alter.
    __m128i e = _mm_and_si128(h, _mm_set1_epi16(0x7fff));
    if (_mm_movemask_epi8(_mm_cmpgt_epi16(e, _mm_set1_epi16(0x7c00))) != 0) {
      for (int j = 0; j < 8; ++j) d[i + j] = F16ToFloat(s[i + j]);
      continue;
    }
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) d[i] = F16ToFloat(s[i]);
}
#endif

}  // namespace

void ToF32(DType t, const void* src, float* dst, int64_t n) {
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, size_t(n) * 4);
      return;
    case DType::kBF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
#if BRAID_HAVE_X86
      if (UseAvx2()) return BF16ToF32Avx2(s, dst, n);
#endif
      for (int64_t i = 0; i < n; ++i) dst[i] = BF16ToFloat(s[i]);
      return;
    }
    case DType::kF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
#if BRAID_HAVE_X86
      if (UseAvx2()) return F16ToF32Avx2(s, dst, n);
#endif
      for (int64_t i = 0; i < n; ++i) dst[i] = F16ToFloat(s[i]);
      return;
    }
    default:
      BRAID_CHECK(false) << "not a floating dtype: " << DTypeName(t);
  }
}

void FromF32(DType t, const float* src, void* dst, int64_t n) {
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, size_t(n) * 4);
      return;
    case DType::kBF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
#if BRAID_HAVE_X86
      if (UseAvx2()) return F32ToBF16Avx2(src, d, n);
#endif
      for (int64_t i = 0; i < n; ++i) d[i] = FloatToBF16(src[i]);
      return;
    }
    case DType::kF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
#if BRAID_HAVE_X86
      if (UseAvx2()) return F32ToF16Avx2(src, d, n);
#endif
      for (int64_t i = 0; i < n; ++i) d[i] = FloatToF16(src[i]);
      return;
    }
    default:
      BRAID_CHECK(false) << "not a floating dtype: " << DTypeName(t);
  }
}

}  // namespace braid::cpu
