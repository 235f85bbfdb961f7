// What an elastic job's launchers and its training program share (launcher/elastic.h is the
// launchers' side, launcher/elastic_batch.h the program's): the variable that marks the job
// elastic, the exit code of a worker that stopped so that the group can regroup, and the store
// keys through which the launchers ask for that and the program says where its newest
// checkpoint is.
#ifndef BRAID_LAUNCHER_ELASTIC_KEYS_H_
#define BRAID_LAUNCHER_ELASTIC_KEYS_H_

#include <string>

#include "absl/strings/str_cat.h"

namespace braid::launcher {

// "MIN:MAX" nodes (--nnodes) in the workers' environment of an elastic job.
inline constexpr char kElasticEnv[] = "BRAID_ELASTIC";

// A worker's exit code for "stopped after a checkpoint so that the group can regroup"
// (EX_TEMPFAIL): not a failure.
inline constexpr int kExitRegroup = 75;

// Set by node 0's launcher while round `round` runs and a node waits to join (its value names
// the node); read by the program's rank 0 at each checkpoint.
inline std::string RegroupKey(int round) { return absl::StrCat("braid.elastic/", round, "/regroup"); }
// Rank 0's decision at the checkpoint of `step` ("stop" or "go"), read by every other rank.
inline std::string RegroupDecisionKey(int round, int64_t step) {
  return absl::StrCat("braid.elastic/", round, "/at/", step);
}
// The step of the program's newest saved checkpoint (for the launchers' messages).
inline std::string CheckpointStepKey() { return "braid.elastic/checkpoint_step"; }

}  // namespace braid::launcher

#endif  // BRAID_LAUNCHER_ELASTIC_KEYS_H_
