// Token streams for language models: a token file in memory and the two ways of cutting it into
// (inputs, targets) batches: random windows (the reference run's sampler, docs/REFERENCE_RUN.md)
// and llm.c-style sequential chunks.
#ifndef BRAID_MODELS_DATA_TOKEN_DATA_H_
#define BRAID_MODELS_DATA_TOKEN_DATA_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/batch.h"
#include "core/device.h"
#include "models/data/random.h"

namespace braid::data {

enum class TokenType { kU8, kU16, kU32 };  // u16 and u32 files are little-endian

// "u8", "u16", "u32", and the width in bytes.
const char* TokenTypeName(TokenType t);
int TokenWidth(TokenType t);

// A read-only token sequence: one file, or several read one after another (a prepared data
// set's shards, token_manifest.h), memory-mapped (the OS shares the pages between the ranks of a
// job on one machine, instead of each rank holding a copy). Windows may cross from one file into
// the next. Move-only.
class TokenFile {
 public:
  static absl::StatusOr<TokenFile> Open(const std::string& path, TokenType type = TokenType::kU8);
  // The files in order, as one sequence; each must hold a whole, non-zero number of tokens.
  // `label` names the sequence in messages (path()).
  static absl::StatusOr<TokenFile> OpenConcatenated(const std::vector<std::string>& paths,
                                                    TokenType type, const std::string& label);
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
    const Segment& s = SegmentOf(i);
    return At(s.bytes, i - s.begin);
  }
  // Copies tokens [begin, begin + n) into out[0..n), widened to i32. Caller checks the range.
  void Copy(int64_t begin, int64_t n, int32_t* out) const;
  // The file token i is read from and its index in that file (messages).
  std::pair<std::string, int64_t> Locate(int64_t i) const;

 private:
  struct Segment {
    int64_t begin = 0;  // index of its first token in the sequence
    int64_t size = 0;
    const uint8_t* bytes = nullptr;
    std::string path;
  };
  TokenFile() = default;
  // u32 ids above INT32_MAX do not occur: no vocabulary is that large.
  int32_t At(const uint8_t* b, int64_t i) const {
    switch (type_) {
      case TokenType::kU8: return b[i];
      case TokenType::kU16: return int32_t(b[2 * i]) | (int32_t(b[2 * i + 1]) << 8);
      case TokenType::kU32:
        return int32_t(uint32_t(b[4 * i]) | (uint32_t(b[4 * i + 1]) << 8) |
                       (uint32_t(b[4 * i + 2]) << 16) | (uint32_t(b[4 * i + 3]) << 24));
    }
    return 0;
  }
  const Segment& SegmentOf(int64_t i) const;
  void Release();

  std::string path_;
  TokenType type_ = TokenType::kU8;
  int64_t size_ = 0;
  std::vector<Segment> segments_;
  std::vector<std::pair<void*, size_t>> mappings_;  // munmap'ed on destruction
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
