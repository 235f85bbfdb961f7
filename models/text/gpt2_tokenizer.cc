#include "models/text/gpt2_tokenizer.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "models/text/byte_unicode.h"
#include "models/text/gpt2_pretokenizer.h"

namespace braid::text {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot read it (", std::strerror(errno), ")"));
  }
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read failed"));
  return buf.str();
}

absl::Status Malformed(const std::string& file, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(file, ": ", what));
}

// encoder.json: one object, spelling -> id, the ids exactly 0..n-1.
absl::StatusOr<std::vector<std::string>> ParseEncoder(absl::string_view text,
                                                      const std::string& file) {
  const nlohmann::json doc = nlohmann::json::parse(text.begin(), text.end(), nullptr,
                                                   /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object() || doc.empty()) {
    return Malformed(file, "not a JSON object of token spellings to ids (GPT-2's encoder.json)");
  }
  std::vector<std::string> tokens(doc.size());
  std::vector<bool> seen(doc.size(), false);
  for (const auto& [spelling, value] : doc.items()) {
    if (!value.is_number_unsigned() || value.get<uint64_t>() >= doc.size()) {
      return Malformed(file, absl::StrCat("the id of '", spelling, "' is ", value.dump(),
                                          "; ids must be 0..", doc.size() - 1));
    }
    uint64_t id = value.get<uint64_t>();
    if (seen[id]) return Malformed(file, absl::StrCat("two tokens have the id ", id));
    seen[id] = true;
    absl::StatusOr<std::string> bytes = BytesFromGpt2Spelling(spelling);
    if (!bytes.ok()) return Malformed(file, std::string(bytes.status().message()));
    if (bytes->empty()) return Malformed(file, absl::StrCat("token ", id, " is empty"));
    tokens[id] = *std::move(bytes);
  }
  return tokens;
}

// vocab.bpe: a "#version" line, then one merge per line, "left right", in rank order.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ParseMerges(
    absl::string_view text, const std::string& file) {
  std::vector<std::pair<std::string, std::string>> merges;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line[0] == '#')) continue;
    std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
    if (parts.size() != 2 || parts[0].empty() || parts[1].empty()) {
      return Malformed(file, absl::StrCat("line ", line_no, " is '", line,
                                          "', not a merge ('left right', GPT-2's vocab.bpe)"));
    }
    absl::StatusOr<std::string> left = BytesFromGpt2Spelling(parts[0]);
    absl::StatusOr<std::string> right = BytesFromGpt2Spelling(parts[1]);
    if (!left.ok() || !right.ok()) {
      return Malformed(file, absl::StrCat("line ", line_no, ": ",
                                          (left.ok() ? right : left).status().message()));
    }
    merges.emplace_back(*std::move(left), *std::move(right));
  }
  if (merges.empty()) return Malformed(file, "no merges (GPT-2's vocab.bpe has 50,000)");
  return merges;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> Gpt2Tokenizer::Load(
    const std::string& encoder_json_path, const std::string& vocab_bpe_path) {
  absl::StatusOr<std::string> encoder = ReadFile(encoder_json_path);
  if (!encoder.ok()) return encoder.status();
  absl::StatusOr<std::string> merges = ReadFile(vocab_bpe_path);
  if (!merges.ok()) return merges.status();
  return Parse(*encoder, *merges, encoder_json_path, vocab_bpe_path);
}

absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> Gpt2Tokenizer::Parse(
    absl::string_view encoder_json, absl::string_view vocab_bpe,
    const std::string& encoder_json_name, const std::string& vocab_bpe_name) {
  auto tokens = ParseEncoder(encoder_json, encoder_json_name);
  if (!tokens.ok()) return tokens.status();
  auto merges = ParseMerges(vocab_bpe, vocab_bpe_name);
  if (!merges.ok()) return merges.status();
  absl::StatusOr<BpeModel> model = BpeModel::Build(*std::move(tokens), *merges);
  if (!model.ok()) {
    return Malformed(absl::StrCat(vocab_bpe_name, " with ", encoder_json_name),
                     std::string(model.status().message()));
  }
  return std::unique_ptr<Gpt2Tokenizer>(new Gpt2Tokenizer(*std::move(model)));
}

void Gpt2Tokenizer::Encode(absl::string_view text, std::vector<uint32_t>* ids) const {
  for (size_t pos = 0; pos < text.size();) {
    size_t end = Gpt2PieceEnd(text, pos);
    model_.EncodePiece(text.substr(pos, end - pos), ids);
    pos = end;
  }
}

absl::StatusOr<std::string> Gpt2Tokenizer::Decode(absl::Span<const uint32_t> ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= model_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", ids[i], " at position ", i,
                                                     " is outside the gpt2 vocabulary (",
                                                     model_.size(), ")"));
    }
    out += model_.token(ids[i]);
  }
  return out;
}

}  // namespace braid::text
