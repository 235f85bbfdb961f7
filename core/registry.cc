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

// Whether an entry can be used (a factory, or a spec with its factory), and what is missing if
// not; whether it claims to be the default of its kind.
template <typename Factory>
const char* Missing(const Factory& factory) {
  return factory ? nullptr : "has no factory";
}
const char* Missing(const ModelSpec& spec) {
  return spec.build ? nullptr : "has no build function";
}
const char* Missing(const OptimizerSpec& spec) {
  return spec.make ? nullptr : "has no make function";
}
const char* Missing(const DatasetSpec& spec) {
  return spec.yields.empty() ? "does not say what it yields (DatasetSpec::yields)" : nullptr;
}
template <typename Factory>
bool IsDefault(const Factory&) {
  return false;
}
bool IsDefault(const ModelSpec& spec) { return spec.is_default; }
bool IsDefault(const OptimizerSpec& spec) { return spec.is_default; }
bool IsDefault(const DatasetSpec& spec) { return spec.is_default; }

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
  } else if (const char* missing = Missing(factory)) {
    status = absl::InvalidArgumentError(
        absl::StrCat(table.kind, " '", name, "' from ", from, " ", missing));
  } else {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = table.entries.find(name);
    if (it != table.entries.end()) {
      status = absl::AlreadyExistsError(absl::StrCat(
          table.kind, " '", name, "' is registered twice: by ", it->second.origin, " and by ",
          from, "; remove one of them from the plugin path or rename the ", table.kind));
    } else if (IsDefault(factory) && !table.default_name.empty()) {
      status = absl::AlreadyExistsError(absl::StrCat(
          table.kind, " '", name, "' from ", from, " claims to be the default ", table.kind,
          ", but '", table.default_name, "' (from ", table.entries.at(table.default_name).origin,
          ") already is; only one ", table.kind, " can be the default"));
    } else {
      if (IsDefault(factory)) table.default_name = name;
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
        " ", table.hint));
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

template <typename Factory>
std::string Registry::Default(const Table<Factory>& table) const {
  std::lock_guard<std::mutex> lock(mu_);
  return table.default_name;
}

absl::Status Registry::AddStrategy(const std::string& name, StrategyFactory factory,
                                   const std::string& origin, StrategyTraits traits) {
  BRAID_RETURN_IF_ERROR(Add(strategies_, name, std::move(factory), origin));
  std::lock_guard<std::mutex> lock(mu_);
  strategy_traits_[name] = std::move(traits);
  return absl::OkStatus();
}

absl::Status Registry::AddStrategy(const std::string& name, StrategyFactory factory,
                                   StrategyTraits traits) {
  return AddStrategy(name, std::move(factory), kBuiltIn, std::move(traits));
}

absl::StatusOr<StrategyTraits> Registry::GetStrategyTraits(const std::string& name) const {
  BRAID_RETURN_IF_ERROR(Find(strategies_, name).status());
  std::lock_guard<std::mutex> lock(mu_);
  auto it = strategy_traits_.find(name);
  return it == strategy_traits_.end() ? StrategyTraits{} : it->second;
}

std::vector<std::string> ServedAxes(const StrategyTraits& traits) {
  if (traits.axes.empty()) return {kAxisData};
  return traits.axes;
}

std::vector<std::pair<std::string, std::string>> Registry::StrategiesServing(
    const std::string& axis) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [name, traits] : strategy_traits_) {
    auto entry = strategies_.entries.find(name);
    if (entry == strategies_.entries.end()) continue;
    for (const std::string& a : ServedAxes(traits)) {
      if (a == axis) {
        out.emplace_back(name, entry->second.origin);
        break;
      }
    }
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> Registry::StrategiesProviding(
    const std::string& feature) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [name, traits] : strategy_traits_) {
    auto entry = strategies_.entries.find(name);
    if (entry == strategies_.entries.end()) continue;
    for (const std::string& f : traits.features) {
      if (f == feature) {
        out.emplace_back(name, entry->second.origin);
        break;
      }
    }
  }
  return out;
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

absl::Status Registry::AddCheckpointer(const std::string& name, CheckpointerFactory factory,
                                       const std::string& origin) {
  return Add(checkpointers_, name, std::move(factory), origin);
}

absl::StatusOr<std::unique_ptr<Checkpointer>> Registry::MakeCheckpointer(
    const std::string& name, const CheckpointOptions& options) const {
  BRAID_ASSIGN_OR_RETURN(auto found, Find(checkpointers_, name));
  BRAID_ASSIGN_OR_RETURN(std::unique_ptr<Checkpointer> made, found.first(options));
  if (made == nullptr) {
    return absl::InternalError(absl::StrCat("the factory of checkpointer '", name, "' (from ",
                                            found.second, ") returned null"));
  }
  return made;
}

bool Registry::HasCheckpointer(const std::string& name) const {
  return Find(checkpointers_, name).ok();
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

absl::Status Registry::AddModel(const std::string& name, ModelSpec spec,
                                const std::string& origin) {
  return Add(models_, name, std::move(spec), origin);
}

absl::StatusOr<ModelSpec> Registry::GetModel(const std::string& name) const {
  BRAID_ASSIGN_OR_RETURN(auto found, Find(models_, name));
  return std::move(found.first);
}

absl::StatusOr<std::unique_ptr<Module>> Registry::MakeModel(const std::string& name,
                                                            const config::ModelConfig& model,
                                                            uint64_t seed, Device device) const {
  BRAID_ASSIGN_OR_RETURN(auto found, Find(models_, name));
  BRAID_ASSIGN_OR_RETURN(std::unique_ptr<Module> made, found.first.build(model, seed, device));
  if (made == nullptr) {
    return absl::InternalError(absl::StrCat("the build function of model '", name, "' (from ",
                                            found.second, ") returned null"));
  }
  return made;
}

std::vector<std::string> Registry::ModelNames() const { return Names(models_); }

std::string Registry::DefaultModel() const { return Default(models_); }

absl::Status Registry::AddDataset(const std::string& name, DatasetSpec spec,
                                  const std::string& origin) {
  return Add(datasets_, name, std::move(spec), origin);
}

absl::StatusOr<DatasetSpec> Registry::GetDataset(const std::string& name) const {
  BRAID_ASSIGN_OR_RETURN(auto found, Find(datasets_, name));
  return std::move(found.first);
}

std::vector<std::string> Registry::DatasetNames() const { return Names(datasets_); }

std::string Registry::DefaultDataset() const { return Default(datasets_); }

absl::Status Registry::AddOptimizer(const std::string& name, OptimizerSpec spec,
                                    const std::string& origin) {
  return Add(optimizers_, name, std::move(spec), origin);
}

absl::StatusOr<OptimizerSpec> Registry::GetOptimizer(const std::string& name) const {
  BRAID_ASSIGN_OR_RETURN(auto found, Find(optimizers_, name));
  return std::move(found.first);
}

absl::StatusOr<std::unique_ptr<Optimizer>> Registry::MakeOptimizer(
    const std::string& name, std::vector<ParamGroup> groups,
    const config::OptimizerConfig& optimizer) const {
  BRAID_ASSIGN_OR_RETURN(auto found, Find(optimizers_, name));
  std::unique_ptr<Optimizer> made = found.first.make(std::move(groups), optimizer);
  if (made == nullptr) {
    return absl::InternalError(absl::StrCat("the make function of optimizer '", name, "' (from ",
                                            found.second, ") returned null"));
  }
  return made;
}

std::vector<std::string> Registry::OptimizerNames() const { return Names(optimizers_); }

std::string Registry::DefaultOptimizer() const { return Default(optimizers_); }

}  // namespace braid
