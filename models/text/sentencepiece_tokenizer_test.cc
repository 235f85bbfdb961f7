// A small SentencePiece model trained here with spm_train (byte fallback, identity
// normalization), then Braid's ids against spm_encode's on the same lines (the same library
// underneath: this checks the wiring, not SentencePiece), round trips, and the errors of missing
// and malformed model files.
#include "models/text/sentencepiece_tokenizer.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/stubs/common.h"
#include "gtest/gtest.h"

namespace braid::text {
namespace {

const char* const kLines[] = {
    "Call me Ishmael. Some years ago, never mind how long precisely, having little money,",
    "I thought I would sail about a little and see the watery part of the world.",
    "It is a way I have of driving off the spleen and regulating the circulation.",
    "Whenever I find myself growing grim about the mouth; whenever it is a damp November,",
    "then, I account it high time to get to sea as soon as I can. This is my substitute.",
    "There now is your insular city of the Manhattoes, belted round by wharves.",
    "Très élevé: naïve café, straße, 日本語のテキスト, Привет мир, emoji 👍🏽 and 3.14159.",
};

std::string Tmp() { return std::getenv("TEST_TMPDIR"); }

std::string Shell(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  EXPECT_NE(p, nullptr) << cmd;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  EXPECT_EQ(pclose(p), 0) << cmd;
  return out;
}

class SentencePieceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // This process runs Debian's libprotobuf, as every Braid program with //core does: the
    // SentencePiece library's own protobuf runtime must keep to itself (sentencepiece_bridge.h).
    GOOGLE_PROTOBUF_VERIFY_VERSION;
    std::ofstream text(Tmp() + "/train.txt");
    for (int r = 0; r < 20; ++r) {
      for (const char* line : kLines) text << line << "\n";
    }
    text.close();
    Shell(absl::StrCat("spm_train --input=", Tmp(), "/train.txt --model_prefix=", Tmp(),
                     "/toy --vocab_size=400 --hard_vocab_limit=false --model_type=bpe "
                     "--byte_fallback=true --character_coverage=0.98 --normalization_rule_name=identity "
                     "--remove_extra_whitespaces=false --minloglevel=2 2>/dev/null"));
  }
  static std::string ModelPath() { return Tmp() + "/toy.model"; }
};

TEST_F(SentencePieceTest, IdsEqualSpmEncode) {
  auto t = SentencePieceTokenizer::Load(ModelPath());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->name(), "sentencepiece:toy.model");
  // spm_train writes the vocabulary beside the model, one piece a line.
  std::ifstream vocab(Tmp() + "/toy.vocab");
  uint32_t pieces = 0;
  for (std::string line; std::getline(vocab, line);) ++pieces;
  EXPECT_GT(pieces, 259u);  // 256 byte pieces, <unk>, <s>, </s>, and merges
  EXPECT_EQ((*t)->vocab_size(), pieces);
  EXPECT_EQ((*t)->eos_id(), std::optional<uint32_t>(2));  // spm_train's default </s>
  std::ofstream(Tmp() + "/lines.txt") << absl::StrJoin(kLines, "\n") << "\n";
  std::string ref = Shell(absl::StrCat("spm_encode --model=", ModelPath(),
                                     " --output_format=id < ", Tmp(), "/lines.txt"));
  std::vector<std::string> ref_lines = absl::StrSplit(ref, '\n', absl::SkipEmpty());
  ASSERT_EQ(ref_lines.size(), std::size(kLines));
  size_t total = 0;
  for (size_t i = 0; i < ref_lines.size(); ++i) {
    std::vector<uint32_t> ids = (*t)->Encode(kLines[i]);
    EXPECT_EQ(absl::StrJoin(ids, " "), ref_lines[i]) << kLines[i];
    total += ids.size();
  }
  EXPECT_GT(total, 100u);
}

TEST_F(SentencePieceTest, RoundTripsWithByteFallback) {
  auto t = SentencePieceTokenizer::Load(ModelPath());
  ASSERT_TRUE(t.ok()) << t.status();
  for (const char* line : kLines) EXPECT_EQ(*(*t)->Decode((*t)->Encode(line)), line);
  // Characters the model never saw come back through byte pieces.
  const std::string unseen = "Ωμέγα 한국어 🧑‍💻 ½";
  EXPECT_EQ(*(*t)->Decode((*t)->Encode(unseen)), unseen);
  const uint32_t n = (*t)->vocab_size();
  EXPECT_EQ((*t)->Decode(std::vector<uint32_t>{5, n}).status().message(),
            absl::StrCat("token id ", n, " at position 1 is outside the sentencepiece:toy.model "
                         "vocabulary (", n, ")"));
}

TEST_F(SentencePieceTest, BadModelFilesAreNamed) {
  auto missing = SentencePieceTokenizer::Load(Tmp() + "/none.model");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(),
            Tmp() + "/none.model: cannot read it (No such file or directory)");
  std::ofstream(Tmp() + "/garbage.model") << "this is not a protobuf \xff\xff\xff";
  auto garbage = SentencePieceTokenizer::Load(Tmp() + "/garbage.model");
  ASSERT_FALSE(garbage.ok());
  EXPECT_EQ(garbage.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(garbage.status().message().rfind(Tmp() + "/garbage.model: not a SentencePiece model (",
                                             0),
            0u)
      << garbage.status();
}

}  // namespace
}  // namespace braid::text
