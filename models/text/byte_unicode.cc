#include "models/text/byte_unicode.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace braid::text {
namespace {

bool Printable(int b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

struct Tables {
  uint32_t to_unicode[256];
  int16_t to_byte[512];  // characters used are all below U+0200; -1 where none
  Tables() {
    for (int16_t& b : to_byte) b = -1;
    uint32_t extra = 256;
    for (int b = 0; b < 256; ++b) {
      to_unicode[b] = Printable(b) ? b : extra++;
      to_byte[to_unicode[b]] = static_cast<int16_t>(b);
    }
  }
};

const Tables& T() {
  static const Tables* t = new Tables();
  return *t;
}

}  // namespace

uint32_t ByteToUnicode(unsigned char b) { return T().to_unicode[b]; }

absl::StatusOr<std::string> BytesFromGpt2Spelling(absl::string_view spelling) {
  std::string out;
  const auto* s = reinterpret_cast<const unsigned char*>(spelling.data());
  for (size_t i = 0; i < spelling.size();) {
    uint32_t c;
    if (s[i] < 0x80) {
      c = s[i++];
    } else if ((s[i] & 0xE0) == 0xC0 && i + 1 < spelling.size() && (s[i + 1] & 0xC0) == 0x80) {
      c = ((s[i] & 0x1F) << 6) | (s[i + 1] & 0x3F);
      i += 2;
    } else {
      // Every character of the mapping is below U+0800, so two bytes at most.
      return absl::InvalidArgumentError(absl::StrCat(
          "'", spelling, "' has a character that stands for no byte in GPT-2's byte encoding"));
    }
    if (c >= 512 || T().to_byte[c] < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("'%s' has the character U+%04X, which stands for no byte in GPT-2's "
                          "byte encoding",
                          std::string(spelling), c));
    }
    out.push_back(static_cast<char>(T().to_byte[c]));
  }
  return out;
}

}  // namespace braid::text
