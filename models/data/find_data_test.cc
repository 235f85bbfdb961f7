#include "models/data/find_data.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace braid::data {
namespace {

std::string TempDir() {
  const char* t = std::getenv("TEST_TMPDIR");
  return t != nullptr ? t : "/tmp";
}

class FindDataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* old = std::getenv("BRAID_DATA_DIR");
    had_old_ = old != nullptr;
    if (had_old_) old_ = old;
  }
  void TearDown() override {
    if (had_old_) {
      setenv("BRAID_DATA_DIR", old_.c_str(), 1);
    } else {
      unsetenv("BRAID_DATA_DIR");
    }
  }
  bool had_old_ = false;
  std::string old_;
};

TEST_F(FindDataTest, EnvironmentVariableComesFirst) {
  const std::string root = TempDir() + "/find_data_env";
  ASSERT_EQ(system(("mkdir -p '" + root + "/node_modules/pkg'").c_str()), 0);
  std::ofstream(root + "/node_modules/pkg/file.txt") << "x";
  setenv("BRAID_DATA_DIR", root.c_str(), 1);
  auto found = FindDataFile("pkg/file.txt");
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_TRUE(absl::StartsWith(*found, "/")) << *found;
  EXPECT_TRUE(absl::EndsWith(*found, "/find_data_env/node_modules/pkg/file.txt")) << *found;

  // BRAID_DATA_DIR may also point straight at a folder holding the relative path.
  setenv("BRAID_DATA_DIR", (root + "/node_modules").c_str(), 1);
  found = FindDataFile("pkg/file.txt");
  ASSERT_TRUE(found.ok()) << found.status();
}

TEST_F(FindDataTest, MissingFileListsPlacesAndSuggestsSetup) {
  setenv("BRAID_DATA_DIR", (TempDir() + "/no_such_dir").c_str(), 1);
  auto found = FindDataFile("no-such-package/missing.bin");
  ASSERT_FALSE(found.ok());
  EXPECT_EQ(found.status().code(), absl::StatusCode::kNotFound);
  const std::string msg(found.status().message());
  EXPECT_NE(msg.find("no_such_dir/node_modules/no-such-package/missing.bin"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("/data/node_modules/no-such-package/missing.bin"), std::string::npos) << msg;
  EXPECT_NE(msg.find("tools/setup.sh"), std::string::npos) << msg;
}

TEST_F(FindDataTest, RejectsAbsolutePaths) {
  EXPECT_EQ(FindDataFile("/etc/passwd").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FindDataFile("").status().code(), absl::StatusCode::kInvalidArgument);
}

// Under `bazel test` the data is reached by walking up from the test binary's real path; this
// runs where tools/setup.sh installed the data (find_data_test_data; SKIPPED elsewhere).
TEST_F(FindDataTest, FindsInstalledData) {
  unsetenv("BRAID_DATA_DIR");
  auto found = FindDataFile(kMobyDickText);
  ASSERT_TRUE(found.ok()) << "data sets not installed (run tools/setup.sh): " << found.status().message();
  struct stat st;
  ASSERT_EQ(stat(found->c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 1204997);
}

}  // namespace
}  // namespace braid::data
