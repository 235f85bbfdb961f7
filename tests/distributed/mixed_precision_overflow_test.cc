// An overflow on one rank only, over real Gloo processes: every rank skips the step and backs
// off its loss scale identically, so replicas (and ZeRO's shards, whose gradients differ per
// rank) never part. Then a clean step applies on every rank.
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "backends/gloo/test_util.h"
#include "core/communicator.h"
#include "launcher/mixed_precision/mixed_precision.h"
#include "core/optimizer.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace braid {
namespace {

TEST(MixedPrecisionOverflowTest, OneRanksOverflowSkipsTheStepEverywhere) {
  const std::string dir = gloo_test::FreshDir();
  gloo_test::RunRanks(3, [&](int rank) {
    gloo_test::FileStore store(dir);
    auto comm = gloo_test::MakeGloo(rank, 3, &store);
    ASSERT_TRUE(comm.ok()) << comm.status();
    Communicator* c = comm->get();
    MixedPrecision mp;
    mp.dtype = DType::kF16;
    LossScalerOptions o;
    o.initial_scale = 1024;
    o.hysteresis = 1;
    o.window = 2;
    mp.scaler = LossScaler(o);
    int agreements = 0;
    mp.sum_over_ranks = [c, &agreements](Tensor& check) {
      ++agreements;
      EXPECT_TRUE(c->AllReduce(check, ReduceOp::kSum)->Wait().ok());
    };
    // Each rank steps its own shard, as under ZeRO: different values per rank.
    Tensor p = Tensor::FromVector<float>({float(rank + 1), -1.0f}, {2}).To(DType::kF16);
    p.set_requires_grad(true);
    p.set_name("shard");
    OptimizerFactory sgd = [](const std::vector<std::pair<std::string, Tensor>>& named) {
      ParamGroup g;
      g.lr = 0.5f;
      for (auto& [n, t] : named) g.params.push_back(t);
      return MakeSgd({g});
    };
    auto opt = MixedPrecisionOptimizerFactory(sgd, &mp)({{"shard", p}});
    auto grad = [&](float a, float b) {
      p.set_grad(Tensor::FromVector<float>({a, b}, {2}).To(DType::kF16));
    };
    // Step 1: rank 1's gradient overflowed f16 (1024 * 100 > 65504 rounds to inf).
    const float inf = std::numeric_limits<float>::infinity();
    grad(1024.0f, rank == 1 ? inf : 1024.0f);
    opt->Step();
    EXPECT_TRUE(mp.last_step_skipped) << "rank " << rank;
    EXPECT_EQ(mp.scaler.scale(), 512.0f) << "rank " << rank;
    EXPECT_EQ(p.ToFloatVector(), (std::vector<float>{float(rank + 1), -1.0f})) << "rank " << rank;
    // Step 2: clean everywhere, at scale 512: p - 0.5 * (512, 1024) / 512.
    grad(512.0f, 1024.0f);
    opt->Step();
    EXPECT_FALSE(mp.last_step_skipped) << "rank " << rank;
    EXPECT_EQ(p.ToFloatVector(), (std::vector<float>{float(rank + 1) - 0.5f, -2.0f})) << "rank " << rank;
    // Step 3: clean again; window 2 doubles the scale on every rank alike.
    grad(0.0f, 0.0f);
    opt->Step();
    EXPECT_EQ(mp.scaler.scale(), 1024.0f) << "rank " << rank;
    EXPECT_EQ(mp.scaler.skipped_steps(), 1);
    EXPECT_EQ(agreements, 3);
  });
}

}  // namespace
}  // namespace braid
