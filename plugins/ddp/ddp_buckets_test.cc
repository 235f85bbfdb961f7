#include "plugins/ddp/ddp_buckets.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace braid::ddp {
namespace {

using ::testing::ElementsAre;

std::vector<BucketableParam> Sizes(const std::vector<int64_t>& bytes, int key = 0) {
  std::vector<BucketableParam> out;
  for (int64_t b : bytes) out.push_back(BucketableParam{b, key});
  return out;
}

TEST(AssignBucketsTest, FirstBucketSmallThenCapped) {
  // Order 4,3,2,1,0 (reverse registration), 40 bytes each: first cap 40, cap 100.
  auto b = AssignBuckets(Sizes({40, 40, 40, 40, 40}), {4, 3, 2, 1, 0}, 40, 100);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_THAT(b[0], ElementsAre(4));
  EXPECT_THAT(b[1], ElementsAre(3, 2));
  EXPECT_THAT(b[2], ElementsAre(1, 0));
}

TEST(AssignBucketsTest, ParameterLargerThanCapGetsItsOwnBucket) {
  auto b = AssignBuckets(Sizes({10, 500, 10, 10}), {0, 1, 2, 3}, 50, 50);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_THAT(b[0], ElementsAre(0));
  EXPECT_THAT(b[1], ElementsAre(1));
  EXPECT_THAT(b[2], ElementsAre(2, 3));
}

TEST(AssignBucketsTest, FollowsTheGivenOrder) {
  auto b = AssignBuckets(Sizes({8, 8, 8, 8}), {2, 0, 3, 1}, 16, 16);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_THAT(b[0], ElementsAre(2, 0));
  EXPECT_THAT(b[1], ElementsAre(3, 1));
}

TEST(AssignBucketsTest, KeysNeverShareABucketAndBucketsSortByFirstMember) {
  // 0, 2 are key 0 (f32 say); 1, 3 key 1. One large cap: one bucket per key.
  std::vector<BucketableParam> p = {{4, 0}, {4, 1}, {4, 0}, {4, 1}};
  auto b = AssignBuckets(p, {1, 0, 3, 2}, 1000, 1000);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_THAT(b[0], ElementsAre(1, 3));  // opened first (position 0)
  EXPECT_THAT(b[1], ElementsAre(0, 2));
}

TEST(AssignBucketsTest, EveryParameterExactlyOnce) {
  std::vector<int64_t> bytes;
  std::vector<int> order;
  for (int i = 0; i < 37; ++i) {
    bytes.push_back(1 + (i * 7919) % 100);
    order.push_back((i * 11) % 37);
  }
  auto b = AssignBuckets(Sizes(bytes), order, 64, 150);
  std::vector<int> flat;
  for (const auto& bucket : b) {
    int64_t total = 0;
    for (int i : bucket) total += bytes[size_t(i)];
    EXPECT_TRUE(total <= 150 || bucket.size() == 1);
    flat.insert(flat.end(), bucket.begin(), bucket.end());
  }
  EXPECT_EQ(flat, order);
  int64_t first = 0;
  for (int i : b[0]) first += bytes[size_t(i)];
  EXPECT_LE(first, 64);
}

}  // namespace
}  // namespace braid::ddp
