// The loss-scaler state machine, step by step: hand-worked sequences, and every (scale,
// counter, window count) against a transcription of DeepSpeed's DynamicLossScaler.update_scale
// kept in this file (../shared/PARALLELISM.md, "Mixed precision", writes the rule out).
#include "launcher/mixed_precision/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace braid {
namespace {

LossScalerOptions Dynamic(float initial, int window, int hysteresis, float min_scale) {
  LossScalerOptions o;
  o.dynamic = true;
  o.initial_scale = initial;
  o.window = window;
  o.hysteresis = hysteresis;
  o.min_scale = min_scale;
  return o;
}

// DeepSpeed's update_scale, line for line in its own terms (cur_iter, last_overflow_iter,
// cur_hysteresis, delayed_shift), so that a slip in the scaler's representation (a window count
// reset at growth, a counter instead of iterations) shows as a disagreement.
struct DeepSpeedReference {
  double cur_scale;
  double min_scale;
  int scale_window;
  int delayed_shift;  // DeepSpeed's name for hysteresis
  bool consecutive_hysteresis;
  int cur_hysteresis;
  int64_t cur_iter = 0;
  int64_t last_overflow_iter = -1;

  DeepSpeedReference(double init_scale, int window, int hysteresis, double min, bool consecutive)
      : cur_scale(init_scale), min_scale(min), scale_window(window), delayed_shift(hysteresis),
        consecutive_hysteresis(consecutive), cur_hysteresis(hysteresis) {}

  void UpdateScale(bool overflow) {
    const double scale_factor = 2.0;
    if (overflow) {
      if (delayed_shift == 1 || cur_hysteresis == 1) {
        cur_scale = std::max(cur_scale / scale_factor, min_scale);
      } else {
        cur_hysteresis -= 1;
      }
      last_overflow_iter = cur_iter;
    } else {
      if (consecutive_hysteresis) cur_hysteresis = delayed_shift;
      if ((cur_iter - last_overflow_iter) % scale_window == 0) {
        if (!consecutive_hysteresis) cur_hysteresis = delayed_shift;
        cur_scale *= scale_factor;
      }
    }
    cur_iter += 1;
  }
  // Clean steps since the last overflow, modulo the window: what LossScalerState::clean_steps
  // holds.
  int64_t CleanStepsInWindow() const { return (cur_iter - last_overflow_iter - 1) % scale_window; }
};

LossScalerOptions Options(float initial, int window, int hysteresis, float min_scale,
                          bool consecutive) {
  LossScalerOptions o = Dynamic(initial, window, hysteresis, min_scale);
  o.consecutive_hysteresis = consecutive;
  return o;
}

// Runs `overflows` through both and compares the whole state after every step.
void ExpectSameAsDeepSpeed(const std::vector<bool>& overflows, float initial, int window,
                           int hysteresis, float min_scale, bool consecutive) {
  LossScaler s(Options(initial, window, hysteresis, min_scale, consecutive));
  DeepSpeedReference ds(initial, window, hysteresis, min_scale, consecutive);
  int64_t skipped = 0;
  for (size_t i = 0; i < overflows.size(); ++i) {
    const bool applied = s.Update(overflows[i]);
    ds.UpdateScale(overflows[i]);
    skipped += overflows[i];
    const std::string where = ::testing::PrintToString(i) + " (hysteresis " +
                              ::testing::PrintToString(hysteresis) + ", window " +
                              ::testing::PrintToString(window) +
                              (consecutive ? ", consecutive_hysteresis)" : ")");
    ASSERT_EQ(applied, !overflows[i]) << "step " << where;
    ASSERT_EQ(double(s.scale()), ds.cur_scale) << "scale after step " << where;
    ASSERT_EQ(s.state().hysteresis_left, ds.cur_hysteresis) << "counter after step " << where;
    ASSERT_EQ(s.state().clean_steps, ds.CleanStepsInWindow()) << "window count after step " << where;
    ASSERT_EQ(s.skipped_steps(), skipped) << "step " << where;
    // Braid stops doubling short of f32's inf, DeepSpeed's Python float does not: the sequences
    // are chosen to stay far below that (NeverGrowsToInfinity tests the cap).
    ASSERT_LT(ds.cur_scale, std::ldexp(1.0, 100)) << "step " << where;
  }
}

// The sequences DeepSpeed's rule is compared on: hand-picked runs of overflows around window
// boundaries and down to the floor, then a seeded random one (mt19937's raw output is fixed by
// the standard, so the sequence is the same everywhere).
std::vector<std::vector<bool>> ScriptedSequences() {
  const bool X = true, o = false;  // overflow, clean
  std::vector<std::vector<bool>> seqs = {
      {X, X, X, X, X, X, X, X, X, X, X, X},           // down to the floor and held there
      {X, o, X, o, X, o, X, o, X, o, X, o, X, o, X},  // alternating: consecutive_hysteresis matters
      {X, X, o, o, o, X, o, o, o, o, X, X, X, o, o, o, o, o, o, o, o},
      {o, o, o, o, o, o, o, o, o, X, o, o, o, o, o, o, o, o, X, X, o, o, o, o},
      {o, o, X, o, o, o, X, o, o, X, X, o, o, o, o, o, o, X, o, X, o, o, X},
      {X, X, X, o, o, o, o, o, o, o, o, o, o, o, o, X, X, o, X, o, o, o, X},
  };
  std::mt19937 rng(20240607);
  std::vector<bool> random;
  for (int i = 0; i < 150; ++i) random.push_back(rng() % 2 == 0);
  seqs.push_back(random);
  return seqs;
}

TEST(LossScalerTest, EveryStateAsDeepSpeedsUpdateScale) {
  for (const std::vector<bool>& seq : ScriptedSequences()) {
    for (int hysteresis : {1, 2, 3}) {
      for (bool consecutive : {false, true}) {
        for (int window : {1, 2, 3, 5}) {
          // min_scale 8 is reached after a few halvings of 256; 24 is not a power of two, so a
          // halving can land on the floor between powers (48 -> 24, then 24 -> 48 on growth).
          for (float min_scale : {8.0f, 24.0f}) {
            ExpectSameAsDeepSpeed(seq, 256, window, hysteresis, min_scale, consecutive);
            if (HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

// The difference from the old rule, by hand: after a halving the counter stays at 1, so the
// next overflow halves again at once; only growth restores it.
TEST(LossScalerTest, HysteresisIsUsedUpUntilTheScaleGrows) {
  LossScaler s(Dynamic(1024, 3, 2, 1));
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_EQ(s.state().hysteresis_left, 2);
  EXPECT_FALSE(s.Update(true));  // first overflow: the counter 2 -> 1, scale kept
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_EQ(s.state().hysteresis_left, 1);
  EXPECT_FALSE(s.Update(true));  // counter at 1: halves, the counter stays 1
  EXPECT_EQ(s.scale(), 512);
  EXPECT_EQ(s.state().hysteresis_left, 1);
  EXPECT_FALSE(s.Update(true));  // and again at once
  EXPECT_EQ(s.scale(), 256);
  EXPECT_EQ(s.state().hysteresis_left, 1);
  EXPECT_EQ(s.skipped_steps(), 3);
  // Clean steps short of the window restore nothing.
  EXPECT_TRUE(s.Update(false));
  EXPECT_TRUE(s.Update(false));
  EXPECT_EQ(s.state().hysteresis_left, 1);
  EXPECT_FALSE(s.Update(true));
  EXPECT_EQ(s.scale(), 128);
  // A full window of clean steps doubles the scale and restores the counter.
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(s.Update(false));
  EXPECT_EQ(s.scale(), 256);
  EXPECT_EQ(s.state().hysteresis_left, 2);
  EXPECT_FALSE(s.Update(true));
  EXPECT_EQ(s.scale(), 256);  // one overflow tolerated again
  EXPECT_EQ(s.state().hysteresis_left, 1);
}

TEST(LossScalerTest, ConsecutiveHysteresisRestoresOnEveryCleanStep) {
  LossScaler s(Options(1024, 1000, 3, 1, /*consecutive=*/true));
  // Overflows separated by clean steps never use up the hysteresis of 3.
  for (int i = 0; i < 10; ++i) {
    EXPECT_FALSE(s.Update(true));
    EXPECT_FALSE(s.Update(true));
    EXPECT_EQ(s.state().hysteresis_left, 1);
    EXPECT_TRUE(s.Update(false));
    EXPECT_EQ(s.state().hysteresis_left, 3);
  }
  EXPECT_EQ(s.scale(), 1024);
  // Three in a row halve; further ones in the same run halve at once.
  EXPECT_FALSE(s.Update(true));
  EXPECT_FALSE(s.Update(true));
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_FALSE(s.Update(true));
  EXPECT_EQ(s.scale(), 512);
  EXPECT_FALSE(s.Update(true));
  EXPECT_EQ(s.scale(), 256);
}

TEST(LossScalerTest, GrowsAfterWindowCleanSteps) {
  LossScaler s(Dynamic(8, 3, 1, 1));
  EXPECT_TRUE(s.Update(false));
  EXPECT_TRUE(s.Update(false));
  EXPECT_EQ(s.scale(), 8);
  EXPECT_TRUE(s.Update(false));  // third clean step in a row
  EXPECT_EQ(s.scale(), 16);
  EXPECT_EQ(s.state().clean_steps, 0);
  // An overflow resets the run of clean steps.
  EXPECT_TRUE(s.Update(false));
  EXPECT_TRUE(s.Update(false));
  EXPECT_FALSE(s.Update(true));  // hysteresis 1: halves at once
  EXPECT_EQ(s.scale(), 8);
  EXPECT_TRUE(s.Update(false));
  EXPECT_TRUE(s.Update(false));
  EXPECT_EQ(s.scale(), 8);
  EXPECT_TRUE(s.Update(false));
  EXPECT_EQ(s.scale(), 16);
}

TEST(LossScalerTest, FloorsAtMinScale) {
  LossScaler s(Dynamic(4, 1000, 1, 2));
  EXPECT_FALSE(s.Update(true));
  EXPECT_EQ(s.scale(), 2);
  EXPECT_FALSE(s.Update(true));
  EXPECT_EQ(s.scale(), 2);  // not below min_loss_scale
  EXPECT_EQ(s.skipped_steps(), 2);
}

TEST(LossScalerTest, NeverGrowsToInfinity) {
  LossScaler s(Dynamic(std::ldexp(1.0f, 127), 1, 1, 1));
  EXPECT_TRUE(s.Update(false));
  EXPECT_EQ(s.scale(), std::ldexp(1.0f, 127));  // 2^128 is inf in f32: kept
}

TEST(LossScalerTest, StaticScaleSkipsButNeverChanges) {
  LossScalerOptions o;
  o.dynamic = false;
  o.initial_scale = 128;
  o.window = 1;
  LossScaler s(o);
  EXPECT_FALSE(s.Update(true));
  EXPECT_FALSE(s.Update(true));
  EXPECT_TRUE(s.Update(false));
  EXPECT_TRUE(s.Update(false));
  EXPECT_EQ(s.scale(), 128);
  EXPECT_EQ(s.skipped_steps(), 2);
}

// A run of decisions replayed from a saved state continues exactly as the original.
TEST(LossScalerTest, StateRoundTripResumesExactly) {
  const std::vector<bool> overflow = {false, true, false, false, true, true, false, false, false,
                                      false, true, false, false, false, false, false};
  LossScaler whole(Dynamic(256, 3, 2, 1));
  LossScaler first(Dynamic(256, 3, 2, 1));
  for (size_t i = 0; i < 7; ++i) {
    whole.Update(overflow[i]);
    first.Update(overflow[i]);
  }
  LossScaler resumed(Dynamic(256, 3, 2, 1));
  ASSERT_TRUE(resumed.SetState(first.state()).ok());
  for (size_t i = 7; i < overflow.size(); ++i) {
    whole.Update(overflow[i]);
    resumed.Update(overflow[i]);
  }
  EXPECT_EQ(resumed.scale(), whole.scale());
  EXPECT_EQ(resumed.skipped_steps(), whole.skipped_steps());
  EXPECT_EQ(resumed.state().clean_steps, whole.state().clean_steps);
  EXPECT_EQ(resumed.state().hysteresis_left, whole.state().hysteresis_left);
}

TEST(LossScalerTest, MetadataRoundTrip) {
  LossScaler a(Dynamic(256, 3, 2, 1));
  a.Update(true);
  a.Update(false);
  std::map<std::string, std::string> md;
  a.SaveTo(&md);
  LossScaler b(Dynamic(256, 3, 2, 1));
  ASSERT_TRUE(b.RestoreFrom(md).ok());
  EXPECT_EQ(b.scale(), a.scale());
  EXPECT_EQ(b.state().clean_steps, 1);
  EXPECT_EQ(b.state().hysteresis_left, 1);
  EXPECT_EQ(b.skipped_steps(), 1);
  // No scaler in the metadata (written without fp16): left as it is.
  LossScaler c(Dynamic(64, 3, 2, 1));
  ASSERT_TRUE(c.RestoreFrom({{"step", "3"}}).ok());
  EXPECT_EQ(c.scale(), 64);
  md["loss_scale_clean_steps"] = "x";
  EXPECT_EQ(c.RestoreFrom(md).code(), absl::StatusCode::kDataLoss);
}

TEST(LossScalerTest, RefusesStatesItCannotReach) {
  LossScaler s(Dynamic(256, 3, 2, 4));
  LossScalerState bad;
  bad.scale = 2;  // below min_scale 4
  bad.hysteresis_left = 1;
  absl::Status st = s.SetState(bad);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("min_loss_scale"), std::string::npos) << st;
  bad.scale = 8;
  bad.hysteresis_left = 3;  // more than the configured 2
  EXPECT_FALSE(s.SetState(bad).ok());
  bad.hysteresis_left = 0;  // the counter never goes below 1 (it stays there while halving)
  EXPECT_FALSE(s.SetState(bad).ok());
  bad.hysteresis_left = 2;
  EXPECT_TRUE(s.SetState(bad).ok());
  EXPECT_EQ(s.scale(), 8);
}

}  // namespace
}  // namespace braid
