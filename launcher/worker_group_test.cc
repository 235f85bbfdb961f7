#include "launcher/worker_group.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace braid::launcher {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string TempDir() {
  const char* t = std::getenv("TEST_TMPDIR");
  std::string base = t ? t : "/tmp";
  static int n = 0;
  std::string dir = absl::StrCat(base, "/wg", getpid(), "_", n++);
  EXPECT_TRUE(MakeDirs(dir).ok());
  return dir;
}

std::string Read(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool Alive(pid_t pid) { return kill(pid, 0) == 0 || errno != ESRCH; }

// How long the waits below give what they wait for: a safety net only, far beyond any scheduling
// delay, so that a loaded machine never fails these tests; something that never happens fails
// the test after it (or Bazel's timeout does first). No test asserts how fast anything was.
constexpr absl::Duration kSafetyNet = absl::Minutes(5);

// Polls `done` every 10 ms until it is true (or kSafetyNet ran out: false).
bool WaitFor(const std::function<bool()>& done) {
  const absl::Time deadline = absl::Now() + kSafetyNet;
  while (!done()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

// A pid a shell script wrote to a file, once the whole line is there (-1 if it never is).
pid_t PidFrom(const std::string& path) {
  int pid = -1;
  const bool read = WaitFor([&] {
    std::string s = Read(path);
    return !s.empty() && s.back() == '\n' && absl::SimpleAtoi(s.substr(0, s.size() - 1), &pid);
  });
  return read ? pid : -1;
}

WorkerSpec Shell(int rank, const std::string& dir, const std::string& script) {
  WorkerSpec s;
  s.rank = rank;
  s.argv = {"/bin/sh", "-c", script};
  s.env = {{"PATH", "/usr/bin:/bin"}, {"RANK", std::to_string(rank)}};
  s.log_path = absl::StrCat(dir, "/workerlog.", rank);
  return s;
}

// Polls until every worker has exited (or kSafetyNet ran out).
std::vector<WorkerExit> WaitAll(WorkerGroup& g) {
  std::vector<WorkerExit> all;
  absl::Time deadline = absl::Now() + kSafetyNet;
  while (g.running() > 0 && absl::Now() < deadline) {
    for (const WorkerExit& e : g.Poll(absl::Milliseconds(100))) all.push_back(e);
  }
  return all;
}

TEST(WorkerGroup, RunsEachWorkerWithItsEnvironmentAndLog) {
  std::string dir = TempDir();
  WorkerGroup g;
  std::vector<WorkerSpec> specs;
  for (int r = 0; r < 3; ++r) {
    specs.push_back(Shell(r, dir, "echo out $RANK; echo err $RANK >&2; echo pgid $(cut -d' ' -f5 /proc/$$/stat)"));
  }
  ASSERT_TRUE(g.Start(specs).ok());
  std::vector<pid_t> pids = g.pids();
  std::vector<WorkerExit> exits = WaitAll(g);
  ASSERT_EQ(exits.size(), 3u);
  for (const WorkerExit& e : exits) EXPECT_TRUE(e.ok()) << DescribeWaitStatus(e.wait_status);
  for (int r = 0; r < 3; ++r) {
    std::string log = Read(absl::StrCat(dir, "/workerlog.", r));
    EXPECT_THAT(log, HasSubstr(absl::StrCat("out ", r, "\n")));
    EXPECT_THAT(log, HasSubstr(absl::StrCat("err ", r, "\n")));
    // Each worker leads its own process group.
    EXPECT_THAT(log, HasSubstr(absl::StrCat("pgid ", pids[r])));
  }
}

TEST(WorkerGroup, ReportsExitCodesAndSignals) {
  std::string dir = TempDir();
  WorkerGroup g;
  ASSERT_TRUE(g.Start({Shell(0, dir, "exit 3"), Shell(1, dir, "kill -SEGV $$")}).ok());
  std::vector<WorkerExit> exits = WaitAll(g);
  ASSERT_EQ(exits.size(), 2u);
  std::map<int, std::string> how;
  for (const WorkerExit& e : exits) {
    EXPECT_FALSE(e.ok());
    how[e.rank] = DescribeWaitStatus(e.wait_status);
  }
  EXPECT_EQ(how[0], "exited with code 3");
  EXPECT_THAT(how[1], HasSubstr("was killed by signal 11 (SIGSEGV"));
}

TEST(WorkerGroup, ExecFailureIsLogged) {
  std::string dir = TempDir();
  WorkerGroup g;
  WorkerSpec s = Shell(0, dir, "");
  s.argv = {"/nonexistent/program"};
  ASSERT_TRUE(g.Start({s}).ok());
  std::vector<WorkerExit> exits = WaitAll(g);
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(DescribeWaitStatus(exits[0].wait_status), "exited with code 127");
  EXPECT_THAT(Read(s.log_path), HasSubstr("cannot run /nonexistent/program: No such file"));
}

TEST(WorkerGroup, StdinPipeGivesTheTextAndEndOfFileOnlyWhenClosed) {
  std::string dir = TempDir();
  WorkerGroup g;
  // Worker 0 reads its first line, says so, then waits for end-of-file; worker 1 (stdin
  // /dev/null) reads end-of-file at once.
  WorkerSpec a = Shell(0, dir, "read -r line; echo \"got $line\"; cat >/dev/null; echo eof");
  a.stdin_pipe = true;
  a.stdin_text = "secret-token\n";
  WorkerSpec b = Shell(1, dir, "cat; echo eof");
  ASSERT_TRUE(g.Start({a, b}).ok());
  ASSERT_TRUE(WaitFor([&] { return Read(a.log_path) == "got secret-token\n"; })) << Read(a.log_path);
  std::vector<WorkerExit> exits;
  ASSERT_TRUE(WaitFor([&] {
    for (const WorkerExit& e : g.Poll(absl::Milliseconds(10))) exits.push_back(e);
    return !exits.empty();
  }));
  // Worker 1 ended (its stdin was /dev/null, and it never held worker 0's pipe open); worker 0
  // still waits for end-of-file.
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].rank, 1);
  EXPECT_EQ(g.running(), 1);
  EXPECT_EQ(Read(b.log_path), "eof\n");
  g.CloseStdin();
  std::vector<WorkerExit> rest = WaitAll(g);
  ASSERT_EQ(rest.size(), 1u);
  EXPECT_TRUE(rest[0].ok());
  EXPECT_EQ(Read(a.log_path), "got secret-token\neof\n");
}

TEST(WorkerGroup, StopReachesGrandchildrenAndLeavesNothing) {
  std::string dir = TempDir();
  WorkerGroup g;
  std::vector<WorkerSpec> specs;
  for (int r = 0; r < 2; ++r) {
    // The worker starts a child of its own and waits: the child is in the worker's group.
    specs.push_back(Shell(r, dir, absl::StrCat("sleep 100 & echo $! > ", dir, "/child.", r, "; wait")));
  }
  ASSERT_TRUE(g.Start(specs).ok());
  std::vector<pid_t> pids = g.pids();
  for (int r = 0; r < 2; ++r) pids.push_back(PidFrom(absl::StrCat(dir, "/child.", r)));
  for (pid_t p : pids) ASSERT_TRUE(p > 0 && Alive(p));
  // SIGTERM must be enough: Stop would send SIGKILL only after this grace, which the test never
  // lives to see (Bazel's timeout fails it first), so Stop returning at all says SIGTERM did it.
  g.Stop(SIGTERM, kSafetyNet);
  EXPECT_EQ(g.running(), 0);
  for (pid_t p : pids) EXPECT_FALSE(Alive(p)) << "pid " << p << " survived";
  std::vector<WorkerExit> exits = g.Poll(absl::ZeroDuration());
  ASSERT_EQ(exits.size(), 2u);
  for (const WorkerExit& e : exits) EXPECT_EQ(WTERMSIG(e.wait_status), SIGTERM);
}

TEST(WorkerGroup, StopEscalatesToSigkillAfterTheGrace) {
  std::string dir = TempDir();
  WorkerGroup g;
  // Ignored signals stay ignored across exec: the sleep ignores SIGTERM too.
  ASSERT_TRUE(g.Start({Shell(0, dir, absl::StrCat("trap '' TERM; sleep 100 & echo $! > ", dir,
                                                  "/child; wait"))}).ok());
  pid_t child = PidFrom(dir + "/child");
  ASSERT_GT(child, 0);
  absl::Time t0 = absl::Now();
  g.Stop(SIGTERM, absl::Milliseconds(500));
  // Not before the grace (a lower bound holds however loaded the machine is); the SIGKILL below
  // and the child being gone show it escalated. How soon after the grace is not asserted.
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(500));
  EXPECT_FALSE(Alive(child));
  std::vector<WorkerExit> exits = g.Poll(absl::ZeroDuration());
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(WTERMSIG(exits[0].wait_status), SIGKILL);
}

TEST(WorkerGroup, StopCatchesProcessesThatLeftTheGroup) {
  // As the launcher does: orphans come back to us instead of init.
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  std::string dir = TempDir();
  WorkerGroup g;
  ASSERT_TRUE(g.Start({Shell(0, dir, absl::StrCat("setsid sleep 100 & echo $! > ", dir,
                                                  "/escaped; sleep 100"))}).ok());
  pid_t escaped = PidFrom(dir + "/escaped");
  ASSERT_GT(escaped, 0);
  // $! is written before setsid(1) has run in the child: wait until it has.
  ASSERT_TRUE(WaitFor([&] { return getpgid(escaped) == escaped; })) << "setsid did not take effect";
  g.Stop(SIGTERM, absl::Seconds(1));
  EXPECT_FALSE(Alive(escaped));
}

TEST(WorkerGroup, EchoCopiesOutputToTheConsoleAndTheLog) {
  std::string dir = TempDir();
  // Capture our own stdout in a file while the group echoes.
  std::string console = dir + "/console";
  fflush(stdout);
  int saved = dup(1);
  int fd = open(console.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  dup2(fd, 1);
  close(fd);
  {
    WorkerGroup g;
    WorkerSpec s = Shell(0, dir, "echo to-stdout; echo to-stderr >&2");
    s.echo = true;
    WorkerSpec quiet = Shell(1, dir, "echo not-echoed");
    ASSERT_TRUE(g.Start({s, quiet}).ok());
    WaitAll(g);
  }
  dup2(saved, 1);
  close(saved);
  std::string out = Read(console);
  EXPECT_THAT(out, HasSubstr("to-stdout\n"));
  EXPECT_THAT(out, HasSubstr("to-stderr\n"));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("not-echoed")));
  std::string log = Read(dir + "/workerlog.0");
  EXPECT_THAT(log, HasSubstr("to-stdout\n"));
  EXPECT_THAT(log, HasSubstr("to-stderr\n"));
}

// Several workers on one console (--tee): every console line carries its worker's prefix and
// is whole, however the worker wrote it; the logs stay as written.
TEST(WorkerGroup, EchoPrefixesWholeLines) {
  std::string dir = TempDir();
  fflush(stdout);
  int saved = dup(1);
  int fd = open((dir + "/console").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  dup2(fd, 1);
  close(fd);
  {
    WorkerGroup g;
    std::vector<WorkerSpec> specs;
    for (int r : {0, 1}) {
      // A line written in pieces, then a last line without a newline.
      WorkerSpec s = Shell(r, dir, absl::StrCat("printf 'part-a-", r, " '; printf 'part-b-", r,
                                                "\\n'; printf 'unterminated-", r, "'"));
      s.echo = true;
      s.echo_prefix = absl::StrCat("[default", r, "]:");
      specs.push_back(s);
    }
    ASSERT_TRUE(g.Start(specs).ok());
    std::vector<WorkerExit> exits = WaitAll(g);
    ASSERT_EQ(exits.size(), 2u);
  }
  dup2(saved, 1);
  close(saved);
  std::vector<std::string> lines = absl::StrSplit(Read(dir + "/console"), '\n', absl::SkipEmpty());
  EXPECT_THAT(lines, ::testing::UnorderedElementsAre(
                         "[default0]:part-a-0 part-b-0", "[default0]:unterminated-0",
                         "[default1]:part-a-1 part-b-1", "[default1]:unterminated-1"));
  EXPECT_EQ(Read(dir + "/workerlog.0"), "part-a-0 part-b-0\nunterminated-0");
}

TEST(WorkerGroup, EchoThroughATerminalWhenAsked) {
  std::string dir = TempDir();
  fflush(stdout);
  int saved = dup(1);
  int fd = open((dir + "/console").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  dup2(fd, 1);
  close(fd);
  {
    WorkerGroup g;
    std::vector<WorkerSpec> specs;
    for (bool tty : {false, true}) {
      WorkerSpec s = Shell(tty, dir, "if [ -t 1 ]; then echo on-a-tty; else echo not-a-tty; fi; echo done >&2");
      s.echo = true;
      s.echo_tty = tty;
      specs.push_back(s);
    }
    ASSERT_TRUE(g.Start(specs).ok());
    std::vector<WorkerExit> exits = WaitAll(g);
    ASSERT_EQ(exits.size(), 2u);
    for (const WorkerExit& e : exits) EXPECT_TRUE(e.ok());
  }
  dup2(saved, 1);
  close(saved);
  // Lines arrive as written: no carriage returns added by the terminal.
  EXPECT_EQ(Read(dir + "/workerlog.0"), "not-a-tty\ndone\n");
  EXPECT_EQ(Read(dir + "/workerlog.1"), "on-a-tty\ndone\n");
  EXPECT_THAT(Read(dir + "/console"), HasSubstr("on-a-tty\ndone\n"));
}

TEST(WorkerGroup, AppendKeepsTheEarlierAttempt) {
  std::string dir = TempDir();
  for (const char* word : {"first", "second"}) {
    WorkerGroup g;
    WorkerSpec s = Shell(0, dir, absl::StrCat("echo ", word));
    s.append_log = std::string(word) == "second";
    ASSERT_TRUE(g.Start({s}).ok());
    WaitAll(g);
  }
  EXPECT_EQ(Read(dir + "/workerlog.0"), "first\nsecond\n");
}

TEST(LastLines, TakesTheEndAndTheLastVersionOfRewrittenLines) {
  std::string dir = TempDir();
  std::string path = dir + "/log";
  {
    std::ofstream f(path);
    for (int i = 1; i <= 15; ++i) f << "line " << i << "\n";
    f << "\rstep 1\033[K\rstep 2\033[K\n";
  }
  EXPECT_THAT(LastLines(path, 3), ElementsAre("line 14", "line 15", "step 2"));
  EXPECT_EQ(LastLines(path, 100).size(), 16u);
  EXPECT_TRUE(LastLines(dir + "/missing", 3).empty());
  EXPECT_TRUE(LastLines(path, 0).empty());
}

TEST(LastLines, HugeLogReadsOnlyItsEnd) {
  std::string path = TempDir() + "/big";
  {
    std::ofstream f(path);
    std::string filler(1000, 'x');
    for (int i = 0; i < 2000; ++i) f << filler << "\n";  // 2 MB
    f << "the end\n";
  }
  std::vector<std::string> tail = LastLines(path, 2);
  ASSERT_EQ(tail.size(), 2u);
  EXPECT_EQ(tail[1], "the end");
  EXPECT_EQ(tail[0].size(), 1000u);
}

TEST(DescribeWaitStatus, Forms) {
  EXPECT_EQ(DescribeWaitStatus(0), "exited with code 0");
  EXPECT_EQ(DescribeWaitStatus(2 << 8), "exited with code 2");
  EXPECT_EQ(DescribeWaitStatus(SIGKILL), "was killed by signal 9 (SIGKILL: Killed)");
}

}  // namespace
}  // namespace braid::launcher
