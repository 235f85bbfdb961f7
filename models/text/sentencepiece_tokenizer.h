// A SentencePiece model (a .model file: Llama-family, T5, ... vocabularies) through Debian's
// libsentencepiece, which lives in libbraid_sentencepiece.so, loaded on first use
// (sentencepiece_bridge.h says why). Its ids are the library's own. Unlike the byte and GPT-2 tokenizers,
// Decode(Encode(x)) == x only where the model allows it: a model normalizes text as it was
// trained to (NFKC by default, spaces collapsed), and without byte_fallback it turns characters
// it has never seen into <unk>. Llama's tokenizer.model (identity normalization, byte fallback)
// round-trips except for details of leading spaces.
#ifndef BRAID_MODELS_TEXT_SENTENCEPIECE_TOKENIZER_H_
#define BRAID_MODELS_TEXT_SENTENCEPIECE_TOKENIZER_H_

#include <memory>
#include <optional>
#include <string>

#include "models/text/tokenizer.h"

namespace braid::text {

class SentencePieceTokenizer : public Tokenizer {
 public:
  // NotFound when the file cannot be read, InvalidArgument when it is no SentencePiece model;
  // both start with the path. FailedPrecondition when libbraid_sentencepiece.so is not found
  // (in the program's runfiles, beside it, or at $BRAID_SENTENCEPIECE_LIB).
  static absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> Load(const std::string& path);

  // "sentencepiece:<file name>": which model, without the folder it happens to be in.
  ~SentencePieceTokenizer() override;
  SentencePieceTokenizer(const SentencePieceTokenizer&) = delete;
  SentencePieceTokenizer& operator=(const SentencePieceTokenizer&) = delete;

  std::string name() const override { return name_; }
  uint32_t vocab_size() const override { return vocab_size_; }
  // The model's </s> (Llama's is 2), written after each document by data preparation; none when
  // the model was trained without one.
  std::optional<uint32_t> eos_id() const { return eos_id_; }
  using Tokenizer::Encode;
  void Encode(absl::string_view text, std::vector<uint32_t>* ids) const override;
  absl::StatusOr<std::string> Decode(absl::Span<const uint32_t> ids) const override;

  struct Library;  // the functions of libbraid_sentencepiece.so

 private:
  SentencePieceTokenizer(const Library* lib, void* model, std::string name);
  const Library* lib_;
  void* model_;
  std::string name_;
  uint32_t vocab_size_;
  std::optional<uint32_t> eos_id_;
};

}  // namespace braid::text

#endif  // BRAID_MODELS_TEXT_SENTENCEPIECE_TOKENIZER_H_
