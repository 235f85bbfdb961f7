// braid::Spawn: a job of your own program's processes on this machine, in one command and
// without the launcher (torch's mp.spawn). It runs the launcher itself (launcher/launcher_main.h)
// with --standalone --nproc_per_node=N --program=<this program>: the same code starts the
// workers, serves the store, forwards signals, stops the group when one fails, and writes the
// same logs. Each worker is this program run again with the same arguments; there Spawn sees the
// launcher's variables and calls `fn` instead. A program started by the launcher
// (`launcher --nproc_per_node=N --program=my_train`) or by Slurm through it is such a worker
// too, so one main() runs both ways. docs/LAUNCHING.md, *Your own program*, shows an example.
#ifndef BRAID_LAUNCHER_SPAWN_H_
#define BRAID_LAUNCHER_SPAWN_H_

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace braid {

// This process's place in the job, from the variables every launcher gives a worker (RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, BRAID_RESTART_COUNT: docs/LAUNCHING.md).
struct WorkerInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int restart_count = 0;  // 0, then 1, 2, ... after --max_restarts restarts

  // The worker a launcher (or Spawn) started this process as; nullopt when none did (no
  // BRAID_RESTART_COUNT, or a rank variable missing or not a number).
  static std::optional<WorkerInfo> FromEnvironment();
};

struct SpawnOptions {
  // The run folder: worker logs (workerlog.<rank>), and the training's metrics.jsonl and
  // train.log (BRAID_RUN_DIR). Empty: runs/<config>-<time>, as the launcher's --log_dir.
  std::string log_dir;
  // Restarts of the whole group after a worker fails (the launcher's --max_restarts).
  int max_restarts = 0;
  // Any other launcher flag, as on its command line ("--tee=3", "--stop_grace_s=5").
  std::vector<std::string> launcher_flags;
  // The arguments each worker's main() gets after its program name. Unset: this process's own
  // (from /proc/self/cmdline), so the workers parse the same flags.
  std::optional<std::vector<std::string>> args;
};

// In a worker: returns fn(its WorkerInfo), the worker's exit code. Otherwise: runs `nprocs`
// workers of this program and returns the job's exit code as the launcher does (0 when every
// worker succeeded, a single worker's own code, 1 when one of several failed, 128+N when this
// process got signal N; docs/LAUNCHING.md, *Exit codes*). Call it from main(), before other
// threads exist, and return what it returns: it blocks the stop signals in this process for the
// job's sake. A job that cannot start (bad nprocs, a bad launcher flag) prints one line naming
// the cause and ends this process with exit code 2, as the launcher does.
int Spawn(int nprocs, const std::function<int(const WorkerInfo&)>& fn,
          const SpawnOptions& options = {});

}  // namespace braid

#endif  // BRAID_LAUNCHER_SPAWN_H_
