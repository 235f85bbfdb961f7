// DeepSpeed's monitors (`tensorboard`, `csv_monitor`): after each step, rank 0 writes the events
// DeepSpeed writes, under the same tags, to each enabled monitor. The x axis is DeepSpeed's:
// samples trained so far ((step + 1) x train_batch_size), as its "Train/Samples/..." tags say.
#ifndef BRAID_LAUNCHER_MONITOR_MONITOR_H_
#define BRAID_LAUNCHER_MONITOR_MONITOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "launcher/monitor/csv_monitor.h"
#include "launcher/monitor/tensorboard_writer.h"

namespace braid::monitor {

// A monitor's folder, resolved: <output_path or the run folder>/<job_name>; "" = off.
struct MonitorFolders {
  std::string tensorboard, csv;
};

using Events = std::vector<std::pair<std::string, float>>;  // (tag, value)

class Monitors {
 public:
  // Nothing is made for an empty folder. `first_step`: where this run starts (a resume's
  // checkpoint step); `samples_per_step`: train_batch_size.
  static absl::StatusOr<std::unique_ptr<Monitors>> Open(const MonitorFolders& folders,
                                                        int first_step, int64_t samples_per_step,
                                                        absl::Time now);

  // The events of step `step` (0-based), at x = (step + 1) x samples_per_step.
  absl::Status Write(int step, const Events& events, absl::Time now);

  // For the start-up line: "TensorBoard events in D, CSV files in E".
  std::string Describe() const;

 private:
  MonitorFolders folders_;
  int64_t samples_per_step_ = 1;
  std::unique_ptr<tensorboard::TensorBoardWriter> tensorboard_;
  std::unique_ptr<CsvMonitor> csv_;
};

}  // namespace braid::monitor

#endif  // BRAID_LAUNCHER_MONITOR_MONITOR_H_
