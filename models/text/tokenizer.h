// A tokenizer turns bytes into token ids and back. Implementations: ByteTokenizer (one id per
// byte, the vocabulary of 256 the byte-level models train on), Gpt2Tokenizer (GPT-2's
// byte-level BPE) and SentencePieceTokenizer (a .model file, through libsentencepiece). Callers that only move ids around (data preparation, sampling) hold this
// interface, so the vocabulary is a choice made once, by name.
#ifndef BRAID_MODELS_TEXT_TOKENIZER_H_
#define BRAID_MODELS_TEXT_TOKENIZER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace braid::text {

// Encode and Decode keep no state between calls: one tokenizer may serve many threads at once.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Short identity written next to ids (e.g. in a manifest), so ids are never read with another
  // vocabulary: "byte", "gpt2".
  virtual std::string name() const = 0;
  // Ids are in [0, vocab_size()).
  virtual uint32_t vocab_size() const = 0;

  // Any bytes are accepted, valid UTF-8 or not. Decode(Encode(x)) == x for every x with the byte
  // and GPT-2 tokenizers; a SentencePiece model normalizes as it was trained to (see
  // sentencepiece_tokenizer.h). Appends to `ids` so that a caller can encode many documents
  // into one buffer.
  virtual void Encode(absl::string_view text, std::vector<uint32_t>* ids) const = 0;
  // InvalidArgument naming the position of the first id >= vocab_size().
  virtual absl::StatusOr<std::string> Decode(absl::Span<const uint32_t> ids) const = 0;

  std::vector<uint32_t> Encode(absl::string_view text) const {
    std::vector<uint32_t> ids;
    Encode(text, &ids);
    return ids;
  }
};

}  // namespace braid::text

#endif  // BRAID_MODELS_TEXT_TOKENIZER_H_
