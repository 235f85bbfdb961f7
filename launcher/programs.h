// Which programs the launcher starts, and the paths users give it: resolved the same way under
// `bazel run` (inside the runfiles tree), from bazel-bin and from an installed copy.
#ifndef BRAID_LAUNCHER_PROGRAMS_H_
#define BRAID_LAUNCHER_PROGRAMS_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace braid::launcher {

// The user's checkout under `bazel run` ($BUILD_WORKSPACE_DIRECTORY), else "".
std::string Workspace();
// bazel run starts us inside the runfiles tree; a relative path from the user means their
// checkout.
std::string ResolveUserPath(const std::string& path);
std::string Absolute(const std::string& path);

// The training program, and the environment it needs to find its own runfiles. Bazel builds a
// runfiles tree for the program that is run (the launcher), not for the programs in it: the
// training program and its plugins live in the launcher's tree, and the runfiles library's
// environment variables (RUNFILES_DIR, RUNFILES_MANIFEST_FILE) tell it so, as Bazel intends for
// child processes. Without runfiles (an installed copy): the program beside the launcher.
struct TrainingProgram {
  std::string path;
  std::vector<std::pair<std::string, std::string>> env;
};
absl::StatusOr<TrainingProgram> FindTrainingProgram(const char* argv0);

// --program=NAME: a path (relative to the user's folder), or a name on $PATH; absolute.
absl::StatusOr<std::string> FindProgram(const std::string& name);

}  // namespace braid::launcher

#endif  // BRAID_LAUNCHER_PROGRAMS_H_
