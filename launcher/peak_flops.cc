#include "launcher/peak_flops.h"

#include <algorithm>

#include "absl/time/clock.h"
#include "core/ops.h"
#include "core/tensor.h"

namespace braid::launcher {

double MeasurePeakFlops(Device device) {
  if (device.type != DeviceType::kCPU) return 0;
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
