// A launcher flag's text turned into its value, or a one-line error naming where the text came
// from (`origin`: "--nnodes" or "PET_NNODES") and what it should be. Shared by the parser and
// torchrun's PET_* variables through SetLaunchFlag; internal to :launch_flags.
#ifndef BRAID_LAUNCHER_LAUNCH_FLAG_VALUES_H_
#define BRAID_LAUNCHER_LAUNCH_FLAG_VALUES_H_

#include <map>
#include <string>

#include "absl/status/status.h"

namespace braid::launcher {

// "<origin> wants <want>, got '<value>'".
absl::Status BadValue(const std::string& origin, const std::string& value, const std::string& want);

absl::Status ParseInt(const std::string& origin, const std::string& v, int min, int* out);
absl::Status ParseSeconds(const std::string& origin, const std::string& v, double* out);  // > 0
absl::Status ParsePort(const std::string& origin, const std::string& v, int* out);  // 1..65535
// "", 1, true, yes / 0, false, no (any case).
absl::Status ParseBool(const std::string& origin, const std::string& v, bool* out);

// torchrun's --redirects/--tee: "3" for every local rank (key -1), or "0:3,1:0" per local rank.
absl::Status ParseStreams(const std::string& origin, const std::string& v, std::map<int, int>* out);

// "host:port", "[v6]:port", or a bare host (port 0: the default applies).
absl::Status ParseEndpoint(const std::string& origin, const std::string& v, std::string* host,
                           int* port);

}  // namespace braid::launcher

#endif  // BRAID_LAUNCHER_LAUNCH_FLAG_VALUES_H_
