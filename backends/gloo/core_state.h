// The state a Gloo communicator shares with its worker threads and Work handles (Core): the
// group's identity, the transport, the progress each rank publishes to the store, and the
// failure diagnosis built from it. Separate from the communicator because the Work handles and
// the collectives hold it too, and may outlive the communicator.
#ifndef BRAID_BACKENDS_GLOO_CORE_STATE_H_
#define BRAID_BACKENDS_GLOO_CORE_STATE_H_

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "backends/gloo/journal.h"
#include "backends/gloo/settings.h"
#include "backends/gloo/threads.h"
#include "core/store.h"

namespace gloo {
class Context;
namespace transport {
class Device;
}  // namespace transport
}  // namespace gloo

namespace braid::gloo_backend::internal {

// ---- Group identity -------------------------------------------------------------------------

struct GroupInfo {
  std::string name;    // "world", "world/g3"
  std::string prefix;  // store namespace: "gloo", "gloo/g3"
  int rank = 0;
  int size = 1;
  std::vector<int> world_ranks;  // member r's rank in the root communicator

  bool IsWorld() const;
  std::string Describe() const;
  std::string Rank(int r) const;
};

// Writes "join/<rank>" and waits for every rank's; names the ranks that did not come and
// refuses a group whose members disagree on `join_value` (world size, member list).
absl::Status JoinGroup(const GroupInfo& g, braid::Store* store, absl::Duration timeout,
                       const std::string& join_value);

// ---- Progress records: what each rank publishes on its heartbeat -----------------------------

struct Progress {
  int64_t started = -1;   // the last collective this rank started (-1: none)
  int64_t finished = -1;  // the last one it finished
  bool failed = false;    // its communicator is broken
  int64_t unix_ms = 0;    // when it was published
  std::string what;       // the last started collective, or a note
  std::string why;        // why its communicator failed, or that it was destroyed
};

std::string EncodeProgress(const Progress& p);
bool DecodeProgress(const std::string& s, Progress* p);

// ---- Core: the state the worker threads and Work handles share ------------------------------

struct Core {
  GroupInfo group;
  Settings settings;
  braid::Store* store = nullptr;
  std::shared_ptr<::gloo::transport::Device> device;
  std::shared_ptr<::gloo::Context> context;
  Journal journal;
  ThreadSet p2p_threads;  // waits for Sends and Recvs polled or dropped unwaited (P2pOp)

  absl::Mutex mu;
  int64_t started = -1;      // GUARDED_BY(mu)
  int64_t finished = -1;     // GUARDED_BY(mu)
  std::string started_what;  // GUARDED_BY(mu)
  std::string broken;        // GUARDED_BY(mu): the first failure; empty while healthy
  std::string final_note;    // GUARDED_BY(mu): published once the communicator is destroyed

  std::mutex beat_mu;
  std::condition_variable beat_cv;
  bool beat_dirty = false;  // GUARDED_BY(beat_mu): progress changed since it was published
  bool beat_stop = false;   // GUARDED_BY(beat_mu)

  std::string ProgressKey(int r) const;

  void Started(int64_t seq, const std::string& what);

  // The heartbeat thread: publishes progress every settings.heartbeat (liveness) and soon after
  // a collective starts (so a peer's diagnosis sees where this rank is), at most every 100 ms.
  void HeartbeatLoop();
  void StopHeartbeat();
  void Finished(int64_t seq);
  std::string Broken();
  void Break(const std::string& why);

  void PublishProgress();

  static std::string Why(const Progress& p);

  // Which ranks have not reached collective `seq` (called after it failed on this rank).
  std::string WhoDidNotArrive(int64_t seq, const std::string& what);

  // The status of a collective that threw `error` after `elapsed` (the transport is now closed).
  absl::Status CollectiveFailed(int64_t seq, const std::string& what, const std::string& error,
                                absl::Duration elapsed, absl::Duration timeout);

  absl::Status P2pFailed(const std::string& what, int peer, const std::string& error,
                         absl::Duration elapsed, absl::Duration timeout);

  absl::Status BrokenError(const std::string& what);

  static std::string FirstLine(const std::string& s) { return s.substr(0, s.find('\n')); }
};

}  // namespace braid::gloo_backend::internal

#endif  // BRAID_BACKENDS_GLOO_CORE_STATE_H_
