// Text generation from any model through its TokenDecoder (core/token_decoder.h): with the
// model's key/value cache each new token runs through the model once. Greedy at temperature 0; otherwise softmax(logits / temperature)
// over the top_k most likely tokens (0: all), drawn with a generator seeded by `seed`, so the
// same seed gives the same tokens on any machine (the draw is ours, not the C++ library's
// distribution, whose algorithm is implementation-defined).
#ifndef BRAID_TOOLS_SAMPLE_GENERATE_H_
#define BRAID_TOOLS_SAMPLE_GENERATE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/token_decoder.h"

namespace braid::tools {

struct SampleOptions {
  int64_t max_new_tokens = 100;
  float temperature = 1.0f;  // 0: greedy (argmax; the lowest id on ties)
  int64_t top_k = 0;         // 0: every token
  uint64_t seed = 1;
  // Tokens [0, vocab_size) may be drawn: the tokenizer's vocabulary, never the padding rows.
  int64_t vocab_size = 0;
};

// The token after `logits` (one row of vocab_size or more) under `opts`; `state` is the
// generator's (advanced by one draw when sampling).
int64_t PickToken(const std::vector<float>& logits, const SampleOptions& opts, uint64_t* state);

// `prompt` (at least one id) followed by max_new_tokens new ones; returns only the new ones.
// The context is the decoder's capacity (the model's block_size): when it is full, generation
// goes on from a cleared decoder over the newest half of the context (one prefill per
// capacity / 2 tokens), so the cost stays linear in the number of tokens generated. `decoder`
// is cleared first. Errors: an empty prompt, an id or vocab_size outside the model's
// vocabulary, bad options.
absl::StatusOr<std::vector<int64_t>> Generate(TokenDecoder& decoder,
                                              const std::vector<int64_t>& prompt,
                                              const SampleOptions& opts);

}  // namespace braid::tools

#endif  // BRAID_TOOLS_SAMPLE_GENERATE_H_
