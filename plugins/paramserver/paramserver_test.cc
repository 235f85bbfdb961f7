// Loads libbraid_paramserver.so the way the trainer does and runs it on ranks that are threads of
// this process (the in-process communicator), on the CPU backend. The reference for "same result"
// is one process stepping the same optimizer on the concatenation of the workers' micro-batches,
// driven by hand.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "backends/in_process/in_process_communicator.h"
#include "core/ops.h"
#include "core/optimizer.h"
#include "core/plugin.h"
#include "core/registry.h"
#include "core/strategy.h"
#include "core/testing/compare.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plugins/paramserver/paramserver_stats.h"
#include "third_party/runfiles.h"

namespace braid {
namespace {

using ::bazel::tools::cpp::runfiles::Runfiles;
using paramserver::ParamServerIntrospection;
using paramserver::ParamServerStats;
using ::testing::AllOf;
using ::testing::HasSubstr;
using StateDict = std::map<std::string, Tensor>;

constexpr int64_t kIn = 4, kHidden = 8, kOut = 3;

// in -> hidden (tanh) -> out, initialised from `seed` so that ranks can start different.
class TinyMlp : public Module {
 public:
  explicit TinyMlp(int seed) : Module("TinyMlp") {
    auto values = [seed](int64_t n, float scale, int salt) {
      std::vector<float> v;
      for (int64_t i = 0; i < n; ++i) {
        v.push_back(scale * std::sin(1.3f * float(i) + 0.7f * float(seed) + 0.1f * float(salt)));
      }
      return v;
    };
    w1_ = RegisterParameter("fc1.weight",
                            Tensor::FromVector(values(kHidden * kIn, 0.5f, 1), {kHidden, kIn}));
    b1_ = RegisterParameter("fc1.bias", Tensor::FromVector(values(kHidden, 0.1f, 2), {kHidden}));
    w2_ = RegisterParameter("fc2.weight",
                            Tensor::FromVector(values(kOut * kHidden, 0.4f, 3), {kOut, kHidden}));
    b2_ = RegisterParameter("fc2.bias", Tensor::FromVector(values(kOut, 0.1f, 4), {kOut}));
  }
  Tensor Forward(const Tensor& x) override {
    return ops::Linear(ops::Tanh(ops::Linear(x, w1_, b1_)), w2_, b2_);
  }

 private:
  Tensor w1_, b1_, w2_, b2_;
};

Tensor MseLoss(Module& model, const Batch& batch) {
  Tensor d = ops::Sub(model(batch.inputs), batch.targets);
  return ops::Mean(ops::Mul(d, d));
}

// Rows [first, first + rows) of step `step`'s data: inputs in [-1, 1], targets a fixed smooth
// function of them (learnable by the MLP).
Batch Rows(int step, int first, int rows) {
  std::vector<float> x, y;
  for (int r = first; r < first + rows; ++r) {
    float in[kIn];
    for (int c = 0; c < kIn; ++c) {
      in[c] = std::sin(0.37f * float(step * 101 + r * 7 + c * 3) + 0.5f);
      x.push_back(in[c]);
    }
    for (int o = 0; o < kOut; ++o) {
      float t = 0;
      for (int c = 0; c < kIn; ++c) t += std::cos(float(o + 2 * c)) * in[c];
      y.push_back(0.8f * std::tanh(t));
    }
  }
  return Batch{Tensor::FromVector(x, {rows, kIn}), Tensor::FromVector(y, {rows, kOut})};
}

std::unique_ptr<Optimizer> MakeOptimizer(const Module::NamedTensors& named) {
  std::vector<Tensor> params;
  for (const auto& [n, p] : named) params.push_back(p);
  return MakeAdamW({ParamGroup{params, 0.02f, 0.01f}});
}

// Runs fn(rank, comm) on one thread per rank; returns each rank's status.
std::vector<absl::Status> RunRanks(
    int n, const std::function<absl::Status(int rank, Communicator& comm)>& fn) {
  std::vector<std::unique_ptr<Communicator>> comms = MakeInProcessGroup(n, "paramserver_test");
  for (auto& c : comms) c->set_timeout(absl::Seconds(60));
  std::vector<absl::Status> statuses(size_t(n), absl::OkStatus());
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] { statuses[size_t(r)] = fn(r, *comms[size_t(r)]); });
  }
  for (auto& t : threads) t.join();
  return statuses;
}

ParamServerStats StatsOf(Strategy& s) {
  auto* ps = dynamic_cast<ParamServerIntrospection*>(&s);
  BRAID_CHECK(ps != nullptr) << "the paramserver strategy does not implement its introspection";
  return ps->Stats();
}

std::vector<float> Flat(const StateDict& state) {
  std::vector<float> out;
  for (const auto& [name, t] : state) {
    std::vector<float> v = t.ToFloatVector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

class ParamServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string error;
    std::unique_ptr<Runfiles> runfiles(Runfiles::CreateForTest(&error));
    ASSERT_NE(runfiles, nullptr) << error;
    absl::Status s =
        LoadPlugin(runfiles->Rlocation("braid/plugins/paramserver/libbraid_paramserver.so"), {});
    ASSERT_TRUE(s.ok()) << s;
  }

  static std::unique_ptr<Strategy> Make() {
    absl::StatusOr<std::unique_ptr<Strategy>> made = Registry::Get().MakeStrategy("paramserver");
    BRAID_CHECK(made.ok()) << made.status();
    return *std::move(made);
  }
};

// ---- Sync: one server and two workers equal one process on the concatenated batch -----------

struct SyncCase {
  const char* name;
  int server_rank;
  bool sgd;  // SGD with momentum instead of AdamW
  float max_grad_norm;
};
void PrintTo(const SyncCase& c, std::ostream* os) { *os << c.name; }

std::unique_ptr<Optimizer> MakeSgdOptimizer(const Module::NamedTensors& named) {
  std::vector<Tensor> params;
  for (const auto& [n, p] : named) params.push_back(p);
  SgdOptions o;
  o.momentum = 0.9f;
  return MakeSgd({ParamGroup{params, 0.1f, 0.01f}}, o);
}

class SyncTest : public ParamServerTest, public ::testing::WithParamInterface<SyncCase> {};

TEST_P(SyncTest, EqualsSingleProcessOnTheWorkersConcatenatedBatch) {
  const SyncCase c = GetParam();
  const int server = c.server_rank, world = 3, steps = 5;
  const OptimizerFactory make_optimizer =
      c.sgd ? OptimizerFactory(MakeSgdOptimizer) : OptimizerFactory(MakeOptimizer);
  // lr changes every step, set on every rank as the trainer does: only the server's may count.
  auto lr_at = [&c](int step) { return (c.sgd ? 0.1f : 0.02f) * (1.0f + 0.5f * float(step)); };

  // Per rank and step: the rank's parameters after the step, and what it reported.
  std::vector<std::vector<std::vector<float>>> params(world);
  std::vector<std::vector<StepStats>> reported(world);
  std::vector<StateDict> final_state(world);
  std::vector<ParamServerStats> stats(world);
  std::vector<absl::Status> st = RunRanks(world, [&](int rank, Communicator& comm) {
    TinyMlp model(/*seed=*/100 + rank);  // only the server's initial values may survive Setup
    std::unique_ptr<Strategy> strategy = Make();
    StrategyContext ctx;
    ctx.comm = &comm;
    ctx.max_grad_norm = c.max_grad_norm;
    ctx.options["mode"] = "sync";
    if (server != 0) ctx.options["server_rank"] = std::to_string(server);
    BRAID_RETURN_IF_ERROR(strategy->Setup(model, make_optimizer, ctx));
    // Worker w (0-based among the workers) has rows [4w, 4w + 4) as two micro-batches of 2.
    const int w = rank < server ? rank : rank - 1;
    // The trainer shards the data by these: the workers alone are the data-parallel group (the
    // server reads worker 0's share and ignores it), so W workers read what W DDP ranks read.
    if (strategy->data_parallel_size() != world - 1 ||
        strategy->data_parallel_rank() != (rank == server ? 0 : w)) {
      return absl::InternalError(absl::StrCat(
          "data-parallel place ", strategy->data_parallel_rank(), " of ",
          strategy->data_parallel_size(), "; want ", rank == server ? 0 : w, " of ", world - 1));
    }
    for (int step = 0; step < steps; ++step) {
      std::vector<Batch> micro;
      if (rank != server) micro = {Rows(step, 4 * w, 2), Rows(step, 4 * w + 2, 2)};
      strategy->optimizer()->SetLearningRate(lr_at(step));
      BRAID_ASSIGN_OR_RETURN(StepStats s, strategy->TrainStep(micro, MseLoss));
      reported[rank].push_back(s);
      params[rank].push_back(Flat(model.StateDict()));
    }
    BRAID_ASSIGN_OR_RETURN(final_state[rank], strategy->FullStateDict());
    stats[rank] = StatsOf(*strategy);
    return absl::OkStatus();
  });
  for (int r = 0; r < world; ++r) ASSERT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];

  TinyMlp reference(/*seed=*/100 + server);
  std::unique_ptr<Optimizer> opt = make_optimizer(reference.NamedParameters());
  const std::vector<float> initial = Flat(reference.StateDict());
  int clipped = 0;
  double worst_norm = 0, worst_worker_norm = 0, worst_loss = 0, worst_param = 0;
  for (int step = 0; step < steps; ++step) {
    // Each worker reports the norm of its own gradient: that of the mean loss over its 4 rows,
    // at the parameters before the step.
    for (int r = 0; r < world; ++r) {
      if (r == server) continue;
      const int w = r < server ? r : r - 1;
      TinyMlp probe(/*seed=*/0);
      ASSERT_TRUE(probe.LoadStateDict(reference.StateDict()).ok());
      MseLoss(probe, Rows(step, 4 * w, 4)).Backward();
      const float want = ClipGradNorm(probe.Parameters(), 0.0f);
      worst_worker_norm = testing::Worst(
          worst_worker_norm, std::fabs(double(reported[r][step].grad_norm) - want) / want);
    }
    opt->SetLearningRate(lr_at(step));
    opt->ZeroGrad();
    Tensor loss = MseLoss(reference, Rows(step, 0, 8));
    loss.Backward();
    // Reported whether or not clipping is on (ClipGradNorm with 0 only measures).
    const float norm = ClipGradNorm(reference.Parameters(), c.max_grad_norm);
    ASSERT_GT(norm, 0.0f);
    clipped += c.max_grad_norm > 0 && norm > c.max_grad_norm;
    worst_norm = testing::Worst(
        worst_norm, std::fabs(double(reported[server][step].grad_norm) - norm) / norm);
    opt->Step();
    worst_loss =
        testing::Worst(worst_loss, std::fabs(double(reported[server][step].loss) - loss.item()));
    std::vector<float> want = Flat(reference.StateDict());
    ASSERT_EQ(params[server][step].size(), want.size());
    // testing::Worst, not std::max: a NaN (a NaN or inf on either side) must not be dropped.
    for (size_t i = 0; i < want.size(); ++i) {
      const double d =
          std::fabs(params[server][step][i] - want[i]) / std::max(1.0f, std::fabs(want[i]));
      worst_param = testing::Worst(worst_param, d);
    }
    // A worker holds exactly the server's parameters once its step returns.
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(params[r][step], params[server][step]) << "rank " << r << ", step " << step;
    }
  }
  std::printf("%s: worst |parameter diff| %.3g (relative above 1), |loss diff| %.3g, relative "
              "grad_norm diff %.3g (server), %.3g (workers)\n",
              c.name, worst_param, worst_loss, worst_norm, worst_worker_norm);
  // Only f32 rounding separates the two (the mean of two workers' gradients against one
  // backward over their rows). Measured over the four cases: parameters 8.9e-8 (AdamWClipped;
  // AdamW's amplification of rounding in tiny gradient elements stays at that level on this
  // small model), losses 6e-8, norms 1.6e-7 relative; each bound is about 3x that. A wrong
  // scale, a missing worker or a stale gradient is orders of magnitude larger.
  EXPECT_LE(worst_param, 3e-7);
  EXPECT_LE(worst_loss, 2e-7);
  EXPECT_LE(worst_norm, 5e-7);
  EXPECT_LE(worst_worker_norm, 5e-7);
  // Clipping, when on, acted on some steps and not on others.
  if (c.max_grad_norm > 0) {
    EXPECT_GT(clipped, 0);
    EXPECT_LT(clipped, steps);
  }
  // The comparison is not between untouched models.
  EXPECT_NE(params[server].back(), initial);
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(Flat(final_state[r]), params[server].back()) << "FullStateDict of rank " << r;
    EXPECT_EQ(stats[r].version, steps) << "rank " << r;
    EXPECT_EQ(stats[r].max_steps_ahead, 0) << "rank " << r;
    EXPECT_EQ(stats[r].is_server, r == server);
  }
  EXPECT_EQ(stats[server].gradients_applied, steps);
  EXPECT_EQ(stats[server].max_version_lag, 0);
}

// AdamW is blind to a constant scale of the gradient; SGD and the clipped norm are not, so
// together they also catch a sum where a mean is due.
INSTANTIATE_TEST_SUITE_P(Cases, SyncTest,
                         ::testing::Values(SyncCase{"AdamW", 0, false, 0.0f},
                                           SyncCase{"AdamWServerLast", 2, false, 0.0f},
                                           SyncCase{"AdamWClipped", 1, false, 0.6f},
                                           SyncCase{"SgdMomentum", 0, true, 0.0f}),
                         [](const ::testing::TestParamInfo<SyncCase>& info) {
                           return std::string(info.param.name);
                         });

// ---- Async: trains, and never runs past the staleness bound ---------------------------------

// A worker's view of the network in which every reply arrives as late as the protocol allows:
// the Work of a receive reports completion only once the worker has blocked in Wait() for it, so
// polling (IsCompleted) never finds a reply early. The worker then never refreshes its parameters
// before it must, and runs exactly max_staleness steps ahead of them, every time and on any
// machine, instead of relying on another worker being slowed down by a sleep. Everything else is
// passed through unchanged.
class RepliesSeenOnlyWhenWaitedFor final : public Communicator {
 public:
  explicit RepliesSeenOnlyWhenWaitedFor(Communicator* inner) : inner_(inner) {
    set_timeout(inner->timeout());
  }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string name() const override { return inner_->name(); }
  std::shared_ptr<Work> AllReduce(Tensor& t, ReduceOp op) override {
    return inner_->AllReduce(t, op);
  }
  std::shared_ptr<Work> ReduceScatter(const Tensor& input, Tensor& output, ReduceOp op,
                                      const std::vector<int64_t>& counts) override {
    return inner_->ReduceScatter(input, output, op, counts);
  }
  std::shared_ptr<Work> AllGather(const Tensor& input, Tensor& output,
                                  const std::vector<int64_t>& counts) override {
    return inner_->AllGather(input, output, counts);
  }
  std::shared_ptr<Work> Broadcast(Tensor& t, int root) override {
    return inner_->Broadcast(t, root);
  }
  std::shared_ptr<Work> Reduce(Tensor& t, int root, ReduceOp op) override {
    return inner_->Reduce(t, root, op);
  }
  std::shared_ptr<Work> Send(const Tensor& t, int dst, int tag) override {
    return inner_->Send(t, dst, tag);
  }
  std::shared_ptr<Work> Recv(Tensor& t, int src, int tag) override {
    return std::make_shared<SeenWhenWaited>(inner_->Recv(t, src, tag));
  }
  std::shared_ptr<Work> Barrier() override { return inner_->Barrier(); }
  absl::StatusOr<std::unique_ptr<Communicator>> NewGroup(const std::vector<int>& ranks) override {
    return inner_->NewGroup(ranks);
  }

 private:
  class SeenWhenWaited final : public Work {
   public:
    explicit SeenWhenWaited(std::shared_ptr<Work> inner) : inner_(std::move(inner)) {}
    absl::Status Wait() override {
      waited_ = true;
      return inner_->Wait();
    }
    bool IsCompleted() override { return waited_ && inner_->IsCompleted(); }

   private:
    std::shared_ptr<Work> inner_;
    bool waited_ = false;  // the worker's own thread only
  };
  Communicator* inner_;
};

class AsyncTest : public ParamServerTest, public ::testing::WithParamInterface<int> {};

TEST_P(AsyncTest, TrainsWithinTheStalenessBound) {
  const int max_staleness = GetParam(), world = 3, steps = 40, workers = world - 1;
  // Held-out rows, never trained on.
  const Batch held_out = Rows(1000, 0, 64);
  auto held_out_loss = [&](Module& m) { return MseLoss(m, held_out).item(); };

  float before = 0, after = 0;
  std::vector<StateDict> final_state(world);
  std::vector<ParamServerStats> stats(world);
  std::vector<absl::Status> st = RunRanks(world, [&](int rank, Communicator& comm) {
    TinyMlp model(/*seed=*/7);
    if (rank == 0) before = held_out_loss(model);
    std::unique_ptr<Strategy> strategy = Make();
    // The server (rank 0) polls for pushes as they come; the workers see replies late.
    RepliesSeenOnlyWhenWaitedFor late_replies(&comm);
    StrategyContext ctx;
    ctx.comm = rank == 0 ? &comm : static_cast<Communicator*>(&late_replies);
    ctx.options = {{"mode", "async"}, {"max_staleness", std::to_string(max_staleness)}};
    BRAID_RETURN_IF_ERROR(strategy->Setup(model, MakeOptimizer, ctx));
    for (int step = 0; step < steps; ++step) {
      std::vector<Batch> micro;
      if (rank != 0) micro = {Rows(step, 4 * rank, 4)};
      BRAID_ASSIGN_OR_RETURN(StepStats s, strategy->TrainStep(micro, MseLoss));
      if (!std::isfinite(s.loss)) return absl::InternalError("loss is not finite");
    }
    BRAID_ASSIGN_OR_RETURN(final_state[rank], strategy->FullStateDict());
    if (rank == 0) after = held_out_loss(model);
    stats[rank] = StatsOf(*strategy);
    return absl::OkStatus();
  });
  for (int r = 0; r < world; ++r) ASSERT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];

  std::printf(
      "max_staleness %d: held-out loss %.4f -> %.4f; workers %d and %d ahead, %d and %d waits; "
      "largest version lag %d\n",
      max_staleness, before, after, stats[1].max_steps_ahead, stats[2].max_steps_ahead,
      int(stats[1].waits_for_fresh), int(stats[2].waits_for_fresh), int(stats[0].max_version_lag));
  EXPECT_LT(after, 0.3f * before) << "held-out loss " << before << " -> " << after;
  EXPECT_EQ(stats[0].gradients_applied, int64_t(steps) * workers);
  for (int r = 1; r < world; ++r) {
    EXPECT_EQ(Flat(final_state[r]), Flat(final_state[0])) << "FullStateDict of rank " << r;
    EXPECT_EQ(stats[r].version, stats[0].version) << "rank " << r;
    // The bound was reached, not merely respected: with replies seen only when waited for, a
    // worker's pushes in flight grow by one a step up to max_staleness, and from step
    // max_staleness + 2 on every step must first wait for the oldest reply.
    EXPECT_EQ(stats[r].max_steps_ahead, max_staleness) << "worker " << r;
    EXPECT_EQ(stats[r].waits_for_fresh, steps - max_staleness - 1) << "worker " << r;
  }
  // How many updates a gradient may miss follows from the bound (docs/WRITING_A_STRATEGY.md).
  EXPECT_LE(stats[0].max_version_lag, int64_t(max_staleness + 2) * workers - 2);
  EXPECT_GT(stats[0].max_version_lag, 0);
}

INSTANTIATE_TEST_SUITE_P(MaxStaleness, AsyncTest, ::testing::Values(0, 2));

// ---- Errors -------------------------------------------------------------------------------------

TEST_F(ParamServerTest, BadOptionsAreClearErrors) {
  std::vector<std::unique_ptr<Communicator>> comms = MakeInProcessGroup(3, "options");
  struct Case {
    std::map<std::string, std::string> options;
    std::vector<std::string> want;
  };
  const std::vector<Case> cases = {
      {{{"mode", "fast"}}, {"mode='fast'", "sync or async"}},
      {{{"mode", "async"}, {"max_staleness", "-1"}}, {"max_staleness='-1'", "0 to 64"}},
      {{{"mode", "async"}, {"max_staleness", "many"}}, {"max_staleness='many'"}},
      {{{"max_staleness", "2"}}, {"max_staleness applies to mode=async only"}},
      {{{"server_rank", "3"}}, {"server_rank=3 is out of range", "3 ranks (0..2)"}},
      {{{"server_rank", "first"}}, {"server_rank='first'"}},
      {{{"bucket_cap_mb", "25"}}, {"unknown option 'bucket_cap_mb'", "mode, max_staleness"}},
  };
  for (const Case& c : cases) {
    TinyMlp model(1);
    StrategyContext ctx;
    ctx.comm = comms[0].get();
    ctx.options = c.options;
    // Options fail before any communication, so one rank alone gets the error at once.
    absl::Status s = Make()->Setup(model, MakeOptimizer, ctx);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("strategy 'paramserver'"));
    for (const std::string& w : c.want) EXPECT_THAT(std::string(s.message()), HasSubstr(w));
  }

  TinyMlp model(1);
  std::vector<std::unique_ptr<Communicator>> alone = MakeInProcessGroup(1);
  StrategyContext ctx;
  ctx.comm = alone[0].get();
  absl::Status s = Make()->Setup(model, MakeOptimizer, ctx);
  EXPECT_THAT(std::string(s.message()), HasSubstr("needs at least 2 ranks"));

  std::unique_ptr<Strategy> early = Make();
  EXPECT_EQ(early->TrainStep({Rows(0, 0, 2)}, MseLoss).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(early->FullStateDict().status().code(), absl::StatusCode::kFailedPrecondition);
}

// Ranks given different modes would exchange messages neither side expects: Setup refuses, on
// every rank, naming both.
TEST_F(ParamServerTest, RanksThatDisagreeFailAtSetup) {
  std::vector<absl::Status> st = RunRanks(3, [&](int rank, Communicator& comm) {
    TinyMlp model(1);
    StrategyContext ctx;
    ctx.comm = &comm;
    ctx.options["mode"] = rank == 2 ? "async" : "sync";
    return Make()->Setup(model, MakeOptimizer, ctx);
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_THAT(
        std::string(st[r].message()),
        AllOf(HasSubstr("disagree on the mode"), HasSubstr("mode=async"), HasSubstr("mode=sync")))
        << "rank " << r;
  }
}

}  // namespace
}  // namespace braid
