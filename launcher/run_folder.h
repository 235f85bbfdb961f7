// Where a run's outputs go by default: runs/<name>-<local start time>, the name taken from the
// config the run trains (gpt-mini-bf16.pbtxt -> gpt-mini-bf16-20260127-101500), so that runs of
// different configs are told apart in a listing and in plot_metrics.py's legends. Every process
// of one job uses the one folder its launcher chose (BRAID_RUN_DIR), restarts included.
#ifndef BRAID_LAUNCHER_RUN_FOLDER_H_
#define BRAID_LAUNCHER_RUN_FOLDER_H_

#include <string>

#include "absl/status/status.h"
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

// A checkpoint folder names the run folder of the run that saved into it (a file "run_folder"
// beside the step_<N> folders), so that a new command resumed from it continues that run's
// metrics instead of starting a new folder. The run folder named there, when the checkpoint
// folder also holds a saved step; "" otherwise.
std::string RunFolderOfCheckpoint(const std::string& checkpoint_dir);
// Names `run_folder` (made absolute) in `checkpoint_dir`, replacing the file atomically.
absl::Status RecordRunFolder(const std::string& checkpoint_dir, const std::string& run_folder);

}  // namespace braid::launcher

#endif  // BRAID_LAUNCHER_RUN_FOLDER_H_
