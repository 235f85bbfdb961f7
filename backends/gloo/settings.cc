// Parsing of the Gloo communicator's options into Settings.
#include "backends/gloo/settings.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/check.h"

namespace braid::gloo_backend::internal {
namespace {

absl::Status ParseSize(const std::string& key, const std::string& value, int64_t min,
                       int64_t* out) {
  if (!absl::SimpleAtoi(value, out) || *out < min) {
    return absl::InvalidArgumentError(absl::StrCat("gloo communicator option ", key, "='", value,
                                                   "' must be an integer >= ", min));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Settings> ParseSettings(const std::map<std::string, std::string>& options) {
  Settings s;
  bool hostname_given = false;
  for (const auto& [key, value] : options) {
    int64_t n = 0;
    if (key == "hostname") {
      s.hostname = value;
      hostname_given = true;
    } else if (key == "iface") {
      s.iface = value;
    } else if (key == "group_name") {
      s.group_name = value;
    } else if (key == "store_prefix") {
      s.store_prefix = value;
    } else if (key == "heartbeat_ms") {
      BRAID_RETURN_IF_ERROR(ParseSize(key, value, 10, &n));
      s.heartbeat = absl::Milliseconds(n);
    } else if (key == "allreduce_algorithm") {
      if (value == "auto") {
        s.allreduce = AllreduceAlgorithm::kAuto;
      } else if (value == "ring") {
        s.allreduce = AllreduceAlgorithm::kRing;
      } else if (value == "bcube") {
        s.allreduce = AllreduceAlgorithm::kBcube;
      } else if (value == "direct") {
        s.allreduce = AllreduceAlgorithm::kDirect;
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("gloo communicator option allreduce_algorithm='", value,
                         "': use auto, ring, bcube or direct"));
      }
    } else if (key == "bcube_max_bytes") {
      BRAID_RETURN_IF_ERROR(ParseSize(key, value, 0, &n));
      s.bcube_max_bytes = size_t(n);
    } else if (key == "direct_max_bytes") {
      BRAID_RETURN_IF_ERROR(ParseSize(key, value, 0, &n));
      s.direct_max_bytes = size_t(n);
    } else if (key == "segment_bytes") {
      BRAID_RETURN_IF_ERROR(ParseSize(key, value, 64, &n));
      s.segment_bytes = size_t(n);
    } else if (key == "shm") {
      if (value == "on" || value == "1") {
        s.shm = true;
      } else if (value == "off" || value == "0") {
        s.shm = false;
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("gloo communicator option shm='", value, "': use on or off"));
      }
    } else if (key == "shm_spin_us") {
      BRAID_RETURN_IF_ERROR(ParseSize(key, value, 0, &n));
      s.shm_spin_us = n;
    } else if (key == "shm_ring_bytes") {
      BRAID_RETURN_IF_ERROR(ParseSize(key, value, 64, &n));
      s.shm_ring_bytes = size_t(n);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown gloo communicator option '", key,
          "' (known: hostname, iface, group_name, store_prefix, heartbeat_ms, "
          "allreduce_algorithm, direct_max_bytes, bcube_max_bytes, segment_bytes, shm, "
          "shm_ring_bytes, shm_spin_us)"));
    }
  }
  if (hostname_given && !s.iface.empty()) {
    return absl::InvalidArgumentError(
        "gloo communicator options: give either hostname or iface, not both");
  }
  return s;
}

std::chrono::milliseconds Ms(absl::Duration d) {
  return std::chrono::milliseconds(std::max<int64_t>(1, absl::ToInt64Milliseconds(d)));
}

}  // namespace braid::gloo_backend::internal
