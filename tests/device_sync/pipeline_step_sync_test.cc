// How many times a pipeline training step makes each rank's host wait for its CUDA device: as
// often as its data-axis layer alone, once over single, ZeRO or DDP (issue 28; docs/GPU.md,
// "Synchronisation points"), under 1F1B, GPipe and interleaved 1F1B; in the first step a
// receiving stage also reads each boundary's shape header, once.
//
// Each rank is a thread on its own fake device (rank r on cuda:r, tests/device_sync/fake_cuda.h);
// activations and gradients cross the stage boundaries as NCCL moves them, without the host
// waiting for the device, so what the fakes record is what the strategies' own code waits for.
// The last stage's losses are never read one by one: the data-axis layer's mean of its tokens is
// the step's mean loss (the pipeline's stand-in tokens are worth 0), and it reaches the host in
// that layer's one read, with the gradient norm (every stage reads the last stage's loss there:
// it is summed over the stages on the device first). From before Setup every collective and
// message passes device tensors, as NCCL requires. The same steps on CPU ranks over the
// in-process communicator give the same losses and norms, bit for bit.
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backends/in_process/run_ranks.h"
#include "core/mesh.h"
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

struct Spec {
  std::string schedule = "1f1b";
  int virtual_stages = 1;
  int replicas = 1;
  std::string inner = "single";
  std::map<std::string, std::string> inner_options;
  int micro_batches = 3;
  float max_grad_norm = 0.05f;  // below the measured norms (asserted): clipping acts
  int steps = 3;
  size_t syncs_per_step = 1;  // the data-axis layer's
};
constexpr int kStages = 2;

struct RankRun {
  std::vector<float> losses, norms;
  std::vector<std::vector<std::string>> syncs;  // per step, on the device (empty on the CPU)
  std::vector<testing::CollectiveWaits> waits;  // per step, on the device
};

RankRun TrainRank(const Spec& spec, int rank, Communicator* comm, Device device,
                  const testing::CollectiveWaits* waits = nullptr) {
  RankRun run;
  testing::BlockLm model;
  auto pipe = Registry::Get().MakeStrategy("pipeline");
  BRAID_CHECK(pipe.ok()) << pipe.status();
  auto data_layer = Registry::Get().MakeStrategy(spec.inner);
  BRAID_CHECK(data_layer.ok()) << data_layer.status();
  BRAID_CHECK((*pipe)->Wrap(std::move(data_layer).value()).ok());
  // The layout, kStages x replicas, as the trainer builds it from parallel { pipeline data }
  // (before host tensors are refused: making the groups is no step's traffic).
  absl::StatusOr<std::unique_ptr<DeviceMesh>> mesh =
      DeviceMesh::Create(*comm, {1, kStages, comm->size() / kStages});
  BRAID_CHECK(mesh.ok()) << mesh.status();
  StrategyContext ctx;
  BRAID_CHECK(HandMeshGroups(**mesh, {{kAxisPipeline}, {kAxisData}}, &ctx).ok());
  ctx.mesh = mesh->get();
  ctx.device = device;
  ctx.max_grad_norm = spec.max_grad_norm;
  ctx.options["schedule"] = spec.schedule;
  ctx.options["virtual_stages"] = absl::StrCat(spec.virtual_stages);
  ctx.options["partition"] = "parameters";
  for (const auto& [k, v] : spec.inner_options) ctx.options[k] = v;
  ctx.criterion = [](const Tensor& logits, const Batch& b) { return ops::CrossEntropy(logits, b.targets); };
  OptimizerFactory factory = [](const std::vector<std::pair<std::string, Tensor>>& named) {
    std::vector<Tensor> params;
    for (const auto& [n, p] : named) params.push_back(p);
    return MakeAdamW({ParamGroup{params, 0.01f, 0.1f}});
  };
  const bool on_device = device.type == DeviceType::kCUDA;
  // As NCCL: every collective and message of Setup and of every step on the device (the
  // gradient norm's and the loss's sums over the stages, the per-step statistics, the shape
  // headers, the data-axis layer's own among them).
  if (on_device) testing::RefuseHostTensors(comm);
  absl::Status setup = (*pipe)->Setup(model, factory, ctx);
  BRAID_CHECK(setup.ok()) << setup;
  const int replica = (*pipe)->data_parallel_rank();
  for (int s = 0; s < spec.steps; ++s) {
    std::vector<Batch> micro;
    for (int i = 0; i < spec.micro_batches; ++i) micro.push_back(testing::MakeLmBatch(s, replica, i, device));
    (*pipe)->optimizer()->SetLearningRate(0.01f);
    if (on_device) testing::Fake(device.index).ClearSyncs();
    const testing::CollectiveWaits before = waits != nullptr ? *waits : testing::CollectiveWaits{};
    absl::StatusOr<StepStats> st = (*pipe)->TrainStep(micro, LossFn());
    BRAID_CHECK(st.ok()) << st.status();
    if (waits != nullptr) run.waits.push_back({waits->host - before.host, waits->device - before.device});
    run.syncs.push_back(on_device ? testing::Fake(device.index).syncs() : std::vector<std::string>{});
    run.losses.push_back(st->loss);
    run.norms.push_back(st->grad_norm);
  }
  return run;
}

std::vector<RankRun> Train(const Spec& spec, bool on_device) {
  const int world = kStages * spec.replicas;
  std::vector<RankRun> runs(static_cast<size_t>(world));
  std::vector<testing::CollectiveWaits> waits;
  auto body = [&](int rank, Communicator* comm) {
    runs[size_t(rank)] = TrainRank(spec, rank, comm, on_device ? Device::CUDA(rank) : Device::CPU(),
                                   on_device ? &waits[size_t(rank)] : nullptr);
  };
  if (on_device) {
    testing::RunRanksOnFakeDevices(world, body, &waits);
  } else {
    testing::RunRanks(world, body);
  }
  return runs;
}

class PipelineStepSyncTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    testing::InstallFakeCuda();
    std::string error;
    std::unique_ptr<Runfiles> runfiles(Runfiles::CreateForTest(&error));
    ASSERT_NE(runfiles, nullptr) << error;
    for (const char* so : {"pipeline/libbraid_pipeline.so", "single/libbraid_single.so",
                           "ddp/libbraid_ddp.so", "zero/libbraid_zero.so"}) {
      absl::Status s = LoadPlugin(runfiles->Rlocation(absl::StrCat("braid/plugins/", so)), {});
      ASSERT_TRUE(s.ok()) << s;
    }
  }

  // Every step on the fake GPUs synchronises each rank's host exactly as often as its data-axis
  // layer does on its own (once: the pipeline adds nothing), but for the first step's shape
  // headers, one read per chunk that receives activations (every chunk but stage 0's first), and
  // every rank reports what the same ranks report on the CPU, bit for bit (the same f32 kernels,
  // messages and reductions, in the same order).
  static void ExpectSyncsPerStepAndTheCpusResults(const Spec& spec) {
    std::vector<RankRun> gpu = Train(spec, /*on_device=*/true);
    std::vector<RankRun> cpu = Train(spec, /*on_device=*/false);
    for (size_t r = 0; r < gpu.size(); ++r) {
      const size_t receiving_chunks = size_t(spec.virtual_stages) - (r % kStages == 0 ? 1 : 0);
      for (size_t s = 0; s < gpu[r].syncs.size(); ++s) {
        EXPECT_EQ(gpu[r].syncs[s].size(), spec.syncs_per_step + (s == 0 ? receiving_chunks : 0))
            << spec.schedule << " x" << spec.virtual_stages << " over " << spec.inner << ", rank " << r
            << ", step " << s << " synchronised the host " << gpu[r].syncs[s].size()
            << " times: " << absl::StrJoin(gpu[r].syncs[s], ", ");
        // Each stage receives one activation (a later stage) or one gradient (an earlier one)
        // per micro-batch and chunk, consumed by its kernels, and its sends are only rewritten
        // by later kernels: all waited for on the device. After the first step (shape headers)
        // the host waits for at most one collective a step, the per-step statistics'.
        EXPECT_GE(gpu[r].waits[s].device, spec.micro_batches * spec.virtual_stages)
            << "rank " << r << ", step " << s;
        if (s > 0) EXPECT_LE(gpu[r].waits[s].host, 1) << "rank " << r << ", step " << s;
        EXPECT_EQ(gpu[r].losses[s], cpu[r].losses[s]) << "rank " << r << ", step " << s;
        EXPECT_EQ(gpu[r].norms[s], cpu[r].norms[s]) << "rank " << r << ", step " << s;
        EXPECT_GT(cpu[r].norms[s], spec.max_grad_norm) << "rank " << r << ", step " << s;
        // Every stage of a replica reports the last stage's loss: a real one, not a stand-in's 0.
        EXPECT_TRUE(std::isfinite(cpu[r].losses[s]) && cpu[r].losses[s] > 0.5f) << cpu[r].losses[s];
      }
    }
  }
};

TEST_F(PipelineStepSyncTest, OneF1BOverSingle) { ExpectSyncsPerStepAndTheCpusResults(Spec{}); }

TEST_F(PipelineStepSyncTest, GPipeOverSingle) {
  Spec spec;
  spec.schedule = "gpipe";
  ExpectSyncsPerStepAndTheCpusResults(spec);
}

// Two chunks per stage: the last rank's first chunk sends stand-in tokens to the data-axis
// layer between its losses.
TEST_F(PipelineStepSyncTest, InterleavedOverSingle) {
  Spec spec;
  spec.schedule = "interleaved";
  spec.virtual_stages = 2;
  spec.micro_batches = 4;
  ExpectSyncsPerStepAndTheCpusResults(spec);
}

TEST_F(PipelineStepSyncTest, OneF1BOverZero2AcrossTwoReplicas) {
  Spec spec;
  spec.replicas = 2;
  spec.inner = "zero";
  spec.inner_options["stage"] = "2";
  ExpectSyncsPerStepAndTheCpusResults(spec);
}

TEST_F(PipelineStepSyncTest, OneF1BOverDdpAcrossTwoReplicas) {
  Spec spec;
  spec.replicas = 2;
  spec.inner = "ddp";
  ExpectSyncsPerStepAndTheCpusResults(spec);
}

}  // namespace
}  // namespace braid
