// EditDistance against the textbook full-table recurrence, with and without a limit: below the
// limit the two agree exactly, above it the bounded one only promises a value above the limit.
#include "core/edit_distance.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace braid {
namespace {

// The whole (|a|+1) x (|b|+1) table, no shortcuts.
size_t Reference(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1,
                          d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    }
  }
  return d[a.size()][b.size()];
}

TEST(EditDistance, KnownPairs) {
  EXPECT_EQ(EditDistance("kitten", "sitting"), 3u);
  EXPECT_EQ(EditDistance("", "abc"), 3u);
  EXPECT_EQ(EditDistance("abc", ""), 3u);
  EXPECT_EQ(EditDistance("train_batch_size", "train_batch_size"), 0u);
  EXPECT_EQ(EditDistance("Stage", "stage"), 1u);
  EXPECT_EQ(EditDistance("Stage", "stage", /*ignore_case=*/true), 0u);
}

TEST(EditDistance, BoundedAgreesWithTheFullTableAtEveryLimit) {
  std::mt19937 rng(20261128);
  // A small alphabet so that random names share letters and distances spread out.
  auto random_name = [&rng](size_t max_len) {
    std::string s(rng() % (max_len + 1), 'a');
    for (char& c : s) c = static_cast<char>('a' + rng() % 4);
    return s;
  };
  int above = 0, within = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const std::string a = random_name(12), b = random_name(12);
    const size_t exact = Reference(a, b);
    ASSERT_EQ(EditDistance(a, b), exact) << a << " / " << b;
    for (size_t limit = 0; limit <= 13; ++limit) {
      const size_t bounded = EditDistance(a, b, /*ignore_case=*/false, limit);
      if (exact <= limit) {
        ASSERT_EQ(bounded, exact) << a << " / " << b << " limit " << limit;
        ++within;
      } else {
        ASSERT_GT(bounded, limit) << a << " / " << b << " limit " << limit;
        ++above;
      }
    }
  }
  // Both branches were exercised many times, so neither check is vacuous.
  EXPECT_GT(within, 1000);
  EXPECT_GT(above, 1000);
}

TEST(EditDistance, ALongNameIsCutOffByItsLength) {
  const std::string key(8000, 'x');
  EXPECT_GT(EditDistance(key, "train_batch_size", true, 5), 5u);
  EXPECT_EQ(EditDistance(key, "train_batch_size"), 8000u);
}

}  // namespace
}  // namespace braid
