// The process's one registry of named factories (strategies, and later other plugin kinds).
// It lives in core, which the host program links once and exports to plugins (-rdynamic); a
// plugin that linked its own copy of core would register into an invisible second registry.
#ifndef BRAID_CORE_REGISTRY_H_
#define BRAID_CORE_REGISTRY_H_

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/strategy.h"

namespace braid {

class Registry {
 public:
  static Registry& Get();

  // Fails if the name is taken (two plugins claiming one name is a configuration error).
  absl::Status AddStrategy(const std::string& name, StrategyFactory factory,
                           const std::string& origin = "built-in");
  // Unknown names are an error listing the known ones.
  absl::StatusOr<std::unique_ptr<Strategy>> MakeStrategy(const std::string& name) const;
  bool HasStrategy(const std::string& name) const;
  std::vector<std::string> StrategyNames() const;

  // LoadPlugin brackets a plugin's register call with these (on one thread): AddStrategy calls
  // in between that keep the default origin are attributed to `plugin`, and their errors are
  // handed back so that the load fails saying why, even if the plugin ignored them.
  void BeginPluginRegistration(const std::string& plugin);
  std::vector<std::string> EndPluginRegistration();

 private:
  Registry() = default;
  struct Entry {
    StrategyFactory factory;
    std::string origin;
  };
  mutable std::mutex mu_;
  std::map<std::string, Entry> strategies_;
};

}  // namespace braid

#endif  // BRAID_CORE_REGISTRY_H_
