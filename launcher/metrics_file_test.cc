#include "launcher/metrics_file.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace braid::launcher {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::trunc) << text;
}

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(StampTime, FirstFieldUnixSecondsToTheMillisecond) {
  const absl::Time t = absl::FromUnixMillis(1764237600123);
  EXPECT_EQ(StampTime("{\"step\": 3, \"loss\": 1.5}", t),
            "{\"time\": 1764237600.123, \"step\": 3, \"loss\": 1.5}");
  EXPECT_EQ(StampTime("{}", t), "{\"time\": 1764237600.123}");
}

// An attempt that ran steps 0..4 and died while writing step 5; the checkpoint was at step 3.
constexpr char kCrashed[] =
    "{\"time\": 1.0, \"step\": 0, \"loss\": 5.5}\n"
    "{\"time\": 2.0, \"step\": 1, \"loss\": 5.0}\n"
    "{\"time\": 3.0, \"step\": 2, \"loss\": 4.5}\n"
    "{\"time\": 4.0, \"step\": 3, \"loss\": 4.0}\n"
    "{\"time\": 5.0, \"step\": 4, \"loss\": 3.5}\n"
    "{\"time\": 6.0, \"step\": 5, \"lo";

TEST(KeepLinesBeforeStep, AResumeDropsTheStepsItRedoesAndACutLine) {
  const std::string path = TempPath("resume.jsonl");
  Write(path, kCrashed);
  absl::StatusOr<int> dropped = KeepLinesBeforeStep(path, 3);
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  EXPECT_EQ(*dropped, 3);  // steps 3 and 4, and the cut line of step 5
  EXPECT_EQ(Read(path),
            "{\"time\": 1.0, \"step\": 0, \"loss\": 5.5}\n"
            "{\"time\": 2.0, \"step\": 1, \"loss\": 5.0}\n"
            "{\"time\": 3.0, \"step\": 2, \"loss\": 4.5}\n");
}

TEST(KeepLinesBeforeStep, AFreshStartKeepsNoStep) {
  const std::string path = TempPath("fresh.jsonl");
  Write(path, kCrashed);
  ASSERT_EQ(*KeepLinesBeforeStep(path, 0), 6);
  EXPECT_EQ(Read(path), "");
}

TEST(KeepLinesBeforeStep, ASummaryStaysOnlyIfItsStepsAreNotRedone) {
  const std::string path = TempPath("summary.jsonl");
  const std::string finished =
      "{\"time\": 1.0, \"step\": 0, \"loss\": 5.5}\n"
      "{\"time\": 2.0, \"step\": 1, \"loss\": 5.0}\n"
      "{\"time\": 3.0, \"summary\": true, \"eval\": \"\", \"steps\": 2, \"first_loss\": 5.5}\n";
  Write(path, finished);
  // Extended from step 2 (its checkpoint): everything stays.
  EXPECT_EQ(*KeepLinesBeforeStep(path, 2), 0);
  EXPECT_EQ(Read(path), finished);
  // Resumed from step 1: step 1 and the summary of steps 0-1 go.
  EXPECT_EQ(*KeepLinesBeforeStep(path, 1), 2);
  EXPECT_EQ(Read(path), "{\"time\": 1.0, \"step\": 0, \"loss\": 5.5}\n");
}

TEST(KeepLinesBeforeStep, TwoRestartsLeaveEachStepOnce) {
  const std::string path = TempPath("twice.jsonl");
  Write(path, "");
  auto append = [&](int from, int to) {
    std::ofstream out(path, std::ios::app);
    for (int s = from; s < to; ++s) out << "{\"step\": " << s << ", \"attempt_from\": " << from << "}\n";
  };
  append(0, 5);  // attempt 0 ran 0..4, checkpoint at 2
  ASSERT_TRUE(KeepLinesBeforeStep(path, 2).ok());
  append(2, 7);  // attempt 1 ran 2..6, checkpoint at 6
  ASSERT_TRUE(KeepLinesBeforeStep(path, 6).ok());
  append(6, 8);  // attempt 2 finished
  EXPECT_EQ(Read(path),
            "{\"step\": 0, \"attempt_from\": 0}\n{\"step\": 1, \"attempt_from\": 0}\n"
            "{\"step\": 2, \"attempt_from\": 2}\n{\"step\": 3, \"attempt_from\": 2}\n"
            "{\"step\": 4, \"attempt_from\": 2}\n{\"step\": 5, \"attempt_from\": 2}\n"
            "{\"step\": 6, \"attempt_from\": 6}\n{\"step\": 7, \"attempt_from\": 6}\n");
}

TEST(KeepLinesBeforeStep, NoFileIsAFirstStart) {
  absl::StatusOr<int> dropped = KeepLinesBeforeStep(TempPath("absent.jsonl"), 0);
  ASSERT_TRUE(dropped.ok());
  EXPECT_EQ(*dropped, 0);
}

}  // namespace
}  // namespace braid::launcher
