// bf16/f16 conversions against independent computations: decoding by the IEEE formula, and
// encoding by searching the sorted table of all representable values for the nearest one.
#include "core/dtype.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace braid {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Value of a non-negative binary floating-point pattern with `mant_bits` mantissa bits and an
// exponent bias `bias`, with no special case for the all-ones exponent: that pattern's value is
// then the next power of two past the largest finite value, the rounding boundary IEEE uses for
// overflow.
double DecodeUnbounded(uint32_t h, int mant_bits, int bias) {
  uint32_t exp = h >> mant_bits;
  uint32_t mant = h & ((1u << mant_bits) - 1);
  if (exp == 0) return std::ldexp(double(mant), 1 - bias - mant_bits);
  return std::ldexp(double(mant + (1u << mant_bits)), int(exp) - bias - mant_bits);
}

struct Format {
  int mant_bits;
  int bias;
  uint32_t inf;  // bit pattern of +inf
};
constexpr Format kBF16{7, 127, 0x7f80};
constexpr Format kF16{10, 15, 0x7c00};

// Decodes a 16-bit pattern of `fmt` with sign, inf and NaN.
double Decode(uint16_t h, const Format& fmt) {
  const bool neg = h & 0x8000;
  const uint32_t mag = h & 0x7fff;
  double v;
  if (mag > fmt.inf) {
    v = std::numeric_limits<double>::quiet_NaN();
  } else if (mag == fmt.inf) {
    v = std::numeric_limits<double>::infinity();
  } else {
    v = DecodeUnbounded(mag, fmt.mant_bits, fmt.bias);
  }
  return neg ? -v : v;
}

// Round-to-nearest-even encoding of a finite or infinite, non-NaN float: binary search for the
// first pattern whose value is >= |f| among 0 .. inf (their values increase with the pattern),
// then pick the nearer neighbour, the even pattern on a tie.
uint16_t EncodeBySearch(float f, const Format& fmt) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(double(f));
  if (std::isinf(a)) return uint16_t(sign | fmt.inf);
  if (a > DecodeUnbounded(fmt.inf, fmt.mant_bits, fmt.bias)) return uint16_t(sign | fmt.inf);
  uint32_t lo = 0, hi = fmt.inf;  // invariant: value(hi) >= a
  while (lo < hi) {
    uint32_t mid = (lo + hi) / 2;
    if (DecodeUnbounded(mid, fmt.mant_bits, fmt.bias) >= a) hi = mid; else lo = mid + 1;
  }
  uint32_t up = lo;
  if (up == 0) return sign;
  uint32_t down = up - 1;
  double dup = DecodeUnbounded(up, fmt.mant_bits, fmt.bias) - a;
  double ddown = a - DecodeUnbounded(down, fmt.mant_bits, fmt.bias);
  uint32_t pick = dup < ddown ? up : ddown < dup ? down : ((up & 1) ? down : up);
  return uint16_t(sign | pick);
}

TEST(DTypeTest, SizesNamesAndParsing) {
  EXPECT_EQ(SizeOf(DType::kF32), 4u);
  EXPECT_EQ(SizeOf(DType::kBF16), 2u);
  EXPECT_EQ(SizeOf(DType::kF16), 2u);
  EXPECT_EQ(SizeOf(DType::kI64), 8u);
  EXPECT_EQ(SizeOf(DType::kU8), 1u);
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32, DType::kI64, DType::kU8,
                  DType::kI8}) {
    auto parsed = ParseDType(DTypeName(t));
    ASSERT_TRUE(parsed.ok()) << DTypeName(t);
    EXPECT_EQ(*parsed, t);
  }
  auto bad = ParseDType("float32");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("float32"), absl::string_view::npos);
  EXPECT_TRUE(IsFloating(DType::kBF16));
  EXPECT_FALSE(IsFloating(DType::kI32));
}

TEST(DTypeTest, DecodesEveryBF16Pattern) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    double want = Decode(uint16_t(h), kBF16);
    float got = BF16ToFloat(uint16_t(h));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << std::hex << h;
    } else {
      ASSERT_EQ(double(got), want) << std::hex << h;
      ASSERT_EQ(std::signbit(got), bool(h & 0x8000)) << std::hex << h;
    }
  }
}

TEST(DTypeTest, DecodesEveryF16Pattern) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    double want = Decode(uint16_t(h), kF16);
    float got = F16ToFloat(uint16_t(h));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << std::hex << h;
    } else {
      ASSERT_EQ(double(got), want) << std::hex << h;
      ASSERT_EQ(std::signbit(got), bool(h & 0x8000)) << std::hex << h;
    }
  }
}

TEST(DTypeTest, EveryNonNaNPatternRoundTrips) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    if (!std::isnan(BF16ToFloat(uint16_t(h)))) {
      ASSERT_EQ(FloatToBF16(BF16ToFloat(uint16_t(h))), h) << "bf16 " << std::hex << h;
    }
    if (!std::isnan(F16ToFloat(uint16_t(h)))) {
      ASSERT_EQ(FloatToF16(F16ToFloat(uint16_t(h))), h) << "f16 " << std::hex << h;
    }
  }
}

// Midpoints between neighbouring representable values (exact in f32, which has more mantissa
// bits), and the floats just either side: ties must go to the even pattern.
void CheckMidpoints(const Format& fmt, uint16_t (*encode)(float)) {
  int ties_up = 0, ties_down = 0;
  for (uint32_t h = 0; h < fmt.inf; ++h) {
    double lo = DecodeUnbounded(h, fmt.mant_bits, fmt.bias);
    double hi = DecodeUnbounded(h + 1, fmt.mant_bits, fmt.bias);
    float mid = float((lo + hi) / 2);
    ASSERT_EQ(double(mid), (lo + hi) / 2) << "midpoint not exact in f32 at " << h;
    for (float sign : {1.0f, -1.0f}) {
      float m = sign * mid;
      uint16_t want = EncodeBySearch(m, fmt);
      ASSERT_EQ(encode(m), want) << "tie " << m << " after pattern " << std::hex << h;
      ASSERT_EQ(want & 1, 0) << "a tie must round to the even pattern";
      float below = std::nextafter(m, 0.0f), above = std::nextafter(m, sign * INFINITY);
      ASSERT_EQ(encode(below), EncodeBySearch(below, fmt)) << below;
      ASSERT_EQ(encode(above), EncodeBySearch(above, fmt)) << above;
      ASSERT_EQ(encode(below) & 0x7fff, h) << "just below a midpoint rounds down";
      ASSERT_EQ(encode(above) & 0x7fff, h + 1) << "just above a midpoint rounds up";
    }
    ++((h & 1) ? ties_up : ties_down);  // odd h: the even neighbour is above
  }
  // Both directions of tie-breaking were exercised.
  EXPECT_GT(ties_up, 1000);
  EXPECT_GT(ties_down, 1000);
}

TEST(DTypeTest, BF16RoundsMidpointsToEven) {
  CheckMidpoints(kBF16, &FloatToBF16);
}

TEST(DTypeTest, F16RoundsMidpointsToEven) { CheckMidpoints(kF16, &FloatToF16); }

TEST(DTypeTest, RandomFloatsRoundToNearest) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> any_bits;
  // f16 only covers 2^-24 .. 65504: draw exponents around that range too, or nearly every
  // random f32 would be 0 or inf there.
  std::uniform_int_distribution<uint32_t> f16_exp(127 - 26, 127 + 17);
  for (int i = 0; i < 200000; ++i) {
    float f = FromBits(any_bits(rng));
    if (!std::isnan(f)) {
      ASSERT_EQ(FloatToBF16(f), EncodeBySearch(f, kBF16)) << f;
    }
    uint32_t u = (any_bits(rng) & 0x807fffffu) | (f16_exp(rng) << 23);
    float g = FromBits(u);
    ASSERT_EQ(FloatToF16(g), EncodeBySearch(g, kF16)) << g << " bits " << std::hex << u;
  }
}

TEST(DTypeTest, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(FloatToBF16(inf), 0x7f80);
  EXPECT_EQ(FloatToBF16(-inf), 0xff80);
  EXPECT_EQ(FloatToF16(inf), 0x7c00);
  EXPECT_EQ(FloatToF16(-inf), 0xfc00);
  EXPECT_EQ(FloatToBF16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToF16(-0.0f), 0x8000);
  EXPECT_TRUE(std::isnan(BF16ToFloat(FloatToBF16(nan))));
  EXPECT_TRUE(std::isnan(F16ToFloat(FloatToF16(nan))));
  EXPECT_TRUE(std::isnan(BF16ToFloat(FloatToBF16(-nan))));
  // A NaN whose payload sits only in the low 16 bits must not truncate to infinity.
  float low_payload_nan = FromBits(0x7f800001u);
  ASSERT_TRUE(std::isnan(low_payload_nan));
  EXPECT_TRUE(std::isnan(BF16ToFloat(FloatToBF16(low_payload_nan))));
  EXPECT_TRUE(std::isnan(F16ToFloat(FloatToF16(low_payload_nan))));
  // Overflow: f32's largest value rounds to bf16 infinity; 65520 is f16's overflow midpoint.
  EXPECT_EQ(FloatToBF16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(FloatToF16(65519.996f), 0x7bff);
  EXPECT_EQ(FloatToF16(65520.0f), 0x7c00);
  EXPECT_EQ(FloatToF16(1e10f), 0x7c00);
  // Subnormals: f16's smallest is 2^-24; half of it is a tie that rounds to even (zero), a bit
  // more rounds up. f32 subnormals survive bf16 (same exponent range).
  EXPECT_EQ(FloatToF16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(FloatToF16(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(FloatToF16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(FloatToF16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 units: tie between 1 and 2
  EXPECT_EQ(FloatToF16(std::ldexp(1023.0f, -24)), 0x03ff);  // largest subnormal
  EXPECT_EQ(FloatToF16(std::ldexp(1.0f, -14)), 0x0400);      // smallest normal
  float f32_subnormal = std::numeric_limits<float>::denorm_min() * 65536.0f * 3.0f;
  EXPECT_EQ(BF16ToFloat(FloatToBF16(f32_subnormal)), f32_subnormal);
  EXPECT_EQ(FloatToBF16(std::numeric_limits<float>::denorm_min()), 0x0000);  // tie to even 0
}

// NaNs of every kind, both signs: quiet and signalling (quiet bit clear), payloads only in the
// high bits, only in the bits bf16 drops, or everywhere. bf16 keeps the sign and the top of the
// payload and sets the quiet bit (so a payload living only in the low 16 bits cannot turn into
// infinity); f16 gives the canonical quiet NaN with the sign.
TEST(DTypeTest, EveryKindOfNaN) {
  for (uint32_t sign : {0u, 0x80000000u}) {
    for (uint32_t payload : {0x400000u, 0x000001u, 0x200000u, 0x00ffffu, 0x7fffffu, 0x3f0000u,
                             0x010000u, 0x408000u}) {
      const uint32_t bits = sign | 0x7f800000u | payload;
      const float f = FromBits(bits);
      ASSERT_TRUE(std::isnan(f));
      EXPECT_EQ(FloatToBF16(f), uint16_t((bits >> 16) | 0x40u)) << std::hex << bits;
      EXPECT_EQ(FloatToF16(f), uint16_t((sign >> 16) | 0x7e00u)) << std::hex << bits;
    }
  }
}

// The float32 classes swept by stride against the search reference, both signs: f32
// subnormals (below both formats' normal range for f16, inside bf16's), f16 subnormals, the
// normals around 1, and the bands just below each format's overflow boundary.
TEST(DTypeTest, FloatClassesAgainstSearch) {
  struct Band {
    const char* name;
    uint32_t lo, hi, stride;
  };
  const Band bands[] = {
      {"f32 subnormals", 0x00000001u, 0x007fffffu, 997},
      {"f16 subnormals and the first normals", 0x33000000u, 0x38ffffffu, 1009},
      {"normals around 1", 0x3f000000u, 0x40000000u, 997},
      {"below bf16 overflow", 0x7f7f0000u, 0x7f7fffffu, 7},
      {"below f16 overflow", 0x477f0000u, 0x4780ffffu, 3},
      {"huge and infinite", 0x7f000000u, 0x7f800000u, 4099},
  };
  for (const Band& b : bands) {
    for (uint64_t u = b.lo; u <= b.hi; u += b.stride) {
      for (uint32_t sign : {0u, 0x80000000u}) {
        const float f = FromBits(uint32_t(u) | sign);
        ASSERT_EQ(FloatToBF16(f), EncodeBySearch(f, kBF16)) << b.name << " " << std::hex << u;
        ASSERT_EQ(FloatToF16(f), EncodeBySearch(f, kF16)) << b.name << " " << std::hex << u;
      }
    }
    // The band's last pattern too (the stride may step over it).
    const float last = FromBits(b.hi);
    ASSERT_EQ(FloatToBF16(last), EncodeBySearch(last, kBF16)) << b.name;
    ASSERT_EQ(FloatToF16(last), EncodeBySearch(last, kF16)) << b.name;
  }
  // bf16's overflow boundary: the midpoint between its largest finite value (0x7f7f) and 2^128
  // is a tie that goes to the even pattern, infinity; one f32 step below stays finite.
  const float bf16_mid = FromBits(0x7f7f8000u);
  EXPECT_EQ(FloatToBF16(bf16_mid), 0x7f80);
  EXPECT_EQ(FloatToBF16(std::nextafter(bf16_mid, 0.0f)), 0x7f7f);
  EXPECT_EQ(FloatToBF16(-bf16_mid), 0xff80);
  // f16's: 65520 is the midpoint between 65504 (0x7bff) and 2^16.
  EXPECT_EQ(FloatToF16(-65520.0f), 0xfc00);
  EXPECT_EQ(FloatToF16(std::nextafter(-65520.0f, 0.0f)), 0xfbff);
  // Signed zeros and f32 subnormals below f16's range keep their sign.
  EXPECT_EQ(FloatToF16(-std::numeric_limits<float>::denorm_min()), 0x8000);
  EXPECT_EQ(FloatToBF16(-std::numeric_limits<float>::denorm_min()), 0x8000);
  EXPECT_EQ(FloatToF16(0.0f), 0x0000);
  EXPECT_EQ(FloatToBF16(0.0f), 0x0000);
}

}  // namespace
}  // namespace braid
