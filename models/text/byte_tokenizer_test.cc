#include "models/text/byte_tokenizer.h"

#include <string>

#include "gtest/gtest.h"

namespace braid::text {
namespace {

TEST(ByteTokenizer, IdsAreBytes) {
  ByteTokenizer t;
  EXPECT_EQ(t.name(), "byte");
  EXPECT_EQ(t.vocab_size(), 256u);
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  std::vector<uint32_t> ids = t.Encode(all);
  ASSERT_EQ(ids.size(), 256u);
  for (uint32_t b = 0; b < 256; ++b) EXPECT_EQ(ids[b], b);
  EXPECT_EQ(*t.Decode(ids), all);
}

TEST(ByteTokenizer, DecodeNamesAnIdOutsideTheVocabulary) {
  ByteTokenizer t;
  absl::StatusOr<std::string> s = t.Decode(std::vector<uint32_t>{65, 256});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().message(),
            "token id 256 at position 1 is outside the byte vocabulary (256)");
}

}  // namespace
}  // namespace braid::text
