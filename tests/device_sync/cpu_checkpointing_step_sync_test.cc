// DeepSpeed's cpu_checkpointing in a whole short run on a fake CUDA device (issue 26, issue 28;
// launcher/activation_checkpointing/kept_inputs.h): every block of a small model checkpointed,
// each segment's input kept in page-locked host memory and brought back for its recompute, under
// the `single` strategy with clipping that binds and 2 accumulated micro-batches. Each step still
// makes exactly one host wait (the step's one read): the copies out and back are on the copy
// stream, waited for by the compute stream. One copy out and one back per segment per
// micro-batch, of the input's bytes; losses, norms and final parameters equal the same run on the
// CPU (where the input stays where it is) bit for bit.
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backends/cuda/runtime.h"
#include "core/ops.h"
#include "core/optimizer.h"
#include "core/pinned_host.h"
#include "core/plugin.h"
#include "core/registry.h"
#include "core/strategy.h"
#include "gtest/gtest.h"
#include "launcher/activation_checkpointing/activation_checkpointing.h"
#include "launcher/activation_checkpointing/kept_inputs.h"
#include "tests/device_sync/fake_cuda.h"
#include "third_party/runfiles.h"

namespace braid {
namespace {

using ::bazel::tools::cpp::runfiles::Runfiles;
constexpr int kBlocks = 3, kSteps = 3, kMicro = 2;

struct CheckpointedRun {
  std::vector<float> losses, norms;
  std::vector<std::vector<std::string>> syncs, issued;  // per step (device run)
  std::map<std::string, std::vector<float>> final_params;
  int64_t peak_kept_bytes = 0;
  std::string copy_stream, compute_stream;
};

CheckpointedRun Train(Device device) {
  CheckpointedRun run;
  const bool on_device = device.type == DeviceType::kCUDA;
  testing::BlockLm model(kBlocks);
  absl::StatusOr<std::unique_ptr<Strategy>> strategy = Registry::Get().MakeStrategy("single");
  BRAID_CHECK(strategy.ok()) << strategy.status();
  StrategyContext ctx;
  ctx.device = device;
  ctx.max_grad_norm = 0.05f;  // below the norms: clipping acts every step
  OptimizerFactory factory = [](const std::vector<std::pair<std::string, Tensor>>& named) {
    std::vector<Tensor> params;
    for (const auto& [n, p] : named) params.push_back(p);
    return MakeAdamW({ParamGroup{params, 0.01f, 0.1f}});
  };
  absl::Status setup = (*strategy)->Setup(model, factory, ctx);
  BRAID_CHECK(setup.ok()) << setup;
  // As the training program does, after the strategy's Setup (launcher/trainer.cc).
  CheckpointPolicy policy;
  policy.kind = CheckpointPolicy::Kind::kEveryBlock;
  policy.checkpoint_last_segment = true;
  KeptInputs::Options kept;
  kept.to_host = true;
  policy.kept_inputs = std::make_shared<KeptInputs>(kept);
  absl::StatusOr<CheckpointingSummary> summary = EnableActivationCheckpointing(model, policy);
  BRAID_CHECK(summary.ok()) << summary.status();
  BRAID_CHECK(summary->segments == kBlocks) << summary->ToString();
  if (on_device) {
    cuda::DeviceRuntime& rt = cuda::RuntimeOf(device);
    run.copy_stream = absl::StrCat(testing::Fake(0).StreamId(rt.copy_stream()), ":");
    run.compute_stream = absl::StrCat(testing::Fake(0).StreamId(rt.compute_stream()), ":");
  }
  LossFn loss_fn = [](Module& m, const Batch& b) { return ops::CrossEntropy(m(b.inputs), b.targets); };
  for (int s = 0; s < kSteps; ++s) {
    std::vector<Batch> micro;
    for (int i = 0; i < kMicro; ++i) micro.push_back(testing::MakeLmBatch(s, 0, i, device));
    (*strategy)->optimizer()->SetLearningRate(0.01f);
    if (on_device) {
      testing::Fake(0).ClearSyncs();
      testing::Fake(0).ClearIssued();
    }
    absl::StatusOr<StepStats> st = (*strategy)->TrainStep(micro, loss_fn);
    BRAID_CHECK(st.ok()) << st.status();
    if (on_device) {
      run.syncs.push_back(testing::Fake(0).syncs());
      run.issued.push_back(testing::Fake(0).issued());
    }
    run.losses.push_back(st->loss);
    run.norms.push_back(st->grad_norm);
  }
  for (auto& [n, p] : model.NamedParameters()) run.final_params[n] = p.ToFloatVector();
  run.peak_kept_bytes = policy.kept_inputs->peak_held_bytes();
  return run;
}

int Count(const std::vector<std::string>& ops, const std::string& prefix) {
  int n = 0;
  for (const std::string& op : ops) n += absl::StartsWith(op, prefix) ? 1 : 0;
  return n;
}

TEST(CpuCheckpointingStepSyncTest, AWholeRunKeepsInputsOnTheHostWithOneHostWaitPerStep) {
  testing::InstallFakeCuda();
  std::string error;
  std::unique_ptr<Runfiles> runfiles(Runfiles::CreateForTest(&error));
  ASSERT_NE(runfiles, nullptr) << error;
  absl::Status loaded = LoadPlugin(runfiles->Rlocation("braid/plugins/single/libbraid_single.so"), {});
  ASSERT_TRUE(loaded.ok()) << loaded;

  const CheckpointedRun gpu = Train(Device::CUDA(0));
  const CheckpointedRun cpu = Train(Device::CPU());
  // One kept input per block: [kRows, kWidth] f32.
  const std::string bytes = absl::StrCat(testing::BlockLm::kRows * testing::BlockLm::kWidth * 4);
  for (int s = 0; s < kSteps; ++s) {
    EXPECT_EQ(gpu.syncs[size_t(s)].size(), 1u)
        << "step " << s << " synchronised the host " << gpu.syncs[size_t(s)].size()
        << " times: " << absl::StrJoin(gpu.syncs[size_t(s)], ", ");
    const std::vector<std::string>& ops = gpu.issued[size_t(s)];
    EXPECT_EQ(Count(ops, gpu.copy_stream + "D2H:" + bytes), kBlocks * kMicro) << absl::StrJoin(ops, " ");
    EXPECT_EQ(Count(ops, gpu.copy_stream + "H2D:" + bytes), kBlocks * kMicro) << absl::StrJoin(ops, " ");
    // Each copy's event is waited for by the compute stream, after the copy was issued.
    for (size_t i = 0; i + 1 < ops.size(); ++i) {
      if (!absl::StartsWith(ops[i], gpu.copy_stream + "D2H") && !absl::StartsWith(ops[i], gpu.copy_stream + "H2D")) continue;
      ASSERT_TRUE(absl::StartsWith(ops[i + 1], gpu.copy_stream + "record:")) << ops[i + 1];
      const std::string event = ops[i + 1].substr(ops[i + 1].rfind(':') + 1);
      EXPECT_NE(std::find(ops.begin() + long(i) + 2, ops.end(), gpu.compute_stream + "wait:" + event), ops.end())
          << "step " << s << ": nothing waits for " << ops[i];
    }
    EXPECT_EQ(gpu.losses[size_t(s)], cpu.losses[size_t(s)]) << "step " << s;
    EXPECT_EQ(gpu.norms[size_t(s)], cpu.norms[size_t(s)]) << "step " << s;
    EXPECT_GT(cpu.norms[size_t(s)], 0.05f);
    EXPECT_TRUE(std::isfinite(cpu.losses[size_t(s)]) && cpu.losses[size_t(s)] > 0.5f) << cpu.losses[size_t(s)];
  }
  EXPECT_NE(cpu.losses.front(), cpu.losses.back());
  ASSERT_EQ(gpu.final_params.size(), cpu.final_params.size());
  for (const auto& [n, v] : cpu.final_params) EXPECT_EQ(gpu.final_params.at(n), v) << n;
  // Every block's input held at once at the end of a forward, on both.
  EXPECT_EQ(gpu.peak_kept_bytes, kBlocks * std::stoll(bytes));
  // The host buffers are reused, not allocated per input (a page-locked free would synchronise):
  // at most one micro-batch's worth exists.
  EXPECT_LE(GetMemoryStats(PinnedHost()).num_allocs, kBlocks);
}

}  // namespace
}  // namespace braid
