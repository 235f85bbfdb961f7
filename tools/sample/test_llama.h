// A small Llama (grouped-query attention: 4 query heads over 2 K/V heads) with weights far from
// init's scale, for the sampling tests: logits O(1..10) and peaked attention, so a wrong token,
// position or cached key shows in what it generates.
#ifndef BRAID_TOOLS_SAMPLE_TEST_LLAMA_H_
#define BRAID_TOOLS_SAMPLE_TEST_LLAMA_H_

#include <memory>
#include <random>

#include "models/llama/llama.h"

namespace braid::tools {

inline models::LlamaConfig TestLlamaConfig(int64_t vocab = 64) {
  models::LlamaConfig c;
  c.vocab_size = vocab;
  c.block_size = 24;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.n_embd = 32;
  c.intermediate_size = 64;
  return c;
}

inline std::unique_ptr<models::Llama> TestLlama(uint64_t seed, int64_t vocab = 64) {
  auto m = std::make_unique<models::Llama>(TestLlamaConfig(vocab));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, 0.3f);
  for (auto& [name, p] : m->NamedParameters()) {
    std::vector<float> v(size_t(p.numel()));
    for (float& x : v) x = n(rng);
    // Norm weights around 1 (not 0): every block contributes.
    if (p.ndim() == 1) {
      for (float& x : v) x += 1.0f;
    }
    p.CopyFrom(Tensor::FromVector(v, p.shape()));
  }
  return m;
}

}  // namespace braid::tools

#endif  // BRAID_TOOLS_SAMPLE_TEST_LLAMA_H_
