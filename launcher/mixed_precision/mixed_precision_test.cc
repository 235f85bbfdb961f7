// The mixed-precision optimizer wrapper on exactly representable values: unscaling, skipping on
// inf/NaN (found here or on another rank), the loss scaler's decisions, clipping folded into the
// unscale, f32 masters rounded into the half parameters, learning-rate hand-through, state.
#include "launcher/mixed_precision/mixed_precision.h"

#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "core/deferred_init.h"
#include "core/module.h"
#include "core/optimizer.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace braid {
namespace {

// A half parameter with `values` (exact in f16 and bf16) and a name.
Tensor HalfParam(const std::vector<float>& values, DType dtype, const std::string& name) {
  Tensor p = Tensor::FromVector(values, {int64_t(values.size())}).To(dtype);
  p.set_requires_grad(true);
  p.set_name(name);
  return p;
}

void SetGrad(Tensor& p, const std::vector<float>& g) {
  p.set_grad(Tensor::FromVector(g, {int64_t(g.size())}).To(p.dtype()));
}

// SGD (lr, no momentum, no weight decay) behind the wrapper, over `params`.
std::unique_ptr<Optimizer> MakeMp(const std::vector<Tensor>& params, float lr, MixedPrecision* mp) {
  OptimizerFactory sgd = [lr](const std::vector<std::pair<std::string, Tensor>>& named) {
    ParamGroup g;
    g.lr = lr;
    for (auto& [n, t] : named) g.params.push_back(t);
    return MakeSgd({g});
  };
  std::vector<std::pair<std::string, Tensor>> named;
  for (const Tensor& p : params) named.emplace_back(p.name(), p);
  return MixedPrecisionOptimizerFactory(sgd, mp)(named);
}

LossScalerOptions Static(float scale) {
  LossScalerOptions o;
  o.dynamic = false;
  o.initial_scale = scale;
  return o;
}

TEST(MixedPrecisionTest, UnscalesStepsMastersAndRoundsIntoParameters) {
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    MixedPrecision mp;
    mp.dtype = dtype;
    mp.scaler = LossScaler(Static(64));
    Tensor p = HalfParam({1.0f, -2.0f, 0.5f}, dtype, "w");
    auto opt = MakeMp({p}, 0.25f, &mp);
    EXPECT_EQ(opt->gradient_scale(), 64.0f);
    SetGrad(p, {64.0f, -128.0f, 32.0f});  // unscaled: 1, -2, 0.5
    opt->Step();
    EXPECT_FALSE(mp.last_step_skipped);
    // master = w - 0.25 * g: 0.75, -1.5, 0.375 (exact in both formats)
    EXPECT_EQ(p.dtype(), dtype);
    EXPECT_EQ(p.ToFloatVector(), (std::vector<float>{0.75f, -1.5f, 0.375f})) << DTypeName(dtype);
    auto state = opt->StateDict();
    ASSERT_TRUE(state.count("w.master")) << "the f32 masters are part of the optimizer state";
    EXPECT_EQ(state["w.master"].dtype(), DType::kF32);
    EXPECT_EQ(state["w.master"].ToFloatVector(), (std::vector<float>{0.75f, -1.5f, 0.375f}));
  }
}

// The master keeps what the half parameter cannot: many small steps add up in f32 and reach the
// parameter, where stepping bf16 weights directly would round each one away.
TEST(MixedPrecisionTest, MasterAccumulatesUpdatesBelowHalfResolution) {
  MixedPrecision mp;
  mp.dtype = DType::kBF16;
  Tensor p = HalfParam({1.0f}, DType::kBF16, "w");
  auto opt = MakeMp({p}, 1.0f, &mp);
  // bf16 spacing at 1 is 2^-7 below 1 is 2^-8; each step moves by 2^-10 (a quarter of it).
  for (int i = 0; i < 8; ++i) {
    SetGrad(p, {std::ldexp(1.0f, -10)});
    opt->Step();
  }
  EXPECT_EQ(opt->StateDict()["w.master"].ToFloatVector()[0], 1.0f - 8 * std::ldexp(1.0f, -10));
  EXPECT_EQ(p.ToFloatVector()[0], 1.0f - std::ldexp(1.0f, -7));  // 0.9921875, exact in bf16
}

TEST(MixedPrecisionTest, OverflowSkipsTheStepAndBacksOffTheScale) {
  MixedPrecision mp;
  mp.dtype = DType::kF16;
  LossScalerOptions o;
  o.initial_scale = 1024;
  o.hysteresis = 1;
  mp.scaler = LossScaler(o);
  Tensor p = HalfParam({1.0f, 2.0f}, DType::kF16, "w");
  Tensor q = HalfParam({3.0f}, DType::kF16, "q");
  auto opt = MakeMp({p, q}, 0.5f, &mp);
  for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    SetGrad(p, {1024.0f, 1024.0f});
    SetGrad(q, {bad});
    const float scale_before = mp.scaler.scale();
    opt->Step();
    EXPECT_TRUE(mp.last_step_skipped);
    EXPECT_EQ(mp.last_step_scale, scale_before);
    EXPECT_EQ(mp.scaler.scale(), scale_before / 2);
    EXPECT_EQ(p.ToFloatVector(), (std::vector<float>{1.0f, 2.0f})) << "a skipped step changes nothing";
    EXPECT_EQ(q.ToFloatVector(), (std::vector<float>{3.0f}));
    EXPECT_EQ(opt->steps_taken(), 0);
  }
  EXPECT_EQ(mp.scaler.skipped_steps(), 2);
  // A clean step at the new scale (256) applies: w - 0.5 * 256/256.
  SetGrad(p, {256.0f, 512.0f});
  SetGrad(q, {0.0f});
  opt->Step();
  EXPECT_FALSE(mp.last_step_skipped);
  EXPECT_EQ(p.ToFloatVector(), (std::vector<float>{0.5f, 1.0f}));
  EXPECT_EQ(opt->steps_taken(), 1);
}

// Every rank skips when any rank overflowed: the wrapper hands sum_over_ranks its own check
// value and follows the sum (over Gloo in tests/distributed/mixed_precision_overflow_test.cc).
TEST(MixedPrecisionTest, FollowsTheRanksAgreement) {
  MixedPrecision mp;
  mp.dtype = DType::kBF16;
  std::vector<bool> finite;
  float other_rank = std::numeric_limits<float>::infinity();
  mp.sum_over_ranks = [&](Tensor& check) {
    ASSERT_EQ(check.numel(), 1);
    finite.push_back(std::isfinite(check.item()));
    check.CopyFrom(Tensor::Full({}, check.item() + other_rank));  // in place, as an all-reduce
  };
  Tensor p = HalfParam({1.0f}, DType::kBF16, "w");
  auto opt = MakeMp({p}, 0.5f, &mp);
  SetGrad(p, {1.0f});
  opt->Step();  // clean here, but another rank overflowed
  EXPECT_TRUE(mp.last_step_skipped);
  EXPECT_EQ(p.ToFloatVector()[0], 1.0f);
  other_rank = 0.0f;
  SetGrad(p, {1.0f});
  opt->Step();
  EXPECT_FALSE(mp.last_step_skipped);
  EXPECT_EQ(p.ToFloatVector()[0], 0.5f);
  SetGrad(p, {std::numeric_limits<float>::infinity()});
  opt->Step();  // overflowed here, the others clean
  EXPECT_TRUE(mp.last_step_skipped);
  EXPECT_EQ(finite, (std::vector<bool>{true, true, false}));
}

TEST(MixedPrecisionTest, ClippingSeesUnscaledNormAndFoldsIntoTheUnscale) {
  MixedPrecision mp;
  mp.dtype = DType::kF16;
  mp.scaler = LossScaler(Static(128));
  Tensor p = HalfParam({0.0f, 0.0f}, DType::kF16, "w");
  auto opt = MakeMp({p}, 1.0f, &mp);
  SetGrad(p, {3.0f * 128, 4.0f * 128});  // unscaled gradient (3, 4): norm 5
  const float norm = ClipGradNormSharded(*opt, {p}, 1.0f, [](double local) { return local; });
  EXPECT_FLOAT_EQ(norm, 5.0f);
  // The half gradient itself is left alone (no second rounding)...
  EXPECT_EQ(p.grad().ToFloatVector(), (std::vector<float>{384.0f, 512.0f}));
  opt->Step();
  // ...and the step uses (3, 4) * 1 / (5 + 1e-6).
  std::vector<float> w = p.ToFloatVector();
  EXPECT_NEAR(w[0], -0.6f, 1e-3f);  // f16 spacing near 0.6 is 2^-11 ~ 4.9e-4
  EXPECT_NEAR(w[1], -0.8f, 1e-3f);
  // Measuring only (max_norm 0) never clips.
  SetGrad(p, {3.0f * 128, 4.0f * 128});
  EXPECT_FLOAT_EQ(ClipGradNormSharded(*opt, {p}, 0.0f, [](double l) { return l; }), 5.0f);
}

TEST(MixedPrecisionTest, LearningRateReachesTheInnerOptimizer) {
  MixedPrecision mp;
  Tensor p = HalfParam({1.0f}, DType::kBF16, "w");
  auto opt = MakeMp({p}, 0.5f, &mp);
  opt->SetLearningRate(0.25f);
  SetGrad(p, {1.0f});
  opt->Step();
  EXPECT_EQ(p.ToFloatVector()[0], 0.75f);
}

TEST(MixedPrecisionTest, StateRoundTripAndRefusalWithoutMasters) {
  MixedPrecision mp;
  Tensor p = HalfParam({1.0f, 2.0f}, DType::kBF16, "w");
  auto opt = MakeMp({p}, 0.5f, &mp);
  SetGrad(p, {1.0f, 1.0f});
  opt->Step();
  auto state = opt->StateDict();
  MixedPrecision mp2;
  Tensor p2 = HalfParam({9.0f, 9.0f}, DType::kBF16, "w");
  auto opt2 = MakeMp({p2}, 0.5f, &mp2);
  ASSERT_TRUE(opt2->LoadStateDict(state).ok());
  EXPECT_EQ(p2.ToFloatVector(), (std::vector<float>{0.5f, 1.5f})) << "parameters follow the masters";
  EXPECT_EQ(opt2->steps_taken(), 1);
  state.erase("w.master");
  absl::Status st = opt2->LoadStateDict(state);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("w.master"), std::string::npos) << st;
  // Per-parameter state for sharded checkpoints carries the master too.
  auto per_param = opt2->ParameterStates(/*create=*/true);
  ASSERT_EQ(per_param.size(), 1u);
  ASSERT_TRUE(per_param[0].count("master"));
  EXPECT_EQ(per_param[0]["master"].dtype(), DType::kF32);
}

TEST(MixedPrecisionTest, ReloadMasterWeightsTakesOverwrittenParameters) {
  MixedPrecision mp;
  Tensor p = HalfParam({1.0f}, DType::kBF16, "w");
  auto opt = MakeMp({p}, 1.0f, &mp);
  p.CopyFrom(Tensor::FromVector<float>({4.0f}, {1}));  // --init_from after Setup
  ReloadMasterWeights(*opt);
  SetGrad(p, {1.0f});
  opt->Step();
  EXPECT_EQ(p.ToFloatVector()[0], 3.0f);
}

class TwoParams : public Module {
 public:
  TwoParams() : Module("TwoParams") {
    w = RegisterParameter("w", Tensor::FromVector<float>({1.0f, 1.00390625f}, {2}));
    b = RegisterBuffer("b", Tensor::FromVector<float>({0.1f}, {1}));
  }
  Tensor Forward(const Tensor& x) override { return x; }
  Tensor w, b;
};

TEST(MixedPrecisionTest, CastParametersKeepsIdentityAndLeavesBuffers) {
  TwoParams m;
  Tensor handle = m.w;  // a module's handle
  CastParameters(m, DType::kBF16);
  EXPECT_EQ(handle.dtype(), DType::kBF16);
  EXPECT_TRUE(handle.SameAs(m.NamedParameters()[0].second));
  EXPECT_TRUE(handle.requires_grad());
  // 1 + 2^-8 is a tie between 1 and 1 + 2^-7 in bf16: to even, 1.
  EXPECT_EQ(handle.ToFloatVector(), (std::vector<float>{1.0f, 1.0f}));
  EXPECT_EQ(m.b.dtype(), DType::kF32);
}

TEST(MixedPrecisionTest, DeferredParameterChangesDtypeAndInitialisesInIt) {
  Tensor p;
  {
    DeferredInitScope deferred;
    p = MakeConstantParameter({3}, 0.3f, Device::CPU());
  }
  ASSERT_TRUE(IsDeferred(p));
  p.ConvertTo(DType::kF16);
  EXPECT_EQ(p.dtype(), DType::kF16);
  EXPECT_EQ(p.storage()->bytes(), 6u);
  Materialize(p);
  EXPECT_EQ(p.ToFloatVector()[0], F16ToFloat(FloatToF16(0.3f)));
}

TEST(MixedPrecisionTest, CastInputsConvertsFloatingInputsOnly) {
  Batch b{Tensor::FromVector<float>({0.5f}, {1}), Tensor::FromVector<int32_t>({3}, {1})};
  Batch c = CastInputs(b, DType::kBF16);
  EXPECT_EQ(c.inputs.dtype(), DType::kBF16);
  EXPECT_EQ(c.targets.dtype(), DType::kI32);
  Batch ids{Tensor::FromVector<int32_t>({1, 2}, {2}), Tensor::FromVector<int32_t>({3, 4}, {2})};
  EXPECT_EQ(CastInputs(ids, DType::kF16).inputs.dtype(), DType::kI32);
}

}  // namespace
}  // namespace braid
