#include "launcher/launch_flag_values.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace braid::launcher {

absl::Status BadValue(const std::string& origin, const std::string& value, const std::string& want) {
  return absl::InvalidArgumentError(absl::StrCat(origin, " wants ", want, ", got '", value, "'"));
}

absl::Status ParseInt(const std::string& origin, const std::string& v, int min, int* out) {
  int x;
  if (!absl::SimpleAtoi(v, &x)) return BadValue(origin, v, "an integer");
  if (x < min) return BadValue(origin, v, absl::StrCat("a number >= ", min));
  *out = x;
  return absl::OkStatus();
}

absl::Status ParseSeconds(const std::string& origin, const std::string& v, double* out) {
  double x;
  if (!absl::SimpleAtod(v, &x) || !(x > 0)) return BadValue(origin, v, "a positive number of seconds");
  *out = x;
  return absl::OkStatus();
}

absl::Status ParsePort(const std::string& origin, const std::string& v, int* out) {
  int x;
  if (!absl::SimpleAtoi(v, &x) || x <= 0 || x > 65535) return BadValue(origin, v, "a port in 1..65535");
  *out = x;
  return absl::OkStatus();
}

absl::Status ParseBool(const std::string& origin, const std::string& v, bool* out) {
  std::string l = absl::AsciiStrToLower(v);
  if (l == "" || l == "1" || l == "true" || l == "yes") *out = true;
  else if (l == "0" || l == "false" || l == "no") *out = false;
  else return BadValue(origin, v, "true or false");
  return absl::OkStatus();
}

// torchrun's --redirects/--tee: "3" for every local rank, or "0:3,1:0" per local rank.
absl::Status ParseStreams(const std::string& origin, const std::string& v, std::map<int, int>* out) {
  std::map<int, int> m;
  auto code = [&](absl::string_view s, int* c) -> absl::Status {
    if (!absl::SimpleAtoi(s, c) || *c < 0 || *c > 3) {
      return BadValue(origin, v, "0 (none), 3 (stdout and stderr), or LOCAL_RANK:CODE,... ");
    }
    if (*c == 1 || *c == 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          origin, "=", v, ": Braid keeps a worker's stdout and stderr together in one log "
          "(<--log_dir>/workerlog.<rank>), so it cannot pick one of them (1 = stdout, 2 = "
          "stderr); use 3 for both, or 0"));
    }
    return absl::OkStatus();
  };
  if (v.find(':') == std::string::npos) {
    int c;
    if (absl::Status st = code(v, &c); !st.ok()) return st;
    m[-1] = c;
  } else {
    for (absl::string_view part : absl::StrSplit(v, ',')) {
      std::vector<absl::string_view> kv = absl::StrSplit(part, absl::MaxSplits(':', 1));
      int lr, c;
      if (kv.size() != 2 || !absl::SimpleAtoi(kv[0], &lr) || lr < 0) {
        return BadValue(origin, v, "0, 3, or LOCAL_RANK:CODE,... (e.g. 0:3,1:0)");
      }
      if (absl::Status st = code(kv[1], &c); !st.ok()) return st;
      m[lr] = c;
    }
  }
  *out = std::move(m);
  return absl::OkStatus();
}

// "host:port", "[v6]:port", or a bare host (no port: the default applies).
absl::Status ParseEndpoint(const std::string& origin, const std::string& v, std::string* host,
                           int* port) {
  *port = 0;
  if (absl::StartsWith(v, "[")) {
    size_t rb = v.find(']');
    if (rb == std::string::npos) return BadValue(origin, v, "HOST:PORT or [IPv6]:PORT");
    *host = v.substr(1, rb - 1);
    std::string rest = v.substr(rb + 1);
    if (rest.empty()) return absl::OkStatus();
    if (rest[0] != ':') return BadValue(origin, v, "HOST:PORT or [IPv6]:PORT");
    return ParsePort(origin, rest.substr(1), port);
  }
  size_t colon = v.rfind(':');
  if (colon == std::string::npos || v.find(':') != colon) {
    *host = v;  // no port, or an IPv6 literal without brackets (and so without a port)
  } else {
    *host = v.substr(0, colon);
    if (absl::Status st = ParsePort(origin, v.substr(colon + 1), port); !st.ok()) return st;
  }
  if (host->empty()) return BadValue(origin, v, "HOST:PORT");
  return absl::OkStatus();
}

}  // namespace braid::launcher
