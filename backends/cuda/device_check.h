// What the training program asks before it uses a CUDA device: can this program train on it?
// Exists in every build, so the program needs no #ifdef: without --config=cuda the answer is
// "this build has no CUDA backend"; with it, CUDA's own reason when the device is unusable
// (no driver, no GPU, index out of range).
#ifndef BRAID_BACKENDS_CUDA_DEVICE_CHECK_H_
#define BRAID_BACKENDS_CUDA_DEVICE_CHECK_H_

#include "absl/status/status.h"
#include "core/device.h"

namespace braid::cuda {

// OK when `device` (cuda:N) is usable; it then is the calling thread's current CUDA device and
// its runtime (streams, allocator) exists. The error's message starts with the device's name.
absl::Status PrepareCudaDevice(Device device);

}  // namespace braid::cuda

#endif  // BRAID_BACKENDS_CUDA_DEVICE_CHECK_H_
