#include "core/registry.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace braid {

namespace {

constexpr char kBuiltIn[] = "built-in";

// The plugin whose register call is running on this thread, and what went wrong in it.
struct RegistrationScope {
  bool active = false;
  std::string plugin;
  std::vector<std::string> errors;
};
thread_local RegistrationScope g_scope;

}  // namespace

Registry& Registry::Get() {
  // Defined once, in core, which the host links once and exports to plugins. Never destroyed:
  // factories live in plugins' code, and exit-time destruction order across .so files is moot.
  static Registry* registry = new Registry();
  return *registry;
}

void Registry::BeginPluginRegistration(const std::string& plugin) {
  g_scope = RegistrationScope{true, plugin, {}};
}

std::vector<std::string> Registry::EndPluginRegistration() {
  std::vector<std::string> errors = std::move(g_scope.errors);
  g_scope = RegistrationScope{};
  return errors;
}

absl::Status Registry::AddStrategy(const std::string& name, StrategyFactory factory,
                                   const std::string& origin) {
  std::string from = origin == kBuiltIn && g_scope.active ? g_scope.plugin : origin;
  absl::Status status;
  if (name.empty()) {
    status =
        absl::InvalidArgumentError(absl::StrCat("a strategy from ", from, " has an empty name"));
  } else if (!factory) {
    status = absl::InvalidArgumentError(
        absl::StrCat("strategy '", name, "' from ", from, " has no factory"));
  } else {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = strategies_.find(name);
    if (it != strategies_.end()) {
      status = absl::AlreadyExistsError(absl::StrCat(
          "strategy '", name, "' is registered twice: by ", it->second.origin, " and by ", from,
          "; remove one of them from the plugin path or rename the strategy"));
    } else {
      strategies_.emplace(name, Entry{std::move(factory), from});
    }
  }
  if (!status.ok() && g_scope.active) g_scope.errors.push_back(std::string(status.message()));
  return status;
}

absl::StatusOr<std::unique_ptr<Strategy>> Registry::MakeStrategy(const std::string& name) const {
  StrategyFactory factory;
  std::string origin;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = strategies_.find(name);
    if (it == strategies_.end()) {
      std::vector<std::string> known;
      for (const auto& [n, e] : strategies_) known.push_back(n);
      return absl::NotFoundError(absl::StrCat(
          "unknown strategy '", name,
          "'; known strategies: ", known.empty() ? "(none registered)" : absl::StrJoin(known, ", "),
          ". A strategy comes from a plugin: load it (LoadPlugin / EnsureStrategy) first"));
    }
    factory = it->second.factory;
    origin = it->second.origin;
  }
  // Outside the lock: a factory may itself consult the registry.
  std::unique_ptr<Strategy> strategy = factory();
  if (strategy == nullptr) {
    return absl::InternalError(
        absl::StrCat("the factory of strategy '", name, "' (from ", origin, ") returned null"));
  }
  return strategy;
}

bool Registry::HasStrategy(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  return strategies_.count(name) > 0;
}

std::vector<std::string> Registry::StrategyNames() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> names;
  for (const auto& [n, e] : strategies_) names.push_back(n);
  return names;
}

}  // namespace braid
