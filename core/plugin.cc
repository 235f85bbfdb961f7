#include "core/plugin.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <algorithm>
#include <functional>
#include <map>
#include <mutex>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/plugin_api.h"
#include "core/registry.h"

namespace braid {

namespace {

constexpr char kPathEnv[] = "BRAID_PLUGIN_PATH";

// Every file dlopen accepted, by canonical path, with the outcome of its one registration:
// registering again would register twice, and a file is never unloaded (see plugin.h).
struct Loaded {
  std::mutex mu;
  std::map<std::string, absl::Status> outcome;
};
Loaded& GetLoaded() {
  static Loaded* loaded = new Loaded();
  return *loaded;
}

// A register call that loads another plugin would deadlock on Loaded::mu; it is refused instead.
thread_local bool g_in_register = false;

bool IsPath(const std::string& s) { return absl::StrContains(s, '/') || absl::EndsWith(s, ".so"); }

bool IsPluginName(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

bool IsFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string FileName(const std::string& name) { return absl::StrCat("libbraid_", name, ".so"); }

std::string JoinPath(const std::string& dir, const std::string& file) {
  return absl::EndsWith(dir, "/") ? absl::StrCat(dir, file) : absl::StrCat(dir, "/", file);
}

// Finds the file for `name_or_path`; a name goes through the search path.
absl::StatusOr<std::string> Resolve(const std::string& name_or_path,
                                    const std::vector<std::string>& search_path) {
  std::string file;
  if (IsPath(name_or_path)) {
    file = name_or_path;
  } else if (!IsPluginName(name_or_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", name_or_path,
                     "' is neither a plugin name (letters, digits, '_', '-') nor a path to "
                     "a .so file"));
  } else {
    std::vector<std::string> tried;
    for (const std::string& dir : search_path) {
      if (dir.empty()) continue;
      // A folder of plugins, or a folder of plugin folders (the source tree's and runfiles'
      // plugins/<name>/ layout), so one entry finds every plugin.
      for (const std::string& candidate :
           {JoinPath(dir, FileName(name_or_path)),
            JoinPath(JoinPath(dir, name_or_path), FileName(name_or_path))}) {
        if (IsFile(candidate)) {
          file = candidate;
          break;
        }
        tried.push_back(candidate);
      }
      if (!file.empty()) break;
    }
    if (file.empty()) {
      return absl::NotFoundError(absl::StrCat(
          "plugin '", name_or_path, "' not found: looked for ", FileName(name_or_path), " at ",
          tried.empty() ? "no path (the search path is empty)" : absl::StrJoin(tried, ", "),
          ". Add the folder holding it to $", kPathEnv,
          " (colon-separated) or give the .so's "
          "path instead of the name"));
    }
  }
  char buf[PATH_MAX];
  if (::realpath(file.c_str(), buf) == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("plugin file '", file, "' cannot be opened: ", ::strerror(errno)));
  }
  if (!IsFile(buf)) {
    return absl::InvalidArgumentError(absl::StrCat("plugin '", file, "' is not a regular file"));
  }
  return std::string(buf);
}

// dlopens, checks and registers `path` (canonical). Caller holds Loaded::mu.
absl::Status Load(const std::string& path) {
  ::dlerror();
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = ::dlerror();
    std::string msg = err != nullptr ? err : "unknown dlopen error";
    std::string hint;
    if (absl::StrContains(msg, "undefined symbol")) {
      hint =
          "; the plugin needs a symbol this program does not provide: the program must link "
          "//core (statically, with -rdynamic, as //core:core does) and the plugin must be "
          "built against this Braid's headers with the braid_plugin macro";
    }
    // Not remembered: the file may be fixed and tried again.
    return absl::FailedPreconditionError(
        absl::StrCat("cannot load plugin ", path, ": dlopen failed: ", msg, hint));
  }

  // From here on the library's static initialisers have run, so it stays loaded.
  absl::Status& outcome = GetLoaded().outcome[path];
  auto find = [&](const char* symbol) -> void* {
    ::dlerror();
    void* p = ::dlsym(handle, symbol);
    return ::dlerror() == nullptr ? p : nullptr;
  };
  auto* abi_version =
      reinterpret_cast<BraidPluginAbiVersionFn>(find(BRAID_PLUGIN_ABI_VERSION_SYMBOL));
  auto* register_fn = reinterpret_cast<BraidPluginRegisterFn>(find(BRAID_PLUGIN_REGISTER_SYMBOL));
  const char* missing = abi_version == nullptr   ? BRAID_PLUGIN_ABI_VERSION_SYMBOL
                        : register_fn == nullptr ? BRAID_PLUGIN_REGISTER_SYMBOL
                                                 : nullptr;
  if (missing != nullptr) {
    outcome = absl::InvalidArgumentError(absl::StrCat(
        "plugin ", path, " does not export the entry point ", missing,
        "(): is it a Braid "
        "plugin? Define the entry points with BRAID_PLUGIN(registry) from core/plugin_api.h"));
    return outcome;
  }
  uint32_t version = abi_version();
  if (version != BRAID_PLUGIN_ABI_VERSION) {
    outcome = absl::FailedPreconditionError(
        absl::StrCat("plugin ", path, " was built for plugin ABI version ", version,
                     " but this program has "
                     "version ",
                     BRAID_PLUGIN_ABI_VERSION, ": rebuild the plugin against this Braid"));
    return outcome;
  }

  Registry& registry = Registry::Get();
  registry.BeginPluginRegistration(path);
  g_in_register = true;
  int rc = register_fn(&registry);
  g_in_register = false;
  std::vector<std::string> errors = registry.EndPluginRegistration();
  if (rc != 0 || !errors.empty()) {
    std::string msg = absl::StrCat("plugin ", path, " failed to register");
    if (rc != 0) absl::StrAppend(&msg, ": ", BRAID_PLUGIN_REGISTER_SYMBOL, "() returned ", rc);
    if (!errors.empty()) absl::StrAppend(&msg, ": ", absl::StrJoin(errors, "; "));
    outcome = absl::InternalError(msg);
    return outcome;
  }
  outcome = absl::OkStatus();
  return outcome;
}

absl::StatusOr<std::string> LoadAndReturnPath(const std::string& name_or_path,
                                              const std::vector<std::string>& search_path) {
  if (g_in_register) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot load plugin '", name_or_path, "' from inside another plugin's registration"));
  }
  BRAID_ASSIGN_OR_RETURN(std::string path, Resolve(name_or_path, search_path));
  Loaded& loaded = GetLoaded();
  std::lock_guard<std::mutex> lock(loaded.mu);
  auto it = loaded.outcome.find(path);
  if (it != loaded.outcome.end()) {
    if (!it->second.ok()) return it->second;
    return path;
  }
  BRAID_RETURN_IF_ERROR(Load(path));
  return path;
}

}  // namespace

std::vector<std::string> PluginSearchPath(const std::vector<std::string>& extra) {
  std::vector<std::string> dirs;
  if (const char* env = ::getenv(kPathEnv)) {
    for (absl::string_view d : absl::StrSplit(env, ':', absl::SkipEmpty())) {
      dirs.emplace_back(d);
    }
  }
  for (const std::string& d : extra) {
    if (!d.empty()) dirs.push_back(d);
  }
  return dirs;
}

absl::Status LoadPlugin(const std::string& name_or_path,
                        const std::vector<std::string>& search_path) {
  return LoadAndReturnPath(name_or_path, search_path).status();
}

namespace {

// The plugin files in `dir` as (name, path): dir/libbraid_<name>.so and
// dir/<folder>/libbraid_<name>.so, in sorted order. Symlinks (runfiles) count as their targets.
void PluginFilesIn(const std::string& dir, std::vector<std::pair<std::string, std::string>>* out) {
  auto plugin_name = [](const std::string& file) -> std::string {
    static const std::string kPrefix = "libbraid_", kSuffix = ".so";
    if (file.size() <= kPrefix.size() + kSuffix.size() || !absl::StartsWith(file, kPrefix) ||
        !absl::EndsWith(file, kSuffix)) {
      return "";
    }
    return file.substr(kPrefix.size(), file.size() - kPrefix.size() - kSuffix.size());
  };
  auto list = [](const std::string& d) {
    std::vector<std::string> names;
    if (DIR* handle = ::opendir(d.c_str())) {
      while (const struct dirent* e = ::readdir(handle)) {
        std::string n = e->d_name;
        if (n != "." && n != "..") names.push_back(n);
      }
      ::closedir(handle);
    }
    std::sort(names.begin(), names.end());
    return names;
  };
  for (const std::string& entry : list(dir)) {
    const std::string path = JoinPath(dir, entry);
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) continue;
    if (S_ISREG(st.st_mode)) {
      std::string name = plugin_name(entry);
      if (!name.empty()) out->emplace_back(name, path);
    } else if (S_ISDIR(st.st_mode)) {
      for (const std::string& inner : list(path)) {
        std::string name = plugin_name(inner);
        if (!name.empty() && IsFile(JoinPath(path, inner))) {
          out->emplace_back(name, JoinPath(path, inner));
        }
      }
    }
  }
}

}  // namespace

PluginScan LoadAllPlugins(const std::vector<std::string>& search_path) {
  PluginScan scan;
  std::set<std::string> names_seen, paths_seen;
  for (const std::string& dir : search_path) {
    if (dir.empty()) continue;
    std::vector<std::pair<std::string, std::string>> files;
    PluginFilesIn(dir, &files);
    for (const auto& [name, file] : files) {
      // The first folder that has a name wins, as when loading by name.
      if (!names_seen.insert(name).second) continue;
      absl::StatusOr<std::string> path = LoadAndReturnPath(file, {});
      if (!path.ok()) {
        scan.failed.push_back(path.status());
      } else if (paths_seen.insert(*path).second) {
        scan.loaded.push_back(*path);
      }
    }
  }
  return scan;
}

namespace {

// Makes sure `has(name)` holds, loading plugin `name` from the search path if it does not.
absl::Status EnsureRegistered(const char* kind, const std::string& name,
                              const std::vector<std::string>& search_path,
                              const std::function<bool(const std::string&)>& has,
                              const std::function<absl::Status()>& unknown,
                              const std::function<std::vector<std::string>()>& names) {
  if (has(name)) return absl::OkStatus();
  if (!IsPluginName(name)) return unknown();  // the unknown-name error, listing known ones
  BRAID_ASSIGN_OR_RETURN(std::string path, LoadAndReturnPath(name, search_path));
  if (has(name)) return absl::OkStatus();
  return absl::NotFoundError(absl::StrCat("plugin ", path, " loaded but registers no ", kind,
                                          " '", name, "'; registered: ",
                                          absl::StrJoin(names(), ", ")));
}

}  // namespace

absl::Status EnsureStrategy(const std::string& name, const std::vector<std::string>& search_path) {
  Registry& r = Registry::Get();
  return EnsureRegistered(
      "strategy", name, search_path, [&](const std::string& n) { return r.HasStrategy(n); },
      [&] { return r.MakeStrategy(name).status(); }, [&] { return r.StrategyNames(); });
}

absl::Status EnsureCommunicator(const std::string& name,
                                const std::vector<std::string>& search_path) {
  Registry& r = Registry::Get();
  return EnsureRegistered(
      "communicator", name, search_path, [&](const std::string& n) { return r.HasCommunicator(n); },
      [&] { return r.MakeCommunicator(name, CommunicatorOptions{}).status(); },
      [&] { return r.CommunicatorNames(); });
}

absl::Status EnsureModel(const std::string& name, const std::vector<std::string>& search_path) {
  Registry& r = Registry::Get();
  // Validation matches model.name case-insensitively ("GPT-Mini" is gpt-mini): so does this.
  auto registered = [&](const std::string& n) {
    for (const std::string& known : r.ModelNames()) {
      if (absl::EqualsIgnoreCase(known, n)) return true;
    }
    return false;
  };
  auto unknown = [&](const std::string& why) {
    const std::vector<std::string> known = r.ModelNames();
    return absl::StrCat("unknown model '", name, "'; known: ",
                        known.empty() ? "(none registered)" : absl::StrJoin(known, ", "),
                        ". A model is linked into the program (models/) or registered by a plugin: "
                        "give its .so as model.path, or put libbraid_<name>.so on the plugin "
                        "search path",
                        why);
  };
  absl::Status s = EnsureRegistered(
      "model", name, search_path, registered,
      [&] {
        return absl::InvalidArgumentError(
            unknown(" (this name cannot be a plugin's: letters, digits, '_' and '-' only)"));
      },
      [&] { return r.ModelNames(); });
  // Not found on the search path: the unknown-name error, saying where the plugin was looked for.
  if (absl::IsNotFound(s) && !registered(name)) {
    return absl::NotFoundError(unknown(absl::StrCat("; ", s.message())));
  }
  return s;
}

absl::Status EnsureOptimizer(const std::string& name, const std::vector<std::string>& search_path) {
  Registry& r = Registry::Get();
  // Config names are case-insensitive (validation stores the registered spelling) and plugin
  // files are lowercase by convention: "Adam8bit" and "adam8bit" both load libbraid_adam8bit.so.
  auto registered = [&](const std::string& n) {
    for (const std::string& known : r.OptimizerNames()) {
      if (absl::EqualsIgnoreCase(known, n)) return true;
    }
    return false;
  };
  auto unknown = [&](const std::string& why) {
    return absl::StrCat("unknown optimizer '", name, "'; known: ",
                        absl::StrJoin(r.OptimizerNames(), ", "),
                        ". An optimizer is built in (core/optimizer.cc) or registered by plugin "
                        "libbraid_<lowercased name>.so on the plugin search path",
                        why);
  };
  absl::Status s = EnsureRegistered(
      "optimizer", absl::AsciiStrToLower(name), search_path, registered,
      [&] {
        return absl::InvalidArgumentError(
            unknown(" (this name cannot be a plugin's: letters, digits, '_' and '-' only)"));
      },
      [&] { return r.OptimizerNames(); });
  // Not found on the search path: the unknown-name error, saying where the plugin was looked for.
  if (absl::IsNotFound(s) && !registered(name)) {
    return absl::NotFoundError(unknown(absl::StrCat("; ", s.message())));
  }
  return s;
}

}  // namespace braid
