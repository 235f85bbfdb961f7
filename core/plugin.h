// Finding and loading plugins (shared libraries exporting the entry points of plugin_api.h).
#ifndef BRAID_CORE_PLUGIN_H_
#define BRAID_CORE_PLUGIN_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace braid {

// Where plugins are looked for, in order: $BRAID_PLUGIN_PATH (colon-separated), then the
// folders given here (the training program adds its runfiles' plugin folders).
std::vector<std::string> PluginSearchPath(const std::vector<std::string>& extra = {});

// Loads a plugin given either
//   - a name ("my_strategy": letters, digits, '_', '-'): for each folder D of `search_path` in
//     order, D/libbraid_<name>.so then D/<name>/libbraid_<name>.so (the file the braid_plugin macro
//     of core/plugin.bzl builds, in the plugins/<name>/ layout); the first that exists wins, or
//   - a path (anything containing '/' or ending in ".so"), relative to the working directory.
// Loading the same file twice (by name or path, through symlinks too) is a no-op. Errors name
// the file (or the name and every path tried), and the reason: not found, dlopen's message, a
// missing entry point, an ABI version mismatch, or a failed registration. Plugins are never
// unloaded: their factories and kernels stay referenced for the life of the process.
absl::Status LoadPlugin(const std::string& name_or_path,
                        const std::vector<std::string>& search_path);

// Every plugin file on `search_path`, each loaded as LoadPlugin(name) would: for each folder D in
// order, D/libbraid_*.so and D/*/libbraid_*.so; a name found in several folders is loaded from
// the first only (as LoadPlugin by name would), and files already loaded are not loaded again.
// A file that fails to load does not stop the others: it is reported in `failed`. Used to find
// which strategy provides a feature (StrategyTraits) when the chosen one does not.
struct PluginScan {
  std::vector<std::string> loaded;  // canonical paths of the plugins now loaded
  std::vector<absl::Status> failed;  // one per file that could not be loaded; each names it
};
PluginScan LoadAllPlugins(const std::vector<std::string>& search_path);

// Makes sure strategy `name` is registered, loading plugin `name` from the search path if not.
absl::Status EnsureStrategy(const std::string& name, const std::vector<std::string>& search_path);

// The same for communicator backends ("gloo" loads libbraid_gloo.so).
absl::Status EnsureCommunicator(const std::string& name,
                                const std::vector<std::string>& search_path);

// The same for models (model.name): one that no linked library registers is loaded from plugin
// `name` on the search path (a user's model built with the braid_plugin macro). An unknown name
// is an error listing the registered models and every file looked for.
absl::Status EnsureModel(const std::string& name, const std::vector<std::string>& search_path);

// The same for optimizers (optimizer.type): one a plugin registers is loaded from plugin
// `<name, lowercased>` ("Adam8bit" loads libbraid_adam8bit.so). Names match case-insensitively,
// as config validation matches optimizer.type, so "adamw" finds core's "AdamW" and loads nothing.
// An unknown name is an error listing the registered optimizers and the files looked for.
absl::Status EnsureOptimizer(const std::string& name, const std::vector<std::string>& search_path);

}  // namespace braid

#endif  // BRAID_CORE_PLUGIN_H_
