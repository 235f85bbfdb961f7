#include "models/text/gpt2_pretokenizer.h"

#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "gtest/gtest.h"

namespace braid::text {
namespace {

using V = std::vector<std::string>;

// Expected pieces worked out by hand from GPT-2's expression (gpt2_pretokenizer.h); the
// white-space cases were also checked against tiktoken's gpt2 ids (the comments give them).
TEST(Gpt2Pieces, WordsNumbersPunctuation) {
  EXPECT_EQ(Gpt2Pieces("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(Gpt2Pieces("123abc 45 6"), (V{"123", "abc", " 45", " 6"}));
  EXPECT_EQ(Gpt2Pieces("x!!?  ...y"), (V{"x", "!!?", " ", " ...", "y"}));
  EXPECT_EQ(Gpt2Pieces("(a+b)"), (V{"(", "a", "+", "b", ")"}));
}

TEST(Gpt2Pieces, ContractionsAreLowerCaseOnly) {
  EXPECT_EQ(Gpt2Pieces("don't we'll I'd you're they've I'm it's"),
            (V{"don", "'t", " we", "'ll", " I", "'d", " you", "'re", " they", "'ve", " I", "'m",
               " it", "'s"}));
  // tiktoken: "He'S" -> [1544, 6, 50], three pieces.
  EXPECT_EQ(Gpt2Pieces("He'S DON'T"), (V{"He", "'", "S", " DON", "'", "T"}));
  // The apostrophe after punctuation belongs to the punctuation run; "'sa" is still "'s".
  EXPECT_EQ(Gpt2Pieces("!'s 'sa ''s"), (V{"!'", "s", " '", "sa", " ''", "s"}));
}

TEST(Gpt2Pieces, WhiteSpaceRuns) {
  EXPECT_EQ(Gpt2Pieces("  x"), (V{" ", " x"}));
  EXPECT_EQ(Gpt2Pieces("a  \n\nb"), (V{"a", "  \n", "\n", "b"}));
  EXPECT_EQ(Gpt2Pieces("x   "), (V{"x", "   "}));
  EXPECT_EQ(Gpt2Pieces("a\r\n\r\n  b"), (V{"a", "\r\n\r\n ", " b"}));
  EXPECT_EQ(Gpt2Pieces("\tx"), (V{"\t", "x"}));
  EXPECT_EQ(Gpt2Pieces(" "), (V{" "}));
  EXPECT_EQ(Gpt2Pieces(" \n"), (V{" \n"}));
}

TEST(Gpt2Pieces, UnicodeClasses) {
  // Combining marks are not letters: "e" + U+0301.
  EXPECT_EQ(Gpt2Pieces("e\xCC\x81t\xC3\xA9"), (V{"e", "\xCC\x81", "t\xC3\xA9"}));
  // CJK and Cyrillic letters, Arabic-Indic digits (Nd), superscript two (No).
  EXPECT_EQ(Gpt2Pieces("\xE6\x97\xA5\xE6\x9C\xAC \xD0\x9C\xD0\xB8\xD1\x80 "
                       "\xD9\xA1\xD9\xA2\xC2\xB2"),
            (V{"\xE6\x97\xA5\xE6\x9C\xAC", " \xD0\x9C\xD0\xB8\xD1\x80", " \xD9\xA1\xD9\xA2\xC2\xB2"}));
  // Emoji and the zero-width joiner are "other": one run.
  EXPECT_EQ(Gpt2Pieces(" \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9!"),
            (V{" \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9!"}));
  // U+0085 is White_Space (tiktoken: " \u0085x" -> [220, 126, 227, 87]).
  EXPECT_EQ(Gpt2Pieces(" \xC2\x85x"), (V{" ", "\xC2\x85", "x"}));
  // U+FEFF is not (tiktoken: " \ufeffx" -> [27332, 119, 123, 87]); nor is U+200B.
  EXPECT_EQ(Gpt2Pieces(" \xEF\xBB\xBFx"), (V{" \xEF\xBB\xBF", "x"}));
  // U+00A0 and U+3000 are.
  EXPECT_EQ(Gpt2Pieces("a\xC2\xA0\xE3\x80\x80 b"), (V{"a", "\xC2\xA0\xE3\x80\x80", " b"}));
}

TEST(Gpt2Pieces, InvalidUtf8IsOtherBytes) {
  EXPECT_EQ(Gpt2Pieces("\xFF\xFE a"), (V{"\xFF\xFE", " a"}));
  EXPECT_EQ(Gpt2Pieces("ab\xC3"), (V{"ab", "\xC3"}));                  // cut sequence
  EXPECT_EQ(Gpt2Pieces("a\xC0\xAF" "b"), (V{"a", "\xC0\xAF", "b"}));   // overlong '/'
  EXPECT_EQ(Gpt2Pieces("a\xED\xA0\x80" "b"), (V{"a", "\xED\xA0\x80", "b"}));  // surrogate
  EXPECT_EQ(Gpt2Pieces("\x80x"), (V{"\x80", "x"}));                     // stray continuation
  EXPECT_EQ(Gpt2Pieces(" \xF5\x80\x80\x80"), (V{" \xF5\x80\x80\x80"}));  // beyond U+10FFFF
}

TEST(Gpt2Pieces, PiecesConcatenateToAnyInput) {
  std::mt19937 rng(7);
  const std::string alphabet[] = {"a", "Z", "7", " ", "\n", "\r", "\t", "'", "s", "!",
                                  "\xC3\xA9", "\xE2\x80\x8D", "\xC2\x85", "\xFF", "\x80"};
  for (int round = 0; round < 2000; ++round) {
    std::string text;
    int n = rng() % 40;
    for (int i = 0; i < n; ++i) {
      if (rng() % 8 == 0) {
        text.push_back(static_cast<char>(rng() % 256));
      } else {
        text += alphabet[rng() % (sizeof(alphabet) / sizeof(alphabet[0]))];
      }
    }
    V pieces = Gpt2Pieces(text);
    EXPECT_EQ(absl::StrJoin(pieces, ""), text);
    for (const std::string& p : pieces) EXPECT_FALSE(p.empty());
  }
}

}  // namespace
}  // namespace braid::text
