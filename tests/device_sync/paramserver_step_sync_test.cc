// The parameter server in sync mode makes each rank's host wait for its CUDA device once per step
// (issue 28; docs/GPU.md, "Synchronisation points"; plugins/paramserver/paramserver.cc): a
// worker's read of its loss and norm, which also finds the last reply's header copied to the
// host; the server's read of the mean gradient's squared norm, which finds the pushes' headers
// and statistics there. Three ranks as threads (the server, rank 0, and two workers), each on its
// fake CUDA device, their messages moved as NCCL moves device memory (tests/device_sync/
// fake_cuda.h); the same steps on CPU ranks give the same losses, norms and final parameters, bit
// for bit.
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_join.h"
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
constexpr int kRanks = 3, kSteps = 3, kMicro = 2;

struct RankRun {
  std::vector<float> losses, norms;
  std::vector<std::vector<std::string>> syncs;  // per step (device runs)
  std::map<std::string, std::vector<float>> final_params;
};

RankRun TrainRank(int rank, Communicator* comm, Device device) {
  RankRun run;
  const bool on_device = device.type == DeviceType::kCUDA;
  testing::BlockLm model;
  absl::StatusOr<std::unique_ptr<Strategy>> strategy = Registry::Get().MakeStrategy("paramserver");
  BRAID_CHECK(strategy.ok()) << strategy.status();
  StrategyContext ctx;
  ctx.device = device;
  ctx.comm = comm;
  ctx.max_grad_norm = 0.05f;  // below the norms: the server clips every step
  ctx.options["mode"] = "sync";
  OptimizerFactory factory = [](const std::vector<std::pair<std::string, Tensor>>& named) {
    std::vector<Tensor> params;
    for (const auto& [n, p] : named) params.push_back(p);
    return MakeAdamW({ParamGroup{params, 0.01f, 0.1f}});
  };
  absl::Status setup = (*strategy)->Setup(model, factory, ctx);
  BRAID_CHECK(setup.ok()) << setup;
  if (on_device) testing::RefuseHostTensors(comm);
  LossFn loss_fn = [](Module& m, const Batch& b) { return ops::CrossEntropy(m(b.inputs), b.targets); };
  const int replica = (*strategy)->data_parallel_rank();
  for (int s = 0; s < kSteps; ++s) {
    std::vector<Batch> micro;
    for (int i = 0; i < kMicro; ++i) micro.push_back(testing::MakeLmBatch(s, replica, i, device));
    (*strategy)->optimizer()->SetLearningRate(0.01f);
    if (on_device) testing::Fake(rank).ClearSyncs();
    absl::StatusOr<StepStats> st = (*strategy)->TrainStep(micro, loss_fn);
    BRAID_CHECK(st.ok()) << st.status();
    if (on_device) run.syncs.push_back(testing::Fake(rank).syncs());
    run.losses.push_back(st->loss);
    run.norms.push_back(st->grad_norm);
  }
  absl::StatusOr<std::map<std::string, Tensor>> state = (*strategy)->FullStateDict();
  BRAID_CHECK(state.ok()) << state.status();
  for (auto& [n, t] : *state) run.final_params[n] = t.ToFloatVector();
  return run;
}

std::vector<RankRun> Train(bool on_device) {
  std::vector<RankRun> runs(kRanks);
  auto body = [&](int rank, Communicator* comm) {
    runs[size_t(rank)] = TrainRank(rank, comm, on_device ? Device::CUDA(rank) : Device::CPU());
  };
  if (on_device) {
    testing::RunRanksOnFakeDevices(kRanks, body);
  } else {
    testing::RunRanks(kRanks, body);
  }
  return runs;
}

TEST(ParamServerStepSyncTest, SyncModeWaitsForTheDeviceOncePerStepOnEveryRank) {
  testing::InstallFakeCuda();
  std::string error;
  std::unique_ptr<Runfiles> runfiles(Runfiles::CreateForTest(&error));
  ASSERT_NE(runfiles, nullptr) << error;
  absl::Status loaded =
      LoadPlugin(runfiles->Rlocation("braid/plugins/paramserver/libbraid_paramserver.so"), {});
  ASSERT_TRUE(loaded.ok()) << loaded;

  const std::vector<RankRun> gpu = Train(/*on_device=*/true);
  const std::vector<RankRun> cpu = Train(/*on_device=*/false);
  for (int r = 0; r < kRanks; ++r) {
    const RankRun& g = gpu[size_t(r)];
    const RankRun& c = cpu[size_t(r)];
    ASSERT_EQ(g.syncs.size(), size_t(kSteps));
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_EQ(g.syncs[size_t(s)].size(), 1u)
          << (r == 0 ? "the server" : "worker rank ") << (r == 0 ? "" : std::to_string(r)) << ", step " << s
          << " synchronised the host " << g.syncs[size_t(s)].size()
          << " times: " << absl::StrJoin(g.syncs[size_t(s)], ", ");
      EXPECT_EQ(g.losses[size_t(s)], c.losses[size_t(s)]) << "rank " << r << ", step " << s;
      EXPECT_EQ(g.norms[size_t(s)], c.norms[size_t(s)]) << "rank " << r << ", step " << s;
      EXPECT_TRUE(std::isfinite(c.losses[size_t(s)]) && c.losses[size_t(s)] > 0.5f) << c.losses[size_t(s)];
    }
    ASSERT_EQ(g.final_params.size(), c.final_params.size());
    for (const auto& [n, v] : c.final_params) EXPECT_EQ(g.final_params.at(n), v) << n << ", rank " << r;
  }
  // The server clipped (its norm is the mean gradient's) and the workers read different data.
  EXPECT_GT(cpu[0].norms.front(), 0.05f);
  EXPECT_NE(cpu[1].losses.front(), cpu[2].losses.front());
  // The server's loss is the workers' mean.
  EXPECT_EQ(cpu[0].losses.front(), float((double(cpu[1].losses.front()) + double(cpu[2].losses.front())) / 2));
}

}  // namespace
}  // namespace braid
