#include "models/data/validation_batches.h"

#include <numeric>

#include "gtest/gtest.h"

namespace braid::data {
namespace {

TokenFile Counting(int64_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return TokenFile::FromTokens(v, TokenType::kU16);
}

TEST(ValidationBatches, EvenlySpacedWindowsFromFirstToLastWithShiftedTargets) {
  TokenFile t = Counting(1001);
  auto got = ValidationBatches(t, 2, 3, 4);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 2u);
  // 6 windows over starts 0 .. 1001 - 4 - 1 = 996: 0, 199, 398, 597, 796, 996.
  const std::vector<int32_t> starts = {0, 199, 398, 597, 796, 996};
  for (int k = 0; k < 2; ++k) {
    std::vector<int32_t> x = (*got)[k].inputs.ToVector<int32_t>();
    std::vector<int32_t> y = (*got)[k].targets.ToVector<int32_t>();
    EXPECT_EQ((*got)[k].inputs.shape(), (Shape{3, 4}));
    for (int b = 0; b < 3; ++b) {
      for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(x[size_t(b * 4 + i)], starts[size_t(k * 3 + b)] + i);
        EXPECT_EQ(y[size_t(b * 4 + i)], starts[size_t(k * 3 + b)] + i + 1);
      }
    }
  }
}

TEST(ValidationBatches, TheSameEveryTime) {
  TokenFile t = Counting(5000);
  auto a = ValidationBatches(t, 3, 2, 16), b = ValidationBatches(t, 3, 2, 16);
  ASSERT_TRUE(a.ok() && b.ok());
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ((*a)[k].inputs.ToVector<int32_t>(), (*b)[k].inputs.ToVector<int32_t>());
    EXPECT_EQ((*a)[k].targets.ToVector<int32_t>(), (*b)[k].targets.ToVector<int32_t>());
  }
}

TEST(ValidationBatches, AShortStreamOverlapsAndATooShortOneSaysWhatToDo) {
  TokenFile t = Counting(6);
  auto got = ValidationBatches(t, 1, 4, 5);  // one window fits: every row is it
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)[0].inputs.ToVector<int32_t>()[15], 0);
  auto too_short = ValidationBatches(t, 1, 1, 6);
  ASSERT_FALSE(too_short.ok());
  EXPECT_NE(too_short.status().message().find("larger --val_fraction"), std::string::npos);
  EXPECT_FALSE(ValidationBatches(t, 0, 1, 2).ok());
}

}  // namespace
}  // namespace braid::data
