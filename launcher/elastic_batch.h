// The training program's side of an elastic job (BRAID_ELASTIC set by the launcher,
// launcher/elastic.h): the global batch stays what the config says while the world size changes
// from round to round, so gradient accumulation is recomputed for each round's data-parallel
// size (DeepSpeed elasticity's rule: a world size is valid when train_batch_size =
// micro-batch × accumulation × data-parallel size holds with a whole accumulation), and the
// program stops after a checkpoint when the launchers ask it to, so that a node can join.
#ifndef BRAID_LAUNCHER_ELASTIC_BATCH_H_
#define BRAID_LAUNCHER_ELASTIC_BATCH_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "launcher/config/train_config.pb.h"
#include "core/store.h"

namespace braid::launcher {

struct ElasticNodes {
  int min_nodes = 1, max_nodes = 1;
};
// From BRAID_ELASTIC ("MIN:MAX"); nullopt in a job of fixed size.
absl::StatusOr<std::optional<ElasticNodes>> ElasticNodesFromEnv();

// Validates a copy of the config for `world_size` processes (the training program's own
// validation: launcher/train_setup.h), quietly.
using ValidateForWorld = std::function<absl::Status(config::TrainConfig*, int world_size)>;

// Makes `cfg` elastic and checks this round's size: the config must fix the global batch
// (train_batch_size and train_micro_batch_size_per_gpu); gradient_accumulation_steps is then
// derived for each world size. Returns the table of the world sizes the job may take
// (MIN..MAX nodes × `local_world` processes), each with its accumulation or why it is refused,
// one line each; refuses `world_size` (this round's) in one line naming the sizes it accepts.
// `cfg` itself is left for the program's own validation at `world_size`.
absl::StatusOr<std::string> PrepareElasticBatch(config::TrainConfig* cfg, ElasticNodes nodes,
                                                int local_world, int world_size,
                                                const ValidateForWorld& validate);

// At each checkpoint of an elastic job: rank 0 records the step and decides, from the
// launchers' regroup key, whether the group stops there; every rank reads the same decision.
class ElasticCheckpoints {
 public:
  // nullptr outside an elastic job; connects to the job's store (ConnectStoreFromEnv).
  static absl::StatusOr<std::unique_ptr<ElasticCheckpoints>> FromEnv(int rank, absl::Duration timeout);
  // `store` must outlive this object. `round` is BRAID_RESTART_COUNT.
  ElasticCheckpoints(Store* store, int rank, int round, absl::Duration timeout)
      : store_(store), rank_(rank), round_(round), timeout_(timeout) {}

  // After the checkpoint of `step` is saved: the node that waits to join when the group is to
  // stop here ("node 2 (host n2)"), else nullopt.
  absl::StatusOr<std::optional<std::string>> AfterCheckpoint(int64_t step);

 private:
  std::unique_ptr<Store> owned_;
  Store* store_;
  int rank_, round_;
  absl::Duration timeout_;
};

// The status a run ends with when it stopped to regroup; the program exits with kExitRegroup.
absl::Status RegroupStatus(int64_t step, const std::string& joiner);
bool IsRegroup(const absl::Status& st);

}  // namespace braid::launcher

#endif  // BRAID_LAUNCHER_ELASTIC_BATCH_H_
