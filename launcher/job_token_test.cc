#include "launcher/job_token.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace braid::launcher {
namespace {

using ::testing::HasSubstr;

std::string TempFolder(const char* name) {
  std::string d = std::string(::getenv("TEST_TMPDIR")) + "/" + name;
  ::mkdir(d.c_str(), 0700);
  ::chmod(d.c_str(), 0700);
  return d;
}

TEST(JobToken, LoopbackAddresses) {
  for (const char* a : {"127.0.0.1", "127.1.2.3", "::1", "localhost"}) {
    EXPECT_TRUE(IsLoopbackAddress(a)) << a;
  }
  for (const char* a : {"10.0.0.1", "128.0.0.1", "::2", "node0", "0.0.0.0", ""}) {
    EXPECT_FALSE(IsLoopbackAddress(a)) << a;
  }
}

// Launchers starting at once agree on one token, and exactly one of them made it.
TEST(JobToken, ConcurrentLaunchersShareOne) {
  std::string dir = TempFolder("shared");
  constexpr int kLaunchers = 8;
  std::vector<absl::StatusOr<SharedToken>> got(kLaunchers, absl::UnknownError(""));
  std::vector<std::thread> threads;
  for (int i = 0; i < kLaunchers; ++i) {
    threads.emplace_back([&, i] { got[i] = LocalJobToken(dir, "127.0.0.1", 29555); });
  }
  for (auto& t : threads) t.join();
  int created = 0;
  for (auto& g : got) {
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(g->token, got[0]->token);
    EXPECT_EQ(g->token.size(), 64u);
    created += g->created;
  }
  EXPECT_EQ(created, 1);
  struct stat st;
  ASSERT_EQ(::stat(got[0]->path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  // Another port is another job: another token.
  auto other = LocalJobToken(dir, "127.0.0.1", 29556);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->token, got[0]->token);
}

TEST(JobToken, RefusesFilesOthersCanRead) {
  std::string dir = TempFolder("loose");
  auto first = LocalJobToken(dir, "127.0.0.1", 1);
  ASSERT_TRUE(first.ok());
  ::chmod(first->path.c_str(), 0644);
  auto again = LocalJobToken(dir, "127.0.0.1", 1);
  EXPECT_THAT(std::string(again.status().message()), HasSubstr("no access for others"));
  EXPECT_THAT(std::string(again.status().message()), HasSubstr(first->path));
}

TEST(JobToken, RefusesAnEmptyFile) {
  std::string dir = TempFolder("empty");
  std::string path = dir + "/job-token-127.0.0.1-2";
  { std::ofstream(path) << ""; }
  ::chmod(path.c_str(), 0600);
  auto t = LocalJobToken(dir, "127.0.0.1", 2);
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("holds no job token"));
}

TEST(JobToken, PrivateFolderFromXdgRuntimeDir) {
  std::string base = TempFolder("xdg");
  ::setenv("XDG_RUNTIME_DIR", base.c_str(), 1);
  auto dir = PrivateFolder();
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(*dir, base + "/braid");
  ::chmod(dir->c_str(), 0755);
  EXPECT_THAT(std::string(PrivateFolder().status().message()), HasSubstr("no access for others"));
}

std::string WriteFile(const std::string& name, const std::string& text) {
  std::string path = TempFolder("files") + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// A Kubernetes Secret's key as mounted: the value, often with a trailing newline (kubectl
// create secret --from-file keeps the file's), behind a symbolic link into ..data/.
TEST(JobTokenFile, ReadsAMountedSecret) {
  std::string dir = TempFolder("secret");
  ::mkdir((dir + "/..data").c_str(), 0755);
  std::ofstream(dir + "/..data/token") << "0123456789abcdef0123456789abcdef\n";
  ::unlink((dir + "/token").c_str());
  ASSERT_EQ(::symlink("..data/token", (dir + "/token").c_str()), 0);
  absl::StatusOr<std::string> t = ReadJobTokenFile(dir + "/token");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, "0123456789abcdef0123456789abcdef");
  EXPECT_EQ(*ReadJobTokenFile(WriteFile("crlf", "tok\r\n")), "tok");
}

TEST(JobTokenFile, RefusesWhatIsNotOneToken) {
  EXPECT_THAT(ReadJobTokenFile(TempFolder("files") + "/missing").status().message(),
              HasSubstr("--job_token_file: cannot open"));
  EXPECT_THAT(ReadJobTokenFile(WriteFile("empty", "\n")).status().message(),
              HasSubstr("is empty"));
  EXPECT_THAT(ReadJobTokenFile(WriteFile("two", "a b\n")).status().message(),
              HasSubstr("holds more than one word"));
  EXPECT_THAT(ReadJobTokenFile(WriteFile("big", std::string(5000, 'a'))).status().message(),
              HasSubstr("larger than 4096 bytes"));
}

// Standard input replaced by a file for one call (the test's own stdin is left as it was).
absl::StatusOr<std::string> FromStdin(const std::string& text) {
  const std::string path = WriteFile("stdin", text);
  int saved = ::dup(0);
  int fd = ::open(path.c_str(), O_RDONLY);
  ::dup2(fd, 0);
  ::close(fd);
  absl::StatusOr<std::string> t = ReadJobTokenFile("-");
  char rest[16] = {0};
  ssize_t n = ::read(0, rest, sizeof rest - 1);  // what a later reader of stdin would get
  ::dup2(saved, 0);
  ::close(saved);
  if (t.ok()) return absl::StrCat(*t, "|", n > 0 ? std::string(rest, n) : "");
  return t;
}

TEST(JobTokenFile, DashIsTheFirstLineOfStandardInput) {
  // Only the first line is taken: what follows stays for the next reader.
  EXPECT_EQ(*FromStdin("tok123\nmore"), "tok123|more");
  EXPECT_EQ(*FromStdin("tok123"), "tok123|");
  EXPECT_THAT(FromStdin("\n").status().message(),
              HasSubstr("--job_token_file=-: the first line of standard input should hold the job token"));
  EXPECT_THAT(FromStdin("").status().message(), HasSubstr("should hold the job token"));
  EXPECT_THAT(FromStdin("a b\n").status().message(), HasSubstr("holds more than one word"));
}

TEST(JobTokenFile, FileAndEnvironmentMustAgree) {
  std::string path = WriteFile("tok", "s3cret\n");
  EXPECT_FALSE(GivenJobToken("", nullptr)->has_value());
  EXPECT_FALSE(GivenJobToken("", "")->has_value());
  EXPECT_EQ(**GivenJobToken("", "from-env"), "from-env");
  EXPECT_EQ(**GivenJobToken(path, nullptr), "s3cret");
  EXPECT_EQ(**GivenJobToken(path, "s3cret"), "s3cret");
  absl::StatusOr<std::optional<std::string>> both = GivenJobToken(path, "other");
  ASSERT_FALSE(both.ok());
  EXPECT_THAT(both.status().message(),
              HasSubstr(absl::StrCat("the job token in --job_token_file=", path,
                                     " differs from $BRAID_JOB_TOKEN")));
  // Neither secret is printed.
  EXPECT_THAT(both.status().message(), ::testing::Not(HasSubstr("s3cret")));
  EXPECT_THAT(both.status().message(), ::testing::Not(HasSubstr("other")));
}

TEST(ChooseJobToken, OrderOfSources) {
  std::string path = WriteFile("tok2", "filetoken\n");
  EXPECT_EQ(*ChooseJobToken(path, nullptr, {2, "10.0.0.1", 29500, "x"}), "filetoken");
  EXPECT_EQ(*ChooseJobToken("", "envtoken", {2, "10.0.0.1", 29500, "x"}), "envtoken");
  // Several machines and nothing given: say how to give one.
  absl::StatusOr<std::string> none = ChooseJobToken("", nullptr, {2, "10.0.0.1", 29500, "--nnodes=2"});
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(none.status().message(), HasSubstr("--job_token_file=FILE"));
  // One launcher: a fresh one.
  absl::StatusOr<std::string> fresh = ChooseJobToken("", nullptr, {1, "127.0.0.1", 0, ""});
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ(fresh->size(), 64u);
}

}  // namespace
}  // namespace braid::launcher
