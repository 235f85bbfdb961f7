#include "launcher/run_folder.h"

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

}  // namespace
}  // namespace braid::launcher
