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
#include "core/communicator.h"
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

  // Communicator backends ("gloo", "nccl"), same rules as strategies.
  absl::Status AddCommunicator(const std::string& name, CommunicatorFactory factory,
                               const std::string& origin = "built-in");
  absl::StatusOr<std::unique_ptr<Communicator>> MakeCommunicator(
      const std::string& name, const CommunicatorOptions& options) const;
  bool HasCommunicator(const std::string& name) const;
  std::vector<std::string> CommunicatorNames() const;

  // LoadPlugin brackets a plugin's register call with these (on one thread): AddStrategy calls
  // in between that keep the default origin are attributed to `plugin`, and their errors are
  // handed back so that the load fails saying why, even if the plugin ignored them.
  void BeginPluginRegistration(const std::string& plugin);
  std::vector<std::string> EndPluginRegistration();

 private:
  Registry() = default;
  // One table per plugin kind; the kinds differ only in their factory's type.
  template <typename Factory>
  struct Table {
    const char* kind;  // "strategy", "communicator": for messages
    struct Entry {
      Factory factory;
      std::string origin;
    };
    std::map<std::string, Entry> entries;
  };
  template <typename Factory>
  absl::Status Add(Table<Factory>& table, const std::string& name, Factory factory,
                   const std::string& origin);
  template <typename Factory>
  absl::StatusOr<std::pair<Factory, std::string>> Find(const Table<Factory>& table,
                                                       const std::string& name) const;
  template <typename Factory>
  std::vector<std::string> Names(const Table<Factory>& table) const;

  mutable std::mutex mu_;
  Table<StrategyFactory> strategies_{"strategy", {}};
  Table<CommunicatorFactory> communicators_{"communicator", {}};
};

}  // namespace braid

#endif  // BRAID_CORE_REGISTRY_H_
