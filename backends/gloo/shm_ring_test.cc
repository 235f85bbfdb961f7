// ShmRing on its own: the byte stream across the ring's end with a writer and a reader thread
// that sleep on each other, the segment's name from creation to removal, the doorbell, Close.
#include "backends/gloo/shm_ring.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace braid::gloo_backend::internal {
namespace {

using ::testing::HasSubstr;

bool NameExists(const std::string& name) {
  int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  close(fd);
  return true;
}

// A capacity that divides nothing the chunks are made of, so copies split at the ring's end in
// every way. The sleeps have no time limit that matters: a lost wake-up hangs the test (and
// bazel's timeout fails it) rather than slowing it down.
TEST(ShmRing, StreamsEveryByteInOrderAcrossTheEnd) {
  std::string name;
  auto reader = ShmRing::Create(1000, &name);
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto writer = ShmRing::Open(name);
  ASSERT_TRUE(writer.ok()) << writer.status();
  EXPECT_EQ((*writer)->capacity(), 1000u);
  const size_t total = 3 << 20;
  std::vector<unsigned char> sent(total), got(total);
  std::mt19937 rng(7);
  for (auto& b : sent) b = static_cast<unsigned char>(rng());
  std::thread w([&] {
    std::mt19937 sizes(1);
    size_t at = 0;
    while (at < total) {
      size_t n = std::min<size_t>(total - at, 1 + sizes() % 1500);
      size_t put = (*writer)->Write(sent.data() + at, n);
      at += put;
      if (put < n) (*writer)->WaitWritable(absl::Hours(1));
    }
  });
  std::mt19937 sizes(2);
  size_t at = 0;
  while (at < total) {
    if ((*reader)->Readable() == 0) (*reader)->WaitReadable(absl::Hours(1));
    at += (*reader)->Read(got.data() + at, std::min<size_t>(total - at, 1 + sizes() % 1700));
  }
  w.join();
  EXPECT_EQ((*reader)->Readable(), 0u);
  EXPECT_TRUE(got == sent);
}

TEST(ShmRing, TheWriterTakesTheNameAndAnUntakenOneIsRemovedByItsCreator) {
  std::string name;
  {
    auto reader = ShmRing::Create(4096, &name);
    ASSERT_TRUE(reader.ok()) << reader.status();
    EXPECT_THAT(name, HasSubstr("/braid-"));
    EXPECT_TRUE(NameExists(name));
    auto writer = ShmRing::Open(name);
    ASSERT_TRUE(writer.ok()) << writer.status();
    EXPECT_FALSE(NameExists(name));  // only the two mappings hold it now
    EXPECT_EQ((*writer)->Write("abc", 3), 3u);
    char out[3];
    EXPECT_EQ((*reader)->Read(out, 3), 3u);
    EXPECT_EQ(std::string(out, 3), "abc");
  }
  {
    auto reader = ShmRing::Create(4096, &name);
    ASSERT_TRUE(reader.ok()) << reader.status();
    EXPECT_TRUE(NameExists(name));
  }
  EXPECT_FALSE(NameExists(name));
  EXPECT_FALSE(ShmRing::Open(name).ok());
}

TEST(ShmRing, OpenRefusesASegmentThatIsNotARing) {
  const std::string name = "/braid-test-not-a-ring-" + std::to_string(getpid());
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 8192), 0);
  close(fd);
  auto ring = ShmRing::Open(name);
  shm_unlink(name.c_str());
  ASSERT_FALSE(ring.ok());
  EXPECT_THAT(std::string(ring.status().message()), HasSubstr("is not a ring"));
}

// A writer that finds the ring full rings the doorbell before it sleeps; Close is seen by the
// other side only, and wakes its sleep.
TEST(ShmRing, AFullRingRingsTheDoorbellAndCloseIsSeenByThePeer) {
  std::string name;
  auto reader = ShmRing::Create(64, &name);
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto writer = ShmRing::Open(name);
  ASSERT_TRUE(writer.ok()) << writer.status();
  std::vector<unsigned char> block(64, 1);
  EXPECT_EQ((*writer)->Write(block.data(), 100), 64u);
  EXPECT_EQ((*writer)->Write(block.data(), 1), 0u);
  std::thread w([&] { (*writer)->WaitWritable(absl::Hours(1)); });  // ends once room is made
  EXPECT_GE((*reader)->WaitDoorbell(0, absl::Hours(1)), 1u);
  EXPECT_EQ((*reader)->Read(nullptr, 10), 10u);
  w.join();
  EXPECT_FALSE((*reader)->PeerClosed());
  EXPECT_FALSE((*writer)->PeerClosed());
  (*writer)->Close();
  EXPECT_TRUE((*reader)->PeerClosed());
  EXPECT_FALSE((*writer)->PeerClosed());
}

// A reader that polls before it sleeps returns as soon as the bytes are there, not at the end of
// its poll (an hour here: a poll that ignored the data would hang the test).
TEST(ShmRing, APollingReaderReturnsWhenTheBytesCome) {
  std::string name;
  auto reader = ShmRing::Create(4096, &name);
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto writer = ShmRing::Open(name);
  ASSERT_TRUE(writer.ok()) << writer.status();
  std::thread w([&] { EXPECT_EQ((*writer)->Write("x", 1), 1u); });
  while ((*reader)->Readable() == 0) (*reader)->WaitReadable(absl::Hours(1), absl::Hours(1));
  w.join();
  EXPECT_EQ((*reader)->Readable(), 1u);
}

// The default poll: only with a CPU for each of the host's ranks, as the launcher tells them.
TEST(ShmRing, SpinsByDefaultOnlyWithACpuForEachLocalRank) {
  unsetenv("LOCAL_WORLD_SIZE");
  EXPECT_EQ(ShmSpinAuto(), absl::ZeroDuration());
  setenv("LOCAL_WORLD_SIZE", "1", 1);
  EXPECT_EQ(ShmSpinAuto(), absl::Milliseconds(2));
  setenv("LOCAL_WORLD_SIZE", "100000", 1);
  EXPECT_EQ(ShmSpinAuto(), absl::ZeroDuration());
  unsetenv("LOCAL_WORLD_SIZE");
}

TEST(ShmRing, HostIdentityNamesBootShmMountAndPidNamespace) {
  std::string id = ShmHostIdentity();
  ASSERT_FALSE(id.empty()) << "this machine has /dev/shm";
  EXPECT_THAT(id, HasSubstr(" boot "));
  EXPECT_THAT(id, HasSubstr(" shm "));
  EXPECT_THAT(id, HasSubstr("pid:["));
  EXPECT_EQ(id, ShmHostIdentity());
}

}  // namespace
}  // namespace braid::gloo_backend::internal
