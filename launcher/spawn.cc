#include "launcher/spawn.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "launcher/launcher_main.h"

namespace braid {
namespace {

bool EnvInt(const char* name, int* out) {
  const char* v = std::getenv(name);
  return v != nullptr && absl::SimpleAtoi(v, out);
}

[[noreturn]] void Refuse(const std::string& msg) {
  std::fprintf(stderr, "braid::Spawn: %s\n", msg.c_str());
  std::fflush(nullptr);
  _exit(2);  // the launcher's code for a job that could not start
}

// The running program's own file: the workers run it again. /proc/self/exe, not argv[0]: the
// program may have been found on $PATH or started from another folder.
std::string SelfExe() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) Refuse("cannot read /proc/self/exe to find this program's file to run as workers");
  return std::string(buf, static_cast<size_t>(n));
}

// This process's arguments after its name, as it was started.
std::vector<std::string> OwnArgs() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  size_t start = 0;
  while (start < all.size()) {
    size_t end = all.find('\0', start);
    if (end == std::string::npos) end = all.size();
    args.push_back(all.substr(start, end - start));
    start = end + 1;
  }
  if (!args.empty()) args.erase(args.begin());
  return args;
}

}  // namespace

std::optional<WorkerInfo> WorkerInfo::FromEnvironment() {
  WorkerInfo w;
  // BRAID_RESTART_COUNT is set by a launcher only: a RANK left in a shell is not a launcher's.
  if (!EnvInt("BRAID_RESTART_COUNT", &w.restart_count) || !EnvInt("RANK", &w.rank) ||
      !EnvInt("WORLD_SIZE", &w.world_size)) {
    return std::nullopt;
  }
  if (!EnvInt("LOCAL_RANK", &w.local_rank)) w.local_rank = w.rank;
  if (!EnvInt("LOCAL_WORLD_SIZE", &w.local_world_size)) w.local_world_size = w.world_size;
  return w;
}

int Spawn(int nprocs, const std::function<int(const WorkerInfo&)>& fn, const SpawnOptions& options) {
  // Started by a launcher (this Spawn's, or the launcher's --program): be the worker. The
  // launcher's layout is the job's; nprocs applies only to a job Spawn starts.
  if (std::optional<WorkerInfo> worker = WorkerInfo::FromEnvironment()) return fn(*worker);
  if (nprocs < 1) {
    Refuse(absl::StrCat("nprocs must be at least 1, got ", nprocs, "; pass the number of worker "
                        "processes to start on this machine"));
  }
  if (options.max_restarts < 0) {
    Refuse(absl::StrCat("SpawnOptions::max_restarts must be 0 or more, got ", options.max_restarts));
  }
  const std::string exe = SelfExe();
  // The launcher's own command line: its flag parser checks the extra flags (an unknown one is
  // refused with a "did you mean" before any worker starts).
  std::vector<std::string> argv = {exe, "--standalone", absl::StrCat("--nproc_per_node=", nprocs),
                                   absl::StrCat("--program=", exe)};
  if (!options.log_dir.empty()) argv.push_back(absl::StrCat("--log_dir=", options.log_dir));
  if (options.max_restarts > 0) argv.push_back(absl::StrCat("--max_restarts=", options.max_restarts));
  for (const std::string& f : options.launcher_flags) argv.push_back(f);
  argv.push_back("--");
  for (const std::string& a : options.args ? *options.args : OwnArgs()) argv.push_back(a);
  std::vector<char*> cargv;
  for (std::string& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  return launcher::LauncherMain(static_cast<int>(argv.size()), cargv.data());
}

}  // namespace braid
