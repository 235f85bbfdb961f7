// What a training program does with its config before it trains, shared by the training program
// (train_main.cc) and a user's own program (launcher/session.h): find the plugins, then resolve,
// load what the config names and validate it, as one implementation.
#ifndef BRAID_LAUNCHER_TRAIN_SETUP_H_
#define BRAID_LAUNCHER_TRAIN_SETUP_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "launcher/config/train_config.pb.h"

namespace braid::launcher {

// Where the plugins (plugins/<name>/libbraid_<name>.so, backends/<name>/...) are: in the
// runfiles of `argv0` (or of the launcher that started it, which hands its runfiles'
// environment on), else in the folders around the program (<root>/launcher/train beside
// <root>/plugins/). `origin` says which, for train.log.
struct PluginLocation {
  std::vector<std::string> search_path;
  std::string origin;
};
PluginLocation FindPlugins(const char* argv0);

// Makes the config's relative paths (strategy.path, data.path, model.path) the user's (under
// `bazel run`, their checkout), loads the model, optimizer and strategy plugins it names (an
// unknown model name is refused listing the known ones and the search path), validates it for
// `world_size` processes (filling in the strategy stack for its layout), checks a prepared data
// set's vocabulary against the model, and on rank 0 prints what validation resolved.
absl::Status PrepareConfig(config::TrainConfig* cfg, int world_size, int rank,
                           const std::vector<std::string>& plugin_search_path);

}  // namespace braid::launcher

#endif  // BRAID_LAUNCHER_TRAIN_SETUP_H_
