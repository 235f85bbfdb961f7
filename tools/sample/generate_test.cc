// Generation through a model's TokenDecoder: with GPT's and Llama's key/value caches (as their
// registrations supply them) greedy against an independent argmax over the uncached model, the
// cached path against the uncached decoder token for token, the same seed giving the same
// tokens, top-k, the draw's distribution, and bad input.
#include "tools/sample/generate.h"

#include <cmath>
#include <memory>
#include <set>

#include "core/autograd.h"
#include "core/check.h"
#include "core/registry.h"
#include "gtest/gtest.h"
#include "tools/sample/test_gpt.h"
#include "tools/sample/test_llama.h"
#include "tools/sample/uncached_decoder.h"

namespace braid::tools {
namespace {

// The model's own decoder, from its registration (`name`: a model registered name).
std::unique_ptr<TokenDecoder> Cached(Module& model, const std::string& name) {
  absl::StatusOr<ModelSpec> spec = Registry::Get().GetModel(name);
  BRAID_CHECK(spec.ok() && spec->decoder) << name << " registers no decoder";
  return spec->decoder(model, 1);
}

absl::StatusOr<std::vector<int64_t>> Generate(models::Gpt& g, const std::vector<int64_t>& prompt,
                                              const SampleOptions& o) {
  return Generate(*Cached(g, "gpt-mini"), prompt, o);
}

// The reference: the whole sequence through the plain forward at every step, argmax of the
// last position over [0, vocab), the lowest id on ties. No cache, no code shared with Generate.
std::vector<int64_t> UncachedGreedy(Module& g, std::vector<int64_t> seq, int64_t n,
                                    int64_t vocab) {
  autograd::NoGradGuard no_grad;
  std::vector<int64_t> out;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<int32_t> ids(seq.begin(), seq.end());
    Tensor all = g.Forward(Tensor::FromVector(ids, {1, int64_t(ids.size())}));
    std::vector<float> logits = all.ToFloatVector();
    const float* last = logits.data() + (ids.size() - 1) * size_t(all.size(-1));
    int64_t best = 0;
    for (int64_t v = 1; v < vocab; ++v) {
      if (last[v] > last[best]) best = v;
    }
    out.push_back(best);
    seq.push_back(best);
  }
  return out;
}

TEST(Generate, GreedyEqualsTheArgmaxOfTheUncachedModel) {
  for (uint64_t seed : {1, 2, 3}) {
    auto g = TestGpt(seed);
    std::vector<int64_t> prompt = {3, 14, 15, 9, 26};
    SampleOptions o;
    o.temperature = 0;
    o.max_new_tokens = 24 - 5;  // up to the full context
    o.vocab_size = 61;          // three padding rows never drawn
    absl::StatusOr<std::vector<int64_t>> got = Generate(*g, prompt, o);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, UncachedGreedy(*g, prompt, o.max_new_tokens, 61)) << "weights seed " << seed;
    // Not a constant sequence: the comparison sees the model's choices.
    EXPECT_GT(std::set<int64_t>(got->begin(), got->end()).size(), 2u);
  }
}

TEST(Generate, TheSameSeedGivesTheSameTokensAndAnotherSeedOthers) {
  auto g = TestGpt(4);
  SampleOptions o;
  o.temperature = 1.0f;
  o.max_new_tokens = 60;  // past the context of 24: the window slides
  o.vocab_size = 64;
  o.seed = 42;
  auto a = Generate(*g, {1, 2, 3}, o);
  auto b = Generate(*g, {1, 2, 3}, o);
  o.seed = 43;
  auto c = Generate(*g, {1, 2, 3}, o);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  ASSERT_EQ(a->size(), 60u);
  EXPECT_EQ(*a, *b);
  EXPECT_NE(*a, *c);
  for (int64_t id : *a) EXPECT_TRUE(id >= 0 && id < 64) << id;
}

TEST(Generate, TopOneIsGreedy) {
  auto g = TestGpt(5);
  SampleOptions o;
  o.temperature = 1.5f;
  o.top_k = 1;
  o.max_new_tokens = 15;
  o.vocab_size = 64;
  auto got = Generate(*g, {7, 8}, o);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, UncachedGreedy(*g, {7, 8}, 15, 64));
}

TEST(Generate, LlamaCachedGreedyEqualsTheUncachedPaths) {
  for (uint64_t seed : {1, 2, 3}) {
    auto m = TestLlama(seed);
    const std::vector<int64_t> prompt = {3, 14, 15, 9, 26};
    SampleOptions o;
    o.temperature = 0;
    o.max_new_tokens = 24 - 5;  // up to the full context
    o.vocab_size = 64;
    absl::StatusOr<std::vector<int64_t>> cached = Generate(*Cached(*m, "llama"), prompt, o);
    absl::StatusOr<std::vector<int64_t>> uncached = Generate(*UncachedDecoder(*m, 24), prompt, o);
    ASSERT_TRUE(cached.ok()) << cached.status();
    ASSERT_TRUE(uncached.ok()) << uncached.status();
    ASSERT_EQ(cached->size(), 19u);
    EXPECT_EQ(*cached, *uncached) << "weights seed " << seed;
    EXPECT_EQ(*cached, UncachedGreedy(*m, prompt, o.max_new_tokens, 64)) << "weights seed " << seed;
    EXPECT_GT(std::set<int64_t>(cached->begin(), cached->end()).size(), 2u);
  }
}

TEST(Generate, LlamaSamplingIsDeterministicAndTheCacheChangesNoDraw) {
  auto m = TestLlama(7);
  SampleOptions o;
  o.temperature = 1.0f;
  o.top_k = 20;
  o.max_new_tokens = 60;  // past the context of 24: both paths restart from the newest half
  o.vocab_size = 64;
  o.seed = 42;
  auto cached = Cached(*m, "llama");
  auto a = Generate(*cached, {1, 2, 3}, o);
  auto b = Generate(*cached, {1, 2, 3}, o);  // the decoder is reused: Generate clears it
  auto u = Generate(*UncachedDecoder(*m, 24), {1, 2, 3}, o);
  o.seed = 43;
  auto c = Generate(*cached, {1, 2, 3}, o);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok() && u.ok());
  ASSERT_EQ(a->size(), 60u);
  EXPECT_EQ(*a, *b);
  EXPECT_EQ(*a, *u);
  EXPECT_NE(*a, *c);
  for (int64_t id : *a) EXPECT_TRUE(id >= 0 && id < 64) << id;
}

TEST(PickToken, DrawsInProportionToTheSoftmaxAndOnlyFromTheTopK) {
  // p(1) = 3/4, p(0) = 1/4, p(2) = 0 (far below), ids 3.. are padding beyond vocab_size.
  std::vector<float> logits = {0.0f, std::log(3.0f), -100.0f, 50.0f};
  SampleOptions o;
  o.temperature = 1.0f;
  o.vocab_size = 3;
  uint64_t state = 9;
  int ones = 0;
  const int n = 8000;
  for (int i = 0; i < n; ++i) {
    int64_t t = PickToken(logits, o, &state);
    ASSERT_TRUE(t == 0 || t == 1) << t;
    ones += t == 1;
  }
  // Binomial(8000, 0.75) has a standard deviation of 39: 0.75 +- 0.02 is 4 of them.
  EXPECT_NEAR(double(ones) / n, 0.75, 0.02);
  o.top_k = 1;
  for (int i = 0; i < 100; ++i) EXPECT_EQ(PickToken(logits, o, &state), 1);
  o.temperature = 0;
  o.top_k = 0;
  EXPECT_EQ(PickToken(logits, o, &state), 1);
}

TEST(Generate, BadInputIsAnErrorThatSaysWhat) {
  auto g = TestGpt(1);
  SampleOptions o;
  o.vocab_size = 64;
  EXPECT_NE(Generate(*g, {}, o).status().message().find("prompt is empty"), std::string::npos);
  o.vocab_size = 256;
  EXPECT_NE(Generate(*g, {1}, o).status().message().find(
                "tokenizer has 256 tokens but the model's embedding has 64 rows"),
            std::string::npos);
  o.vocab_size = 64;
  EXPECT_NE(Generate(*g, {70}, o).status().message().find("outside the vocabulary"), std::string::npos);
  o.temperature = -1;
  EXPECT_FALSE(Generate(*g, {1}, o).ok());
}

}  // namespace
}  // namespace braid::tools
