#include "models/data/random.h"

#include <vector>

#include "gtest/gtest.h"

namespace braid::data {
namespace {

// Expected values come from an independent Python implementation of docs/REFERENCE_RUN.md's
// definition (arbitrary-precision integers masked to 64 bits), run once at development time.
TEST(SplitMix64, MatchesIndependentImplementation) {
  struct Case {
    uint64_t seed;
    std::vector<uint64_t> first;
  };
  const Case cases[] = {
      {1234,
       {0xbb0cf61b2f181cdbull, 0x97c7a1364df06524ull, 0x33befae49bc025daull, 0x4e6241f252d0a033ull,
        0xb912e3ff44b145a5ull}},
      {1235,
       {0xf973b37b85701082ull, 0x6e56d7ddb8ddbd93ull, 0xaf34c47097803426ull, 0x979141cd91133db1ull,
        0x1e2bdb60fda9c207ull}},
      // Seed 0 is also the generator's widely published test vector.
      {0,
       {0xe220a8397b1dcdafull, 0x6e789e6aa1b965f4ull, 0x06c45d188009454full, 0xf88bb8a8724c81ecull,
        0x1b39896a51a8749bull}},
  };
  for (const Case& c : cases) {
    SplitMix64 rng(c.seed);
    for (size_t i = 0; i < c.first.size(); ++i) {
      EXPECT_EQ(rng.Next(), c.first[i]) << "seed " << c.seed << " output " << i;
    }
  }
}

TEST(SplitMix64, StateResumesStream) {
  SplitMix64 a(1234);
  a.Next();
  a.Next();
  SplitMix64 b(a.state());
  for (int i = 0; i < 10; ++i) EXPECT_EQ(a.Next(), b.Next());
}

TEST(UniformBelow, StaysInRangeAndHitsEveryValue) {
  SplitMix64 rng(7);
  std::vector<int> counts(7, 0);
  for (int i = 0; i < 7000; ++i) {
    uint64_t v = UniformBelow(rng, 7);
    ASSERT_LT(v, 7u);
    ++counts[v];
  }
  // 1000 expected per bucket; 5 standard deviations is about +-150.
  for (int c : counts) {
    EXPECT_GT(c, 850);
    EXPECT_LT(c, 1150);
  }
  EXPECT_EQ(UniformBelow(rng, 1), 0u);
  // n close to 2^64: the rejection threshold is large and the loop must still terminate.
  uint64_t big = ~uint64_t(0) - 5;
  for (int i = 0; i < 100; ++i) EXPECT_LT(UniformBelow(rng, big), big);
}

}  // namespace
}  // namespace braid::data
