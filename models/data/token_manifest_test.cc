#include "models/data/token_manifest.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/data/sha256.h"

namespace braid::data {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string TempDir(const std::string& name) {
  const char* t = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(t != nullptr ? t : "/tmp") + "/" + name;
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

void Write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

std::string U16(const std::vector<uint32_t>& ids) {
  std::string out;
  for (uint32_t id : ids) {
    out.push_back(char(id & 0xff));
    out.push_back(char(id >> 8));
  }
  return out;
}

// A data set of two train shards and one validation shard, written as prepare_data would.
struct Fixture {
  std::string dir;
  TokenManifest m;
};

Fixture MakeDataset(const std::string& name) {
  Fixture f;
  f.dir = TempDir(name);
  const std::vector<std::vector<uint32_t>> ids = {{1, 2, 3, 9}, {4, 5}, {7, 8, 9}};
  const char* files[] = {"train-00000.bin", "train-00001.bin", "validation-00000.bin"};
  f.m.tokenizer = "test";
  f.m.vocab_size = 10;
  f.m.eot_id = 9;
  f.m.dtype = TokenType::kU16;
  f.m.seed = 7;
  f.m.val_fraction = 0.25;
  f.m.train_documents = 2;
  f.m.validation_documents = 1;
  for (int i = 0; i < 3; ++i) {
    const std::string bytes = U16(ids[i]);
    Write(f.dir + "/" + files[i], bytes);
    TokenShard s;
    s.file = files[i];
    s.split = i < 2 ? Split::kTrain : Split::kValidation;
    s.tokens = int64_t(ids[i].size());
    s.max_token_id = 0;
    for (uint32_t id : ids[i]) s.max_token_id = std::max(s.max_token_id, id);
    s.sha256 = Sha256Hex(bytes.data(), bytes.size());
    f.m.shards.push_back(s);
  }
  Write(f.dir + "/manifest.json", TokenManifestToJson(f.m));
  return f;
}

TEST(TokenManifest, WritesAndReadsBack) {
  Fixture f = MakeDataset("roundtrip");
  const std::string text = TokenManifestToJson(f.m);
  absl::StatusOr<TokenManifest> back = ParseTokenManifest(text, "manifest.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == f.m);
  EXPECT_EQ(TokenManifestToJson(*back), text);
  EXPECT_EQ(back->Tokens(Split::kTrain), 6);
  EXPECT_EQ(back->Tokens(Split::kValidation), 3);
  // No end-of-text token: the key is left out, and reads back as none.
  f.m.eot_id.reset();
  back = ParseTokenManifest(TokenManifestToJson(f.m), "manifest.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_FALSE(back->eot_id.has_value());
}

TEST(TokenManifest, RefusalsNameTheFieldAndWhatToDo) {
  Fixture f = MakeDataset("refusals");
  const std::string good = TokenManifestToJson(f.m);
  auto refused = [&](const std::string& from, const std::string& to) {
    std::string text = absl::StrReplaceAll(good, {{from, to}});
    EXPECT_NE(text, good) << "the test's edit of " << from << " did nothing";
    absl::StatusOr<TokenManifest> m = ParseTokenManifest(text, "data/x/manifest.json");
    EXPECT_FALSE(m.ok()) << from << " -> " << to;
    return std::string(m.status().message());
  };
  EXPECT_THAT(refused("\"u16\"", "\"u8\""), AllOf(HasSubstr("data/x/manifest.json: dtype"),
                                                  HasSubstr("prepare the data again")));
  EXPECT_THAT(refused("\"vocab_size\": 10", "\"vocab_size\": 70000"), HasSubstr("cannot hold"));
  EXPECT_THAT(refused("\"eot_id\": 9", "\"eot_id\": 10"), HasSubstr("eot_id"));
  EXPECT_THAT(refused("\"max_token_id\":9", "\"max_token_id\":10"),
              HasSubstr("shards[0].max_token_id"));
  EXPECT_THAT(refused("train-00001.bin", "../train-00001.bin"), HasSubstr("shards[1].file"));
  EXPECT_THAT(refused("train-00001.bin", "train-00000.bin"), HasSubstr("a second time"));
  EXPECT_THAT(refused("\"split\":\"validation\"", "\"split\":\"test\""), HasSubstr("shards[2].split"));
  EXPECT_THAT(refused("\"validation\":1", "\"validation\":0"), HasSubstr("documents.validation"));
  EXPECT_THAT(refused("\"tokens\":4", "\"tokens\":0"), HasSubstr("shards[0].tokens"));
  EXPECT_THAT(refused("\"val_fraction\": 0.25", "\"val_fraction\": 1.5"), HasSubstr("val_fraction"));
  EXPECT_THAT(refused(f.m.shards[0].sha256, "abc"), HasSubstr("shards[0].sha256"));
  EXPECT_THAT(refused("braid-tokens-1", "braid-tokens-0"), HasSubstr("has format \"braid-tokens-0\""));
  EXPECT_THAT(refused("\"format\"", "\"fmt\""), HasSubstr("not a Braid token manifest"));
  EXPECT_THAT(refused("}\n", ""), AllOf(HasSubstr("is not JSON"), HasSubstr("cut short")));
}

TEST(TokenDataset, OpensAFolderOrItsManifestAndReadsEachSplit) {
  Fixture f = MakeDataset("open");
  for (const std::string& path : {f.dir, f.dir + "/manifest.json"}) {
    EXPECT_TRUE(IsTokenDatasetPath(path)) << path;
    absl::StatusOr<TokenDataset> d = TokenDataset::Open(path);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_TRUE(d->manifest() == f.m);
    auto train = d->Tokens(Split::kTrain);
    ASSERT_TRUE(train.ok()) << train.status();
    std::vector<int32_t> got((*train)->size());
    (*train)->Copy(0, (*train)->size(), got.data());
    EXPECT_EQ(got, (std::vector<int32_t>{1, 2, 3, 9, 4, 5}));  // across the shard boundary
    auto val = d->Tokens(Split::kValidation);
    ASSERT_TRUE(val.ok()) << val.status();
    EXPECT_EQ((*val)->size(), 3);
    EXPECT_EQ((**val)[0], 7);
  }
  EXPECT_FALSE(IsTokenDatasetPath(f.dir + "/train-00000.bin"));
}

TEST(TokenDataset, RefusesMissingTruncatedAndForeignShards) {
  Fixture f = MakeDataset("damaged");
  const std::string shard = f.dir + "/train-00001.bin";
  const std::string bytes = U16({4, 5});
  auto message = [&] {
    absl::StatusOr<TokenDataset> d = TokenDataset::Open(f.dir);
    EXPECT_FALSE(d.ok());
    return std::string(d.status().message());
  };
  std::remove(shard.c_str());
  EXPECT_THAT(message(), AllOf(HasSubstr("train-00001.bin"), HasSubstr("is missing"),
                               HasSubstr("prepare the data again")));
  Write(shard, bytes.substr(0, 3));
  EXPECT_THAT(message(), AllOf(HasSubstr("train-00001.bin' has 3 bytes"), HasSubstr("truncated")));
  Write(shard, U16({5, 4}));  // same size, other bytes
  EXPECT_THAT(message(), AllOf(HasSubstr("train-00001.bin"), HasSubstr("SHA-256")));
  Write(shard, bytes);
  EXPECT_TRUE(TokenDataset::Open(f.dir).ok());

  const std::string empty = TempDir("no_manifest");
  absl::StatusOr<TokenDataset> none = TokenDataset::Open(empty);
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(std::string(none.status().message()),
              AllOf(HasSubstr("no_manifest/manifest.json"), HasSubstr("prepare_data")));
}

TEST(TokenDataset, VocabularyCheckNamesShardAndOffset) {
  Fixture f = MakeDataset("vocab");
  absl::StatusOr<TokenDataset> d = TokenDataset::Open(f.dir);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(d->CheckVocab(10).ok());
  EXPECT_TRUE(d->CheckVocab(50257).ok());
  // Ids 9 (train-00000 offset 3) and 8, 9 (validation) do not fit a vocabulary of 8.
  absl::Status s = d->CheckVocab(8);
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("train-00000.bin' holds token id 9 at offset 3"),
                    HasSubstr("vocabulary of 8"), HasSubstr("model.vocab_size to at least 10")));
  // The same from the manifest alone, as a run's start does it.
  EXPECT_EQ(CheckTokenDatasetVocab(f.dir, 8), s);
  EXPECT_TRUE(CheckTokenDatasetVocab(f.dir, 10).ok());
  EXPECT_THAT(std::string(CheckTokenDatasetVocab(f.dir + "/nothing", 10).message()),
              HasSubstr("cannot read the token manifest"));
  // Every id fits 9.. but the tokenizer's vocabulary of 10 does not.
  TokenManifest m = f.m;
  m.shards.pop_back();
  m.validation_documents = 0;
  m.shards[0].max_token_id = 3;
  Write(f.dir + "/train-00000.bin", U16({1, 2, 3, 3}));
  m.shards[0].sha256 = Sha256Hex(U16({1, 2, 3, 3}).data(), 8);
  Write(f.dir + "/manifest.json", TokenManifestToJson(m));
  d = TokenDataset::Open(f.dir);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_THAT(std::string(d->CheckVocab(9).message()),
              AllOf(HasSubstr("10 ids are more than the model's vocabulary of 9")));
  absl::StatusOr<std::shared_ptr<const TokenFile>> val = d->Tokens(Split::kValidation);
  ASSERT_FALSE(val.ok());
  EXPECT_THAT(std::string(val.status().message()), HasSubstr("--val_fraction"));
}

}  // namespace
}  // namespace braid::data
