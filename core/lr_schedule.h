// DeepSpeed's learning-rate schedulers (deepspeed/runtime/lr_schedules.py), with DeepSpeed's
// parameter names and formulas, so that a DeepSpeed config's `scheduler` section trains with
// the rates it did there. Braid's own Constant and WarmupCosine are in core/optimizer.h.
//
// Each is a pure function of the step: At(s) is DeepSpeed's get_lr() with
// last_batch_iteration = s, the rate of optimizer step s (counted from 0). Nothing is stored
// but the parameters, so a resumed run (which restarts at the checkpoint's step) gets the same
// rates as an uninterrupted one.
#ifndef BRAID_CORE_LR_SCHEDULE_H_
#define BRAID_CORE_LR_SCHEDULE_H_

#include <cstdint>
#include <memory>

#include "core/optimizer.h"

namespace braid::deepspeed_lr {

// How a warm-up rises from its start to its peak over n = max(2, warmup_num_steps) steps:
// kLog: ln(s + 1) / ln(n) (DeepSpeed's default); kLinear: s / n.
enum class WarmupType { kLog, kLinear };

struct WarmupParams {
  double warmup_min_lr = 0.0;
  double warmup_max_lr = 1e-3;
  int64_t warmup_num_steps = 1000;  // fewer than 2 count as 2, as in DeepSpeed
  WarmupType warmup_type = WarmupType::kLog;
};

// warmup_min_lr + (warmup_max_lr - warmup_min_lr) × warm-up fraction, then warmup_max_lr.
std::unique_ptr<LrSchedule> WarmupLR(const WarmupParams& p);

// WarmupLR's warm-up, then a linear decay: warmup_min_lr + (warmup_max_lr - warmup_min_lr) ×
// max(0, (total - s) / max(1, total - n)), back at warmup_min_lr from total_num_steps on.
std::unique_ptr<LrSchedule> WarmupDecayLR(const WarmupParams& p, int64_t total_num_steps);

struct WarmupCosineParams {
  double lr = 1e-3;  // the optimizer's rate: the others are ratios of it
  int64_t total_num_steps = 0;  // > warmup steps
  double warmup_min_ratio = 0.0;
  int64_t warmup_num_steps = 1000;  // fewer than 2 count as 2
  double cos_min_ratio = 1e-4;
  WarmupType warmup_type = WarmupType::kLog;
};
// lr × ratio: during the warm-up warmup_min_ratio + (1 - warmup_min_ratio) × fraction; then
// max(0, cos_min_ratio + (1 - cos_min_ratio) × (1 + cos(π (s - n + 1) / (total - n))) / 2).
// From total_num_steps on it stays at lr × cos_min_ratio (DeepSpeed's cosine would rise again).
std::unique_ptr<LrSchedule> WarmupCosineLR(const WarmupCosineParams& p);

struct OneCycleParams {
  double cycle_min_lr = 0.0, cycle_max_lr = 0.0;
  int64_t cycle_first_step_size = 2000;
  int64_t cycle_second_step_size = 2000;  // DeepSpeed's default: the first
  int64_t decay_step_size = 0;            // 0: no decay after the cycle
  double decay_lr_rate = 0.0;             // 0: no decay after the cycle
  // The momentum's cycle (OneCycleMomentum), DeepSpeed's defaults.
  double cycle_min_mom = 0.8, cycle_max_mom = 0.9;
  double decay_mom_rate = 0.0;
};
// One triangle over total = first + second steps, with x = (s + 1) / total (DeepSpeed's phase,
// one step ahead): up from cycle_min_lr for x <= first / total, back down after; from s = total
// on, cycle_min_lr / (1 + decay_lr_rate × (s - total + 1) / decay_step_size).
std::unique_ptr<LrSchedule> OneCycle(const OneCycleParams& p);

// OneCycle's momentum (DeepSpeed's cycle_momentum: Adam's beta1, beta2 held at 0.99): the rate's
// triangle upside down, cycle_max_mom - (cycle_max_mom - cycle_min_mom) x scale with the rate's
// scale at step s; from s = total on, cycle_max_mom x (1 + decay_mom_rate x (s - total + 1) /
// decay_step_size), or cycle_max_mom when decay_step_size is 0.
double OneCycleMomentum(const OneCycleParams& p, int64_t s);
inline constexpr double kOneCycleBeta2 = 0.99;  // DeepSpeed's, while the momentum cycles

struct LrRangeTestParams {
  double min_lr = 1e-3;
  int64_t step_size = 2000;
  double step_rate = 1.0;
  bool staircase = false;
};
// min_lr × (1 + step_rate × (s + 1) / step_size), the quotient floored when staircase.
std::unique_ptr<LrSchedule> LRRangeTest(const LrRangeTestParams& p);

}  // namespace braid::deepspeed_lr

#endif  // BRAID_CORE_LR_SCHEDULE_H_
