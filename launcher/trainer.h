// The training program's engine: builds the model, data and strategy a TrainConfig describes,
// then trains, reporting progress, metrics (JSON lines) and a summary.
#ifndef BRAID_LAUNCHER_TRAINER_H_
#define BRAID_LAUNCHER_TRAINER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/config/train_config.pb.h"

namespace braid::launcher {

struct TrainerEnv {
  int rank = 0, world_size = 1;
  std::vector<std::string> plugin_search_path;  // searched after $BRAID_PLUGIN_PATH
  std::string plugin_origin;  // how that path was found, for train.log
  std::string log_dir;  // resolved folder for train.log ("" = no files)
  std::string metrics_path;  // JSON lines, one per step and a summary (in log_dir by default)
  bool interactive = false;  // rewrite the progress line in place (a terminal)
  bool quiet = false;        // print nothing but errors
};

struct TrainResult {
  int steps = 0;
  float first_loss = 0, final_loss = 0;
  double median_tokens_per_s = 0;  // steady state: the first steps are left out
  int64_t peak_bytes = 0;          // the device allocator's peak
  std::string metrics_path, log_path;
};

// `cfg` must have passed config::ValidateConfig.
absl::StatusOr<TrainResult> Train(const config::TrainConfig& cfg, const TrainerEnv& env);

}  // namespace braid::launcher

#endif  // BRAID_LAUNCHER_TRAINER_H_
