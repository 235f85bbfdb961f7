// How many times a data-parallel training step makes each rank's host wait for its CUDA device
// (issue 28; docs/GPU.md, "Synchronisation points"): ZeRO stages 1, 2 and 3 and DDP once.
//
// Two ranks as threads, rank r on cuda:r, each a fake device (tests/device_sync/fake_cuda.h)
// behind the CUDA backend's runtime; their collectives move device memory as NCCL does, without
// the host waiting for the device, so what the fakes record is what the strategy's own code
// waits for. ZeRO's one read holds the rank's mean loss, the squared gradient norm summed over
// both ranks' shards on the device (an all-reduce of one device scalar) and mixed precision's
// inf/NaN flag (core/micro_batches.h). DDP reads the same and, in that same read, every bucket's
// flags (which parameters each rank used, whether a rank abandoned the step: what decides which
// gradients stay undefined, or that the step fails, before anything is clipped or stepped) and,
// in its first step, rank 0's bucket order. From before Setup every collective must pass device
// tensors, as NCCL requires. The same steps on CPU ranks over the in-process communicator give
// the same losses and norms, bit for bit in f32.
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backends/in_process/run_ranks.h"
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
constexpr int kRanks = 2;

// The strategy under test: ZeRO at a stage, or DDP (stage 0).
struct Layer {
  std::string strategy;
  int stage = 0;
  size_t syncs_per_step = 1;
};

struct Spec {
  Layer layer;
  DType dtype = DType::kF32;  // kBF16 / kF16: mixed precision
  float initial_scale = 1.0f;  // f16: dynamic loss scaling from this scale
  int accumulation = 1;
  float max_grad_norm = 0.0f;
  int steps = 3;
};

struct RankRun {
  std::vector<float> losses, norms;
  std::vector<std::vector<std::string>> syncs;  // per step, on the device (empty on the CPU)
  std::vector<bool> skipped;
  std::vector<testing::CollectiveWaits> waits;  // per step, on the device
};

// One rank's steps; the world agrees on overflow as the training program makes it agree
// (launcher/trainer.cc: the check values summed on the device, read with the loss). From before
// Setup the communicator refuses host tensors, as NCCL does, so every collective of Setup and of
// a step must pass device tensors (DDP's comparison of the ranks' models and its bucket order,
// mixed precision's overflow agreement among them).
RankRun TrainRank(const Spec& spec, int rank, Communicator* comm, Device device,
                  const testing::CollectiveWaits* waits = nullptr) {
  RankRun run;
  testing::BlockLm model;
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
    mp->device = device;
    mp->sum_over_ranks = [comm](Tensor& check) {
      absl::Status s = comm->AllReduce(check, ReduceOp::kSum)->Wait();
      BRAID_CHECK(s.ok()) << s;
    };
    CastParameters(model, spec.dtype);
    factory = MixedPrecisionOptimizerFactory(factory, mp.get());
    loss_fn = [mpp = mp.get()](Module& m, const Batch& b) {
      return ScaledLoss(ops::CrossEntropy(m(b.inputs), b.targets), *mpp);
    };
  }
  absl::StatusOr<std::unique_ptr<Strategy>> strategy = Registry::Get().MakeStrategy(spec.layer.strategy);
  BRAID_CHECK(strategy.ok()) << strategy.status();
  StrategyContext ctx;
  ctx.device = device;
  ctx.comm = comm;
  ctx.max_grad_norm = spec.max_grad_norm;
  if (spec.layer.stage > 0) ctx.options["stage"] = absl::StrCat(spec.layer.stage);
  const bool on_device = device.type == DeviceType::kCUDA;
  if (on_device) testing::RefuseHostTensors(comm);
  absl::Status setup = (*strategy)->Setup(model, factory, ctx);
  BRAID_CHECK(setup.ok()) << setup;
  for (int s = 0; s < spec.steps; ++s) {
    std::vector<Batch> micro;
    for (int i = 0; i < spec.accumulation; ++i) micro.push_back(testing::MakeLmBatch(s, rank, i, device));
    (*strategy)->optimizer()->SetLearningRate(0.01f);
    if (on_device) testing::Fake(device.index).ClearSyncs();
    const testing::CollectiveWaits before = waits != nullptr ? *waits : testing::CollectiveWaits{};
    absl::StatusOr<StepStats> st = (*strategy)->TrainStep(micro, loss_fn);
    BRAID_CHECK(st.ok()) << st.status();
    if (waits != nullptr) {
      run.waits.push_back({waits->host - before.host, waits->device - before.device});
    }
    run.syncs.push_back(on_device ? testing::Fake(device.index).syncs() : std::vector<std::string>{});
    run.losses.push_back(st->loss);
    run.norms.push_back(st->grad_norm);
    run.skipped.push_back(mp->last_step_skipped);
  }
  return run;
}

std::vector<RankRun> Train(const Spec& spec, bool on_device) {
  std::vector<RankRun> runs(kRanks);
  std::vector<testing::CollectiveWaits> waits;
  auto body = [&](int rank, Communicator* comm) {
    runs[size_t(rank)] = TrainRank(spec, rank, comm, on_device ? Device::CUDA(rank) : Device::CPU(),
                                   on_device ? &waits[size_t(rank)] : nullptr);
  };
  if (on_device) {
    testing::RunRanksOnFakeDevices(kRanks, body, &waits);
  } else {
    testing::RunRanks(kRanks, body);
  }
  return runs;
}

class DataParallelStepSyncTest : public ::testing::TestWithParam<Layer> {
 protected:
  static void SetUpTestSuite() {
    testing::InstallFakeCuda();
    std::string error;
    std::unique_ptr<Runfiles> runfiles(Runfiles::CreateForTest(&error));
    ASSERT_NE(runfiles, nullptr) << error;
    for (const char* so : {"zero/libbraid_zero.so", "ddp/libbraid_ddp.so"}) {
      absl::Status s = LoadPlugin(runfiles->Rlocation(absl::StrCat("braid/plugins/", so)), {});
      ASSERT_TRUE(s.ok()) << s;
    }
  }

  // Every step of `spec` on the fake GPUs synchronises each rank's host exactly as often as its
  // strategy should: once.
  static std::vector<RankRun> ExpectOneSyncPerStep(const Spec& spec) {
    std::vector<RankRun> gpu = Train(spec, /*on_device=*/true);
    for (int r = 0; r < kRanks; ++r) {
      const RankRun& run = gpu[size_t(r)];
      for (size_t s = 0; s < run.syncs.size(); ++s) {
        EXPECT_EQ(run.syncs[s].size(), spec.layer.syncs_per_step)
            << spec.layer.strategy << " " << spec.layer.stage << ", rank " << r << ", step " << s
            << " synchronised the host " << run.syncs[s].size()
            << " times: " << absl::StrJoin(run.syncs[s], ", ");
      }
    }
    return gpu;
  }
};

TEST_P(DataParallelStepSyncTest, F32StepWithClippingSynchronisesOnceAndMatchesTheCpu) {
  Spec spec;
  spec.layer = GetParam();
  spec.max_grad_norm = 0.05f;  // below the measured norms (asserted): clipping acts every step
  std::vector<RankRun> gpu = ExpectOneSyncPerStep(spec);
  std::vector<RankRun> cpu = Train(spec, /*on_device=*/false);
  for (int r = 0; r < kRanks; ++r) {
    for (size_t s = 0; s < cpu[size_t(r)].losses.size(); ++s) {
      // The same f32 kernels and reductions on the same values, in the same order: bit-identical.
      EXPECT_EQ(gpu[size_t(r)].losses[s], cpu[size_t(r)].losses[s]) << "rank " << r << ", step " << s;
      EXPECT_EQ(gpu[size_t(r)].norms[s], cpu[size_t(r)].norms[s]) << "rank " << r << ", step " << s;
      EXPECT_GT(cpu[size_t(r)].norms[s], spec.max_grad_norm) << "rank " << r << ", step " << s;
      // One global norm: both ranks measured the sum over both shards.
      EXPECT_EQ(gpu[size_t(r)].norms[s], gpu[0].norms[s]) << "rank " << r << ", step " << s;
      EXPECT_TRUE(std::isfinite(cpu[size_t(r)].losses[s]) && cpu[size_t(r)].losses[s] > 0.5f)
          << cpu[size_t(r)].losses[s];
    }
  }
  // The ranks read different data: their shards' squared norms differ, so the equal norms above
  // are the sum over both ranks.
  EXPECT_NE(cpu[0].losses.front(), cpu[1].losses.front());
}

// Every collective a step waits for feeds device work only (ZeRO's all-gathers and
// reduce-scatters, the norm's all-reduce that the step's one read then reads, DDP's bucket
// all-reduces), so each is a stream wait (Work::WaitOnDevice): on NCCL the compute stream waits
// for the collective's event and the host goes on. A host wait (Work::Wait) on a collective
// would block the host on the GPU under NCCL, where the fakes' syncs() cannot see it.
TEST_P(DataParallelStepSyncTest, CollectivesAreWaitedForOnTheDeviceNotTheHost) {
  Spec spec;
  spec.layer = GetParam();
  spec.max_grad_norm = 0.05f;
  spec.accumulation = 2;
  spec.steps = 4;
  std::vector<RankRun> gpu = Train(spec, /*on_device=*/true);
  // DDP's first step broadcasts its bucket order, once, and waits for it on the host.
  const size_t first = spec.layer.strategy == "ddp" ? 1 : 0;
  for (int r = 0; r < kRanks; ++r) {
    const RankRun& run = gpu[size_t(r)];
    ASSERT_EQ(run.waits.size(), size_t(spec.steps));
    for (size_t s = first; s < run.waits.size(); ++s) {
      EXPECT_EQ(run.waits[s].host, 0) << spec.layer.strategy << " " << spec.layer.stage << ", rank " << r
                                      << ", step " << s << ": collectives waited for on the host";
      // ZeRO: at least one reduce-scatter per micro-batch. DDP reduces only the last
      // micro-batch's buckets and may find one done by a poll (IsCompleted, no wait of either
      // kind), which the threads' timing decides: only its host count is held.
      if (spec.layer.strategy == "zero") {
        EXPECT_GE(run.waits[s].device, spec.accumulation) << "rank " << r << ", step " << s;
      }
    }
  }
}

TEST_P(DataParallelStepSyncTest, AccumulatingMicroBatchesStillSynchronisesOncePerStep) {
  Spec spec;
  spec.layer = GetParam();
  spec.accumulation = 3;
  std::vector<RankRun> gpu = ExpectOneSyncPerStep(spec);
  std::vector<RankRun> cpu = Train(spec, /*on_device=*/false);
  for (int r = 0; r < kRanks; ++r) {
    for (size_t s = 0; s < cpu[size_t(r)].losses.size(); ++s) {
      EXPECT_EQ(gpu[size_t(r)].losses[s], cpu[size_t(r)].losses[s]) << "rank " << r << ", step " << s;
      EXPECT_EQ(gpu[size_t(r)].norms[s], cpu[size_t(r)].norms[s]) << "rank " << r << ", step " << s;
    }
  }
}

TEST_P(DataParallelStepSyncTest, Bf16MixedPrecisionSynchronisesOncePerStep) {
  Spec spec;
  spec.layer = GetParam();
  spec.dtype = DType::kBF16;
  spec.max_grad_norm = 1.0f;
  std::vector<RankRun> gpu = ExpectOneSyncPerStep(spec);
  std::vector<RankRun> cpu = Train(spec, /*on_device=*/false);
  for (int r = 0; r < kRanks; ++r) {
    for (size_t s = 0; s < cpu[size_t(r)].losses.size(); ++s) {
      EXPECT_FALSE(gpu[size_t(r)].skipped[s]);
      // Native bf16 kernels on the CPU, the half fallbacks on the fake: the same operations
      // rounded to bf16 at not always the same points, so bf16's precision (2^-8 relative).
      EXPECT_NEAR(gpu[size_t(r)].losses[s], cpu[size_t(r)].losses[s], 4e-3 * std::abs(cpu[size_t(r)].losses[s]))
          << "rank " << r << ", step " << s;
    }
  }
}

// f16 with dynamic loss scaling from 2^24: the first steps overflow (the flag is set on the
// device and read with the loss) and are skipped on both ranks, the scale halves, and every
// step, skipped or not, synchronises once.
TEST_P(DataParallelStepSyncTest, F16LossScalingSkipsOverflowsWithOneSyncPerStep) {
  Spec spec;
  spec.layer = GetParam();
  spec.dtype = DType::kF16;
  spec.initial_scale = std::ldexp(1.0f, 24);
  spec.steps = 12;
  std::vector<RankRun> gpu = ExpectOneSyncPerStep(spec);
  std::vector<RankRun> cpu = Train(spec, /*on_device=*/false);
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_TRUE(gpu[size_t(r)].skipped.front());
    EXPECT_FALSE(gpu[size_t(r)].skipped.back());
    EXPECT_EQ(gpu[size_t(r)].skipped, cpu[size_t(r)].skipped);
  }
}

INSTANTIATE_TEST_SUITE_P(Strategies, DataParallelStepSyncTest,
                         ::testing::Values(Layer{"zero", 1, 1}, Layer{"zero", 2, 1}, Layer{"zero", 3, 1},
                                           Layer{"ddp", 0, 1}),
                         [](const ::testing::TestParamInfo<Layer>& p) {
                           return absl::StrCat(p.param.strategy, p.param.stage);
                         });

}  // namespace
}  // namespace braid
