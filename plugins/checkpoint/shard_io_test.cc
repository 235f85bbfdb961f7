// shard_io.h: a checkpoint file written and read in one pass each. What is read back is what was
// written, bit for bit; the recorded CRC-32 is zlib's over every byte of the file; core's
// safetensors reader reads the file too; any flipped byte or a truncation is reported as damage
// naming the file; a full disk (ENOSPC, from /dev/full) is reported as such.
#include "plugins/checkpoint/shard_io.h"

#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "core/testing/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plugins/checkpoint/safetensors.h"

namespace braid::checkpoint {
namespace {

using ::testing::HasSubstr;

std::string TmpPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void Spit(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

std::map<std::string, Tensor> Sample() {
  std::mt19937 rng(4);
  std::map<std::string, Tensor> t;
  // Larger than one 4 MiB piece, so the CRC runs over several pieces of one tensor.
  t["a.weight#0"] = test::RandomTensor({3 * 1024 * 1024 / 2}, rng);
  t["b#1"] = Tensor::FromVector(std::vector<int64_t>{1, -2, 3}, {3});
  t["c#2"] = Tensor::FromVector(std::vector<uint8_t>{7, 8, 9, 10, 11}, {5});
  t["empty#3"] = Tensor::Empty({0});
  return t;
}

bool SameBytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         (a.nbytes() == 0 || std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0);
}

TEST(ShardIo, RoundTripIsBitwiseAndTheCrcCoversTheWholeFile) {
  const std::string path = TmpPath("round.safetensors");
  const auto tensors = Sample();
  absl::StatusOr<ShardWritten> w = WriteShard(path, tensors, {{"format", "test"}});
  ASSERT_TRUE(w.ok()) << w.status();
  const std::string bytes = Slurp(path);
  EXPECT_EQ(w->bytes, int64_t(bytes.size()));
  EXPECT_EQ(w->crc32, uint32_t(crc32(0L, reinterpret_cast<const Bytef*>(bytes.data()), uInt(bytes.size()))));

  absl::StatusOr<std::map<std::string, Tensor>> r = ReadShard(path, w->bytes, w->crc32);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), tensors.size());
  for (auto& [key, t] : tensors) EXPECT_TRUE(SameBytes(t, r->at(key))) << key;

  // A plain safetensors file: core's strict reader accepts it, with the metadata.
  absl::StatusOr<SafetensorsContents> core = ReadSafetensors(path);
  ASSERT_TRUE(core.ok()) << core.status();
  EXPECT_EQ(core->metadata.at("format"), "test");
  for (auto& [key, t] : tensors) EXPECT_TRUE(SameBytes(t, core->tensors.at(key))) << key;
}

TEST(ShardIo, EveryDamageIsReportedNamingTheFile) {
  const std::string path = TmpPath("damaged.safetensors");
  absl::StatusOr<ShardWritten> w = WriteShard(path, Sample(), {{"format", "test"}});
  ASSERT_TRUE(w.ok()) << w.status();
  const std::string good = Slurp(path);
  // One flipped byte in the header length, the header, the first and the last data bytes, and in
  // between: each is damage, whatever the header then says.
  for (size_t at : {size_t(0), size_t(3), size_t(20), good.size() / 2, good.size() - 1,
                    good.size() - 5 - 3 * 8}) {
    std::string bad = good;
    bad[at] = char(bad[at] ^ 0x55);
    Spit(path, bad);
    absl::StatusOr<std::map<std::string, Tensor>> r = ReadShard(path, w->bytes, w->crc32);
    ASSERT_FALSE(r.ok()) << "byte " << at;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << "byte " << at;
    EXPECT_THAT(r.status().message(), HasSubstr(path + " is damaged: ")) << "byte " << at;
  }
  Spit(path, good.substr(0, good.size() - 1));
  EXPECT_THAT(ReadShard(path, w->bytes, w->crc32).status().message(),
              HasSubstr(path + " is damaged: it has " + std::to_string(good.size() - 1) +
                        " bytes where the index says " + std::to_string(good.size())));
  Spit(path, good);
  EXPECT_TRUE(ReadShard(path, w->bytes, w->crc32).ok());
  EXPECT_THAT(ReadShard(path, w->bytes, w->crc32 ^ 1u).status().message(), HasSubstr("CRC-32"));
  EXPECT_THAT(ReadShard(TmpPath("absent.safetensors"), 8, 0).status().message(),
              HasSubstr("absent.safetensors cannot be read"));
}

// /dev/full fails every write with ENOSPC: a full disk without filling one. Reached through a
// link, which the failed write removes (never the device). Runs in shard_io_test_dev_full,
// which Bazel skips where the machine has no /dev/full: here its absence is a failure.
TEST(ShardIo, AFullDiskIsReportedAsSuch) {
  struct stat st;
  ASSERT_EQ(::stat("/dev/full", &st), 0) << "no /dev/full, but the target requires one";
  const std::string path = TmpPath("full.safetensors");
  ::unlink(path.c_str());
  ASSERT_EQ(::symlink("/dev/full", path.c_str()), 0);
  absl::StatusOr<ShardWritten> w = WriteShard(path, Sample(), {});
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(w.status().message(),
              HasSubstr("writing '" + path + "' failed: No space left on device: the disk holding the "
                        "checkpoint is full"));
  EXPECT_NE(::lstat(path.c_str(), &st), 0) << "the partial file (here the link) is removed";
  EXPECT_EQ(::stat("/dev/full", &st), 0);
}

}  // namespace
}  // namespace braid::checkpoint
