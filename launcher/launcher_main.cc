// The Braid launcher: sets up the rank environment and runs the training program.
//
//   bazel run //launcher -- [--nnodes=1 --node_rank=0 --nproc_per_node=1
//                            --master_addr=127.0.0.1 --master_port=29500] [--config=FILE] [...]
//
// Everything it does not know is passed on to the training program (//launcher:train). In this
// release one process per job is supported; the rank flags are parsed and checked so configs and
// scripts written now keep working when multi-process launch lands.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "tools/cpp/runfiles/runfiles.h"

namespace {

using bazel::tools::cpp::runfiles::Runfiles;

pid_t g_child = -1;

void Forward(int sig) {
  if (g_child > 0) kill(g_child, sig);
}

[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "braid launcher: %s\n", msg.c_str());
  std::exit(2);
}

struct Flags {
  int nnodes = 1, node_rank = 0, nproc_per_node = 1, master_port = 29500;
  std::string master_addr = "127.0.0.1";
  std::vector<std::string> passthrough;
};

bool TakeInt(const std::string& arg, const char* name, int* out) {
  std::string prefix = absl::StrCat("--", name, "=");
  if (!absl::StartsWith(arg, prefix)) return false;
  if (!absl::SimpleAtoi(arg.substr(prefix.size()), out)) {
    Die(absl::StrCat("--", name, " wants an integer, got '", arg.substr(prefix.size()), "'"));
  }
  return true;
}

Flags Parse(int argc, char** argv) {
  Flags f;
  bool rest = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (rest) {
      f.passthrough.push_back(a);
    } else if (a == "--") {
      rest = true;
    } else if (TakeInt(a, "nnodes", &f.nnodes) || TakeInt(a, "node_rank", &f.node_rank) ||
               TakeInt(a, "nproc_per_node", &f.nproc_per_node) ||
               TakeInt(a, "master_port", &f.master_port)) {
    } else if (absl::StartsWith(a, "--master_addr=")) {
      f.master_addr = a.substr(strlen("--master_addr="));
    } else if (a == "--help" || a == "-h") {
      std::printf(
          "usage: launcher [--nnodes=N --node_rank=K --nproc_per_node=P --master_addr=A "
          "--master_port=Q] [--config=FILE] [training flags]\n"
          "Training flags are those of //launcher:train (run it with --help).\n");
      std::exit(0);
    } else {
      f.passthrough.push_back(a);
    }
  }
  if (f.nnodes < 1 || f.nproc_per_node < 1) Die("--nnodes and --nproc_per_node must be >= 1");
  if (f.node_rank < 0 || f.node_rank >= f.nnodes) {
    Die(absl::StrCat("--node_rank=", f.node_rank, " is outside [0, --nnodes=", f.nnodes, ")"));
  }
  if (f.master_port <= 0 || f.master_port > 65535) Die("--master_port must be in 1..65535");
  if (f.nnodes * f.nproc_per_node > 1) {
    Die(absl::StrCat("a world of ", f.nnodes * f.nproc_per_node,
                     " processes was asked for, but this build launches one process per job "
                     "(multi-process and multi-node launch arrive with the Gloo communicator); "
                     "use --nnodes=1 --nproc_per_node=1"));
  }
  return f;
}

// bazel run starts us inside the runfiles tree; a relative --config means the user's checkout.
std::string ResolveUserPath(const std::string& flag_value) {
  if (flag_value.empty() || flag_value[0] == '/') return flag_value;
  if (access(flag_value.c_str(), R_OK) == 0) return flag_value;
  const char* ws = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  if (ws) return absl::StrCat(ws, "/", flag_value);
  return flag_value;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f = Parse(argc, argv);
  std::string error;
  std::unique_ptr<Runfiles> rf(Runfiles::Create(argv[0], &error));
  std::string trainer;
  if (rf) trainer = rf->Rlocation("braid/launcher/train");
  if (trainer.empty() || access(trainer.c_str(), X_OK) != 0) {
    // Installed layout: the training program next to the launcher.
    std::string self = argv[0];
    trainer = self.substr(0, self.rfind('/') + 1) + "train";
  }
  if (access(trainer.c_str(), X_OK) != 0) {
    Die(absl::StrCat("cannot find the training program (looked for ", trainer,
                     "); build it with bazel build //launcher:all"));
  }
  std::vector<std::string> args = {trainer};
  for (const std::string& a : f.passthrough) {
    for (const char* path_flag : {"--config=", "--init_from=", "--save_to=", "--log_dir="}) {
      if (absl::StartsWith(a, path_flag)) {
        args.push_back(absl::StrCat(path_flag, ResolveUserPath(a.substr(strlen(path_flag)))));
        goto next;
      }
    }
    args.push_back(a);
  next:;
  }
  int rank = f.node_rank * f.nproc_per_node;
  setenv("RANK", std::to_string(rank).c_str(), 1);
  setenv("LOCAL_RANK", "0", 1);
  setenv("WORLD_SIZE", std::to_string(f.nnodes * f.nproc_per_node).c_str(), 1);
  setenv("LOCAL_WORLD_SIZE", std::to_string(f.nproc_per_node).c_str(), 1);
  setenv("NODE_RANK", std::to_string(f.node_rank).c_str(), 1);
  setenv("MASTER_ADDR", f.master_addr.c_str(), 1);
  setenv("MASTER_PORT", std::to_string(f.master_port).c_str(), 1);
  const char* ws = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  if (ws && !std::getenv("BRAID_DATA_DIR")) setenv("BRAID_DATA_DIR", absl::StrCat(ws, "/data").c_str(), 1);

  std::vector<char*> cargs;
  for (std::string& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  g_child = fork();
  if (g_child < 0) Die(absl::StrCat("fork failed: ", strerror(errno)));
  if (g_child == 0) {
    execv(cargs[0], cargs.data());
    std::fprintf(stderr, "braid launcher: cannot run %s: %s\n", cargs[0], strerror(errno));
    _exit(127);
  }
  struct sigaction sa = {};
  sa.sa_handler = Forward;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  int status = 0;
  while (waitpid(g_child, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) {
    int code = WEXITSTATUS(status);
    if (code != 0) std::fprintf(stderr, "braid launcher: rank %d exited with code %d\n", rank, code);
    return code;
  }
  if (WIFSIGNALED(status)) {
    std::fprintf(stderr, "braid launcher: rank %d was killed by signal %d (%s)\n", rank,
                 WTERMSIG(status), strsignal(WTERMSIG(status)));
    return 128 + WTERMSIG(status);
  }
  return 1;
}
