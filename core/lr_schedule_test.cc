// DeepSpeed's schedulers against their formulas worked out by hand at chosen steps: the first
// step, inside and at the ends of each phase, and far past the end. The expected numbers are
// written as the arithmetic they come from, not by calling the code under test.
#include "core/lr_schedule.h"

#include <cmath>

#include "gtest/gtest.h"

namespace braid::deepspeed_lr {
namespace {

TEST(WarmupLR, LogWarmupRisesAsLnOfStepThenHolds) {
  auto s = WarmupLR({1e-4, 1e-3, 100, WarmupType::kLog});
  EXPECT_FLOAT_EQ(s->At(0), 1e-4f);                          // ln 1 = 0
  EXPECT_FLOAT_EQ(s->At(9), float(1e-4 + 9e-4 * 0.5));       // ln 10 / ln 100
  EXPECT_FLOAT_EQ(s->At(99), 1e-3f);                         // ln 100 / ln 100, last warm-up step
  EXPECT_FLOAT_EQ(s->At(100), 1e-3f);
  EXPECT_FLOAT_EQ(s->At(1000000), 1e-3f);
}

TEST(WarmupLR, LinearWarmupAndTheTwoStepMinimum) {
  auto s = WarmupLR({1e-4, 1e-3, 100, WarmupType::kLinear});
  EXPECT_FLOAT_EQ(s->At(0), 1e-4f);
  EXPECT_FLOAT_EQ(s->At(25), float(1e-4 + 9e-4 * 0.25));
  EXPECT_FLOAT_EQ(s->At(99), float(1e-4 + 9e-4 * 0.99));
  EXPECT_FLOAT_EQ(s->At(100), 1e-3f);
  // DeepSpeed counts 0 or 1 warm-up steps as 2.
  auto one = WarmupLR({0.0, 1e-3, 1, WarmupType::kLinear});
  EXPECT_FLOAT_EQ(one->At(0), 0.0f);
  EXPECT_FLOAT_EQ(one->At(1), 5e-4f);
  EXPECT_FLOAT_EQ(one->At(2), 1e-3f);
  auto zero = WarmupLR({0.0, 1e-3, 0, WarmupType::kLog});
  EXPECT_FLOAT_EQ(zero->At(0), 0.0f);
  EXPECT_FLOAT_EQ(zero->At(1), 1e-3f);  // ln 2 / ln 2
}

TEST(WarmupDecayLR, DecaysLinearlyToWarmupMinAtTotal) {
  auto s = WarmupDecayLR({0.0, 1e-3, 10, WarmupType::kLinear}, 110);
  EXPECT_FLOAT_EQ(s->At(5), 5e-4f);
  EXPECT_FLOAT_EQ(s->At(10), 1e-3f);   // (110 - 10) / (110 - 10)
  EXPECT_FLOAT_EQ(s->At(60), 5e-4f);   // (110 - 60) / 100
  EXPECT_FLOAT_EQ(s->At(109), 1e-5f);  // 1 / 100
  EXPECT_EQ(s->At(110), 0.0f);
  EXPECT_EQ(s->At(500), 0.0f);  // clamped, never negative
  auto floor = WarmupDecayLR({1e-4, 1e-3, 10, WarmupType::kLog}, 110);
  EXPECT_FLOAT_EQ(floor->At(60), float(1e-4 + 9e-4 * 0.5));
  EXPECT_FLOAT_EQ(floor->At(110), 1e-4f);
  EXPECT_FLOAT_EQ(floor->At(3), float(1e-4 + 9e-4 * std::log(4.0) / std::log(10.0)));
}

TEST(WarmupCosineLR, RatiosOfTheRateWithDeepSpeedsOffByOneCosine) {
  auto s = WarmupCosineLR({1e-3, 110, 0.1, 10, 0.01, WarmupType::kLinear});
  EXPECT_FLOAT_EQ(s->At(0), 1e-4f);                       // warmup_min_ratio
  EXPECT_FLOAT_EQ(s->At(5), float(1e-3 * (0.1 + 0.9 * 0.5)));
  EXPECT_FLOAT_EQ(s->At(9), float(1e-3 * (0.1 + 0.9 * 0.9)));
  // The cosine's phase is (s - warmup + 1) / (total - warmup), as in DeepSpeed.
  EXPECT_FLOAT_EQ(s->At(10), float(1e-3 * (0.01 + 0.99 * (1 + std::cos(M_PI / 100)) / 2)));
  EXPECT_FLOAT_EQ(s->At(59), float(1e-3 * (0.01 + 0.99 * 0.5)));  // a quarter turn
  EXPECT_FLOAT_EQ(s->At(109), 1e-5f);                             // cos π: cos_min_ratio
  EXPECT_FLOAT_EQ(s->At(110), 1e-5f);  // held (DeepSpeed's would rise again)
  EXPECT_FLOAT_EQ(s->At(400), 1e-5f);
  auto log = WarmupCosineLR({2e-3, 1000, 0.0, 100, 1e-4, WarmupType::kLog});
  EXPECT_EQ(log->At(0), 0.0f);
  EXPECT_FLOAT_EQ(log->At(9), 1e-3f);  // ln 10 / ln 100 of 2e-3
}

TEST(OneCycle, TriangleThenDecay) {
  // first 10 + second 30 = 40 steps; the phase is (s + 1) / 40, peak at 10 / 40.
  auto s = OneCycle({1e-4, 1e-3, 10, 30, 10, 0.5});
  EXPECT_FLOAT_EQ(s->At(0), float(1e-4 + 9e-4 * 0.1));  // x = 1/40, scale x / 0.25
  EXPECT_FLOAT_EQ(s->At(4), float(1e-4 + 9e-4 * 0.5));
  EXPECT_FLOAT_EQ(s->At(9), 1e-3f);                      // x = 0.25: the peak
  EXPECT_FLOAT_EQ(s->At(24), float(1e-4 + 9e-4 * 0.5));  // (0.625 - 1) / (0.25 - 1)
  EXPECT_FLOAT_EQ(s->At(38), float(1e-4 + 9e-4 * (1.0 / 30)));
  EXPECT_FLOAT_EQ(s->At(39), 1e-4f);  // x wraps to 0: the cycle's end
  EXPECT_FLOAT_EQ(s->At(40), float(1e-4 / (1 + 0.5 * 0.1)));  // decay: (40 - 40 + 1) / 10
  EXPECT_FLOAT_EQ(s->At(59), 5e-5f);                          // 1 + 0.5 × 2
  // decay_step_size 0 or decay_lr_rate 0: no decay.
  EXPECT_FLOAT_EQ(OneCycle({1e-4, 1e-3, 10, 30, 0, 0.5})->At(1000), 1e-4f);
  EXPECT_FLOAT_EQ(OneCycle({1e-4, 1e-3, 10, 30, 10, 0.0})->At(1000), 1e-4f);
}

TEST(OneCycle, MomentumIsTheTriangleUpsideDownThenDecays) {
  // The rate's cycle above (first 10, second 30), momentum from 0.9 down to 0.8 at the peak.
  OneCycleParams p{1e-4, 1e-3, 10, 30, 10, 0.5};
  p.cycle_min_mom = 0.8;
  p.cycle_max_mom = 0.9;
  p.decay_mom_rate = 0.01;
  EXPECT_DOUBLE_EQ(OneCycleMomentum(p, 0), 0.9 - 0.1 * 0.1);   // scale 0.1
  EXPECT_DOUBLE_EQ(OneCycleMomentum(p, 4), 0.9 - 0.1 * 0.5);   // scale 0.5
  EXPECT_DOUBLE_EQ(OneCycleMomentum(p, 9), 0.8);               // the rate's peak
  EXPECT_DOUBLE_EQ(OneCycleMomentum(p, 24), 0.9 - 0.1 * 0.5);  // (0.625 - 1) / (0.25 - 1)
  EXPECT_DOUBLE_EQ(OneCycleMomentum(p, 39), 0.9);              // x wraps to 0
  // Decay: 0.9 x (1 + 0.01 x (s - 40 + 1) / 10).
  EXPECT_DOUBLE_EQ(OneCycleMomentum(p, 40), 0.9 * (1 + 0.01 * 0.1));
  EXPECT_DOUBLE_EQ(OneCycleMomentum(p, 59), 0.9 * (1 + 0.01 * 2.0));
  p.decay_step_size = 0;  // no decay: cycle_max_mom
  EXPECT_DOUBLE_EQ(OneCycleMomentum(p, 1000), 0.9);
  // The momentum falls while the rate rises, and the two meet their ends together.
  auto lr = OneCycle(p);
  for (int64_t s : {0, 3, 9, 20, 38}) {
    const double rate_scale = (lr->At(s) - 1e-4) / 9e-4;
    EXPECT_NEAR(OneCycleMomentum(p, s), 0.9 - 0.1 * rate_scale, 1e-6) << "step " << s;
  }
}

TEST(LRRangeTest, ContinuousAndStaircase) {
  auto s = LRRangeTest({1e-3, 10, 0.5, false});
  EXPECT_FLOAT_EQ(s->At(0), float(1e-3 * (1 + 0.5 * 0.1)));
  EXPECT_FLOAT_EQ(s->At(9), 1.5e-3f);
  EXPECT_FLOAT_EQ(s->At(99), 6e-3f);
  auto stairs = LRRangeTest({1e-3, 10, 0.5, true});
  EXPECT_FLOAT_EQ(stairs->At(0), 1e-3f);
  EXPECT_FLOAT_EQ(stairs->At(8), 1e-3f);
  EXPECT_FLOAT_EQ(stairs->At(9), 1.5e-3f);
  EXPECT_FLOAT_EQ(stairs->At(18), 1.5e-3f);
  EXPECT_FLOAT_EQ(stairs->At(19), 2e-3f);
}

}  // namespace
}  // namespace braid::deepspeed_lr
