// How many times a training step makes the host wait for a CUDA device: at most once (issue 28).
//
// The step runs for real on "cuda:0" with the fake device (backends/cuda/fake_device_api.h)
// behind the CUDA backend's runtime: its caching allocator, its copies (device-to-device dtype
// conversion included), and the kernel table's CUDA slots filled with the CPU backend's f32
// kernels plus the half fallbacks (tests/device_sync/fake_cuda.h). The fake records every
// synchronisation (Synchronize*, cudaFree, a device-to-host copy the host waits for, item());
// the test counts them per TrainStep of the "single" strategy, the one-GPU path, in f32, bf16
// and f16 with dynamic loss scaling (an overflowing step included), with clipping and gradient
// accumulation. What the one read holds: the loss, the gradient norm and mixed precision's
// inf/NaN flag (core/micro_batches.h).
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_join.h"
#include "backends/cuda/fake_device_api.h"
#include "launcher/mixed_precision/mixed_precision.h"
#include "core/ops.h"
#include "core/optimizer.h"
#include "core/plugin.h"
#include "core/registry.h"
#include "core/strategy.h"
#include "gtest/gtest.h"
#include "tests/device_sync/fake_cuda.h"
#include "third_party/runfiles.h"

namespace braid {
namespace {

using ::bazel::tools::cpp::runfiles::Runfiles;

constexpr int64_t kVocab = 16, kWidth = 8, kRows = 6;

using testing::InstallFakeCuda;

cuda::FakeDeviceApi& Fake() { return testing::Fake(0); }

// Embedding -> LayerNorm -> Linear -> GELU -> Linear -> logits: a GPT's step without attention.
class TinyLm : public Module {
 public:
  TinyLm() : Module("TinyLm") {
    auto wave = [](int64_t n, float scale, int salt) {
      std::vector<float> v(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) v[size_t(i)] = scale * std::sin(0.37f * float(i + salt));
      return v;
    };
    wte_ = RegisterParameter("wte", Tensor::FromVector(wave(kVocab * kWidth, 0.5f, 1), {kVocab, kWidth}));
    ln_w_ = RegisterParameter("ln.weight", Tensor::Full({kWidth}, 1.0f));
    ln_b_ = RegisterParameter("ln.bias", Tensor::Full({kWidth}, 0.0f));
    fc_w_ = RegisterParameter("fc.weight", Tensor::FromVector(wave(kWidth * kWidth, 0.4f, 2), {kWidth, kWidth}));
    fc_b_ = RegisterParameter("fc.bias", Tensor::Full({kWidth}, 0.01f));
    head_ = RegisterParameter("head.weight", Tensor::FromVector(wave(kVocab * kWidth, 0.4f, 3), {kVocab, kWidth}));
    head_b_ = RegisterParameter("head.bias", Tensor::Full({kVocab}, 0.0f));
  }
  Tensor Forward(const Tensor& ids) override {
    Tensor x = ops::LayerNorm(ops::Embedding(wte_, ids), ln_w_, ln_b_);
    x = ops::GeluTanh(ops::Linear(x, fc_w_, fc_b_));
    return ops::Linear(x, head_, head_b_);
  }

 private:
  Tensor wte_, ln_w_, ln_b_, fc_w_, fc_b_, head_, head_b_;
};

// Micro-batch i of step s, on `device` (the prefetcher's job: made before the step). One target
// is -1 (ignored by the loss), so the count of targets runs on the device too.
Batch MakeBatch(int s, int i, Device device) {
  std::vector<int32_t> ids, targets;
  for (int r = 0; r < kRows; ++r) {
    ids.push_back(int32_t((s * 7 + i * 5 + r * 3) % kVocab));
    targets.push_back(r == 2 ? -1 : int32_t((s * 3 + i * 11 + r * 5 + 1) % kVocab));
  }
  return Batch{Tensor::FromVector(ids, {kRows}).To(device),
               Tensor::FromVector(targets, {kRows}).To(device)};
}

struct StepRun {
  std::vector<float> losses, norms;
  std::vector<std::vector<std::string>> syncs;  // per step, on the device (empty on the CPU)
  std::vector<bool> skipped;
};

struct Spec {
  DType dtype = DType::kF32;  // kBF16 / kF16: mixed precision
  float initial_scale = 1.0f;  // f16: dynamic loss scaling from this scale
  int accumulation = 1;
  float max_grad_norm = 0.0f;
  int steps = 3;
};

class StepSyncTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    InstallFakeCuda();
    std::string error;
    std::unique_ptr<Runfiles> runfiles(Runfiles::CreateForTest(&error));
    ASSERT_NE(runfiles, nullptr) << error;
    absl::Status s = LoadPlugin(runfiles->Rlocation("braid/plugins/single/libbraid_single.so"), {});
    ASSERT_TRUE(s.ok()) << s;
  }

  static StepRun Train(const Spec& spec, Device device) {
    StepRun run;
    TinyLm model;
    auto mp = std::make_unique<MixedPrecision>();
    OptimizerFactory factory = [](const std::vector<std::pair<std::string, Tensor>>& named) {
      std::vector<Tensor> params;
      for (const auto& [n, p] : named) params.push_back(p);
      return MakeAdamW({ParamGroup{params, 0.01f, 0.1f}});
    };
    LossFn loss_fn = [](Module& m, const Batch& b) { return ops::CrossEntropy(m(b.inputs), b.targets); };
    if (spec.dtype != DType::kF32) {
      mp->dtype = spec.dtype;
      LossScalerOptions so;
      so.dynamic = spec.dtype == DType::kF16;
      so.initial_scale = spec.initial_scale;
      so.window = 1000;
      so.hysteresis = 1;
      mp->scaler = LossScaler(so);
      CastParameters(model, spec.dtype);
      factory = MixedPrecisionOptimizerFactory(factory, mp.get());
      loss_fn = [mpp = mp.get()](Module& m, const Batch& b) {
        return ScaledLoss(ops::CrossEntropy(m(b.inputs), b.targets), *mpp);
      };
    }
    absl::StatusOr<std::unique_ptr<Strategy>> strategy = Registry::Get().MakeStrategy("single");
    BRAID_CHECK(strategy.ok()) << strategy.status();
    StrategyContext ctx;
    ctx.device = device;
    ctx.max_grad_norm = spec.max_grad_norm;
    absl::Status setup = (*strategy)->Setup(model, factory, ctx);
    BRAID_CHECK(setup.ok()) << setup;
    for (int s = 0; s < spec.steps; ++s) {
      std::vector<Batch> micro;
      for (int i = 0; i < spec.accumulation; ++i) micro.push_back(MakeBatch(s, i, device));
      const bool on_device = device.type == DeviceType::kCUDA;
      if (on_device) Fake().ClearSyncs();
      (*strategy)->optimizer()->SetLearningRate(0.01f);
      absl::StatusOr<StepStats> st = (*strategy)->TrainStep(micro, loss_fn);
      BRAID_CHECK(st.ok()) << st.status();
      run.syncs.push_back(on_device ? Fake().syncs() : std::vector<std::string>{});
      run.losses.push_back(st->loss);
      run.norms.push_back(st->grad_norm);
      run.skipped.push_back(mp->last_step_skipped);
    }
    return run;
  }

  // Every step of `spec` on the fake GPU synchronises the host exactly once (the one read of the
  // step's scalars: at most one is the bound, and the loss has to reach the host), and
  // computes what the same steps compute on the CPU.
  static StepRun ExpectOneSyncPerStep(const Spec& spec) {
    StepRun gpu = Train(spec, Device::CUDA(0));
    for (size_t s = 0; s < gpu.syncs.size(); ++s) {
      EXPECT_EQ(gpu.syncs[s].size(), 1u)
          << "step " << s << " synchronised the host " << gpu.syncs[s].size() << " times: "
          << absl::StrJoin(gpu.syncs[s], ", ");
    }
    return gpu;
  }
};

TEST_F(StepSyncTest, F32StepWithClippingSynchronisesOnceAndMatchesTheCpu) {
  Spec spec;
  spec.max_grad_norm = 0.05f;  // below the measured norms (asserted): clipping acts every step
  StepRun gpu = ExpectOneSyncPerStep(spec);
  StepRun cpu = Train(spec, Device::CPU());
  for (size_t s = 0; s < cpu.losses.size(); ++s) {
    // The same f32 kernels on the same values, in the same order: bit-identical.
    EXPECT_EQ(gpu.losses[s], cpu.losses[s]) << "step " << s;
    EXPECT_EQ(gpu.norms[s], cpu.norms[s]) << "step " << s;
    EXPECT_GT(cpu.norms[s], spec.max_grad_norm) << "step " << s;
    EXPECT_TRUE(std::isfinite(cpu.losses[s]) && cpu.losses[s] > 0.5f) << cpu.losses[s];
  }
  EXPECT_LT(cpu.losses.back(), cpu.losses.front());  // it trains
}

TEST_F(StepSyncTest, AccumulatingMicroBatchesStillSynchronisesOncePerStep) {
  Spec spec;
  spec.accumulation = 3;
  StepRun gpu = ExpectOneSyncPerStep(spec);
  StepRun cpu = Train(spec, Device::CPU());
  for (size_t s = 0; s < cpu.losses.size(); ++s) EXPECT_EQ(gpu.losses[s], cpu.losses[s]) << s;
}

TEST_F(StepSyncTest, Bf16MixedPrecisionSynchronisesOncePerStep) {
  Spec spec;
  spec.dtype = DType::kBF16;
  spec.max_grad_norm = 1.0f;
  StepRun gpu = ExpectOneSyncPerStep(spec);
  StepRun cpu = Train(spec, Device::CPU());
  for (size_t s = 0; s < cpu.losses.size(); ++s) {
    EXPECT_FALSE(gpu.skipped[s]);
    // The CPU runs its native bf16 kernels, the fake device the half fallbacks (f32 kernels
    // between conversions): each rounds the same operations to bf16, but not always at the same
    // points, so the losses agree to bf16's precision (2^-8 relative) rather than bitwise.
    EXPECT_NEAR(gpu.losses[s], cpu.losses[s], 4e-3 * std::abs(cpu.losses[s])) << s;
  }
}

// f16 with dynamic loss scaling starting at 2^24: the first steps overflow (the inf/NaN flag
// is set on the device and read with the loss) and are skipped, the scale halves, and every
// step, skipped or not, synchronises once.
TEST_F(StepSyncTest, F16LossScalingSkipsOverflowsWithOneSyncPerStep) {
  Spec spec;
  spec.dtype = DType::kF16;
  spec.initial_scale = std::ldexp(1.0f, 24);
  spec.steps = 16;
  StepRun gpu = ExpectOneSyncPerStep(spec);
  StepRun cpu = Train(spec, Device::CPU());
  EXPECT_TRUE(gpu.skipped.front());
  EXPECT_FALSE(gpu.skipped.back());
  EXPECT_EQ(gpu.skipped, cpu.skipped);
}

}  // namespace
}  // namespace braid
