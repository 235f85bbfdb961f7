// Token streams for language models: a token file in memory and the two ways of cutting it into
// (inputs, targets) batches: random windows (the reference run's sampler, docs/REFERENCE_RUN.md)
// and llm.c-style sequential chunks.
#ifndef BRAID_MODELS_DATA_TOKEN_DATA_H_
#define BRAID_MODELS_DATA_TOKEN_DATA_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/batch.h"
#include "core/device.h"
#include "models/data/random.h"

namespace braid::data {

enum class TokenType { kU8, kU16 };  // u16 files are little-endian

// A read-only token file, memory-mapped (the OS shares the pages between the ranks of a job on
// one machine, instead of each rank holding a copy). Move-only.
class TokenFile {
 public:
  static absl::StatusOr<TokenFile> Open(const std::string& path, TokenType type = TokenType::kU8);
  // Tokens held in memory (tests, generated data). Values must fit the type.
  static TokenFile FromTokens(const std::vector<int32_t>& tokens, TokenType type = TokenType::kU8);

  TokenFile(TokenFile&& o) noexcept;
  TokenFile& operator=(TokenFile&& o) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;
  ~TokenFile();

  int64_t size() const { return size_; }  // in tokens
  TokenType type() const { return type_; }
  const std::string& path() const { return path_; }  // "<memory>" for FromTokens
  int32_t operator[](int64_t i) const {
    BRAID_CHECK(i >= 0 && i < size_)
        << "token " << i << " out of range for " << path_ << " (" << size_ << " tokens)";
    return At(i);
  }
  // Copies tokens [begin, begin + n) into out[0..n), widened to i32. Caller checks the range.
  void Copy(int64_t begin, int64_t n, int32_t* out) const;

 private:
  TokenFile() = default;
  int32_t At(int64_t i) const {
    if (type_ == TokenType::kU8) return bytes_[i];
    return int32_t(bytes_[2 * i]) | (int32_t(bytes_[2 * i + 1]) << 8);
  }
  void Release();

  std::string path_;
  TokenType type_ = TokenType::kU8;
  const uint8_t* bytes_ = nullptr;
  int64_t size_ = 0;
  void* mapping_ = nullptr;  // munmap'ed on destruction when set
  size_t mapping_bytes_ = 0;
  std::vector<uint8_t> owned_;  // FromTokens
};

// The reference run's sampler: one independent stream per rank, rng = SplitMix64(base_seed +
// rank); each batch draws, for b = 0..B-1 in order, s = rng.Next() mod (N - T) and takes
// x[b] = data[s : s+T], y[b] = data[s+1 : s+T+1]. The stream never resets.
class RandomWindowSampler {
 public:
  // Needs N > T (every window and its shifted target fit) and B, T >= 1.
  static absl::StatusOr<RandomWindowSampler> Create(std::shared_ptr<const TokenFile> data,
                                                    int64_t batch, int64_t context,
                                                    uint64_t base_seed, int rank,
                                                    Device device = Device::CPU());
  // inputs and targets: i32 [B, T] on the sampler's device.
  Batch Next();
  // The window starts Next() would use, advancing the stream the same way (tests, debugging).
  std::vector<int64_t> NextStarts();

  // For checkpoints: restoring the state resumes the exact stream.
  uint64_t rng_state() const { return rng_.state(); }
  void set_rng_state(uint64_t s) { rng_ = SplitMix64(s); }
  int64_t batch() const { return batch_; }
  int64_t context() const { return context_; }

 private:
  RandomWindowSampler(std::shared_ptr<const TokenFile> data, int64_t batch, int64_t context,
                      uint64_t seed, Device device)
      : data_(std::move(data)), batch_(batch), context_(context), rng_(seed), device_(device) {}

  std::shared_ptr<const TokenFile> data_;
  int64_t batch_;
  int64_t context_;
  SplitMix64 rng_;
  Device device_;
};

// llm.c-style sequential batches: each batch is the next B*T+1 tokens (x = the first B*T,
// y = the last B*T, row b is tokens [b*T, (b+1)*T)). Rank r of W starts at r*B*T and moves
// W*B*T per batch, so the ranks read disjoint chunks; when the next chunk of some rank would run
// past the end, every rank wraps back to its start together (the tail of the file shorter than
// W*B*T+1 tokens is skipped that pass, as in llm.c).
class SequentialLoader {
 public:
  // Needs N >= W*B*T + 1, so that every rank has at least one batch per pass.
  static absl::StatusOr<SequentialLoader> Create(std::shared_ptr<const TokenFile> data,
                                                 int64_t batch, int64_t context, int rank,
                                                 int world_size, Device device = Device::CPU());
  Batch Next();
  // Token position the next batch starts at (before Next() advances).
  int64_t position() const { return (step_ * world_ + rank_) * batch_ * context_; }
  int64_t batches_per_pass() const { return batches_per_pass_; }
  // For checkpoints: the index of the next batch within the current pass.
  int64_t step() const { return step_; }
  void set_step(int64_t s) {
    BRAID_CHECK(s >= 0) << "negative step " << s;
    step_ = s % batches_per_pass_;
  }

 private:
  SequentialLoader(std::shared_ptr<const TokenFile> data, int64_t batch, int64_t context, int rank,
                   int world, Device device);

  std::shared_ptr<const TokenFile> data_;
  int64_t batch_;
  int64_t context_;
  int rank_;
  int world_;
  Device device_;
  int64_t batches_per_pass_;
  int64_t step_ = 0;
};

}  // namespace braid::data

#endif  // BRAID_MODELS_DATA_TOKEN_DATA_H_
