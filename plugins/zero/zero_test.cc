// ZeRO stages 1-3 on N ranks (threads over the in-process communicator) equal one process
// training on the global batch; the real plugin .so is loaded into a program linked like the
// trainer. Multi-process runs over Gloo are in tests/distributed/zero_equivalence_test.sh.
#include <algorithm>
#include <cstdio>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/in_process/in_process_communicator.h"
#include "backends/in_process/run_ranks.h"
#include "core/autograd.h"
#include "core/config/sections.pb.h"
#include "core/deferred_init.h"
#include "core/micro_batches.h"
#include "core/ops.h"
#include "core/optimizer.h"
#include "core/pinned_host.h"
#include "core/plugin.h"
#include "core/registry.h"
#include "core/strategy.h"
#include "core/testing/equivalence.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/gpt/gpt.h"
#include "models/mlp/mlp.h"
#include "third_party/runfiles.h"

namespace braid {
namespace {

using ::bazel::tools::cpp::runfiles::Runfiles;
using ::testing::HasSubstr;
using StateDict = std::map<std::string, Tensor>;

// Parameter counts the world sizes do not divide, so shards are uneven and padded: the MLP's one
// unit has 13*8+8 + 8*5+5 = 157 elements (neither 2 nor 3 divides it); the GPT's units have 710
// (outside the blocks) and 1330 (each block), which 3 does not divide.
std::unique_ptr<Module> MakeMlp(uint64_t seed) {
  models::MlpConfig c;
  c.in = 13;
  c.hidden = 8;
  c.out = 5;
  c.seed = seed;
  return std::make_unique<models::Mlp>(c);
}

std::unique_ptr<Module> MakeGpt(uint64_t seed) {
  models::GptConfig c;
  c.vocab_size = 61;
  c.padded_vocab_size = 61;
  c.block_size = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 10;
  c.seed = seed;
  return std::make_unique<models::Gpt>(c);
}

// Rows [first, first + rows) of step `step`'s global batch, the same for every run.
Batch MlpRows(int step, int first, int rows) {
  std::mt19937 rng(1000u + unsigned(step));
  std::normal_distribution<float> x(0, 1);
  std::vector<float> all_x(size_t(64 * 13));
  std::vector<int32_t> all_y(64);
  for (float& v : all_x) v = x(rng);
  for (int32_t& v : all_y) v = int32_t(rng() % 5);
  return {Tensor::FromVector(std::vector<float>(all_x.begin() + first * 13, all_x.begin() + (first + rows) * 13),
                             {rows, 13}),
          Tensor::FromVector(std::vector<int32_t>(all_y.begin() + first, all_y.begin() + first + rows), {rows})};
}

Batch GptRows(int step, int first, int rows) {
  std::mt19937 rng(2000u + unsigned(step));
  std::vector<int32_t> all(size_t(64 * 9));
  for (int32_t& v : all) v = int32_t(rng() % 61);
  std::vector<int32_t> x, y;
  for (int r = first; r < first + rows; ++r) {
    x.insert(x.end(), all.begin() + r * 9, all.begin() + r * 9 + 8);
    y.insert(y.end(), all.begin() + r * 9 + 1, all.begin() + r * 9 + 9);
  }
  return {Tensor::FromVector(x, {rows, 8}), Tensor::FromVector(y, {rows, 8})};
}

LossFn CrossEntropyLoss() {
  return [](Module& m, const Batch& b) { return ops::CrossEntropy(m(b.inputs), b.targets); };
}

// Weight decay by the parameters' own attribute, as the trainer does.
OptimizerFactory Optim(bool adamw) {
  return testing::GroupedByWeightDecay(adamw, adamw ? 1e-2f : 0.1f, adamw ? 0.1f : 0.0f);
}

struct Spec {
  int stage = 1;
  int ranks = 2;
  int rows = 2;  // per micro-batch
  int accumulation = 1;
  int steps = 4;
  bool gpt = false;
  bool adamw = false;
  float max_grad_norm = 0;
  bool deferred = false;  // build the model under DeferredInitScope (stage 3 asks for it)
  std::map<std::string, std::string> options;  // more strategy options
};

struct Result {
  std::vector<StateDict> state;  // per rank, FullStateDict after training
  std::vector<std::vector<StepStats>> stats;
  std::vector<std::vector<std::pair<std::string, int64_t>>> peaks;
  StateDict reference;
  std::vector<float> reference_loss, reference_norm;
};

class ZeroTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string error;
    std::unique_ptr<Runfiles> rf(Runfiles::CreateForTest(&error));
    ASSERT_NE(rf, nullptr) << error;
    absl::Status st = LoadPlugin(rf->Rlocation("braid/plugins/zero/libbraid_zero.so"), {});
    ASSERT_TRUE(st.ok()) << st;
  }

  static Result Run(const Spec& spec) {
    auto make_model = spec.gpt ? MakeGpt : MakeMlp;
    auto rows = spec.gpt ? GptRows : MlpRows;
    const int per_rank = spec.rows * spec.accumulation;
    Result out;
    // One process on the global batch: every rank's micro-batches, in rank order.
    {
      std::unique_ptr<Module> model = make_model(7);
      std::unique_ptr<Optimizer> opt = Optim(spec.adamw)(model->NamedParameters());
      for (int step = 0; step < spec.steps; ++step) {
        std::vector<Batch> mbs;
        for (int r = 0; r < spec.ranks; ++r) {
          for (int a = 0; a < spec.accumulation; ++a) {
            mbs.push_back(rows(step, r * per_rank + a * spec.rows, spec.rows));
          }
        }
        opt->ZeroGrad();
        StepStats st;
        EXPECT_TRUE(RunMicroBatches("reference", *model, mbs, CrossEntropyLoss(), &st).ok());
        out.reference_norm.push_back(ClipGradNorm(model->Parameters(), spec.max_grad_norm));
        opt->Step();
        out.reference_loss.push_back(st.loss);
      }
      out.reference = model->StateDict();
    }
    out.state.resize(size_t(spec.ranks));
    out.stats.resize(size_t(spec.ranks));
    out.peaks.resize(size_t(spec.ranks));
    testing::RunRanks(spec.ranks, [&](int rank, Communicator* comm) {
      auto made = Registry::Get().MakeStrategy("zero");
      ASSERT_TRUE(made.ok()) << made.status();
      std::unique_ptr<Strategy> zero = std::move(made).value();
      StrategyContext ctx;
      ctx.comm = comm;
      ctx.options = spec.options;
      ctx.options["stage"] = std::to_string(spec.stage);
      ctx.max_grad_norm = spec.max_grad_norm;
      EXPECT_EQ(zero->wants_deferred_init(ctx), spec.stage == 3);
      std::unique_ptr<Module> model;
      if (spec.deferred) {
        DeferredInitScope scope;
        model = make_model(7);
      } else {
        model = make_model(7);
      }
      absl::Status st = zero->Setup(*model, Optim(spec.adamw), ctx);
      ASSERT_TRUE(st.ok()) << st;
      EXPECT_EQ(zero->data_parallel_rank(), rank);
      EXPECT_EQ(zero->data_parallel_size(), spec.ranks);
      for (int step = 0; step < spec.steps; ++step) {
        std::vector<Batch> mbs;
        for (int a = 0; a < spec.accumulation; ++a) {
          mbs.push_back(rows(step, rank * per_rank + a * spec.rows, spec.rows));
        }
        auto stats = zero->TrainStep(mbs, CrossEntropyLoss());
        ASSERT_TRUE(stats.ok()) << stats.status();
        out.stats[size_t(rank)].push_back(*stats);
      }
      auto full = zero->FullStateDict();
      ASSERT_TRUE(full.ok()) << full.status();
      out.state[size_t(rank)] = *full;
      out.peaks[size_t(rank)] = zero->ModelStatePeaks();
    });
    return out;
  }

  // Max |a - b| / (1 + max|b|) over every tensor, naming the worst.
  static double MaxRelDiff(const StateDict& got, const StateDict& want, std::string* worst) {
    return testing::MaxRelativeDifference(got, want, worst);
  }


  static void ExpectMatches(const Spec& spec, const Result& r, double tol) {
    for (int rank = 0; rank < spec.ranks; ++rank) {
      SCOPED_TRACE(absl::StrCat("rank ", rank));
      std::string worst;
      double d = MaxRelDiff(r.state[size_t(rank)], r.reference, &worst);
      std::printf("stage %d, %d rank(s), rank %d: max relative weight difference %.3g (%s)\n",
                  spec.stage, spec.ranks, rank, d, worst.c_str());
      EXPECT_LE(d, tol) << "worst tensor " << worst;
      ASSERT_EQ(r.stats[size_t(rank)].size(), r.reference_loss.size());
      for (size_t s = 0; s < r.reference_loss.size(); ++s) {
        // The mean loss over all ranks equals the reference's; each rank's own is part of it.
        ASSERT_TRUE(std::isfinite(r.reference_norm[s])) << "step " << s;  // else any norm passes
        EXPECT_NEAR(r.stats[size_t(rank)][s].grad_norm, r.reference_norm[s],
                    tol * 10 * std::max(1.0f, r.reference_norm[s]))
            << "step " << s;
      }
    }
    for (size_t s = 0; s < r.reference_loss.size(); ++s) {
      double mean = 0;
      for (int rank = 0; rank < spec.ranks; ++rank) mean += r.stats[size_t(rank)][s].loss;
      mean /= spec.ranks;
      EXPECT_NEAR(mean, r.reference_loss[s], 1e-5 * std::max(1.0f, r.reference_loss[s])) << "step " << s;
    }
  }
};

// SGD shows any scale error (a missing 1/N or 1/k, a shard counted twice); AdamW would hide a
// constant factor. 1e-7 relative: float32 sums over differently ordered reductions of a few
// hundred terms (measured at most 3e-8).
TEST_F(ZeroTest, EveryStageOnTwoAndThreeRanksEqualsOneProcessWithSgd) {
  for (bool gpt : {false, true}) {
    for (int stage : {1, 2, 3}) {
      for (int ranks : {2, 3}) {
        SCOPED_TRACE(absl::StrCat(gpt ? "gpt" : "mlp", " stage ", stage, " ranks ", ranks));
        Spec spec;
        spec.gpt = gpt;
        spec.stage = stage;
        spec.ranks = ranks;
        spec.deferred = stage == 3;
        ExpectMatches(spec, Run(spec), 1e-7);
      }
    }
  }
}

TEST_F(ZeroTest, AccumulationAndClippingWithSgd) {
  for (int stage : {1, 2, 3}) {
    SCOPED_TRACE(absl::StrCat("stage ", stage));
    Spec spec;
    spec.gpt = true;
    spec.stage = stage;
    spec.ranks = 3;
    spec.accumulation = 2;
    spec.max_grad_norm = 0.05f;  // below the gradients' norm: clipping is active every step
    spec.deferred = stage == 3;
    Result r = Run(spec);
    for (float n : r.reference_norm) EXPECT_GT(n, spec.max_grad_norm);
    ExpectMatches(spec, r, 1e-7);
  }
}

// AdamW divides by the running gradient magnitude, so rounding-sized gradient differences turn
// into lr-sized steps for near-zero gradients: a looser bound (measured 7e-6 after 4 steps).
TEST_F(ZeroTest, AdamWOnThreeRanks) {
  for (int stage : {1, 2, 3}) {
    SCOPED_TRACE(absl::StrCat("stage ", stage));
    Spec spec;
    spec.gpt = true;
    spec.adamw = true;
    spec.stage = stage;
    spec.ranks = 3;
    spec.accumulation = 2;
    spec.deferred = stage == 3;
    ExpectMatches(spec, Run(spec), 2e-5);
  }
}

// One rank is plain single-process training: bit for bit (AdamW and clipping included).
TEST_F(ZeroTest, OneRankEqualsOneProcessExactly) {
  for (int stage : {1, 2, 3}) {
    SCOPED_TRACE(absl::StrCat("stage ", stage));
    Spec spec;
    spec.gpt = true;
    spec.adamw = true;
    spec.stage = stage;
    spec.ranks = 1;
    spec.accumulation = 2;
    spec.max_grad_norm = 0.05f;
    spec.deferred = stage == 3;
    Result r = Run(spec);
    std::string worst;
    EXPECT_EQ(MaxRelDiff(r.state[0], r.reference, &worst), 0.0) << worst;
    for (size_t s = 0; s < r.reference_loss.size(); ++s) {
      EXPECT_EQ(r.stats[0][s].loss, r.reference_loss[s]);
    }
  }
}

// Deferred initialisation gives each stage-3 rank exactly the values a full initialisation
// gives: after zero steps, the gathered state equals the model built whole.
TEST_F(ZeroTest, DeferredInitialisationEqualsFullInitialisation) {
  Spec spec;
  spec.gpt = true;
  spec.stage = 3;
  spec.ranks = 3;
  spec.steps = 0;
  spec.deferred = true;
  Result r = Run(spec);
  for (int rank = 0; rank < 3; ++rank) {
    std::string worst;
    EXPECT_EQ(MaxRelDiff(r.state[size_t(rank)], r.reference, &worst), 0.0) << worst;
  }
}

int64_t Peak(const std::vector<std::pair<std::string, int64_t>>& peaks, const std::string& kind) {
  for (auto& [k, v] : peaks) {
    if (k == kind) return v;
  }
  ADD_FAILURE() << "no peak for " << kind;
  return -1;
}

// Stage 3 never holds more full parameters than its shards plus the documented transient: the
// units in use at once, here the parameters outside the blocks (embeddings, final norm: used
// from the first layer to the head) and one block, plus the next block when prefetching.
TEST_F(ZeroTest, StageThreeHoldsShardsPlusTwoUnits) {
  Spec spec;
  spec.gpt = true;
  spec.stage = 3;
  spec.ranks = 3;
  spec.steps = 2;
  spec.deferred = true;
  spec.options["prefetch_elements"] = "0";
  Result r = Run(spec);
  spec.options["prefetch_elements"] = "-1";
  Result prefetching = Run(spec);
  std::unique_ptr<Module> m = MakeGpt(7);
  int64_t total = 0, outside = 0, block = 0;
  for (auto& [n, p] : m->NamedParameters()) {
    total += p.numel();
    if (n.rfind("h.", 0) == 0) {
      if (n.rfind("h.0.", 0) == 0) block += p.numel();
    } else {
      outside += p.numel();
    }
  }
  auto padded = [](int64_t n) { return (n + 2) / 3 * 3; };
  const int64_t shards = (2 * padded(block) + padded(outside)) / 3 * 4;
  const int64_t bound = shards + (padded(outside) + padded(block)) * 4;
  for (int rank = 0; rank < 3; ++rank) {
    int64_t p = Peak(r.peaks[size_t(rank)], "parameters");
    EXPECT_EQ(p, bound) << "rank " << rank;
    EXPECT_LT(p, total * 4) << "stage 3 should never hold the whole model";
    EXPECT_EQ(Peak(prefetching.peaks[size_t(rank)], "parameters"), bound + padded(block) * 4)
        << "rank " << rank << ": prefetching holds the next block too";
  }
  // Stage 2 holds full parameters but only gradient shards (plus one unit's transient buffer).
  spec.stage = 2;
  spec.deferred = false;
  Result r2 = Run(spec);
  EXPECT_EQ(Peak(r2.peaks[0], "parameters"), (2 * padded(block) + padded(outside)) * 4);
  EXPECT_EQ(Peak(r2.peaks[0], "gradients"), shards);
  // Stage 1 holds the full gradients, the reduced shard written over its own slice of them.
  spec.stage = 1;
  Result r1 = Run(spec);
  EXPECT_EQ(Peak(r1.peaks[0], "gradients"), (2 * padded(block) + padded(outside)) * 4);
}

// ZeRO-Offload: the optimizer steps host copies; the result is the same computation.
TEST_F(ZeroTest, OffloadedOptimizerGivesTheSameTraining) {
  for (int stage : {1, 2, 3}) {
    for (bool adamw : {false, true}) {
      SCOPED_TRACE(absl::StrCat("stage ", stage, adamw ? " AdamW" : " SGD"));
      Spec spec;
      spec.gpt = true;
      spec.adamw = adamw;
      spec.stage = stage;
      spec.ranks = 3;
      spec.accumulation = 2;
      spec.max_grad_norm = 0.05f;
      spec.deferred = stage == 3;
      spec.options["offload_optimizer"] = "cpu";
      Result r = Run(spec);
      ExpectMatches(spec, r, adamw ? 2e-5 : 1e-7);
      EXPECT_GT(Peak(r.peaks[0], "optimizer state (host)"), 0);
      EXPECT_GT(Peak(r.peaks[0], "host copies of shards"), 0);
    }
  }
  // One rank: bit for bit what one process computes.
  Spec one;
  one.gpt = true;
  one.adamw = true;
  one.stage = 2;
  one.ranks = 1;
  one.max_grad_norm = 0.05f;
  one.options["offload_optimizer"] = "cpu";
  Result r = Run(one);
  std::string worst;
  EXPECT_EQ(MaxRelDiff(r.state[0], r.reference, &worst), 0.0) << worst;
}

// ZeRO-Infinity's parameter offload: the shards live in host memory and are copied to the
// device per unit for its all-gather; the optimizer steps them there. The same computation, so
// the same bounds as the optimizer offload: 1e-7 with SGD, 2e-5 with AdamW (above), with and
// without offload_optimizer and the prefetch.
TEST_F(ZeroTest, OffloadedParametersGiveTheSameTraining) {
  for (bool adamw : {false, true}) {
    for (const char* optimizer_offload : {"none", "cpu"}) {
      for (const char* prefetch : {"0", "-1"}) {
        SCOPED_TRACE(absl::StrCat(adamw ? "AdamW" : "SGD", ", offload_optimizer ", optimizer_offload,
                                  ", prefetch_elements ", prefetch));
        Spec spec;
        spec.gpt = true;
        spec.adamw = adamw;
        spec.stage = 3;
        spec.ranks = 3;
        spec.accumulation = 2;
        spec.max_grad_norm = 0.05f;
        spec.deferred = true;
        spec.options["offload_param"] = "cpu";
        spec.options["offload_optimizer"] = optimizer_offload;
        spec.options["prefetch_elements"] = prefetch;
        Result r = Run(spec);
        ExpectMatches(spec, r, adamw ? 2e-5 : 1e-7);
        EXPECT_GT(Peak(r.peaks[0], "optimizer state (host)"), 0);
      }
    }
  }
  // One rank: bit for bit what one process computes.
  Spec one;
  one.gpt = true;
  one.adamw = true;
  one.stage = 3;
  one.ranks = 1;
  one.max_grad_norm = 0.05f;
  one.deferred = true;
  one.options["offload_param"] = "cpu";
  Result r = Run(one);
  std::string worst;
  EXPECT_EQ(MaxRelDiff(r.state[0], r.reference, &worst), 0.0) << worst;
}

// What a rank holds with offload_param, against the formula: on the device, no shard between
// uses: the units in use (the parameters outside the blocks and one block, plus the next block
// when prefetching) and the device-side copy of the shard being gathered; on the host, this
// rank's shards (1/N of the padded model) and a copy of their gradients for the optimizer.
TEST_F(ZeroTest, OffloadedParametersLeaveTheDeviceOnlyTheUnitsInUse) {
  std::unique_ptr<Module> m = MakeGpt(7);
  int64_t outside = 0, block = 0;
  for (auto& [n, p] : m->NamedParameters()) {
    if (n.rfind("h.", 0) != 0) outside += p.numel();
    if (n.rfind("h.0.", 0) == 0) block += p.numel();
  }
  auto padded = [](int64_t n) { return (n + 2) / 3 * 3; };
  const int64_t shards = (2 * padded(block) + padded(outside)) / 3 * 4;  // bytes per rank
  Spec spec;
  spec.gpt = true;
  spec.stage = 3;
  spec.ranks = 3;
  spec.steps = 2;
  spec.deferred = true;
  spec.options["offload_param"] = "cpu";
  for (const char* prefetch : {"0", "-1"}) {
    SCOPED_TRACE(absl::StrCat("prefetch_elements ", prefetch));
    spec.options["prefetch_elements"] = prefetch;
    Result r = Run(spec);
    const int64_t blocks_in_use = std::string(prefetch) == "0" ? 1 : 2;
    const int64_t device = (padded(outside) + blocks_in_use * padded(block) + padded(block) / 3) * 4;
    for (int rank = 0; rank < 3; ++rank) {
      EXPECT_EQ(Peak(r.peaks[size_t(rank)], "parameters"), device) << "rank " << rank;
      EXPECT_EQ(Peak(r.peaks[size_t(rank)], "parameter shards (host)"), shards) << "rank " << rank;
      const int64_t grads = Peak(r.peaks[size_t(rank)], "gradient copies (host)");
      EXPECT_GT(grads, 0);
      EXPECT_LE(grads, shards) << "the real elements of this rank's shards, no padding";
    }
  }
}

// pin_memory is honoured: where the training device's backend offers page-locked memory (a
// fake one for the CPU here; CUDA's cudaHostAlloc in a GPU build), the host shards and the
// optimizer's host tensors are allocated from it; without pin_memory they are not.
TEST_F(ZeroTest, PinMemoryPutsTheOffloadedStateInPinnedMemory) {
  class CountingPinned final : public Allocator {
   public:
    void* Allocate(size_t bytes) override {
      RecordAlloc(bytes);
      return std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    }
    void Deallocate(void* p, size_t bytes) override {
      RecordFree(bytes);
      std::free(p);
    }
  };
  RegisterPinnedHostAllocator(DeviceType::kCPU, [](Device) { return std::make_unique<CountingPinned>(); });
  Spec spec;
  spec.gpt = true;
  spec.adamw = true;
  spec.stage = 3;
  spec.ranks = 2;
  spec.steps = 2;
  spec.deferred = true;
  spec.options["offload_param"] = "cpu";
  spec.options["pin_memory"] = "false";
  Run(spec);
  EXPECT_NE(OffloadHost(Device::CPU(), true), Device::Host());
  const int64_t before = GetMemoryStats(PinnedHost()).num_allocs;
  EXPECT_EQ(before, 0) << "nothing pinned without pin_memory";
  spec.options["pin_memory"] = "true";
  Result r = Run(spec);
  ExpectMatches(spec, r, 2e-5);
  EXPECT_GT(GetMemoryStats(PinnedHost()).num_allocs, 0);
  // Both ranks' shards and gradient copies are pinned (the ranks are threads of one process).
  int64_t offloaded = 0;
  for (int rank = 0; rank < 2; ++rank) {
    offloaded += Peak(r.peaks[size_t(rank)], "parameter shards (host)") +
                 Peak(r.peaks[size_t(rank)], "gradient copies (host)");
  }
  EXPECT_GE(GetMemoryStats(PinnedHost()).peak_bytes, offloaded);
  RegisterPinnedHostAllocator(DeviceType::kCPU, nullptr);  // the other tests run pageable
}

// Units small enough to stay gathered (stage3_param_persistence_threshold) are gathered again
// after each step, so they train like the others (with the shards on the host too).
TEST_F(ZeroTest, PersistentUnitsSeeEveryStep) {
  for (const char* offload : {"none", "cpu"}) {
    SCOPED_TRACE(absl::StrCat("offload_param ", offload));
    Spec spec;
    spec.gpt = true;
    spec.stage = 3;
    spec.ranks = 2;
    spec.deferred = true;
    spec.options["param_persistence_threshold"] = "1000";  // the parameters outside the blocks
    spec.options["offload_param"] = offload;
    ExpectMatches(spec, Run(spec), 1e-7);
  }
}

// Stage 3 prefetching (from the second step on, once the order units are used in is known)
// changes when parameters arrive, never their values; and it holds one more unit at a time.
TEST_F(ZeroTest, PrefetchChangesTimingNotResults) {
  Spec spec;
  spec.gpt = true;
  spec.adamw = true;
  spec.stage = 3;
  spec.ranks = 2;
  spec.deferred = true;
  spec.options["prefetch_elements"] = "0";
  Result off = Run(spec);
  spec.options["prefetch_elements"] = "-1";
  Result on = Run(spec);
  for (int rank = 0; rank < 2; ++rank) {
    std::string worst;
    EXPECT_EQ(MaxRelDiff(on.state[size_t(rank)], off.state[size_t(rank)], &worst), 0.0) << worst;
    EXPECT_GT(Peak(on.peaks[size_t(rank)], "parameters"), Peak(off.peaks[size_t(rank)], "parameters"));
  }
  ExpectMatches(spec, on, 2e-5);
}

// Full weights (e.g. --init_from) go into the shards: gathering them back gives them unchanged.
TEST_F(ZeroTest, LoadedFullWeightsGatherBackUnchanged) {
  std::unique_ptr<Module> source = MakeGpt(99);  // other values than the ranks' own init
  StateDict want = source->StateDict();
  for (int stage : {1, 2, 3}) {
    SCOPED_TRACE(absl::StrCat("stage ", stage));
    std::vector<std::unique_ptr<Communicator>> group = MakeInProcessGroup(3);
    std::vector<std::thread> threads;
    std::vector<StateDict> got(3);
    for (int rank = 0; rank < 3; ++rank) {
      threads.emplace_back([&, rank] {
        auto zero = Registry::Get().MakeStrategy("zero");
        ASSERT_TRUE(zero.ok());
        StrategyContext ctx;
        ctx.comm = group[size_t(rank)].get();
        ctx.options["stage"] = std::to_string(stage);
        ctx.options["offload_optimizer"] = "cpu";  // the host copies must follow too
        std::unique_ptr<Module> model;
        {
          DeferredInitScope scope;
          model = MakeGpt(7);
        }
        ASSERT_TRUE((*zero)->Setup(*model, Optim(false), ctx).ok());
        ASSERT_TRUE((*zero)->LoadFullStateDict(want).ok());
        auto full = (*zero)->FullStateDict();
        ASSERT_TRUE(full.ok()) << full.status();
        got[size_t(rank)] = *full;
        // A missing name is refused, naming it.
        StateDict partial = want;
        partial.erase("h.1.mlp.c_fc.bias");
        absl::Status st = (*zero)->LoadFullStateDict(partial);
        EXPECT_THAT(std::string(st.message()), HasSubstr("h.1.mlp.c_fc.bias"));
      });
    }
    for (auto& t : threads) t.join();
    for (int rank = 0; rank < 3; ++rank) {
      std::string worst;
      EXPECT_EQ(MaxRelDiff(got[size_t(rank)], want, &worst), 0.0) << worst;
    }
  }
}

TEST_F(ZeroTest, BadOptionsAreRefusedNamingThem) {
  std::vector<std::unique_ptr<Communicator>> group = MakeInProcessGroup(1);
  for (auto [key, value, want] :
       {std::tuple<std::string, std::string, std::string>{"stage", "4", "ZeRO stage 4 is not 1, 2 or 3"},
        {"stage", "x", "option stage='x'"},
        {"bucket", "1", "unknown option 'bucket'"},
        {"offload_optimizer", "nvme", "option offload_optimizer='nvme' is not cpu or none"},
        {"offload_param", "cpu", "offload_param needs stage 3 (stage 1 keeps full parameters"},
        {"pin_memory", "yes", "option pin_memory='yes' is not true or false"}}) {
    auto zero = Registry::Get().MakeStrategy("zero");
    ASSERT_TRUE(zero.ok());
    StrategyContext ctx;
    ctx.comm = group[0].get();
    ctx.options[key] = value;
    if (key != "stage") ctx.options["stage"] = "1";
    std::unique_ptr<Module> model = MakeMlp(1);
    absl::Status st = (*zero)->Setup(*model, Optim(false), ctx);
    EXPECT_THAT(std::string(st.message()), HasSubstr(want));
  }
  // DeepSpeed settings Braid lacks are errors, not ignored.
  config::Sections cfg;
  cfg.mutable_zero_optimization()->set_stage(2);
  cfg.mutable_zero_optimization()->set_reduce_scatter(false);
  auto zero = Registry::Get().MakeStrategy("zero");
  ASSERT_TRUE(zero.ok());
  StrategyContext ctx;
  ctx.comm = group[0].get();
  ctx.config = &cfg;
  std::unique_ptr<Module> model = MakeMlp(1);
  absl::Status st = (*zero)->Setup(*model, Optim(false), ctx);
  EXPECT_THAT(std::string(st.message()), HasSubstr("reduce_scatter: false not supported"));
}

}  // namespace
}  // namespace braid
