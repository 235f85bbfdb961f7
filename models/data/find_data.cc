#include "models/data/find_data.h"

#include <dirent.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <deque>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace braid::data {
namespace {

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::string Absolute(const std::string& path) {
  char buf[PATH_MAX];
  if (::realpath(path.c_str(), buf) != nullptr) return buf;
  return path;
}

std::string Parent(const std::string& dir) {
  size_t slash = dir.find_last_of('/');
  if (slash == std::string::npos || slash == 0) return "/";
  return dir.substr(0, slash);
}

std::string GetEnv(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

bool IsDir(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool IsSymlink(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return names;
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  ::closedir(d);
  return names;
}

// A runfiles tree is symlinks into the execroot and, for source files, into the source tree.
// Under `bazel test` neither the cwd nor the binary is inside the workspace, so the first source
// file found in the runfiles (any `data` dependency, e.g. //:README.md) is the way back to it.
// Returns the folder that file really lives in, or "" when the runfiles hold no source file.
std::string SourceDirFromRunfiles(const std::string& runfiles) {
  std::deque<std::pair<std::string, int>> queue = {{runfiles, 0}};
  int visited = 0;
  while (!queue.empty() && visited < 500) {
    auto [dir, depth] = queue.front();
    queue.pop_front();
    for (const std::string& name : ListDir(dir)) {
      ++visited;
      const std::string path = dir + "/" + name;
      if (IsSymlink(path)) {
        std::string real = Absolute(path);
        if (!IsDir(real) && real.find("/bazel-out/") == std::string::npos &&
            real.find("/external/") == std::string::npos) {
          return Parent(real);
        }
      } else if (depth < 4 && IsDir(path) && name != "_solib_k8" && name != "external") {
        queue.push_back({path, depth + 1});
      }
    }
  }
  return "";
}

// Candidate paths in search order, without duplicates.
class Candidates {
 public:
  void Add(const std::string& path) {
    if (seen_.insert(path).second) paths_.push_back(path);
  }
  // <dir>/data/node_modules/<relative> for `start` and every parent up to "/".
  void AddWalkUp(std::string start, const std::string& relative) {
    if (start.empty()) return;
    start = Absolute(start);
    while (true) {
      std::string base = start == "/" ? "" : start;
      Add(absl::StrCat(base, "/data/node_modules/", relative));
      if (start == "/") break;
      start = Parent(start);
    }
  }
  const std::vector<std::string>& paths() const { return paths_; }

 private:
  std::set<std::string> seen_;
  std::vector<std::string> paths_;
};

}  // namespace

absl::StatusOr<std::string> FindDataFile(const std::string& relative) {
  if (relative.empty() || relative[0] == '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("FindDataFile wants a path relative to node_modules (e.g. '", kMobyDickText,
                     "'), got '", relative, "'"));
  }
  Candidates c;
  std::string env_dir = GetEnv("BRAID_DATA_DIR");
  if (!env_dir.empty()) {
    c.Add(absl::StrCat(env_dir, "/node_modules/", relative));
    c.Add(absl::StrCat(env_dir, "/", relative));
  }
  std::string workspace = GetEnv("BUILD_WORKSPACE_DIRECTORY");
  if (!workspace.empty()) c.Add(absl::StrCat(workspace, "/data/node_modules/", relative));
  char cwd[PATH_MAX];
  if (::getcwd(cwd, sizeof(cwd)) != nullptr) c.AddWalkUp(cwd, relative);
  std::vector<std::string> runfiles = {GetEnv("RUNFILES_DIR"), GetEnv("TEST_SRCDIR")};
  std::string exe = Absolute("/proc/self/exe");
  if (exe != "/proc/self/exe") {
    c.AddWalkUp(Parent(exe), relative);
    runfiles.push_back(exe + ".runfiles");
  }
  std::set<std::string> searched;
  for (const std::string& r : runfiles) {
    if (r.empty() || !IsDir(r) || !searched.insert(Absolute(r)).second) continue;
    c.AddWalkUp(r, relative);
    c.AddWalkUp(SourceDirFromRunfiles(r), relative);
  }

  for (const std::string& p : c.paths()) {
    if (Exists(p)) return Absolute(p);
  }
  return absl::NotFoundError(absl::StrCat(
      "data file '", relative, "' not found; looked in:\n  ", absl::StrJoin(c.paths(), "\n  "),
      "\nRun tools/setup.sh from the repository root to install the data sets into "
      "<repo>/data/node_modules, or set BRAID_DATA_DIR to a folder that holds node_modules/."));
}

}  // namespace braid::data
