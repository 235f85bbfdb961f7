#include "models/data/sha256.h"

#include <cstdlib>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace braid::data {
namespace {

// FIPS 180-2's examples.
TEST(Sha256, KnownDigests) {
  EXPECT_EQ(Sha256Hex("abc", 3), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex("", 0), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  Sha256 h;  // in pieces
  const std::string m = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  h.Update(m.data(), 10);
  h.Update(m.data() + 10, m.size() - 10);
  EXPECT_EQ(h.Hex(), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256, OfFileEqualsOfBytesAndNamesAMissingFile) {
  const char* t = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(t != nullptr ? t : "/tmp") + "/sha_input.bin";
  std::string bytes(3 << 20, '\0');  // more than one read block
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = char(i * 7 + (i >> 11));
  std::ofstream(path, std::ios::binary) << bytes;
  absl::StatusOr<std::string> got = Sha256OfFile(path);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, Sha256Hex(bytes.data(), bytes.size()));
  absl::StatusOr<std::string> missing = Sha256OfFile(path + ".missing");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("sha_input.bin.missing"), absl::string_view::npos);
}

}  // namespace
}  // namespace braid::data
