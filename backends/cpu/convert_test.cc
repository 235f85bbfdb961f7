// The vectorised converters (convert.h) against core's scalar ones on every input: all 2^32
// float bit patterns for f32 -> bf16 and f32 -> f16, all 65,536 patterns for the way back.
// Compared bit for bit, NaN payloads included.
#include "backends/cpu/convert.h"

#include <cstring>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/dtype.h"
#include "gtest/gtest.h"

namespace braid::cpu {
namespace {

class ConvertTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    SetSimdEnabled(GetParam());
    // The Simd cases run in convert_test_avx2, which Bazel skips on a CPU without these
    // instructions (third_party/host): here their absence is a failure.
    if (GetParam()) {
      ASSERT_TRUE(SimdEnabled()) << "this CPU has no AVX2/FMA/F16C";
    }
  }
  void TearDown() override { SetSimdEnabled(true); }
};

void CheckAllFloats(DType t, uint16_t (*scalar)(float)) {
  constexpr int64_t kChunk = 1 << 16;
  std::vector<uint32_t> bits(kChunk);
  std::vector<uint16_t> got(kChunk);
  int64_t mismatches = 0;
  for (uint64_t base = 0; base < (uint64_t{1} << 32); base += kChunk) {
    for (int64_t i = 0; i < kChunk; ++i) bits[size_t(i)] = uint32_t(base + uint64_t(i));
    const float* f = reinterpret_cast<const float*>(bits.data());
    // An odd length: the last elements go through the scalar tail.
    FromF32(t, f, got.data(), kChunk - 3);
    FromF32(t, f + kChunk - 3, got.data() + kChunk - 3, 3);
    for (int64_t i = 0; i < kChunk; ++i) {
      float x;
      std::memcpy(&x, &bits[size_t(i)], 4);
      const uint16_t want = scalar(x);
      if (got[size_t(i)] != want && ++mismatches <= 5) {
        ADD_FAILURE() << DTypeName(t) << ": float bits 0x" << std::hex << bits[size_t(i)]
                      << " gives 0x" << got[size_t(i)] << ", the scalar conversion 0x" << want;
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
}

void CheckAllHalves(DType t, float (*scalar)(uint16_t)) {
  std::vector<uint16_t> h(65536);
  for (uint32_t i = 0; i < 65536; ++i) h[i] = uint16_t(i);
  std::vector<float> got(65536);
  ToF32(t, h.data(), got.data(), 65536 - 5);
  ToF32(t, h.data() + 65536 - 5, got.data() + 65536 - 5, 5);
  int mismatches = 0;
  for (uint32_t i = 0; i < 65536; ++i) {
    const float want = scalar(h[i]);
    if (std::memcmp(&got[i], &want, 4) != 0 && ++mismatches <= 5) {
      ADD_FAILURE() << DTypeName(t) << ": 0x" << std::hex << i << " decodes to " << got[i]
                    << ", the scalar conversion " << want;
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST_P(ConvertTest, EveryFloatToBF16) { CheckAllFloats(DType::kBF16, &FloatToBF16); }
TEST_P(ConvertTest, EveryFloatToF16) { CheckAllFloats(DType::kF16, &FloatToF16); }
TEST_P(ConvertTest, EveryBF16ToFloat) { CheckAllHalves(DType::kBF16, &BF16ToFloat); }
TEST_P(ConvertTest, EveryF16ToFloat) { CheckAllHalves(DType::kF16, &F16ToFloat); }

// true: the AVX2/F16C paths; false: the portable loops.
INSTANTIATE_TEST_SUITE_P(Paths, ConvertTest, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "Simd" : "Portable"; });

}  // namespace
}  // namespace braid::cpu
