// Parsing the options of the "paramserver" strategy (paramserver_options.h).
#include "plugins/paramserver/paramserver_options.h"

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "plugins/paramserver/paramserver_errors.h"

namespace braid::paramserver {

absl::StatusOr<Options> ParseOptions(const std::map<std::string, std::string>& in) {
  Options o;
  bool staleness_given = false;
  for (const auto& [key, value] : in) {
    if (key == "mode") {
      if (value == "sync") {
        o.mode = Mode::kSync;
      } else if (value == "async") {
        o.mode = Mode::kAsync;
      } else {
        return Invalid(absl::StrCat("option mode='", value, "' must be sync or async"));
      }
    } else if (key == "server_rank") {
      if (!absl::SimpleAtoi(value, &o.server_rank) || o.server_rank < 0) {
        return Invalid(
            absl::StrCat("option server_rank='", value, "' must be a rank number (0, 1, ...)"));
      }
    } else if (key == "max_staleness") {
      if (!absl::SimpleAtoi(value, &o.max_staleness) || o.max_staleness < 0 ||
          o.max_staleness > kMaxStalenessLimit) {
        return Invalid(absl::StrCat("option max_staleness='", value,
                                    "' must be a whole number of steps from 0 to ",
                                    kMaxStalenessLimit));
      }
      staleness_given = true;
    } else {
      return Invalid(absl::StrCat("unknown option '", key,
                                  "'; known options: mode, max_staleness, server_rank"));
    }
  }
  if (o.mode == Mode::kSync && staleness_given) {
    return Invalid("option max_staleness applies to mode=async only; add mode=async or remove it");
  }
  if (o.mode == Mode::kAsync && !staleness_given) o.max_staleness = kDefaultMaxStaleness;
  return o;
}

const char* ModeName(Mode m) { return m == Mode::kSync ? "sync" : "async"; }

}  // namespace braid::paramserver
