#include "launcher/run_folder.h"

#include <dirent.h>
#include <limits.h>
#include <stdlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace braid::launcher {

std::string RunFolderName(const std::string& config_path, const std::string& fallback,
                          absl::Time start) {
  std::string stem = config_path.substr(config_path.rfind('/') + 1);
  if (size_t dot = stem.rfind('.'); dot != std::string::npos && dot > 0) stem.resize(dot);
  if (stem.empty()) stem = fallback;
  return absl::StrCat(stem, "-", absl::FormatTime("%Y%m%d-%H%M%S", start, absl::LocalTimeZone()));
}

namespace {

constexpr char kRunFolderFile[] = "run_folder";

bool HoldsAStep(const std::string& dir) {
  bool found = false;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      found |= absl::StartsWith(n, "step_") && !absl::EndsWith(n, ".tmp");
    }
    closedir(d);
  }
  return found;
}

}  // namespace

std::string RunFolderOfCheckpoint(const std::string& checkpoint_dir) {
  if (checkpoint_dir.empty() || !HoldsAStep(checkpoint_dir)) return "";
  std::ifstream in(absl::StrCat(checkpoint_dir, "/", kRunFolderFile));
  std::string line;
  if (!std::getline(in, line)) return "";
  return std::string(absl::StripAsciiWhitespace(line));
}

absl::Status RecordRunFolder(const std::string& checkpoint_dir, const std::string& run_folder) {
  char resolved[PATH_MAX];
  const std::string absolute =
      realpath(run_folder.c_str(), resolved) != nullptr ? std::string(resolved) : run_folder;
  if (RunFolderOfCheckpoint(checkpoint_dir) == absolute) return absl::OkStatus();
  const std::string path = absl::StrCat(checkpoint_dir, "/", kRunFolderFile);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << absolute << "\n";
    if (!out.flush()) {
      std::remove(tmp.c_str());
      return absl::ResourceExhaustedError(absl::StrCat("cannot write ", tmp));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::PermissionDeniedError(absl::StrCat("cannot replace ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace braid::launcher
