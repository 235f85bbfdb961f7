// How the launchers of one job find and watch one another through the rendezvous store: each
// checks in with its view of the job (so that two nodes started with different --nnodes or
// --nproc_per_node fail at once, naming both), a job-wide "failed" key stops every node's
// workers when one fails, heartbeats let node 0 notice a launcher that vanished, and a final
// count lets node 0 keep the store up until every launcher has read the outcome.
//
// Keys live under "braid.launcher/<attempt>/", so each restart of the worker group starts
// clean and never collides with the workers' own keys.
#ifndef BRAID_LAUNCHER_RENDEZVOUS_H_
#define BRAID_LAUNCHER_RENDEZVOUS_H_

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/store.h"

namespace braid::launcher {

// One launcher's view of the job, as published at check-in.
struct LauncherInfo {
  int id = 0;             // node rank (or the task's rank when a scheduler started one per worker)
  int num_launchers = 1;  // how many check in
  int world_size = 1;
  int local_workers = 1;  // workers this launcher starts
  bool uniform = true;    // every launcher must start the same number of workers
  int max_restarts = 0;
  std::string label;      // "node 1" or "rank 5's launcher"
  std::string host;       // for messages
  std::string layout;     // how the numbers were given: "--nnodes=2 --nproc_per_node=4"
  // --rdzv_id: the job's id. Launchers of two jobs that share a master address and token (a
  // rerun started before the old one ended) then refuse each other instead of mixing.
  std::string run_id = "none";

  std::string Serialize() const;
  static absl::StatusOr<LauncherInfo> Parse(const std::string& s);
};

class LauncherRendezvous {
 public:
  // `store` must outlive this object.
  LauncherRendezvous(Store* store, LauncherInfo self) : store_(store), self_(std::move(self)) {}

  // Publishes this launcher for `attempt` and waits until all num_launchers have checked in with
  // a matching view of the job. Fails at once (every launcher then fails too) on a disagreement
  // or a second launcher with the same id; after `timeout` naming the launchers that never came;
  // with Cancelled when `cancelled()` turns true.
  // For a restart (attempt > 0), a launcher that has not checked in yet and whose heartbeat of
  // the previous attempt has not moved for `silence` is gone (SIGKILLed, its machine lost): the
  // check-in fails with Unavailable naming it, rather than wait `timeout` for it. `silence` must
  // cover what a living launcher spends between its last beat and its check-in (stopping its
  // workers: --stop_grace_s, then up to 5 s after SIGKILL).
  absl::Status CheckIn(int attempt, absl::Duration timeout, const std::function<bool()>& cancelled,
                       absl::Duration silence = absl::InfiniteDuration());

  struct Failure {
    std::string message;
    // A worker failed: --max_restarts may start the group again. Not so when a launcher was
    // interrupted, vanished or could not start its workers: the next attempt would wait for it.
    bool restartable = true;
  };
  // Marks the attempt failed; the first report wins and is what every launcher prints.
  absl::Status ReportFailure(int attempt, const Failure& failure);
  // The attempt's failure, if a launcher reported one. Errors mean the store is gone.
  absl::StatusOr<std::optional<Failure>> CheckFailure(int attempt);
  // How many launchers got as far as publishing their check-in record for `attempt`.
  absl::StatusOr<int> CountArrived(int attempt);

  // Says "still here". Call about once a second.
  absl::Status Heartbeat(int attempt);
  // Launchers (other than this one) whose heartbeat has not moved for `timeout`, as of the
  // calls so far; call periodically.
  absl::StatusOr<std::vector<LauncherInfo>> SilentLaunchers(int attempt, absl::Duration timeout);

  // This launcher's workers all finished well; returns how many launchers have said so.
  absl::StatusOr<int> ReportDone(int attempt);
  absl::StatusOr<int> CountDone(int attempt);
  // This launcher has seen the outcome and is leaving; returns how many have.
  absl::StatusOr<int> ReportExit(int attempt);
  absl::StatusOr<int> CountExit(int attempt);

  // The other launchers' info from the last successful CheckIn.
  const std::map<int, LauncherInfo>& peers() const { return peers_; }
  const LauncherInfo& self() const { return self_; }

 private:
  std::string Key(int attempt, const std::string& name) const;
  absl::StatusOr<std::optional<std::string>> TryGet(const std::string& key);
  absl::Status Disagree(int attempt, const LauncherInfo& other);
  // Of `missing`, a launcher of `previous` whose heartbeat of attempt - 1 stood still for `silence`.
  absl::StatusOr<std::optional<LauncherInfo>> GoneBeforeCheckIn(int attempt,
                                                                const std::map<int, LauncherInfo>& previous,
                                                                const std::vector<int>& missing,
                                                                absl::Duration silence);

  Store* store_;
  LauncherInfo self_;
  std::map<int, LauncherInfo> peers_;
  struct Beat {
    std::string value;
    absl::Time changed;
  };
  std::map<int, Beat> beats_;
  int64_t beat_count_ = 0;
  int beats_attempt_ = -1;
};

}  // namespace braid::launcher

#endif  // BRAID_LAUNCHER_RENDEZVOUS_H_
