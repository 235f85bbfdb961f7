#include "models/text/byte_tokenizer.h"

#include "absl/strings/str_cat.h"

namespace braid::text {

void ByteTokenizer::Encode(absl::string_view text, std::vector<uint32_t>* ids) const {
  ids->reserve(ids->size() + text.size());
  for (unsigned char c : text) ids->push_back(c);
}

absl::StatusOr<std::string> ByteTokenizer::Decode(absl::Span<const uint32_t> ids) const {
  std::string out;
  out.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= 256) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", ids[i], " at position ", i,
                                                     " is outside the byte vocabulary (256)"));
    }
    out.push_back(static_cast<char>(ids[i]));
  }
  return out;
}

}  // namespace braid::text
