// Page-locked ("pinned") host memory for state a strategy offloads from its training device
// (DeepSpeed's `pin_memory`, e.g. ZeRO-Infinity's parameter shards).
//
// Why a device of its own: a copy between a GPU and pageable host memory is staged by the
// driver through a pinned buffer of its own and blocks the host; from page-locked memory it is a
// direct DMA. Which memory can be page-locked, and how, is the backend's business (CUDA:
// cudaHostAlloc), so core only keeps the slot: a backend registers an allocator factory for the
// device type it serves, and OffloadHost picks it. A CPU training device copies nothing across
// a bus, so no backend registers one for it and pinning means nothing there.
#ifndef BRAID_CORE_PINNED_HOST_H_
#define BRAID_CORE_PINNED_HOST_H_

#include <functional>
#include <memory>

#include "core/allocator.h"
#include "core/device.h"

namespace braid {

// Pinned host memory: a CPU device (CPU kernels run on it) with its own allocator and counters,
// printed "host (pinned)". It exists once OffloadHost has chosen it.
inline constexpr int kPinnedHostIndex = -2;
inline Device PinnedHost() { return Device{DeviceType::kCPU, kPinnedHostIndex}; }

// Makes the pinned host allocator for copies to and from `compute` (a device of the type the
// factory was registered for; its runtime does the pinning).
using PinnedHostAllocatorFactory = std::function<std::unique_ptr<Allocator>(Device compute)>;
// For backends: page-locked host memory serves copies to and from devices of `compute_type`.
void RegisterPinnedHostAllocator(DeviceType compute_type, PinnedHostAllocatorFactory factory);
bool HasPinnedHostAllocator(DeviceType compute_type);

// Where state offloaded from `compute` lives: PinnedHost() when `pin` and `compute`'s backend
// registered pinned memory (the first such call makes the allocator, for `compute`), otherwise
// Device::Host() (pageable). One pinned host device per process: pinned memory from CUDA is
// portable across that process's devices.
Device OffloadHost(Device compute, bool pin);

}  // namespace braid

#endif  // BRAID_CORE_PINNED_HOST_H_
