#include "launcher/programs.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tools/cpp/runfiles/runfiles.h"

namespace braid::launcher {

using bazel::tools::cpp::runfiles::Runfiles;

std::string Workspace() {
  const char* ws = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  return ws ? ws : "";
}

// bazel run starts us inside the runfiles tree; a relative path from the user means their
// checkout.
std::string ResolveUserPath(const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  if (access(path.c_str(), F_OK) == 0 || Workspace().empty()) return path;
  return absl::StrCat(Workspace(), "/", path);
}

std::string Absolute(const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  char cwd[4096];
  if (!getcwd(cwd, sizeof cwd)) return path;
  return absl::StrCat(cwd, "/", path);
}

absl::StatusOr<TrainingProgram> FindTrainingProgram(const char* argv0) {
  std::string error;
  std::unique_ptr<Runfiles> rf(Runfiles::Create(argv0, &error));
  TrainingProgram out;
  std::string& path = out.path;
  if (rf) path = rf->Rlocation("braid/launcher/train");
  if (!path.empty() && access(path.c_str(), X_OK) == 0) {
    // Absolute: a worker may start in another folder than ours.
    for (const auto& [k, v] : rf->EnvVars()) out.env.emplace_back(k, Absolute(v));
  } else {
    // Installed layout: the training program next to the launcher. A launcher started through
    // $PATH has a bare name for argv[0]: its folder is then /proc/self/exe's.
    std::string self = argv0;
    if (self.find('/') == std::string::npos) {
      char exe[4096];
      ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
      if (n > 0) self.assign(exe, n);
    }
    path = self.substr(0, self.rfind('/') + 1) + "train";
  }
  if (access(path.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("cannot find the training program (looked for ", path,
                                            "); build it with bazel build //launcher:all"));
  }
  path = Absolute(path);
  return out;
}

absl::StatusOr<std::string> FindProgram(const std::string& name) {
  std::string path;
  if (name.find('/') != std::string::npos) {
    path = Absolute(ResolveUserPath(name));
  } else {
    const char* search = std::getenv("PATH");
    for (absl::string_view dir : absl::StrSplit(search ? search : "/usr/bin:/bin", ':')) {
      std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/", name);
      if (access(candidate.c_str(), X_OK) == 0) {
        path = Absolute(candidate);
        break;
      }
    }
    if (path.empty()) return absl::NotFoundError(absl::StrCat("--program=", name, ": not found on $PATH"));
  }
  if (access(path.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("--program=", name, ": ", path,
                                            " is not an executable file (", strerror(errno), ")"));
  }
  return path;
}

}  // namespace braid::launcher
