#include "core/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <utility>

#include "core/check.h"

namespace braid::deepspeed_lr {
namespace {

// A schedule given as a function of the step, evaluated in double and rounded once.
class FunctionSchedule final : public LrSchedule {
 public:
  explicit FunctionSchedule(std::function<double(int64_t)> f) : f_(std::move(f)) {}
  float At(int64_t step) const override { return float(f_(step)); }

 private:
  std::function<double(int64_t)> f_;
};

// DeepSpeed raises a warm-up shorter than 2 steps to 2 (its log warm-up divides by ln n).
int64_t EffectiveWarmup(int64_t warmup_num_steps) { return std::max<int64_t>(2, warmup_num_steps); }

// The fraction of the warm-up done at step s < n.
double WarmupFraction(WarmupType type, int64_t s, int64_t n) {
  if (type == WarmupType::kLog) return std::log(double(s) + 1.0) / std::log(double(n));
  return double(s) / double(n);
}

}  // namespace

std::unique_ptr<LrSchedule> WarmupLR(const WarmupParams& p) {
  BRAID_CHECK(p.warmup_num_steps >= 0) << "WarmupLR: warmup_num_steps " << p.warmup_num_steps;
  const int64_t n = EffectiveWarmup(p.warmup_num_steps);
  return std::make_unique<FunctionSchedule>([p, n](int64_t s) {
    const double gamma = s < n ? WarmupFraction(p.warmup_type, s, n) : 1.0;
    return p.warmup_min_lr + (p.warmup_max_lr - p.warmup_min_lr) * gamma;
  });
}

std::unique_ptr<LrSchedule> WarmupDecayLR(const WarmupParams& p, int64_t total_num_steps) {
  BRAID_CHECK(p.warmup_num_steps >= 0 && total_num_steps >= 1)
      << "WarmupDecayLR: warmup_num_steps " << p.warmup_num_steps << ", total_num_steps "
      << total_num_steps;
  const int64_t n = EffectiveWarmup(p.warmup_num_steps);
  return std::make_unique<FunctionSchedule>([p, n, total_num_steps](int64_t s) {
    const double gamma =
        s < n ? WarmupFraction(p.warmup_type, s, n)
              : std::max(0.0, double(total_num_steps - s) /
                                  std::max(1.0, double(total_num_steps - n)));
    return p.warmup_min_lr + (p.warmup_max_lr - p.warmup_min_lr) * gamma;
  });
}

std::unique_ptr<LrSchedule> WarmupCosineLR(const WarmupCosineParams& p) {
  const int64_t n = EffectiveWarmup(p.warmup_num_steps);
  BRAID_CHECK(p.warmup_num_steps >= 0 && p.total_num_steps > n)
      << "WarmupCosineLR needs total_num_steps (" << p.total_num_steps
      << ") > the warm-up's steps (" << n << ")";
  return std::make_unique<FunctionSchedule>([p, n](int64_t s) {
    if (s < n) {
      return p.lr * (p.warmup_min_ratio +
                     (1.0 - p.warmup_min_ratio) * WarmupFraction(p.warmup_type, s, n));
    }
    // Held at the end: past total_num_steps DeepSpeed's cosine climbs back up, which no run
    // that trains longer than its schedule means.
    const int64_t last = std::min(s, p.total_num_steps - 1);
    const double progress = double(last - n + 1) / double(p.total_num_steps - n);
    const double cosine = (1.0 + std::cos(M_PI * progress)) / 2.0;
    return p.lr * std::max(0.0, p.cos_min_ratio + (1.0 - p.cos_min_ratio) * cosine);
  });
}

namespace {

// OneCycle's position in its triangle at step s < total: 0 at the ends, 1 at the peak.
double OneCycleScale(const OneCycleParams& p, int64_t s) {
  const double total = double(p.cycle_first_step_size + p.cycle_second_step_size);
  const double ratio = double(p.cycle_first_step_size) / total;
  const double it = double(s) + 1.0;
  const double cycle = std::floor(1.0 + it / total);
  const double x = 1.0 + it / total - cycle;
  return x <= ratio ? x / ratio : (x - 1.0) / (ratio - 1.0);
}

}  // namespace

double OneCycleMomentum(const OneCycleParams& p, int64_t s) {
  const int64_t total = p.cycle_first_step_size + p.cycle_second_step_size;
  if (s < total) {
    return p.cycle_max_mom - (p.cycle_max_mom - p.cycle_min_mom) * OneCycleScale(p, s);
  }
  if (p.decay_step_size == 0) return p.cycle_max_mom;
  const double interval = (double(s - total) + 1.0) / double(p.decay_step_size);
  return p.cycle_max_mom * (1.0 + p.decay_mom_rate * interval);
}

std::unique_ptr<LrSchedule> OneCycle(const OneCycleParams& p) {
  BRAID_CHECK(p.cycle_first_step_size >= 1 && p.cycle_second_step_size >= 1)
      << "OneCycle: step sizes " << p.cycle_first_step_size << ", " << p.cycle_second_step_size;
  const double total = double(p.cycle_first_step_size + p.cycle_second_step_size);
  const bool decay = p.decay_step_size != 0 && p.decay_lr_rate != 0.0;
  return std::make_unique<FunctionSchedule>([p, total, decay](int64_t s) {
    if (double(s) < total) {
      return p.cycle_min_lr + (p.cycle_max_lr - p.cycle_min_lr) * OneCycleScale(p, s);
    }
    if (!decay) return p.cycle_min_lr;
    const double interval = (double(s) - total + 1.0) / double(p.decay_step_size);
    return p.cycle_min_lr / (1.0 + p.decay_lr_rate * interval);
  });
}

std::unique_ptr<LrSchedule> LRRangeTest(const LrRangeTestParams& p) {
  BRAID_CHECK(p.step_size >= 1) << "LRRangeTest: lr_range_test_step_size " << p.step_size;
  return std::make_unique<FunctionSchedule>([p](int64_t s) {
    double interval = (double(s) + 1.0) / double(p.step_size);
    if (p.staircase) interval = std::floor(interval);
    return p.min_lr * (1.0 + p.step_rate * interval);
  });
}

}  // namespace braid::deepspeed_lr
