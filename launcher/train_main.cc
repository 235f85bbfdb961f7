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
#include "launcher/compose.h"
#include "core/plugin.h"
#include "core/registry.h"
#include "launcher/programs.h"
#include "launcher/run_folder.h"
#include "launcher/trainer.h"
#include "models/data/token_manifest.h"
#include "tools/cpp/runfiles/runfiles.h"

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

using bazel::tools::cpp::runfiles::Runfiles;

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
    BRAID_ASSIGN_OR_RETURN(cfg, braid::config::LoadConfigFile(path));
  }
  if (absl::GetFlag(FLAGS_steps) > 0) cfg.set_steps(absl::GetFlag(FLAGS_steps));
  if (absl::GetFlag(FLAGS_threads) > 0) cfg.set_threads(absl::GetFlag(FLAGS_threads));
  if (!absl::GetFlag(FLAGS_strategy).empty()) cfg.mutable_strategy()->set_name(absl::GetFlag(FLAGS_strategy));
  if (!absl::GetFlag(FLAGS_init_from).empty()) cfg.set_init_from(absl::GetFlag(FLAGS_init_from));
  if (!absl::GetFlag(FLAGS_save_to).empty()) cfg.set_save_to(absl::GetFlag(FLAGS_save_to));
  // A relative strategy.path means what a relative --config means: the user's folder (under
  // `bazel run`, their checkout), not the runfiles tree this program starts in; and a bare file
  // name must not send dlopen searching the library path.
  if (!cfg.strategy().path().empty()) {
    cfg.mutable_strategy()->set_path(
        braid::launcher::Absolute(braid::launcher::ResolveUserPath(cfg.strategy().path())));
  }
  // data.path too: a prepared data set named from the checkout, as the shipped configs do.
  if (!cfg.data().path().empty()) {
    cfg.mutable_data()->set_path(
        braid::launcher::Absolute(braid::launcher::ResolveUserPath(cfg.data().path())));
  }

  braid::launcher::TrainerEnv env;
  env.rank = EnvInt("RANK", 0);
  env.world_size = EnvInt("WORLD_SIZE", 1);

  // Plugins ship in this program's runfiles as plugins/<name>/libbraid_<name>.so and
  // backends/<name>/libbraid_<name>.so; the loader looks in <folder>/<name>/ of each folder.
  // The runfiles are our own tree, or, when //launcher started us, the launcher's (it hands us
  // their environment). Without runfiles (a copied bazel-bin tree), the same layout around us:
  // <root>/launcher/train beside <root>/plugins/ and <root>/backends/.
  std::string root;
  std::string error;
  std::unique_ptr<Runfiles> rf(Runfiles::Create(argv0, &error));
  if (rf) {
    std::string marker = rf->Rlocation("braid/plugins/single/libbraid_single.so");
    if (!marker.empty() && access(marker.c_str(), R_OK) == 0) {
      root = marker.substr(0, marker.rfind("/plugins/single/"));
      env.plugin_origin = absl::StrCat("from the runfiles at ", root);
    }
  }
  if (root.empty()) {
    std::string exe_dir = std::string(argv0).substr(0, std::string(argv0).rfind('/') + 1);
    root = (exe_dir.empty() ? std::string("./") : exe_dir) + "..";
    env.plugin_origin = absl::StrCat("from the folders beside the program at ", root);
  }
  env.plugin_search_path.push_back(root + "/plugins");
  env.plugin_search_path.push_back(root + "/backends");

  // Feature sections (fp16, zero_optimization, ...) are validated against what the chosen
  // strategy declares when it registers: its plugin is loaded for that (only when the config
  // asks for a feature). When it lacks one, every plugin on the search path is loaded to name
  // the strategies that have it.
  const std::vector<std::string> search_path = braid::PluginSearchPath(env.plugin_search_path);
  braid::config::StrategyCatalog catalog;
  catalog.features_of =
      [&](const std::string& name) -> absl::StatusOr<std::vector<std::string>> {
    if (!cfg.strategy().path().empty()) {
      BRAID_RETURN_IF_ERROR(braid::LoadPlugin(cfg.strategy().path(), search_path));
    }
    BRAID_RETURN_IF_ERROR(braid::EnsureStrategy(name, search_path));
    BRAID_ASSIGN_OR_RETURN(braid::StrategyTraits traits,
                           braid::Registry::Get().GetStrategyTraits(name));
    return traits.features;
  };
  catalog.providers_of = [&](const std::string& feature) {
    braid::PluginScan scan = braid::LoadAllPlugins(search_path);
    braid::config::FeatureProviders found;
    for (auto& [name, origin] : braid::Registry::Get().StrategiesProviding(feature)) {
      found.strategies.push_back({name, origin});
    }
    for (const absl::Status& failed : scan.failed) {
      found.unloadable.push_back(std::string(failed.message()));
    }
    return found;
  };
  catalog.searched = "strategy in the plugins on the search path";
  // The stack of layers for the layout (launcher/compose.h): fills in the strategy of a config
  // that names none, and refuses a layout no stack serves before any process trains.
  const braid::launcher::LayerCatalog layers =
      braid::launcher::PluginLayerCatalog(search_path, cfg.strategy().path());
  catalog.compose = [&](int tensor, int pipeline, int data, const std::string& named,
                        const std::vector<std::string>& features) -> absl::StatusOr<std::string> {
    BRAID_ASSIGN_OR_RETURN(braid::launcher::Stack stack,
                           braid::launcher::ComposeStack(tensor, pipeline, data, named, layers, features));
    return stack.state_holder();
  };
  // optimizer.type may name an optimizer that a plugin registers ("Adam8bit" comes from
  // libbraid_adam8bit.so): load it before validation, which looks the name up in the registry.
  if (!cfg.optimizer().type().empty()) {
    absl::Status st = braid::EnsureOptimizer(cfg.optimizer().type(), search_path);
    // A DeepSpeed optimizer Braid lacks (Lamb, OneBitAdam, ...): validation refuses it naming
    // the nearest Braid one, which says more than "no plugin of that name".
    const bool refused_by_validation =
        absl::IsNotFound(st) && braid::config::IsDeepSpeedOptimizerBraidLacks(cfg.optimizer().type());
    if (!st.ok() && !refused_by_validation) {
      return absl::Status(st.code(), absl::StrCat("optimizer.type: ", st.message()));
    }
  }
  BRAID_RETURN_IF_ERROR(braid::config::ValidateConfigWith(&cfg, env.world_size, catalog));
  // A prepared data set's ids against the model's vocabulary, from its manifest, before the model
  // is built (the shards' checksums are checked when the data is opened).
  if (cfg.data().dataset() == "tokens" && cfg.model().vocab_size() > 0 &&
      braid::data::IsTokenDatasetPath(cfg.data().path())) {
    BRAID_RETURN_IF_ERROR(
        braid::data::CheckTokenDatasetVocab(cfg.data().path(), cfg.model().vocab_size()));
  }
  // What validation resolved or accepted without effect ("auto" values, DeepSpeed's own tuning
  // keys), once per job.
  if (env.rank == 0) {
    for (const std::string& note : braid::config::ConfigNotes(cfg)) {
      std::fprintf(stderr, "braid: config: %s\n", note.c_str());
    }
  }
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
  if (std::system(absl::StrCat("mkdir -p '", log_dir, "'").c_str()) != 0) {
    return absl::PermissionDeniedError(absl::StrCat("cannot create log folder '", log_dir, "'"));
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
  if (!st.ok()) {
    std::fprintf(stderr, "braid train: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  return 0;
}
