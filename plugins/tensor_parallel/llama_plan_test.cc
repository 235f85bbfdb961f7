// models/llama under its own tensor-parallel plan (ModelSpec::tensor_plan, kLlamaTensorPlan) on
// t ranks (threads over the in-process communicator) equals one process: logits and every
// gradient, with and without sequence parallelism, tied and untied. The strategy takes the plan
// from the model's registration, and refuses in one line a tensor size that does not divide the
// K/V heads. Multi-process runs over Gloo are in tests/distributed.
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backends/in_process/run_ranks.h"
#include "core/config/sections.pb.h"
#include "core/mesh.h"
#include "core/ops.h"
#include "core/plugin.h"
#include "core/registry.h"
#include "core/strategy.h"
#include "core/testing/compare.h"
#include "core/testing/equivalence.h"
#include "gtest/gtest.h"
#include "models/llama/llama.h"
#include "plugins/tensor_parallel/parallel_ops.h"
#include "plugins/tensor_parallel/plan.h"
#include "third_party/runfiles.h"

namespace braid::tensor_parallel {
namespace {

using ::bazel::tools::cpp::runfiles::Runfiles;

// 4 query heads of 4 sharing 2 K/V heads, width 16, SwiGLU 24, vocab 64, context 8.
models::LlamaConfig SmallLlama(bool tied) {
  models::LlamaConfig c;
  c.vocab_size = 64;
  c.block_size = 8;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.n_embd = 16;
  c.intermediate_size = 24;
  c.tie_embeddings = tied;
  c.seed = 5;
  return c;
}

Batch Rows(int rows) {
  std::mt19937 rng(77);
  std::vector<int32_t> x(size_t(rows * 8)), y(size_t(rows * 8));
  for (int32_t& v : x) v = int32_t(rng() % 64);
  for (int32_t& v : y) v = int32_t(rng() % 64);
  return {Tensor::FromVector(x, {rows, 8}), Tensor::FromVector(y, {rows, 8})};
}

double Scaled(const Tensor& a, const Tensor& b) {
  const double scale = 1.0 + testing::MaxAbsDiff(b.ToFloatVector(), std::vector<float>(size_t(b.numel()), 0.0f));
  return testing::MaxAbsDiff(a.ToFloatVector(), b.ToFloatVector()) / scale;
}

class LlamaPlanTest : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

// Tolerance: float32 rounding of sums split in 2 parts and re-added in another order, 2e-6
// relative to the largest value (as the GPT plan's test).
TEST_P(LlamaPlanTest, LogitsAndGradientsEqualOneProcess) {
  const bool sp = std::get<0>(GetParam()), tied = std::get<1>(GetParam());
  const int t = 2;
  models::Llama ref(SmallLlama(tied));
  Batch b = Rows(2);
  Tensor want_logits = ref(b.inputs);
  ops::CrossEntropy(want_logits, b.targets).Backward();
  std::map<std::string, Tensor> want_grads;
  for (auto& [n, p] : ref.NamedParameters()) want_grads[n] = p.grad();
  absl::StatusOr<Plan> plan = ParsePlan(models::kLlamaTensorPlan, "llama");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->divides, (std::vector<std::string>{"n_head", "n_kv_head"}));
  testing::RunRanks(t, [&](int rank, Communicator* comm) {
    models::Llama model(SmallLlama(tied));
    auto shards = ApplyPlan(model, *plan, *comm, nullptr, sp);
    ASSERT_TRUE(shards.ok()) << shards.status();
    // Split: the embedding, lm_head when untied, and per layer q, k, v, o, gate, up, down.
    EXPECT_EQ(shards->size(), (tied ? 1u : 2u) + 2u * 7u);
    EXPECT_EQ(shards->at("model.layers.0.self_attn.k_proj.weight").dim, 0);
    EXPECT_EQ(shards->at("model.layers.1.mlp.down_proj.weight").dim, 1);
    Tensor logits = model(b.inputs);
    ASSERT_EQ(logits.size(-1), 64 / t);
    auto full = GatherFromGroup(logits.Reshape({16, 64 / t}), ShardSpec{1, 1, {16, 64}}, *comm);
    ASSERT_TRUE(full.ok());
    EXPECT_LT(Scaled(*full, want_logits.Reshape({16, 64})), 2e-6);
    VocabParallelCrossEntropy(logits, b.targets, *comm).Backward();
    for (auto& [n, p] : model.NamedParameters()) {
      Tensor g = p.grad();
      ASSERT_TRUE(g.defined()) << n;
      auto it = shards->find(n);
      if (it != shards->end()) {
        auto gathered = GatherFromGroup(g, it->second, *comm);
        ASSERT_TRUE(gathered.ok());
        g = *gathered;
      }
      EXPECT_LT(Scaled(g, want_grads.at(n)), 2e-6) << n;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(SequenceParallelAndTying, LlamaPlanTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()));

class LlamaStrategyTest : public ::testing::Test {
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
  // Setup of tensor_parallel(single) over `t` ranks with the config's model section; each rank's
  // status.
  static std::vector<absl::Status> Setup(int t, const config::Sections& cfg) {
    std::vector<absl::Status> out(static_cast<size_t>(t), absl::OkStatus());
    testing::RunRanks(t, [&](int rank, Communicator* comm) {
      auto mesh = DeviceMesh::Create(*comm, {t, 1, 1});
      ASSERT_TRUE(mesh.ok()) << mesh.status();
      auto tp = Registry::Get().MakeStrategy("tensor_parallel");
      auto in = Registry::Get().MakeStrategy("single");
      ASSERT_TRUE(tp.ok() && in.ok());
      ASSERT_TRUE((*tp)->Wrap(std::move(*in)).ok());
      StrategyContext ctx;
      ASSERT_TRUE(HandMeshGroups(**mesh, {{kAxisTensor}, {kAxisData}}, &ctx).ok());
      ctx.mesh = mesh->get();
      ctx.config = &cfg;
      ctx.criterion = [](const Tensor& o, const Batch& b) { return ops::CrossEntropy(o, b.targets); };
      models::Llama model(SmallLlama(false));
      auto optim = [](const std::vector<std::pair<std::string, Tensor>>& named) {
        ParamGroup g;
        for (auto& [n, p] : named) g.params.push_back(p);
        return MakeSgd({g});
      };
      out[size_t(rank)] = (*tp)->Setup(model, optim, ctx);
      if (out[size_t(rank)].ok()) {
        // The model's plan split it: a rank holds half of each K/V projection.
        EXPECT_EQ(model.StateDict().at("model.layers.0.self_attn.k_proj.weight").size(0), 4);
      }
    });
    return out;
  }
};

TEST_F(LlamaStrategyTest, TheModelsPlanIsUsedAndKvHeadsMustDivide) {
  config::Sections cfg;
  cfg.mutable_model()->set_name("llama");
  cfg.mutable_model()->set_n_head(4);
  (*cfg.mutable_model()->mutable_options())["n_kv_head"] = "2";
  for (const absl::Status& st : Setup(2, cfg)) EXPECT_TRUE(st.ok()) << st;
  for (const absl::Status& st : Setup(4, cfg)) {
    EXPECT_EQ(st.message(),
              "tensor_parallel: model.options \"n_kv_head\" (2) is not a multiple of "
              "parallel.tensor (4): plan llama splits by it; choose a tensor size that divides it");
  }
}

}  // namespace
}  // namespace braid::tensor_parallel
