// braid::Session: training from your own main(). A session is one worker's part of a training
// run that a config describes: Create validates the config for the job (the launcher's or
// braid::Spawn's, launcher/spawn.h), builds the model the config names from the registry,
// composes the strategy layers for the config's layout from the plugins and sets them up, and
// opens this rank's data; each Step is one optimizer step; Save writes the whole model's
// weights. It is the training program's own engine (launcher/trainer.h) driven step by step, so
// a program that runs every step trains exactly as `launcher/train` with the same config does
// (the same losses, metrics.jsonl and train.log). docs/LAUNCHING.md, *Your own program*.
//
//   int Worker(const braid::WorkerInfo& w) {
//     auto cfg = braid::Session::LoadConfig("launcher/configs/gpt-mini-ddp.pbtxt");
//     auto session = braid::Session::Create(*cfg, w);
//     while (!(*session)->done()) (*session)->Step();
//     return (*session)->Finish().ok() ? 0 : 1;
//   }
//   int main() { return braid::Spawn(2, Worker); }
#ifndef BRAID_LAUNCHER_SESSION_H_
#define BRAID_LAUNCHER_SESSION_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "launcher/config/train_config.pb.h"
#include "core/module.h"
#include "launcher/spawn.h"

namespace braid {

class Session {
 public:
  struct Options {
    // metrics.jsonl and train.log go here. Empty: the launcher's run folder ($BRAID_RUN_DIR,
    // which Spawn sets too), else no files.
    std::string log_dir;
    bool quiet = false;  // no progress lines, only errors
  };

  // A config file: text format (.pbtxt, .textproto, .txt) or DeepSpeed JSON (.json); a relative
  // path is the user's (under `bazel run`, the checkout), as the training program's --config.
  // Change the result (steps, the optimizer, ...) before Create. Problems of a JSON file's keys
  // are kept in it for Create, which reports them with the value problems in one message.
  static absl::StatusOr<config::TrainConfig> LoadConfig(const std::string& path);

  // Validates `cfg` for worker.world_size processes (one message naming what is wrong), then
  // makes everything the first step needs. Every worker of the job must call it with the same
  // config: it is collective (the workers meet through the launcher's store).
  static absl::StatusOr<std::unique_ptr<Session>> Create(config::TrainConfig cfg,
                                                         const WorkerInfo& worker,
                                                         const Options& options);
  static absl::StatusOr<std::unique_ptr<Session>> Create(config::TrainConfig cfg,
                                                         const WorkerInfo& worker) {
    return Create(std::move(cfg), worker, Options());
  }
  ~Session();

  // One step of the config's: a batch per accumulation step, forward, backward, the strategy's
  // reduction and the optimizer; reported as the training program reports it. Returns the
  // step's loss (the same on every data-parallel rank). Collective. An error after the config's
  // last step, or when the step fails (a collective timed out, the loss is not finite).
  absl::StatusOr<float> Step();
  bool done() const;  // the config's steps are done
  int step() const;   // steps done so far

  // The whole model's weights to a safetensors file (what `save_to` writes; tools/sample reads
  // it). Collective: every worker calls it; rank 0 writes.
  absl::Status Save(const std::string& path);
  // The run's summary line, the final evaluation and the config's save_to, once, after the last
  // step. Collective.
  absl::Status Finish();

  Module& model();  // this rank's model, as the strategy laid it out
  const config::TrainConfig& config() const;  // as validated (its "auto" values resolved)

 private:
  struct Impl;
  explicit Session(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace braid

#endif  // BRAID_LAUNCHER_SESSION_H_
