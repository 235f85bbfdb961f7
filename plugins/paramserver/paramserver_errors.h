// The prefix of every error the "paramserver" strategy returns, shared by its option parser
// (paramserver_options.cc) and the strategy itself (paramserver.cc). Header-only and internal to
// the plugin.
#ifndef BRAID_PLUGINS_PARAMSERVER_PARAMSERVER_ERRORS_H_
#define BRAID_PLUGINS_PARAMSERVER_PARAMSERVER_ERRORS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace braid::paramserver {

inline absl::Status Invalid(const std::string& msg) {
  return absl::InvalidArgumentError(absl::StrCat("strategy 'paramserver': ", msg));
}
inline absl::Status Failed(absl::StatusCode code, const std::string& msg) {
  return absl::Status(code, absl::StrCat("strategy 'paramserver': ", msg));
}

}  // namespace braid::paramserver

#endif  // BRAID_PLUGINS_PARAMSERVER_PARAMSERVER_ERRORS_H_
