#include "tools/prepare_data/prepare.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/data/token_manifest.h"
#include "models/text/byte_tokenizer.h"

namespace braid::tools {
namespace {

namespace fs = std::filesystem;
using data::Split;
using data::TokenDataset;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::string Temp(const std::string& name) {
  const char* t = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(t != nullptr ? t : "/tmp") + "/" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void Write(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Every file of a folder, name -> bytes.
std::map<std::string, std::string> Snapshot(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out[e.path().filename().string()] = Read(e.path());
  return out;
}

std::vector<int32_t> All(const TokenDataset& d, Split s) {
  auto t = d.Tokens(s);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return {};
  std::vector<int32_t> out(size_t((*t)->size()));
  (*t)->Copy(0, (*t)->size(), out.data());
  return out;
}

// Ten documents "doc<i> ..." in a folder; with the byte tokenizer and end-of-text 0 (a byte the
// texts never hold), each split's stream decodes back to its documents.
struct Corpus {
  std::string dir;
  std::vector<std::string> texts;
};
Corpus TenDocuments(const std::string& name) {
  Corpus c;
  c.dir = Temp(name) + "/in";
  for (int i = 0; i < 10; ++i) {
    c.texts.push_back(absl::StrCat("doc", i, std::string(size_t(5 + 7 * i), char('a' + i))));
    Write(absl::StrFormat("%s/%02d.txt", c.dir, i), c.texts.back());
  }
  Write(c.dir + "/notes.bin", "not text: skipped");
  Write(c.dir + "/.hidden/x.txt", "hidden: skipped");
  return c;
}

PrepareOptions Options(const Corpus& c, const std::string& out) {
  PrepareOptions o;
  o.inputs = {c.dir};
  o.out_dir = out;
  o.val_fraction = 0.3;
  o.seed = 7;
  o.threads = 3;
  o.shard_tokens = 40;
  o.eot_id = 0;
  return o;
}

// The documents of a split, cut at the end-of-text ids.
std::vector<std::string> Documents(const std::vector<int32_t>& ids) {
  std::vector<std::string> docs(1);
  for (int32_t id : ids) {
    if (id == 0) {
      docs.emplace_back();
    } else {
      docs.back().push_back(char(id));
    }
  }
  EXPECT_TRUE(docs.back().empty()) << "the stream does not end with an end-of-text id";
  docs.pop_back();
  return docs;
}

TEST(PrepareData, SplitsWholeDocumentsInInputOrderAcrossShards) {
  Corpus c = TenDocuments("split");
  const std::string out = Temp("split_out");
  text::ByteTokenizer bytes;
  absl::StatusOr<data::TokenManifest> m = PrepareData(bytes, Options(c, out));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->train_documents, 7);
  EXPECT_EQ(m->validation_documents, 3);
  EXPECT_EQ(m->dtype, data::TokenType::kU16);
  EXPECT_EQ(m->tokenizer, "byte");
  EXPECT_EQ(m->vocab_size, 256u);
  EXPECT_GT(m->Shards(Split::kTrain).size(), 2u) << "40-token shards: documents cross them";

  absl::StatusOr<TokenDataset> d = TokenDataset::Open(out);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(d->manifest() == *m);
  const std::vector<std::string> train = Documents(All(*d, Split::kTrain));
  const std::vector<std::string> val = Documents(All(*d, Split::kValidation));
  ASSERT_EQ(train.size(), 7u);
  ASSERT_EQ(val.size(), 3u);
  // Each document exactly once, whole, and each split in input order.
  std::vector<std::string> merged;
  size_t t = 0, v = 0;
  for (const std::string& text : c.texts) {
    if (t < train.size() && train[t] == text) {
      ++t;
    } else if (v < val.size() && val[v] == text) {
      ++v;
    } else {
      ADD_FAILURE() << "document " << text << " is missing or out of order";
    }
  }
  EXPECT_EQ(t + v, 10u);
  // Another seed holds out other documents.
  PrepareOptions o = Options(c, Temp("split2") + "/out");
  o.seed = 8;
  absl::StatusOr<data::TokenManifest> m2 = PrepareData(bytes, o);
  ASSERT_TRUE(m2.ok()) << m2.status();
  absl::StatusOr<TokenDataset> d2 = TokenDataset::Open(o.out_dir);
  ASSERT_TRUE(d2.ok());
  EXPECT_NE(Documents(All(*d2, Split::kValidation)), val);
}

// The bytes depend on the inputs and options only: not on the thread count, nor on whether the
// folder held an earlier run.
TEST(PrepareData, ReRunsAreByteIdentical) {
  Corpus c = TenDocuments("rerun");
  text::ByteTokenizer bytes;
  PrepareOptions one = Options(c, Temp("rerun_a"));
  one.threads = 1;
  ASSERT_TRUE(PrepareData(bytes, one).ok());
  const auto first = Snapshot(one.out_dir);
  EXPECT_TRUE(first.count("manifest.json"));
  PrepareOptions many = one;
  many.threads = 4;
  ASSERT_TRUE(PrepareData(bytes, many).ok());  // over the first run
  EXPECT_EQ(Snapshot(many.out_dir), first);
  many.out_dir = Temp("rerun_b");
  ASSERT_TRUE(PrepareData(bytes, many).ok());
  EXPECT_EQ(Snapshot(many.out_dir), first);

  // A smaller run over a larger one leaves none of the larger one's shards.
  PrepareOptions big = one;
  big.shard_tokens = 10;
  ASSERT_TRUE(PrepareData(bytes, big).ok());
  ASSERT_TRUE(PrepareData(bytes, one).ok());
  EXPECT_EQ(Snapshot(one.out_dir), first);
}

// A run stopped part-way (as if killed) leaves the folder's earlier data set readable and
// unchanged, and a fresh folder without a manifest, so training accepts nothing half-written.
TEST(PrepareData, AnInterruptedRunLeavesNothingTrainingWouldAccept) {
  Corpus c = TenDocuments("crash");
  text::ByteTokenizer bytes;
  PrepareOptions o = Options(c, Temp("crash_out"));
  ASSERT_TRUE(PrepareData(bytes, o).ok());
  const auto before = Snapshot(o.out_dir);

  PrepareOptions other = o;
  other.seed = 99;  // another data set
  for (int after : {0, 1, 3}) {
    other.crash_after_shards = after;
    absl::StatusOr<data::TokenManifest> m = PrepareData(bytes, other);
    ASSERT_FALSE(m.ok());
    EXPECT_TRUE(absl::IsAborted(m.status())) << m.status();
    auto now = Snapshot(o.out_dir);
    for (const auto& [name, content] : before) EXPECT_EQ(now[name], content) << name;
    absl::StatusOr<TokenDataset> d = TokenDataset::Open(o.out_dir);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_TRUE(d->manifest() == *data::ParseTokenManifest(before.at("manifest.json"), "m"));
  }
  const std::string fresh = Temp("crash_fresh");
  other.out_dir = fresh;
  other.crash_after_shards = 2;
  ASSERT_FALSE(PrepareData(bytes, other).ok());
  EXPECT_FALSE(fs::exists(fresh + "/manifest.json"));
  EXPECT_FALSE(TokenDataset::Open(fresh).ok());
  // The next complete run clears the leftovers.
  other.crash_after_shards = -1;
  ASSERT_TRUE(PrepareData(bytes, other).ok());
  for (const auto& [name, content] : Snapshot(fresh)) {
    EXPECT_EQ(name.find(".partial"), std::string::npos) << name;
  }
  EXPECT_TRUE(TokenDataset::Open(fresh).ok());
}

TEST(PrepareData, JsonLinesTakeTheNamedField) {
  const std::string dir = Temp("jsonl");
  Write(dir + "/a.jsonl",
        "{\"text\": \"first\", \"id\": 1}\n\n{\"id\": 2, \"text\": \"second \\u00e9\"}\n"
        "{\"text\": \"\"}\n{\"text\": \"third\"}");
  PrepareOptions o;
  o.inputs = {dir + "/a.jsonl"};
  o.out_dir = dir + "/out";
  o.val_fraction = 0;
  o.eot_id = 0;
  text::ByteTokenizer bytes;
  absl::StatusOr<data::TokenManifest> m = PrepareData(bytes, o);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->train_documents, 3);  // the empty text is no document
  absl::StatusOr<TokenDataset> d = TokenDataset::Open(o.out_dir);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(Documents(All(*d, Split::kTrain)),
            (std::vector<std::string>{"first", "second \xc3\xa9", "third"}));
  EXPECT_FALSE(d->Tokens(Split::kValidation).ok());
}

// A vocabulary past 65,536 ids: each byte b is id 65536 + b.
class WideTokenizer : public text::Tokenizer {
 public:
  std::string name() const override { return "wide"; }
  uint32_t vocab_size() const override { return 70000; }
  using Tokenizer::Encode;
  void Encode(absl::string_view text, std::vector<uint32_t>* ids) const override {
    for (unsigned char c : text) ids->push_back(65536 + c);
  }
  absl::StatusOr<std::string> Decode(absl::Span<const uint32_t> ids) const override {
    return absl::UnimplementedError("not needed");
  }
};

TEST(PrepareData, VocabulariesPast65536IdsAreWrittenAsU32) {
  Corpus c = TenDocuments("wide");
  PrepareOptions o = Options(c, Temp("wide_out"));
  o.eot_id = 69999;
  WideTokenizer wide;
  absl::StatusOr<data::TokenManifest> m = PrepareData(wide, o);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->dtype, data::TokenType::kU32);
  absl::StatusOr<TokenDataset> d = TokenDataset::Open(o.out_dir);
  ASSERT_TRUE(d.ok()) << d.status();
  std::vector<int32_t> ids = All(*d, Split::kTrain);
  std::vector<int32_t> val = All(*d, Split::kValidation);
  ids.insert(ids.end(), val.begin(), val.end());
  int64_t bytes = 0;
  for (const std::string& t : c.texts) bytes += int64_t(t.size());
  EXPECT_EQ(int64_t(ids.size()), bytes + 10);  // every byte and 10 end-of-text ids
  for (int32_t id : ids) {
    ASSERT_TRUE(id == 69999 || (id >= 65536 + 'a' && id <= 65536 + 'z') ||
                (id >= 65536 + '0' && id <= 65536 + '9'))
        << id;
  }
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 69999), 10);
  EXPECT_TRUE(d->CheckVocab(70000).ok());
  EXPECT_THAT(std::string(d->CheckVocab(65536).message()), HasSubstr("beyond the model's vocabulary of 65536"));
}

std::string Refusal(const PrepareOptions& o) {
  text::ByteTokenizer bytes;
  absl::StatusOr<data::TokenManifest> m = PrepareData(bytes, o);
  EXPECT_FALSE(m.ok());
  const std::string message(m.status().message());
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  return message;
}

TEST(PrepareData, BadInputIsOneLineNamingTheFileAndLeavesTheOutputAlone) {
  const std::string dir = Temp("bad");
  PrepareOptions o;
  o.out_dir = dir + "/out";
  o.val_fraction = 0;
  // A data set already there must survive every refusal below.
  Write(dir + "/good.txt", "good text");
  o.inputs = {dir + "/good.txt"};
  text::ByteTokenizer bytes;
  ASSERT_TRUE(PrepareData(bytes, o).ok());
  const auto before = Snapshot(o.out_dir);

  Write(dir + "/empty.txt", "");
  o.inputs = {dir + "/good.txt", dir + "/empty.txt"};
  EXPECT_THAT(Refusal(o), AllOf(HasSubstr("empty.txt is empty")));
  fs::create_directories(dir + "/nothing");
  Write(dir + "/nothing/data.bin", "x");
  o.inputs = {dir + "/nothing"};
  EXPECT_THAT(Refusal(o), AllOf(HasSubstr("folder " + dir + "/nothing holds no text")));
  o.inputs = {dir + "/missing.txt"};
  EXPECT_THAT(Refusal(o), HasSubstr("missing.txt: no such file or folder"));
  Write(dir + "/lines.jsonl", "{\"text\": \"a\"}\n{\"body\": \"b\", \"id\": 3}\n");
  o.inputs = {dir + "/lines.jsonl"};
  EXPECT_THAT(Refusal(o), AllOf(HasSubstr("lines.jsonl:2: no string field \"text\" (its fields: body, id)"),
                                HasSubstr("--jsonl_field")));
  Write(dir + "/broken.jsonl", "{\"text\": \"a\"}\n{\"text\": \"b\n");
  o.inputs = {dir + "/broken.jsonl"};
  EXPECT_THAT(Refusal(o), HasSubstr("broken.jsonl:2: not JSON"));
  o.inputs = {dir + "/good.txt"};
  o.val_fraction = 0.1;
  EXPECT_THAT(Refusal(o), AllOf(HasSubstr("one document (" + dir + "/good.txt)"),
                                HasSubstr("--val_fraction=0")));
  o.val_fraction = 1;
  EXPECT_THAT(Refusal(o), HasSubstr("--val_fraction=1"));
  o.val_fraction = 0;
  o.eot_id = 256;
  EXPECT_THAT(Refusal(o), HasSubstr("--eot_id=256 is outside the byte vocabulary"));
  EXPECT_EQ(Snapshot(o.out_dir), before);
}

}  // namespace
}  // namespace braid::tools
