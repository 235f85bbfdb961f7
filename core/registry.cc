#include "core/registry.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/check.h"

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

template <typename Factory>
absl::Status Registry::Add(Table<Factory>& table, const std::string& name, Factory factory,
                           const std::string& origin) {
  std::string from = origin == kBuiltIn && g_scope.active ? g_scope.plugin : origin;
  absl::Status status;
  if (name.empty()) {
    status = absl::InvalidArgumentError(
        absl::StrCat("a ", table.kind, " from ", from, " has an empty name"));
  } else if (!factory) {
    status = absl::InvalidArgumentError(
        absl::StrCat(table.kind, " '", name, "' from ", from, " has no factory"));
  } else {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = table.entries.find(name);
    if (it != table.entries.end()) {
      status = absl::AlreadyExistsError(absl::StrCat(
          table.kind, " '", name, "' is registered twice: by ", it->second.origin, " and by ",
          from, "; remove one of them from the plugin path or rename the ", table.kind));
    } else {
      table.entries.emplace(name, typename Table<Factory>::Entry{std::move(factory), from});
    }
  }
  if (!status.ok() && g_scope.active) g_scope.errors.push_back(std::string(status.message()));
  return status;
}

template <typename Factory>
absl::StatusOr<std::pair<Factory, std::string>> Registry::Find(const Table<Factory>& table,
                                                               const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = table.entries.find(name);
  if (it == table.entries.end()) {
    std::vector<std::string> known;
    for (const auto& [n, e] : table.entries) known.push_back(n);
    return absl::NotFoundError(absl::StrCat(
        "unknown ", table.kind, " '", name, "'; known: ",
        known.empty() ? "(none registered)" : absl::StrJoin(known, ", "), ". A ", table.kind,
        " comes from a plugin: load it (LoadPlugin / EnsureStrategy) first"));
  }
  return std::make_pair(it->second.factory, it->second.origin);
}

template <typename Factory>
std::vector<std::string> Registry::Names(const Table<Factory>& table) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> names;
  for (const auto& [n, e] : table.entries) names.push_back(n);
  return names;
}

absl::Status Registry::AddStrategy(const std::string& name, StrategyFactory factory,
                                   const std::string& origin) {
  return Add(strategies_, name, std::move(factory), origin);
}

absl::StatusOr<std::unique_ptr<Strategy>> Registry::MakeStrategy(const std::string& name) const {
  BRAID_ASSIGN_OR_RETURN(auto found, Find(strategies_, name));
  // Outside the lock: a factory may itself consult the registry.
  std::unique_ptr<Strategy> strategy = found.first();
  if (strategy == nullptr) {
    return absl::InternalError(absl::StrCat("the factory of strategy '", name, "' (from ",
                                            found.second, ") returned null"));
  }
  return strategy;
}

bool Registry::HasStrategy(const std::string& name) const { return Find(strategies_, name).ok(); }

std::vector<std::string> Registry::StrategyNames() const { return Names(strategies_); }

absl::Status Registry::AddCommunicator(const std::string& name, CommunicatorFactory factory,
                                       const std::string& origin) {
  return Add(communicators_, name, std::move(factory), origin);
}

absl::StatusOr<std::unique_ptr<Communicator>> Registry::MakeCommunicator(
    const std::string& name, const CommunicatorOptions& options) const {
  BRAID_ASSIGN_OR_RETURN(auto found, Find(communicators_, name));
  BRAID_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> comm, found.first(options));
  if (comm == nullptr) {
    return absl::InternalError(absl::StrCat("the factory of communicator '", name, "' (from ",
                                            found.second, ") returned null"));
  }
  return comm;
}

bool Registry::HasCommunicator(const std::string& name) const {
  return Find(communicators_, name).ok();
}

std::vector<std::string> Registry::CommunicatorNames() const { return Names(communicators_); }

}  // namespace braid
