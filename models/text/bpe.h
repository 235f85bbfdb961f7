// Byte-pair encoding of one piece (a pre-tokenized word) with a ranked vocabulary, as tiktoken
// does it: start from one token per byte; repeatedly merge the adjacent pair whose concatenated
// bytes form the token of lowest rank (the leftmost such pair on a tie) until no adjacent pair
// forms a token. A token's rank is its merge's line in GPT-2's vocab.bpe, which for GPT-2 is
// also its id minus 256.
//
// Short pieces (nearly all of them) use a plain scan per merge. Long ones use a heap of pairs
// keyed by (rank, position) over a linked list of parts, O(n log n): a megabyte with no space in
// it (base64, a minified line) costs seconds, not hours. Both give the same merges: (rank,
// position) is a total order on the pairs present at any time, and each picks its minimum.
#ifndef BRAID_MODELS_TEXT_BPE_H_
#define BRAID_MODELS_TEXT_BPE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace braid::text {

class BpeModel {
 public:
  static constexpr uint32_t kNoRank = UINT32_MAX;

  // `tokens[id]` is the bytes of token `id`; every single byte must be one of them, and no two
  // tokens may be equal. `merges` is the ordered list of (left, right) byte strings; merge i
  // gives the token left + right rank i. Tokens made by no merge (bytes, special tokens) have no
  // rank. Errors name the merge or token at fault.
  static absl::StatusOr<BpeModel> Build(
      std::vector<std::string> tokens,
      const std::vector<std::pair<std::string, std::string>>& merges);

  uint32_t size() const { return static_cast<uint32_t>(tokens_.size()); }
  const std::string& token(uint32_t id) const { return tokens_[id]; }
  uint32_t byte_id(unsigned char b) const { return byte_ids_[b]; }
  // The id of the ordinary token (a byte or a merge's) with these bytes, or kNoRank. Special
  // tokens (no rank, more than one byte, e.g. "<|endoftext|>") are never found: text does not
  // turn into them.
  uint32_t Find(absl::string_view bytes) const {
    auto it = ids_.find(bytes);
    return it == ids_.end() ? kNoRank : it->second;
  }
  uint32_t rank(uint32_t id) const { return ranks_[id]; }

  // Appends the ids of `piece` (non-empty) to `out`. The whole piece is looked up first, as
  // tiktoken does: a piece that is itself a token is that token.
  void EncodePiece(absl::string_view piece, std::vector<uint32_t>* out) const;
  // The merge loops themselves, without the whole-piece lookup (tests compare the two).
  void MergeShort(absl::string_view piece, std::vector<uint32_t>* out) const;
  void MergeLong(absl::string_view piece, std::vector<uint32_t>* out) const;

 private:
  struct Merged {
    uint32_t rank;
    uint32_t id;
  };
  // The token formed by ids a and b side by side, if any.
  const Merged* Pair(uint32_t a, uint32_t b) const {
    auto it = pairs_.find((uint64_t{a} << 32) | b);
    return it == pairs_.end() ? nullptr : &it->second;
  }

  std::vector<std::string> tokens_;
  std::vector<uint32_t> ranks_;  // by id
  uint32_t byte_ids_[256] = {};
  absl::flat_hash_map<std::string, uint32_t> ids_;
  // (left id << 32 | right id) -> the ranked token whose bytes are left's then right's: every
  // split of every ranked token into two tokens, so a merge never builds a string.
  absl::flat_hash_map<uint64_t, Merged> pairs_;
};

}  // namespace braid::text

#endif  // BRAID_MODELS_TEXT_BPE_H_
