// The loss-scaler state machine, step by step, against the rule written out in loss_scaler.h.
#include "core/loss_scaler.h"

#include <cmath>
#include <map>
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

TEST(LossScalerTest, HysteresisThenHalving) {
  LossScaler s(Dynamic(1024, 1000, 2, 1));
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_FALSE(s.Update(true));  // first overflow: one unit of hysteresis spent, scale kept
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_EQ(s.state().hysteresis_left, 1);
  EXPECT_FALSE(s.Update(true));  // second: halves, hysteresis restored
  EXPECT_EQ(s.scale(), 512);
  EXPECT_EQ(s.state().hysteresis_left, 2);
  EXPECT_EQ(s.skipped_steps(), 2);
  EXPECT_TRUE(s.Update(false));
  EXPECT_EQ(s.scale(), 512);
  // A clean step does not restore hysteresis (DeepSpeed's rule: only growth does).
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
  bad.hysteresis_left = 2;
  EXPECT_TRUE(s.SetState(bad).ok());
  EXPECT_EQ(s.scale(), 8);
}

}  // namespace
}  // namespace braid
