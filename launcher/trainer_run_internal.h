// The training program's run, phase by phase: the private seam between trainer.cc (everything
// before the first step, Train and TrainingRun) and trainer_loop.cc (the steps, checkpoints and
// the report at the end). Not an interface: only those two files include it.
#ifndef BRAID_LAUNCHER_TRAINER_RUN_INTERNAL_H_
#define BRAID_LAUNCHER_TRAINER_RUN_INTERNAL_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/checkpointer.h"
#include "core/communicator.h"
#include "core/mesh.h"
#include "launcher/mixed_precision/mixed_precision.h"
#include "core/module.h"
#include "core/optimizer.h"
#include "core/store.h"
#include "core/strategy.h"
#include "launcher/batch_sources.h"
#include "launcher/compose.h"
#include "launcher/elastic_batch.h"
#include "launcher/evaluation.h"
#include "launcher/optimization.h"
#include "launcher/run_report.h"
#include "launcher/trainer.h"

namespace braid::launcher::internal {

using config::TrainConfig;

// One training run, as a sequence of named phases (Train calls them in order). The members are
// declared in the order they are made, so they are destroyed in reverse: the strategy before the
// communicators its groups come from, the model before the strategy that hooks into it.
class Run {
 public:
  Run(const TrainConfig& cfg, const TrainerEnv& env) : cfg_(cfg), env_(env) {}

  absl::Status PrepareDevice();
  absl::Status OpenReport();
  absl::Status ConnectWorld();
  absl::Status Compose();
  absl::Status BuildModelAndPrecision();
  absl::Status SetUpStrategy();
  absl::Status PrepareData();
  absl::Status Resume();
  // The training steps: BeginLoop, then Step until done(), then EndLoop (Loop does all three).
  absl::Status Loop();
  absl::Status BeginLoop();
  absl::StatusOr<StepStats> Step();
  bool done() const { return step_ >= steps_; }
  absl::Status EndLoop();
  absl::StatusOr<TrainResult> Finish();
  // The whole model's weights to a safetensors file (collective; rank 0 writes).
  absl::Status SaveWeights(const std::string& path);

  int step() const { return step_; }
  int steps() const { return steps_; }
  Module& model() { return *model_; }
  Strategy& strategy() { return *strategy_; }

 private:
  // Step's phases, in order.
  std::vector<Batch> NextMicroBatches();
  float SetStepHyperparameters(int step);
  absl::Status ReportStep(int step, const StepStats& st, float lr, double dt);
  absl::Status EvaluateIfDue(int step);
  absl::Status CheckpointIfDue(int step);
  absl::Status SaveCheckpoint(int done_steps);

  const TrainConfig& cfg_;
  config::Sections sections_;  // what the strategy reads of cfg_ (StrategyContext::config)
  const TrainerEnv& env_;
  Device device_ = Device::CPU();
  std::unique_ptr<Reporter> rep_;
  std::map<std::string, Tensor> init_weights_;
  std::unique_ptr<Store> store_, world_store_;
  std::vector<std::unique_ptr<Communicator>> group_;
  std::unique_ptr<DeviceMesh> mesh_;
  Stack stack_;
  std::unique_ptr<Strategy> strategy_;
  StrategyContext ctx_;
  std::unique_ptr<Module> model_;
  // The whole model's parameter count, before a layer splits it (tensor parallelism's slices).
  int64_t model_parameters_ = 0;
  std::unique_ptr<MixedPrecision> mp_;
  OptimizerFactory make_optimizer_;
  std::unique_ptr<BatchSource> source_;
  std::unique_ptr<LrSchedule> schedule_;
  BetasSchedule betas_;
  LossFn loss_fn_;
  int steps_ = 0, accum_ = 1;
  int64_t tokens_per_step_ = 0;
  std::string unit_ = "tok";  // the dataset's (DatasetSpec::unit)
  // Sharded checkpoints (plugins/checkpoint), and where a resumed run starts.
  std::unique_ptr<Checkpointer> checkpointer_;
  std::unique_ptr<ElasticCheckpoints> elastic_;  // an elastic job's regroups (elastic_batch.h)
  CheckpointOptions checkpoint_options_;
  int first_step_ = 0;
  int64_t batches_drawn_ = 0;  // from the data source, for the resumed run to draw the same
  int checkpoints_saved_ = 0;
  double checkpoint_blocked_s_ = 0;
  TrainResult result_;
  std::unique_ptr<Evaluation> eval_;  // the config's eval section; null without one
  StepTotals totals_;  // for the summary
  std::unique_ptr<monitor::Monitors> monitors_;  // tensorboard, csv_monitor (rank 0)
  IntervalTimes interval_;  // wall_clock_breakdown
  // The MFU's terms (rank 0; 0 = unknown): the model's training FLOPs per token, the device's
  // measured peak per process.
  double flops_per_token_ = 0, peak_flops_ = 0;
  std::string peak_basis_;  // a CUDA device's (empty on the CPU: the measured ceiling)
  absl::Time start_;
  // The loop's state between Steps.
  int step_ = 0;
  int kill_at_step_ = -1;
  int print_every_ = 1;
  std::function<Batch()> next_batch_;
};

}  // namespace braid::launcher::internal

#endif  // BRAID_LAUNCHER_TRAINER_RUN_INTERNAL_H_
