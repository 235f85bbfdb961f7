// Tensor parallelism on t ranks (threads over the in-process communicator) equals one process:
// the parallel ops against their full counterparts and finite differences, GPT's logits and
// gradients under the shipped plan, and whole training steps of the real plugin wrapped around
// single and DDP. Multi-process runs over Gloo (TP x PP x DP) are in tests/distributed.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "backends/in_process/run_ranks.h"
#include "core/autograd.h"
#include "core/config/sections.pb.h"
#include "core/deferred_init.h"
#include "core/mesh.h"
#include "core/micro_batches.h"
#include "core/ops.h"
#include "core/optimizer.h"
#include "core/plugin.h"
#include "core/registry.h"
#include "core/strategy.h"
#include "core/testing/compare.h"
#include "core/testing/equivalence.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/gpt/gpt.h"
#include "models/mlp/mlp.h"
#include "plugins/tensor_parallel/parallel_ops.h"
#include "plugins/tensor_parallel/plan.h"
#include "third_party/runfiles.h"

namespace braid::tensor_parallel {
namespace {

using ::bazel::tools::cpp::runfiles::Runfiles;
using ::testing::HasSubstr;
using StateDict = std::map<std::string, Tensor>;

// Small enough for threads, and every split size divides: vocab 64, 4 heads of 4, width 16.
models::GptConfig SmallGpt() {
  models::GptConfig c;
  c.vocab_size = 64;
  c.padded_vocab_size = 64;
  c.block_size = 8;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 16;
  c.seed = 11;
  return c;
}

Batch GptRows(int step, int first, int rows) {
  std::mt19937 rng(3000u + unsigned(step));
  std::vector<int32_t> all(size_t(16 * 9));
  for (int32_t& v : all) v = int32_t(rng() % 64);
  std::vector<int32_t> x, y;
  for (int r = first; r < first + rows; ++r) {
    x.insert(x.end(), all.begin() + r * 9, all.begin() + r * 9 + 8);
    y.insert(y.end(), all.begin() + r * 9 + 1, all.begin() + r * 9 + 9);
  }
  return {Tensor::FromVector(x, {rows, 8}), Tensor::FromVector(y, {rows, 8})};
}

Tensor RandomTensor(const Shape& shape, unsigned seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0, scale);
  std::vector<float> v(size_t(NumElements(shape)));
  for (float& x : v) x = d(rng);
  return Tensor::FromVector(v, shape);
}

// +inf on a NaN or inf in either, or sizes that differ, so EXPECT_EQ(..., 0.0) fails on them.
double MaxAbsDiff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.numel(), b.numel());
  return testing::MaxAbsDiff(a.ToFloatVector(), b.ToFloatVector());
}

// Columns [rank * V/t, ...) of a [N, V] tensor.
Tensor Columns(const Tensor& full, int rank, int size) {
  return SliceForRank(full, ShardSpec{1, 1, full.shape()}, rank, size);
}

// ---- The ops ------------------------------------------------------------------------------

class OpsTest : public ::testing::TestWithParam<int> {};

TEST_P(OpsTest, VocabParallelCrossEntropyEqualsTheFullOneAndItsGradient) {
  const int t = GetParam();
  const int64_t n = 6, v = 24;
  Tensor full = RandomTensor({n, v}, 5, 3.0f);
  // Targets in every rank's range, one ignored (-1), as the full op ignores it.
  Tensor targets = Tensor::FromVector(std::vector<int32_t>{0, 23, 7, -1, 12, 18}, {n});
  Tensor want_logits = full.Clone().set_requires_grad(true);
  Tensor want = ops::CrossEntropy(want_logits, targets);
  want.Backward();
  testing::RunRanks(t, [&](int rank, Communicator* comm) {
    Tensor local = Columns(full, rank, t).set_requires_grad(true);
    Tensor loss = VocabParallelCrossEntropy(local, targets, *comm);
    EXPECT_NEAR(loss.item(), want.item(), 1e-6 * std::fabs(want.item()));
    loss.Backward();
    EXPECT_LT(MaxAbsDiff(local.grad(), Columns(want_logits.grad(), rank, t)), 1e-7);
  });
}

TEST_P(OpsTest, VocabParallelCrossEntropyGradientMatchesFiniteDifferences) {
  const int t = GetParam();
  const int64_t n = 3, v = 8;
  Tensor full = RandomTensor({n, v}, 9);
  Tensor targets = Tensor::FromVector(std::vector<int32_t>{1, 6, 3}, {n});
  testing::RunRanks(t, [&](int rank, Communicator* comm) {
    Tensor local = Columns(full, rank, t).set_requires_grad(true);
    VocabParallelCrossEntropy(local, targets, *comm).Backward();
    std::vector<float> analytic = local.grad().ToFloatVector();
    // Every rank perturbs in turn (the loss is collective), central differences in double-ish.
    const float h = 1e-2f;
    for (int owner = 0; owner < t; ++owner) {
      for (int64_t i = 0; i < local.numel(); ++i) {
        std::vector<float> plus = local.ToFloatVector(), minus = plus;
        if (rank == owner) {
          plus[size_t(i)] += h;
          minus[size_t(i)] -= h;
        }
        autograd::NoGradGuard ng;
        float lp = VocabParallelCrossEntropy(Tensor::FromVector(plus, local.shape()), targets, *comm).item();
        float lm = VocabParallelCrossEntropy(Tensor::FromVector(minus, local.shape()), targets, *comm).item();
        if (rank == owner) {
          EXPECT_NEAR((lp - lm) / (2 * h), analytic[size_t(i)], 2e-3) << "element " << i;
        }
      }
    }
  });
}

TEST_P(OpsTest, VocabParallelEmbeddingEqualsTheFullLookupAndItsGradient) {
  const int t = GetParam();
  Tensor table = RandomTensor({16, 5}, 13);
  Tensor ids = Tensor::FromVector(std::vector<int32_t>{0, 15, 4, 4, 9, 12}, {2, 3});
  Tensor want_table = table.Clone().set_requires_grad(true);
  Tensor want = ops::Embedding(want_table, ids);
  Tensor seed = RandomTensor({2, 3, 5}, 17);
  ops::Sum(ops::Mul(want, seed)).Backward();
  testing::RunRanks(t, [&](int rank, Communicator* comm) {
    ShardSpec rows{0, 1, table.shape()};
    Tensor local = SliceForRank(table, rows, rank, t).set_requires_grad(true);
    Tensor got = VocabParallelEmbedding(local, ids, rank * (16 / t), *comm);
    EXPECT_EQ(MaxAbsDiff(got, want), 0.0);  // one owner per row: the sum adds zeros
    ops::Sum(ops::Mul(got, seed)).Backward();
    EXPECT_EQ(MaxAbsDiff(local.grad(), SliceForRank(want_table.grad(), rows, rank, t)), 0.0);
  });
}

TEST_P(OpsTest, SliceAndGatherAreInverse) {
  const int t = GetParam();
  Tensor w = RandomTensor({24, 8}, 21);
  for (ShardSpec spec : {ShardSpec{0, 1, w.shape()}, ShardSpec{0, 3, w.shape()},
                         ShardSpec{1, 1, w.shape()}}) {
    testing::RunRanks(t, [&](int rank, Communicator* comm) {
      Tensor local = SliceForRank(w, spec, rank, t);
      auto back = GatherFromGroup(local, spec, *comm);
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_EQ(back->shape(), w.shape());
      EXPECT_EQ(MaxAbsDiff(*back, w), 0.0);
    });
  }
  // chunks=3 on 2 ranks: rank 0 holds rows 0-3, 8-11, 16-19 (its half of each chunk).
  Tensor part = SliceForRank(w, ShardSpec{0, 3, w.shape()}, 0, 2);
  EXPECT_EQ(MaxAbsDiff(part.Slice(4, 8), w.Slice(8, 12)), 0.0);
}

// A checkpoint places a slice's elements by PartToFull: slicing a tensor whose values are their
// own flat positions must give exactly the positions PartToFull names, for any sub-range.
TEST_P(OpsTest, PartToFullNamesTheElementsSliceForRankTakes) {
  const int t = GetParam();
  std::vector<float> pos(24 * 8);
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = float(i);
  Tensor w = Tensor::FromVector(pos, {24, 8});
  for (ShardSpec spec : {ShardSpec{0, 1, w.shape()}, ShardSpec{0, 3, w.shape()},
                         ShardSpec{1, 1, w.shape()}}) {
    for (int r = 0; r < t; ++r) {
      std::vector<float> local = SliceForRank(w, spec, r, t).ToFloatVector();
      for (auto [b, e] : {std::pair<int64_t, int64_t>{0, int64_t(local.size())}, {3, 17}}) {
        std::vector<float> named;
        for (auto& [x, y] : PartToFull(spec, r, t, b, e)) {
          for (int64_t i = x; i < y; ++i) named.push_back(float(i));
        }
        EXPECT_EQ(named, std::vector<float>(local.begin() + b, local.begin() + e))
            << "dim " << spec.dim << " chunks " << spec.chunks << " rank " << r;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, OpsTest, ::testing::Values(2, 4));

// ---- GPT under the shipped plan -------------------------------------------------------------

class GptPlanTest : public ::testing::TestWithParam<std::tuple<int, bool>> {};

// Logits (gathered over the vocabulary) and every parameter's gradient (gathered) equal one
// process's. Tolerance: float32 rounding of sums split in t parts and re-added in another order
// (each all-reduce reorders a 16- or 64-term dot product): 2e-6 relative to the largest value.
// With sequence parallelism (the second parameter) the same holds: the replicated weights' partial
// gradients are summed over the group as they arrive.
TEST_P(GptPlanTest, LogitsAndGradientsEqualOneProcess) {
  const int t = std::get<0>(GetParam());
  const bool sp = std::get<1>(GetParam());
  models::Gpt ref(SmallGpt());
  Batch b = GptRows(0, 0, 2);
  Tensor want_logits = ref(b.inputs);
  ops::CrossEntropy(want_logits, b.targets).Backward();
  StateDict want_grads;
  for (auto& [n, p] : ref.NamedParameters()) want_grads[n] = p.grad();
  auto plan = RegisteredPlan("gpt-mini");
  ASSERT_TRUE(plan.ok()) << plan.status();
  testing::RunRanks(t, [&](int rank, Communicator* comm) {
    models::Gpt model(SmallGpt());
    auto shards = ApplyPlan(model, *plan, *comm, nullptr, sp);
    ASSERT_TRUE(shards.ok()) << shards.status();
    // Split: wte, and per block c_attn (weight, bias), c_proj weight, c_fc (weight, bias),
    // mlp c_proj weight.
    EXPECT_EQ(shards->size(), 1u + 2u * 6u);
    Tensor logits = model(b.inputs);
    EXPECT_EQ(logits.size(-1), 64 / t);
    auto full = GatherFromGroup(logits.Reshape({16, 64 / t}), ShardSpec{1, 1, {16, 64}}, *comm);
    ASSERT_TRUE(full.ok());
    const double scale = 1.0 + MaxAbsDiff(want_logits, Tensor::Zeros(want_logits.shape()));
    EXPECT_LT(MaxAbsDiff(*full, want_logits.Reshape({16, 64})) / scale, 2e-6);
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
      const Tensor& w = want_grads.at(n);
      const double s = 1.0 + MaxAbsDiff(w, Tensor::Zeros(w.shape()));
      EXPECT_LT(MaxAbsDiff(g, w) / s, 2e-6) << n;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, GptPlanTest,
                         ::testing::Combine(::testing::Values(2, 4), ::testing::Bool()));

// The sequence ops: gather then scatter of a sum is the identity; scatter of t equal copies gives
// t times this rank's rows; and both backward passes are the other op. One sequence (B = 1, where
// the collectives' rank-major layout is the tensor's own and no rows are moved) and two.
TEST_P(OpsTest, SequenceGatherAndScatterAreConjugate) {
  const int t = GetParam();
  for (const int64_t batch : {1, 2}) {
    SCOPED_TRACE(batch);
    Tensor full = RandomTensor({batch, 8, 3}, 31);  // [B, T, C]
    testing::RunRanks(t, [&](int rank, Communicator* comm) {
      const int64_t rows = 8 / t;
      std::vector<float> v = full.ToFloatVector(), mine;
      for (int64_t b = 0; b < batch; ++b) {
        mine.insert(mine.end(), v.begin() + (b * 8 + rank * rows) * 3, v.begin() + (b * 8 + (rank + 1) * rows) * 3);
      }
      Tensor local = Tensor::FromVector(mine, {batch, rows, 3}).set_requires_grad(true);
      Tensor gathered = GatherSequence(local, *comm);
      EXPECT_EQ(MaxAbsDiff(gathered, full), 0.0);
      Tensor seed = RandomTensor({batch, 8, 3}, 37);  // the same on every rank
      ops::Sum(ops::Mul(gathered, seed)).Backward();
      // d/dlocal of sum over ranks' identical losses: t times this rank's rows of the seed.
      std::vector<float> s = seed.ToFloatVector(), want;
      for (int64_t b = 0; b < batch; ++b) {
        for (int64_t i = (b * 8 + rank * rows) * 3; i < (b * 8 + (rank + 1) * rows) * 3; ++i) want.push_back(float(t) * s[size_t(i)]);
      }
      EXPECT_LT(MaxAbsDiff(local.grad(), Tensor::FromVector(want, {batch, rows, 3})), 1e-6);
      Tensor scattered = ScatterSequence(full, *comm);
      std::vector<float> times_t;
      for (float x : mine) times_t.push_back(float(t) * x);
      EXPECT_LT(MaxAbsDiff(scattered, Tensor::FromVector(times_t, {batch, rows, 3})), 1e-6);
      // The input is only read: the full tensor is unchanged after scattering it.
      EXPECT_EQ(MaxAbsDiff(full, Tensor::FromVector(v, {batch, 8, 3})), 0.0);
    });
  }
}

TEST(PlanTest, BadPlansAndLayoutsAreRefusedNamingTheRule) {
  auto unknown = ParsePlan("h.*.mlp.c_fc sideways\n", "mine.plan");
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(std::string(unknown.status().message()),
              AllOf(HasSubstr("mine.plan line 1"), HasSubstr("unknown style 'sideways'")));
  auto option = ParsePlan("fc1 rowwise chunks=3\n", "p");
  ASSERT_FALSE(option.ok());
  EXPECT_THAT(std::string(option.status().message()), HasSubstr("not an option of rowwise"));
  EXPECT_FALSE(RegisteredPlan("bert").ok());

  auto typo = ParsePlan("h.*.mlp.c_fx colwise\n", "typo.plan");
  ASSERT_TRUE(typo.ok());
  testing::RunRanks(2, [&](int rank, Communicator* comm) {
    models::Gpt model(SmallGpt());
    auto st = ApplyPlan(model, *typo, *comm, nullptr);
    ASSERT_FALSE(st.ok());
    EXPECT_THAT(std::string(st.status().message()),
                AllOf(HasSubstr("typo.plan line 1"), HasSubstr("matches no module")));
  });
  // 3 ranks do not divide the 64-row vocabulary: refused before anything changed.
  auto gpt = RegisteredPlan("gpt-mini");
  testing::RunRanks(3, [&](int rank, Communicator* comm) {
    models::Gpt model(SmallGpt());
    const int64_t before = model.NumParameters();
    auto st = ApplyPlan(model, *gpt, *comm, nullptr);
    ASSERT_FALSE(st.ok());
    EXPECT_THAT(std::string(st.status().message()),
                AllOf(HasSubstr("wte.weight"), HasSubstr("does not divide")));
    EXPECT_EQ(model.NumParameters(), before);
  });
}

// ---- The strategy, wrapped around single and DDP -------------------------------------------

class StrategyTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string error;
    std::unique_ptr<Runfiles> rf(Runfiles::CreateForTest(&error));
    ASSERT_NE(rf, nullptr) << error;
    for (const char* p : {"braid/plugins/tensor_parallel/libbraid_tensor_parallel.so",
                          "braid/plugins/ddp/libbraid_ddp.so", "braid/plugins/single/libbraid_single.so",
                          "braid/plugins/zero/libbraid_zero.so"}) {
      absl::Status st = LoadPlugin(rf->Rlocation(p), {});
      ASSERT_TRUE(st.ok()) << st;
    }
  }
};

LossFn CrossEntropyLoss() {
  return [](Module& m, const Batch& b) { return ops::CrossEntropy(m(b.inputs), b.targets); };
}

struct TpRun {
  int tensor = 2, data = 1, steps = 3, rows = 2;
  bool sequence_parallel = false;
  float max_grad_norm = 0;
  bool adamw = false;
  std::map<std::string, std::string> inner_options;  // the wrapped strategy's ("stage" for zero)
  // ZeRO-3 below: the model is built deferred, and between steps no split parameter holds
  // memory (each rank keeps only its shard of its slice).
  bool sharded_below = false;
};

OptimizerFactory TpOptim(const TpRun& run) {
  return testing::GroupedByWeightDecay(run.adamw, run.adamw ? 1e-3f : 0.5f, 0.1f);
}

// One process on the global batch of `run`, clipping to `max_grad_norm` (0: none): each step's
// loss and gradient norm before clipping, and the final weights.
struct Reference {
  std::vector<float> loss, norm;
  StateDict state;
};
Reference TrainOneProcess(const TpRun& run, float max_grad_norm) {
  Reference out;
  models::Gpt model(SmallGpt());
  auto opt = TpOptim(run)(model.NamedParameters());
  for (int step = 0; step < run.steps; ++step) {
    std::vector<Batch> mbs = {GptRows(step, 0, run.rows * run.data)};
    opt->ZeroGrad();
    StepStats st;
    EXPECT_TRUE(RunMicroBatches("reference", model, mbs, CrossEntropyLoss(), &st).ok());
    out.norm.push_back(ClipGradNorm(model.Parameters(), max_grad_norm));
    opt->Step();
    out.loss.push_back(st.loss);
  }
  out.state = model.StateDict();
  return out;
}

// Trains `run` under tensor_parallel(inner) and one process on the global batch; returns the
// largest relative difference of the final weights (every rank's FullStateDict) and checks the
// losses and gradient norms step by step.
//
// With clipping on, it also checks that clipping binds, so that matching the clipped one process
// means the strategy clipped: every step's norm before clipping exceeds max_grad_norm, and the
// one process without clipping ends at weights more than 10x the 1e-5 tolerance away, where a
// strategy whose clipping did nothing would end (the norm it reports is taken before clipping
// and would not show it). Measured: SGD ~0.1 apart; AdamW, whose update divides most of the
// gradient's scale out, ~3e-4.
double TrainAndCompare(const TpRun& run, const std::string& inner) {
  OptimizerFactory optim = TpOptim(run);
  const Reference ref = TrainOneProcess(run, run.max_grad_norm);
  const std::vector<float>& want_loss = ref.loss;
  const std::vector<float>& want_norm = ref.norm;
  const StateDict& want = ref.state;
  if (run.max_grad_norm > 0) {
    for (int step = 0; step < run.steps; ++step) {
      EXPECT_GT(want_norm[size_t(step)], run.max_grad_norm) << "clipping does not bind at step " << step;
    }
    std::string worst;
    const double apart = testing::MaxRelativeDifference(TrainOneProcess(run, 0).state, want, &worst);
    std::printf("%s t=%d d=%d: the one process without clipping ends %.3g from the clipped one (%s)\n",
                run.adamw ? "AdamW" : "SGD", run.tensor, run.data, apart, worst.c_str());
    EXPECT_TRUE(std::isfinite(apart));
    EXPECT_GT(apart, 1e-4) << "clipping barely moves the weights: a strategy that did not clip would pass";
  }
  const int world = run.tensor * run.data;
  std::vector<double> diff(size_t(world), 1.0);
  testing::RunRanks(world, [&](int rank, Communicator* comm) {
    auto mesh = DeviceMesh::Create(*comm, {run.tensor, 1, run.data});
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    auto tp = Registry::Get().MakeStrategy("tensor_parallel");
    auto in = Registry::Get().MakeStrategy(inner);
    ASSERT_TRUE(tp.ok() && in.ok());
    ASSERT_TRUE((*tp)->Wrap(std::move(*in)).ok());
    StrategyContext ctx;
    ASSERT_TRUE(HandMeshGroups(**mesh, {{kAxisTensor}, {kAxisData}}, &ctx).ok());
    ctx.mesh = mesh->get();
    ctx.max_grad_norm = run.max_grad_norm;
    if (run.sequence_parallel) ctx.options["sequence_parallel"] = "true";
    ctx.options["plan"] = "gpt-mini";  // the registered GPT's plan (no config names the model here)
    for (const auto& [k, v] : run.inner_options) ctx.options[k] = v;
    ctx.criterion = [](const Tensor& out, const Batch& b) { return ops::CrossEntropy(out, b.targets); };
    // Built as the training program builds it: without parameter memory when the stack asks
    // (ZeRO-3 below tensor parallelism).
    std::unique_ptr<models::Gpt> built;
    if ((*tp)->wants_deferred_init(ctx)) {
      DeferredInitScope deferred;
      built = std::make_unique<models::Gpt>(SmallGpt());
    } else {
      built = std::make_unique<models::Gpt>(SmallGpt());
    }
    models::Gpt& model = *built;
    EXPECT_EQ((*tp)->wants_deferred_init(ctx), run.sharded_below);
    absl::Status st = (*tp)->Setup(model, optim, ctx);
    ASSERT_TRUE(st.ok()) << st;
    auto released = [&model] {
      int n = 0;
      for (auto& [name, p] : model.NamedParameters()) n += p.has_data() ? 0 : 1;
      return n;
    };
    if (run.sharded_below) EXPECT_GT(released(), 0) << "ZeRO-3 below released no parameter";
    EXPECT_EQ((*tp)->data_parallel_size(), run.data);
    const int dp = (*tp)->data_parallel_rank();
    EXPECT_EQ(dp, rank / run.tensor);
    for (int step = 0; step < run.steps; ++step) {
      auto stats = (*tp)->TrainStep({GptRows(step, dp * run.rows, run.rows)}, CrossEntropyLoss());
      ASSERT_TRUE(stats.ok()) << stats.status();
      // This rank's loss is its data shard's; with one replica it is the global batch's.
      if (run.data == 1) {
        EXPECT_NEAR(stats->loss, want_loss[size_t(step)], 1e-5) << "step " << step;
      }
      EXPECT_NEAR(stats->grad_norm, want_norm[size_t(step)], 1e-5 * want_norm[size_t(step)])
          << "step " << step;
    }
    auto full = (*tp)->FullStateDict();
    ASSERT_TRUE(full.ok()) << full.status();
    std::string worst;
    diff[size_t(rank)] = testing::MaxRelativeDifference(*full, want, &worst);
    EXPECT_LT(diff[size_t(rank)], 1e-5) << "rank " << rank << ", worst " << worst;
  });
  return *std::max_element(diff.begin(), diff.end());
}

// SGD with clipping that binds (the norm is 1.75, 1.0 and 0.98 in the 3 steps, clipped to 0.5;
// TrainAndCompare checks it binds): a wrong norm, or a replicated parameter counted t times,
// changes the update. Tolerance 1e-5 relative: float32 rounding of
// the split sums over 3 steps (seen: about 1e-7).
TEST_F(StrategyTest, Tp2AndTp4AroundSingleEqualOneProcess) {
  for (int t : {2, 4}) {
    TpRun run;
    run.tensor = t;
    run.max_grad_norm = 0.5f;
    EXPECT_LT(TrainAndCompare(run, "single"), 1e-5) << "t = " << t;
  }
}

// Sequence parallelism with accumulation-free SGD, with binding clipping on t = 2 and 4 (the t x d
// run around DDP does not clip): a replicated weight whose partial gradient were not summed
// (LayerNorms, wpe, the row-split biases) would drift.
TEST_F(StrategyTest, SequenceParallelTp2AndTp4EqualOneProcess) {
  for (int t : {2, 4}) {
    TpRun run;
    run.tensor = t;
    run.sequence_parallel = true;
    run.max_grad_norm = 0.5f;
    EXPECT_LT(TrainAndCompare(run, "single"), 1e-5) << "t = " << t;
  }
  TpRun dp;
  dp.tensor = 2;
  dp.data = 2;
  dp.sequence_parallel = true;
  EXPECT_LT(TrainAndCompare(dp, "ddp"), 1e-5);
}

TEST_F(StrategyTest, Tp2TimesDp2AroundDdpEqualsOneProcessOnTheGlobalBatch) {
  TpRun run;
  run.tensor = 2;
  run.data = 2;
  run.max_grad_norm = 0.5f;
  EXPECT_LT(TrainAndCompare(run, "ddp"), 1e-5);
  run.adamw = true;
  EXPECT_LT(TrainAndCompare(run, "ddp"), 1e-5);
}

// ZeRO-3 on the data axis under tensor parallelism: each rank keeps its data shard of its tensor
// slices. The model is built deferred (the stack asks for it) and each split parameter is whole
// only while it is sliced. Same bounds as around DDP; SGD with binding clipping (a norm that
// missed the other shards or slices would clip differently), then AdamW.
TEST_F(StrategyTest, Tp2TimesDp2AroundZero3EqualsOneProcessOnTheGlobalBatch) {
  TpRun run;
  run.tensor = 2;
  run.data = 2;
  run.max_grad_norm = 0.5f;
  run.inner_options = {{"stage", "3"}};
  run.sharded_below = true;
  EXPECT_LT(TrainAndCompare(run, "zero"), 1e-5);
  run.adamw = true;
  EXPECT_LT(TrainAndCompare(run, "zero"), 1e-5);
}

TEST_F(StrategyTest, LoadingFullWeightsKeepsEachRanksSliceAndFullStateDictGathersThem) {
  models::Gpt source(SmallGpt());
  StateDict weights;
  for (auto& [n, p] : source.NamedParameters()) weights[n] = RandomTensor(p.shape(), 77);
  testing::RunRanks(2, [&](int rank, Communicator* comm) {
    auto mesh = DeviceMesh::Create(*comm, {2, 1, 1});
    ASSERT_TRUE(mesh.ok());
    auto tp = Registry::Get().MakeStrategy("tensor_parallel");
    ASSERT_TRUE((*tp)->Wrap(*Registry::Get().MakeStrategy("single")).ok());
    StrategyContext ctx;
    ASSERT_TRUE(HandMeshGroups(**mesh, {{kAxisTensor}, {kAxisData}}, &ctx).ok());
    ctx.mesh = mesh->get();
    ctx.options["plan"] = "gpt-mini";
    models::Gpt model(SmallGpt());
    ASSERT_TRUE((*tp)->Setup(model, testing::GroupedByWeightDecay(false, 0.1f, 0), ctx).ok());
    ASSERT_TRUE((*tp)->LoadFullStateDict(weights).ok());
    auto back = (*tp)->FullStateDict();
    ASSERT_TRUE(back.ok());
    std::string worst;
    EXPECT_EQ(testing::MaxRelativeDifference(*back, weights, &worst), 0.0) << worst;
    StateDict wrong = weights;
    wrong["wte.weight"] = RandomTensor({32, 16}, 1);
    absl::Status st = (*tp)->LoadFullStateDict(wrong);
    EXPECT_THAT(std::string(st.message()), AllOf(HasSubstr("wte.weight"), HasSubstr("[64,16]")));
  });
}

// A head count the tensor size does not divide is refused at Setup, before any step, naming it.
TEST_F(StrategyTest, HeadsTheTensorSizeDoesNotDivideAreRefusedAtStart) {
  config::Sections cfg;
  cfg.mutable_model()->set_name("gpt-mini");  // whose registration carries the plan
  cfg.mutable_model()->set_n_head(3);
  testing::RunRanks(2, [&](int rank, Communicator* comm) {
    auto mesh = DeviceMesh::Create(*comm, {2, 1, 1});
    ASSERT_TRUE(mesh.ok());
    auto tp = Registry::Get().MakeStrategy("tensor_parallel");
    ASSERT_TRUE((*tp)->Wrap(*Registry::Get().MakeStrategy("single")).ok());
    StrategyContext ctx;
    ASSERT_TRUE(HandMeshGroups(**mesh, {{kAxisTensor}, {kAxisData}}, &ctx).ok());
    ctx.mesh = mesh->get();
    ctx.config = &cfg;
    models::Gpt model(SmallGpt());
    absl::Status st = (*tp)->Setup(model, testing::GroupedByWeightDecay(false, 0.1f, 0), ctx);
    EXPECT_THAT(std::string(st.message()),
                HasSubstr("model.n_head (3) is not a multiple of parallel.tensor (2)"));
  });
}

// A model with a loss of its own under a plan whose output is vocab_sharded: the plan would
// replace that loss by the vocabulary-parallel cross-entropy, so Setup refuses on every rank, in
// one line naming the model, the plan's line and what to do. The same model with a plan file
// that leaves the output whole is accepted (its loss is then the one the trainer uses).
TEST_F(StrategyTest, AModelsOwnLossUnderAVocabShardedOutputIsRefusedAtStart) {
  absl::StatusOr<ModelSpec> gpt = Registry::Get().GetModel("gpt-mini");
  ASSERT_TRUE(gpt.ok()) << gpt.status();
  ModelSpec own = *gpt;
  own.is_default = false;
  own.loss = [](const Tensor& out, const Batch& b) { return ops::CrossEntropy(out, b.targets); };
  ASSERT_NE(own.tensor_plan.find("vocab_sharded"), std::string::npos);
  if (!Registry::Get().GetModel("gpt-own-loss").ok()) {
    ASSERT_TRUE(Registry::Get().AddModel("gpt-own-loss", own).ok());
  }
  // GPT's plan without its output line, the head (tied to wte) and wte left whole.
  std::string whole_output;
  for (absl::string_view line : absl::StrSplit(own.tensor_plan, '\n')) {
    if (absl::StrContains(line, "vocab_sharded") || absl::StartsWith(line, "lm_head") ||
        absl::StartsWith(line, "wte ")) {
      continue;
    }
    absl::StrAppend(&whole_output, line, "\n");
  }
  const std::string plan_file = ::testing::TempDir() + "/whole_output.plan";
  {
    std::ofstream out(plan_file);
    out << whole_output;
  }
  config::Sections cfg;
  cfg.mutable_model()->set_name("gpt-own-loss");
  for (bool with_plan_file : {false, true}) {
    if (with_plan_file) cfg.mutable_parallel()->set_tensor_plan(plan_file);
    testing::RunRanks(2, [&](int rank, Communicator* comm) {
      auto mesh = DeviceMesh::Create(*comm, {2, 1, 1});
      ASSERT_TRUE(mesh.ok());
      auto tp = Registry::Get().MakeStrategy("tensor_parallel");
      ASSERT_TRUE((*tp)->Wrap(*Registry::Get().MakeStrategy("single")).ok());
      StrategyContext ctx;
      ASSERT_TRUE(HandMeshGroups(**mesh, {{kAxisTensor}, {kAxisData}}, &ctx).ok());
      ctx.mesh = mesh->get();
      ctx.config = &cfg;
      models::Gpt model(SmallGpt());
      absl::Status st = (*tp)->Setup(model, testing::GroupedByWeightDecay(false, 0.1f, 0), ctx);
      if (with_plan_file) {
        EXPECT_TRUE(st.ok()) << st;
        return;
      }
      EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
      const std::string msg(st.message());
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      EXPECT_THAT(msg, AllOf(HasSubstr("model \"gpt-own-loss\" has a loss of its own"),
                             HasSubstr("plan gpt-own-loss says 'output vocab_sharded'"),
                             HasSubstr("give parallel.tensor_plan a plan without that line")));
    });
  }
}

TEST_F(StrategyTest, SetupWithoutAMeshOrAnInnerStrategySaysWhatToDo) {
  auto tp = Registry::Get().MakeStrategy("tensor_parallel");
  models::Gpt model(SmallGpt());
  StrategyContext ctx;
  absl::Status st = (*tp)->Setup(model, testing::GroupedByWeightDecay(false, 0.1f, 0), ctx);
  EXPECT_THAT(std::string(st.message()), AllOf(HasSubstr("is a layer over another strategy"),
                                               HasSubstr("give that one with Wrap before Setup")));
  ASSERT_TRUE((*tp)->Wrap(*Registry::Get().MakeStrategy("single")).ok());
  st = (*tp)->Setup(model, testing::GroupedByWeightDecay(false, 0.1f, 0), ctx);
  EXPECT_THAT(std::string(st.message()), HasSubstr("parallel { tensor: N }"));
}

}  // namespace
}  // namespace braid::tensor_parallel
