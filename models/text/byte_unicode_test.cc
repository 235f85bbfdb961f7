#include "models/text/byte_unicode.h"

#include <set>
#include <string>

#include "gtest/gtest.h"

namespace braid::text {
namespace {

std::string Utf8(uint32_t c) {
  std::string s;
  if (c < 0x80) {
    s.push_back(static_cast<char>(c));
  } else {
    s.push_back(static_cast<char>(0xC0 | (c >> 6)));
    s.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
  return s;
}

// Known points of GPT-2's table: printable bytes are themselves, the space is 'Ġ' (U+0120),
// the newline 'Ċ' (U+010A), byte 0 is U+0100 and the soft hyphen (0xAD) is the last, U+0143.
TEST(ByteUnicode, KnownPoints) {
  EXPECT_EQ(ByteToUnicode('a'), uint32_t{'a'});
  EXPECT_EQ(ByteToUnicode('!'), uint32_t{'!'});
  EXPECT_EQ(ByteToUnicode(0xE9), 0xE9u);
  EXPECT_EQ(ByteToUnicode(' '), 0x120u);
  EXPECT_EQ(ByteToUnicode('\n'), 0x10Au);
  EXPECT_EQ(ByteToUnicode(0), 0x100u);
  EXPECT_EQ(ByteToUnicode(0xAD), 0x143u);
}

TEST(ByteUnicode, IsABijectionAndReadsBack) {
  std::set<uint32_t> seen;
  std::string spelled, bytes;
  for (int b = 0; b < 256; ++b) {
    seen.insert(ByteToUnicode(b));
    spelled += Utf8(ByteToUnicode(b));
    bytes.push_back(static_cast<char>(b));
  }
  EXPECT_EQ(seen.size(), 256u);
  EXPECT_EQ(*BytesFromGpt2Spelling(spelled), bytes);
}

TEST(ByteUnicode, RefusesCharactersThatStandForNoByte) {
  EXPECT_FALSE(BytesFromGpt2Spelling("a b").ok());        // a raw space is spelled 'Ġ'
  EXPECT_FALSE(BytesFromGpt2Spelling("\xC5\x84").ok());   // U+0144, past the table
  EXPECT_FALSE(BytesFromGpt2Spelling("\xE6\x97\xA5").ok());
  EXPECT_FALSE(BytesFromGpt2Spelling("\xC3").ok());
}

}  // namespace
}  // namespace braid::text
