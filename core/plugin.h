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

// Loads "name" (found as lib<name>.so or braid_<name>.so ... on the search path; see plugin.cc)
// or an explicit path to a .so. Loading the same file twice is a no-op. Errors name the file,
// the folders searched, and the reason (not found, dlopen's message, missing entry point,
// ABI version mismatch, registration failure).
absl::Status LoadPlugin(const std::string& name_or_path, const std::vector<std::string>& search_path);

// Makes sure strategy `name` is registered, loading plugin `name` from the search path if not.
absl::Status EnsureStrategy(const std::string& name, const std::vector<std::string>& search_path);

}  // namespace braid

#endif  // BRAID_CORE_PLUGIN_H_
