// The optimizer and schedule the trainer gets from a validated config: each scheduler.type with
// its params reaches the right formula, a resumed run gets the same rates as an uninterrupted
// one, and DeepSpeed's Adam modes reach the optimizer.
#include "launcher/optimization.h"

#include <string>
#include <utility>
#include <vector>

#include "launcher/config/config.h"
#include "launcher/config/config_test_util.h"
#include "core/testing/reference_kernels.h"
#include "gtest/gtest.h"

namespace braid::launcher {
namespace {

config::TrainConfig Validated(const std::string& text) {
  config::TrainConfig cfg = config::test_util::Text(text);
  absl::Status st = config::ValidateConfig(&cfg, 1, {});
  EXPECT_TRUE(st.ok()) << st;
  return cfg;
}

// Each type's params reach its formula (values worked by hand, as in core/lr_schedule_test.cc).
TEST(MakeSchedule, EachTypeWithItsParams) {
  auto s = MakeSchedule(Validated(R"pb(steps: 110 optimizer { params { lr: 1e-3 } }
      scheduler { type: "WarmupDecayLR"
                  params { warmup_num_steps: 10 warmup_type: "linear" warmup_min_lr: 0 } })pb"));
  EXPECT_FLOAT_EQ(s->At(5), 5e-4f);
  EXPECT_FLOAT_EQ(s->At(60), 5e-4f);  // (110 - 60) / (110 - 10): total_num_steps is steps
  EXPECT_EQ(s->At(110), 0.0f);

  s = MakeSchedule(Validated(R"pb(optimizer { params { lr: 1e-3 } }
      scheduler { type: "WarmupLR" params { warmup_num_steps: 100 warmup_min_lr: 1e-4 } })pb"));
  EXPECT_FLOAT_EQ(s->At(9), float(1e-4 + 9e-4 * 0.5));  // log warm-up by default

  s = MakeSchedule(Validated(R"pb(optimizer { params { lr: 1e-3 } }
      scheduler { type: "WarmupCosineLR"
                  params { total_num_steps: 110 warmup_num_steps: 10 warmup_min_ratio: 0.1
                           cos_min_ratio: 0.01 warmup_type: "linear" } })pb"));
  EXPECT_FLOAT_EQ(s->At(5), float(1e-3 * (0.1 + 0.9 * 0.5)));
  EXPECT_FLOAT_EQ(s->At(59), float(1e-3 * (0.01 + 0.99 * 0.5)));

  s = MakeSchedule(Validated(R"pb(scheduler { type: "OneCycle"
      params { cycle_min_lr: 1e-4 cycle_max_lr: 1e-3 cycle_first_step_size: 10
               cycle_second_step_size: 30 decay_step_size: 10 decay_lr_rate: 0.5
               cycle_momentum: false } })pb"));
  EXPECT_FLOAT_EQ(s->At(9), 1e-3f);
  EXPECT_FLOAT_EQ(s->At(59), 5e-5f);

  s = MakeSchedule(Validated(R"pb(scheduler { type: "LRRangeTest"
      params { lr_range_test_min_lr: 1e-3 lr_range_test_step_size: 10
               lr_range_test_step_rate: 0.5 lr_range_test_staircase: true } })pb"));
  EXPECT_FLOAT_EQ(s->At(8), 1e-3f);
  EXPECT_FLOAT_EQ(s->At(19), 2e-3f);

  s = MakeSchedule(Validated("scheduler { type: \"WarmupCosine\" params { warmup_num_steps: 10 } } "
                             "optimizer { params { lr: 2e-3 } }"));
  EXPECT_FLOAT_EQ(s->At(5), 1e-3f);
  EXPECT_FLOAT_EQ(MakeSchedule(Validated("optimizer { params { lr: 3e-4 } }"))->At(7), 3e-4f);
}

// A resumed run is a new process: it reads the same config, validates it and builds the schedule
// again, then asks for the rates from the checkpoint's step on (plugins/checkpoint stores the
// step; the trainer calls At(step)). Its rates must be the uninterrupted run's, bit for bit, for
// every type, whatever the optimizer's rate was when the checkpoint was written.
TEST(MakeSchedule, AResumedRunGetsTheUninterruptedRates) {
  const char* configs[] = {
      "steps: 300 scheduler { type: \"WarmupLR\" params { warmup_num_steps: 50 } }",
      "steps: 300 scheduler { type: \"WarmupDecayLR\" params { warmup_num_steps: 50 } }",
      "steps: 300 scheduler { type: \"WarmupCosineLR\" params { warmup_num_steps: 50 } }",
      "steps: 300 scheduler { type: \"WarmupCosine\" params { warmup_num_steps: 50 } }",
      "steps: 300 scheduler { type: \"OneCycle\" params { cycle_min_lr: 1e-4 cycle_max_lr: 1e-3 "
      "cycle_first_step_size: 40 decay_step_size: 5 decay_lr_rate: 0.1 cycle_momentum: false } }",
      "steps: 300 scheduler { type: \"LRRangeTest\" params { lr_range_test_step_size: 7 } }",
  };
  for (const char* text : configs) {
    auto uninterrupted = MakeSchedule(Validated(text));
    std::vector<float> rates;
    for (int64_t step = 0; step < 300; ++step) rates.push_back(uninterrupted->At(step));
    for (int64_t resume_at : {1, 49, 50, 51, 137, 299}) {
      auto resumed = MakeSchedule(Validated(text));
      for (int64_t step = resume_at; step < 300; ++step) {
        ASSERT_EQ(resumed->At(step), rates[size_t(step)])
            << text << ": resumed at " << resume_at << ", step " << step;
      }
    }
    // Not all one number (so that the comparison above could fail).
    EXPECT_NE(rates[10], rates[200]) << text;
  }
}

// OneCycle's momentum reaches the optimizer as DeepSpeed sets it: (beta1 on the cycle, 0.99),
// for optimizers with betas only; a config that turns it off, or SGD, leaves the betas alone.
TEST(MakeBetasSchedule, OneCycleMomentumForAdamOnly) {
  const std::string cycle =
      "steps: 100 scheduler { type: \"OneCycle\" params { cycle_min_lr: 1e-4 cycle_max_lr: 1e-3 "
      "cycle_first_step_size: 10 cycle_second_step_size: 30 ";
  BetasSchedule betas = MakeBetasSchedule(Validated(cycle + "} }"));  // DeepSpeed's defaults
  ASSERT_TRUE(betas != nullptr);
  EXPECT_EQ(betas(0), std::make_pair(float(0.9 - 0.1 * 0.1), 0.99f));
  EXPECT_EQ(betas(9), std::make_pair(0.8f, 0.99f));
  EXPECT_EQ(betas(60), std::make_pair(0.9f, 0.99f));  // no decay_step_size: cycle_max_mom
  betas = MakeBetasSchedule(Validated(cycle + "cycle_min_mom: 0.5 cycle_max_mom: 0.7 } }"));
  EXPECT_EQ(betas(9), std::make_pair(0.5f, 0.99f));
  EXPECT_EQ(MakeBetasSchedule(Validated(cycle + "cycle_momentum: false } }")), nullptr);
  EXPECT_EQ(MakeBetasSchedule(Validated(
                cycle + "} } optimizer { type: \"SGD\" params { lr: 0.1 momentum: 0.9 } }")),
            nullptr);
  EXPECT_EQ(MakeBetasSchedule(Validated("steps: 10")), nullptr);
}

Tensor Param(float v, bool decay) {
  Tensor t = Tensor::FromVector(std::vector<float>{v}, {1});
  t.set_requires_grad(true);
  t.set_weight_decay(decay);
  return t;
}

// One Adam step from zero moments moves each weight by lr × sign(its update direction); with
// w = 1, g = -0.1 and weight_decay 0.5 the two modes move it opposite ways: L2 steps along
// g + 0.5 w = 0.4 (down), decoupled decay shrinks w by lr × 0.5 and steps along g (up).
TEST(MakeOptimizerFactory, AdamModesReachTheOptimizer) {
  reference::RegisterReferenceKernels();
  for (bool w_mode : {true, false}) {
    config::TrainConfig cfg = Validated(absl::StrCat(
        "optimizer { type: \"Adam\" params { lr: 0.01 weight_decay: 0.5 adam_w_mode: ",
        w_mode ? "true" : "false", " } }"));
    Tensor w = Param(1.0f, true), bias = Param(1.0f, false);
    std::vector<std::pair<std::string, Tensor>> named = {{"w", w}, {"bias", bias}};
    std::unique_ptr<Optimizer> opt = MakeOptimizerFactory(cfg)(named);
    EXPECT_EQ(opt->name(), "Adam");
    for (Tensor* t : {&w, &bias}) t->set_grad(Tensor::FromVector(std::vector<float>{-0.1f}, {1}));
    opt->Step();
    const double want_w = w_mode ? 1.0 - 0.01 * 0.5 * 1.0 + 0.01 : 1.0 - 0.01;
    EXPECT_NEAR(w.item(), want_w, 1e-6) << "adam_w_mode " << w_mode;
    EXPECT_NEAR(bias.item(), 1.0 + 0.01, 1e-6) << "no decay on the bias";
  }
}

}  // namespace
}  // namespace braid::launcher
