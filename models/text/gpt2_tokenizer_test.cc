// Loading GPT-2's two files and what a malformed one is told, with small files written here.
// Bit-exactness against tiktoken on the real vocabulary: //tools/tokenize:reference_test.
#include "models/text/gpt2_tokenizer.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "models/text/byte_unicode.h"

namespace braid::text {
namespace {

std::string Spell(const std::string& bytes) {
  std::string s;
  for (unsigned char b : bytes) {
    uint32_t c = ByteToUnicode(b);
    if (c < 0x80) {
      s.push_back(static_cast<char>(c));
    } else {
      s.push_back(static_cast<char>(0xC0 | (c >> 6)));
      s.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
  }
  return s;
}

// A GPT-2-shaped vocabulary: the 256 bytes, then the merges' tokens, then <|endoftext|>.
struct Files {
  std::string encoder, merges;
};
Files MakeFiles(const std::vector<std::pair<std::string, std::string>>& merges) {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.emplace_back(1, static_cast<char>(b));
  Files f{"{", "#version: 0.2\n"};
  for (const auto& [l, r] : merges) {
    tokens.push_back(l + r);
    absl::StrAppend(&f.merges, Spell(l), " ", Spell(r), "\n");
  }
  for (size_t id = 0; id < tokens.size(); ++id) {
    // JSON escapes for the two characters of the table that need them.
    std::string key = Spell(tokens[id]);
    if (key == "\"" || key == "\\") key = "\\" + key;
    absl::StrAppend(&f.encoder, id ? ", " : "", "\"", key, "\": ", id);
  }
  absl::StrAppend(&f.encoder, ", \"<|endoftext|>\": ", tokens.size(), "}");
  return f;
}

const std::vector<std::pair<std::string, std::string>> kMerges = {
    {" ", "t"}, {"h", "e"}, {" t", "he"}, {"a", "a"}, {"aa", "aa"}};

TEST(Gpt2Tokenizer, EncodesAndDecodes) {
  Files f = MakeFiles(kMerges);
  auto t = Gpt2Tokenizer::Parse(f.encoder, f.merges);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->name(), "gpt2");
  EXPECT_EQ((*t)->vocab_size(), 256u + kMerges.size() + 1);
  const BpeModel& m = (*t)->model();
  EXPECT_EQ((*t)->Encode(" the the"), (std::vector<uint32_t>{m.Find(" the"), m.Find(" the")}));
  // "aaaaa" is one piece: "aa"+"aa" merges first... after "a"+"a" twice (rank order).
  EXPECT_EQ((*t)->Encode("aaaaa"), (std::vector<uint32_t>{m.Find("aaaa"), m.Find("a")}));
  EXPECT_EQ((*t)->Encode("!"), std::vector<uint32_t>{'!'});  // these files number bytes as bytes
  std::string text = "the theme \xFF\xC3 aaa\r\n";
  EXPECT_EQ(*(*t)->Decode((*t)->Encode(text)), text);
  EXPECT_EQ(*(*t)->Decode(std::vector<uint32_t>{(*t)->vocab_size() - 1}), "<|endoftext|>");
  EXPECT_EQ((*t)->Decode(std::vector<uint32_t>{(*t)->vocab_size()}).status().message(),
            "token id 262 at position 0 is outside the gpt2 vocabulary (262)");
}

std::string ParseError(const std::string& encoder, const std::string& merges) {
  auto t = Gpt2Tokenizer::Parse(encoder, merges, "E.json", "M.bpe");
  return t.ok() ? "ok" : std::string(t.status().message());
}

TEST(Gpt2Tokenizer, MalformedFilesAreNamed) {
  Files f = MakeFiles(kMerges);
  EXPECT_EQ(ParseError("[1, 2]", f.merges),
            "E.json: not a JSON object of token spellings to ids (GPT-2's encoder.json)");
  EXPECT_EQ(ParseError("{\"a\": 1", f.merges),
            "E.json: not a JSON object of token spellings to ids (GPT-2's encoder.json)");
  EXPECT_EQ(ParseError("{\"a\": 0, \"b\": 5}", f.merges),
            "E.json: the id of 'b' is 5; ids must be 0..1");
  EXPECT_EQ(ParseError("{\"a\": 0, \"b\": \"x\"}", f.merges),
            "E.json: the id of 'b' is \"x\"; ids must be 0..1");
  EXPECT_EQ(ParseError("{\"a\": 0, \"b\": 0}", f.merges), "E.json: two tokens have the id 0");
  EXPECT_EQ(ParseError("{\"a\": 0, \"b\": 1}", f.merges),
            "M.bpe with E.json: no token for the byte 0: a byte-level vocabulary needs all 256");
  EXPECT_EQ(ParseError(f.encoder, "#version: 0.2\n"),
            "M.bpe: no merges (GPT-2's vocab.bpe has 50,000)");
  EXPECT_EQ(ParseError(f.encoder, "#version: 0.2\nĠt\n"),
            "M.bpe: line 2 is 'Ġt', not a merge ('left right', GPT-2's vocab.bpe)");
  EXPECT_EQ(ParseError(f.encoder, "#version: 0.2\nĠ t\nx y\n"),
            "M.bpe with E.json: merge 2 ('x' + 'y'): the merged token is not in the vocabulary");
  EXPECT_NE(ParseError(f.encoder, "#version: 0.2\n\xE6\x97\xA5 t\n").find("M.bpe: line 2: "),
            std::string::npos);
}

TEST(Gpt2Tokenizer, MissingFileIsNamed) {
  auto t = Gpt2Tokenizer::Load("/nonexistent/encoder.json", "/nonexistent/vocab.bpe");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(t.status().message(),
            "/nonexistent/encoder.json: cannot read it (No such file or directory)");
}

}  // namespace
}  // namespace braid::text
