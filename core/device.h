// Where a tensor lives. The device is part of every tensor; nothing in core assumes CPU.
#ifndef BRAID_CORE_DEVICE_H_
#define BRAID_CORE_DEVICE_H_

#include <string>

#include "absl/status/statusor.h"

namespace braid {

enum class DeviceType : uint8_t { kCPU = 0, kCUDA = 1 };
inline constexpr int kNumDeviceTypes = 2;

struct Device {
  DeviceType type = DeviceType::kCPU;
  // CPU devices can be numbered too: each cpu:N has its own allocator and counters, which is how
  // single-process data parallel is exercised without GPUs.
  int index = 0;

  static Device CPU(int index = 0) { return Device{DeviceType::kCPU, index}; }
  static Device CUDA(int index = 0) { return Device{DeviceType::kCUDA, index}; }
  // Host memory kept apart from the training device: where offloaded state lives (ZeRO-Offload's
  // optimizer). A CPU device with an allocator and counters of its own, so that on CPU-only runs
  // too the summary shows what moved off the training device. Printed "host".
  static constexpr int kHostIndex = -1;
  static Device Host() { return Device{DeviceType::kCPU, kHostIndex}; }
  static absl::StatusOr<Device> Parse(const std::string& s);  // "cpu", "cpu:1", "cuda:0"
  std::string ToString() const;
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

std::ostream& operator<<(std::ostream& os, const Device& d);

}  // namespace braid

#endif  // BRAID_CORE_DEVICE_H_
