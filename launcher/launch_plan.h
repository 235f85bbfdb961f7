// What one launcher process has to do: its flags, the rank layout (from flags, Slurm or Open MPI)
// and the workers it starts. Pure functions of the command line and the environment, so that the
// layout rules are unit-tested without starting anything.
#ifndef BRAID_LAUNCHER_LAUNCH_PLAN_H_
#define BRAID_LAUNCHER_LAUNCH_PLAN_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace braid::launcher {

using EnvMap = std::map<std::string, std::string>;

// The environment of this process as a map (for the functions below).
EnvMap CurrentEnvironment();

enum class SchedulerMode { kAuto, kNone, kSlurm, kOpenMpi };

struct LaunchFlags {
  int nnodes = 1, node_rank = 0, nproc_per_node = 1;
  std::string master_addr;  // "" = from the environment or the scheduler, else 127.0.0.1
  int master_port = 0;      // 0 = not given
  std::string log_dir;      // "" = the default (see DefaultLogDir)
  int max_restarts = 0;
  std::string program;      // "" = //launcher:train
  SchedulerMode scheduler = SchedulerMode::kAuto;
  double connect_timeout_s = 120;  // reaching the master's store
  double rdzv_timeout_s = 300;     // every node checking in (per attempt)
  double stop_grace_s = 10;        // SIGTERM -> SIGKILL
  double heartbeat_timeout_s = 60;  // a silent launcher of another node counts as failed
  int tail_lines = 10;
  bool help = false;
  // Which of the flags above were given (by name, without "--").
  std::vector<std::string> given;
  // Everything for the program: unknown flags before "--" and all arguments after it.
  std::vector<std::string> program_args;

  bool Given(const std::string& name) const;
};

// Parses argv[1..]. Flags the launcher knows are consumed before "--"; anything else before
// "--" (e.g. --config=FILE) and everything after it goes to the program unchanged.
absl::StatusOr<LaunchFlags> ParseLaunchFlags(const std::vector<std::string>& args);

extern const char kLauncherUsage[];

// Where the layout came from; named in messages so a user knows which numbers to fix.
enum class LayoutSource { kFlags, kSlurm, kOpenMpi };
const char* LayoutSourceName(LayoutSource s);

struct WorkerPlan {
  int rank = 0, local_rank = 0;
};

// The job as this launcher sees it. "Launchers" are the peers that check in with one another
// through the rendezvous store: one per node when the launcher spawns the workers of its node,
// one per worker when a scheduler (Slurm, mpirun) started every worker's launcher itself.
struct LaunchPlan {
  LayoutSource source = LayoutSource::kFlags;
  int world_size = 1;
  int nnodes = 1, node_rank = 0;
  int local_world_size = 1;  // workers on this node (LOCAL_WORLD_SIZE)
  int num_launchers = 1, launcher_id = 0;  // launcher 0 serves the store
  std::vector<WorkerPlan> workers;  // the workers this launcher starts
  std::string master_addr;
  int master_port = 29500;
  bool master_addr_defaulted = false;  // none given: 127.0.0.1, every node on this machine
  bool master_port_given = false;  // false: node 0 may pick a free port (single launcher only)
  std::string describe;  // e.g. "--nnodes=2 --nproc_per_node=4" or "Slurm: SLURM_NTASKS=8"
};

// Combines flags and environment (Slurm: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
// SLURM_NODEID, SLURM_NNODES, SLURM_TASKS_PER_NODE, SLURM_JOB_NODELIST; Open MPI:
// OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE; Open MPI names no node index, so the
// node rank assumes ranks placed node by node, mpirun's default).
// Under a scheduler, one launcher runs one worker, unless --nproc_per_node is given: then the
// scheduler must have started one task per node and gives only the node rank and count.
absl::StatusOr<LaunchPlan> MakeLaunchPlan(const LaunchFlags& flags, const EnvMap& env);

// The first host of a Slurm node list: "gpu[07-09,12],cpu1" -> "gpu07".
absl::StatusOr<std::string> FirstSlurmHost(const std::string& nodelist);

// Tasks on each node from SLURM_TASKS_PER_NODE: "2(x3),1" -> {2, 2, 2, 1}.
absl::StatusOr<std::vector<int>> ParseSlurmTasksPerNode(const std::string& spec);

// The variables the launcher sets for one worker (on top of its own environment).
EnvMap WorkerEnvironment(const LaunchPlan& plan, const WorkerPlan& w, const std::string& token,
                         int restart_count);

}  // namespace braid::launcher

#endif  // BRAID_LAUNCHER_LAUNCH_PLAN_H_
