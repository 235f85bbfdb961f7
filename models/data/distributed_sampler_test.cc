#include "models/data/distributed_sampler.h"

#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace braid::data {
namespace {

std::vector<std::vector<int64_t>> Shards(int64_t n, int world, DistributedSamplerOptions o,
                                         int64_t epoch) {
  std::vector<std::vector<int64_t>> out;
  for (int r = 0; r < world; ++r) {
    auto s = DistributedSampler::Create(n, r, world, o);
    EXPECT_TRUE(s.ok()) << s.status();
    out.push_back(s->Indices(epoch));
    EXPECT_EQ(int64_t(out.back().size()), s->num_samples());
  }
  return out;
}

TEST(DistributedSampler, DropLastShardsAreEqualDisjointAndCoverTheEpoch) {
  for (int world : {1, 2, 3}) {
    for (int64_t n : {9, 10, 11, 12}) {
      DistributedSamplerOptions o;
      o.seed = 42;
      o.drop_last = true;
      auto shards = Shards(n, world, o, 0);
      std::set<int64_t> seen;
      for (const auto& s : shards) {
        EXPECT_EQ(int64_t(s.size()), n / world);
        for (int64_t i : s) {
          EXPECT_GE(i, 0);
          EXPECT_LT(i, n);
          EXPECT_TRUE(seen.insert(i).second) << "index " << i << " on two ranks, W=" << world;
        }
      }
      EXPECT_EQ(int64_t(seen.size()), n / world * world) << "n=" << n << " W=" << world;
    }
  }
}

TEST(DistributedSampler, PaddedShardsCoverEverySampleWithFewestRepeats) {
  for (int world : {1, 2, 3}) {
    for (int64_t n : {1, 2, 10, 11}) {
      DistributedSamplerOptions o;
      o.seed = 7;
      auto shards = Shards(n, world, o, 3);
      const int64_t per_rank = (n + world - 1) / world;
      std::map<int64_t, int> count;
      for (const auto& s : shards) {
        EXPECT_EQ(int64_t(s.size()), per_rank);
        for (int64_t i : s) ++count[i];
      }
      // Every sample appears; exactly per_rank*W - n extra appearances, each repeat at most
      // ceil(W/n) times overall.
      EXPECT_EQ(int64_t(count.size()), n) << "n=" << n << " W=" << world;
      int extra = 0;
      for (auto& [i, c] : count) {
        EXPECT_GE(i, 0);
        EXPECT_LT(i, n);
        extra += c - 1;
        EXPECT_LE(c, 1 + (world + n - 1) / n);
      }
      EXPECT_EQ(extra, per_rank * world - n) << "n=" << n << " W=" << world;
    }
  }
}

TEST(DistributedSampler, ReshufflesPerEpochDeterministically) {
  DistributedSamplerOptions o;
  o.seed = 1;
  auto a = DistributedSampler::Create(100, 0, 1, o);
  auto b = DistributedSampler::Create(100, 1, 2, o);
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<int64_t> e0 = a->EpochOrder(0), e1 = a->EpochOrder(1);
  EXPECT_EQ(a->EpochOrder(0), e0);  // deterministic
  EXPECT_EQ(b->EpochOrder(0), e0);  // same order on every rank, whatever its rank or world
  EXPECT_NE(e0, e1);                // reshuffled per epoch
  std::vector<int64_t> sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_NE(e0, sorted);                                      // actually shuffled
  for (int64_t i = 0; i < 100; ++i) EXPECT_EQ(sorted[i], i);  // a permutation
  // Rank 1 of 2 takes the odd positions of the epoch order.
  std::vector<int64_t> r1 = b->Indices(0);
  for (size_t k = 0; k < r1.size(); ++k) EXPECT_EQ(r1[k], e0[2 * k + 1]);
  // Another seed, another order.
  o.seed = 2;
  auto c = DistributedSampler::Create(100, 0, 1, o);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(c->EpochOrder(0), e0);
}

TEST(DistributedSampler, NoShuffleKeepsOrder) {
  DistributedSamplerOptions o;
  o.shuffle = false;
  auto s = DistributedSampler::Create(7, 1, 3, o);
  ASSERT_TRUE(s.ok());
  // Order 0..6 padded with 0, 1; rank 1 takes positions 1, 4, 7.
  EXPECT_EQ(s->Indices(5), (std::vector<int64_t>{1, 4, 0}));
}

TEST(DistributedSampler, RejectsBadArguments) {
  EXPECT_FALSE(DistributedSampler::Create(10, 2, 2).ok());
  EXPECT_FALSE(DistributedSampler::Create(10, -1, 2).ok());
  EXPECT_FALSE(DistributedSampler::Create(-1, 0, 1).ok());
  DistributedSamplerOptions o;
  o.drop_last = true;
  EXPECT_FALSE(DistributedSampler::Create(2, 0, 3, o).ok());
  auto empty = DistributedSampler::Create(0, 0, 2);
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->Indices(0).empty());
}

}  // namespace
}  // namespace braid::data
