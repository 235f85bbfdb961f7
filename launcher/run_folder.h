// Where a run's outputs go by default: runs/<name>-<local start time>, the name taken from the
// config the run trains (gpt-mini-bf16.pbtxt -> gpt-mini-bf16-20260127-101500), so that runs of
// different configs are told apart in a listing and in plot_metrics.py's legends. Every process
// of one job uses the one folder its launcher chose (BRAID_RUN_DIR), restarts included.
#ifndef BRAID_LAUNCHER_RUN_FOLDER_H_
#define BRAID_LAUNCHER_RUN_FOLDER_H_

#include <string>

#include "absl/time/time.h"

namespace braid::launcher {

// The name of the run train starts without --config (the reference run, gpt-mini on Moby Dick).
inline constexpr char kReferenceRunName[] = "gpt-mini";

// The environment variable that carries the launcher's run folder to its workers.
inline constexpr char kRunDirEnv[] = "BRAID_RUN_DIR";

// The stem of `config_path` (its file name without the last extension), or `fallback` when the
// path is empty; then "-YYYYmmdd-HHMMSS" of `start` in the local time zone.
std::string RunFolderName(const std::string& config_path, const std::string& fallback,
                          absl::Time start);

}  // namespace braid::launcher

#endif  // BRAID_LAUNCHER_RUN_FOLDER_H_
