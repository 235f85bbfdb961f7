#include "launcher/monitor/csv_monitor.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace braid::monitor {
namespace {

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string TempDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name);
  std::system(absl::StrCat("rm -rf '", dir, "' && mkdir -p '", dir, "'").c_str());
  return dir;
}

TEST(CsvMonitor, DeepSpeedsLayoutOneFilePerTag) {
  EXPECT_EQ(CsvFileName("Train/Samples/train_loss"), "Train_Samples_train_loss.csv");
  EXPECT_EQ(CsvFileName("my metric"), "my_metric.csv");
  const std::string dir = TempDir("layout");
  CsvMonitor m(dir, 0);
  ASSERT_TRUE(m.Write("Train/Samples/train_loss", 8, 5.5).ok());
  ASSERT_TRUE(m.Write("Train/Samples/lr", 8, 0.001).ok());
  ASSERT_TRUE(m.Write("Train/Samples/train_loss", 16, 5.25).ok());
  EXPECT_EQ(Read(dir + "/Train_Samples_train_loss.csv"), "step,train_loss\n8,5.5\n16,5.25\n");
  EXPECT_EQ(Read(dir + "/Train_Samples_lr.csv"), "step,lr\n8,0.001\n");
}

TEST(CsvMonitor, ARestartReplacesTheRowsItRedoes) {
  const std::string dir = TempDir("restart");
  {
    CsvMonitor first(dir, 0);
    for (int x : {8, 16, 24, 32}) ASSERT_TRUE(first.Write("loss", x, x / 8.0).ok());
  }
  // Resumed at step 2 (x up to 16 kept): rows 24 and 32 are written again, the header once.
  CsvMonitor second(dir, 16);
  for (int x : {24, 32, 40}) ASSERT_TRUE(second.Write("loss", x, x / 4.0).ok());
  EXPECT_EQ(Read(dir + "/loss.csv"), "step,loss\n8,1\n16,2\n24,6\n32,8\n40,10\n");
}

}  // namespace
}  // namespace braid::monitor
