// One token per byte (vocabulary 256): what the byte-level models have always read.
#ifndef BRAID_MODELS_TEXT_BYTE_TOKENIZER_H_
#define BRAID_MODELS_TEXT_BYTE_TOKENIZER_H_

#include "models/text/tokenizer.h"

namespace braid::text {

class ByteTokenizer : public Tokenizer {
 public:
  std::string name() const override { return "byte"; }
  uint32_t vocab_size() const override { return 256; }
  using Tokenizer::Encode;
  void Encode(absl::string_view text, std::vector<uint32_t>* ids) const override;
  absl::StatusOr<std::string> Decode(absl::Span<const uint32_t> ids) const override;
};

}  // namespace braid::text

#endif  // BRAID_MODELS_TEXT_BYTE_TOKENIZER_H_
