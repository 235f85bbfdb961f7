#include "launcher/monitor/monitor.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace braid::monitor {

namespace {

absl::Status MakeDirs(const std::string& dir) {
  for (size_t i = 1; i <= dir.size(); ++i) {
    if (i == dir.size() || dir[i] == '/') {
      const std::string partial = dir.substr(0, i);
      if (mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
        return absl::PermissionDeniedError(
            absl::StrCat("cannot create the folder ", partial, ": ", std::strerror(errno)));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Monitors>> Monitors::Open(const MonitorFolders& folders,
                                                         int first_step, int64_t samples_per_step,
                                                         absl::Time now) {
  auto m = std::make_unique<Monitors>();
  m->folders_ = folders;
  m->samples_per_step_ = samples_per_step;
  if (!folders.tensorboard.empty()) {
    if (absl::Status st = MakeDirs(folders.tensorboard); !st.ok()) {
      return absl::Status(st.code(), absl::StrCat("tensorboard: ", st.message()));
    }
    absl::StatusOr<std::unique_ptr<tensorboard::TensorBoardWriter>> w =
        tensorboard::TensorBoardWriter::Create(folders.tensorboard, now);
    if (!w.ok()) return absl::Status(w.status().code(), absl::StrCat("tensorboard: ", w.status().message()));
    m->tensorboard_ = *std::move(w);
  }
  if (!folders.csv.empty()) {
    if (absl::Status st = MakeDirs(folders.csv); !st.ok()) {
      return absl::Status(st.code(), absl::StrCat("csv_monitor: ", st.message()));
    }
    m->csv_ = std::make_unique<CsvMonitor>(folders.csv, int64_t(first_step) * samples_per_step);
  }
  return m;
}

absl::Status Monitors::Write(int step, const Events& events, absl::Time now) {
  const int64_t x = int64_t(step + 1) * samples_per_step_;
  if (tensorboard_ != nullptr) {
    if (absl::Status st = tensorboard_->AddScalars(x, now, events); !st.ok()) return st;
  }
  if (csv_ != nullptr) {
    for (const auto& [tag, v] : events) {
      if (absl::Status st = csv_->Write(tag, x, v); !st.ok()) return st;
    }
  }
  return absl::OkStatus();
}

std::string Monitors::Describe() const {
  std::vector<std::string> parts;
  if (tensorboard_ != nullptr) parts.push_back(absl::StrCat("TensorBoard events in ", tensorboard_->path()));
  if (csv_ != nullptr) parts.push_back(absl::StrCat("CSV files in ", folders_.csv));
  return absl::StrJoin(parts, ", ");
}

}  // namespace braid::monitor
