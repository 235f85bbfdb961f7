// The Braid launcher: starts the workers of one node, gives each the rank environment, serves
// (node 0) the rendezvous store, and watches the job with the launchers of the other nodes.
//
//   bazel run //launcher -- [--nnodes=N --node_rank=K --nproc_per_node=P --master_addr=A
//                            --master_port=Q --log_dir=D --max_restarts=R --program=PATH]
//                           [--] <arguments for the program, e.g. --config=FILE>
//
// docs/LAUNCHING.md is the user's guide; `launcher --help` lists the flags (launch_flags.h
// parses them, launch_plan.h turns them and the environment into the job's layout, and
// node_launcher.h runs this node's part of the job).
#include "launcher/launcher_main.h"

#include <errno.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "launcher/hostfile_launch.h"
#include "launcher/job_token.h"
#include "launcher/launch_flags.h"
#include "launcher/launch_plan.h"
#include "launcher/launcher_signals.h"
#include "launcher/node_launcher.h"
#include "launcher/programs.h"
#include "launcher/run_folder.h"

namespace braid::launcher {
namespace {
// or it or the connection is gone: stop as on SIGTERM, which tells the other nodes too.
void WatchStdin(int node_rank) {
  std::thread([node_rank] {
    char buf[256];
    while (true) {
      ssize_t n = read(STDIN_FILENO, buf, sizeof buf);
      if (n > 0 || (n < 0 && errno == EINTR)) continue;
      break;
    }
    Say(absl::StrCat("node ", node_rank, ": standard input closed: the hostfile launcher on the "
                     "first host is stopping the job, or it or its ssh connection went away; "
                     "stopping"));
    kill(getpid(), SIGTERM);
  }).detach();
}

int Main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  absl::StatusOr<LaunchFlags> flags = ParseLaunchFlags(args);
  if (!flags.ok()) Die(absl::StrCat(flags.status().message(), " (launcher --help lists the flags)"));
  if (flags->help) {
    std::printf("%s", LauncherUsage().c_str());
    return 0;
  }
  // DeepSpeed's hostfile launcher: this launcher starts one per node (hostfile_launch.h).
  if (!flags->hostfile.empty()) return HostfileMain(*flags, argv[0]);
  const EnvMap env = CurrentEnvironment();
  flags = FlagsWithEnvironment(*std::move(flags), env, DetectHost(env));
  if (!flags.ok()) Die(std::string(flags.status().message()));
  absl::StatusOr<LaunchPlan> plan = MakeLaunchPlan(*flags, env);
  if (!plan.ok()) Die(std::string(plan.status().message()));
  if (absl::Status st = CheckElasticLayout(*flags, *plan); !st.ok()) Die(std::string(st.message()));
  if (flags->dry_run) {
    std::printf("%s", DescribePlan(*plan).c_str());
    return 0;
  }
  // Before anything is made: a missing or wrong token file stops the launcher with nothing left.
  absl::StatusOr<std::string> token = ChooseJobToken(
      flags->job_token_file.empty() || flags->job_token_file == "-" ? flags->job_token_file
                                                                     : ResolveUserPath(flags->job_token_file),
      std::getenv("BRAID_JOB_TOKEN"),
      {plan->num_launchers, plan->master_addr, plan->master_port, plan->describe});
  if (!token.ok()) Die(std::string(token.status().message()));

  // The run folder (worker logs, and the training program's metrics and train.log): --log_dir,
  // else runs/<config>-<time>, agreed by the launchers once they share the store.
  std::string log_dir = flags->log_dir;
  if (!log_dir.empty()) {
    log_dir = Absolute(ResolveUserPath(log_dir));
    if (absl::Status st = MakeDirs(log_dir); !st.ok()) Die(absl::StrCat("--log_dir: ", st.message()));
  }

  std::vector<std::string> program_argv;
  const bool default_program = flags->program.empty();
  TrainingProgram program;
  if (default_program) {
    absl::StatusOr<TrainingProgram> found = FindTrainingProgram(argv[0]);
    if (!found.ok()) Die(std::string(found.status().message()));
    program = *std::move(found);
  } else {
    absl::StatusOr<std::string> found = FindProgram(flags->program);
    if (!found.ok()) Die(std::string(found.status().message()));
    program.path = *found;
  }
  program_argv.push_back(program.path);
  bool program_has_log_dir = false;
  for (const std::string& a : flags->program_args) {
    std::string arg = a;
    if (default_program) {
      for (const char* path_flag : {"--config=", "--init_from=", "--save_to=", "--log_dir="}) {
        if (absl::StartsWith(a, path_flag)) {
          arg = absl::StrCat(path_flag, ResolveUserPath(a.substr(strlen(path_flag))));
        }
      }
      program_has_log_dir |= absl::StartsWith(a, "--log_dir=");
    }
    program_argv.push_back(arg);
  }
  // The training program's metrics and train.log go beside the worker logs when the user chose
  // the folder (a config's log.dir then gives way); otherwise beside them too, unless the
  // config's log.dir names another folder (the program reads $BRAID_RUN_DIR after log.dir).
  if (default_program && flags->Given("log_dir") && !program_has_log_dir) {
    program_argv.push_back(absl::StrCat("--log_dir=", log_dir));
  }
  std::string config_path;
  for (size_t i = 0; i < flags->program_args.size(); ++i) {
    const std::string& a = flags->program_args[i];
    if (absl::StartsWith(a, "--config=")) config_path = a.substr(strlen("--config="));
    if (a == "--config" && i + 1 < flags->program_args.size()) config_path = flags->program_args[i + 1];
  }
  const std::string run_name = RunFolderName(
      config_path, default_program ? kReferenceRunName : program.path.substr(program.path.rfind('/') + 1),
      absl::Now());

  if (plan->num_launchers > 1 && plan->master_addr_defaulted) {
    Say(absl::StrCat("no --master_addr given: node 0 is this machine (", plan->master_addr, ":",
                     plan->master_port, "). For nodes on several machines, pass "
                     "--master_addr=<node 0's address> to every launcher."));
  }
  const bool watch_stdin = flags->watch_stdin;
  const int node_rank = plan->node_rank;
  Launcher launcher(*std::move(flags), *std::move(plan), std::move(program_argv),
                    std::move(program.env), log_dir, run_name, *token);
  // After the launcher blocked its stop signals (in every thread to come): the watcher's
  // SIGTERM is then read by the launcher's loop like any other.
  if (watch_stdin) WatchStdin(node_rank);
  return launcher.Run();
}

}  // namespace

int LauncherMain(int argc, char** argv) { return Main(argc, argv); }

}  // namespace braid::launcher
