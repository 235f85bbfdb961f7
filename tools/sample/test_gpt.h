// A small GPT with weights far from init's scale (logits O(1..10), peaked attention), for the
// sampling tests: a wrong token or a wrong position shows in what it generates.
#ifndef BRAID_TOOLS_SAMPLE_TEST_GPT_H_
#define BRAID_TOOLS_SAMPLE_TEST_GPT_H_

#include <memory>
#include <random>

#include "models/gpt/gpt.h"

namespace braid::tools {

inline models::GptConfig TestGptConfig(int64_t vocab_rows = 64) {
  models::GptConfig c;
  c.vocab_size = c.padded_vocab_size = vocab_rows;
  c.block_size = 24;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 32;
  return c;
}

inline std::unique_ptr<models::Gpt> TestGpt(uint64_t seed, int64_t vocab_rows = 64) {
  auto g = std::make_unique<models::Gpt>(TestGptConfig(vocab_rows));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, 0.3f);
  for (auto& [name, p] : g->NamedParameters()) {
    std::vector<float> v(size_t(p.numel()));
    // Strong position embeddings: a greedy run moves from token to token instead of settling
    // on one at once, so comparing two greedy runs compares many choices.
    const float scale = name == "wpe.weight" ? 5.0f : 1.0f;
    for (float& x : v) x = scale * n(rng);
    p.CopyFrom(Tensor::FromVector(v, p.shape()));
  }
  return g;
}

}  // namespace braid::tools

#endif  // BRAID_TOOLS_SAMPLE_TEST_GPT_H_
