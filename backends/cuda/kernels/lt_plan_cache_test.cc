// The cuBLASLt plan cache's host side: operand alignment from the actual pointers (including
// offset views into a flat buffer, as ZeRO hands out), what the cache key distinguishes, and the
// cache's hits, misses and least-recently-used eviction with a fake plan builder.
#include "backends/cuda/kernels/lt_plan_cache.h"

#include <algorithm>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace braid::cuda {
namespace {

TEST(OperandAlignment, FromThePointerAndTheBatchStride) {
  const uintptr_t base = 0x7f0000100000;  // what the caching allocator hands out: 512-aligned
  EXPECT_EQ(OperandAlignment(base, 1, 0, 4), 256u);
  EXPECT_EQ(OperandAlignment(0, 1, 0, 4), 256u);  // no operand
  // Views into a flat f32 buffer at element offsets 1, 4, 8, 64.
  EXPECT_EQ(OperandAlignment(base + 4 * 1, 1, 0, 4), 4u);
  EXPECT_EQ(OperandAlignment(base + 4 * 4, 1, 0, 4), 16u);
  EXPECT_EQ(OperandAlignment(base + 4 * 8, 1, 0, 4), 32u);
  EXPECT_EQ(OperandAlignment(base + 4 * 64, 1, 0, 4), 256u);
  // A bf16 view at an odd element offset: 2 bytes.
  EXPECT_EQ(OperandAlignment(base + 2 * 3, 1, 0, 2), 2u);
  // Strided batches: every entry's start counts. 3 f32 per entry = 12 bytes: 4-aligned entries.
  EXPECT_EQ(OperandAlignment(base, 5, 3, 4), 4u);
  EXPECT_EQ(OperandAlignment(base, 5, 64, 4), 256u);
  EXPECT_EQ(OperandAlignment(base, 1, 3, 4), 256u);  // one entry: the stride is never used
}

MatmulPlan LinearPlan() {
  MatmulCall c;  // x [64, 768] @ W[3072, 768]^T
  c.a_rows = 64, c.a_cols = 768, c.b_rows = 3072, c.b_cols = 768;
  c.out_rows = 64, c.out_cols = 3072, c.trans_b = true;
  return *PlanMatmul(c);
}

TEST(LtPlanKey, DistinguishesWhatThePlanDependsOn) {
  const MatmulPlan p = LinearPlan();
  const uintptr_t w = 0x10000, x = 0x20000, d = 0x40000;
  const LtPlanKey k = MakeLtPlanKey(0, LtDType::kF32, p, w, x, d, 0, 4);
  EXPECT_EQ(k.m, 3072);
  EXPECT_EQ(k.n, 64);
  EXPECT_EQ(k.k, 768);
  EXPECT_EQ(k.align_a, 256u);
  EXPECT_EQ(k.align_bias, 256u);
  const LtPlanKey same = MakeLtPlanKey(0, LtDType::kF32, p, w + 0x100000, x, d, 0, 4);
  EXPECT_TRUE(k == same);  // another 256-aligned weight: the same plan
  EXPECT_EQ(LtPlanKeyHash()(k), LtPlanKeyHash()(same));
  auto differs = [&](const LtPlanKey& o, const char* what) {
    EXPECT_FALSE(k == o) << what << ": " << o.ToString();
  };
  differs(MakeLtPlanKey(1, LtDType::kF32, p, w, x, d, 0, 4), "device");
  differs(MakeLtPlanKey(0, LtDType::kBF16, p, w, x, d, 0, 2), "dtype");
  const LtPlanKey offset_view = MakeLtPlanKey(0, LtDType::kF32, p, w + 4 * 7, x, d, 0, 4);
  EXPECT_EQ(offset_view.align_a, 4u);  // a ZeRO shard starting 7 floats into its flat buffer
  differs(offset_view, "alignment of A");
  differs(MakeLtPlanKey(0, LtDType::kF32, p, w, x + 8, d, 0, 4), "alignment of B");
  differs(MakeLtPlanKey(0, LtDType::kF32, p, w, x, d + 16, 0, 4), "alignment of D");
  MatmulPlan q = p;
  q.epilogue = Epilogue::kBias;
  differs(MakeLtPlanKey(0, LtDType::kF32, q, w, x, d, 0x50000, 4), "epilogue");
  EXPECT_EQ(MakeLtPlanKey(0, LtDType::kF32, q, w, x, d, 0x50000 + 4, 4).align_bias, 4u);
  q = p;
  q.trans_a = false;
  differs(MakeLtPlanKey(0, LtDType::kF32, q, w, x, d, 0, 4), "transpose");
  q = p;
  q.ldd = 4096;
  differs(MakeLtPlanKey(0, LtDType::kF32, q, w, x, d, 0, 4), "leading dimension");
  // 2-D calls: the strides (meaningless there) do not split the cache.
  q = p;
  q.stride_a = 12345;
  EXPECT_TRUE(k == MakeLtPlanKey(0, LtDType::kF32, q, w, x, d, 0, 4));
  q.batch = 2;
  differs(MakeLtPlanKey(0, LtDType::kF32, q, w, x, d, 0, 4), "batch");
}

struct FakePlan {
  int id;
  LtPlanKey key;
};

TEST(LtPlanCache, BuildsOncePerKeyAndNeverCachesAFailure) {
  int builds = 0;
  bool fail = false;
  LtPlanCache<FakePlan> cache([&](const LtPlanKey& k) -> absl::StatusOr<std::unique_ptr<FakePlan>> {
    ++builds;
    if (fail) return absl::NotFoundError("cuBLASLt has no algorithm for " + k.ToString());
    return std::make_unique<FakePlan>(FakePlan{builds, k});
  });
  const MatmulPlan p = LinearPlan();
  const LtPlanKey k = MakeLtPlanKey(0, LtDType::kF32, p, 0x10000, 0x20000, 0x40000, 0, 4);
  absl::StatusOr<std::shared_ptr<const FakePlan>> first = cache.Get(k);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ((*first)->id, 1);
  for (int i = 0; i < 5; ++i) {
    absl::StatusOr<std::shared_ptr<const FakePlan>> again = cache.Get(k);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(*again, *first);  // the very same plan object
  }
  EXPECT_EQ(builds, 1);
  EXPECT_EQ(cache.misses(), 1);
  EXPECT_EQ(cache.hits(), 5);
  // The same shape through an offset view: another plan (the heuristic was told 4 bytes).
  const LtPlanKey view = MakeLtPlanKey(0, LtDType::kF32, p, 0x10000 + 4, 0x20000, 0x40000, 0, 4);
  absl::StatusOr<std::shared_ptr<const FakePlan>> second = cache.Get(view);
  ASSERT_TRUE(second.ok());
  EXPECT_NE(*second, *first);
  EXPECT_EQ((*second)->key.align_a, 4u);
  EXPECT_EQ(cache.size(), 2u);
  // A failed build is reported and retried next time, not remembered.
  fail = true;
  const LtPlanKey other = MakeLtPlanKey(0, LtDType::kF16, p, 0x10000, 0x20000, 0x40000, 0, 2);
  absl::StatusOr<std::shared_ptr<const FakePlan>> bad = cache.Get(other);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(bad.status().message().find("f16 m=3072 n=64 k=768"), std::string::npos)
      << bad.status();
  fail = false;
  EXPECT_TRUE(cache.Get(other).ok());
  EXPECT_EQ(builds, 4);
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_EQ(cache.misses(), 4);
}

// A fake plan that records its destruction, as LtPlan's destructor destroys the cuBLASLt
// descriptors.
struct CountedPlan {
  CountedPlan(const LtPlanKey& k, std::vector<int64_t>* d) : key(k), destroyed(d) {}
  CountedPlan(const CountedPlan&) = delete;
  ~CountedPlan() { destroyed->push_back(key.m); }
  LtPlanKey key;
  std::vector<int64_t>* destroyed;  // the m of each plan destroyed, in order
};

TEST(LtPlanCache, EvictsTheLeastRecentlyUsedBeyondItsCapacityAndRebuildsIt) {
  std::vector<int64_t> built, destroyed;
  auto cache = std::make_unique<LtPlanCache<CountedPlan>>(
      [&](const LtPlanKey& k) -> absl::StatusOr<std::unique_ptr<CountedPlan>> {
        built.push_back(k.m);
        return std::make_unique<CountedPlan>(k, &destroyed);
      },
      3);
  EXPECT_EQ(cache->capacity(), 3u);
  auto key = [](int64_t m) {
    LtPlanKey k;
    k.m = m, k.n = 8, k.k = 8, k.lda = m, k.ldb = 8, k.ldd = m;
    return k;
  };
  for (int64_t m : {1, 2, 3}) ASSERT_TRUE(cache->Get(key(m)).ok());
  EXPECT_TRUE(destroyed.empty());
  ASSERT_TRUE(cache->Get(key(1)).ok());  // 1 is now the most recently used: 2 is the least
  ASSERT_TRUE(cache->Get(key(4)).ok());  // a fourth plan: 2 goes
  EXPECT_EQ(destroyed, (std::vector<int64_t>{2}));
  EXPECT_FALSE(cache->Contains(key(2)));
  for (int64_t m : {1, 3, 4}) EXPECT_TRUE(cache->Contains(key(m))) << m;
  ASSERT_TRUE(cache->Get(key(5)).ok());  // then 3 (used before 1 and 4)
  EXPECT_EQ(destroyed, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(cache->size(), 3u);
  EXPECT_EQ(cache->evictions(), 2);
  // An evicted key is built again (a miss), evicting the next least recently used (1).
  const int64_t misses = cache->misses();
  ASSERT_TRUE(cache->Get(key(2)).ok());
  EXPECT_EQ(cache->misses(), misses + 1);
  EXPECT_EQ(built, (std::vector<int64_t>{1, 2, 3, 4, 5, 2}));
  EXPECT_EQ(destroyed, (std::vector<int64_t>{2, 3, 1}));
  // A plan in use when it is evicted lives until its user lets it go.
  absl::StatusOr<std::shared_ptr<const CountedPlan>> held = cache->Get(key(4));
  ASSERT_TRUE(held.ok());
  for (int64_t m : {6, 7, 8}) ASSERT_TRUE(cache->Get(key(m)).ok());
  EXPECT_FALSE(cache->Contains(key(4)));
  EXPECT_EQ((*held)->key.m, 4);
  EXPECT_EQ(std::count(destroyed.begin(), destroyed.end(), 4), 0);
  held = absl::StatusOr<std::shared_ptr<const CountedPlan>>();  // released: destroyed now
  EXPECT_EQ(std::count(destroyed.begin(), destroyed.end(), 4), 1);
  // Destroying the cache destroys every plan it holds.
  const size_t before = destroyed.size();
  cache.reset();
  EXPECT_EQ(destroyed.size(), before + 3);
}

TEST(LtPlanCache, HasADocumentedDefaultCapacity) {
  LtPlanCache<int> cache([](const LtPlanKey&) -> absl::StatusOr<std::unique_ptr<int>> {
    return std::make_unique<int>(0);
  });
  EXPECT_EQ(cache.capacity(), kDefaultLtPlanCacheCapacity);
  EXPECT_EQ(kDefaultLtPlanCacheCapacity, 256u);
}

}  // namespace
}  // namespace braid::cuda
