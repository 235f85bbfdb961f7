#include "launcher/monitor/csv_monitor.h"

#include <cstdio>
#include <fstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"

namespace braid::monitor {

std::string CsvFileName(const std::string& tag) {
  return absl::StrCat(absl::StrReplaceAll(tag, {{"/", "_"}, {" ", "_"}}), ".csv");
}

absl::Status CsvMonitor::Write(const std::string& tag, int64_t x, double value) {
  const std::string path = absl::StrCat(dir_, "/", CsvFileName(tag));
  if (started_.insert(tag).second) {
    // Keep the header and the rows of steps this run does not redo; then append.
    std::vector<std::string> kept;
    {
      std::ifstream in(path);
      std::string line;
      for (bool first = true; std::getline(in, line); first = false) {
        const std::string x_text = line.substr(0, line.find(','));
        int64_t row_x;
        if (first || (absl::SimpleAtoi(x_text, &row_x) && row_x <= keep_up_to_ &&
                      line.find(',') != std::string::npos)) {
          kept.push_back(line);
        }
      }
    }
    if (kept.empty()) {
      const size_t slash = tag.rfind('/');
      kept.push_back(absl::StrCat("step,", slash == std::string::npos ? tag : tag.substr(slash + 1)));
    }
    std::ofstream out(path, std::ios::trunc);
    for (const std::string& k : kept) out << k << "\n";
    if (!out.flush()) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path));
  }
  std::ofstream out(path, std::ios::app);
  out << x << "," << absl::StrFormat("%.9g", value) << "\n";
  if (!out.flush()) return absl::ResourceExhaustedError(absl::StrCat("cannot write ", path, " (disk full?)"));
  return absl::OkStatus();
}

}  // namespace braid::monitor
