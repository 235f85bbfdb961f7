#include "launcher/run_folder.h"

#include <cstdlib>
#include <string>

#include "absl/time/civil_time.h"
#include "gtest/gtest.h"

namespace braid::launcher {
namespace {

TEST(RunFolderName, TheConfigsStemAndTheLocalTime) {
  const absl::Time t = absl::FromCivil(absl::CivilSecond(2026, 1, 27, 10, 15, 0), absl::LocalTimeZone());
  EXPECT_EQ(RunFolderName("launcher/configs/gpt-mini-bf16.pbtxt", "gpt-mini", t),
            "gpt-mini-bf16-20260127-101500");
  EXPECT_EQ(RunFolderName("/a/b.c/zero2_offload.json", "x", t), "zero2_offload-20260127-101500");
  EXPECT_EQ(RunFolderName("noext", "x", t), "noext-20260127-101500");
  EXPECT_EQ(RunFolderName(".hidden", "x", t), ".hidden-20260127-101500");
  EXPECT_EQ(RunFolderName("", "gpt-mini", t), "gpt-mini-20260127-101500");
}

TEST(RunFolderOfCheckpoint, NamedOnceAStepIsSaved) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/ckpt";
  ASSERT_EQ(std::system(("rm -rf '" + dir + "' && mkdir -p '" + dir + "/step_2.tmp'").c_str()), 0);
  ASSERT_TRUE(RecordRunFolder(dir, "/runs/a-1").ok());
  EXPECT_EQ(RunFolderOfCheckpoint(dir), "");  // no complete step: nothing to continue
  ASSERT_EQ(std::system(("mkdir -p '" + dir + "/step_2'").c_str()), 0);
  EXPECT_EQ(RunFolderOfCheckpoint(dir), "/runs/a-1");
  ASSERT_TRUE(RecordRunFolder(dir, "/runs/b-2").ok());  // replaced
  EXPECT_EQ(RunFolderOfCheckpoint(dir), "/runs/b-2");
  EXPECT_EQ(RunFolderOfCheckpoint(""), "");
}

}  // namespace
}  // namespace braid::launcher
