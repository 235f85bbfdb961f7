// Loads libbraid_dp.so the way the trainer does and checks what the single-process data-parallel
// strategy costs and refuses: the first device's peak memory in each loss mode, and the errors a
// user can meet. Split from dp_test.cc (results against one device); helpers in test_util.h.
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "backends/in_process/in_process_communicator.h"
#include "core/allocator.h"
#include "core/check.h"
#include "core/ops.h"
#include "core/plugin.h"
#include "core/registry.h"
#include "core/strategy.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/gpt/gpt.h"
#include "models/mlp/mlp.h"
#include "plugins/dp/test_util.h"

namespace braid::dp_test {
namespace {

using ::testing::HasSubstr;

// ---- First-device memory --------------------------------------------------------------------

struct Peak {
  int64_t base = 0;  // held on cpu:0 when the measured step starts
  int64_t peak = 0;  // cpu:0's peak during the step
};

// Trains a model with large outputs one warm-up step (AdamW allocates its state there), then
// measures cpu:0 over one more step. Everything is freed before returning, so the calls do not
// see each other's tensors.
Peak MeasureFirstDevice(Kind kind, const std::string& mode, int devices, int64_t rows,
                        const ModuleFactory& make) {
  std::unique_ptr<Strategy> dp = *Registry::Get().MakeStrategy("dp");
  std::unique_ptr<Module> model = make(Device::CPU(0));
  StrategyContext ctx;
  ctx.options["devices"] = "cpu:0,cpu:1" + std::string(devices == 3 ? ",cpu:2" : "");
  ctx.options["loss_mode"] = mode;
  ctx.make_replica = make;
  BRAID_CHECK(dp->Setup(*model, AdamW, ctx).ok());
  Batch batch;
  if (kind == Kind::kGpt) {
    batch = MakeBatch(Kind::kGpt, 0, rows);
  } else {
    std::vector<float> x(static_cast<size_t>(rows * 64));
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * float(i));
    std::vector<int32_t> y(static_cast<size_t>(rows));
    for (size_t i = 0; i < y.size(); ++i) y[i] = int32_t(i * 131 % 8192);
    batch = Batch{Tensor::FromVector(x, {rows, 64}), Tensor::FromVector(y, {rows})};
  }
  BRAID_CHECK(dp->TrainStep({batch}, CrossEntropyLoss).ok());
  GetAllocator(Device::CPU(0))->ResetPeak();
  Peak p;
  p.base = GetMemoryStats(Device::CPU(0)).current_bytes;
  BRAID_CHECK(dp->TrainStep({batch}, CrossEntropyLoss).ok());
  p.peak = GetMemoryStats(Device::CPU(0)).peak_bytes;
  return p;
}

TEST_F(DpTest, BalancedModeKeepsTheFirstDevicePeakBelowGatherMode) {
  // An MLP with a wide output layer (64 -> 64 -> 8192 logits) and a tiny GPT: their outputs
  // (logits) dominate the activations.
  ModuleFactory wide = [](Device d) {
    models::MlpConfig c;
    c.in = 64;
    c.hidden = 64;
    c.out = 8192;
    return std::unique_ptr<Module>(std::make_unique<models::Mlp>(c, d));
  };
  ModuleFactory gpt = [](Device d) {
    return std::unique_ptr<Module>(std::make_unique<models::Gpt>(TinyGpt(1), d));
  };
  struct Setting {
    const char* model;
    Kind kind;
    ModuleFactory* make;
    int64_t rows;
    int64_t output_bytes;  // of the whole micro-batch's logits
  };
  const Setting settings[] = {
      Setting{"mlp 64-64-8192", Kind::kMlp, &wide, 96, 96 * 8192 * 4},
      Setting{"gpt 2x64, vocab 256", Kind::kGpt, &gpt, 12, 12 * 16 * 256 * 4}};
  for (const Setting& s : settings) {
    for (int devices : {2, 3}) {
      Peak gather = MeasureFirstDevice(s.kind, "gather", devices, s.rows, *s.make);
      Peak balanced = MeasureFirstDevice(s.kind, "balanced", devices, s.rows, *s.make);
      std::printf(
          "[dp peak cpu:0] %s, batch %lld, %d devices: gather %lld bytes (%lld held before the "
          "step), balanced %lld bytes (%lld held before), ratio %.2f\n",
          s.model, static_cast<long long>(s.rows), devices, static_cast<long long>(gather.peak),
          static_cast<long long>(gather.base), static_cast<long long>(balanced.peak),
          static_cast<long long>(balanced.base), double(gather.peak) / double(balanced.peak));
      EXPECT_EQ(gather.base, balanced.base) << s.model;
      EXPECT_LT(balanced.peak, gather.peak) << s.model << ", " << devices << " devices";
      // Gather mode holds, beyond balanced mode, at least the other devices' outputs.
      EXPECT_GE(gather.peak - balanced.peak, s.output_bytes * (devices - 1) / devices)
          << s.model << ", " << devices << " devices";
    }
  }
}

// ---- Errors ---------------------------------------------------------------------------------

TEST_F(DpTest, ReportsMisuse) {
  EXPECT_TRUE(LoadPlugin(plugin_, {}).ok());  // loading again is a no-op
  EXPECT_TRUE(EnsureStrategy("dp", {}).ok());
  Made made;
  auto setup_error = [&](StrategyContext ctx) {
    std::unique_ptr<Module> model = MakeModel(Kind::kMlp, Device::CPU(0), 1);
    return std::string(MakeDp()->Setup(*model, AdamW, ctx).message());
  };

  EXPECT_EQ(MakeDp()->TrainStep({MakeBatch(Kind::kMlp, 0, 2)}, CrossEntropyLoss).status().code(),
            absl::StatusCode::kFailedPrecondition);

  StrategyContext ctx = Context(2, "balanced", Factory(Kind::kMlp, &made));
  ctx.options["bucket_cap_mb"] = "25";
  EXPECT_THAT(setup_error(ctx), HasSubstr("bucket_cap_mb"));

  ctx = Context(2, "balanced", Factory(Kind::kMlp, &made));
  ctx.options["devices"] = "cpu:0,gpu:1";
  EXPECT_THAT(setup_error(ctx), HasSubstr("'gpu:1'"));
  ctx.options["devices"] = "cpu:0, cpu:1,cpu:0";
  EXPECT_THAT(setup_error(ctx), HasSubstr("cpu:0 twice"));

  EXPECT_THAT(setup_error(Context(2, "scatter", Factory(Kind::kMlp, &made))),
              HasSubstr("loss_mode 'scatter'"));
  EXPECT_THAT(setup_error(Context(2, "gather", nullptr)), HasSubstr("make_replica"));
  StrategyContext defaults;  // two devices by default, so a factory is needed
  EXPECT_THAT(setup_error(defaults), HasSubstr("cpu:0,cpu:1"));

  // A factory that builds another architecture.
  ModuleFactory wider = [](Device d) {
    models::MlpConfig c = SmallMlp(1);
    c.hidden = 17;
    return std::unique_ptr<Module>(std::make_unique<models::Mlp>(c, d));
  };
  std::string mismatch = setup_error(Context(2, "balanced", wider));
  EXPECT_THAT(mismatch, HasSubstr("fc1.weight"));
  EXPECT_THAT(mismatch, HasSubstr("cpu:1"));
  ModuleFactory null_factory = [](Device) { return std::unique_ptr<Module>(); };
  EXPECT_THAT(setup_error(Context(2, "balanced", null_factory)), HasSubstr("null"));

  std::vector<std::unique_ptr<Communicator>> two = MakeInProcessGroup(2);
  ctx = Context(2, "balanced", Factory(Kind::kMlp, &made));
  ctx.comm = two[0].get();
  EXPECT_THAT(setup_error(ctx), HasSubstr("2 ranks"));

  // Step-time errors, in both modes.
  for (const char* mode : {"balanced", "gather"}) {
    std::unique_ptr<Strategy> dp = MakeDp();
    std::unique_ptr<Module> model = MakeModel(Kind::kMlp, Device::CPU(0), 1);
    ASSERT_TRUE(dp->Setup(*model, AdamW, Context(2, mode, Factory(Kind::kMlp, &made))).ok());
    EXPECT_EQ(dp->TrainStep({}, CrossEntropyLoss).status().code(),
              absl::StatusCode::kInvalidArgument);
    Batch uneven = MakeBatch(Kind::kMlp, 0, 4);
    uneven.targets = uneven.targets.Slice(0, 3);
    EXPECT_THAT(std::string(dp->TrainStep({uneven}, CrossEntropyLoss).status().message()),
                HasSubstr("same number of rows"));
    auto constant = [](Module& m, const Batch& b) {
      m(b.inputs);
      return Tensor::Scalar(1.0f);
    };
    EXPECT_THAT(
        std::string(dp->TrainStep({MakeBatch(Kind::kMlp, 0, 4)}, constant).status().message()),
        HasSubstr("depends on no trainable parameter"));
    // Failed steps leave the model as it was.
    ExpectIdentical(*model, *MakeModel(Kind::kMlp, Device::CPU(0), 1), mode);
  }

  // A loss that is not criterion(model(inputs), targets) cannot run in gather mode, but can in
  // balanced mode.
  auto twice = [](Module& m, const Batch& b) {
    return ops::Add(CrossEntropyLoss(m, b), ops::Scale(CrossEntropyLoss(m, b), 0.5f));
  };
  for (const char* mode : {"gather", "balanced"}) {
    std::unique_ptr<Strategy> dp = MakeDp();
    std::unique_ptr<Module> model = MakeModel(Kind::kMlp, Device::CPU(0), 1);
    ASSERT_TRUE(dp->Setup(*model, AdamW, Context(2, mode, Factory(Kind::kMlp, &made))).ok());
    absl::StatusOr<StepStats> st = dp->TrainStep({MakeBatch(Kind::kMlp, 0, 4)}, twice);
    if (std::string(mode) == "gather") {
      EXPECT_THAT(std::string(st.status().message()), HasSubstr("called the model 2 time(s)"));
      EXPECT_THAT(std::string(st.status().message()), HasSubstr("loss_mode=balanced"));
    } else {
      EXPECT_TRUE(st.ok()) << st.status();
    }
  }
}

}  // namespace
}  // namespace braid::dp_test
