#include "launcher/monitor/tensorboard_writer.h"

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "launcher/monitor/tfevents.pb.h"

namespace braid::tensorboard {
namespace {

// The CRC-32C check values of RFC 3720 (iSCSI), appendix B.4, and the common "123456789" one.
TEST(Crc32c, KnownValues) {
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(Crc32c("", 0), 0u);
  unsigned char zeros[32] = {}, ones[32], ascending[32];
  std::memset(ones, 0xff, sizeof(ones));
  for (int i = 0; i < 32; ++i) ascending[i] = static_cast<unsigned char>(i);
  EXPECT_EQ(Crc32c(zeros, 32), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(ones, 32), 0x62A8AB43u);
  EXPECT_EQ(Crc32c(ascending, 32), 0x46DD794Eu);
}

TEST(Crc32c, MaskIsTfRecords) {
  const uint32_t c = Crc32c("123456789", 9);
  EXPECT_EQ(MaskedCrc32c("123456789", 9), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

uint64_t LittleEndian(const std::string& s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return v;
}

// Reads back the framing and the messages (tests/e2e/monitors_test.sh reads the files of a real
// run with a reader of its own, in Python).
TEST(TensorBoardWriter, RecordsFramedAndChecked) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = tmp != nullptr ? tmp : "/tmp";
  const absl::Time t0 = absl::FromUnixMillis(1764237600500);
  std::string path;
  {
    auto w = TensorBoardWriter::Create(dir, t0);
    ASSERT_TRUE(w.ok()) << w.status();
    path = (*w)->path();
    EXPECT_NE(path.find("/events.out.tfevents.1764237600."), std::string::npos) << path;
    ASSERT_TRUE((*w)->AddScalars(16, t0 + absl::Seconds(1), {{"Train/Samples/train_loss", 5.5f},
                                                               {"Train/Samples/lr", 1e-3f}})
                    .ok());
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string bytes = ss.str();
  std::vector<Event> events;
  for (size_t at = 0; at < bytes.size();) {
    ASSERT_LE(at + 12, bytes.size());
    const uint64_t n = LittleEndian(bytes, at, 8);
    EXPECT_EQ(LittleEndian(bytes, at + 8, 4), MaskedCrc32c(bytes.data() + at, 8));
    ASSERT_LE(at + 12 + n + 4, bytes.size());
    const std::string data = bytes.substr(at + 12, n);
    EXPECT_EQ(LittleEndian(bytes, at + 12 + n, 4), MaskedCrc32c(data.data(), n));
    Event e;
    ASSERT_TRUE(e.ParseFromString(data));
    events.push_back(e);
    at += 12 + n + 4;
  }
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
  EXPECT_DOUBLE_EQ(events[0].wall_time(), 1764237600.5);
  EXPECT_EQ(events[1].step(), 16);
  EXPECT_DOUBLE_EQ(events[1].wall_time(), 1764237601.5);
  ASSERT_EQ(events[1].summary().value_size(), 2);
  EXPECT_EQ(events[1].summary().value(0).tag(), "Train/Samples/train_loss");
  EXPECT_EQ(events[1].summary().value(0).simple_value(), 5.5f);
  EXPECT_EQ(events[1].summary().value(1).simple_value(), 1e-3f);
}

}  // namespace
}  // namespace braid::tensorboard
