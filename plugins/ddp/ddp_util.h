// The two helpers that both halves of the "ddp" strategy use -- the strategy class (ddp.cc) and
// its gradient reducer (ddp_reducer.cc): the prefix of every error, and the timeline's clock.
// Header-only and internal to the plugin.
#ifndef BRAID_PLUGINS_DDP_DDP_UTIL_H_
#define BRAID_PLUGINS_DDP_DDP_UTIL_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace braid::ddp {

inline double NowUs() { return absl::ToDoubleMicroseconds(absl::Now() - absl::UnixEpoch()); }

inline absl::Status Error(absl::StatusCode code, const std::string& msg) {
  return absl::Status(code, absl::StrCat("strategy 'ddp': ", msg));
}

}  // namespace braid::ddp

#endif  // BRAID_PLUGINS_DDP_DDP_UTIL_H_
