// Generation speed with and without the key/value cache (models/nn/kv_cache.h), one process:
// gpt-mini's shape (random weights: speed does not depend on them), greedy, N new tokens after a
// one-token prompt, for several N. With the cache each token runs through the model once; without
// it (what nanoGPT's generate does) the whole context runs again for every token, so its time per
// token grows with the context. Each figure is the fastest of 5 runs (the machine is shared).
// Prints one line per N; the figures go to docs/BENCHMARKS.md, never into a test.
//   bazel build //tools/bench:sample_bench && bazel-bin/tools/bench/sample_bench
#include <algorithm>
#include <cstdio>
#include <vector>

#include "absl/time/clock.h"
#include "backends/cpu/cpu_backend.h"
#include "core/autograd.h"
#include "models/gpt/gpt.h"

namespace {

using braid::Tensor;

// Greedy tokens with the cache.
double Cached(braid::models::Gpt& g, int n) {
  const absl::Time t0 = absl::Now();
  braid::models::KvCache cache = g.NewKvCache();
  int32_t next = 10;
  for (int i = 0; i < n; ++i) {
    std::vector<float> logits =
        g.ForwardCached(Tensor::FromVector(std::vector<int32_t>{next}, {1, 1}), cache).ToFloatVector();
    next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  return absl::ToDoubleSeconds(absl::Now() - t0);
}

// The same without it: the whole sequence so far through Forward for every token.
double Uncached(braid::models::Gpt& g, int n) {
  braid::autograd::NoGradGuard no_grad;
  const absl::Time t0 = absl::Now();
  std::vector<int32_t> seq = {10};
  const int64_t v = g.config().padded_vocab_size;
  for (int i = 0; i < n; ++i) {
    std::vector<float> logits =
        g.Forward(Tensor::FromVector(seq, {1, int64_t(seq.size())})).ToFloatVector();
    const float* last = logits.data() + (seq.size() - 1) * size_t(v);
    seq.push_back(int32_t(std::max_element(last, last + v) - last));
  }
  return absl::ToDoubleSeconds(absl::Now() - t0);
}

}  // namespace

int main() {
  braid::cpu::SetNumThreads(1);
  braid::models::Gpt g(braid::models::GptConfig::Mini());  // context 128
  g.Eval();
  Cached(g, 8);  // warm-up
  for (int n : {32, 64, 127}) {
    double c = 1e30, u = 1e30;
    for (int r = 0; r < 5; ++r) {
      c = std::min(c, Cached(g, n));
      u = std::min(u, Uncached(g, n));
    }
    std::printf("gpt-mini, %3d new tokens: cached %.3f s (%.0f tok/s), uncached %.3f s (%.0f tok/s), %.1fx\n",
                n, c, n / c, u, n / u, u / c);
  }
  return 0;
}
