// The cached forward (generation) against the plain one: logits at every position equal the
// full-sequence forward's, whether the prefix went in at once or a token at a time.
#include "models/nn/kv_cache.h"

#include <random>

#include "core/autograd.h"
#include "core/testing/compare.h"
#include "gtest/gtest.h"
#include "models/gpt/gpt.h"

namespace braid::models {
namespace {

// A small GPT whose weights are far from init's 0.02 scale, so attention is peaked and the
// logits are O(1..10): an error in the cache (a wrong position, a wrong head) shows.
GptConfig Small() {
  GptConfig c;
  c.vocab_size = 61;
  c.padded_vocab_size = 64;
  c.block_size = 24;
  c.n_layer = 3;
  c.n_head = 4;
  c.n_embd = 32;
  return c;
}

void Scramble(Gpt& g, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, 0.3f);
  for (auto& [name, p] : g.NamedParameters()) {
    std::vector<float> v(size_t(p.numel()));
    for (float& x : v) x = n(rng);
    p.CopyFrom(Tensor::FromVector(v, p.shape()));
  }
}

Tensor Ids(int64_t b, int64_t t, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> v(size_t(b * t));
  for (int32_t& x : v) x = int32_t(rng() % 61);
  return Tensor::FromVector(v, {b, t});
}

// Logits [B, T, V] at positions [begin, end) as a flat vector, batch-major.
std::vector<float> Positions(const Tensor& logits, int64_t begin, int64_t end) {
  const int64_t B = logits.size(0), T = logits.size(1), V = logits.size(2);
  std::vector<float> all = logits.ToFloatVector(), out;
  for (int64_t b = 0; b < B; ++b) {
    out.insert(out.end(), all.begin() + (b * T + begin) * V, all.begin() + (b * T + end) * V);
  }
  return out;
}

// Relative to the largest logit of the reference, floor 1: f32 rounding of a different
// summation order (the cache's loop against the batched kernel) stays far below 1e-5.
constexpr double kTol = 1e-5;

TEST(KvCache, PrefixAtOnceThenOneTokenAtATimeEqualsFullForward) {
  Gpt g(Small());
  Scramble(g, 7);
  const int64_t B = 2, T = 24;
  Tensor ids = Ids(B, T, 11);
  Tensor full;
  {
    autograd::NoGradGuard no_grad;
    full = g.Forward(ids);
  }
  // The reference is far from zero, so the comparison is not trivially met.
  std::vector<float> ref = full.ToFloatVector();
  float biggest = 0;
  for (float v : ref) biggest = std::max(biggest, std::fabs(v));
  ASSERT_GT(biggest, 1.0f);

  KvCache cache = g.NewKvCache(B);
  const int64_t prefix = 7;
  std::vector<int32_t> all = ids.ToVector<int32_t>();
  auto columns = [&](int64_t begin, int64_t end) {
    std::vector<int32_t> v;
    for (int64_t b = 0; b < B; ++b) {
      v.insert(v.end(), all.begin() + b * T + begin, all.begin() + b * T + end);
    }
    return Tensor::FromVector(v, {B, end - begin});
  };
  Tensor first = g.ForwardCached(columns(0, prefix), cache);
  EXPECT_EQ(cache.length(), prefix);
  EXPECT_LE(testing::MaxRelDiff(first.ToFloatVector(), Positions(full, 0, prefix)), kTol);
  for (int64_t t = prefix; t < T; ++t) {
    Tensor step = g.ForwardCached(columns(t, t + 1), cache);
    EXPECT_LE(testing::MaxRelDiff(step.ToFloatVector(), Positions(full, t, t + 1)), kTol)
        << "position " << t;
  }
  EXPECT_EQ(cache.length(), T);
}

TEST(KvCache, ChunksOfSeveralTokensAndAClearedCacheGiveTheSame) {
  Gpt g(Small());
  Scramble(g, 3);
  const int64_t T = 20;
  Tensor ids = Ids(1, T, 5);
  Tensor full;
  {
    autograd::NoGradGuard no_grad;
    full = g.Forward(ids);
  }
  KvCache cache = g.NewKvCache();
  std::vector<int32_t> all = ids.ToVector<int32_t>();
  for (int round = 0; round < 2; ++round) {  // the second round reuses the cleared cache
    cache.Clear();
    for (int64_t begin = 0; begin < T; begin += 6) {
      const int64_t end = std::min(T, begin + 6);
      std::vector<int32_t> chunk(all.begin() + begin, all.begin() + end);
      Tensor out = g.ForwardCached(Tensor::FromVector(chunk, {1, end - begin}), cache);
      EXPECT_LE(testing::MaxRelDiff(out.ToFloatVector(), Positions(full, begin, end)), kTol)
          << "round " << round << ", positions " << begin << ".." << end;
    }
  }
}

TEST(KvCache, AWrongCacheChangesTheLogits) {
  // The comparison above can fail: a token whose cached context is another sequence's does not
  // give the full forward's logits.
  Gpt g(Small());
  Scramble(g, 7);
  Tensor a = Ids(1, 8, 1), b = Ids(1, 8, 2);
  Tensor full;
  {
    autograd::NoGradGuard no_grad;
    full = g.Forward(a);
  }
  KvCache cache = g.NewKvCache();
  std::vector<int32_t> bv = b.ToVector<int32_t>(), av = a.ToVector<int32_t>();
  g.ForwardCached(Tensor::FromVector(std::vector<int32_t>(bv.begin(), bv.begin() + 7), {1, 7}),
                  cache);
  Tensor last = g.ForwardCached(Tensor::FromVector(std::vector<int32_t>{av[7]}, {1, 1}), cache);
  EXPECT_GT(testing::MaxRelDiff(last.ToFloatVector(), Positions(full, 7, 8)), 1e-3);
}

TEST(KvCache, OverflowingTheContextIsFatalAndSaysSo) {
  Gpt g(Small());
  KvCache cache = g.NewKvCache();
  g.ForwardCached(Ids(1, 20, 1), cache);
  EXPECT_DEATH(g.ForwardCached(Ids(1, 5, 2), cache), "exceeds the context 24");
}

}  // namespace
}  // namespace braid::models
