#include "models/data/token_data.h"

#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "models/data/find_data.h"

namespace braid::data {
namespace {

std::string TempPath(const std::string& name) {
  const char* t = std::getenv("TEST_TMPDIR");
  return std::string(t != nullptr ? t : "/tmp") + "/" + name;
}

void WriteBytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

// Tokens equal to their position, so a window's first token tells where it starts.
std::shared_ptr<const TokenFile> Counting(int n) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = i;
  return std::make_shared<const TokenFile>(TokenFile::FromTokens(t, TokenType::kU16));
}

TEST(TokenFile, ReadsU8AndLittleEndianU16) {
  const std::string path = TempPath("tokens.bin");
  WriteBytes(path, {0x01, 0x02, 0xff, 0x00});
  auto u8 = TokenFile::Open(path, TokenType::kU8);
  ASSERT_TRUE(u8.ok()) << u8.status();
  ASSERT_EQ(u8->size(), 4);
  EXPECT_EQ((*u8)[0], 1);
  EXPECT_EQ((*u8)[2], 255);
  auto u16 = TokenFile::Open(path, TokenType::kU16);
  ASSERT_TRUE(u16.ok()) << u16.status();
  ASSERT_EQ(u16->size(), 2);
  EXPECT_EQ((*u16)[0], 0x0201);
  EXPECT_EQ((*u16)[1], 0x00ff);
  int32_t out[2];
  u16->Copy(0, 2, out);
  EXPECT_EQ(out[0], 0x0201);
  EXPECT_EQ(out[1], 0x00ff);

  // Moving keeps the mapping valid.
  TokenFile moved = std::move(*u8);
  EXPECT_EQ(moved.size(), 4);
  EXPECT_EQ(moved[1], 2);
}

TEST(TokenFile, ErrorsNameTheFile) {
  auto missing = TokenFile::Open(TempPath("no_such_tokens.bin"));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("no_such_tokens.bin"), absl::string_view::npos);

  const std::string odd = TempPath("odd.bin");
  WriteBytes(odd, {1, 2, 3});
  auto u16 = TokenFile::Open(odd, TokenType::kU16);
  ASSERT_FALSE(u16.ok());
  EXPECT_NE(u16.status().message().find("odd.bin"), absl::string_view::npos);
  EXPECT_NE(u16.status().message().find("u16"), absl::string_view::npos);

  const std::string empty = TempPath("empty.bin");
  WriteBytes(empty, {});
  EXPECT_FALSE(TokenFile::Open(empty).ok());
}

TEST(TokenFile, ReadsLittleEndianU32) {
  const std::string path = TempPath("tokens32.bin");
  WriteBytes(path, {0x51, 0xc4, 0x00, 0x00, 0xff, 0xff, 0x01, 0x00});
  auto u32 = TokenFile::Open(path, TokenType::kU32);
  ASSERT_TRUE(u32.ok()) << u32.status();
  ASSERT_EQ(u32->size(), 2);
  EXPECT_EQ((*u32)[0], 50257);
  EXPECT_EQ((*u32)[1], 0x1ffff);
  TokenFile mem = TokenFile::FromTokens({50257, 0x1ffff}, TokenType::kU32);
  EXPECT_EQ(mem[0], 50257);
  EXPECT_EQ(mem[1], 0x1ffff);
  WriteBytes(path, {1, 2, 3, 4, 5, 6});
  auto odd = TokenFile::Open(path, TokenType::kU32);
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.status().message().find("not a whole number of u32 tokens"), absl::string_view::npos)
      << odd.status();
}

// Shards read as one sequence: a copy that crosses from one file into the next reads both, and
// every position is located in its own file.
TEST(TokenFile, ConcatenatedFilesReadAsOneSequence) {
  const std::string a = TempPath("shard_a.bin"), b = TempPath("shard_b.bin"),
                    c = TempPath("shard_c.bin");
  WriteBytes(a, {0, 0, 1, 0, 2, 0});  // u16 0 1 2
  WriteBytes(b, {3, 0});              // 3
  WriteBytes(c, {4, 0, 5, 0});        // 4 5
  auto f = TokenFile::OpenConcatenated({a, b, c}, TokenType::kU16, "train split");
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->size(), 6);
  EXPECT_EQ(f->path(), "train split");
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ((*f)[i], i);
  for (int64_t begin = 0; begin < 6; ++begin) {
    for (int64_t n = 0; begin + n <= 6; ++n) {
      std::vector<int32_t> out(size_t(n) + 1, -1);
      f->Copy(begin, n, out.data());
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(out[size_t(i)], begin + i);
      EXPECT_EQ(out[size_t(n)], -1) << "wrote past the copy";
    }
  }
  EXPECT_EQ(f->Locate(2), std::make_pair(a, int64_t{2}));
  EXPECT_EQ(f->Locate(3), std::make_pair(b, int64_t{0}));
  EXPECT_EQ(f->Locate(5), std::make_pair(c, int64_t{1}));

  TokenFile moved = std::move(*f);
  EXPECT_EQ(moved[4], 4);

  // A damaged shard is named, not the sequence.
  WriteBytes(b, {3});
  auto bad = TokenFile::OpenConcatenated({a, b, c}, TokenType::kU16, "train split");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("shard_b.bin"), absl::string_view::npos) << bad.status();
}

// The samplers read shards as they read one file: the same batches from the shards of a
// sequence as from the whole sequence in one file.
TEST(TokenFile, SamplersReadShardsAsOneFile) {
  std::vector<uint8_t> all;
  std::vector<std::string> paths;
  for (int s = 0; s < 4; ++s) {
    std::vector<uint8_t> bytes;
    for (int i = 0; i < 97 + 31 * s; ++i) {  // uneven shard sizes
      const int v = (s * 1000 + i * 7) % 50000;
      bytes.push_back(uint8_t(v & 0xff));
      bytes.push_back(uint8_t(v >> 8));
    }
    paths.push_back(TempPath(absl::StrCat("sampled_", s, ".bin")));
    WriteBytes(paths.back(), bytes);
    all.insert(all.end(), bytes.begin(), bytes.end());
  }
  const std::string whole_path = TempPath("sampled_all.bin");
  WriteBytes(whole_path, all);
  auto shards = std::make_shared<const TokenFile>(
      *TokenFile::OpenConcatenated(paths, TokenType::kU16, "shards"));
  auto whole = std::make_shared<const TokenFile>(*TokenFile::Open(whole_path, TokenType::kU16));
  ASSERT_EQ(shards->size(), whole->size());
  auto a = RandomWindowSampler::Create(shards, 3, 40, 1234, 1);
  auto b = RandomWindowSampler::Create(whole, 3, 40, 1234, 1);
  ASSERT_TRUE(a.ok() && b.ok());
  auto c = SequentialLoader::Create(shards, 2, 16, 1, 2);
  auto d = SequentialLoader::Create(whole, 2, 16, 1, 2);
  ASSERT_TRUE(c.ok() && d.ok());
  for (int step = 0; step < 20; ++step) {
    Batch x = a->Next(), y = b->Next();
    EXPECT_EQ(x.inputs.ToVector<int32_t>(), y.inputs.ToVector<int32_t>());
    EXPECT_EQ(x.targets.ToVector<int32_t>(), y.targets.ToVector<int32_t>());
    Batch u = c->Next(), v = d->Next();
    EXPECT_EQ(u.inputs.ToVector<int32_t>(), v.inputs.ToVector<int32_t>());
    EXPECT_EQ(u.targets.ToVector<int32_t>(), v.targets.ToVector<int32_t>());
  }
}

TEST(RandomWindowSampler, WindowsFollowTheReferenceDefinition) {
  auto data = Counting(5000);
  const int64_t B = 4, T = 8;
  auto sampler = RandomWindowSampler::Create(data, B, T, /*base_seed=*/1234, /*rank=*/1);
  ASSERT_TRUE(sampler.ok()) << sampler.status();
  // SplitMix64(1234 + 1).Next() mod (5000 - 8), eight draws, from an independent Python
  // implementation; the second batch continues the same stream.
  const int64_t expected[2][4] = {{3586, 659, 2470, 689}, {135, 1733, 2809, 3599}};
  for (int step = 0; step < 2; ++step) {
    Batch batch = sampler->Next();
    ASSERT_EQ(batch.inputs.shape(), (Shape{B, T}));
    ASSERT_EQ(batch.targets.shape(), (Shape{B, T}));
    ASSERT_EQ(batch.inputs.dtype(), DType::kI32);
    ASSERT_EQ(batch.targets.dtype(), DType::kI32);
    const int32_t* x = batch.inputs.data<int32_t>();
    const int32_t* y = batch.targets.data<int32_t>();
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < T; ++t) {
        EXPECT_EQ(x[b * T + t], expected[step][b] + t) << "step " << step << " b " << b;
        EXPECT_EQ(y[b * T + t], expected[step][b] + t + 1) << "step " << step << " b " << b;
      }
    }
  }
  // Rank 0 draws from seed 1234: a different stream.
  auto rank0 = RandomWindowSampler::Create(data, B, T, 1234, 0);
  ASSERT_TRUE(rank0.ok());
  EXPECT_EQ(rank0->NextStarts(), (std::vector<int64_t>{2395, 2852, 4954, 1587}));
}

TEST(RandomWindowSampler, RestoredStateResumesStream) {
  auto data = Counting(300);
  auto a = RandomWindowSampler::Create(data, 3, 10, 5, 0);
  ASSERT_TRUE(a.ok());
  a->Next();
  auto b = RandomWindowSampler::Create(data, 3, 10, 99, 0);
  ASSERT_TRUE(b.ok());
  b->set_rng_state(a->rng_state());
  EXPECT_EQ(a->NextStarts(), b->NextStarts());
}

TEST(RandomWindowSampler, EveryStartIsReachableAndWindowsFit) {
  // N - T = 3 possible starts; the last window's target ends exactly at the last token.
  auto data = Counting(11);
  auto s = RandomWindowSampler::Create(data, 5, 8, 0, 0);
  ASSERT_TRUE(s.ok());
  std::set<int64_t> seen;
  for (int i = 0; i < 50; ++i) {
    Batch batch = s->Next();
    const int32_t* y = batch.targets.data<int32_t>();
    for (int b = 0; b < 5; ++b) {
      seen.insert(y[b * 8] - 1);
      EXPECT_LE(y[b * 8 + 7], 10);
    }
  }
  EXPECT_EQ(seen, (std::set<int64_t>{0, 1, 2}));
}

TEST(RandomWindowSampler, RejectsDataShorterThanAWindow) {
  auto s = RandomWindowSampler::Create(Counting(8), 1, 8, 0, 0);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("at least 9"), absl::string_view::npos) << s.status();
  EXPECT_FALSE(RandomWindowSampler::Create(Counting(100), 0, 8, 0, 0).ok());
}

TEST(RandomWindowSampler, ReferenceRunOnMobyDick) {
  auto path = FindDataFile(kMobyDickText);
  ASSERT_TRUE(path.ok()) << "Moby Dick not installed (run tools/setup.sh): " << path.status().message();
  auto file = TokenFile::Open(*path);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(file->size(), 1204997);
  auto data = std::make_shared<const TokenFile>(std::move(*file));
  auto s = RandomWindowSampler::Create(data, 16, 128, 1234, 0);
  ASSERT_TRUE(s.ok());
  Batch batch = s->Next();
  // Starts from the independent Python implementation, and the text at the first one.
  const int64_t starts[16] = {151852, 720308, 301984, 1141392, 1071645, 816146, 269845, 1198766,
                              833379, 658589, 627279, 1175582, 1054149, 452073, 153143, 754508};
  const int32_t* x = batch.inputs.data<int32_t>();
  const int32_t* y = batch.targets.data<int32_t>();
  for (int b = 0; b < 16; ++b) {
    EXPECT_EQ(x[b * 128], (*data)[starts[b]]) << b;
    EXPECT_EQ(y[b * 128 + 127], (*data)[starts[b] + 128]) << b;
  }
  const std::string text = "e scowl, Captain Pel";
  for (size_t i = 0; i < text.size(); ++i) EXPECT_EQ(x[i], uint8_t(text[i])) << i;
}

// Start positions of the rows of the batches a rank reads in one pass.
std::vector<int32_t> FirstTokens(SequentialLoader& l, int batches, int64_t B, int64_t T) {
  std::vector<int32_t> starts;
  for (int i = 0; i < batches; ++i) {
    Batch batch = l.Next();
    const int32_t* x = batch.inputs.data<int32_t>();
    const int32_t* y = batch.targets.data<int32_t>();
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < T; ++t) {
        EXPECT_EQ(x[b * T + t], x[b * T] + t);
        EXPECT_EQ(y[b * T + t], x[b * T] + t + 1);
      }
      starts.push_back(x[b * T]);
    }
  }
  return starts;
}

TEST(SequentialLoader, RanksReadDisjointChunksAndWrapTogether) {
  const int64_t B = 2, T = 5;
  auto data = Counting(100);
  for (int world : {1, 2, 3}) {
    std::set<int32_t> covered;
    for (int rank = 0; rank < world; ++rank) {
      auto l = SequentialLoader::Create(data, B, T, rank, world);
      ASSERT_TRUE(l.ok()) << l.status();
      const int64_t per_pass = 99 / (world * B * T);
      ASSERT_EQ(l->batches_per_pass(), per_pass);
      std::vector<int32_t> pass1 = FirstTokens(*l, int(per_pass), B, T);
      // Batch k of rank r starts at (k*W + r)*B*T; row b at that + b*T.
      for (int64_t k = 0; k < per_pass; ++k) {
        for (int64_t b = 0; b < B; ++b) {
          EXPECT_EQ(pass1[k * B + b], (k * world + rank) * B * T + b * T)
              << "world " << world << " rank " << rank << " batch " << k;
        }
      }
      for (int32_t s : pass1) {
        for (int t = 0; t < T; ++t) {
          EXPECT_TRUE(covered.insert(s + t).second)
              << "position " << s + t << " read twice (world " << world << ")";
        }
      }
      // The next pass repeats the first exactly.
      EXPECT_EQ(l->step(), 0);
      EXPECT_EQ(FirstTokens(*l, int(per_pass), B, T), pass1);
    }
    // Together the ranks cover the file up to the skipped tail.
    const int64_t used = (99 / (world * B * T)) * world * B * T;
    EXPECT_EQ(int64_t(covered.size()), used);
    EXPECT_EQ(*covered.rbegin(), used - 1);
  }
}

TEST(SequentialLoader, UsesTheLastTokenWhenItFitsExactly) {
  // 31 = 3*2*5 + 1 tokens: one batch per rank, rank 2's last target is token 30.
  auto data = Counting(31);
  auto l = SequentialLoader::Create(data, 2, 5, 2, 3);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->batches_per_pass(), 1);
  Batch b = l->Next();
  EXPECT_EQ(b.targets.data<int32_t>()[9], 30);
  EXPECT_EQ(l->position(), 20);  // wrapped back to its start
  EXPECT_FALSE(SequentialLoader::Create(Counting(30), 2, 5, 2, 3).ok());
  EXPECT_FALSE(SequentialLoader::Create(data, 2, 5, 3, 3).ok());
}

}  // namespace
}  // namespace braid::data
