// DeepSpeed's partition_activations under tensor parallelism: with the real tensor_parallel
// strategy (t = 2 and 4, ranks as threads) around single, a GPT whose every block is checkpointed
// trains to the same weights, bit for bit, whether each rank keeps the blocks' inputs whole or
// only its 1/t of them (all-gathered over the tensor group before each recompute), and as without
// checkpointing at all; the bytes each rank holds for its checkpoints, on the store's own books,
// are exactly 1/t of the whole inputs'.
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backends/in_process/run_ranks.h"
#include "core/mesh.h"
#include "core/ops.h"
#include "core/optimizer.h"
#include "core/plugin.h"
#include "core/registry.h"
#include "core/strategy.h"
#include "gtest/gtest.h"
#include "launcher/activation_checkpointing/activation_checkpointing.h"
#include "launcher/activation_checkpointing/kept_inputs.h"
#include "models/gpt/gpt.h"
#include "third_party/runfiles.h"

namespace braid {
namespace {

using ::bazel::tools::cpp::runfiles::Runfiles;

constexpr int kLayers = 4, kRows = 2, kT = 8, kWidth = 16, kSteps = 3;

models::GptConfig SmallGpt() {
  models::GptConfig c;
  c.vocab_size = 64;
  c.padded_vocab_size = 64;
  c.block_size = kT;
  c.n_layer = kLayers;
  c.n_head = 4;
  c.n_embd = kWidth;
  c.seed = 11;
  return c;
}

Batch Rows(int step) {
  std::mt19937 rng(500u + unsigned(step));
  std::vector<int32_t> x, y;
  for (int r = 0; r < kRows; ++r) {
    std::vector<int32_t> row(kT + 1);
    for (int32_t& v : row) v = int32_t(rng() % 64);
    x.insert(x.end(), row.begin(), row.end() - 1);
    y.insert(y.end(), row.begin() + 1, row.end());
  }
  return {Tensor::FromVector(x, {kRows, kT}), Tensor::FromVector(y, {kRows, kT})};
}

enum class Kept { kNoCheckpointing, kWhole, kPartitioned };

struct RankResult {
  std::map<std::string, std::vector<float>> weights;  // FullStateDict after kSteps
  std::vector<float> losses;
  int64_t peak_held_bytes = 0, gathered = 0, recomputes = 0;
};

class PartitionActivationsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string error;
    std::unique_ptr<Runfiles> rf(Runfiles::CreateForTest(&error));
    ASSERT_NE(rf, nullptr) << error;
    for (const char* p : {"braid/plugins/tensor_parallel/libbraid_tensor_parallel.so",
                          "braid/plugins/single/libbraid_single.so"}) {
      absl::Status st = LoadPlugin(rf->Rlocation(p), {});
      ASSERT_TRUE(st.ok()) << st;
    }
  }

  // kSteps of SGD under tensor_parallel(single) on t ranks; every block checkpointed (its last
  // too, so all kLayers inputs are kept) unless kNoCheckpointing.
  static std::vector<RankResult> Train(int t, Kept kept) {
    std::vector<RankResult> out(static_cast<size_t>(t));
    testing::RunRanks(t, [&](int rank, Communicator* comm) {
      auto mesh = DeviceMesh::Create(*comm, {t, 1, 1});
      ASSERT_TRUE(mesh.ok()) << mesh.status();
      auto tp = Registry::Get().MakeStrategy("tensor_parallel");
      auto single = Registry::Get().MakeStrategy("single");
      ASSERT_TRUE(tp.ok() && single.ok());
      ASSERT_TRUE((*tp)->Wrap(std::move(*single)).ok());
      StrategyContext ctx;
      ASSERT_TRUE(HandMeshGroups(**mesh, {{kAxisTensor}, {kAxisData}}, &ctx).ok());
      ctx.mesh = mesh->get();
      ctx.options["plan"] = "gpt-mini";
      ctx.criterion = [](const Tensor& o, const Batch& b) { return ops::CrossEntropy(o, b.targets); };
      models::Gpt model(SmallGpt());
      OptimizerFactory sgd = [](const std::vector<std::pair<std::string, Tensor>>& named) {
        ParamGroup g;
        for (const auto& [n, p] : named) g.params.push_back(p);
        g.lr = 0.5f;
        return MakeSgd({g});
      };
      absl::Status st = (*tp)->Setup(model, sgd, ctx);
      ASSERT_TRUE(st.ok()) << st;
      // As the training program does: after Setup, on the split model.
      KeptInputs::Options o;
      if (kept == Kept::kPartitioned) o.partition_group = &(*mesh)->tensor();
      auto store = std::make_shared<KeptInputs>(o);
      if (kept != Kept::kNoCheckpointing) {
        CheckpointPolicy policy;
        policy.kind = CheckpointPolicy::Kind::kEveryBlock;
        policy.checkpoint_last_segment = true;
        policy.kept_inputs = store;
        auto summary = EnableActivationCheckpointing(model, policy);
        ASSERT_TRUE(summary.ok()) << summary.status();
        ASSERT_EQ(summary->segments, kLayers);
      }
      ResetActivationCheckpointStats();
      RankResult& r = out[size_t(rank)];
      for (int step = 0; step < kSteps; ++step) {
        auto stats = (*tp)->TrainStep({Rows(step)}, [](Module& m, const Batch& b) {
          return ops::CrossEntropy(m(b.inputs), b.targets);
        });
        ASSERT_TRUE(stats.ok()) << stats.status();
        r.losses.push_back(stats->loss);
      }
      auto full = (*tp)->FullStateDict();
      ASSERT_TRUE(full.ok()) << full.status();
      for (auto& [name, w] : *full) r.weights[name] = w.ToFloatVector();
      r.peak_held_bytes = store->peak_held_bytes();
      r.gathered = store->gathered();
      r.recomputes = GetActivationCheckpointStats().recomputes;
      EXPECT_EQ(store->held_bytes(), 0) << "rank " << rank << ": a checkpoint still holds its input";
    });
    return out;
  }
};

TEST_F(PartitionActivationsTest, EachRankKeepsItsSliceAndTrainsToTheSameWeightsBitForBit) {
  // Each block's input: kRows x kT x kWidth f32.
  const int64_t input_bytes = int64_t(kRows) * kT * kWidth * 4;
  for (int t : {2, 4}) {
    const std::vector<RankResult> plain = Train(t, Kept::kNoCheckpointing);
    const std::vector<RankResult> whole = Train(t, Kept::kWhole);
    const std::vector<RankResult> sliced = Train(t, Kept::kPartitioned);
    ASSERT_EQ(sliced.size(), size_t(t));
    for (int rank = 0; rank < t; ++rank) {
      const RankResult& p = plain[size_t(rank)];
      const RankResult& w = whole[size_t(rank)];
      const RankResult& s = sliced[size_t(rank)];
      // Exact equality: a NaN anywhere fails it.
      ASSERT_EQ(s.weights.size(), w.weights.size());
      for (const auto& [name, values] : w.weights) {
        EXPECT_EQ(s.weights.at(name), values) << "t " << t << " rank " << rank << ": " << name;
        EXPECT_EQ(p.weights.at(name), values) << "t " << t << " rank " << rank << ": " << name;
      }
      EXPECT_EQ(s.losses, w.losses);
      // The same recomputes, each preceded by one all-gather when partitioned, none when whole.
      EXPECT_EQ(s.recomputes, int64_t(kLayers) * kSteps);
      EXPECT_EQ(w.recomputes, s.recomputes);
      EXPECT_EQ(s.gathered, s.recomputes);
      EXPECT_EQ(w.gathered, 0);
      // All kLayers inputs are held at once at the end of each forward: whole, kLayers inputs;
      // partitioned, 1/t of each (t divides kRows x kT x kWidth).
      EXPECT_EQ(w.peak_held_bytes, kLayers * input_bytes) << "t " << t;
      EXPECT_EQ(s.peak_held_bytes * t, w.peak_held_bytes) << "t " << t << " rank " << rank;
    }
  }
}

}  // namespace
}  // namespace braid
