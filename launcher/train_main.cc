// The training program: reads a config, trains, reports. Usually started by //launcher, which
// sets RANK / WORLD_SIZE; runs on its own as a single process too.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "backends/cpu/cpu_backend.h"
#include "core/check.h"
#include "launcher/config/config.h"
#include "launcher/elastic_batch.h"
#include "launcher/elastic_keys.h"
#include "launcher/programs.h"
#include "launcher/run_folder.h"
#include "launcher/train_setup.h"
#include "launcher/trainer.h"
#include "launcher/worker_group.h"

ABSL_FLAG(std::string, config, "",
          "training config (.pbtxt/.textproto/.txt text format, or .json); empty = the reference "
          "run (gpt-mini on Moby Dick)");
ABSL_FLAG(int, steps, 0, "override the config's steps (> 0)");
ABSL_FLAG(int, threads, 0, "override the config's threads (> 0)");
ABSL_FLAG(std::string, strategy, "", "override the config's strategy name");
ABSL_FLAG(std::string, init_from, "", "override: start from these safetensors weights");
ABSL_FLAG(std::string, save_to, "", "override: write the final weights here (safetensors)");
ABSL_FLAG(std::string, log_dir, "",
          "folder for metrics.jsonl and train.log (default: the config's log.dir, else "
          "the launcher's run folder, else runs/<config name>-<time> in the workspace)");
ABSL_FLAG(bool, print_config, false, "print the effective config (text format) and exit");

namespace {

int EnvInt(const char* name, int def) {
  const char* v = std::getenv(name);
  int out;
  return v && absl::SimpleAtoi(v, &out) ? out : def;
}

absl::Status Run(const char* argv0) {
  using braid::config::TrainConfig;
  TrainConfig cfg;
  std::string path = absl::GetFlag(FLAGS_config);
  if (!path.empty()) {
    // Problems of the keys wait for validation, which reports them with its own in one message.
    braid::config::ReadOptions read;
    read.defer_to_validation = true;
    BRAID_ASSIGN_OR_RETURN(cfg, braid::config::LoadConfigFile(path, read));
  }
  if (absl::GetFlag(FLAGS_steps) > 0) cfg.set_steps(absl::GetFlag(FLAGS_steps));
  if (absl::GetFlag(FLAGS_threads) > 0) cfg.set_threads(absl::GetFlag(FLAGS_threads));
  if (!absl::GetFlag(FLAGS_strategy).empty()) cfg.mutable_strategy()->set_name(absl::GetFlag(FLAGS_strategy));
  if (!absl::GetFlag(FLAGS_init_from).empty()) cfg.set_init_from(absl::GetFlag(FLAGS_init_from));
  if (!absl::GetFlag(FLAGS_save_to).empty()) cfg.set_save_to(absl::GetFlag(FLAGS_save_to));
  braid::launcher::TrainerEnv env;
  env.rank = EnvInt("RANK", 0);
  env.world_size = EnvInt("WORLD_SIZE", 1);
  const braid::launcher::PluginLocation plugins = braid::launcher::FindPlugins(argv0);
  env.plugin_search_path = plugins.search_path;
  env.plugin_origin = plugins.origin;
  // An elastic job keeps its global batch: accumulation is derived for this round's world size,
  // which must be one the batch allows (launcher/elastic_batch.h).
  BRAID_ASSIGN_OR_RETURN(std::optional<braid::launcher::ElasticNodes> elastic, braid::launcher::ElasticNodesFromEnv());
  if (elastic) {
    BRAID_ASSIGN_OR_RETURN(
        std::string table,
        braid::launcher::PrepareElasticBatch(
            &cfg, *elastic, EnvInt("LOCAL_WORLD_SIZE", 1), env.world_size,
            [&](braid::config::TrainConfig* c, int world) {
              return braid::launcher::PrepareConfig(c, world, /*rank=*/-1, env.plugin_search_path);
            }));
    if (env.rank == 0) std::fprintf(stderr, "%s\n", table.c_str());
  }
  BRAID_RETURN_IF_ERROR(
      braid::launcher::PrepareConfig(&cfg, env.world_size, env.rank, env.plugin_search_path));
  if (absl::GetFlag(FLAGS_print_config)) {
    std::printf("%s", braid::config::ConfigToText(cfg).c_str());
    return absl::OkStatus();
  }
  braid::cpu::SetNumThreads(cfg.threads());

  // The run folder: --log_dir, else the config's log.dir, else the folder of the run whose
  // checkpoint this run resumes from (a new command continues its metrics), else the one the
  // launcher chose for every process of the job (restarts included), else runs/<config>-<time>
  // of our own.
  std::string log_dir = absl::GetFlag(FLAGS_log_dir);
  if (log_dir.empty()) log_dir = cfg.log().dir();
  if (log_dir.empty() && cfg.has_checkpoint() &&
      (!cfg.checkpoint().has_resume() || cfg.checkpoint().resume())) {
    std::string dir = cfg.checkpoint().dir();
    const char* ws = std::getenv("BUILD_WORKSPACE_DIRECTORY");  // as the trainer resolves it
    if (!dir.empty() && dir[0] != '/' && ws != nullptr && *ws) dir = absl::StrCat(ws, "/", dir);
    log_dir = braid::launcher::RunFolderOfCheckpoint(dir);
  }
  if (const char* chosen = std::getenv(braid::launcher::kRunDirEnv); log_dir.empty() && chosen) {
    log_dir = chosen;
  }
  if (log_dir.empty()) {
    const char* ws = std::getenv("BUILD_WORKSPACE_DIRECTORY");
    std::string base = ws ? ws : ".";
    log_dir = absl::StrCat(base, "/runs/",
                           braid::launcher::RunFolderName(path, cfg.model().name(), absl::Now()));
  }
  // Made here, not by a shell: a bundle's program may run where there is none (docs/GPU.md).
  if (absl::Status st = braid::launcher::MakeDirs(log_dir); !st.ok()) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create log folder '", log_dir, "': ", st.message()));
  }
  env.log_dir = log_dir;
  const std::string& mf = cfg.log().metrics_file();
  env.metrics_path = mf.empty() ? log_dir + "/metrics.jsonl"
                     : mf[0] == '/' ? mf : absl::StrCat(log_dir, "/", mf);
  env.quiet = cfg.log().quiet();
  env.interactive = isatty(fileno(stdout)) && !env.quiet;
  BRAID_ASSIGN_OR_RETURN(auto result, braid::launcher::Train(cfg, env));
  (void)result;
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Braid training program: train --config=FILE [overrides]");
  absl::ParseCommandLine(argc, argv);
  absl::Status st = Run(argv[0]);
  if (braid::launcher::IsRegroup(st)) {  // not a failure: the launchers restart the group larger
    std::fprintf(stderr, "braid train: %s\n", std::string(st.message()).c_str());
    return braid::launcher::kExitRegroup;
  }
  if (!st.ok()) {
    std::fprintf(stderr, "braid train: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  return 0;
}
