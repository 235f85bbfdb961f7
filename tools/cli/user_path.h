// The path a user typed on a tool's command line, as the tool must open it: `bazel run` starts
// programs in their runfiles, so a relative path is taken from the folder the user typed it in
// (BUILD_WORKING_DIRECTORY); absolute paths, and every path outside `bazel run`, stay as they are.
#ifndef BRAID_TOOLS_CLI_USER_PATH_H_
#define BRAID_TOOLS_CLI_USER_PATH_H_

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"

namespace braid::tools {

inline std::string UserPath(const std::string& path) {
  const char* wd = std::getenv("BUILD_WORKING_DIRECTORY");
  if (path.empty() || path[0] == '/' || wd == nullptr || *wd == '\0') return path;
  return absl::StrCat(wd, "/", path);
}

}  // namespace braid::tools

#endif  // BRAID_TOOLS_CLI_USER_PATH_H_
