// Your own training program (docs/LAUNCHING.md, *Your own program*): a main() that trains a
// config with braid::Session, started either way:
//
//   bazel run //launcher/examples/my_train -- --nprocs=2 --steps=20      # braid::Spawn, no launcher
//   bazel build //launcher/examples/my_train //launcher                    # under the launcher:
//   bazel-bin/launcher/launcher --nproc_per_node=2
//       --program=bazel-bin/launcher/examples/my_train/my_train -- --steps=20
//
// Under the launcher (or Slurm, MPI, ... through it) braid::Spawn sees the worker's variables and
// runs Worker at once; started alone, it starts --nprocs workers of this program itself.
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "launcher/session.h"
#include "launcher/spawn.h"

ABSL_FLAG(std::string, config, "launcher/configs/gpt-mini-ddp.pbtxt",
          "the training config (text format or DeepSpeed JSON)");
ABSL_FLAG(int, steps, 0, "train this many steps instead of the config's (> 0)");
ABSL_FLAG(int, nprocs, 2, "worker processes when started without the launcher");
ABSL_FLAG(std::string, log_dir, "", "run folder: worker logs, metrics.jsonl, train.log");
ABSL_FLAG(std::string, save_to, "", "write the trained weights here (safetensors)");

namespace {

int Fail(const braid::WorkerInfo& w, const absl::Status& st) {
  std::fprintf(stderr, "my_train: rank %d: %s\n", w.rank, std::string(st.message()).c_str());
  return 1;
}

// One worker: the config's model, strategies and data, trained step by step.
int Worker(const braid::WorkerInfo& w) {
  absl::StatusOr<braid::config::TrainConfig> cfg =
      braid::Session::LoadConfig(absl::GetFlag(FLAGS_config));
  if (!cfg.ok()) return Fail(w, cfg.status());
  if (absl::GetFlag(FLAGS_steps) > 0) cfg->set_steps(absl::GetFlag(FLAGS_steps));

  absl::StatusOr<std::unique_ptr<braid::Session>> session = braid::Session::Create(*cfg, w);
  if (!session.ok()) return Fail(w, session.status());
  braid::Session& s = **session;

  float last = 0;
  while (!s.done()) {
    absl::StatusOr<float> loss = s.Step();
    if (!loss.ok()) return Fail(w, loss.status());
    last = *loss;
  }
  if (!absl::GetFlag(FLAGS_save_to).empty()) {
    if (absl::Status st = s.Save(absl::GetFlag(FLAGS_save_to)); !st.ok()) return Fail(w, st);
  }
  if (absl::Status st = s.Finish(); !st.ok()) return Fail(w, st);
  if (w.rank == 0) {
    std::printf("my_train: %d rank(s) trained %d step(s); last loss %.6f\n", w.world_size,
                s.step(), last);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  braid::SpawnOptions options;
  options.log_dir = absl::GetFlag(FLAGS_log_dir);
  return braid::Spawn(absl::GetFlag(FLAGS_nprocs), Worker, options);
}
