#include "launcher/run_folder.h"

#include "absl/strings/str_cat.h"

namespace braid::launcher {

std::string RunFolderName(const std::string& config_path, const std::string& fallback,
                          absl::Time start) {
  std::string stem = config_path.substr(config_path.rfind('/') + 1);
  if (size_t dot = stem.rfind('.'); dot != std::string::npos && dot > 0) stem.resize(dot);
  if (stem.empty()) stem = fallback;
  return absl::StrCat(stem, "-", absl::FormatTime("%Y%m%d-%H%M%S", start, absl::LocalTimeZone()));
}

}  // namespace braid::launcher
