#include "core/device.h"

#include <ostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace braid {

absl::StatusOr<Device> Device::Parse(const std::string& s) {
  std::string kind = s;
  int index = 0;
  auto colon = s.find(':');
  if (colon != std::string::npos) {
    kind = s.substr(0, colon);
    if (!absl::SimpleAtoi(s.substr(colon + 1), &index) || index < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad device '", s, "': the index after ':' must be a number >= 0"));
    }
  }
  if (kind == "cpu") return Device{DeviceType::kCPU, index};
  if (kind == "cuda") return Device{DeviceType::kCUDA, index};
  return absl::InvalidArgumentError(
      absl::StrCat("bad device '", s, "': expected cpu, cpu:N or cuda:N"));
}

std::string Device::ToString() const {
  if (*this == Host()) return "host";
  if (type == DeviceType::kCPU && index == -2) return "host (pinned)";  // core/pinned_host.h
  return absl::StrCat(type == DeviceType::kCPU ? "cpu" : "cuda", ":", index);
}

std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.ToString(); }

}  // namespace braid
