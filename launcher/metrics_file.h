// The metrics file's lines (JSON, one object a line): each stamped with the wall-clock time, and
// the rule that keeps every step exactly once when a run is restarted (--max_restarts) or resumed
// into the folder of an earlier attempt, which appends instead of starting the file again.
//
// The rule: a run that starts at step k (0 when it starts afresh, the checkpoint's step when it
// resumes) first drops the lines it is about to write again:
//   - step lines ({"step": s, ...}) with s >= k: the attempt that wrote them was rolled back to
//     step k, so the new attempt's line for s replaces them;
//   - summary lines ({"summary": true, "steps": n, ...}) with n > k: they summarise steps that
//     are being redone (a summary of a finished run that is now extended, n <= k, stays);
//   - a last line cut short (no closing brace), as a process killed mid-write leaves it.
// Every other line stays, in its order; then the run appends.
#ifndef BRAID_LAUNCHER_METRICS_FILE_H_
#define BRAID_LAUNCHER_METRICS_FILE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace braid::launcher {

// `json_object` ("{...}") with "time" (Unix seconds, millisecond resolution) as its first field.
std::string StampTime(const std::string& json_object, absl::Time t);

// Applies the rule above to the file at `path` for a run starting at `first_step` (atomically:
// a new file renamed over the old). A missing file is fine (nothing to keep). Returns how many
// lines were dropped.
absl::StatusOr<int> KeepLinesBeforeStep(const std::string& path, int first_step);

}  // namespace braid::launcher

#endif  // BRAID_LAUNCHER_METRICS_FILE_H_
