// One node's launcher once its layout is known: serves (node 0) or reaches the rendezvous store,
// agrees on the run folder, starts this node's workers and watches them together with the other
// nodes' launchers, restarting (--max_restarts) or regrouping (elastic) as the job allows.
// LauncherMain (launcher_main.cc) parses the command line and builds one; internal to
// :launcher_main.
#ifndef BRAID_LAUNCHER_NODE_LAUNCHER_H_
#define BRAID_LAUNCHER_NODE_LAUNCHER_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/store/tcp_store.h"
#include "launcher/elastic.h"
#include "launcher/launch_flags.h"
#include "launcher/launch_plan.h"
#include "launcher/launcher_signals.h"
#include "launcher/programs.h"
#include "launcher/rendezvous.h"
#include "launcher/worker_group.h"

namespace braid::launcher {

// How one attempt (or elastic round) of the worker group ended.
struct Outcome {
  enum Kind {
    kSuccess,
    kWorkerFailed,   // a worker of this launcher
    kRemoteFailed,   // another launcher reported a failure (or stopped responding)
    kStoreLost,      // node 0's store went away: nothing to restart with
    kInterrupted,    // a signal to this launcher
    kLauncherError,  // check-in failed, workers could not start
    kRegroup,        // elastic: the workers stopped at a checkpoint so that a node can join
  } kind = kSuccess;
  std::string message;  // printed as the one message about the failure
  int exit_code = 0;
  bool restartable = false;  // --max_restarts may start the worker group again
};

// One per launcher process; Run() is the whole job and returns the launcher's exit code.
class Launcher {
 public:
  Launcher(LaunchFlags flags, LaunchPlan plan, std::vector<std::string> argv,
           std::vector<std::pair<std::string, std::string>> program_env, std::string log_dir,
           std::string run_name, std::string token)
      : flags_(std::move(flags)), plan_(std::move(plan)), argv_(std::move(argv)),
        program_env_(std::move(program_env)), log_dir_(std::move(log_dir)),
        run_name_(std::move(run_name)), token_(std::move(token)) {}

  int Run();
  int RunElastic();  // --nnodes=MIN:MAX: rounds of membership (launcher/elastic.h)
  // Appends "----- braid launcher: <what> -----" to this node's worker logs: where an attempt begins.
  void MarkLogs(const std::string& what) const {
    for (const WorkerPlan& w : plan_.workers) {
      if (FILE* f = std::fopen(absl::StrCat(log_dir_, "/workerlog.", w.rank).c_str(), "a")) {
        std::fprintf(f, "----- braid launcher: %s -----\n", what.c_str());
        std::fclose(f);
      }
    }
  }

 private:
  std::string Label() const {
    if (flags_.Elastic()) return absl::StrCat("node ", flags_.node_rank);  // its identity
    return plan_.source == LayoutSource::kFlags || flags_.Given("nproc_per_node")
               ? absl::StrCat("node ", plan_.node_rank)
               : absl::StrCat("rank ", plan_.launcher_id, "'s launcher");
  }
  LauncherInfo SelfInfo() const;
  void ServeAndConnect();
  void AgreeOnRunFolder();
  std::vector<WorkerSpec> Specs(int attempt) const;
  Outcome RunAttempt(int attempt);
  Outcome WorkerFailure(const WorkerExit& e) const;
  int Finish(const Outcome& o, int attempt);

  LaunchFlags flags_;
  LaunchPlan plan_;
  std::vector<std::string> argv_;
  std::vector<std::pair<std::string, std::string>> program_env_;  // e.g. its runfiles
  std::string log_dir_;   // "" until AgreeOnRunFolder when --log_dir was not given
  std::string run_name_;  // this launcher's proposal for runs/<name> then
  std::string token_;
  std::string host_ = Hostname();
  Signals signals_;
  std::unique_ptr<TcpStoreServer> server_;
  std::unique_ptr<TcpStoreClient> client_;
  std::unique_ptr<LauncherRendezvous> rdzv_;
  WorkerGroup* group_ = nullptr;
  int vanished_ = 0;  // launchers found silent: node 0 does not wait for them at the end
  ElasticRendezvous* elastic_ = nullptr;  // an elastic job's rounds
  std::vector<int> round_members_;  // the node ids of the round that runs
};

}  // namespace braid::launcher

#endif  // BRAID_LAUNCHER_NODE_LAUNCHER_H_
