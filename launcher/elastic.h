// Elastic membership (--nnodes=MIN:MAX, torchrun's spelling): the job runs in rounds. Each
// round admits the launchers that are there, between MIN and MAX nodes, gives them node ranks
// and a world size, and runs the worker group at that size until it ends: finished, failed (a
// node lost: its launcher or its ranks died), or asked to regroup because a node waits to join.
// Then the next round starts from the newest checkpoint (the training program reshards it and
// recomputes gradient accumulation for the new data-parallel size; launcher/elastic_batch.h).
//
// A launcher's identity is its --node_rank (node 0 serves the store and decides the rounds);
// within a round the members are ranked in the order of their identities, so node 0 is always
// rank 0 and the survivors of a loss keep their relative order.
//
// RoundAdmission is the admission rule alone, with the clock given by the caller (unit-tested
// event by event); ElasticRendezvous runs it over the launchers' store.
#ifndef BRAID_LAUNCHER_ELASTIC_H_
#define BRAID_LAUNCHER_ELASTIC_H_

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/store.h"
#include "launcher/elastic_keys.h"
#include "launcher/launch_plan.h"

namespace braid::launcher {

struct RoundRules {
  int min_nodes = 1, max_nodes = 1;
  absl::Duration last_call;  // once min_nodes are in, how long to wait for more
  absl::Duration timeout;    // fewer than min_nodes this long after the round opened: give up
};

// Which nodes one round admits. A round closes at once when max_nodes have arrived, or
// `last_call` after the min_nodes-th arrival; it times out when min_nodes have not arrived
// `timeout` after it opened. Nodes beyond max_nodes wait for the next round.
class RoundAdmission {
 public:
  RoundAdmission(RoundRules rules, absl::Time opened) : rules_(rules), opened_(opened) {}

  enum class Arrival { kAdmitted, kFull, kDuplicate };
  Arrival Arrive(int node, absl::Time now);

  enum class Decision { kWait, kClose, kTimeout };
  Decision Decide(absl::Time now) const;
  // When Decide may next change without an arrival (the last call's end, or the timeout).
  absl::Time NextDeadline() const;

  // The admitted nodes in ascending order: a node's position is its rank for the round.
  std::vector<int> Members() const;
  int arrived() const { return static_cast<int>(nodes_.size()); }

 private:
  RoundRules rules_;
  absl::Time opened_;
  std::optional<absl::Time> quorum_at_;  // when min_nodes had arrived
  std::vector<int> nodes_;               // in arrival order
};

// What node 0 published for a round.
struct RoundResult {
  std::vector<int> members;        // node ids, ascending: index = node rank in the round
  std::vector<std::string> hosts;  // beside members
  std::string note;                // what changed and why, printed by every member
  std::string error;               // non-empty: the job ends with this message
  int RankOf(int node) const;      // -1 when not a member
  std::string Serialize() const;
  static absl::StatusOr<RoundResult> Parse(const std::string& s);
};

// How the previous round ended, as node 0 saw it (for the next round's note and the restart
// count).
struct PreviousRound {
  bool failed = false;  // a worker failed or a launcher vanished (not a regroup to grow)
  std::string why;      // its one-line cause
};

// The rounds over the launchers' store (keys under braid.launcher/elastic/). Not thread-safe.
class ElasticRendezvous {
 public:
  // `store` must outlive this object; `now` is the clock (absl::Now outside tests).
  ElasticRendezvous(Store* store, int node, std::string host, RoundRules rules, int max_restarts,
                    absl::Time (*now)() = absl::Now)
      : store_(store), node_(node), host_(std::move(host)), rules_(rules),
        max_restarts_(max_restarts), now_(now) {}

  // Registers this launcher for the round after the newest published one (at or after
  // `at_least`); returns the round it joined.
  absl::StatusOr<int> Join(int at_least);

  // Node 0 only, called repeatedly while waiting: admits the round's arrivals and publishes the
  // result once the round closes (or times out). `previous` describes the round before it.
  absl::Status Coordinate(int round, const PreviousRound& previous);

  // Waits for the round's result, deciding it meanwhile when this is node 0; `pause` waits a
  // little between looks and returns true to give up (nullopt then).
  absl::StatusOr<std::optional<RoundResult>> Await(int round, const PreviousRound& previous,
                                                   const std::function<bool()>& pause);

  // The round's result once node 0 published it.
  absl::StatusOr<std::optional<RoundResult>> Result(int round);

  // A launcher that waits to join `round` and is not one of `members` (the running round's, who
  // join it too once that round ends): the running round's cue to regroup and grow.
  absl::StatusOr<std::optional<std::string>> Waiting(int round, const std::vector<int>& members);

 private:
  std::string Key(int round, const std::string& name) const;

  Store* store_;
  int node_;
  std::string host_;
  RoundRules rules_;
  int max_restarts_;
  absl::Time (*now_)();
  // Node 0's state for the round it coordinates.
  int coordinating_ = -1;
  std::optional<RoundAdmission> admission_;
  std::vector<std::string> hosts_by_arrival_;
  int seen_ = 0;  // joiners read so far
  std::optional<RoundResult> last_;  // the previous round's members
  int failures_ = 0;                 // rounds that failed without losing a node
};

// Elastic jobs take their layout from the flags (one launcher per node, --nproc_per_node each):
// an error naming what stands in the way otherwise.
absl::Status CheckElasticLayout(const LaunchFlags& flags, const LaunchPlan& plan);

// The plan of one round: `nodes` nodes, this launcher's node rank `rank` among them.
LaunchPlan PlanForRound(const LaunchPlan& base, const LaunchFlags& flags, int round, int rank, int nodes);

// The node label used in every elastic message: "node 2 (host n2)".
std::string NodeName(int node, const std::string& host);

}  // namespace braid::launcher

#endif  // BRAID_LAUNCHER_ELASTIC_H_
