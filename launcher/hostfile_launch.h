// DeepSpeed's hostfile launcher, for Braid: the launcher started with --hostfile on the first
// host starts one launcher per node of the hostfile (hostfile.h), the first here and the others
// over OpenSSH, and supervises them:
//
//   - each node's launcher is an ordinary one (--nnodes, --node_rank, --nproc_per_node,
//     --master_addr = the first host), given the job token as the first line of its standard
//     input (--job_token_file=-), never on a command line where `ps` would show it;
//   - every node's output comes back here, each line prefixed with its host ("worker-1: ...");
//   - the nodes keep their standard input open to this process (--watch_stdin): when it closes
//     (Ctrl-C here, a node that failed, this process or an ssh connection gone), every node's
//     launcher stops its workers and the job ends everywhere.
//
// ssh runs with BatchMode=yes (keys or an agent, never a password prompt), -p --ssh_port, and
// the options in $BRAID_SSH_OPTIONS (split at spaces; e.g. "-F my_ssh_config").
#ifndef BRAID_LAUNCHER_HOSTFILE_LAUNCH_H_
#define BRAID_LAUNCHER_HOSTFILE_LAUNCH_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "launcher/hostfile.h"
#include "launcher/launch_flags.h"

namespace braid::launcher {

// What the nodes of a hostfile job are started with.
struct HostfileContext {
  std::string launcher_path;  // this launcher, absolute: the same path on every host
  std::string cwd;            // the folder every node's launcher starts in
  std::string ssh = "ssh";    // OpenSSH's client (HostfileMain finds it on $PATH)
  std::map<std::string, std::string> env;  // this process's environment
};

struct NodeStart {
  int node_rank = 0;
  std::string host;
  bool local = false;             // node 0: started here, not over ssh
  std::vector<std::string> argv;  // what runs here (the launcher, or ssh)
  std::map<std::string, std::string> env_overrides;  // on top of this process's environment
};

// The command of every node, from the flags (as parsed; --hostfile given) and the hostfile's
// nodes. Flags the user gave are passed on to every node's launcher except those that pick the
// hosts and the layout; so are the program's arguments. The remote launchers get the variables
// that configure Braid (BRAID_*, but never BRAID_JOB_TOKEN), NCCL_*, OMP_NUM_THREADS,
// OPENBLAS_NUM_THREADS and BUILD_WORKSPACE_DIRECTORY, and CUDA_VISIBLE_DEVICES when
// --include/--exclude chose slots other than 0..P-1.
absl::StatusOr<std::vector<NodeStart>> PlanHostfileNodes(const LaunchFlags& flags,
                                                         const HostfileNodes& nodes,
                                                         const HostfileContext& ctx);

// The hostfile's nodes as the flags select them (--include/--exclude, --nnodes, --nproc_per_node),
// checking the flags that make no sense with a hostfile.
absl::StatusOr<HostfileNodes> HostfileNodesFor(const LaunchFlags& flags);

// A word for a POSIX shell: single-quoted unless it is plain.
std::string ShellQuote(const std::string& word);

// What --dry_run prints: one line per node.
std::string DescribeHostfileNodes(const std::vector<NodeStart>& nodes);

// Starts the nodes, streams their output, and waits until every node's launcher has ended.
// Returns the exit code: 0 when every node succeeded; 128+N when this process was stopped by
// signal N; else 1 (2 when every failed node's launcher could not start its job).
int RunHostfileNodes(const std::vector<NodeStart>& nodes, const std::string& token,
                     const std::map<std::string, std::string>& env, double stop_grace_s);

// The launcher's main for --hostfile (argv0: this launcher, as started): reads the hostfile,
// takes the job token (BRAID_JOB_TOKEN, --job_token_file, else a fresh one), and runs the nodes;
// with --dry_run prints each node's command instead. Returns the exit code.
int HostfileMain(const LaunchFlags& flags, const char* argv0);

}  // namespace braid::launcher

#endif  // BRAID_LAUNCHER_HOSTFILE_LAUNCH_H_
