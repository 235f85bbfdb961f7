#include "core/testing/compare.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace braid::testing {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
}  // namespace

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return kInf;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    // Checked on the inputs rather than on the difference: the difference is NaN for a NaN on
    // either side or the same inf on both, and std::max would drop it.
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return kInf;
    worst = std::max(worst, std::fabs(double(a[i]) - double(b[i])));
  }
  return worst;
}

double MaxRelDiff(const std::vector<float>& a, const std::vector<float>& b, double floor) {
  const double diff = MaxAbsDiff(a, b);
  // Also keeps inf / inf (NaN) out: an infinite diff means some value was not finite.
  if (std::isinf(diff)) return kInf;
  double scale = floor;
  for (float v : b) scale = std::max(scale, double(std::fabs(v)));  // all finite by now
  return scale > 0 ? diff / scale : diff;
}

double Worst(double so_far, double d) {
  if (std::isnan(d) || std::isnan(so_far)) return kInf;
  return std::max(so_far, d);
}

}  // namespace braid::testing
