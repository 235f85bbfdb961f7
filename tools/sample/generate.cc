#include "tools/sample/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace braid::tools {
namespace {

// SplitMix64: a tiny generator whose output is the same everywhere.
uint64_t NextRandom(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::vector<float> LastRow(const Tensor& logits) {
  const int64_t t = logits.size(1), v = logits.size(2);
  std::vector<float> all = logits.ToFloatVector();
  return std::vector<float>(all.begin() + (t - 1) * v, all.begin() + t * v);
}

Tensor Ids(const std::vector<int64_t>& ids, size_t begin) {
  std::vector<int32_t> v(ids.begin() + long(begin), ids.end());
  return Tensor::FromVector(v, {1, int64_t(v.size())});
}

}  // namespace

int64_t PickToken(const std::vector<float>& logits, const SampleOptions& opts, uint64_t* state) {
  const int64_t n = opts.vocab_size;
  if (opts.temperature <= 0) {
    return int64_t(std::max_element(logits.begin(), logits.begin() + n) - logits.begin());
  }
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  const int64_t k = opts.top_k > 0 ? std::min(opts.top_k, n) : n;
  if (k < n) {
    // The k most likely first, ids ascending among equals: a strict order, so the kept set and
    // its order never depend on the algorithm. Linear selection, then a sort of the k kept.
    auto before = [&](int64_t a, int64_t b) {
      return logits[size_t(a)] != logits[size_t(b)] ? logits[size_t(a)] > logits[size_t(b)] : a < b;
    };
    std::nth_element(order.begin(), order.begin() + (k - 1), order.end(), before);
    std::sort(order.begin(), order.begin() + k, before);
  }
  // Subtracting the largest logit keeps exp() in range (every token, in id order, when k == n).
  float most = -INFINITY;
  for (int64_t i = 0; i < k; ++i) most = std::max(most, logits[size_t(order[size_t(i)])]);
  std::vector<double> p(static_cast<size_t>(k));
  const double top = double(most) / opts.temperature;
  double sum = 0;
  for (int64_t i = 0; i < k; ++i) {
    sum += (p[size_t(i)] = std::exp(double(logits[size_t(order[size_t(i)])]) / opts.temperature - top));
  }
  const double u = double(NextRandom(state) >> 11) * 0x1.0p-53 * sum;  // in [0, sum)
  double acc = 0;
  for (int64_t i = 0; i < k; ++i) {
    acc += p[size_t(i)];
    if (u < acc) return order[size_t(i)];
  }
  return order[size_t(k - 1)];  // u within rounding of sum
}

absl::StatusOr<std::vector<int64_t>> Generate(TokenDecoder& decoder,
                                              const std::vector<int64_t>& prompt,
                                              const SampleOptions& opts) {
  const int64_t rows = decoder.vocab_rows();
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt is empty; give some text to continue");
  if (opts.vocab_size <= 0 || opts.vocab_size > rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the tokenizer has ", opts.vocab_size, " tokens but the model's embedding has ", rows,
        " rows; use the tokenizer the model was trained with"));
  }
  for (int64_t id : prompt) {
    if (id < 0 || id >= opts.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("prompt token ", id, " is outside the vocabulary of ",
                                                     opts.vocab_size));
    }
  }
  if (opts.max_new_tokens < 0 || opts.top_k < 0 || !(opts.temperature >= 0) ||
      !std::isfinite(opts.temperature)) {
    return absl::InvalidArgumentError(
        "max_new_tokens and top_k must be >= 0 and temperature a finite number >= 0");
  }
  std::vector<int64_t> seq = prompt, out;
  uint64_t state = opts.seed;
  const size_t window = size_t(decoder.capacity());
  decoder.Clear();
  // The prompt's newest `window` tokens go in first (a longer prompt is cut, as in nanoGPT).
  std::vector<float> last =
      LastRow(decoder.Step(Ids(seq, seq.size() > window ? seq.size() - window : 0)));
  for (int64_t i = 0; i < opts.max_new_tokens; ++i) {
    const int64_t next = PickToken(last, opts, &state);
    seq.push_back(next);
    out.push_back(next);
    if (i + 1 == opts.max_new_tokens) break;
    if (decoder.length() == int64_t(window)) {
      // Full: a fresh context over the newest half, this token included.
      decoder.Clear();
      last = LastRow(decoder.Step(Ids(seq, seq.size() - std::max<size_t>(1, window / 2))));
    } else {
      last = LastRow(decoder.Step(Ids(seq, seq.size() - 1)));
    }
  }
  return out;
}

}  // namespace braid::tools
