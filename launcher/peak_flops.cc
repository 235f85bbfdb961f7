#include "launcher/peak_flops.h"

#include <algorithm>

#include "absl/time/clock.h"
#include "backends/cuda/device_check.h"
#include "core/ops.h"
#include "core/tensor.h"

namespace braid::launcher {

double MeasurePeakFlops(Device device, DType dtype, std::string* basis) {
  if (device.type == DeviceType::kCUDA) {
    std::string why;
    absl::StatusOr<double> peak = cuda::DevicePeakFlops(device, dtype, &why);
    if (basis != nullptr) *basis = peak.ok() ? why : std::string(peak.status().message());
    return peak.ok() ? *peak : 0;
  }
  if (device.type != DeviceType::kCPU) return 0;
  if (basis != nullptr) *basis = "f32 matmul ceiling measured now";
  constexpr int64_t n = 1024;
  // Values that stay normal through the sums (denormals would slow the product down).
  const Tensor a = Tensor::Full({n, n}, 0.5f), b = Tensor::Full({n, n}, 0.25f);
  (void)ops::MatMul(a, b);  // warm-up: OpenBLAS's buffers and threads
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    const absl::Time t0 = absl::Now();
    Tensor c = ops::MatMul(a, b);
    best = std::min(best, absl::ToDoubleSeconds(absl::Now() - t0));
  }
  return best > 0 ? 2.0 * n * n * n / best : 0;
}

}  // namespace braid::launcher
