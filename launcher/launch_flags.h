// The launcher's command line: Braid's own flags and torchrun's spellings of them, and the
// training program's flags that may stand before "--". Pure functions, unit-tested in
// launch_flags_test.cc (with console_choice.h and host_facts.h, which the flags use); the layout
// those flags and the environment give is launch_plan.h's business.
#ifndef BRAID_LAUNCHER_LAUNCH_FLAGS_H_
#define BRAID_LAUNCHER_LAUNCH_FLAGS_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "launcher/console_choice.h"
#include "launcher/host_facts.h"

namespace braid::launcher {

// kMpi: whichever MPI started this process (Open MPI's or a Hydra mpiexec's variables);
// kOpenMpi and kMpich are what kAuto and kMpi resolve to (launch_plan.cc).
enum class SchedulerMode { kAuto, kNone, kSlurm, kMpi, kOpenMpi, kMpich, kTorchEnv };

struct LaunchFlags {
  int nnodes = 1, node_rank = 0, nproc_per_node = 1;
  // --nnodes=MIN:MAX: nnodes is MAX, nnodes_min MIN (equal for --nnodes=N): launcher/elastic.h.
  int nnodes_min = 1;
  double rdzv_last_call_s = 30;  // elastic: how long a round waits for more once MIN are in
  // "auto", "cpu" or "gpu" until ResolveNprocPerNode turns it into nproc_per_node; "" = a number.
  std::string nproc_per_node_kind;
  bool nproc_resolved = false;  // ResolveNprocPerNode ran on nproc_per_node_kind
  std::string master_addr;  // "" = from the environment or the scheduler, else 127.0.0.1
  int master_port = 0;      // 0 = not given
  bool standalone = false;  // torchrun --standalone: one node, a free port on this machine
  std::string rdzv_backend = "static";  // static or c10d: both mean Braid's own store
  std::string rdzv_id = "none";  // the job's id: every launcher of a job must give the same
  std::string role = "default";  // torchrun's worker role (ROLE_NAME, the console prefix)
  std::string log_dir;      // "" = the default (runs/<config>-<time>)
  int max_restarts = 0;
  std::string program;      // "" = //launcher:train
  SchedulerMode scheduler = SchedulerMode::kAuto;
  std::string job_token_file;  // "" = BRAID_JOB_TOKEN or a generated/shared token; "-" = stdin
  // DeepSpeed's hostfile launcher (hostfile_launch.h): start one launcher per host over ssh.
  std::string hostfile, include, exclude;  // include/exclude: "host:slot,slot@host"
  int ssh_port = 0;         // 0 = ssh's own default
  bool watch_stdin = false;  // end of standard input stops the job (a node of a hostfile job)
  double connect_timeout_s = 120;  // reaching the master's store
  double rdzv_timeout_s = 300;     // every node checking in (per attempt)
  double stop_grace_s = 10;        // SIGTERM -> SIGKILL
  double heartbeat_timeout_s = 60;  // a silent launcher of another node counts as failed
  int tail_lines = 10;
  ConsoleSpec console;
  bool help = false;
  bool dry_run = false;  // print the plan and exit: what each node/pod would do
  // Which of the flags above were given (by canonical name, without "--"), and where each value
  // came from: "--nnodes" for the command line, or the environment variable ("PET_NNODES",
  // "JOB_COMPLETION_INDEX") that supplied it (launch_plan.cc).
  std::vector<std::string> given;
  std::map<std::string, std::string> origin;
  // Everything for the program: the training program's flags before "--" (canonical spelling)
  // and every argument after "--" (or after a positional program), in order.
  std::vector<std::string> program_args;
  // The text each launcher flag had on the command line (by canonical name; "true" for a bare
  // bool flag), so that the hostfile launcher can pass the same flags on to every node.
  std::map<std::string, std::string> command_line;

  bool Given(const std::string& name) const;
  bool Elastic() const { return nnodes_min < nnodes; }
  // How to name the source of a flag's value in a message: "--nnodes" or "PET_NNODES".
  std::string Origin(const std::string& name) const;
};

// Parses argv[1..]. Flag names may use '-' or '_' ("--nproc-per-node"); values follow '=' or
// come as the next argument. Before "--" the launcher accepts its own flags, torchrun's, and the
// training program's own flags (--config, --steps, ...: passed on unchanged when the program is
// the training program); anything else is an error with a "did you mean". The first positional
// argument names the program (as torchrun's training script), and every argument after it is
// the program's. Everything after "--" is the program's.
absl::StatusOr<LaunchFlags> ParseLaunchFlags(const std::vector<std::string>& args);

// Sets one flag from text, as the command line would; `origin` names the source in messages
// ("--nnodes" or "PET_NNODES"). Used for torchrun's PET_* variables (launch_plan.cc).
absl::Status SetLaunchFlag(LaunchFlags* f, const std::string& name, const std::string& value,
                           const std::string& origin);

// A flag's value as text, for comparing two sources of it ("" for flags that have none).
std::string LaunchFlagValue(const LaunchFlags& f, const std::string& name);

// The training program's flags that may stand before "--" (//launcher:train's own).
const std::vector<std::string>& TrainingProgramFlags();

// The usage text (`launcher --help`).
std::string LauncherUsage();

// Turns --nproc_per_node=auto|cpu|gpu into a number, as torchrun: auto = one per GPU when
// there are GPUs, else one per CPU; gpu = one per GPU (an error without one); cpu = one per CPU.
absl::Status ResolveNprocPerNode(LaunchFlags* f, const HostFacts& host);

}  // namespace braid::launcher

#endif  // BRAID_LAUNCHER_LAUNCH_FLAGS_H_
