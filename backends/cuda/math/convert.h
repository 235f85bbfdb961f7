// f32 <-> bf16 / f16 conversions on both sides, bit-identical to core's FloatToBF16,
// BF16ToFloat, FloatToF16 and F16ToFloat (core/dtype.h): round to nearest even, NaN kept quiet
// (bf16: the payload's top bits with the quiet bit set; f16: the canonical 0x7e00), overflow to
// infinity. Written out rather than using cuda_bf16.h so that host tests check the exact code
// the kernels run (and because CUDA's intrinsics return other NaN payloads).
#ifndef BRAID_BACKENDS_CUDA_MATH_CONVERT_H_
#define BRAID_BACKENDS_CUDA_MATH_CONVERT_H_

#include "backends/cuda/math/hd.h"

namespace braid::cuda::math {

BRAID_HD uint16_t FloatToBF16(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

BRAID_HD float BF16ToFloat(uint16_t h) { return BitsToFloat(uint32_t(h) << 16); }

BRAID_HD uint16_t FloatToF16(float f) {
  const uint32_t x = FloatBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) return uint16_t(sign | (absx > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (absx >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // overflows to inf after rounding
  if (absx < 0x38800000u) {  // subnormal or zero in f16
    // Scale so that the f16 subnormal unit (2^-24) becomes 1 (exact: a power of two), then
    // round to nearest even; rintf does that in the default rounding mode, as nearbyint does.
    const float scaled = BitsToFloat(absx) * 16777216.0f;
    return uint16_t(sign | uint32_t(rintf(scaled)));
  }
  const uint32_t mant = absx & 0x7fffffu;
  const uint32_t exp = (absx >> 23) - 127 + 15;
  uint32_t h = (exp << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h += 1;
  return uint16_t(sign | h);
}

BRAID_HD float F16ToFloat(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    // mant * 2^-24 is exact in f32 (at most 10 significant bits), as core's ldexp is.
    u = FloatBits(float(mant) * 5.9604644775390625e-8f) | sign;
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  return BitsToFloat(u);
}

// ---- Whole-element conversion between the three floating formats ---------------------------
// The codes are device_api.h's FloatFormat (and core's kF32 / kBF16 / kF16), checked where both
// are visible. A conversion goes through f32 once: bf16 -> f16 rounds once, as core's does.
enum class Format : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

template <Format F>
struct Elem;
template <>
struct Elem<Format::kF32> {
  using T = float;
  static BRAID_HD float Get(float v) { return v; }
  static BRAID_HD float Put(float v) { return v; }
};
template <>
struct Elem<Format::kBF16> {
  using T = uint16_t;
  static BRAID_HD float Get(uint16_t h) { return BF16ToFloat(h); }
  static BRAID_HD uint16_t Put(float f) { return FloatToBF16(f); }
};
template <>
struct Elem<Format::kF16> {
  using T = uint16_t;
  static BRAID_HD float Get(uint16_t h) { return F16ToFloat(h); }
  static BRAID_HD uint16_t Put(float f) { return FloatToF16(f); }
};

// The element type a format is stored as (float, or the 16 bits of a bf16/f16).
template <Format F>
using Stored = typename Elem<F>::T;

// dst[i] = src[i], converted from `From` to `To` (the same format: the bits, NaN payloads
// included, as core's copy keeps them).
template <Format From, Format To>
BRAID_HD void ConvertOne(const void* src, void* dst, int64_t i) {
  using S = typename Elem<From>::T;
  using D = typename Elem<To>::T;
  if constexpr (From == To) {
    static_cast<D*>(dst)[i] = static_cast<const S*>(src)[i];
  } else {
    static_cast<D*>(dst)[i] = Elem<To>::Put(Elem<From>::Get(static_cast<const S*>(src)[i]));
  }
}

template <Format F>
struct FormatTag {
  static constexpr Format value = F;
};

// Calls f(FormatTag<from>{}, FormatTag<to>{}) with the formats as compile-time constants (host
// side: the CUDA launcher picks its kernel with it, the fake device converts with it).
template <typename Fn>
void DispatchFormats(Format from, Format to, Fn&& f) {
  auto with_to = [&](auto from_tag) {
    switch (to) {
      case Format::kF32: return f(from_tag, FormatTag<Format::kF32>{});
      case Format::kBF16: return f(from_tag, FormatTag<Format::kBF16>{});
      case Format::kF16: return f(from_tag, FormatTag<Format::kF16>{});
    }
  };
  switch (from) {
    case Format::kF32: return with_to(FormatTag<Format::kF32>{});
    case Format::kBF16: return with_to(FormatTag<Format::kBF16>{});
    case Format::kF16: return with_to(FormatTag<Format::kF16>{});
  }
}

// Bytes per element of a format.
BRAID_HD int FormatSize(Format f) { return f == Format::kF32 ? 4 : 2; }

}  // namespace braid::cuda::math

#endif  // BRAID_BACKENDS_CUDA_MATH_CONVERT_H_
