#include "launcher/train_setup.h"

#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/cuda/device_check.h"
#include "core/check.h"
#include "core/plugin.h"
#include "core/registry.h"
#include "launcher/compose.h"
#include "launcher/config/config.h"
#include "launcher/programs.h"
#include "tools/cpp/runfiles/runfiles.h"

namespace braid::launcher {

using bazel::tools::cpp::runfiles::Runfiles;

PluginLocation FindPlugins(const char* argv0) {
  PluginLocation loc;
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
      loc.origin = absl::StrCat("from the runfiles at ", root);
    }
  }
  if (root.empty()) {
    std::string exe_dir = std::string(argv0).substr(0, std::string(argv0).rfind('/') + 1);
    root = (exe_dir.empty() ? std::string("./") : exe_dir) + "..";
    loc.origin = absl::StrCat("from the folders beside the program at ", root);
  }
  loc.search_path.push_back(root + "/plugins");
  loc.search_path.push_back(root + "/backends");
  return loc;
}

namespace {

// A relative strategy.path means what a relative --config means: the user's folder (under
// `bazel run`, their checkout), not the runfiles tree this program starts in; and a bare file
// name must not send dlopen searching the library path.
void ResolveUserPaths(config::TrainConfig* cfg) {
  if (!cfg->strategy().path().empty()) {
    cfg->mutable_strategy()->set_path(Absolute(ResolveUserPath(cfg->strategy().path())));
  }
  // data.path too: a prepared data set named from the checkout, as the shipped configs do.
  if (!cfg->data().path().empty()) {
    cfg->mutable_data()->set_path(Absolute(ResolveUserPath(cfg->data().path())));
  }
  // And model.path, a user's model plugin (docs/WRITING_A_MODEL.md).
  if (!cfg->model().path().empty()) {
    cfg->mutable_model()->set_path(Absolute(ResolveUserPath(cfg->model().path())));
  }
}

// What validation asks of the plugins: a strategy's features, the strategies providing a
// feature, the device's half-precision support and the layer stack for a layout. `cfg` outlives
// the catalog (validation runs while both live).
config::StrategyCatalog MakeStrategyCatalog(const config::TrainConfig& cfg,
                                            const std::vector<std::string>& search_path) {
  config::StrategyCatalog catalog;
  // Feature sections (fp16, zero_optimization, ...) are validated against what the chosen
  // strategy declares when it registers: its plugin is loaded for that (only when the config
  // asks for a feature). When it lacks one, every plugin on the search path is loaded to name
  // the strategies that have it.
  catalog.features_of =
      [&cfg, search_path](const std::string& name) -> absl::StatusOr<std::vector<std::string>> {
    if (!cfg.strategy().path().empty()) {
      BRAID_RETURN_IF_ERROR(LoadPlugin(cfg.strategy().path(), search_path));
    }
    BRAID_RETURN_IF_ERROR(EnsureStrategy(name, search_path));
    BRAID_ASSIGN_OR_RETURN(StrategyTraits traits, Registry::Get().GetStrategyTraits(name));
    return traits.features;
  };
  catalog.providers_of = [search_path](const std::string& feature) {
    PluginScan scan = LoadAllPlugins(search_path);
    config::FeatureProviders found;
    for (auto& [name, origin] : Registry::Get().StrategiesProviding(feature)) {
      found.strategies.push_back({name, origin});
    }
    for (const absl::Status& failed : scan.failed) {
      found.unloadable.push_back(std::string(failed.message()));
    }
    return found;
  };
  catalog.searched = "strategy in the plugins on the search path";
  // fp16/bf16 "auto": what the device's backend says it computes in (a CPU: neither).
  catalog.half_support = [](const std::string& device) {
    config::HalfSupport out;
    absl::StatusOr<Device> d = Device::Parse(device);
    if (!d.ok() || d->type != DeviceType::kCUDA) return out;
    // No answer (no usable device): off here; preparing the device reports why, later.
    absl::StatusOr<cuda::HalfSupport> s = cuda::DeviceHalfSupport(*d, nullptr);
    out.bf16 = s.ok() && s->bf16;
    out.fp16 = s.ok() && s->f16;
    return out;
  };
  // The stack of layers for the layout (launcher/compose.h): fills in the strategy of a config
  // that names none, and refuses a layout no stack serves before any process trains.
  catalog.compose = [layers = PluginLayerCatalog(search_path, cfg.strategy().path())](
                        int tensor, int pipeline, int data, const std::string& named,
                        const std::vector<std::string>& features) -> absl::StatusOr<std::string> {
    BRAID_ASSIGN_OR_RETURN(Stack stack,
                           ComposeStack(tensor, pipeline, data, named, layers, features));
    return stack.state_holder();
  };
  return catalog;
}

// Loads the model and optimizer plugins the config names, before validation looks the names up
// in the registry.
absl::Status LoadNamedPlugins(config::TrainConfig* cfg,
                              const std::vector<std::string>& search_path) {
  // A model may come from a plugin: model.path's, or plugin <model.name> on the search path. It
  // is loaded before validation, which looks the name up in the registry; an unknown name is
  // refused listing the registered models and where the plugin was looked for.
  // A config whose reader deferred its problems to validation (ReadOptions.defer_to_validation:
  // it has reader problems, or the positions of its keys) has them reported with validation's in
  // one message: a plugin not found is one more of them, placed at the key that named it.
  auto one_more = [&](const absl::Status& st) {
    if (cfg->reader_problems().empty() && cfg->key_positions().empty()) return false;
    cfg->add_reader_problems(std::string(st.message()));
    return true;
  };
  if (!cfg->model().path().empty()) {
    if (cfg->model().name().empty()) {
      absl::Status st = absl::InvalidArgumentError(
          "model.path is set but model.name is empty: name the model its plugin registers");
      if (!one_more(st)) return st;
    }
    absl::Status st = LoadPlugin(cfg->model().path(), search_path);
    if (!st.ok()) {
      st = absl::Status(st.code(), absl::StrCat("model.path: ", st.message()));
      if (!one_more(st)) return st;
    }
  }
  if (!cfg->model().name().empty()) {
    absl::Status st = EnsureModel(cfg->model().name(), search_path);
    if (!st.ok()) {
      st = absl::Status(st.code(), absl::StrCat("model.name: ", st.message()));
      if (!one_more(st)) return st;
    }
  }
  // optimizer.type may name an optimizer that a plugin registers ("Adam8bit" comes from
  // libbraid_adam8bit.so): load it before validation, which looks the name up in the registry.
  if (!cfg->optimizer().type().empty()) {
    absl::Status st = EnsureOptimizer(cfg->optimizer().type(), search_path);
    // A DeepSpeed optimizer Braid lacks (Lamb, OneBitAdam, ...): validation refuses it naming
    // the nearest Braid one, which says more than "no plugin of that name".
    const bool refused_by_validation =
        absl::IsNotFound(st) && config::IsDeepSpeedOptimizerBraidLacks(cfg->optimizer().type());
    if (!st.ok() && !refused_by_validation) {
      st = absl::Status(st.code(), absl::StrCat("optimizer.type: ", st.message()));
      if (!one_more(st)) return st;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status PrepareConfig(config::TrainConfig* cfg, int world_size, int rank,
                           const std::vector<std::string>& plugin_search_path) {
  ResolveUserPaths(cfg);
  const std::vector<std::string> search_path = PluginSearchPath(plugin_search_path);
  BRAID_RETURN_IF_ERROR(LoadNamedPlugins(cfg, search_path));
  BRAID_RETURN_IF_ERROR(
      config::ValidateConfigWith(cfg, world_size, MakeStrategyCatalog(*cfg, search_path)));
  // The data's ids against the model's vocabulary, before the model is built, where the dataset
  // can tell (a prepared data set from its manifest; its shards' checksums are checked when it is
  // opened).
  absl::StatusOr<DatasetSpec> data = Registry::Get().GetDataset(cfg->data().dataset());
  if (data.ok() && data->check_vocab && cfg->model().vocab_size() > 0) {
    BRAID_RETURN_IF_ERROR(data->check_vocab(config::SectionsOf(*cfg), cfg->model().vocab_size()));
  }
  // What validation resolved or accepted without effect ("auto" values, DeepSpeed's own tuning
  // keys), once per job.
  if (rank == 0) {
    for (const std::string& note : config::ConfigNotes(*cfg)) {
      std::fprintf(stderr, "braid: config: %s\n", note.c_str());
    }
  }
  return absl::OkStatus();
}

}  // namespace braid::launcher
