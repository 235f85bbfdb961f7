// What the training program asks before it uses a CUDA device: can this program train on it?
// Exists in every build, so the program needs no #ifdef: without --config=cuda the answer is
// "this build has no CUDA backend"; with it, CUDA's own reason when the device is unusable
// (no driver, no GPU, index out of range).
#ifndef BRAID_BACKENDS_CUDA_DEVICE_CHECK_H_
#define BRAID_BACKENDS_CUDA_DEVICE_CHECK_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/strategy.h"

namespace braid::cuda {

// OK when `device` (cuda:N) is usable; it then is the calling thread's current CUDA device and
// its runtime (streams, allocator) exists. The error's message starts with the device's name.
absl::Status PrepareCudaDevice(Device device);

// The training batches on `device` (after PrepareCudaDevice): `next_on_host` makes each batch on
// the CPU, and batch k+1 is staged in pinned memory and copied on the device's copy stream while
// step k runs (prefetch.h). Without the CUDA backend: the same error as PrepareCudaDevice.
absl::StatusOr<std::function<Batch()>> PrefetchBatches(Device device,
                                                       std::function<Batch()> next_on_host);

// The device's peak FLOP rate for products in `dtype` (peak_flops.h: from its properties), and
// in `basis` where the figure comes from; the error of PrepareCudaDevice without the device.
absl::StatusOr<double> DevicePeakFlops(Device device, DType dtype, std::string* basis);

// The half-precision dtypes `device` computes in, from its compute capability: bf16 from 8.0
// (Ampere) on, f16 on every GPU CUDA 13 runs (7.5 and later). `basis` (may be null) names the
// device and its capability. For "auto" fp16/bf16 in a config. Without the CUDA backend: the
// error of PrepareCudaDevice.
struct HalfSupport {
  bool bf16 = false;
  bool f16 = false;
};
inline HalfSupport HalfSupportOfCapability(int major, int minor) {
  return HalfSupport{major >= 8, major > 5 || (major == 5 && minor >= 3)};
}
absl::StatusOr<HalfSupport> DeviceHalfSupport(Device device, std::string* basis);

}  // namespace braid::cuda

#endif  // BRAID_BACKENDS_CUDA_DEVICE_CHECK_H_
