#include "launcher/metrics_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace braid::launcher {

namespace {

// The integer after "<key>": in one of our lines (they are written by run_report.cc with a space
// after the colon; any spacing is accepted).
std::optional<long long> IntField(absl::string_view line, absl::string_view key) {
  const std::string quoted = absl::StrCat("\"", key, "\"");
  size_t at = line.find(quoted);
  if (at == absl::string_view::npos) return std::nullopt;
  absl::string_view rest = absl::StripLeadingAsciiWhitespace(line.substr(at + quoted.size()));
  if (rest.empty() || rest[0] != ':') return std::nullopt;
  rest = absl::StripLeadingAsciiWhitespace(rest.substr(1));
  size_t n = 0;
  while (n < rest.size() && (absl::ascii_isdigit(rest[n]) || (n == 0 && rest[n] == '-'))) ++n;
  long long v;
  if (!absl::SimpleAtoi(rest.substr(0, n), &v)) return std::nullopt;
  return v;
}

bool IsSummary(absl::string_view line) {
  size_t at = line.find("\"summary\"");
  if (at == absl::string_view::npos) return false;
  absl::string_view rest = absl::StripLeadingAsciiWhitespace(line.substr(at + 9));
  return absl::StartsWith(rest, ":") &&
         absl::StartsWith(absl::StripLeadingAsciiWhitespace(rest.substr(1)), "true");
}

}  // namespace

std::string StampTime(const std::string& json_object, absl::Time t) {
  const std::string stamp = absl::StrFormat("\"time\": %.3f", absl::ToUnixMillis(t) / 1e3);
  if (json_object.size() < 2 || json_object[0] != '{') return json_object;
  const bool empty = json_object.find_first_not_of(" \t", 1) == json_object.size() - 1;
  return absl::StrCat("{", stamp, empty ? "" : ", ", json_object.substr(1));
}

absl::StatusOr<int> KeepLinesBeforeStep(const std::string& path, int first_step) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0 && errno == ENOENT) return 0;  // a first start
  std::ifstream in(path);
  if (!in.is_open()) {
    return absl::PermissionDeniedError(absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
  }
  std::vector<std::string> kept;
  int dropped = 0;
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view l = absl::StripAsciiWhitespace(line);
    if (l.empty()) continue;
    bool drop = false;
    if (l.back() != '}') {
      drop = true;  // cut short by a crash mid-write
    } else if (IsSummary(l)) {
      std::optional<long long> steps = IntField(l, "steps");
      drop = !steps.has_value() || *steps > first_step;
    } else if (std::optional<long long> step = IntField(l, "step")) {
      drop = *step >= first_step;
    }
    if (drop) {
      ++dropped;
    } else {
      kept.push_back(line);
    }
  }
  in.close();
  if (dropped == 0) return 0;
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    for (const std::string& k : kept) out << k << "\n";
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      return absl::ResourceExhaustedError(absl::StrCat("cannot write ", tmp, " (disk full?)"));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot replace ", path, ": ", std::strerror(errno)));
  }
  return dropped;
}

}  // namespace braid::launcher
