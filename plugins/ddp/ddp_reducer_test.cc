// The ddp strategy's gradient reducer seen through the loaded plugin, on ranks that are threads
// of this process (test_util.h): parameters without gradients (an error naming them, the same on
// every rank, or averaged as zeros with find_unused_parameters), a step abandoned on one rank,
// bucket order and its rebuild, reductions overlapping backward, and the trace file.
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "core/ops.h"
#include "core/strategy.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "models/nn/layers.h"
#include "plugins/ddp/ddp_trace.h"
#include "plugins/ddp/test_util.h"

namespace braid::ddp_test {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// ---- Models and data ---------------------------------------------------------------------------

// Registers fc_a, fc_b, fc_c but applies them in the order c, b, a: backward produces a's
// gradients first, the reverse of what the registration order suggests.
class ReversedNet : public Module {
 public:
  explicit ReversedNet(uint64_t seed, int64_t dim = 192) : Module("ReversedNet") {
    std::mt19937_64 rng(seed);
    const float s = 1.0f / std::sqrt(float(dim));
    a_ = RegisterModule("fc_a",
                        std::make_unique<nn::Linear>(dim, kClasses, true, s, rng, Device::CPU()));
    b_ =
        RegisterModule("fc_b", std::make_unique<nn::Linear>(dim, dim, true, s, rng, Device::CPU()));
    c_ =
        RegisterModule("fc_c", std::make_unique<nn::Linear>(kIn, dim, true, s, rng, Device::CPU()));
  }
  Tensor Forward(const Tensor& x) override { return (*a_)(ops::Tanh((*b_)(ops::Tanh((*c_)(x))))); }

 private:
  nn::Linear *a_, *b_, *c_;
};

// An MLP with a parameter the loss never uses, and one it uses only for batches whose first
// label is odd (so one rank may use it while another does not).
class SometimesNet : public Module {
 public:
  explicit SometimesNet(uint64_t seed) : Module("SometimesNet") {
    std::mt19937_64 rng(seed);
    fc_ = RegisterModule(
        "fc", std::make_unique<nn::Linear>(kIn, kClasses, true, 0.3f, rng, Device::CPU()));
    never_ = RegisterParameter("never", nn::Normal({kClasses}, 0.5f, rng, Device::CPU()));
    sometimes_ = RegisterParameter("sometimes", nn::Normal({kClasses}, 0.5f, rng, Device::CPU()));
  }
  Tensor Forward(const Tensor& x) override {
    Tensor y = (*fc_)(x);
    return use_sometimes ? ops::Add(y, sometimes_) : y;
  }
  bool use_sometimes = false;

 private:
  nn::Linear* fc_;
  Tensor never_, sometimes_;
};

// ---- Parameters without gradients ------------------------------------------------------------

struct UnusedRun {
  std::vector<absl::Status> status;
  std::vector<StateDict> before, after;
  std::vector<std::vector<float>> sometimes_grad;
};

// One step of SometimesNet on two ranks; rank r uses "sometimes" iff uses[r].
UnusedRun RunSometimes(std::vector<bool> uses, bool find_unused, bool view) {
  UnusedRun out;
  out.status.resize(2);
  out.before.resize(2);
  out.after.resize(2);
  out.sometimes_grad.resize(2);
  DdpTest::RunRanks(2, [&](int rank, Communicator* comm) {
    SometimesNet model(5);
    model.use_sometimes = uses[size_t(rank)];
    std::unique_ptr<Strategy> ddp = DdpTest::MakeDdp();
    StrategyContext ctx;
    ctx.comm = comm;
    ctx.options = {{"find_unused_parameters", find_unused ? "true" : "false"},
                   {"gradient_as_bucket_view", view ? "true" : "false"},
                   {"bucket_cap_mb", "0.0002"}};
    ASSERT_TRUE(ddp->Setup(model, AdamW, ctx).ok());
    out.before[size_t(rank)] = Snapshot(model);
    out.status[size_t(rank)] = ddp->TrainStep({MlpRows(0, rank * 4, 4)}, CrossEntropyLoss).status();
    out.after[size_t(rank)] = Snapshot(model);
    for (const auto& [n, p] : model.NamedParameters()) {
      if (n == "sometimes" && p.grad().defined())
        out.sometimes_grad[size_t(rank)] = p.grad().ToFloatVector();
    }
    // The ranks are still in step: a normal step afterwards works everywhere.
    model.use_sometimes = true;
    if (!find_unused) {
      absl::Status again = ddp->TrainStep({MlpRows(1, rank * 4, 4)}, CrossEntropyLoss).status();
      EXPECT_THAT(std::string(again.message()), HasSubstr("'never'"));
    }
  });
  return out;
}

TEST_F(DdpTest, UnusedParameterIsAnErrorNamingItOnEveryRank) {
  for (bool view : {true, false}) {
    UnusedRun r = RunSometimes({true, true}, /*find_unused=*/false, view);
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_EQ(r.status[size_t(rank)].code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_THAT(std::string(r.status[size_t(rank)].message()), HasSubstr("'never'"));
      EXPECT_THAT(std::string(r.status[size_t(rank)].message()), Not(HasSubstr("'sometimes'")));
      EXPECT_THAT(std::string(r.status[size_t(rank)].message()),
                  HasSubstr("find_unused_parameters"));
      EXPECT_EQ(MaxDiff(r.after[size_t(rank)], r.before[size_t(rank)]), 0.0f);  // no update
    }
    EXPECT_EQ(r.status[0].message(), r.status[1].message());  // the same verdict everywhere
  }
}

TEST_F(DdpTest, ParameterUnusedOnOneRankIsAnErrorOnBothRanks) {
  UnusedRun r = RunSometimes({false, true}, /*find_unused=*/false, true);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string msg(r.status[size_t(rank)].message());
    EXPECT_THAT(msg, HasSubstr("'sometimes' (on 1 of 2 ranks"));
    EXPECT_THAT(msg, HasSubstr("'never' (on 2 of 2 ranks"));
  }
  EXPECT_THAT(std::string(r.status[0].message()),
              HasSubstr("'sometimes' (on 1 of 2 ranks, this one included)"));
}

TEST_F(DdpTest, FindUnusedParametersTrains) {
  for (bool view : {true, false}) {
    UnusedRun r = RunSometimes({false, true}, /*find_unused=*/true, view);
    for (int rank = 0; rank < 2; ++rank) {
      ASSERT_TRUE(r.status[size_t(rank)].ok()) << r.status[size_t(rank)];
      EXPECT_EQ(MaxDiff(r.after[size_t(rank)], r.after[0]), 0.0f);
      // Used by no rank: no gradient at all, so AdamW (weight decay included) leaves it alone.
      EXPECT_EQ(r.after[size_t(rank)].at("never").ToFloatVector(),
                r.before[size_t(rank)].at("never").ToFloatVector());
      EXPECT_NE(r.after[size_t(rank)].at("sometimes").ToFloatVector(),
                r.before[size_t(rank)].at("sometimes").ToFloatVector());
    }
    // "sometimes" counts as zero on rank 0: the average is half of rank 1's own gradient, which
    // for an added bias is the column sums of d(mean CE)/d(logits) over rank 1's rows.
    SometimesNet ref(5);
    ref.use_sometimes = true;
    Tensor loss = CrossEntropyLoss(ref, MlpRows(0, 4, 4));
    loss.Backward();
    std::vector<float> g1;
    for (const auto& [n, p] : ref.NamedParameters()) {
      if (n == "sometimes") g1 = p.grad().ToFloatVector();
    }
    ASSERT_EQ(g1.size(), size_t(kClasses));
    for (int rank = 0; rank < 2; ++rank) {
      ASSERT_EQ(r.sometimes_grad[size_t(rank)].size(), g1.size()) << "rank " << rank;
      for (size_t i = 0; i < g1.size(); ++i) {
        EXPECT_NEAR(r.sometimes_grad[size_t(rank)][i], g1[i] / 2, 1e-6) << "rank " << rank;
      }
    }
  }
}

TEST_F(DdpTest, InvalidLossOnOneRankFailsEveryRankWithoutHanging) {
  std::vector<absl::Status> first(2), second(2);
  std::vector<StateDict> before(2), after(2);
  RunRanks(2, [&](int rank, Communicator* comm) {
    std::unique_ptr<Module> model = MakeMlp(3);
    std::unique_ptr<Strategy> ddp = MakeDdp();
    StrategyContext ctx;
    ctx.comm = comm;
    ctx.options = {{"bucket_cap_mb", "0.001"}};
    ASSERT_TRUE(ddp->Setup(*model, AdamW, ctx).ok());
    before[size_t(rank)] = Snapshot(*model);
    LossFn bad = [rank](Module& m, const Batch& b) {
      return rank == 1 ? Tensor::Scalar(1.0f) : CrossEntropyLoss(m, b);
    };
    // Two micro-batches: rank 1 gives up in the first, before any reduction of the step.
    first[size_t(rank)] =
        ddp->TrainStep({MlpRows(0, rank * 4, 2), MlpRows(0, rank * 4 + 2, 2)}, bad).status();
    after[size_t(rank)] = Snapshot(*model);
    second[size_t(rank)] = ddp->TrainStep({MlpRows(1, rank * 2, 2)}, CrossEntropyLoss).status();
  });
  EXPECT_EQ(first[1].code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(first[1].message()), HasSubstr("depends on no trainable parameter"));
  EXPECT_EQ(first[0].code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(first[0].message()), HasSubstr("another rank"));
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(MaxDiff(after[size_t(rank)], before[size_t(rank)]), 0.0f);
    EXPECT_TRUE(second[size_t(rank)].ok()) << second[size_t(rank)];
  }
}

// ---- Overlap, bucket order, timeline ---------------------------------------------------------

TEST_F(DdpTest, BucketsFollowReadinessOrderAndReductionsOverlapBackward) {
  RunRanks(2, [&](int rank, Communicator* comm) {
    ReversedNet model(11);
    // Our own hooks see gradients become ready in the same order as the strategy's.
    std::vector<std::string> ready_order;
    std::vector<std::pair<Tensor, uint64_t>> hooks;
    for (const auto& [n, p] : model.NamedParameters()) {
      Tensor t = p;
      std::string name = n;
      hooks.emplace_back(t, t.RegisterPostAccumulateGradHook(
                                [&ready_order, name](Tensor&) { ready_order.push_back(name); }));
    }
    std::unique_ptr<Strategy> ddp = MakeDdp();
    StrategyContext ctx;
    ctx.comm = comm;
    // fc_b.weight (144 KiB) alone fills a bucket; the first one is tiny.
    ctx.options = {{"bucket_cap_mb", "0.1"}, {"first_bucket_mb", "0.001"}};
    ASSERT_TRUE(ddp->Setup(model, AdamW, ctx).ok());
    auto* intro = dynamic_cast<ddp::DdpIntrospection*>(ddp.get());
    ASSERT_NE(intro, nullptr);
    auto flatten = [](const std::vector<ddp::BucketInfo>& buckets) {
      std::vector<std::string> names;
      for (const auto& b : buckets) names.insert(names.end(), b.params.begin(), b.params.end());
      return names;
    };
    std::vector<std::string> registration;
    for (const auto& [n, p] : model.NamedParameters()) registration.push_back(n);
    std::vector<std::string> reversed(registration.rbegin(), registration.rend());
    EXPECT_EQ(flatten(intro->Buckets()), reversed);
    EXPECT_FALSE(intro->BucketsRebuilt());

    const int steps = 4;
    for (int step = 0; step < steps; ++step) {
      ASSERT_TRUE(ddp->TrainStep({MlpRows(step, rank * 16, 16)}, CrossEntropyLoss).ok());
      if (step == 0) {
        ASSERT_EQ(ready_order.size(), registration.size());
        EXPECT_NE(ready_order, reversed);  // the model was built to make them differ
      }
    }
    std::vector<std::string> first_step_order(ready_order.begin(),
                                              ready_order.begin() + registration.size());
    EXPECT_TRUE(intro->BucketsRebuilt());
    std::vector<ddp::BucketInfo> buckets = intro->Buckets();
    EXPECT_EQ(flatten(buckets), first_step_order);
    ASSERT_GE(buckets.size(), 3u);
    EXPECT_EQ(buckets[0].params.size(), 1u);  // first_bucket_mb keeps the first one small

    // From the recorded events (not timing): per step, when backward ended, when each bucket
    // became ready and when its reduction was launched.
    std::map<int64_t, double> backward_end;
    std::map<int64_t, std::vector<ddp::TraceEvent>> reductions;
    int rebuilds = 0;
    for (const ddp::TraceEvent& e : intro->TraceEvents()) {
      if (e.name == "backward") backward_end[e.step] = e.end_us;
      if (e.name == "allreduce") reductions[e.step].push_back(e);
      if (e.name == "rebuild_buckets") {
        ++rebuilds;
        EXPECT_EQ(e.step, 1);
      }
      EXPECT_LE(e.start_us, e.end_us) << e.name;
    }
    EXPECT_EQ(rebuilds, 1);
    ASSERT_EQ(reductions.size(), size_t(steps));
    for (auto& [step, events] : reductions) {
      ASSERT_GE(events.size(), 3u);
      double last_ready = 0;
      for (const auto& e : events) last_ready = std::max(last_ready, e.ready_us);
      for (size_t i = 0; i < events.size(); ++i) {
        EXPECT_EQ(events[i].bucket, int(i));
        EXPECT_GE(events[i].start_us, events[i].ready_us);  // never before its gradients
        if (i > 0) {
          EXPECT_GE(events[i].start_us, events[i - 1].start_us);  // in bucket order
        }
      }
      if (step == 0) {
        // Initial layout (reverse registration): bucket 0 holds fc_c, whose gradients come
        // last, and launches are in bucket order, so nothing was launched before it was ready,
        // long after the last bucket (fc_a) was.
        EXPECT_GT(events[0].ready_us, events.back().ready_us);
        for (const auto& e : events) EXPECT_GE(e.start_us, events[0].ready_us);
      } else {
        // Rebuilt layout: bucket 0 is reduced while backward is still producing the others.
        EXPECT_LT(events[0].start_us, last_ready) << "step " << step;
        EXPECT_LT(events[0].start_us, backward_end[step]) << "step " << step;
      }
    }
    for (auto& [t, id] : hooks) t.RemoveHook(id);
  });
}

TEST_F(DdpTest, TraceFileIsAChromeTrace) {
  const std::string dir = ::testing::TempDir();
  const std::string pattern = dir + "/ddp_trace.json";
  RunRanks(2, [&](int rank, Communicator* comm) {
    std::unique_ptr<Module> model = MakeMlp(9);
    std::unique_ptr<Strategy> ddp = MakeDdp();
    StrategyContext ctx;
    ctx.comm = comm;
    ctx.options = {{"bucket_cap_mb", "0.001"}, {"trace_file", pattern}, {"trace_steps", "2"}};
    ASSERT_TRUE(ddp->Setup(*model, AdamW, ctx).ok());
    for (int step = 0; step < 3; ++step) {
      ASSERT_TRUE(ddp->TrainStep({MlpRows(step, rank * 2, 2)}, CrossEntropyLoss).ok());
    }
  });
  for (int rank = 0; rank < 2; ++rank) {
    const std::string path = dir + "/ddp_trace-rank" + std::to_string(rank) + ".json";
    std::ifstream in(path);
    ASSERT_TRUE(in.good()) << path;
    std::stringstream text;
    text << in.rdbuf();
    google::protobuf::Struct trace;
    auto parsed = google::protobuf::util::JsonStringToMessage(text.str(), &trace);
    ASSERT_TRUE(parsed.ok()) << path << ": " << parsed.ToString();
    const auto& events = trace.fields().at("traceEvents").list_value().values();
    std::multiset<std::string> names;
    std::set<double> steps;
    for (const auto& v : events) {
      const auto& f = v.struct_value().fields();
      EXPECT_EQ(f.at("pid").number_value(), rank);
      if (f.at("ph").string_value() != "X") continue;
      const std::string name = f.at("name").string_value();
      names.insert(name);
      EXPECT_GE(f.at("dur").number_value(), 0) << name;
      EXPECT_GT(f.at("ts").number_value(), 1.5e15) << name;  // microseconds since 1970
      EXPECT_EQ(f.at("tid").number_value(), name == "allreduce" ? 1 : 0) << name;
      steps.insert(f.at("args").struct_value().fields().at("step").number_value());
    }
    for (const char* want :
         {"setup", "forward", "backward", "allreduce", "wait_comm", "optimizer"}) {
      EXPECT_GE(names.count(want), 1u) << want << " in " << path;
    }
    // trace_steps=2 keeps the last two steps (plus setup).
    EXPECT_EQ(steps, (std::set<double>{-1, 1, 2})) << path;
    EXPECT_EQ(names.count("forward"), 2u);
    std::remove(path.c_str());
  }

  // "{rank}" in the path names each rank's file; no temporary file is left behind.
  const std::string subdir = dir + "/ddp_trace_pattern";
  ASSERT_EQ(::mkdir(subdir.c_str(), 0755) == 0 || errno == EEXIST, true);
  RunRanks(2, [&](int rank, Communicator* comm) {
    std::unique_ptr<Module> model = MakeMlp(9);
    std::unique_ptr<Strategy> ddp = MakeDdp();
    StrategyContext ctx;
    ctx.comm = comm;
    ctx.options = {{"trace_file", subdir + "/r{rank}.trace"}};
    ASSERT_TRUE(ddp->Setup(*model, AdamW, ctx).ok());
    ASSERT_TRUE(ddp->TrainStep({MlpRows(0, rank * 2, 2)}, CrossEntropyLoss).ok());
  });
  std::vector<std::string> files;
  DIR* d = ::opendir(subdir.c_str());
  ASSERT_NE(d, nullptr);
  while (dirent* entry = ::readdir(d)) {
    if (entry->d_name[0] != '.') files.push_back(entry->d_name);
  }
  ::closedir(d);
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{"r0.trace", "r1.trace"}));
}

}  // namespace
}  // namespace braid::ddp_test
