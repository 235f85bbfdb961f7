// CSV files as DeepSpeed's `csv_monitor` writes them: one file per metric,
// <dir>/<tag with '/' and ' ' made '_'>.csv ("Train/Samples/train_loss" ->
// Train_Samples_train_loss.csv), a header "step,<the tag's last part>", then "<x>,<value>" rows.
//
// Restarts and resumes append, each x kept once: the first row this process writes to a file
// first drops the rows it will write again (x > keep_up_to, the x of the last step before this
// run's first), like the metrics file (launcher/metrics_file.h).
#ifndef BRAID_LAUNCHER_MONITOR_CSV_MONITOR_H_
#define BRAID_LAUNCHER_MONITOR_CSV_MONITOR_H_

#include <cstdint>
#include <set>
#include <string>

#include "absl/status/status.h"

namespace braid::monitor {

// The file name DeepSpeed gives a tag, without the folder.
std::string CsvFileName(const std::string& tag);

class CsvMonitor {
 public:
  // `dir` must exist.
  CsvMonitor(std::string dir, int64_t keep_up_to) : dir_(std::move(dir)), keep_up_to_(keep_up_to) {}

  absl::Status Write(const std::string& tag, int64_t x, double value);

 private:
  std::string dir_;
  int64_t keep_up_to_;
  std::set<std::string> started_;  // tags whose file this process has prepared
};

}  // namespace braid::monitor

#endif  // BRAID_LAUNCHER_MONITOR_CSV_MONITOR_H_
