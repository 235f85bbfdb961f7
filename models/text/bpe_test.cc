#include "models/text/bpe.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "models/text/bpe_reference.h"

namespace braid::text {
namespace {

std::string Join(const BpeModel& m, const std::vector<uint32_t>& ids) {
  std::string s;
  for (uint32_t id : ids) s += m.token(id);
  return s;
}

// Words in and out of the toy model's training text, runs where merge order matters, bytes.
std::vector<std::string> Samples() {
  std::vector<std::string> s = {"a",      "aa",        "aaa",      "aaaaaaaaa", "abababa",
                                "baaab",  "zzzzzzzzz", " the",     "thethe",    " mother",
                                "Ishmael", "resumed",  "\xC3\xA9t\xC3\xA9", "1234567890123",
                                "\xFF\xFE\xFD", "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E"};
  std::mt19937 rng(1);
  const char letters[] = "aabzthe ";
  for (int i = 0; i < 500; ++i) {
    std::string w;
    int n = 1 + rng() % 90;  // both sides of the short/long cut at 64 bytes
    for (int j = 0; j < n; ++j) w.push_back(letters[rng() % 8]);
    s.push_back(w);
  }
  return s;
}

TEST(BpeModel, ToyModelHasMergesWhereOrderMatters) {
  BpeModel m = ToyModel();
  EXPECT_GT(m.size(), 400u);
  EXPECT_NE(m.Find("aa"), BpeModel::kNoRank);
  EXPECT_NE(m.Find("aaaa"), BpeModel::kNoRank);
  EXPECT_EQ(m.Find("<|endoftext|>"), BpeModel::kNoRank);  // special: text never becomes it
  EXPECT_EQ(m.token(m.size() - 1), "<|endoftext|>");
}

TEST(BpeModel, BothMergeLoopsEqualTheReference) {
  BpeModel m = ToyModel();
  for (const std::string& w : Samples()) {
    std::vector<uint32_t> piece, short_ids, long_ids;
    m.EncodePiece(w, &piece);
    m.MergeShort(w, &short_ids);
    m.MergeLong(w, &long_ids);
    EXPECT_EQ(piece, ReferenceEncodePiece(m, w)) << w;
    EXPECT_EQ(short_ids, long_ids) << w;
    EXPECT_EQ(Join(m, long_ids), w);
  }
}

TEST(BpeModel, LongPieceEqualsTheReference) {
  BpeModel m = ToyModel();
  std::mt19937 rng(3);
  std::string w;
  while (w.size() < 3000) {
    const char* parts[] = {"a", "aa", "ab", "b", "the", "z", "\xC3\xA9"};
    w += parts[rng() % 7];
  }
  std::vector<uint32_t> ids;
  m.EncodePiece(w, &ids);
  EXPECT_EQ(ids, ReferenceEncodePiece(m, w));
  EXPECT_LT(ids.size(), w.size());  // something merged
}

TEST(BpeModel, MegabytePieceCompletesAndRoundTrips) {
  // One "word" of a megabyte: the heap keeps it O(n log n). No time limit is asserted; a
  // quadratic loop would make this test time out instead.
  BpeModel m = ToyModel();
  std::string w;
  std::mt19937 rng(5);
  while (w.size() < (1 << 20)) w += "abzthe"[rng() % 6];
  std::vector<uint32_t> ids;
  m.EncodePiece(w, &ids);
  EXPECT_EQ(Join(m, ids), w);
  EXPECT_LT(ids.size(), w.size());
}

TEST(BpeModel, BuildRefusesBadVocabularies) {
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.emplace_back(1, static_cast<char>(b));

  std::vector<std::string> no_byte(bytes.begin() + 1, bytes.end());
  EXPECT_NE(BpeModel::Build(no_byte, {}).status().message().find("no token for the byte 0"),
            std::string::npos);

  std::vector<std::string> twice = bytes;
  twice.push_back("a");
  EXPECT_NE(BpeModel::Build(twice, {}).status().message().find("same bytes"), std::string::npos);

  std::vector<std::string> ab = bytes;
  ab.push_back("ab");
  EXPECT_TRUE(BpeModel::Build(ab, {{"a", "b"}}).ok());
  EXPECT_NE(BpeModel::Build(ab, {{"a", "c"}}).status().message().find("merge 1"),
            std::string::npos);
  EXPECT_NE(BpeModel::Build(ab, {{"a", "b"}, {"a", "b"}}).status().message().find("already"),
            std::string::npos);
}

}  // namespace
}  // namespace braid::text
