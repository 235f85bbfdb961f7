// Deterministic random numbers for data loading. SplitMix64 is the generator the reference run
// (docs/REFERENCE_RUN.md) specifies, so that Braid and its PyTorch twin draw the same windows;
// it must stay bit-exact.
#ifndef BRAID_MODELS_DATA_RANDOM_H_
#define BRAID_MODELS_DATA_RANDOM_H_

#include <cstdint>

namespace braid::data {

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}

  uint64_t Next() {
    state_ += 0x9E3779B97F4A7C15ull;
    uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

  // The whole generator state, for checkpoints: SplitMix64(state()) continues the stream.
  uint64_t state() const { return state_; }

 private:
  uint64_t state_;
};

// Uniform in [0, n), n > 0, without modulo bias (rejects the few values that would favour small
// results). Used for shuffles; the reference-run window sampler uses plain `Next() % n` instead
// because that is what its specification says.
inline uint64_t UniformBelow(SplitMix64& rng, uint64_t n) {
  const uint64_t threshold = (0 - n) % n;  // 2^64 mod n
  while (true) {
    uint64_t r = rng.Next();
    if (r >= threshold) return r % n;
  }
}

}  // namespace braid::data

#endif  // BRAID_MODELS_DATA_RANDOM_H_
