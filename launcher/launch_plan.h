// What one launcher process has to do: the rank layout (from flags, torchrun's and Kubernetes'
// variables, Slurm, Open MPI) and the workers it starts. Pure functions of the command line and the environment, so that the
// layout rules are unit-tested without starting anything.
#ifndef BRAID_LAUNCHER_LAUNCH_PLAN_H_
#define BRAID_LAUNCHER_LAUNCH_PLAN_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "launcher/launch_flags.h"

namespace braid::launcher {

using EnvMap = std::map<std::string, std::string>;

// The environment of this process as a map (for the functions below).
EnvMap CurrentEnvironment();

// Where the layout came from; named in messages so a user knows which numbers to fix.
enum class LayoutSource { kFlags, kSlurm, kOpenMpi, kMpich, kTorchEnv };
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
  // torchrun's names for the job, passed to the workers (ROLE_NAME, TORCHELASTIC_RUN_ID, ...).
  std::string role = "default", run_id = "none";
  int max_restarts = 0;
};

// The flags as the environment completes them, in this order of precedence:
//   1. the command line;
//   2. torchrun's own variables for its flags (what Kubeflow's PyTorchJob sets): PET_NNODES,
//      PET_NODE_RANK, PET_NPROC_PER_NODE, PET_MASTER_ADDR, PET_MASTER_PORT, PET_RDZV_ENDPOINT,
//      PET_RDZV_BACKEND, PET_RDZV_ID, PET_MAX_RESTARTS;
//   3. the scheduler's: JOB_COMPLETION_INDEX (a Kubernetes Indexed Job's pod index) for the
//      node rank; Slurm's and Open MPI's layouts (MakeLaunchPlan).
// Two sources of one number (the node count, the node rank, workers per node, restarts, the
// job id) must agree: a disagreement is an error naming both. Only node 0's address and port
// given on the command line override the environment's (as $MASTER_ADDR always could);
// PET_MASTER_ADDR and $MASTER_ADDR must agree with each other. Also resolves
// --nproc_per_node=auto|cpu|gpu against `host`.
absl::StatusOr<LaunchFlags> FlagsWithEnvironment(LaunchFlags flags, const EnvMap& env,
                                                 const HostFacts& host);

// Combines flags (as FlagsWithEnvironment returns them) and environment (Slurm: SLURM_PROCID,
// SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_NNODES, SLURM_TASKS_PER_NODE,
// SLURM_JOB_NODELIST; Open MPI: OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE; MPICH's
// Hydra mpiexec (also Intel MPI's, MVAPICH's): PMI_RANK, PMI_SIZE, MPI_LOCALRANKID,
// MPI_LOCALNRANKS; neither MPI names a node index, so the node rank assumes ranks placed node
// by node, both mpiruns' default;
// torch's env:// variables RANK and WORLD_SIZE (LOCAL_RANK, LOCAL_WORLD_SIZE when given), for a
// process started by something else that speaks them, e.g. an older PyTorchJob).
// Under a scheduler, one launcher runs one worker, unless --nproc_per_node is given: then the
// scheduler must have started one task per node and gives only the node rank and count.
absl::StatusOr<LaunchPlan> MakeLaunchPlan(const LaunchFlags& flags, const EnvMap& env);

// The first host of a Slurm node list: "gpu[07-09,12],cpu1" -> "gpu07".
absl::StatusOr<std::string> FirstSlurmHost(const std::string& nodelist);

// Tasks on each node from SLURM_TASKS_PER_NODE: "2(x3),1" -> {2, 2, 2, 1}.
absl::StatusOr<std::vector<int>> ParseSlurmTasksPerNode(const std::string& spec);

// What --dry_run prints: the layout, the master, and this launcher's workers, one fact per line.
std::string DescribePlan(const LaunchPlan& plan);

// The variables the launcher sets for one worker (on top of its own environment).
EnvMap WorkerEnvironment(const LaunchPlan& plan, const WorkerPlan& w, const std::string& token,
                         int restart_count);

}  // namespace braid::launcher

#endif  // BRAID_LAUNCHER_LAUNCH_PLAN_H_
