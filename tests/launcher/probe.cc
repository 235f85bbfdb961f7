// A worker for the launcher's tests: checks the environment contract the launcher promises,
// records it (and its pid) in files the test reads back, then does what the test asks: crash,
// sleep, ignore SIGTERM, leave a child process behind, or exchange values with every other rank
// through the rendezvous store.
//
//   probe --out_dir=D [--lines=N] [--crash_rank=R --crash=exit3|segv --crash_after_ms=MS
//         --crash_attempts=K] [--sleep_s=S] [--ignore_sigterm] [--spawn_child] [--exchange]
//
// The pid file out_dir/pid.RANK.RESTART is written only once the probe is set up (SIGTERM ignored,
// child spawned): a test may signal it as soon as the file exists. A crash's MS count from the
// moment every rank's pid file exists.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "backends/store/tcp_store.h"

namespace {

[[noreturn]] void Fail(const std::string& msg) {
  std::fprintf(stderr, "probe: FAIL: %s\n", msg.c_str());
  std::fflush(nullptr);
  std::exit(10);
}

int EnvInt(const char* name) {
  const char* v = std::getenv(name);
  if (!v) Fail(absl::StrCat(name, " is not set"));
  int out;
  if (!absl::SimpleAtoi(v, &out)) Fail(absl::StrCat(name, "='", v, "' is not an integer"));
  return out;
}

std::string EnvStr(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) Fail(absl::StrCat(name, " is not set"));
  return v;
}

void WriteFile(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    f << text;
    if (!f) Fail(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) Fail(absl::StrCat("cannot rename to ", path));
}

std::string Flag(int argc, char** argv, const char* name, const std::string& def = "") {
  std::string prefix = absl::StrCat("--", name, "=");
  for (int i = 1; i < argc; ++i) {
    if (absl::StartsWith(argv[i], prefix)) return argv[i] + prefix.size();
    if (std::string(argv[i]) == absl::StrCat("--", name)) return "1";
  }
  return def;
}

void Exchange(int rank, int world, int restart) {
  auto store = braid::ConnectStoreFromEnv(absl::Seconds(30));
  if (!store.ok()) Fail(absl::StrCat("cannot reach the store: ", store.status().message()));
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  // Keys per attempt: a restarted group must not see the previous group's values.
  std::string p = absl::StrCat("probe/", restart, "/");
  if (auto st = (*store)->Set(absl::StrCat(p, "rank", rank), absl::StrCat(rank * rank + 1)); !st.ok()) {
    Fail(absl::StrCat("store Set: ", st.message()));
  }
  auto arrived = (*store)->Add(p + "arrived", 1);
  if (!arrived.ok()) Fail(absl::StrCat("store Add: ", arrived.status().message()));
  if (*arrived == world) (void)(*store)->Set(p + "all", "1");
  if (auto st = (*store)->Wait({p + "all"}, absl::Seconds(60)); !st.ok()) {
    Fail(absl::StrCat("waiting for every rank: ", st.message()));
  }
  // Every rank reads every rank's value: the same sum everywhere, computed independently.
  long sum = 0;
  for (int r = 0; r < world; ++r) {
    auto v = (*store)->Get(absl::StrCat(p, "rank", r), absl::Seconds(10));
    long x;
    if (!v.ok() || !absl::SimpleAtoi(*v, &x)) Fail(absl::StrCat("cannot read rank ", r, "'s value"));
    if (x != long{r} * r + 1) Fail(absl::StrCat("rank ", r, "'s value is ", x));
    sum += x;
  }
  std::printf("probe: rank %d on %s: exchange ok, sum %ld over %d ranks\n", rank, host, sum, world);
  std::fflush(stdout);
  // Leave only when everyone has read: the store stays up until then.
  auto left = (*store)->Add(p + "read", 1);
  if (left.ok() && *left == world) (void)(*store)->Set(p + "read_all", "1");
  if (auto st = (*store)->Wait({p + "read_all"}, absl::Seconds(60)); !st.ok()) {
    Fail(absl::StrCat("final barrier: ", st.message()));
  }
}

// Returns once every rank of this attempt has written its pid file (30 s at most), so that a
// crash never comes before a slow-starting rank has even begun: the test then knows every worker
// ran, whatever the load on the machine.
void WaitForEveryRank(const std::string& out, int world, int restart) {
  absl::Time deadline = absl::Now() + absl::Seconds(30);
  for (int r = 0; r < world; ++r) {
    std::string path = absl::StrCat(out, "/pid.", r, ".", restart);
    while (access(path.c_str(), F_OK) != 0) {
      if (absl::Now() > deadline) return;
      absl::SleepFor(absl::Milliseconds(10));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  int rank = EnvInt("RANK"), local_rank = EnvInt("LOCAL_RANK"), world = EnvInt("WORLD_SIZE");
  int local_world = EnvInt("LOCAL_WORLD_SIZE"), node = EnvInt("NODE_RANK"), port = EnvInt("MASTER_PORT");
  int restart = EnvInt("BRAID_RESTART_COUNT");
  std::string addr = EnvStr("MASTER_ADDR"), token = EnvStr("BRAID_JOB_TOKEN");
  // The contract: ranks numbered node by node, everything in range.
  if (!(0 <= rank && rank < world)) Fail(absl::StrCat("RANK=", rank, " outside WORLD_SIZE=", world));
  if (!(0 <= local_rank && local_rank < local_world)) Fail("LOCAL_RANK outside LOCAL_WORLD_SIZE");
  if (world % local_world != 0) Fail("WORLD_SIZE is not a multiple of LOCAL_WORLD_SIZE");
  if (rank != node * local_world + local_rank) {
    Fail(absl::StrCat("RANK=", rank, " but NODE_RANK*LOCAL_WORLD_SIZE+LOCAL_RANK=",
                      node * local_world + local_rank));
  }
  if (port <= 0 || port > 65535) Fail("MASTER_PORT out of range");
  if (token.size() < 16) Fail("BRAID_JOB_TOKEN is too short");
  if (getpgrp() != getpid()) Fail("the worker is not the leader of its own process group");

  std::string out = Flag(argc, argv, "out_dir");
  if (out.empty()) Fail("--out_dir is required");
  // Everything the test relies on is set up before the pid file is written: the pid file is the
  // signal that this worker (and its child) is ready to be signalled, no sleep needed.
  std::string child_pid;
  if (Flag(argc, argv, "spawn_child") == "1") {
    pid_t c = fork();
    if (c == 0) {
      // A grandchild of the launcher in the worker's group: it must not outlive the job.
      for (int i = 0; i < 600; ++i) sleep(1);
      _exit(0);
    }
    child_pid = absl::StrCat(" ", c);
  }
  // After the fork: the child keeps the default disposition, as before.
  if (Flag(argc, argv, "ignore_sigterm") == "1") signal(SIGTERM, SIG_IGN);
  WriteFile(absl::StrCat(out, "/pid.", rank, ".", restart), absl::StrCat(getpid(), child_pid, "\n"));
  WriteFile(absl::StrCat(out, "/env.", rank, ".", restart),
            absl::StrCat("RANK=", rank, " LOCAL_RANK=", local_rank, " WORLD_SIZE=", world,
                         " LOCAL_WORLD_SIZE=", local_world, " NODE_RANK=", node, " MASTER_ADDR=",
                         addr, " MASTER_PORT=", port, " TOKEN_LEN=", token.size(), " RESTART=",
                         restart, "\n"));
  std::printf("probe: rank %d (local %d of %d, node %d) of %d, master %s:%d, restart %d\n", rank,
              local_rank, local_world, node, world, addr.c_str(), port, restart);
  int lines = 0;
  absl::SimpleAtoi(Flag(argc, argv, "lines", "0"), &lines);
  for (int i = 1; i <= lines; ++i) std::printf("probe: rank %d line %d\n", rank, i);
  std::fflush(stdout);

  if (Flag(argc, argv, "exchange") == "1") Exchange(rank, world, restart);

  int crash_rank = -1, crash_after_ms = 0, crash_attempts = 1000000;
  absl::SimpleAtoi(Flag(argc, argv, "crash_rank", "-1"), &crash_rank);
  absl::SimpleAtoi(Flag(argc, argv, "crash_after_ms", "0"), &crash_after_ms);
  absl::SimpleAtoi(Flag(argc, argv, "crash_attempts", "1000000"), &crash_attempts);
  if (rank == crash_rank && restart < crash_attempts) {
    WaitForEveryRank(out, world, restart);
    absl::SleepFor(absl::Milliseconds(crash_after_ms));
    std::string how = Flag(argc, argv, "crash", "exit3");
    std::fprintf(stderr, "probe: rank %d crashing on purpose (%s)\n", rank, how.c_str());
    std::fflush(nullptr);
    if (how == "segv") {
      signal(SIGSEGV, SIG_DFL);
      raise(SIGSEGV);
    }
    std::exit(3);
  }
  double sleep_s = 0;
  absl::SimpleAtod(Flag(argc, argv, "sleep_s", "0"), &sleep_s);
  absl::SleepFor(absl::Seconds(sleep_s));
  std::printf("probe: rank %d done\n", rank);
  return 0;
}
