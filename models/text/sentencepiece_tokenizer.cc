#include "models/text/sentencepiece_tokenizer.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string_view>

#include "absl/strings/str_cat.h"

namespace braid::text {

SentencePieceTokenizer::SentencePieceTokenizer(spm::ModelPtr model, std::string name)
    : model_(std::move(model)),
      name_(std::move(name)),
      vocab_size_(static_cast<uint32_t>(spm::VocabSize(*model_))) {}

absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> SentencePieceTokenizer::Load(
    const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot read it (", std::strerror(errno), ")"));
  }
  std::ostringstream buf;
  buf << in.rdbuf();
  std::string error;
  spm::ModelPtr model = spm::Load(buf.str(), &error);
  if (model == nullptr || spm::VocabSize(*model) <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a SentencePiece model (", error.empty() ? "no pieces" : error,
                     ")"));
  }
  size_t slash = path.find_last_of('/');
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  return std::unique_ptr<SentencePieceTokenizer>(
      new SentencePieceTokenizer(std::move(model), "sentencepiece:" + base));
}

void SentencePieceTokenizer::Encode(absl::string_view text, std::vector<uint32_t>* ids) const {
  std::vector<int> out;
  std::string error;
  // Encoding a loaded model has no failure but a missing model, which Load rules out.
  spm::Encode(*model_, std::string_view(text.data(), text.size()), &out, &error);
  ids->insert(ids->end(), out.begin(), out.end());
}

absl::StatusOr<std::string> SentencePieceTokenizer::Decode(absl::Span<const uint32_t> ids) const {
  std::vector<int> in(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= vocab_size_) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", ids[i], " at position ", i,
                                                     " is outside the ", name_, " vocabulary (",
                                                     vocab_size_, ")"));
    }
    in[i] = static_cast<int>(ids[i]);
  }
  std::string text, error;
  if (!spm::Decode(*model_, in, &text, &error)) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": ", error));
  }
  return text;
}

}  // namespace braid::text
