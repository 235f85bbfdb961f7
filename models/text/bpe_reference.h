// Test oracles for BPE: the merge loop written the slow, obvious way, and a small vocabulary
// trained here, so that tests and the fuzzer need no data files.
#ifndef BRAID_MODELS_TEXT_BPE_REFERENCE_H_
#define BRAID_MODELS_TEXT_BPE_REFERENCE_H_

#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"
#include "models/text/bpe.h"

namespace braid::text {

// tiktoken's algorithm on strings: a piece that is an ordinary token is that token; otherwise
// start from bytes and repeatedly merge the leftmost adjacent pair whose concatenation is the
// ranked token of lowest rank. Quadratic or worse: short inputs only.
std::vector<uint32_t> ReferenceEncodePiece(const BpeModel& model, absl::string_view piece);

// A byte-level BPE trained on a fixed text of a few languages (most frequent pair first, ties
// broken by the pair's bytes), with about `num_merges` merges and a special token
// "<|endoftext|>" after them. Its runs of repeated letters give merges such as "aa" + "a" and
// "aa" + "aa", where the order of merging matters.
BpeModel ToyModel(int num_merges = 300);

}  // namespace braid::text

#endif  // BRAID_MODELS_TEXT_BPE_REFERENCE_H_
