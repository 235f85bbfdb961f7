// The training program's engine: builds the model, data and strategy a TrainConfig describes,
// then trains, reporting progress, metrics (JSON lines) and a summary.
#ifndef BRAID_LAUNCHER_TRAINER_H_
#define BRAID_LAUNCHER_TRAINER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "launcher/config/train_config.pb.h"
#include "core/module.h"
#include "core/strategy.h"

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

// What Train does, driven by the caller one step at a time (the API of a user's own program,
// launcher/session.h, is built on it): Start makes everything Train makes before its first step,
// each Step is one of Train's steps (reported and checkpointed alike), Finish is Train's end. So
// a program that calls Step until done() trains exactly as Train does.
class TrainingRun {
 public:
  // `cfg` must have passed config::ValidateConfig.
  static absl::StatusOr<std::unique_ptr<TrainingRun>> Start(config::TrainConfig cfg, TrainerEnv env);
  ~TrainingRun();

  // The next step; an error once done() (or when the step fails: a collective timed out, the
  // loss is not finite).
  absl::StatusOr<StepStats> Step();
  bool done() const;
  int step() const;   // steps done (a resumed run starts at its checkpoint's step)
  int steps() const;  // the config's
  Module& model();    // as the strategy laid it out on this rank
  Strategy& strategy();
  const config::TrainConfig& config() const;

  // The whole model's weights to a safetensors file, as save_to writes them: collective (every
  // rank must call it), rank 0 writes.
  absl::Status SaveWeights(const std::string& path);
  // The summary, the final evaluation and save_to; once.
  absl::StatusOr<TrainResult> Finish();

 private:
  struct State;
  explicit TrainingRun(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace braid::launcher

#endif  // BRAID_LAUNCHER_TRAINER_H_
