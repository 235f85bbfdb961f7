#include "launcher/session.h"

#include <unistd.h>

#include <cstdlib>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "backends/cpu/cpu_backend.h"
#include "core/check.h"
#include "launcher/config/config.h"
#include "launcher/programs.h"
#include "launcher/run_folder.h"
#include "launcher/train_setup.h"
#include "launcher/trainer.h"
#include "launcher/worker_group.h"

namespace braid {

struct Session::Impl {
  std::unique_ptr<launcher::TrainingRun> run;
};

Session::Session(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Session::~Session() = default;

absl::StatusOr<config::TrainConfig> Session::LoadConfig(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("Session::LoadConfig: name a config file");
  // Problems of the keys wait for Create's validation, which reports them with its own.
  config::ReadOptions read;
  read.defer_to_validation = true;
  return config::LoadConfigFile(launcher::ResolveUserPath(path), read);
}

absl::StatusOr<std::unique_ptr<Session>> Session::Create(config::TrainConfig cfg,
                                                         const WorkerInfo& worker,
                                                         const Options& options) {
  launcher::TrainerEnv env;
  env.rank = worker.rank;
  env.world_size = worker.world_size;
  // The plugins beside this program, as the training program finds its own: in its runfiles
  // (a cc_binary with the plugins as data), or in the installed layout around it.
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  const std::string self = n > 0 ? std::string(exe, static_cast<size_t>(n)) : "";
  const launcher::PluginLocation plugins = launcher::FindPlugins(self.c_str());
  env.plugin_search_path = plugins.search_path;
  env.plugin_origin = plugins.origin;
  BRAID_RETURN_IF_ERROR(
      launcher::PrepareConfig(&cfg, env.world_size, env.rank, env.plugin_search_path));
  cpu::SetNumThreads(cfg.threads());
  env.log_dir = options.log_dir;
  if (env.log_dir.empty()) {
    if (const char* d = std::getenv(launcher::kRunDirEnv); d != nullptr) env.log_dir = d;
  }
  if (!env.log_dir.empty()) {
    BRAID_RETURN_IF_ERROR(launcher::MakeDirs(env.log_dir));
    const std::string& mf = cfg.log().metrics_file();
    env.metrics_path = mf.empty() ? env.log_dir + "/metrics.jsonl"
                       : mf[0] == '/' ? mf : absl::StrCat(env.log_dir, "/", mf);
  }
  env.quiet = options.quiet || cfg.log().quiet();
  env.interactive = isatty(fileno(stdout)) && !env.quiet;
  auto impl = std::make_unique<Impl>();
  BRAID_ASSIGN_OR_RETURN(impl->run, launcher::TrainingRun::Start(std::move(cfg), std::move(env)));
  return std::unique_ptr<Session>(new Session(std::move(impl)));
}

absl::StatusOr<float> Session::Step() {
  BRAID_ASSIGN_OR_RETURN(StepStats st, impl_->run->Step());
  return st.loss;
}

bool Session::done() const { return impl_->run->done(); }
int Session::step() const { return impl_->run->step(); }
absl::Status Session::Save(const std::string& path) {
  return impl_->run->SaveWeights(launcher::ResolveUserPath(path));
}
absl::Status Session::Finish() { return impl_->run->Finish().status(); }
Module& Session::model() { return impl_->run->model(); }
const config::TrainConfig& Session::config() const { return impl_->run->config(); }

}  // namespace braid
