// ZeRO's offloaded state moves every step without making the host wait per copy (issue 26,
// issue 28; docs/GPU.md, "Synchronisation points"): ZeRO-Offload's gradient pieces go to the
// host and its updated pieces come back, and ZeRO-Infinity's parameter shards (offload_param)
// come to the device for their gathers, all through core/async_copy.h; each rank's host still
// waits exactly once per step (the step's one read, which also finds those copies done).
//
// Two ranks as threads on fake CUDA devices (tests/device_sync/fake_cuda.h), as in
// data_parallel_step_sync_test. For offload_param the fake's list of enqueued operations shows
// each shard's copy on the copy stream, the compute stream (not the host) waiting for its event,
// and the copy of the unit after the prefetched one issued before the forward of the unit before
// it: ahead of use. The same steps on CPU ranks, where the copies are made at once (the
// synchronous path), give the same losses, norms and final parameters bit for bit.
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/match.h"
#include "backends/cuda/runtime.h"
#include "backends/in_process/run_ranks.h"
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
constexpr int kSteps = 3;

struct Case {
  std::string name;
  std::map<std::string, std::string> options;  // the zero strategy's
};

struct RankRun {
  std::vector<float> losses, norms;
  std::vector<std::vector<std::string>> syncs;   // per step (device runs)
  std::vector<std::vector<std::string>> issued;  // per step: what the host enqueued, in order
  // Per step, at each block's forward pre-hook (before ZeRO's), the copy-stream H2D copies
  // issued so far in the step.
  std::vector<std::vector<int>> h2d_at_block;
  std::map<std::string, std::vector<float>> final_params;
  std::string copy_stream, compute_stream;  // the fake's ids
};

int CountPrefix(const std::vector<std::string>& v, const std::string& prefix) {
  int n = 0;
  for (const std::string& s : v) n += absl::StartsWith(s, prefix) ? 1 : 0;
  return n;
}

RankRun TrainRank(const Case& c, int rank, Communicator* comm, Device device) {
  RankRun run;
  const bool on_device = device.type == DeviceType::kCUDA;
  if (on_device) {
    cuda::DeviceRuntime& rt = cuda::RuntimeOf(device);
    run.copy_stream = absl::StrCat(testing::Fake(rank).StreamId(rt.copy_stream()), ":");
    run.compute_stream = absl::StrCat(testing::Fake(rank).StreamId(rt.compute_stream()), ":");
  }
  testing::BlockLm model(/*blocks=*/3);
  // Registered before the strategy's own hooks, so they run before each block's gather.
  std::vector<int> at_block;
  for (auto& [name, block] : model.NamedBlocks()) {
    block->AddForwardPreHook([&, rank](Module&) {
      if (on_device) at_block.push_back(CountPrefix(testing::Fake(rank).issued(), run.copy_stream + "H2D:"));
    });
  }
  OptimizerFactory factory = [](const std::vector<std::pair<std::string, Tensor>>& named) {
    std::vector<Tensor> params;
    for (const auto& [n, p] : named) params.push_back(p);
    return MakeAdamW({ParamGroup{params, 0.01f, 0.1f}});
  };
  LossFn loss_fn = [](Module& m, const Batch& b) { return ops::CrossEntropy(m(b.inputs), b.targets); };
  absl::StatusOr<std::unique_ptr<Strategy>> strategy = Registry::Get().MakeStrategy("zero");
  BRAID_CHECK(strategy.ok()) << strategy.status();
  StrategyContext ctx;
  ctx.device = device;
  ctx.comm = comm;
  ctx.max_grad_norm = 0.05f;  // below the norms: clipping acts every step
  ctx.options = c.options;
  absl::Status setup = (*strategy)->Setup(model, factory, ctx);
  BRAID_CHECK(setup.ok()) << setup;
  if (on_device) testing::RefuseHostTensors(comm);
  for (int s = 0; s < kSteps; ++s) {
    std::vector<Batch> micro;
    for (int i = 0; i < 2; ++i) micro.push_back(testing::MakeLmBatch(s, rank, i, device));
    (*strategy)->optimizer()->SetLearningRate(0.01f);
    if (on_device) {
      testing::Fake(rank).ClearSyncs();
      testing::Fake(rank).ClearIssued();
    }
    at_block.clear();
    absl::StatusOr<StepStats> st = (*strategy)->TrainStep(micro, loss_fn);
    BRAID_CHECK(st.ok()) << st.status();
    if (on_device) {
      run.syncs.push_back(testing::Fake(rank).syncs());
      run.issued.push_back(testing::Fake(rank).issued());
    }
    run.h2d_at_block.push_back(at_block);
    run.losses.push_back(st->loss);
    run.norms.push_back(st->grad_norm);
  }
  absl::StatusOr<std::map<std::string, Tensor>> state = (*strategy)->FullStateDict();
  BRAID_CHECK(state.ok()) << state.status();
  for (auto& [n, t] : *state) run.final_params[n] = t.ToFloatVector();
  if (on_device) {
    // No rank tears its strategy down (freeing pinned memory, which the fakes record as a
    // synchronisation of the device that made the one pinned allocator) while another is still
    // counting its last step.
    Tensor one = Tensor::FromVector(std::vector<float>{1.0f}, {1}, device);
    absl::Status st = comm->AllReduce(one, ReduceOp::kSum)->Wait();
    BRAID_CHECK(st.ok()) << st;
  }
  return run;
}

std::vector<RankRun> Train(const Case& c, bool on_device) {
  std::vector<RankRun> runs(kRanks);
  auto body = [&](int rank, Communicator* comm) {
    runs[size_t(rank)] = TrainRank(c, rank, comm, on_device ? Device::CUDA(rank) : Device::CPU());
  };
  if (on_device) {
    testing::RunRanksOnFakeDevices(kRanks, body);
  } else {
    testing::RunRanks(kRanks, body);
  }
  return runs;
}

// The fake devices and the zero plugin, once for every test here.
class FakeCudaWithZero : public ::testing::Environment {
 public:
  void SetUp() override {
    testing::InstallFakeCuda();
    std::string error;
    std::unique_ptr<Runfiles> runfiles(Runfiles::CreateForTest(&error));
    ASSERT_NE(runfiles, nullptr) << error;
    absl::Status s = LoadPlugin(runfiles->Rlocation("braid/plugins/zero/libbraid_zero.so"), {});
    ASSERT_TRUE(s.ok()) << s;
  }
};
const auto* const kEnvironment = ::testing::AddGlobalTestEnvironment(new FakeCudaWithZero);

class OffloadStepSyncTest : public ::testing::TestWithParam<Case> {};

// One host wait per step on every rank, the copies' included; the CPU's results bit for bit.
TEST_P(OffloadStepSyncTest, OneHostWaitPerStepAndTheCpusResults) {
  std::vector<RankRun> gpu = Train(GetParam(), /*on_device=*/true);
  std::vector<RankRun> cpu = Train(GetParam(), /*on_device=*/false);
  for (int r = 0; r < kRanks; ++r) {
    const RankRun& g = gpu[size_t(r)];
    ASSERT_EQ(g.syncs.size(), size_t(kSteps));
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_EQ(g.syncs[size_t(s)].size(), 1u)
          << "rank " << r << ", step " << s << " synchronised the host " << g.syncs[size_t(s)].size()
          << " times: " << absl::StrJoin(g.syncs[size_t(s)], ", ");
      // The offloaded state did move this step, through the device API.
      EXPECT_GT(CountPrefix(g.issued[size_t(s)], g.compute_stream + "D2H:") +
                    CountPrefix(g.issued[size_t(s)], g.copy_stream + "H2D:"),
                0)
          << absl::StrJoin(g.issued[size_t(s)], " ");
      EXPECT_EQ(g.losses[size_t(s)], cpu[size_t(r)].losses[size_t(s)]) << "rank " << r << ", step " << s;
      EXPECT_EQ(g.norms[size_t(s)], cpu[size_t(r)].norms[size_t(s)]) << "rank " << r << ", step " << s;
      EXPECT_GT(cpu[size_t(r)].norms[size_t(s)], 0.05f);
      EXPECT_TRUE(std::isfinite(cpu[size_t(r)].losses[size_t(s)]) && cpu[size_t(r)].losses[size_t(s)] > 0.5f);
    }
    ASSERT_EQ(g.final_params.size(), cpu[size_t(r)].final_params.size());
    for (auto& [n, v] : cpu[size_t(r)].final_params) {
      EXPECT_EQ(g.final_params.at(n), v) << n << ", rank " << r;
    }
  }
  // The parameters moved: step 3's loss is not step 1's.
  EXPECT_NE(cpu[0].losses.front(), cpu[0].losses.back());
}

// offload_param: every shard copy is on the copy stream, the compute stream waits for its event
// (the host never does), and from the second step (the order of units known) the copy of the
// unit after the prefetched one is issued before the forward of the unit before that.
TEST(OffloadParamAheadTest, ShardCopiesAreIssuedAheadAndWaitedForByTheComputeStream) {
  Case c{"param", {{"stage", "3"}, {"offload_param", "cpu"}, {"pin_memory", "true"}}};
  std::vector<RankRun> gpu = Train(c, /*on_device=*/true);
  for (int r = 0; r < kRanks; ++r) {
    const RankRun& g = gpu[size_t(r)];
    for (int s = 0; s < kSteps; ++s) {
      const std::vector<std::string>& ops = g.issued[size_t(s)];
      int copies = 0;
      for (size_t i = 0; i < ops.size(); ++i) {
        if (!absl::StartsWith(ops[i], g.copy_stream + "H2D:")) continue;
        ++copies;
        // The copy stream first waited for the compute stream's position, then copies, then
        // records the copy's event, which the compute stream later waits for.
        ASSERT_GE(i, 1u);
        EXPECT_TRUE(absl::StartsWith(ops[i - 1], g.copy_stream + "wait:")) << ops[i - 1];
        ASSERT_LT(i + 1, ops.size());
        ASSERT_TRUE(absl::StartsWith(ops[i + 1], g.copy_stream + "record:")) << ops[i + 1];
        const std::string event = ops[i + 1].substr(ops[i + 1].rfind(':') + 1);
        bool waited = false;
        for (size_t j = i + 2; j < ops.size() && !waited; ++j) {
          waited = ops[j] == g.compute_stream + "wait:" + event;
        }
        EXPECT_TRUE(waited) << "rank " << r << ", step " << s << ": no compute-stream wait for "
                            << ops[i] << " (" << event << ")";
      }
      // Four units (three blocks and the rest), none persistent, each gathered for its forward
      // and again for its backward, in each of the 2 micro-batches.
      EXPECT_EQ(copies, 4 * 2 * 2) << absl::StrJoin(ops, " ");
      if (s == 0) continue;  // the first step learns the order units are used in
      // Forward order: the rest (embedding) first, then blocks 0, 1, 2. Before block j's own
      // gather, block j+1's shard copy is already issued: the rest's, block 0..j's and j+1's
      // (issuing each copy only with its gather would give one fewer). The first micro-batch's
      // forward is the first three entries.
      const std::vector<int>& at = g.h2d_at_block[size_t(s)];
      ASSERT_GE(at.size(), 3u);
      for (int j = 0; j < 3; ++j) {
        EXPECT_GE(at[size_t(j)], std::min(j + 3, 4)) << "rank " << r << ", step " << s << ", block " << j;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Offload, OffloadStepSyncTest,
    ::testing::Values(
        Case{"optimizer_stage1", {{"stage", "1"}, {"offload_optimizer", "cpu"}, {"pin_memory", "true"}}},
        Case{"optimizer_stage2", {{"stage", "2"}, {"offload_optimizer", "cpu"}, {"pin_memory", "true"}}},
        Case{"optimizer_stage3", {{"stage", "3"}, {"offload_optimizer", "cpu"}, {"pin_memory", "true"}}},
        Case{"param_pinned", {{"stage", "3"}, {"offload_param", "cpu"}, {"pin_memory", "true"}}},
        Case{"param_pageable", {{"stage", "3"}, {"offload_param", "cpu"}, {"pin_memory", "false"}}}),
    [](const ::testing::TestParamInfo<Case>& p) { return p.param.name; });

}  // namespace
}  // namespace braid
